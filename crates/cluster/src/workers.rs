//! The worker registry: a KV bucket (`cluster.worker_bucket`) where each
//! worker keeps a record of itself, `worker/<host>`, renewed every few
//! seconds (its heartbeat), and where the operator asks a worker to drain,
//! `drain/<host>`.
//!
//! Each key has one writer: the worker writes its record, the operator (or
//! the controller) the drain request. So a heartbeat never overwrites a
//! drain request; the worker reads the request at each heartbeat, stops
//! pulling orders, and says so in its record (`drained`).
//!
//! Whether a worker is alive is [`worker_state`]'s decision, a pure function
//! of how long ago its record was last written. The controller, watching
//! the bucket, measures that on its monotonic clock from the instant it saw
//! the record's revision change ([`since_seen`]); a one-shot reader
//! (`agent-state workers`) has only the server's timestamp of the write and
//! its own wall clock ([`since_stored`]), so its age is off by the two
//! clocks' difference (NTP keeps that far below the seconds that count).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};

/// One running session, as its worker lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningSession {
    pub session_id: String,
    pub agent: String,
    /// When it started, milliseconds since the Unix epoch (the worker's clock).
    pub started_ms: u64,
}

/// One credential group a worker serves, and whether its credential works.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialState {
    pub group: String,
    pub working: bool,
    /// Why it does not work (its check's failure), or that it is not
    /// checked yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What a worker says of itself at each heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub host: String,
    /// `agent-state --version` of the worker.
    pub version: String,
    /// How many sessions it runs at most at once.
    pub slots: usize,
    pub sessions: Vec<RunningSession>,
    pub credentials: Vec<CredentialState>,
    /// It has seen a drain request: it pulls no order, its sessions finish.
    pub drained: bool,
    /// It stopped cleanly (SIGTERM): its last record.
    #[serde(default)]
    pub stopped: bool,
    /// Why it pulls no order though it has free slots (low disk or
    /// memory), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_pulling: Option<String>,
    /// When it wrote this record, milliseconds since the Unix epoch (its clock).
    pub heartbeat_ms: u64,
    /// How often it writes its record, in milliseconds.
    pub heartbeat_every_ms: u64,
}

/// How often a worker renews its record, and when a reader counts it lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerTiming {
    pub heartbeat_every: Duration,
    pub lost_after: Duration,
}

impl WorkerTiming {
    /// A heartbeat every 5 s; lost after 20 s without one (three missed).
    pub const DEFAULT: WorkerTiming = WorkerTiming {
        heartbeat_every: Duration::from_secs(5),
        lost_after: Duration::from_secs(20),
    };

    /// A worker beating every `heartbeat_every`, counted lost after four
    /// periods without a beat (at least 3 s).
    pub fn beating_every(heartbeat_every: Duration) -> WorkerTiming {
        WorkerTiming {
            heartbeat_every,
            lost_after: (heartbeat_every * 4).max(Duration::from_secs(3)),
        }
    }
}

impl Default for WorkerTiming {
    fn default() -> Self {
        WorkerTiming::DEFAULT
    }
}

/// What `agent-state workers` says of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    /// It beats and pulls orders.
    Alive,
    /// It beats, pulls nothing, and still runs sessions (or has not yet
    /// seen the drain request).
    Draining,
    /// It beats, pulls nothing and runs nothing: it can be stopped.
    Drained,
    /// It stopped cleanly.
    Stopped,
    /// No heartbeat for `lost_after`: its sessions' leases will be fenced.
    Lost,
}

impl WorkerState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Alive => "alive",
            WorkerState::Draining => "draining",
            WorkerState::Drained => "drained",
            WorkerState::Stopped => "stopped",
            WorkerState::Lost => "lost",
        }
    }
}

/// The decision. `since_heartbeat` is how long ago the record was last
/// written ([`since_seen`] or [`since_stored`]); `drain_requested` whether
/// `drain/<host>` is set. A clean stop is said as such; otherwise silence
/// past `lost_after` is lost whatever the record says, since nothing it
/// says is current.
pub fn worker_state(
    timing: &WorkerTiming,
    record: &WorkerRecord,
    since_heartbeat: Duration,
    drain_requested: bool,
) -> WorkerState {
    if record.stopped {
        WorkerState::Stopped
    } else if since_heartbeat >= timing.lost_after {
        WorkerState::Lost
    } else if record.drained && record.sessions.is_empty() {
        WorkerState::Drained
    } else if record.drained || drain_requested {
        WorkerState::Draining
    } else {
        WorkerState::Alive
    }
}

/// What a starting worker makes of the record its host name already has:
/// two live workers of one name would each take the other's leases for
/// their own (the lease names the host), so a second one must not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameCheck {
    /// No live worker has the name: no record, a clean stop, or silence
    /// past its `lost_after`.
    Free,
    /// A record this recent is a live worker's, or this worker's earlier
    /// self just killed: read it again after this long; written again
    /// meanwhile (and not a clean stop), the name is taken.
    Watch(Duration),
}

/// The longest a starting worker watches another's record.
pub const NAME_WATCH_MAX: Duration = Duration::from_secs(30);

/// The decision for the record `entry` of this worker's host name, read at
/// `now` (this host's wall clock; the record's time is the server's). The
/// watch lasts two of the record's heartbeats and a margin. Pure.
pub fn name_check(entry: Option<&WorkerEntry>, now: SystemTime) -> NameCheck {
    let Some(entry) = entry else {
        return NameCheck::Free;
    };
    let every = Duration::from_millis(entry.record.heartbeat_every_ms.max(1));
    let timing = WorkerTiming::beating_every(every);
    if entry.record.stopped || since_stored(entry.stored_at, now) >= timing.lost_after {
        return NameCheck::Free;
    }
    NameCheck::Watch((every * 2 + Duration::from_millis(500)).min(NAME_WATCH_MAX))
}

/// The age of a heartbeat seen at `seen_at` (the instant a watcher saw the
/// record's revision change), on the watcher's monotonic clock.
pub fn since_seen(seen_at: Instant, now: Instant) -> Duration {
    now.saturating_duration_since(seen_at)
}

/// The age of a heartbeat the server stored at `stored_at`, by the reader's
/// wall clock `now` (0 if the reader's clock is behind the server's).
pub fn since_stored(stored_at: SystemTime, now: SystemTime) -> Duration {
    now.duration_since(stored_at).unwrap_or_default()
}

/// Milliseconds since the Unix epoch of `t`.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[derive(Debug, thiserror::Error)]
pub enum WorkersError {
    #[error(
        "host name {host:?} cannot be a worker key: only letters, digits, '-', '_' and inner '.'"
    )]
    InvalidHost { host: String },
    #[error("cannot create or update the worker bucket {bucket}: {source}")]
    Bucket {
        bucket: String,
        source: jetstream::context::CreateKeyValueError,
    },
    #[error("NATS failed to open the worker bucket {bucket}: {source}")]
    Open {
        bucket: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("NATS failed to {operation} {key} in the worker bucket {bucket}: {source}")]
    Nats {
        bucket: String,
        key: String,
        operation: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{key} in the worker bucket {bucket} is not a worker record: {detail}")]
    Corrupt {
        bucket: String,
        key: String,
        detail: String,
    },
}

/// A worker as read from the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEntry {
    pub record: WorkerRecord,
    /// When the server stored the record (the server's clock).
    pub stored_at: SystemTime,
    pub revision: u64,
    /// Whether `drain/<host>` is set.
    pub drain_requested: bool,
}

/// The worker bucket.
#[derive(Clone)]
pub struct Workers {
    store: kv::Store,
    bucket: String,
}

impl Workers {
    /// Creates the bucket (or brings it to shape): one revision kept per
    /// key, `replicas` copies, file storage.
    pub(crate) async fn create(
        jetstream: &jetstream::Context,
        bucket: &str,
        replicas: usize,
    ) -> Result<Workers, WorkersError> {
        let store = jetstream
            .create_or_update_key_value(kv::Config {
                bucket: bucket.to_string(),
                description: "agent-state: worker/<host> records and drain/<host> requests".into(),
                history: 1,
                storage: stream::StorageType::File,
                num_replicas: replicas,
                ..Default::default()
            })
            .await
            .map_err(|source| WorkersError::Bucket {
                bucket: bucket.to_string(),
                source,
            })?;
        Ok(Workers {
            store,
            bucket: bucket.to_string(),
        })
    }

    /// The bucket if it exists (a reader creates nothing): `None` when no
    /// worker has ever registered.
    pub(crate) async fn open(
        jetstream: &jetstream::Context,
        bucket: &str,
    ) -> Result<Option<Workers>, WorkersError> {
        use async_nats::jetstream::context::{GetStreamErrorKind, KeyValueErrorKind};
        let open_error = |source: Box<dyn std::error::Error + Send + Sync>| WorkersError::Open {
            bucket: bucket.to_string(),
            source,
        };
        // Twice at most: a bucket missing at the first question may be
        // created by a worker before the second.
        for _ in 0..2 {
            match jetstream.get_key_value(bucket).await {
                Ok(store) => {
                    return Ok(Some(Workers {
                        store,
                        bucket: bucket.to_string(),
                    }));
                }
                Err(e) if e.kind() == KeyValueErrorKind::GetBucket => {
                    // Missing, or the request failed: tell them apart by
                    // asking for the stream itself.
                    match jetstream.get_stream(format!("KV_{bucket}")).await {
                        Err(se)
                            if matches!(
                                se.kind(),
                                GetStreamErrorKind::JetStream(j)
                                    if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
                            ) =>
                        {
                            return Ok(None);
                        }
                        Ok(_) => continue,
                        Err(se) => return Err(open_error(Box::new(se))),
                    }
                }
                Err(e) => return Err(open_error(Box::new(e))),
            }
        }
        Err(open_error(
            "the bucket's stream exists but the bucket cannot be opened".into(),
        ))
    }

    /// Writes the worker's record (its heartbeat); returns the revision.
    pub async fn beat(&self, record: &WorkerRecord) -> Result<u64, WorkersError> {
        let key = record_key(&record.host)?;
        let bytes = Bytes::from(serde_json::to_vec(record).expect("a record serialises"));
        self.store
            .put(&key, bytes)
            .await
            .map_err(|e| self.nats(&key, "write", e))
    }

    /// Sets (`true`) or clears the drain request of `host`.
    pub async fn request_drain(&self, host: &str, drain: bool) -> Result<(), WorkersError> {
        let key = drain_key(host)?;
        if drain {
            self.store
                .put(&key, Bytes::from_static(b"1"))
                .await
                .map(|_| ())
                .map_err(|e| self.nats(&key, "write", e))
        } else {
            self.store
                .delete(&key)
                .await
                .map_err(|e| self.nats(&key, "delete", e))
        }
    }

    /// Whether `drain/<host>` is set.
    pub async fn drain_requested(&self, host: &str) -> Result<bool, WorkersError> {
        let key = drain_key(host)?;
        let last = crate::kv_last(&self.store, &self.bucket, &key)
            .await
            .map_err(|e| self.nats(&key, "read", e))?;
        Ok(last.is_some_and(|l| l.value.is_some()))
    }

    /// One worker's record, if it has one.
    pub async fn get(&self, host: &str) -> Result<Option<WorkerEntry>, WorkersError> {
        let key = record_key(host)?;
        let last = crate::kv_last(&self.store, &self.bucket, &key)
            .await
            .map_err(|e| self.nats(&key, "read", e))?;
        let Some((entry, value)) = last.and_then(|l| l.value.clone().map(|v| (l, v))) else {
            return Ok(None);
        };
        let record: WorkerRecord =
            serde_json::from_slice(&value).map_err(|e| WorkersError::Corrupt {
                bucket: self.bucket.clone(),
                key: key.clone(),
                detail: e.to_string(),
            })?;
        let nanos = entry.stored_nanos.max(0) as u64;
        Ok(Some(WorkerEntry {
            drain_requested: self.drain_requested(&record.host).await?,
            record,
            stored_at: UNIX_EPOCH + Duration::from_nanos(nanos),
            revision: entry.revision,
        }))
    }

    /// Every worker with a record, by host name. A record that does not
    /// read is an error naming its key.
    pub async fn list(&self) -> Result<Vec<WorkerEntry>, WorkersError> {
        let keys: Vec<String> = match self.store.keys().await {
            Ok(keys) => keys
                .try_collect()
                .await
                .map_err(|e| self.nats("worker/*", "list", e))?,
            Err(e) => return Err(self.nats("worker/*", "list", e)),
        };
        let mut hosts: Vec<&str> = keys
            .iter()
            .filter_map(|k| k.strip_prefix("worker/"))
            .collect();
        hosts.sort_unstable();
        let mut out = Vec::new();
        for host in hosts {
            if let Some(entry) = self.get(host).await? {
                out.push(entry);
            }
        }
        Ok(out)
    }

    fn nats(
        &self,
        key: &str,
        operation: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> WorkersError {
        WorkersError::Nats {
            bucket: self.bucket.clone(),
            key: key.to_string(),
            operation,
            source: Box::new(source),
        }
    }
}

/// A host name NATS accepts inside a key: letters, digits, `-`, `_`, and
/// `.` between them (`w1.example.net`).
pub fn check_host(host: &str) -> Result<(), WorkersError> {
    let ok = !host.is_empty()
        && host.len() <= 253
        && !host.starts_with('.')
        && !host.ends_with('.')
        && !host.contains("..")
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(WorkersError::InvalidHost {
            host: host.to_string(),
        })
    }
}

fn record_key(host: &str) -> Result<String, WorkersError> {
    check_host(host)?;
    Ok(format!("worker/{host}"))
}

fn drain_key(host: &str) -> Result<String, WorkersError> {
    check_host(host)?;
    Ok(format!("drain/{host}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(drained: bool, sessions: usize, stopped: bool) -> WorkerRecord {
        WorkerRecord {
            host: "w1".into(),
            version: "0.1.0".into(),
            slots: 2,
            sessions: (0..sessions)
                .map(|i| RunningSession {
                    session_id: format!("s-{i}"),
                    agent: format!("a{i}"),
                    started_ms: 0,
                })
                .collect(),
            credentials: vec![],
            drained,
            stopped,
            not_pulling: None,
            heartbeat_ms: 0,
            heartbeat_every_ms: 5000,
        }
    }

    /// The record of the starting worker's host name, as table rows:
    /// (record: none / stopped / beating every N ms, its age, the decision).
    #[test]
    fn a_starting_worker_watches_a_recent_record_of_its_name() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let entry = |stopped: bool, every_ms: u64, age: Duration| WorkerEntry {
            record: WorkerRecord {
                heartbeat_every_ms: every_ms,
                ..record(false, 1, stopped)
            },
            stored_at: now - age,
            revision: 7,
            drain_requested: false,
        };
        let secs = Duration::from_secs;
        let ms = Duration::from_millis;
        let table: &[(Option<WorkerEntry>, NameCheck)] = &[
            (None, NameCheck::Free),
            // A clean stop frees the name at once.
            (Some(entry(true, 5000, secs(1))), NameCheck::Free),
            // Beating every 5 s: lost after 20 s.
            (
                Some(entry(false, 5000, secs(1))),
                NameCheck::Watch(ms(10_500)),
            ),
            (
                Some(entry(false, 5000, secs(19))),
                NameCheck::Watch(ms(10_500)),
            ),
            (Some(entry(false, 5000, secs(20))), NameCheck::Free),
            // Every 300 ms (tests): lost after 3 s.
            (Some(entry(false, 300, ms(100))), NameCheck::Watch(ms(1100))),
            (Some(entry(false, 300, secs(3))), NameCheck::Free),
            // The server's clock ahead of this host's: still watched.
            (
                Some(entry(false, 5000, Duration::ZERO)),
                NameCheck::Watch(ms(10_500)),
            ),
            // A record beating every hour: watched for at most 30 s.
            (
                Some(entry(false, 3_600_000, secs(60))),
                NameCheck::Watch(NAME_WATCH_MAX),
            ),
        ];
        for (e, want) in table {
            assert_eq!(name_check(e.as_ref(), now), *want, "{e:?}");
        }
        let ahead = WorkerEntry {
            stored_at: now + secs(5),
            ..entry(false, 5000, Duration::ZERO)
        };
        assert_eq!(name_check(Some(&ahead), now), NameCheck::Watch(ms(10_500)));
    }

    /// (seconds since the heartbeat, drained in the record, sessions,
    /// stopped, drain requested, the state)
    #[test]
    fn the_state_of_a_worker() {
        use WorkerState::*;
        let t = WorkerTiming::DEFAULT;
        let table: &[(u64, bool, usize, bool, bool, WorkerState)] = &[
            (0, false, 0, false, false, Alive),
            (4, false, 2, false, false, Alive),
            (19, false, 1, false, false, Alive),
            (20, false, 1, false, false, Lost),
            (3600, false, 0, false, false, Lost),
            // Asked, not yet seen by the worker.
            (1, false, 1, false, true, Draining),
            (1, false, 0, false, true, Draining),
            // Seen: draining while sessions run, drained when none do.
            (1, true, 1, false, true, Draining),
            (1, true, 0, false, true, Drained),
            // The request was withdrawn, the worker has not seen it yet.
            (1, true, 0, false, false, Drained),
            // A drained worker that goes silent is lost all the same.
            (25, true, 0, false, true, Lost),
            // A clean stop is said as such, however old.
            (3600, false, 0, true, false, Stopped),
            (0, true, 0, true, true, Stopped),
        ];
        for &(secs, drained, sessions, stopped, requested, want) in table {
            let r = record(drained, sessions, stopped);
            assert_eq!(
                worker_state(&t, &r, Duration::from_secs(secs), requested),
                want,
                "{secs} s, drained {drained}, {sessions} session(s), stopped {stopped}, requested {requested}"
            );
        }
    }

    #[test]
    fn ages_never_go_negative() {
        let base = Instant::now() + Duration::from_secs(5);
        assert_eq!(
            since_seen(base, base - Duration::from_secs(1)),
            Duration::ZERO
        );
        assert_eq!(
            since_seen(base, base + Duration::from_secs(7)),
            Duration::from_secs(7)
        );
        let t = UNIX_EPOCH + Duration::from_secs(100);
        assert_eq!(since_stored(t, t - Duration::from_secs(3)), Duration::ZERO);
        assert_eq!(
            since_stored(t, t + Duration::from_millis(1500)),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn the_lost_time_follows_the_heartbeat() {
        let table: &[(u64, u64)] = &[(5000, 20_000), (1000, 4000), (200, 3000)];
        for &(every, lost) in table {
            let t = WorkerTiming::beating_every(Duration::from_millis(every));
            assert_eq!(
                t.lost_after,
                Duration::from_millis(lost),
                "every {every} ms"
            );
        }
    }

    #[test]
    fn host_names() {
        let table: &[(&str, bool)] = &[
            ("w1", true),
            ("w1.example.net", true),
            ("gpu-box_2", true),
            ("", false),
            (".w1", false),
            ("w1.", false),
            ("a..b", false),
            ("a b", false),
            ("a/b", false),
            ("a*", false),
        ];
        for &(host, ok) in table {
            assert_eq!(check_host(host).is_ok(), ok, "{host:?}");
        }
    }
}
