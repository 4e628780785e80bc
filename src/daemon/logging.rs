//! Logging: to journald with structured fields (`AGENT`, `SESSION_ID`,
//! `INSTANCE`, `ERROR_CODE`, so `journalctl -u agent-state AGENT=rio` works)
//! when the daemon runs under systemd, else readable lines on stderr.
//! `AGENT_STATE_LOG` sets the filter (default `info`).
//!
//! Error records (see `crate::catalogue`) need a priority per severity, which
//! tracing's levels cannot express (critical is `crit`, 2): under journald they
//! are sent by [`journal_send`] in journald's native protocol instead.
//!
//! Every line about an agent names it in its text: `journalctl -u
//! agent-state` shows `MESSAGE` alone, and two agents' sessions started in
//! the same second share an id. So the journald layer here (not
//! tracing-journald, which sends the message as it is) writes
//! `MESSAGE=rio: session 20261126-125525 completed` for an event with an
//! `agent` field, and every field as its own (`AGENT=rio`, `SESSION_ID=…`).

use std::os::unix::net::UnixDatagram;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

/// journald's native socket, once logging goes to journald.
static JOURNAL: OnceLock<UnixDatagram> = OnceLock::new();
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub fn init() {
    let filter =
        EnvFilter::try_from_env("AGENT_STATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // systemd sets JOURNAL_STREAM when stderr goes to the journal.
    let journald = std::env::var_os("JOURNAL_STREAM").and_then(|_| UnixDatagram::unbound().ok());
    match journald {
        Some(socket) => {
            let _ = JOURNAL.set(socket);
            let _ = tracing_subscriber::registry()
                .with(filter)
                .with(Journald)
                .try_init();
        }
        None => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false)
                .try_init();
        }
    }
}

/// The journald layer: one native-protocol datagram per event.
struct Journald;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Journald {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let priority = match *event.metadata().level() {
            tracing::Level::ERROR => "3",
            tracing::Level::WARN => "4",
            tracing::Level::INFO => "6",
            _ => "7",
        };
        let message = named(fields.agent.as_deref(), &fields.message);
        let mut out: Vec<(&str, &str)> = vec![("PRIORITY", priority), ("MESSAGE", &message)];
        out.extend(fields.others.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        journal_send(&out);
    }
}

/// `message` naming `agent` first (`rio: …`), unless it does already.
fn named(agent: Option<&str>, message: &str) -> String {
    match agent {
        Some(a) if !(message.starts_with(a) && message[a.len()..].starts_with([':', ' '])) => {
            format!("{a}: {message}")
        }
        _ => message.to_string(),
    }
}

/// An event's fields: the message, the agent, and the rest as journald
/// fields (`AGENT`, `SESSION_ID`, … uppercase).
#[derive(Default)]
struct Fields {
    message: String,
    agent: Option<String>,
    others: Vec<(String, String)>,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.record(field.name(), value.to_string());
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.record(field.name(), format!("{value:?}"));
    }
}

impl Fields {
    fn record(&mut self, name: &str, value: String) {
        if name == "message" {
            self.message = value;
            return;
        }
        if name == "agent" {
            self.agent = Some(value.clone());
        }
        // journald's field names: A-Z, 0-9 and `_`, not starting with `_`.
        let key: String = name
            .chars()
            .map(|c| match c {
                'a'..='z' => c.to_ascii_uppercase(),
                'A'..='Z' | '0'..='9' => c,
                _ => '_',
            })
            .collect();
        let key = key.trim_start_matches('_');
        if !key.is_empty() && !matches!(key, "MESSAGE" | "PRIORITY" | "SYSLOG_IDENTIFIER") {
            self.others.push((key.to_string(), value));
        }
    }
}

/// Is logging going to journald?
pub fn to_journal() -> bool {
    JOURNAL.get().is_some()
}

/// Send one entry to journald with these fields (`PRIORITY`, `MESSAGE`, ...;
/// `SYSLOG_IDENTIFIER` is added). Returns false if logging does not go to
/// journald or the send failed, so the caller can log another way.
pub fn journal_send(fields: &[(&str, &str)]) -> bool {
    let Some(socket) = JOURNAL.get() else {
        return false;
    };
    let mut buf = Vec::new();
    encode_field(&mut buf, "SYSLOG_IDENTIFIER", "agent-state");
    for (name, value) in fields {
        encode_field(&mut buf, name, value);
    }
    socket.send_to(&buf, JOURNAL_SOCKET).is_ok()
}

/// journald's native format: `NAME=value\n`, or for a value with a newline
/// `NAME\n`, its length as 64-bit little endian, the value, `\n`.
fn encode_field(buf: &mut Vec<u8>, name: &str, value: &str) {
    buf.extend_from_slice(name.as_bytes());
    if value.contains('\n') {
        buf.push(b'\n');
        buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        buf.push(b'=');
    }
    buf.extend_from_slice(value.as_bytes());
    buf.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_about_an_agent_names_it() {
        for (agent, message, want) in [
            (
                Some("rio"),
                "session 1 completed",
                "rio: session 1 completed",
            ),
            (Some("rio"), "rio: already named", "rio: already named"),
            (Some("rio"), "rio started", "rio started"),
            (Some("rio"), "riot police", "rio: riot police"),
            (None, "ready: 4 agents", "ready: 4 agents"),
        ] {
            assert_eq!(named(agent, message), want);
        }
    }

    #[test]
    fn fields_become_journald_names() {
        let mut f = Fields::default();
        f.record("message", "m".into());
        f.record("agent", "rio".into());
        f.record("session_id", "20261126-1".into());
        f.record("_weird-name", "x".into());
        assert_eq!(f.message, "m");
        assert_eq!(f.agent.as_deref(), Some("rio"));
        assert_eq!(
            f.others,
            [
                ("AGENT".to_string(), "rio".to_string()),
                ("SESSION_ID".to_string(), "20261126-1".to_string()),
                ("WEIRD_NAME".to_string(), "x".to_string()),
            ]
        );
    }

    #[test]
    fn native_protocol_encoding() {
        let mut buf = Vec::new();
        encode_field(&mut buf, "MESSAGE", "one line");
        encode_field(&mut buf, "DETAILS", "two\nlines");
        let mut want = b"MESSAGE=one line\nDETAILS\n".to_vec();
        want.extend_from_slice(&9u64.to_le_bytes());
        want.extend_from_slice(b"two\nlines\n");
        assert_eq!(buf, want);
    }
}
