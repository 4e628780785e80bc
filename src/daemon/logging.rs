//! Logging: to journald with structured fields (`AGENT`, `SESSION_ID`,
//! `INSTANCE`, `ERROR_CODE`, so `journalctl -u agent-state AGENT=rio` works)
//! when the daemon runs under systemd, else readable lines on stderr.
//! `AGENT_STATE_LOG` sets the filter (default `info`).

use tracing_subscriber::EnvFilter;
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
