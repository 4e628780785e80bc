//! A session's messages: the claim into `.claimed/ID/`, reading them back, acknowledging them into `processed/`, returning them to the inbox.

use super::mover::{MOVER_BATCH, Mover};
use super::*;

/// What claiming found.
#[derive(Debug, Default)]
pub struct Claim {
    /// In delivery order.
    pub claimed: Vec<Message>,
    pub rejected: Vec<Rejected>,
    pub expired: Vec<String>,
    pub unsettled: Vec<String>,
}

/// Validate every waiting message and move the valid ones to
/// `.claimed/{session_id}/`. Call with the agent lock held.
/// Names a writer still has open (known to the daemon's watch).
pub type Writing = std::collections::BTreeSet<String>;

/// `files` is the clock the files settle by, read once the lock is held.
#[allow(clippy::too_many_arguments)]
pub fn claim(
    agent: &AgentDir,
    session_id: &str,
    now: Timestamp,
    settle: Duration,
    files: FileClock,
    writing: &Writing,
    known: Option<&Known>,
    listed: Option<&Listed>,
) -> Result<Claim> {
    crate::session_id::check(session_id)?;
    let mut out = Claim::default();
    let Some(listing) = Listing::open(agent, listed)? else {
        return Ok(out);
    };
    // Names listed beforehand may be gone since (claimed by a script's
    // `session begin`, rejected by a scan, removed by hand): skipped, never
    // judged "vanished" and set aside.
    let gone = |name: &str| {
        listed.is_some()
            && matches!(
                fsx::stat_at(
                    listing.dir.as_fd(),
                    OsStr::new(name),
                    &agent.inbox().join(name)
                ),
                Ok(None)
            )
    };
    let undecodable: Vec<OsString> = listing
        .undecodable
        .iter()
        .filter(|n| {
            !(listed.is_some()
                && matches!(
                    fsx::stat_at(listing.dir.as_fd(), n.as_os_str(), &agent.inbox().join(n)),
                    Ok(None)
                ))
        })
        .cloned()
        .collect();
    out.rejected.extend(reject_names(agent, undecodable, now)?);
    if listing.names.is_empty() {
        return Ok(out);
    }
    let inbox_dir = listing.dir.as_fd();
    let claimed_dir = agent.claimed(session_id);
    let now_sys: SystemTime = now.0.into();
    // The caller's file clock for settling: `now` is whole seconds.
    let settle_now = files.now().max(now_sys);
    // Ids already taken: a message claimed in this batch, or one processed
    // under that name. A second message with a taken id is delivered with a
    // new one, the id it came with in `original_id` (seed 002, "duplicate
    // id": generate a new id), so replies, acknowledgements and the journal
    // name one message each.
    let mut taken: std::collections::HashSet<String> = std::collections::HashSet::new();
    // Claimed with a new id: indexes in `out.claimed`, rewritten once
    // renamed.
    let mut renamed_ids: Vec<usize> = Vec::new();
    // The file name of each message in `out.claimed`, in step with it.
    let mut claimed_names: Vec<String> = Vec::new();
    let mut processed = Processed::new(agent);
    let big = listing.names.len() >= MOVER_BATCH;
    std::thread::scope(|scope| -> Result<()> {
        // Started at the first message claimed.
        let mut mover: Option<Mover<'_, '_>> = None;
        for name in listing.names {
            if gone(&name) {
                continue;
            }
            let path = agent.inbox().join(&name);
            let intake = Intake {
                settle,
                writer_open: writing.contains(&name),
            };
            let (verdict, stamp) = inspect_with(agent, inbox_dir, &name, settle_now, intake, known);
            match verdict {
                Verdict::Unsettled(_) => out.unsettled.push(name),
                Verdict::Invalid(r) => {
                    let kept = reject_as(agent, &path, &r, now)?;
                    out.rejected.push(Rejected::new(name, &kept, r.reason));
                }
                Verdict::Valid(m) if m.attempts >= MAX_ATTEMPTS => {
                    let reason = format!("undeliverable: {} failed delivery attempts", m.attempts);
                    let kept = reject(agent, &path, &reason, now)?;
                    out.rejected.push(Rejected::new(name, &kept, reason));
                }
                Verdict::Valid(m) if m.is_expired(now) => {
                    atomic::create_dir(&agent.processed(), INBOX_PRIVATE_DIR_MODE)?;
                    move_unique_unsynced(&path, &agent.processed(), &name)?;
                    // processed/ may have been made just now.
                    processed = Processed::new(agent);
                    journal::append(
                        &agent.store,
                        &agent.journal(),
                        &Entry::new(
                            now,
                            Event::MessageExpired(MessageExpired {
                                message_id: m.id.clone(),
                                file: name.clone(),
                            }),
                        ),
                    )?;
                    out.expired.push(m.id.clone());
                }
                Verdict::Valid(mut m) => {
                    let mover = match &mut mover {
                        Some(mover) => mover,
                        None => {
                            atomic::create_dir(&claimed_dir, INBOX_PRIVATE_DIR_MODE)?;
                            let to = fsx::dir(&claimed_dir)?;
                            mover.insert(Mover::start(
                                scope,
                                big,
                                inbox_dir,
                                to,
                                agent,
                                &claimed_dir,
                            ))
                        }
                    };
                    mover.claim(&name, stamp)?;
                    let processed_as = format!("{}.json", m.id);
                    let dup = taken.contains(&m.id)
                        || (is_message_name(&processed_as)
                            && !m.id.contains('/')
                            && processed.is_taken(&processed_as)?);
                    if dup {
                        let original =
                            std::mem::replace(&mut m.id, uuid::Uuid::new_v4().to_string());
                        m.extra
                            .insert("original_id".into(), Value::String(original.clone()));
                        tracing::info!(
                            agent = %agent.name,
                            "{name}: its id {original:?} is taken by another message: delivered as {}",
                            m.id
                        );
                        renamed_ids.push(out.claimed.len());
                    }
                    taken.insert(m.id.clone());
                    claimed_names.push(name);
                    out.claimed.push(*m);
                }
            }
        }
        if let Some(mut mover) = mover {
            mover.finish()?;
            // Rewritten in `.claimed/`, once each: a message given a new id
            // (its claimed copy says so too: it is what the session and the
            // journal read back), and one whose file was swapped between
            // its check and its rename and went back to the inbox (see
            // `mover`): the message checked, and quoted, is what the claim
            // holds.
            let mut rewrite = std::collections::BTreeSet::from_iter(renamed_ids);
            for name in mover.swapped() {
                tracing::warn!(
                    agent = %agent.name,
                    "{name}: replaced in the inbox between its check and its claim; the message checked is delivered, and the file put in its place is back in the inbox, to be judged as a new one"
                );
                rewrite.extend(claimed_names.iter().position(|n| n == name));
            }
            for i in rewrite {
                write_message(agent, &claimed_dir.join(&claimed_names[i]), &out.claimed[i])?;
            }
            // A mover is made for the first message claimed: the inbox
            // lost names.
            fsx::sync_fd(inbox_dir, &agent.inbox())?;
            fsx::sync_fd(mover.to(), &claimed_dir)?;
        }
        Ok(())
    })?;
    if out.claimed.is_empty() && !out.expired.is_empty() {
        fsx::sync_fd(inbox_dir, &agent.inbox())?;
    }
    if !out.expired.is_empty() {
        atomic::sync_dir(&agent.processed())?;
    }
    out.claimed.sort_by(Message::delivery_order);
    Ok(out)
}

/// `processed/`, opened at the first name looked up there (once per claim,
/// not once per message): is a message's id taken by one acknowledged before?
struct Processed<'a> {
    agent: &'a AgentDir,
    dir: Option<Option<std::os::fd::OwnedFd>>,
}

impl<'a> Processed<'a> {
    fn new(agent: &'a AgentDir) -> Processed<'a> {
        Processed { agent, dir: None }
    }

    fn is_taken(&mut self, name: &str) -> Result<bool> {
        let path = self.agent.processed();
        if self.dir.is_none() {
            self.dir = Some(fsx::open_dir(&path)?);
        }
        let Some(Some(dir)) = &self.dir else {
            return Ok(false);
        };
        Ok(fsx::stat_at(dir.as_fd(), OsStr::new(name), &path.join(name))?.is_some())
    }
}

/// The messages claimed by `session_id`, in delivery order, with their files.
pub fn claimed(agent: &AgentDir, session_id: &str) -> Result<Vec<(PathBuf, Message)>> {
    let dir = agent.claimed(crate::session_id::check(session_id)?);
    let mut out = Vec::new();
    // One handle for the directory: each file is opened by name in it.
    let Some(handle) = fsx::open_dir(&dir)? else {
        return Ok(out);
    };
    let listed = handle
        .try_clone()
        .map_err(|e| Error::io("listing", &dir, e))?;
    for name in fsx::list_fd(listed, &dir)? {
        let path = dir.join(&name);
        let Some(name) = name.to_str().map(str::to_string) else {
            continue;
        };
        if !is_message_name(&name) {
            continue;
        }
        let stem = name.trim_end_matches(".json");
        // The handle's own `fstat` serves the whole read, as at the intake.
        let Some((mut file, st)) =
            fsx::open_read_at_stat(handle.as_fd(), OsStr::new(&name), &path)?
        else {
            continue;
        };
        // Swapped for a hard link since it was claimed: never read.
        if st.st_nlink > 1 {
            continue;
        }
        let bytes = fsx::read_sized(&mut file, st.st_size.max(0) as u64, MAX_MESSAGE_BYTES)
            .at("reading", &path)?;
        // The file's mtime (kept by the renames), as for a waiting message:
        // a message without `created_at` keeps the same sent time and order.
        let mtime =
            Timestamp::from_datetime(chrono::DateTime::<chrono::Utc>::from(fsx::modified(&st)));
        // A claimed file was valid when claimed; if someone edited it since,
        // keep it in the session anyway with what can be read.
        if let Ok(mut m) = validate(&bytes, stem, &agent.name, mtime) {
            m.file_owner = Some(st.st_uid);
            out.push((path, m));
        }
    }
    out.sort_by(|a, b| Message::delivery_order(&a.1, &b.1));
    Ok(out)
}

/// Session succeeded: move its claimed messages to `processed/`, without
/// reading them again (what they say was read when they were claimed and
/// when the session's end was journaled). One fsync of each directory for
/// the whole batch, after the last rename. Returns how many moved. Call with
/// the agent lock held.
pub fn acknowledge(agent: &AgentDir, session_id: &str) -> Result<usize> {
    let dir = agent.claimed(crate::session_id::check(session_id)?);
    let Some(from) = fsx::open_dir(&dir)? else {
        finish_claim_dir(agent, &dir)?;
        return Ok(0);
    };
    let listed = from
        .try_clone()
        .map_err(|e| Error::io("listing", &dir, e))?;
    let names: Vec<String> = fsx::list_fd(listed, &dir)?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| is_message_name(n))
        .collect();
    if !names.is_empty() {
        let processed = agent.processed();
        atomic::create_dir(&processed, INBOX_PRIVATE_DIR_MODE)?;
        let to = fsx::dir(&processed)?;
        // The daemon's sessions ending together take turns (see
        // `Store::acknowledging_one_at_a_time`).
        let _turn = agent.store.acknowledgement_turn();
        for name in &names {
            // By the two handles, under its own name; a name already taken
            // in processed/ (a message sent twice under one name) costs a
            // search for a free one.
            let kept = keepable_name(name);
            match fsx::rename_at(
                from.as_fd(),
                name.as_ref(),
                to.as_fd(),
                kept.as_ref(),
                false,
            ) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    move_unique_unsynced(&dir.join(name), &processed, name)?;
                }
                Err(e) => {
                    return Err(Error::io(
                        "renaming",
                        dir.join(name),
                        std::io::Error::new(
                            e.kind(),
                            format!("to {}: {e}", processed.join(&kept).display()),
                        ),
                    ));
                }
            }
        }
        fsx::sync_fd(&to, &processed)?;
        fsx::sync_fd(&from, &dir)?;
    }
    finish_claim_dir(agent, &dir)?;
    Ok(names.len())
}

/// A waiting message handled without a session (a human's reply that the
/// flow router acted on): moved to `processed/` as a session's would be.
/// `Ok(false)` if it is no longer waiting. Call with the agent lock held.
pub fn process_waiting(agent: &AgentDir, name: &str) -> Result<bool> {
    if !is_message_name(name) {
        return Ok(false);
    }
    let from = agent.inbox().join(name);
    if !fsx::exists(&from) {
        return Ok(false);
    }
    let processed = agent.processed();
    atomic::create_dir(&processed, INBOX_PRIVATE_DIR_MODE)?;
    move_unique_unsynced(&from, &processed, name)?;
    atomic::sync_dir(&processed)?;
    atomic::sync_dir(&agent.inbox())?;
    Ok(true)
}

/// Session failed: put its claimed messages back in the inbox with one more
/// attempt counted, or in `rejected/` once they reach [`MAX_ATTEMPTS`].
/// Returns (returned ids, undeliverable ids). Call with the agent lock held.
pub fn return_claimed(
    agent: &AgentDir,
    session_id: &str,
    now: Timestamp,
) -> Result<(Vec<String>, Vec<String>)> {
    return_claimed_counting(agent, session_id, now, true)
}

/// [`return_claimed`]; with `count = false` the attempt is not counted: the
/// session did not fail on its messages, its process (or the daemon) was
/// killed under it, and a crash-looping daemon must not make messages
/// undeliverable.
pub fn return_claimed_counting(
    agent: &AgentDir,
    session_id: &str,
    now: Timestamp,
    count: bool,
) -> Result<(Vec<String>, Vec<String>)> {
    let mut returned = Vec::new();
    let mut undeliverable = Vec::new();
    let dir = agent.claimed(crate::session_id::check(session_id)?);
    if fsx::open_dir(&dir)?.is_none() {
        return Ok((returned, undeliverable));
    }
    for raw in fsx::list(&dir)? {
        let path = dir.join(&raw);
        let name = raw.to_string_lossy().to_string();
        let bytes = match fsx::read_limited(&path, MAX_MESSAGE_BYTES)? {
            Some((b, _)) => b,
            None => continue,
        };
        let stem = name.trim_end_matches(".json");
        match validate(&bytes, stem, &agent.name, now) {
            Ok(mut m) => {
                if count {
                    m.attempts += 1;
                }
                if m.attempts >= MAX_ATTEMPTS {
                    // Record the count in the file first, so the rejected
                    // copy says how many times it was tried.
                    write_message(agent, &path, &m)?;
                    let reason = format!(
                        "undeliverable: {} sessions that claimed it failed (last: {session_id})",
                        m.attempts
                    );
                    reject(agent, &path, &reason, now)?;
                    undeliverable.push(m.id);
                } else {
                    // Only a counted attempt changes the file: an uncounted
                    // return is a rename (no rewrite, no fsync per message:
                    // thousands of messages go back after a crash).
                    if count {
                        write_message(agent, &path, &m)?;
                    }
                    move_unique_unsynced(&path, &agent.inbox(), &name)?;
                    returned.push(m.id);
                }
            }
            Err(r) => {
                reject(
                    agent,
                    &path,
                    &format!("edited while claimed: {}", r.reason),
                    now,
                )?;
                undeliverable.push(stem.to_string());
            }
        }
    }
    atomic::sync_dir(&agent.inbox())?;
    finish_claim_dir(agent, &dir)?;
    Ok((returned, undeliverable))
}

/// Removes a session's claim directory `dir` once it is empty (its
/// callers made it from a checked session id).
fn finish_claim_dir(agent: &AgentDir, dir: &Path) -> Result<()> {
    match fsx::remove_dir(dir) {
        Ok(true) => atomic::sync_dir(&agent.claimed_root()),
        Ok(false) => Ok(()),
        // Something unexpected is left in it: keep it for a human.
        Err(_) => Ok(()),
    }
}

/// Sessions with a `.claimed/` directory.
pub fn claimed_sessions(agent: &AgentDir) -> Result<Vec<String>> {
    let dir = agent.claimed_root();
    let mut out = Vec::new();
    for name in fsx::list(&dir)? {
        if let Some(name) = name.to_str()
            && fsx::is_dir(&dir.join(name))
        {
            out.push(name.to_string());
        }
    }
    out.sort();
    Ok(out)
}

pub(super) fn write_message(agent: &AgentDir, path: &Path, m: &Message) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(m).unwrap_or_default();
    bytes.push(b'\n');
    atomic::write_file(&agent.store, path, &bytes, MESSAGE_MODE)
}
