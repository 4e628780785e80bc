//! `agent-state record AGENT`: outcomes the review pipeline learns later;
//! `agent-state record AGENT EVENT [KEY=VALUE...]`: a journal event of the
//! agent's or its script's own (seed 001's `orient_complete`,
//! `sources_archived`), written as one line beside the tool's.

use crate::cli::{Context, print_notes};
use crate::error::{Error, Result, exit};
use crate::state::journal::{Event, Record};
use crate::state::metrics;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent
    pub agent: String,
    /// A journal event of the session's own, e.g. orient_complete or
    /// sources_archived (lowercase, digits and `_`; not one of agent-state's
    /// own events); the running session's id is added
    pub event: Option<String>,
    /// The event's fields, KEY=VALUE: a VALUE that is JSON (5, true,
    /// ["a","b"]) is kept as such, any other as a string
    #[arg(value_name = "KEY=VALUE", requires = "event")]
    pub fields: Vec<String>,
    /// Claims the agent proposed, to add to metrics.json
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub claims_proposed: u64,
    /// Of them, accepted by review
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub claims_accepted: u64,
    /// Challenged by review
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub claims_challenged: u64,
    /// Rejected by review
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub claims_rejected: u64,
    /// Beliefs the agent found disconfirmed
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub disconfirmation_hits: u64,
}

pub fn run(ctx: &Context, a: Args) -> Result<u8> {
    let (_, dir) = ctx.working_agent(&a.agent)?;
    if let Some(event) = &a.event {
        return own_event(ctx, &dir, event, &a);
    }
    let record = Record {
        claims_proposed: a.claims_proposed,
        claims_accepted: a.claims_accepted,
        claims_challenged: a.claims_challenged,
        claims_rejected: a.claims_rejected,
        disconfirmation_hits: a.disconfirmation_hits,
    };
    if record == Record::default() {
        return Err(Error::Usage(
            "nothing to record: give at least one of --claims-proposed, --claims-accepted, --claims-challenged, --claims-rejected, --disconfirmation-hits".into(),
        ));
    }
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let event = Event::Record(record);
    dir.journal_append(&lock, ctx.now, event.clone())?;
    let m = metrics::apply(&dir, &lock, &event, ctx.now, &mut notes)?;
    print_notes(&notes);
    println!(
        "{}: claims proposed {}, accepted {}, challenged {}, rejected {}; disconfirmation hits {}",
        dir.name,
        m.lifetime.claims_proposed,
        m.lifetime.claims_accepted,
        m.lifetime.claims_challenged,
        m.lifetime.claims_rejected,
        m.lifetime.disconfirmation_hits
    );
    Ok(exit::OK)
}

/// The longest line `record AGENT EVENT` writes.
const MAX_EVENT_LINE: usize = 16 << 10;

/// What `name` must look like, as an event or a field name.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The journal line of `record AGENT EVENT KEY=VALUE...` (pure): refused
/// when a name is malformed, a key is given twice or is the line's own
/// (`ts`, `event`), or the event is one agent-state writes itself (a
/// forged `session_end` would count in the metrics).
fn event_line(
    ts: crate::clock::Timestamp,
    event: &str,
    fields: &[String],
    session_id: Option<&str>,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    use serde_json::Value;
    if !valid_name(event) {
        return Err(Error::Usage(format!(
            "event {event:?}: lowercase letters, digits and `_`, starting with a letter, at most 64 (e.g. orient_complete)"
        )));
    }
    let mut line = serde_json::Map::new();
    line.insert("ts".into(), Value::String(ts.to_string()));
    line.insert("event".into(), Value::String(event.to_string()));
    if let Some(id) = session_id {
        line.insert("session_id".into(), Value::String(id.to_string()));
    }
    let mut given = std::collections::BTreeSet::new();
    for field in fields {
        let Some((key, value)) = field.split_once('=') else {
            return Err(Error::Usage(format!(
                "{field:?} is not KEY=VALUE (e.g. count=5 or files_read='[\"identity.md\"]')"
            )));
        };
        if !valid_name(key) || key == "ts" || key == "event" {
            return Err(Error::Usage(format!(
                "field {key:?}: lowercase letters, digits and `_`, starting with a letter; not `ts` or `event`"
            )));
        }
        if !given.insert(key.to_string()) {
            return Err(Error::Usage(format!("field {key:?} is given twice")));
        }
        let value = serde_json::from_str::<Value>(value)
            .unwrap_or_else(|_| Value::String(value.to_string()));
        line.insert(key.to_string(), value);
    }
    let parsed =
        serde_json::from_value::<crate::state::journal::Entry>(Value::Object(line.clone()));
    if !matches!(
        parsed,
        Ok(crate::state::journal::Entry {
            event: Event::Other,
            ..
        })
    ) || event == crate::state::rotation::MARKER_EVENT
    {
        return Err(Error::Usage(format!(
            "{event:?} is one of agent-state's own events, written by the hooks and the daemon: record the session's own events under another name"
        )));
    }
    Ok(line)
}

fn own_event(ctx: &Context, dir: &crate::state::AgentDir, event: &str, a: &Args) -> Result<u8> {
    if a.claims_proposed
        + a.claims_accepted
        + a.claims_challenged
        + a.claims_rejected
        + a.disconfirmation_hits
        > 0
    {
        return Err(Error::Usage(
            "record either an EVENT or the review's counts (--claims-…), not both at once".into(),
        ));
    }
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let session: crate::state::session::Session = dir.load(&lock, ctx.now, &mut notes)?;
    let running = (session.status == Some(crate::state::session::SessionStatus::Running))
        .then_some(session.session_id.as_str())
        .filter(|id| !id.is_empty());
    let line = event_line(ctx.now, event, &a.fields, running)?;
    let mut bytes = serde_json::to_vec(&line).map_err(|e| Error::Data(e.to_string()))?;
    if bytes.len() > MAX_EVENT_LINE {
        return Err(Error::Usage(format!(
            "the event is {} bytes; a journal line is at most {} KiB: keep the fields short (the details belong in the agent's files)",
            bytes.len(),
            MAX_EVENT_LINE >> 10
        )));
    }
    bytes.push(b'\n');
    crate::state::journal::append_lines(&dir.store, &dir.journal(), &bytes)?;
    print_notes(&notes);
    println!(
        "{}: {event} journaled{}",
        dir.name,
        running
            .map(|id| format!(" (session {id})"))
            .unwrap_or_default()
    );
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_line_is_the_session_s_own_and_well_formed() {
        let ts = crate::clock::Timestamp::parse("2026-03-31T20:35:00Z").unwrap();
        let fields = |f: &[&str]| f.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let line = event_line(
            ts,
            "orient_complete",
            &fields(&[
                r#"files_read=["identity.md","beliefs.md"]"#,
                "note=read all",
                "count=5",
            ]),
            Some("20260331-220000"),
        )
        .unwrap();
        assert_eq!(
            serde_json::Value::Object(line),
            serde_json::json!({"ts":"2026-03-31T20:35:00Z","event":"orient_complete","session_id":"20260331-220000","files_read":["identity.md","beliefs.md"],"note":"read all","count":5})
        );
        for (event, f, why) in [
            ("session_end", vec![], "agent-state's own"),
            ("message_sent", vec![], "agent-state's own"),
            ("log_rotated", vec![], "agent-state's own"),
            ("Orient", vec![], "lowercase"),
            ("x", vec!["noequals"], "KEY=VALUE"),
            ("x", vec!["ts=1"], "not `ts`"),
            ("x", vec!["a=1", "a=2"], "twice"),
        ] {
            let e = event_line(ts, event, &fields(&f), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{event} {f:?}: {e}");
        }
    }
}
