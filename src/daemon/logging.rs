//! Logging: to journald with structured fields (`AGENT`, `SESSION_ID`,
//! `INSTANCE`, `ERROR_CODE`, so `journalctl -u agent-state AGENT=rio` works)
//! when the daemon runs under systemd, else readable lines on stderr.
//! `AGENT_STATE_LOG` sets the filter (default `info`).
//!
//! Error records (see `crate::catalogue`) need a priority per severity, which
//! tracing's levels cannot express (critical is `crit`, 2): under journald they
//! are sent by [`journal_send`] in journald's native protocol instead.

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
    let journald = std::env::var_os("JOURNAL_STREAM")
        .and_then(|_| tracing_journald::layer().ok())
        .map(|l| {
            l.with_field_prefix(None)
                .with_syslog_identifier("agent-state".into())
        });
    match journald {
        Some(layer) => {
            if let Ok(socket) = UnixDatagram::unbound() {
                let _ = JOURNAL.set(socket);
            }
            let _ = tracing_subscriber::registry()
                .with(filter)
                .with(layer)
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
