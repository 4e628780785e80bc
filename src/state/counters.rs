//! `.daemon/counters.json`: the instance counters (`rio-047`). The daemon
//! takes an instance id here for every session it spawns, and so does
//! `session begin` run by a script without a daemon: this is the store's,
//! not the daemon's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::journal;
use super::lock::flock_bounded;
use super::{AgentDir, StateRoot, atomic, note_repair, set_aside_name};
use crate::clock::Timestamp;
use crate::error::{Error, Result};

#[derive(Debug, Default, Serialize, Deserialize)]
struct Counters {
    #[serde(default)]
    counters: BTreeMap<String, u64>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// The next instance id of the agent of `dir` (`rio-047`): one counter per
/// agent in `.daemon/counters.json`, incremented under
/// `.daemon/counters.lock`, never reset. A corrupt file is set aside and the
/// count restarts above the highest instance recorded in the agent's
/// journal ([`highest_instance`]).
pub fn next_instance(root: &StateRoot, agent_dir: &AgentDir) -> Result<String> {
    let agent = agent_dir.name.as_str();
    let dir = root.daemon_dir();
    atomic::create_dir(&dir, 0o750)?;
    let lock_path = dir.join("counters.lock");
    let file = crate::state::lock::open_private_lock(&lock_path)?;
    let _lock = flock_bounded(file, &lock_path)?;
    let path = dir.join("counters.json");
    let mut counters = match atomic::read_json::<Counters>(&path) {
        Ok(c) => c.unwrap_or_default(),
        Err(Error::Corrupt { .. }) => {
            let aside = set_aside_name(&path, "corrupt", &Timestamp::now().compact());
            atomic::rename(&path, &aside)?;
            note_repair(
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
    atomic::write_json(&path, &counters)?;
    Ok(format!("{agent}-{n:03}"))
}

/// The highest instance number in an agent's journal, so a lost
/// counters.json never restarts the count at 1.
pub fn highest_instance(dir: &AgentDir) -> u64 {
    let prefix = format!("{}-", dir.name);
    journal::read(&dir.journal())
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
