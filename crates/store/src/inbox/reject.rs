//! Setting input aside: names that can be kept, `rejected/` with a `.reason.json`, and retrying rejected files once they are complete.

use super::*;

/// The longest name kept as it is when a message is moved: room is left for
/// a de-duplicating `-N` and a `.reason.json` beside it within the 255-byte
/// limit of a file name.
pub const MAX_KEPT_NAME: usize = 200;

/// `name` if it can be kept (de-duplicated and with a `.reason.json` beside
/// it) within the file name limit; else a shortened form: its first bytes,
/// `~`, a hash of the whole, and its extension.
pub fn keepable_name(name: &str) -> String {
    if name.len() <= MAX_KEPT_NAME {
        return name.to_string();
    }
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let ext = if name.ends_with(".json") { ".json" } else { "" };
    let mut cut = MAX_KEPT_NAME - 32;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{hash:016x}{ext}", &name[..cut])
}

/// A unique path for `name` in `dir` (`x.json`, `x-2.json`, …), the name
/// shortened first if it could not be kept whole ([`keepable_name`]).
pub(super) fn unique_in(dir: &Path, name: &str) -> PathBuf {
    let name = keepable_name(name);
    let candidate = dir.join(&name);
    if !fsx::exists(&candidate) {
        return candidate;
    }
    let (stem, ext) = match name.rsplit_once('.') {
        Some((s, e)) => (s.to_string(), format!(".{e}")),
        None => (name.to_string(), String::new()),
    };
    (2..)
        .map(|n| dir.join(format!("{stem}-{n}{ext}")))
        .find(|p| !fsx::exists(p))
        .expect("an unused name")
}

/// [`move_unique`] without the directory fsyncs: for a batch of moves, the
/// caller syncs both directories once after the last one. Tries the name as
/// it is first (no stat): only a name already taken costs a search.
pub(super) fn move_unique_unsynced(from: &Path, dir: &Path, name: &str) -> Result<PathBuf> {
    let first = dir.join(keepable_name(name));
    match fsx::rename(from, &first, false) {
        Ok(()) => return Ok(first),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    loop {
        let target = unique_in(dir, name);
        match fsx::rename(from, &target, false) {
            Ok(()) => return Ok(target),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {
            }
            Err(e) => return Err(e),
        }
    }
}

/// Move `from` to a unique name in `dir` (never replacing anything, never
/// through a link); returns where it went.
pub(super) fn move_unique(from: &Path, dir: &Path, name: &str) -> Result<PathBuf> {
    loop {
        let target = unique_in(dir, name);
        if atomic::rename_new(from, &target)? {
            return Ok(target);
        }
    }
}

/// Move `source` (a file in one of `agent`'s inbox directories) to
/// `rejected/`, write the reason beside it and journal it. Returns the new path.
pub fn reject(agent: &AgentDir, source: &Path, reason: &str, now: Timestamp) -> Result<PathBuf> {
    reject_marked(agent, source, reason, now, false)
}

/// [`reject`]; `retry_when_valid` marks a file that did not parse, to be
/// moved back if it is completed later ([`retry_completed`]).
pub(super) fn reject_marked(
    agent: &AgentDir,
    source: &Path,
    reason: &str,
    now: Timestamp,
    retry_when_valid: bool,
) -> Result<PathBuf> {
    let rejected = agent.rejected();
    atomic::create_dir(&rejected, INBOX_PRIVATE_DIR_MODE)?;
    let raw_name = source.file_name().unwrap_or_default();
    let name = match raw_name.to_str() {
        Some(n) => n.to_string(),
        None => format!("not-utf8-{}.json", uuid::Uuid::new_v4().simple()),
    };
    let target = unique_in(&rejected, &name);
    let target_name = target
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let mut reason_doc = serde_json::json!({
        "file": target_name,
        "original_name": raw_name.to_str().map(str::to_string).unwrap_or_else(|| escaped_name(raw_name)),
        "agent": agent.name.as_str(),
        "rejected_at": now,
        "code": "INBOX_REJECTED",
        "reason": reason,
    });
    if retry_when_valid {
        reason_doc["retry_when_valid"] = Value::Bool(true);
        // What it was when judged: a change after this is a writer coming
        // back to finish it.
        if let Ok(Some(st)) = fsx::metadata(source) {
            reason_doc["judged_version"] = Value::String(file_version(&st));
        }
    }
    if raw_name.to_str().is_none() {
        let hex: String = raw_name
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        reason_doc["original_name_bytes"] = Value::String(hex);
    }
    let mut bytes = serde_json::to_vec_pretty(&reason_doc).unwrap_or_default();
    bytes.push(b'\n');
    // The reason and the journal first, the move last: a crash in between
    // leaves the message where it was (rejected again next time), never a
    // rejected message without its reason or its journal line.
    atomic::write_file(
        &agent.store,
        &rejected.join(format!("{target_name}.reason.json")),
        &bytes,
        0o640,
    )?;
    journal::append(
        &agent.store,
        &agent.journal(),
        &Entry::new(
            now,
            Event::MessageRejected(MessageRejected {
                file: raw_name
                    .to_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| escaped_name(raw_name)),
                reason: reason.to_string(),
                moved_to: format!("inbox/rejected/{target_name}"),
            }),
        ),
    )?;
    // Never replacing anything: if the name was taken meanwhile, another.
    if !atomic::rename_new(source, &target)? {
        let target = move_unique(source, &rejected, &target_name)?;
        let _ = atomic::rename(
            &rejected.join(format!("{target_name}.reason.json")),
            &rejected.join(format!(
                "{}.reason.json",
                target.file_name().unwrap_or_default().to_string_lossy()
            )),
        );
        return Ok(target);
    }
    Ok(target)
}

/// A file that `inbox` lists under rejected/, with its reason if recorded.
#[derive(Debug, Serialize)]
pub struct RejectedFile {
    pub file: String,
    pub reason: Option<String>,
    pub rejected_at: Option<String>,
}

pub fn rejected_files(agent: &AgentDir) -> Result<Vec<RejectedFile>> {
    let dir = agent.rejected();
    let mut out = Vec::new();
    let Ok(entries) = fsx::list(&dir) else {
        return Ok(out);
    };
    for raw in entries {
        let name = match raw.to_str() {
            Some(n) => n.to_string(),
            None => escaped_name(&raw),
        };
        if name.ends_with(".reason.json") || name.starts_with('.') {
            continue;
        }
        let reason_doc: Option<Value> =
            fsx::read_limited(&dir.join(format!("{name}.reason.json")), MAX_MESSAGE_BYTES)
                .ok()
                .flatten()
                .and_then(|(b, _)| serde_json::from_slice(&b).ok());
        out.push(RejectedFile {
            file: name,
            reason: reason_doc
                .as_ref()
                .and_then(|d| d["reason"].as_str().map(str::to_string)),
            rejected_at: reason_doc
                .as_ref()
                .and_then(|d| d["rejected_at"].as_str().map(str::to_string)),
        });
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(out)
}

/// An inbox file set aside, as reported: its name in the inbox, where it is
/// kept now, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Its name in the inbox (escaped, `caf\xe9.json`, if not UTF-8).
    pub file: String,
    /// Where it is kept, from the agent's directory: `inbox/rejected/NAME`,
    /// the name it was really given (de-duplicated, shortened, or
    /// `not-utf8-….json`).
    pub kept: String,
    pub reason: String,
}

impl Rejected {
    /// `shown_name` (the inbox name, escaped if need be) set aside at `kept`.
    pub(super) fn new(shown_name: String, kept: &Path, reason: String) -> Rejected {
        Rejected {
            file: shown_name,
            kept: format!(
                "inbox/rejected/{}",
                kept.file_name().unwrap_or_default().to_string_lossy()
            ),
            reason,
        }
    }

    /// `NAME`, or `NAME (kept as inbox/rejected/KEPT)` when it was kept
    /// under another name.
    pub fn shown(&self) -> String {
        if self.kept.strip_prefix("inbox/rejected/") == Some(self.file.as_str()) {
            self.file.clone()
        } else {
            format!("{} (kept as {})", self.file, self.kept)
        }
    }
}

/// Reject for `r`: a file that did not parse is marked to be retried if it
/// is completed later (a writer that paused longer than the settle time).
pub(super) fn reject_as(
    agent: &AgentDir,
    path: &Path,
    r: &Rejection,
    now: Timestamp,
) -> Result<PathBuf> {
    reject_marked(agent, path, &r.reason, now, r.incomplete)
}

/// Files rejected because they did not parse, changed since and valid now:
/// moved back to the inbox (journaled), so a message a person finished
/// after it was judged is delivered, not lost. Returns their new names.
/// Call with the agent lock held.
pub fn retry_completed(agent: &AgentDir, now: Timestamp) -> Result<Vec<String>> {
    let dir = agent.rejected();
    let mut out = Vec::new();
    for reason_name in fsx::list(&dir)? {
        let Some(reason_name) = reason_name.to_str() else {
            continue;
        };
        let Some(file) = reason_name.strip_suffix(".reason.json") else {
            continue;
        };
        let reason_path = dir.join(reason_name);
        let Ok(Some((bytes, _))) = fsx::read_limited(&reason_path, MAX_MESSAGE_BYTES) else {
            continue;
        };
        let Ok(doc) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        if doc["retry_when_valid"] != Value::Bool(true) {
            continue;
        }
        let path = dir.join(file);
        let Ok(Some(st)) = fsx::metadata(&path) else {
            continue;
        };
        if doc["judged_version"].as_str() == Some(file_version(&st).as_str()) {
            continue;
        }
        let Ok(Some(f)) = fsx::open_read(&path) else {
            continue;
        };
        let Ok(meta) = f.metadata() else { continue };
        if meta.nlink() > 1 || meta.len() > MAX_MESSAGE_BYTES {
            continue;
        }
        let mut content = Vec::new();
        if (&f)
            .take(MAX_MESSAGE_BYTES + 1)
            .read_to_end(&mut content)
            .is_err()
        {
            continue;
        }
        let stem = file.trim_end_matches(".json");
        if validate(&content, stem, &agent.name, now).is_err() {
            continue;
        }
        let original = doc["original_name"].as_str().unwrap_or(file).to_string();
        out.push(move_back(
            agent,
            file,
            &original,
            "completed after it was rejected as unparsable: delivered",
            now,
        )?);
    }
    Ok(out)
}

/// Move `rejected/{file}` back to the inbox under `name` (a free one),
/// remove its reason file and journal `message_retried` with `why`.
/// Returns the name it has in the inbox. Call with the agent lock held.
pub(super) fn move_back(
    agent: &AgentDir,
    file: &str,
    name: &str,
    why: &str,
    now: Timestamp,
) -> Result<String> {
    let back = move_unique(&agent.rejected().join(file), &agent.inbox(), name)?;
    fsx::remove_file(&agent.rejected().join(format!("{file}.reason.json")))?;
    let back_name = back
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    journal::append(
        &agent.store,
        &agent.journal(),
        &Entry::new(
            now,
            Event::MessageRetried(crate::state::journal::MessageRetried {
                file: back_name.clone(),
                from: format!("inbox/rejected/{file}"),
                reason: why.into(),
            }),
        ),
    )?;
    Ok(back_name)
}
