//! The lease `run/<agent>` in the lease bucket: one session per agent across
//! every host. JetStream's ack is not a fence (a worker paused past AckWait
//! can still ack late, nats-server#4786); this lease is.
//!
//! - **take**: a create, i.e. a write that expects the key to have no live
//!   value. The revision the server gives the write is the fencing token:
//!   the session's end carries it, and the controller records the end only
//!   if the lease still has it ([`crate::liveness::end_is_from_holder`]).
//! - **renew**: a compare-and-set on that revision; the new revision
//!   replaces it. A stale revision is refused ([`LeaseError::Stale`]).
//! - **release** (the worker, at the end) and **fence** (the controller,
//!   when the worker is lost): a delete that expects the revision.
//!
//! Every write expects a revision (`Nats-Expected-Last-Subject-Sequence`),
//! so two writers can never both succeed. Where the server keeps a TTL per
//! key (nats-server 2.11 and later), each write carries one: a lease nobody
//! renews goes away on its own, even with the controller down.
//!
//! A take first expects the revision this host last saw the key at (its own
//! release's delete marker, [`Leases::release`]), else none: an agent whose
//! last session ran here is taken in one round trip, not three (create
//! refused, read, create). A wrong guess is only refused like any stale
//! expectation, and the take reads the key as before.
//!
//! A write whose acknowledgement is lost (a leader election, a cut link) may
//! still have been stored. A lease value is unique to its holder, session
//! and renewal count, so when the next write finds a revision it did not
//! expect, it reads the key: if the value is the one it wrote, that write
//! went through and the lease is still its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, kv, message::PublishMessage};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// How often a take retries when the key changes under it between its read
/// and its write (a delete marker being removed, another taker).
const TAKE_ATTEMPTS: usize = 4;

/// At most this many keys' last revisions are remembered for the next take
/// (then they are forgotten all at once: a guess, not a record).
const HINTS_MAX: usize = 4096;

/// What the lease holds: who runs the agent's session, which session, and
/// how many renewals it has made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseValue {
    /// The worker host's name.
    pub holder: String,
    /// The session id of the order.
    pub session: String,
    /// 0 at the take, one more at each renewal.
    pub renewal: u64,
    /// The taking process ([`process_run`]): a take found stored with
    /// another run's value was not this process's (a restarted worker's
    /// earlier self took it, and that session may have run), so it is
    /// held, not taken for this process's own lost answer. Empty in values
    /// written before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub run: String,
}

/// This process's run: its pid and start time, the same for every take it
/// makes (across reconnections), never a later process's.
pub fn process_run() -> &'static str {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RUN.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{nanos:x}", std::process::id())
    })
}

impl LeaseValue {
    /// The same holder's same session (at any renewal).
    pub fn same_session(&self, other: &LeaseValue) -> bool {
        self.holder == other.holder && self.session == other.session
    }
}

/// A lease this host holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub agent: String,
    pub value: LeaseValue,
    /// The fencing token: the revision of this host's last write.
    pub revision: u64,
}

/// The lease as anyone reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    pub value: LeaseValue,
    pub revision: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("agent name {agent:?} cannot be a lease key: only letters, digits, '-' and '_'")]
    InvalidAgent { agent: String },
    #[error("the lease run/{agent} is held by {holder} (session {session}, revision {revision})")]
    Held {
        agent: String,
        holder: String,
        session: String,
        revision: u64,
    },
    #[error(
        "the lease run/{agent} no longer has revision {revision} (now {}): it was fenced or taken by another; stop the session",
        current.map_or("gone".to_string(), |r| format!("revision {r}"))
    )]
    Stale {
        agent: String,
        revision: u64,
        current: Option<u64>,
    },
    #[error("the lease run/{agent} kept changing while it was taken; try again")]
    Contended { agent: String },
    #[error("the lease run/{agent} at revision {revision} holds no lease value: {detail}")]
    Corrupt {
        agent: String,
        revision: u64,
        detail: String,
    },
    #[error("NATS failed to {operation} the lease run/{agent}: {source}")]
    Nats {
        agent: String,
        operation: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The lease bucket.
#[derive(Clone)]
pub struct Leases {
    jetstream: jetstream::Context,
    store: kv::Store,
    bucket: String,
    ttl: Option<Duration>,
    /// Per agent, the revision of this host's last delete of its key: what
    /// the next take expects first.
    hints: Arc<Mutex<HashMap<String, u64>>>,
}

/// How a write ended.
enum Write {
    Stored(u64),
    /// The key's revision was not the one expected.
    Refused,
}

impl Leases {
    pub(crate) fn new(
        jetstream: jetstream::Context,
        store: kv::Store,
        bucket: String,
        ttl: Option<Duration>,
    ) -> Leases {
        Leases {
            jetstream,
            store,
            bucket,
            ttl,
            hints: Arc::default(),
        }
    }

    /// The TTL each write carries (none where the server cannot keep one).
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// Takes `run/<agent>` for `holder`'s session `session`, if nobody holds it.
    pub async fn take(
        &self,
        agent: &str,
        holder: &str,
        session: &str,
    ) -> Result<Lease, LeaseError> {
        let key = key(agent)?;
        let value = LeaseValue {
            holder: holder.to_string(),
            session: session.to_string(),
            renewal: 0,
            run: process_run().to_string(),
        };
        let bytes = encode(&value);
        let mut expected = self.hint(agent, None).unwrap_or(0);
        for _ in 0..TAKE_ATTEMPTS {
            match self
                .write(agent, &key, Some(bytes.clone()), expected, "take")
                .await?
            {
                Write::Stored(revision) => {
                    return Ok(Lease {
                        agent: agent.to_string(),
                        value,
                        revision,
                    });
                }
                Write::Refused => match self.read(agent, &key).await? {
                    // Our own take, whose acknowledgement was lost.
                    Some((revision, Some(current))) if current == value => {
                        return Ok(Lease {
                            agent: agent.to_string(),
                            value,
                            revision,
                        });
                    }
                    Some((revision, Some(current))) => {
                        return Err(LeaseError::Held {
                            agent: agent.to_string(),
                            holder: current.holder,
                            session: current.session,
                            revision,
                        });
                    }
                    // A delete marker: a create expects its revision.
                    Some((revision, None)) => expected = revision,
                    None => expected = 0,
                },
            }
        }
        Err(LeaseError::Contended {
            agent: agent.to_string(),
        })
    }

    /// Renews `lease` by compare-and-set on its revision; returns the lease
    /// with its new revision. A lease fenced, taken or renewed further since
    /// is [`LeaseError::Stale`]: the caller must stop the session. The same
    /// renewal sent again (after a lost acknowledgement) finds itself stored
    /// and returns that write: the value names the holder, the session and
    /// the renewal count, which no other writer produces.
    ///
    /// The caller reads its monotonic clock *before* the call and, when the
    /// call succeeds, keeps that instant as `renewed_at` for
    /// [`crate::liveness::worker_lease_action`].
    pub async fn renew(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        let key = key(&lease.agent)?;
        let value = LeaseValue {
            renewal: lease.value.renewal + 1,
            ..lease.value.clone()
        };
        match self
            .write(
                &lease.agent,
                &key,
                Some(encode(&value)),
                lease.revision,
                "renew",
            )
            .await?
        {
            Write::Stored(revision) => Ok(Lease {
                agent: lease.agent.clone(),
                value,
                revision,
            }),
            Write::Refused => match self.read(&lease.agent, &key).await? {
                // This very renewal was stored; its acknowledgement was lost.
                Some((revision, Some(current))) if current == value => Ok(Lease {
                    agent: lease.agent.clone(),
                    value,
                    revision,
                }),
                other => Err(LeaseError::Stale {
                    agent: lease.agent.clone(),
                    revision: lease.revision,
                    current: other.and_then(|(revision, value)| value.map(|_| revision)),
                }),
            },
        }
    }

    /// Gives the lease back at the session's end (the worker). A lease at
    /// another revision that still names this holder and session is this
    /// holder's own renewal, stored without its answer reaching it (a leader
    /// election, a cut link): released at that revision, not left to hold
    /// the agent's next sessions off until its TTL. Anything else there is
    /// [`LeaseError::Stale`].
    pub async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        match self.delete(&lease.agent, lease.revision, "release").await {
            Err(LeaseError::Stale {
                current: Some(now), ..
            }) => match self.current(&lease.agent).await? {
                Some(rec) if rec.revision == now && rec.value.same_session(&lease.value) => {
                    self.delete(&lease.agent, now, "release").await
                }
                _ => Err(LeaseError::Stale {
                    agent: lease.agent.clone(),
                    revision: lease.revision,
                    current: Some(now),
                }),
            },
            other => other,
        }
    }

    /// Deletes the lease if it still has `revision` (the controller, when
    /// the worker is lost). A lease renewed since is [`LeaseError::Stale`]:
    /// the worker is alive after all.
    pub async fn fence(&self, agent: &str, revision: u64) -> Result<(), LeaseError> {
        self.delete(agent, revision, "fence").await
    }

    /// Every lease held now, by agent (the controller's reconcile). A key
    /// that is no agent's lease is left out; one that does not read is an
    /// error naming it.
    pub async fn all(&self) -> Result<Vec<(String, LeaseRecord)>, LeaseError> {
        use futures_util::TryStreamExt;
        let nats = |source: Box<dyn std::error::Error + Send + Sync>| LeaseError::Nats {
            agent: "*".to_string(),
            operation: "list",
            source,
        };
        let keys: Vec<String> = self
            .store
            .keys()
            .await
            .map_err(|e| nats(Box::new(e)))?
            .try_collect()
            .await
            .map_err(|e| nats(Box::new(e)))?;
        let mut agents: Vec<&str> = keys.iter().filter_map(|k| k.strip_prefix("run/")).collect();
        agents.sort_unstable();
        let mut out = Vec::new();
        for agent in agents {
            if key(agent).is_err() {
                continue;
            }
            if let Some(record) = self.current(agent).await? {
                out.push((agent.to_string(), record));
            }
        }
        Ok(out)
    }

    /// The lease as it is now, if anyone holds it.
    pub async fn current(&self, agent: &str) -> Result<Option<LeaseRecord>, LeaseError> {
        let key = key(agent)?;
        Ok(match self.read(agent, &key).await? {
            Some((revision, Some(value))) => Some(LeaseRecord { value, revision }),
            _ => None,
        })
    }

    async fn delete(
        &self,
        agent: &str,
        revision: u64,
        operation: &'static str,
    ) -> Result<(), LeaseError> {
        let key = key(agent)?;
        match self.write(agent, &key, None, revision, operation).await? {
            Write::Stored(marker) => {
                self.hint(agent, Some(marker));
                Ok(())
            }
            // A delete carries nothing of ours to recognise it by: after a
            // lost acknowledgement, `current: None` may be this very delete.
            Write::Refused => Err(LeaseError::Stale {
                agent: agent.to_string(),
                revision,
                current: self.current(agent).await?.map(|record| record.revision),
            }),
        }
    }

    /// Takes the remembered revision of `agent`'s key, and remembers
    /// `marker` instead if given.
    fn hint(&self, agent: &str, marker: Option<u64>) -> Option<u64> {
        let mut hints = self.hints.lock().unwrap_or_else(|e| e.into_inner());
        let was = hints.remove(agent);
        if let Some(marker) = marker {
            if hints.len() >= HINTS_MAX {
                hints.clear();
            }
            hints.insert(agent.to_string(), marker);
        }
        was
    }

    /// One write that expects the key's last revision to be `expected` (0:
    /// no message for the key at all). `None` writes a delete marker.
    async fn write(
        &self,
        agent: &str,
        key: &str,
        value: Option<Bytes>,
        expected: u64,
        operation: &'static str,
    ) -> Result<Write, LeaseError> {
        let nats = |source: Box<dyn std::error::Error + Send + Sync>| LeaseError::Nats {
            agent: agent.to_string(),
            operation,
            source,
        };
        let mut message = PublishMessage::build().expected_last_subject_sequence(expected);
        message = match value {
            Some(bytes) => {
                let message = message.payload(bytes);
                match self.ttl {
                    Some(ttl) => message.ttl(ttl),
                    None => message,
                }
            }
            None => message.header("KV-Operation", "DEL"),
        };
        let subject = format!("$KV.{}.{key}", self.bucket);
        let ack = self
            .jetstream
            .send_publish(subject, message)
            .await
            .map_err(|e| nats(Box::new(e)))?;
        match ack.await {
            Ok(ack) => Ok(Write::Stored(ack.sequence)),
            Err(e) if refused(&e) => Ok(Write::Refused),
            Err(e) => Err(nats(Box::new(e))),
        }
    }

    /// The key's last entry: its revision and the value, `None` for a
    /// delete (or expiry) marker. Read from the leader
    /// ([`crate::kv_last`]): every write is fenced by its expected
    /// revision, and the decisions taken on a read are not taken on a
    /// follower's stale answer either.
    async fn read(
        &self,
        agent: &str,
        key: &str,
    ) -> Result<Option<(u64, Option<LeaseValue>)>, LeaseError> {
        let last = crate::kv_last(&self.store, &self.bucket, key)
            .await
            .map_err(|source| LeaseError::Nats {
                agent: agent.to_string(),
                operation: "read",
                source: Box::new(source),
            })?;
        let Some(last) = last else {
            return Ok(None);
        };
        let Some(bytes) = last.value else {
            return Ok(Some((last.revision, None)));
        };
        let value =
            serde_json::from_slice::<LeaseValue>(&bytes).map_err(|e| LeaseError::Corrupt {
                agent: agent.to_string(),
                revision: last.revision,
                detail: e.to_string(),
            })?;
        Ok(Some((last.revision, Some(value))))
    }
}

/// Whether the server refused a write for its expected revision. The
/// client knows the code of nats-server 2.10 (10071); 2.12 and later answer
/// 10164 for the same refusal.
fn refused(error: &jetstream::context::PublishError) -> bool {
    use jetstream::ErrorCode;
    if error.kind() == jetstream::context::PublishErrorKind::WrongLastSequence {
        return true;
    }
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .is_some_and(|e| {
            matches!(
                e.error_code(),
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE
                    | ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
            )
        })
}

/// `run/<agent>`, for a name NATS accepts as part of a key.
fn key(agent: &str) -> Result<String, LeaseError> {
    if agent.is_empty()
        || !agent
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(LeaseError::InvalidAgent {
            agent: agent.to_string(),
        });
    }
    Ok(format!("run/{agent}"))
}

fn encode(value: &LeaseValue) -> Bytes {
    Bytes::from(serde_json::to_vec(value).expect("a lease value serialises"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_keys() {
        let table: &[(&str, Option<&str>)] = &[
            ("rio", Some("run/rio")),
            ("agent-7_b", Some("run/agent-7_b")),
            ("", None),
            ("a.b", None),
            ("a/b", None),
            ("a*", None),
            ("é", None),
        ];
        for (agent, want) in table {
            assert_eq!(key(agent).ok().as_deref(), *want, "{agent:?}");
        }
    }
}
