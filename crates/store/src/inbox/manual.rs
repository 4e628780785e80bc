//! What a person does to a mailbox by hand (the human mailbox as a
//! workflow): find a message wherever it lies, acknowledge a waiting one
//! (to `processed/`, journaled), redeliver a rejected one (back to the
//! inbox, its reason file removed, journaled) once it is valid.

use super::*;

/// Where a message lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    Waiting,
    Claimed,
    Processed,
    Rejected,
}

impl Place {
    pub fn as_str(self) -> &'static str {
        match self {
            Place::Waiting => "waiting",
            Place::Claimed => "claimed",
            Place::Processed => "processed",
            Place::Rejected => "rejected",
        }
    }
}

/// A message found by its id or file name.
#[derive(Debug)]
pub struct Found {
    pub place: Place,
    pub path: PathBuf,
    /// Its bytes (at most the message limit).
    pub bytes: Vec<u8>,
}

/// The file name `wanted` means: `ID`, `ID.json` or a file name.
fn file_name(wanted: &str) -> String {
    if wanted.ends_with(".json") {
        wanted.to_string()
    } else {
        format!("{wanted}.json")
    }
}

/// Find message `wanted` (an id or a file name) in `agent`'s inbox, its
/// claimed, processed or rejected messages; a message id is also looked
/// for inside the files of `processed/` when its file name differs.
pub fn find(agent: &AgentDir, wanted: &str) -> Result<Option<Found>> {
    let name = file_name(wanted);
    if name.contains('/') || !is_message_name(&name) {
        return Err(Error::Usage(format!(
            "{wanted:?} is not a message id or file name (e.g. 3f2a…-….json)"
        )));
    }
    let mut places = vec![(Place::Waiting, agent.inbox())];
    for session in fsx::list(&agent.claimed_root())? {
        places.push((Place::Claimed, agent.claimed_root().join(session)));
    }
    places.push((Place::Processed, agent.processed()));
    places.push((Place::Rejected, agent.rejected()));
    for (place, dir) in &places {
        let path = dir.join(&name);
        if let Some((bytes, _)) = fsx::read_limited(&path, MAX_MESSAGE_BYTES)? {
            return Ok(Some(Found {
                place: *place,
                path,
                bytes,
            }));
        }
    }
    // An id's beginning, as people copy it from a listing (`3f2a9c`).
    let Some(prefix) = id_prefix(wanted) else {
        return Ok(None);
    };
    let mut matches = Vec::new();
    for (place, dir) in &places {
        for n in fsx::list(dir)? {
            let Some(n) = n.to_str() else { continue };
            if n.starts_with(prefix) && n.ends_with(".json") && is_message_name(n) {
                matches.push((*place, dir.join(n)));
            }
        }
    }
    match matches.len() {
        0 => Ok(None),
        1 => {
            let (place, path) = matches.remove(0);
            Ok(
                fsx::read_limited(&path, MAX_MESSAGE_BYTES)?.map(|(bytes, _)| Found {
                    place,
                    path,
                    bytes,
                }),
            )
        }
        n => Err(Error::Usage(format!(
            "{}: {wanted:?} is the beginning of {n} messages' ids ({}); give more of it",
            agent.name,
            matches
                .iter()
                .take(5)
                .map(|(place, p)| format!(
                    "{} ({})",
                    p.file_name().unwrap_or_default().to_string_lossy(),
                    place.as_str()
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The shortest beginning of an id looked up by prefix.
const MIN_PREFIX: usize = 4;

/// `wanted` as the beginning of an id: at least [`MIN_PREFIX`] characters
/// of an id's alphabet (hex digits and dashes), no `.json`.
fn id_prefix(wanted: &str) -> Option<&str> {
    (wanted.len() >= MIN_PREFIX && wanted.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        .then_some(wanted)
}

/// The file name of a found message.
fn found_name(found: &Found) -> String {
    found
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Acknowledge waiting message `wanted`: moved to `processed/` and
/// journaled (`message_acknowledged`). Call with the agent lock held.
pub fn acknowledge_waiting(agent: &AgentDir, wanted: &str, now: Timestamp) -> Result<String> {
    let Some(found) = find(agent, wanted)? else {
        return Err(Error::NotFound(format!(
            "{}: no message {wanted:?} in {}",
            agent.name,
            agent.inbox().display()
        )));
    };
    if found.place != Place::Waiting {
        return Err(Error::Usage(format!(
            "{}: message {wanted:?} is {}, not waiting: only a waiting message is acknowledged",
            agent.name,
            found.place.as_str()
        )));
    }
    let name = found_name(&found);
    let id = serde_json::from_slice::<Value>(&found.bytes)
        .ok()
        .and_then(|v| v["id"].as_str().map(str::to_string))
        .unwrap_or_else(|| name.trim_end_matches(".json").to_string());
    journal::append(
        &agent.store,
        &agent.journal(),
        &Entry::new(
            now,
            Event::MessageAcknowledged(crate::state::journal::MessageAcknowledged {
                message_id: id.clone(),
                file: name.clone(),
            }),
        ),
    )?;
    process_waiting(agent, &name)?;
    Ok(id)
}

/// Move rejected message `wanted` back to the inbox if it is valid now
/// (else the validation error, and nothing moves); its reason file is
/// removed and the move journaled. Call with the agent lock held.
pub fn redeliver(agent: &AgentDir, wanted: &str, now: Timestamp) -> Result<String> {
    let Some(found) = find(agent, wanted)? else {
        return Err(Error::NotFound(format!(
            "{}: no message {wanted:?} in {}",
            agent.name,
            agent.rejected().display()
        )));
    };
    if found.place != Place::Rejected {
        return Err(Error::Usage(format!(
            "{}: message {wanted:?} is {}: only a rejected message is redelivered",
            agent.name,
            found.place.as_str()
        )));
    }
    let name = found_name(&found);
    if let Some(st) = fsx::metadata(&found.path)?
        && (fsx::file_type(&st) != SFlag::S_IFREG || st.st_nlink > 1)
    {
        return Err(Error::Data(format!(
            "{}: {} is not a plain file with one link (a {}): it stays rejected",
            agent.name,
            found.path.display(),
            fsx::describe_stat(&st)
        )));
    }
    let stem = name.trim_end_matches(".json");
    if let Err(r) = validate(&found.bytes, stem, &agent.name, now) {
        return Err(Error::Data(format!(
            "{}: {} is still not a valid message: {}; fix it where it lies, then redeliver it",
            agent.name,
            found.path.display(),
            r.reason
        )));
    }
    // Its reason file goes with it; what it was is in the journal.
    let back = move_back(
        agent,
        &name,
        &name,
        "redelivered by hand (agent-state inbox redeliver)",
        now,
    )?;
    atomic::sync_dir(&agent.rejected())?;
    Ok(back)
}
