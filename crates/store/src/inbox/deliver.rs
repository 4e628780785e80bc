//! Writing a message into an inbox (`send`, escalations): `inbox/.tmp/`, fsync, rename in, directory fsync.

use super::*;

/// A message to send.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub from: AgentName,
    pub kind: MessageType,
    pub priority: Priority,
    pub subject: String,
    pub body: String,
    pub source_ref: Option<String>,
    pub expires_at: Option<Timestamp>,
}

/// Deliver `out` into `to`'s inbox: written in `inbox/.tmp/`, fsynced, renamed
/// in, directory fsynced. Returns the message as delivered.
pub fn deliver(to: &AgentDir, out: &Outgoing, now: Timestamp) -> Result<Message> {
    deliver_with_id(to, out, uuid::Uuid::new_v4().to_string(), now)
}

/// [`deliver`] under a fixed id, once: `Ok(None)` if a message of that id
/// is already in the inbox, claimed, processed or rejected (a sender that
/// retries after a crash, such as the flow router, delivers it only once).
pub fn deliver_once(
    to: &AgentDir,
    out: &Outgoing,
    id: &str,
    now: Timestamp,
) -> Result<Option<Message>> {
    to.require()?;
    let name = format!("{id}.json");
    let mut places = vec![to.inbox(), to.processed(), to.rejected()];
    if let Ok(entries) = fsx::list(&to.claimed_root()) {
        places.extend(entries.into_iter().map(|e| to.claimed_root().join(e)));
    }
    if places.iter().any(|dir| fsx::exists(&dir.join(&name))) {
        return Ok(None);
    }
    deliver_with_id(to, out, id.to_string(), now).map(Some)
}

fn deliver_with_id(to: &AgentDir, out: &Outgoing, id: String, now: Timestamp) -> Result<Message> {
    to.require()?;
    let message = Message {
        id: id.clone(),
        from: out.from.to_string(),
        to: to.name.to_string(),
        created_at: now,
        kind: out.kind,
        priority: out.priority,
        subject: out.subject.clone(),
        body: out.body.clone(),
        source_ref: out.source_ref.clone(),
        expires_at: out.expires_at,
        attempts: 0,
        extra: Map::new(),
        // This process creates the file: it is its owner.
        file_owner: Some(nix::unistd::geteuid().as_raw()),
    };
    let mut bytes = serde_json::to_vec_pretty(&message).unwrap_or_default();
    bytes.push(b'\n');
    if bytes.len() as u64 > MAX_MESSAGE_BYTES {
        return Err(Error::Data(format!(
            "the message to {} would be {} bytes; the limit is {MAX_MESSAGE_BYTES} (1 MiB): put large content in a file and name it with --source-ref",
            to.name,
            bytes.len()
        )));
    }
    let tmp_dir = to.inbox_tmp();
    atomic::create_dir(&tmp_dir, INBOX_DIR_MODE)?;
    // Written under a new name in inbox/.tmp/ (O_EXCL, never through a link,
    // its mode set exactly whatever the umask), fsynced, renamed in without
    // replacing anything.
    let tmp_fd = fsx::dir(&tmp_dir)?;
    let (mut f, tmp_name) = fsx::create_temp(tmp_fd.as_fd(), &tmp_dir, MESSAGE_MODE)?;
    let tmp = tmp_dir.join(&tmp_name);
    let written = f
        .write_all(&bytes)
        .and_then(|()| f.sync_all())
        .at("writing", &tmp);
    if let Err(e) = written {
        fsx::discard_at(tmp_fd.as_fd(), &tmp_name);
        return Err(e);
    }
    let target = to.inbox().join(format!("{id}.json"));
    if let Err(e) = atomic::rename_new(&tmp, &target) {
        fsx::discard_at(tmp_fd.as_fd(), &tmp_name);
        return Err(e);
    }
    journal_delivered(to, &message, now);
    Ok(message)
}

/// Journal the arrival of a message just delivered, if the sender may and
/// the recipient's lock is free this instant: a human mailbox is never read
/// by the daemon's intake, so this is its only `message_received`; an
/// agent's intake writes it otherwise (a sender in the inbox group cannot
/// write the journal, and a sender never waits for a recipient's lock).
fn journal_delivered(to: &AgentDir, message: &Message, now: Timestamp) {
    let lock = to.lock_within(Duration::ZERO);
    if let Ok(lock) = lock {
        let stripped = Message {
            body: String::new(),
            ..message.clone()
        };
        if let Err(e) = super::journal_arrivals(to, &lock, &[&stripped], now) {
            tracing::debug!(agent = %to.name, "message {} delivered, its arrival not journaled: {e}", message.id);
        }
    }
}

/// Count of regular entries in a directory (0 if it does not exist).
pub fn count_files(dir: &Path) -> usize {
    fsx::list(dir)
        .map(|names| {
            names
                .iter()
                .filter(|n| {
                    matches!(fsx::metadata(&dir.join(n)), Ok(Some(st)) if fsx::file_type(&st) == SFlag::S_IFREG)
                })
                .count()
        })
        .unwrap_or(0)
}
