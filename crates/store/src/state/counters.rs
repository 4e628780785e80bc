//! `.daemon/counters.json`: the instance counters (`rio-047`). The daemon
//! takes an instance id here for every session it spawns, and so does
//! `session begin` run by a script without a daemon: this is the store's,
//! not the daemon's.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::journal;
use super::lock::flock_within;
use super::{AgentDir, STATE_FILE_MODE, StateRoot, atomic, set_aside_name};
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::fsx;

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
/// journal ([`highest_instance`]). The file is written, fsynced and renamed
/// into place before the id is returned, so no id is handed out that a crash
/// could hand out again. With [`StateRoot::keeping_counters`], what this
/// root wrote last is used again while the file is still that write
/// ([`Kept`]).
pub fn next_instance(root: &StateRoot, agent_dir: &AgentDir, now: Timestamp) -> Result<String> {
    let agent = agent_dir.name.as_str();
    let dir = root.daemon_dir();
    atomic::create_dir(&dir, 0o750)?;
    let lock_path = dir.join("counters.lock");
    let file = crate::state::lock::open_private_lock(&lock_path)?;
    let _lock = flock_within(file, &lock_path, root.lock_wait)?;
    let path = dir.join("counters.json");
    let mut kept = root
        .counters
        .0
        .as_ref()
        .map(|k| k.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    // Taken out, and put back only once the new count is in the file: a
    // failed write leaves nothing kept that the file does not hold.
    let last = kept
        .as_mut()
        .and_then(|k| k.take())
        .filter(|last| last.is_current(&path));
    let (mut counters, mut bytes) = match last {
        Some(last) => (last.counters, Some(last.bytes)),
        None => (read_or_set_aside(root, &path, now)?, None),
    };
    let entry = counters.counters.entry(agent.to_string()).or_insert(0);
    let was = *entry;
    if *entry == 0 {
        *entry = highest_instance(agent_dir);
    }
    *entry += 1;
    let n = *entry;
    let rewritten = bytes
        .as_mut()
        .is_some_and(|b| rewrite_count(b, agent, was, n));
    let bytes = match bytes {
        Some(b) if rewritten => {
            debug_assert_eq!(
                String::from_utf8_lossy(&b),
                String::from_utf8_lossy(&serialize(&counters, &path)?),
                "the count rewritten in place is the file serialized whole"
            );
            b
        }
        _ => serialize(&counters, &path)?,
    };
    atomic::stage_file(&root.store, &path, &bytes, STATE_FILE_MODE)?.commit()?;
    if let Some(kept) = kept.as_mut() {
        **kept = Last::of(&path, counters, bytes);
    }
    Ok(format!("{agent}-{n:03}"))
}

/// counters.json as read, or empty after setting a corrupt one aside.
fn read_or_set_aside(root: &StateRoot, path: &Path, now: Timestamp) -> Result<Counters> {
    match atomic::read_json::<Counters>(path) {
        Ok(c) => Ok(c.unwrap_or_default()),
        Err(Error::Corrupt { .. }) => {
            let aside = set_aside_name(path, "corrupt", &now.compact());
            atomic::rename(path, &aside)?;
            root.store.note_repair(
                "",
                &format!(
                    "{} was corrupt: set aside as {}; instance counters continue from the highest ids in the journals",
                    path.display(),
                    aside.display()
                ),
            );
            Ok(Counters::default())
        }
        Err(e) => Err(e),
    }
}

/// The file's bytes, as [`atomic::write_json`] writes them.
fn serialize(counters: &Counters, path: &Path) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(counters)
        .map_err(|e| Error::Data(format!("cannot serialize {}: {e}", path.display())))?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Replace `agent`'s count `was` by `n` in `bytes`, the file as
/// [`serialize`] wrote it: a top-level entry is the only text that starts a
/// line with two spaces and a quote (nested values are indented further, a
/// newline inside a string is escaped), and each key is written once. False,
/// with `bytes` unchanged, when the entry is not there as `was`.
fn rewrite_count(bytes: &mut Vec<u8>, agent: &str, was: u64, n: u64) -> bool {
    let Ok(key) = serde_json::to_string(agent) else {
        return false;
    };
    let entry = format!("\n  {key}: {was}");
    let Some(at) = memchr::memmem::find(bytes, entry.as_bytes()) else {
        return false;
    };
    let end = at + entry.len();
    if !matches!(bytes.get(end), Some(b',' | b'\n')) {
        return false;
    }
    let start = end - was.to_string().len();
    bytes.splice(start..end, n.to_string().into_bytes());
    true
}

/// What a long-lived process keeps of `.daemon/counters.json` between the
/// ids it takes (the daemon, which takes one for every session: at 10,000
/// agents, reading, parsing, serializing and freeing every agent's entry was
/// most of its CPU per wake). Kept: the counts and the bytes it wrote last,
/// and that file, held open so that its inode number cannot be given to
/// another file. Every writer replaces the file whole, by a rename, under
/// the lock; so while the path still names that inode, with the size, mtime
/// and ctime it had, the file is what was written, and the next id needs no
/// read and rewrites one number of the bytes kept. Anything else (a script's
/// `session begin`, `list_agents`, an operator's edit, a failed write): the
/// file is read again, as without this. The write itself, fsynced, is the
/// same either way. Clones share it; off by default.
#[derive(Clone, Default)]
pub struct Kept(Option<Arc<Mutex<Option<Last>>>>);

impl Kept {
    /// Keeping what is written.
    pub fn on() -> Kept {
        Kept(Some(Arc::default()))
    }
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Kept(on)"
        } else {
            "Kept(off)"
        })
    }
}

/// The last write: see [`Kept`].
struct Last {
    /// Held open: its inode number is not reused while it is.
    _file: File,
    identity: Identity,
    counters: Counters,
    bytes: Vec<u8>,
}

/// A file's inode and what every change to it changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Identity {
    fn of(st: &nix::sys::stat::FileStat) -> Identity {
        Identity {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }
}

impl Last {
    /// The file just written to `path` (under the lock, so it is ours),
    /// opened and kept; `None` if it cannot be, and the next id reads it.
    fn of(path: &Path, counters: Counters, bytes: Vec<u8>) -> Option<Last> {
        let file = fsx::open_read(path).ok()??;
        let st = nix::sys::stat::fstat(&file).ok()?;
        (st.st_size as u64 == bytes.len() as u64).then(|| Last {
            _file: file,
            identity: Identity::of(&st),
            counters,
            bytes,
        })
    }

    /// Whether `path` is still the file kept, unchanged.
    fn is_current(&self, path: &Path) -> bool {
        matches!(fsx::metadata(path), Ok(Some(st)) if Identity::of(&st) == self.identity)
    }
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
    use crate::agent_name::AgentName;

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

    #[test]
    fn a_count_rewritten_in_place_is_the_file_serialized_whole() {
        // (file as read, agent, new count)
        for (text, agent, n) in [
            (r#"{"clay": 0, "rio": 47}"#, "rio", 48),
            (r#"{"clay": 0, "rio": 47}"#, "clay", 1),
            (r#"{"clay": 9, "rio": 47}"#, "clay", 10),
            (r#"{"clay": 99, "rio": 4}"#, "rio", 1000),
            (r#"{"rio": 4, "rio2": 47}"#, "rio", 5),
            (r#"{"rio2": 4, "rio": 47}"#, "rio", 48),
            // Keys that are no counts come first, nested values indented.
            (r#"{"note": {"rio": 3}, "rio": 3}"#, "rio", 4),
            (r#"{"note": "\n  \"rio\": 3", "rio": 3}"#, "rio", 4),
        ] {
            let mut c: Counters = serde_json::from_str(text).unwrap();
            let mut bytes = serialize(&c, Path::new("counters.json")).unwrap();
            let was = c.counters[agent];
            assert!(rewrite_count(&mut bytes, agent, was, n), "{text}");
            c.counters.insert(agent.to_string(), n);
            let whole = serialize(&c, Path::new("counters.json")).unwrap();
            assert_eq!(
                String::from_utf8(bytes).unwrap(),
                String::from_utf8(whole).unwrap(),
                "{text}"
            );
        }
        // Not there as that count: unchanged, and the caller serializes.
        let c: Counters = serde_json::from_str(r#"{"rio": 47, "note": {"leo": 3}}"#).unwrap();
        let bytes = serialize(&c, Path::new("counters.json")).unwrap();
        for (agent, was) in [("rio", 4), ("leo", 3), ("clay", 0)] {
            let mut b = bytes.clone();
            assert!(!rewrite_count(&mut b, agent, was, was + 1), "{agent}");
            assert_eq!(b, bytes);
        }
    }

    #[test]
    fn a_kept_file_is_read_again_once_anyone_else_wrote_it() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = StateRoot::new(dir.path()).keeping_counters();
        let script = StateRoot::new(dir.path());
        let name = |n: &str| AgentName::parse(n).unwrap();
        let rio = daemon.agent(&name("rio"));
        let leo = daemon.agent(&name("leo"));
        let path = daemon.daemon_dir().join("counters.json");
        let read =
            || -> Value { serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap() };
        let now = Timestamp::now();
        list_agents(&daemon, ["rio", "leo", "clay"]).unwrap();
        assert_eq!(next_instance(&daemon, &rio, now).unwrap(), "rio-001");
        assert_eq!(
            next_instance(&daemon.clone(), &rio, now).unwrap(),
            "rio-002"
        );
        assert_eq!(read(), serde_json::json!({"clay": 0, "leo": 0, "rio": 2}));
        // A script's session begin replaces the file.
        assert_eq!(next_instance(&script, &rio, now).unwrap(), "rio-003");
        assert_eq!(next_instance(&daemon, &rio, now).unwrap(), "rio-004");
        // An edit in place (a new size), and one by rename.
        std::fs::write(&path, r#"{"rio": 40, "leo": 7}"#).unwrap();
        assert_eq!(next_instance(&daemon, &leo, now).unwrap(), "leo-008");
        let other = dir.path().join("other.json");
        std::fs::write(&other, r#"{"rio": 70, "leo": 70}"#).unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert_eq!(next_instance(&daemon, &rio, now).unwrap(), "rio-071");
        // list_agents adds an agent: read again, the new count kept.
        list_agents(&script, ["zed"]).unwrap();
        assert_eq!(next_instance(&daemon, &leo, now).unwrap(), "leo-071");
        assert_eq!(read(), serde_json::json!({"leo": 71, "rio": 71, "zed": 0}));
        // Removed: counted from the journals again (none here), not from
        // what was kept.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(next_instance(&daemon, &rio, now).unwrap(), "rio-001");
    }
}
