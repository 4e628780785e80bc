//! `.daemon/counters.json`: the instance counters (`rio-047`). The daemon
//! takes an instance id here for every session it spawns, and so does
//! `session begin` run by a script without a daemon: this is the store's,
//! not the daemon's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::journal;
use super::lock::flock_within;
use super::{AgentDir, StateRoot, atomic, set_aside_name};
use crate::clock::Timestamp;
use crate::error::{Error, Result};

/// The file as seed 000 shapes it: one flat map, agent → the last instance
/// number (`{"rio": 47, "clay": 0}`). Read also in this project's first
/// shape (`{"counters": {"rio": 47}}`), which is written back flat; keys
/// that are not counters are kept as they are.
#[derive(Debug, Default)]
struct Counters {
    counters: BTreeMap<String, u64>,
    extra: Map<String, Value>,
}

// Both ways in one pass over the entries, without a `Map` of every entry in
// between: the file holds one entry per agent, and it is read and written
// for every session begun (at 10,000 agents, the intermediate maps and
// their clones were most of the daemon's CPU per wake).
impl<'de> Deserialize<'de> for Counters {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Counters;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of agent names and instance counts")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut entries: A,
            ) -> std::result::Result<Counters, A::Error> {
                let mut c = Counters::default();
                // A key given twice counts as its last value (as a `Map`
                // reads it); the first shape's `counters` object is merged
                // after, the higher count winning.
                let mut top: BTreeMap<String, u64> = BTreeMap::new();
                let mut nested: Option<Map<String, Value>> = None;
                while let Some(k) = entries.next_key::<String>()? {
                    let v: Value = entries.next_value()?;
                    if k == "counters" {
                        nested = None;
                    }
                    if let Some(n) = v.as_u64() {
                        c.extra.shift_remove(&k);
                        top.insert(k, n);
                    } else if k == "counters" && v.is_object() {
                        top.remove(&k);
                        nested = v.as_object().cloned();
                    } else {
                        top.remove(&k);
                        c.extra.insert(k, v);
                    }
                }
                let Some(nested) = nested else {
                    c.counters = top;
                    return Ok(c);
                };
                c.extra.shift_remove("counters");
                for (k, v) in nested {
                    if let Some(n) = v.as_u64() {
                        c.counters.insert(k, n);
                    }
                }
                for (k, n) in top {
                    let e = c.counters.entry(k).or_insert(0);
                    *e = (*e).max(n);
                }
                Ok(c)
            }
        }
        d.deserialize_map(Visit)
    }
}

impl Serialize for Counters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        // The keys that are no counts first, in their order, then the
        // counts by agent name (as a `Map` built that way would write them:
        // a count whose name is also such a key takes that key's place).
        let mut map = s.serialize_map(None)?;
        for (k, v) in &self.extra {
            match self.counters.get(k) {
                Some(n) => map.serialize_entry(k, n)?,
                None => map.serialize_entry(k, v)?,
            }
        }
        for (k, n) in &self.counters {
            if !self.extra.contains_key(k) {
                map.serialize_entry(k, n)?;
            }
        }
        map.end()
    }
}

/// Every agent of `agents` listed in `.daemon/counters.json` (at 0 when
/// new), as seed 000's first start makes it; counts already there are kept.
pub fn list_agents<'a>(root: &StateRoot, agents: impl IntoIterator<Item = &'a str>) -> Result<()> {
    let dir = root.daemon_dir();
    atomic::create_dir(&dir, 0o750)?;
    let lock_path = dir.join("counters.lock");
    let file = crate::state::lock::open_private_lock(&lock_path)?;
    let _lock = flock_within(file, &lock_path, root.lock_wait)?;
    let path = dir.join("counters.json");
    // A corrupt file is `next_instance`'s to set aside: left as it is here.
    let Ok(read) = atomic::read_json::<Counters>(&path) else {
        return Ok(());
    };
    let existed = read.is_some();
    let mut counters = read.unwrap_or_default();
    let before = counters.counters.len();
    for agent in agents {
        counters.counters.entry(agent.to_string()).or_insert(0);
    }
    if counters.counters.len() != before || !existed {
        atomic::write_json(&root.store, &path, &counters)?;
    }
    Ok(())
}

/// The next instance id of the agent of `dir` (`rio-047`): one counter per
/// agent in `.daemon/counters.json`, incremented under
/// `.daemon/counters.lock`, never reset. A corrupt file is set aside and the
/// count restarts above the highest instance recorded in the agent's
/// journal ([`highest_instance`]).
pub fn next_instance(root: &StateRoot, agent_dir: &AgentDir, now: Timestamp) -> Result<String> {
    let agent = agent_dir.name.as_str();
    let dir = root.daemon_dir();
    atomic::create_dir(&dir, 0o750)?;
    let lock_path = dir.join("counters.lock");
    let file = crate::state::lock::open_private_lock(&lock_path)?;
    let _lock = flock_within(file, &lock_path, root.lock_wait)?;
    let path = dir.join("counters.json");
    let mut counters = match atomic::read_json::<Counters>(&path) {
        Ok(c) => c.unwrap_or_default(),
        Err(Error::Corrupt { .. }) => {
            let aside = set_aside_name(&path, "corrupt", &now.compact());
            atomic::rename(&path, &aside)?;
            root.store.note_repair(
                "",
                &format!(
                    "{} was corrupt: set aside as {}; instance counters continue from the highest ids in the journals",
                    path.display(),
                    aside.display()
                ),
            );
            Counters::default()
        }
        Err(e) => return Err(e),
    };
    let entry = counters.counters.entry(agent.to_string()).or_insert(0);
    if *entry == 0 {
        *entry = highest_instance(agent_dir);
    }
    *entry += 1;
    let n = *entry;
    atomic::write_json(&root.store, &path, &counters)?;
    Ok(format!("{agent}-{n:03}"))
}

/// The highest instance number in an agent's journal, so a lost
/// counters.json never restarts the count at 1.
pub fn highest_instance(dir: &AgentDir) -> u64 {
    let prefix = format!("{}-", dir.name);
    journal::read(&dir.store, &dir.journal())
        .map(|scan| {
            scan.entries
                .iter()
                .filter_map(|e| match &e.event {
                    journal::Event::SessionStart(s) => s
                        .instance
                        .as_deref()?
                        .strip_prefix(&prefix)?
                        .parse::<u64>()
                        .ok(),
                    _ => None,
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_read_in_both_shapes_and_written_flat() {
        for (text, want) in [
            (r#"{"rio": 47, "clay": 0}"#, r#"{"clay":0,"rio":47}"#),
            (r#"{"counters": {"rio": 47}}"#, r#"{"rio":47}"#),
            // Both: the higher count wins; a key that is no count is kept.
            (
                r#"{"counters": {"rio": 3}, "rio": 5, "note": "x"}"#,
                r#"{"note":"x","rio":5}"#,
            ),
            // An agent named `counters` has a number, not an object.
            (r#"{"counters": 2}"#, r#"{"counters":2}"#),
            // A key given twice: its last value.
            (r#"{"rio": 3, "rio": 2}"#, r#"{"rio":2}"#),
            (
                r#"{"counters": {"rio": 3}, "counters": 4}"#,
                r#"{"counters":4}"#,
            ),
            (r#"{"note": 1, "note": "x"}"#, r#"{"note":"x"}"#),
            // A first-shape count named like a key that is no count.
            (
                r#"{"note": "x", "zed": "y", "counters": {"note": 3, "a": 1}}"#,
                r#"{"note":3,"zed":"y","a":1}"#,
            ),
        ] {
            let c: Counters = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&c).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn listing_agents_adds_them_at_zero_and_keeps_counts() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::new(dir.path());
        list_agents(&root, ["rio", "clay"]).unwrap();
        let path = root.daemon_dir().join("counters.json");
        let read = |p: &std::path::Path| -> Value {
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
        };
        assert_eq!(read(&path), serde_json::json!({"rio": 0, "clay": 0}));
        std::fs::write(&path, r#"{"counters": {"rio": 7}}"#).unwrap();
        list_agents(&root, ["rio", "leo"]).unwrap();
        assert_eq!(read(&path), serde_json::json!({"rio": 7, "leo": 0}));
    }
}
