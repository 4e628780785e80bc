//! `[logs]`: the append-only logs (each agent's `journal.jsonl`, the
//! daemon's `errors.jsonl` and `signals.jsonl`) are rotated by size into
//! compressed segments (`crate::state::rotation`), which are kept for a
//! configured time. Read here; rotated and pruned by the daemon's monitor.

use std::time::Duration;

use serde::Deserialize;

use super::Validator;

/// `[logs]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// A log is rotated once it holds more than this.
    pub rotate_size: u64,
    /// Rotated journals are removed after this; `None`: kept for good (the
    /// default: a journal is the agent's history and what its state is
    /// rebuilt from, and compressed it costs a tenth of its size).
    pub journal_retention: Option<Duration>,
    /// Rotated `errors.jsonl` and `signals.jsonl` are removed after this;
    /// `None`: kept for good.
    pub daemon_log_retention: Option<Duration>,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            rotate_size: 16 << 20,
            journal_retention: None,
            daemon_log_retention: Some(Duration::from_secs(90 * 86_400)),
        }
    }
}

/// The smallest rotation size: a log rotated at every few lines would
/// only make segments.
const MIN_ROTATE_SIZE: u64 = 1024;
/// The largest: a segment is decompressed whole when read back.
const MAX_ROTATE_SIZE: u64 = 256 << 20;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLogs {
    rotate_size: Option<String>,
    journal_retention: Option<String>,
    daemon_log_retention: Option<String>,
}

impl Validator {
    pub(super) fn logs(&mut self, raw: &RawLogs) -> LogSettings {
        let rotate_size = self.size("logs.rotate_size", raw.rotate_size.as_deref(), "16MiB");
        if !(MIN_ROTATE_SIZE..=MAX_ROTATE_SIZE).contains(&rotate_size) {
            self.problem(
                "logs.rotate_size",
                "must be between 1KiB and 256MiB (the default is \"16MiB\")",
            );
        }
        LogSettings {
            rotate_size,
            journal_retention: self.retention(
                "logs.journal_retention",
                raw.journal_retention.as_deref(),
                "forever",
            ),
            daemon_log_retention: self.retention(
                "logs.daemon_log_retention",
                raw.daemon_log_retention.as_deref(),
                "90d",
            ),
        }
    }

    /// A duration, or `"forever"` for none.
    fn retention(&mut self, field: &str, value: Option<&str>, default: &str) -> Option<Duration> {
        match value.unwrap_or(default) {
            "forever" => None,
            text => {
                let d = self.duration(field, Some(text), "1d");
                if d < Duration::from_secs(3600) {
                    self.problem(
                        field,
                        "must be at least 1h, or \"forever\" to keep rotated logs for good",
                    );
                }
                Some(d)
            }
        }
    }
}
