//! `message_received`: a message's arrival, in its recipient's journal,
//! once per message — whoever sees it first writes it (the daemon's intake
//! when the file lands, or a session's claim when the claim got there
//! first, or a script run without a daemon), and a message seen again (the
//! daemon restarted, a failed session returned it) is found in the journal
//! and not written twice.
//!
//! The journal is the memory: it is read backwards from its end down to two
//! minutes before the oldest new message was written (its `created_at`), so
//! a fresh message costs a few lines. The sender chooses `created_at`: the
//! read stops at [`LOOKBACK_MAX`] in time and [`LINES_MAX`] in lines, so a
//! message claiming to be from 1970 costs a bounded read, and at worst is
//! written a second time if its first line is older than that.

use std::collections::HashSet;
use std::ops::ControlFlow;

use chrono::Duration;

use super::Message;
use crate::clock::Timestamp;
use crate::error::Result;
use crate::state::AgentDir;
use crate::state::journal::{self, Entry, Event, MessageReceived};
use crate::state::lock::AgentLock;

/// Clock skew allowed between a message's `created_at` and its
/// `message_received` line: senders on this machine stamp it with this
/// clock, a file without one gets its mtime; a sender's clock further ahead
/// costs at worst a second line. Small, because every arrival reads the
/// journal back this far.
const SKEW: Duration = Duration::minutes(2);
/// The furthest back the journal is read.
pub const LOOKBACK_MAX: Duration = Duration::days(30);
/// The most journal lines read for one batch.
pub const LINES_MAX: usize = 100_000;
/// The longest subject copied into the journal, in characters.
const SUBJECT_MAX: usize = 200;

/// How far back the journal is read for `arrived` (pure).
pub fn lookback_floor(arrived: &[&Message], now: Timestamp) -> Timestamp {
    let oldest = arrived
        .iter()
        .map(|m| m.created_at.0)
        .min()
        .unwrap_or(now.0);
    let floor = oldest.checked_sub_signed(SKEW).unwrap_or(oldest);
    let bound = now.0.checked_sub_signed(LOOKBACK_MAX).unwrap_or(now.0);
    Timestamp::from_datetime(floor.max(bound))
}

/// The `message_received` event of `m`; `sender` names the owner of its
/// file ([`user_name`]).
pub fn event(m: &Message, sender: Option<String>) -> Event {
    Event::MessageReceived(MessageReceived {
        message_id: m.id.clone(),
        from: m.from.clone(),
        kind: m.kind,
        priority: m.priority.as_str().to_string(),
        subject: m.subject.chars().take(SUBJECT_MAX).collect(),
        sender,
    })
}

/// A user's name as the system knows it, or `uid N` without a passwd entry
/// (or when the lookup fails).
pub fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => format!("uid {uid}"),
    }
}

/// Journal `message_received` for each of `arrived` that the journal does
/// not have yet, in one append; returns how many were written. Call with
/// the agent lock held (`_lock`), so two writers cannot both miss a line.
pub fn journal_arrivals(
    agent: &AgentDir,
    _lock: &AgentLock,
    arrived: &[&Message],
    now: Timestamp,
) -> Result<usize> {
    if arrived.is_empty() {
        return Ok(0);
    }
    let wanted: HashSet<&str> = arrived.iter().map(|m| m.id.as_str()).collect();
    let seen = journaled(agent, &wanted, lookback_floor(arrived, now))?;
    let mut lines = Vec::new();
    let mut written = HashSet::new();
    // One lookup per sender, not per message (a burst is one sender's).
    let mut names: std::collections::HashMap<u32, String> = std::collections::HashMap::new();
    for m in arrived {
        if seen.contains(m.id.as_str()) || !written.insert(m.id.as_str()) {
            continue;
        }
        let sender = m
            .file_owner
            .map(|uid| names.entry(uid).or_insert_with(|| user_name(uid)).clone());
        lines.extend(Entry::new(now, event(m, sender)).to_line());
    }
    if !lines.is_empty() {
        journal::append_lines(&agent.store, &agent.journal(), &lines)?;
    }
    Ok(written.len())
}

/// The ids of `wanted` that have a `message_received` line in `agent`'s
/// journal written at or after `floor`.
fn journaled(
    agent: &AgentDir,
    wanted: &HashSet<&str>,
    floor: Timestamp,
) -> Result<HashSet<String>> {
    #[derive(serde::Deserialize)]
    struct Ts {
        ts: Timestamp,
    }
    let mut found = HashSet::new();
    let mut lines = 0usize;
    journal::scan_lines_backwards(&agent.store, &agent.journal(), |line| {
        lines += 1;
        if lines > LINES_MAX {
            return ControlFlow::Break(());
        }
        if contains(line, b"\"message_received\"") {
            // The id as written, without parsing the line: a burst reads
            // back thousands of arrivals of the last minutes per pass, and
            // only a wanted id's line needs the parse that confirms it.
            if let Some(id) = raw_message_id(line)
                && !wanted.contains(id)
            {
                return ControlFlow::Continue(());
            }
            if let Ok(Entry {
                event: Event::MessageReceived(r),
                ..
            }) = serde_json::from_slice::<Entry>(line)
                && wanted.contains(r.message_id.as_str())
            {
                found.insert(r.message_id);
                if found.len() == wanted.len() {
                    return ControlFlow::Break(());
                }
            }
        } else if let Ok(t) = serde_json::from_slice::<Ts>(line)
            && t.ts < floor
        {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    })?;
    Ok(found)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

/// The `message_id` of a journal line as its bytes stand, when it needs no
/// unescaping (`None` otherwise, or without one: the caller parses). The
/// first `"message_id":"` of a line is the field's: inside a string value
/// its quotes would be escaped.
fn raw_message_id(line: &[u8]) -> Option<&str> {
    const KEY: &[u8] = b"\"message_id\":\"";
    let start = memchr::memmem::find(line, KEY)? + KEY.len();
    let len = memchr::memchr(b'"', &line[start..])?;
    let id = &line[start..start + len];
    if id.contains(&b'\\') {
        return None;
    }
    std::str::from_utf8(id).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: &str, created: &str) -> Message {
        let json = format!(
            r#"{{"id":"{id}","from":"leo","to":"rio","created_at":"{created}","type":"question","priority":"high","subject":"s","body":"b"}}"#
        );
        super::super::validate(
            json.as_bytes(),
            id,
            &crate::agent_name::AgentName::parse("rio").unwrap(),
            Timestamp::parse("2026-01-01T00:00:00Z").unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn the_lookback_floor_is_the_oldest_message_less_the_skew_within_the_bound() {
        let now = Timestamp::parse("2026-03-31T12:00:00Z").unwrap();
        for (created, floor) in [
            // A fresh message: two minutes before it.
            ("2026-03-31T11:59:00Z", "2026-03-31T11:57:00Z"),
            // Written yesterday.
            ("2026-03-30T12:00:00Z", "2026-03-30T11:58:00Z"),
            // From 1970 (the sender's word): thirty days, no further.
            ("1970-01-01T00:00:00Z", "2026-03-01T12:00:00Z"),
            // From the future: two minutes before it.
            ("2026-04-30T00:00:00Z", "2026-04-29T23:58:00Z"),
        ] {
            let m = msg("a", created);
            assert_eq!(
                lookback_floor(&[&m], now),
                Timestamp::parse(floor).unwrap(),
                "{created}"
            );
        }
        let (a, b) = (
            msg("a", "2026-03-31T11:00:00Z"),
            msg("b", "2026-03-20T00:00:00Z"),
        );
        assert_eq!(
            lookback_floor(&[&a, &b], now),
            Timestamp::parse("2026-03-19T23:58:00Z").unwrap()
        );
    }

    #[test]
    fn each_message_is_journaled_once_across_passes_and_duplicates_in_a_batch() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = crate::state::StateRoot::new(tmp.path())
            .agent(&crate::agent_name::AgentName::parse("rio").unwrap());
        std::fs::create_dir_all(&dir.path).unwrap();
        let lock = dir.lock().unwrap();
        let now = Timestamp::parse("2026-03-31T12:00:00Z").unwrap();
        let (a, b) = (
            msg("a", "2026-03-31T11:59:00Z"),
            msg("b", "2026-03-31T11:59:30Z"),
        );
        assert_eq!(journal_arrivals(&dir, &lock, &[&a, &a], now).unwrap(), 1);
        // Another event between: the scan goes past it.
        let other = Event::MessageSent(journal::MessageSent {
            message_id: "x".into(),
            to: "leo".into(),
            kind: crate::state::journal::MessageType::Flag,
            subject: "message_received".into(),
        });
        dir.journal_append(&lock, now, other).unwrap();
        assert_eq!(journal_arrivals(&dir, &lock, &[&a, &b], now).unwrap(), 1);
        assert_eq!(journal_arrivals(&dir, &lock, &[&b, &a], now).unwrap(), 0);
        let text = std::fs::read_to_string(dir.journal()).unwrap();
        assert_eq!(
            text.matches(r#""event":"message_received""#).count(),
            2,
            "{text}"
        );
        assert!(
            text.contains(
                r#""message_id":"a","from":"leo","type":"question","priority":"high","subject":"s""#
            ),
            "{text}"
        );
    }

    #[test]
    fn the_raw_id_is_the_parsed_one_or_none() {
        let now = Timestamp::parse("2026-03-31T12:00:00Z").unwrap();
        let line = |id: &str, subject: &str| {
            let mut m = msg("a", "2026-03-31T11:59:00Z");
            m.id = id.into();
            m.subject = subject.into();
            let mut line = Entry::new(now, event(&m, Some("root".into()))).to_line();
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            line
        };
        for (id, subject, raw) in [
            ("ma00001-00150", "s", Some("ma00001-00150")),
            ("x", r#"","message_id":"forged"#, Some("x")),
            ("é-1", "s", Some("é-1")),
            (r#"q"uote"#, "s", None),
            (r"back\slash", "s", None),
            ("tab\t", "s", None),
        ] {
            let line = line(id, subject);
            assert_eq!(
                raw_message_id(&line),
                raw,
                "{}",
                String::from_utf8_lossy(&line)
            );
            // Where it answers, it is what the parse says.
            if let Some(raw) = raw {
                let Entry {
                    event: Event::MessageReceived(r),
                    ..
                } = serde_json::from_slice::<Entry>(&line).unwrap()
                else {
                    panic!("not an arrival");
                };
                assert_eq!(r.message_id, raw);
            }
        }
        assert_eq!(
            raw_message_id(br#"{"ts":"x","event":"session_start"}"#),
            None
        );
        assert_eq!(raw_message_id(br#"{"message_id":"cut"#), None);
    }
}
