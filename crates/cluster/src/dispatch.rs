//! The dispatch stream: the controller publishes one order per session, a
//! worker pulls one when it has room for it.
//!
//! The stream is a work queue: an order leaves it when a worker acks it.
//! Each order is published with its session id as `Nats-Msg-Id`, so a second
//! publication of the same session within the dedup window (the controller
//! retrying after a lost ack, or after a restart) is dropped by the server;
//! [`Dispatch::publish`] returns only once the server has stored the order.
//!
//! Orders go to subject `<stream>.<credential group>`, and the workers of one
//! group share one durable pull consumer: a worker asks for one order only
//! when it has a free slot and a working credential for the group
//! ([`OrderQueue::next`]), sends confirmed in-progress acks while it
//! prepares ([`PulledOrder::in_progress`]) and acks once the session runs
//! under its lease. An order a worker took and neither acked nor extended
//! within `ack_wait` goes to another worker: the queue's ack is not a fence,
//! the lease is ([`crate::lease`]).

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull, message::PublishMessage};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

/// The id of run `iteration` (1 for the first) of `agent`'s session
/// `session` on the cluster: its dedup id, its output and end subjects, its
/// lease's session. `AGENT_SESSION`, with `-itN` for later runs: session ids
/// are per agent (two agents started in the same second have the same one)
/// and never hold a `_`, so the last `_` splits them.
pub fn order_id(agent: &str, session: &str, iteration: u32) -> String {
    match iteration {
        0 | 1 => format!("{agent}_{session}"),
        n => format!("{agent}_{session}-it{n}"),
    }
}

/// Whether `order` is the id of a run of `agent`'s session `session`
/// ([`order_id`]). Pure.
pub fn order_of_session(order: &str, agent: &str, session: &str) -> bool {
    let Some(run) = order
        .strip_prefix(agent)
        .and_then(|rest| rest.strip_prefix('_'))
    else {
        return false;
    };
    match run.strip_prefix(session) {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix("-it")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

/// The most queued orders of one group [`Dispatch::queued`] reads before
/// it answers "there".
pub const QUEUED_SCAN: usize = 10_000;

/// One session, as the controller orders it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionOrder {
    /// The session id the controller journalled in `session_start`; the
    /// order's `Nats-Msg-Id`.
    pub session_id: String,
    pub agent: String,
    /// Which workers may run it: those with a working credential of this group.
    pub credential_group: String,
    /// What to run (the daemon's session spec); opaque to this crate.
    #[serde(default)]
    pub spec: serde_json::Value,
}

/// The server stored an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Its sequence in the stream.
    pub sequence: u64,
    /// The server had this session id already (within the dedup window) and
    /// kept the first order only.
    pub duplicate: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(
        "credential group {group:?} cannot be part of a subject: only letters, digits, '-' and '_'"
    )]
    InvalidGroup { group: String },
    #[error("the server did not store the order of session {session_id}: {source}")]
    Publish {
        session_id: String,
        source: jetstream::context::PublishError,
    },
    #[error("cannot create the consumer {consumer} on stream {stream}: {source}")]
    Consumer {
        stream: String,
        consumer: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot pull an order from {consumer}: {source}")]
    Pull {
        consumer: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "no answer to a pull from {consumer} within {waited:?} (the server that took it may be gone); pulling again"
    )]
    PullUnanswered { consumer: String, waited: Duration },
    #[error(
        "order {sequence} of stream {stream} is not a session order ({detail}); it was terminated"
    )]
    BadOrder {
        stream: String,
        sequence: u64,
        detail: String,
    },
    #[error("cannot read the orders in stream {stream}: {source}")]
    Read {
        stream: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot {operation} the order of session {session_id}: {source}")]
    Ack {
        session_id: String,
        operation: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl DispatchError {
    /// A pull no server answered for its consumer (status 503, "no
    /// responders"): the consumer has no leader at the moment. async-nats
    /// says so only in the text of the error it gives for the status.
    pub fn is_no_responders(&self) -> bool {
        match self {
            DispatchError::Pull { source, .. } => {
                let text = source.to_string().to_ascii_lowercase();
                text.contains(": 503,") || text.contains("no responders")
            }
            _ => false,
        }
    }
}

/// The dispatch stream.
#[derive(Clone)]
pub struct Dispatch {
    jetstream: jetstream::Context,
    stream: String,
    ack_wait: Duration,
    replicas: usize,
}

impl Dispatch {
    pub(crate) fn new(
        jetstream: jetstream::Context,
        stream: String,
        ack_wait: Duration,
        replicas: usize,
    ) -> Dispatch {
        Dispatch {
            jetstream,
            stream,
            ack_wait,
            replicas,
        }
    }

    pub fn stream_name(&self) -> &str {
        &self.stream
    }

    /// Publishes `order` and waits until the server has stored it (or has
    /// recognised it as a duplicate).
    pub async fn publish(&self, order: &SessionOrder) -> Result<Published, DispatchError> {
        let subject = self.subject(&order.credential_group)?;
        let payload = serde_json::to_vec(order).expect("an order serialises");
        let publish_error = |source| DispatchError::Publish {
            session_id: order.session_id.clone(),
            source,
        };
        let ack = self
            .jetstream
            .send_publish(
                subject,
                PublishMessage::build()
                    .payload(payload.into())
                    .message_id(&order.session_id),
            )
            .await
            .map_err(publish_error)?
            .await
            .map_err(publish_error)?;
        Ok(Published {
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    /// Whether the order `order_id` of `group` is in the stream: queued, or
    /// pulled and not yet acknowledged (a worker acknowledges an order once
    /// it has its lease and has started it, or once its end is stored). Not
    /// there, then no lease naming it and no end of it, read in that order,
    /// means the order was never stored (or is done). The group's orders
    /// are read one by one (a work queue holds only those not yet taken);
    /// past [`QUEUED_SCAN`] of them the answer is "there", which only
    /// makes the caller wait for the dispatch timeout.
    pub async fn queued(&self, group: &str, order_id: &str) -> Result<bool, DispatchError> {
        use async_nats::jetstream::stream::RawMessageErrorKind;
        let subject = self.subject(group)?;
        let read_error = |source: Box<dyn std::error::Error + Send + Sync>| DispatchError::Read {
            stream: self.stream.clone(),
            source,
        };
        let stream = self
            .jetstream
            .get_stream_no_info(&self.stream)
            .await
            .map_err(|e| read_error(Box::new(e)))?;
        let mut from = 1;
        for _ in 0..QUEUED_SCAN {
            let message = match stream
                .get_first_raw_message_by_subject(&subject, from)
                .await
            {
                Ok(message) => message,
                Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => return Ok(false),
                Err(e) => return Err(read_error(Box::new(e))),
            };
            let by_header = message
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .is_some_and(|v| v.as_str() == order_id);
            let by_payload = || {
                serde_json::from_slice::<SessionOrder>(&message.payload)
                    .is_ok_and(|o| o.session_id == order_id)
            };
            if by_header || by_payload() {
                return Ok(true);
            }
            from = message.sequence + 1;
        }
        Ok(true)
    }

    /// The queue of `group`'s orders: a durable pull consumer the group's
    /// workers share, created if missing.
    pub async fn queue(&self, group: &str) -> Result<OrderQueue, DispatchError> {
        let filter = self.subject(group)?;
        let name = format!("workers-{group}");
        let consumer_error =
            |source: Box<dyn std::error::Error + Send + Sync>| DispatchError::Consumer {
                stream: self.stream.clone(),
                consumer: name.clone(),
                source,
            };
        let stream = self
            .jetstream
            .get_stream(&self.stream)
            .await
            .map_err(|e| consumer_error(Box::new(e)))?;
        let consumer = stream
            .get_or_create_consumer(
                &name,
                pull::Config {
                    durable_name: Some(name.clone()),
                    description: Some(format!("agent-state workers of credential group {group}")),
                    filter_subject: filter,
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: self.ack_wait,
                    num_replicas: self.replicas,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| consumer_error(Box::new(e)))?;
        Ok(OrderQueue {
            consumer,
            name,
            stream: self.stream.clone(),
        })
    }

    fn subject(&self, group: &str) -> Result<String, DispatchError> {
        if group.is_empty()
            || !group
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(DispatchError::InvalidGroup {
                group: group.to_string(),
            });
        }
        Ok(format!("{}.{group}", self.stream))
    }
}

/// How long past its expiry a pull may go unanswered before it counts as
/// lost.
const PULL_ANSWER_GRACE: Duration = Duration::from_secs(3);

/// How long a pull that found no responders waits before asking again.
const NO_RESPONDERS_RETRY: Duration = Duration::from_millis(200);

/// One credential group's orders, as a worker sees them.
pub struct OrderQueue {
    consumer: jetstream::consumer::Consumer<pull::Config>,
    name: String,
    stream: String,
}

impl OrderQueue {
    /// Asks the server for one order and waits for it at most `wait`: `None`
    /// if none came. The server hands out nothing this worker did not ask
    /// for, so a busy worker is never given an order to sit on.
    pub async fn next(&self, wait: Duration) -> Result<Option<PulledOrder>, DispatchError> {
        // The server answers a pull by its expiry at the latest; a pull sent
        // to a server that then died is answered by nobody, and the client
        // would wait for ever (seen after a stream leader's SIGKILL).
        let until = tokio::time::Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let waited = left + PULL_ANSWER_GRACE;
            let answer = match tokio::time::timeout(waited, self.next_unbounded(left)).await {
                Ok(answer) => answer,
                Err(_) => Err(DispatchError::PullUnanswered {
                    consumer: self.name.clone(),
                    waited,
                }),
            };
            // No server answered for the consumer: its leader is being
            // elected (a fresh cluster, a lost server). Asked again within
            // the wait, not reported: an election is no worker's error.
            match answer {
                Err(e) if e.is_no_responders() && left > NO_RESPONDERS_RETRY => {
                    tokio::time::sleep(NO_RESPONDERS_RETRY).await;
                }
                answer => return answer,
            }
        }
    }

    async fn next_unbounded(&self, wait: Duration) -> Result<Option<PulledOrder>, DispatchError> {
        let pull_error = |source: Box<dyn std::error::Error + Send + Sync>| DispatchError::Pull {
            consumer: self.name.clone(),
            source,
        };
        let mut batch = self
            .consumer
            .batch()
            .max_messages(1)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| pull_error(Box::new(e)))?;
        let Some(message) = batch.next().await else {
            return Ok(None);
        };
        let message = message.map_err(pull_error)?;
        let (sequence, delivered) = message
            .info()
            .map(|info| (info.stream_sequence, info.delivered))
            .map_err(pull_error)?;
        match serde_json::from_slice::<SessionOrder>(&message.payload) {
            Ok(order) => Ok(Some(PulledOrder {
                order,
                sequence,
                delivered,
                message,
            })),
            Err(e) => {
                // Redelivering it would not make it readable.
                let _ = message.ack_with(AckKind::Term).await;
                Err(DispatchError::BadOrder {
                    stream: self.stream.clone(),
                    sequence,
                    detail: e.to_string(),
                })
            }
        }
    }
}

/// An order a worker pulled and has not yet acked.
pub struct PulledOrder {
    pub order: SessionOrder,
    /// Its sequence in the stream.
    pub sequence: u64,
    /// How many times it was handed out, this time included (1: the first).
    pub delivered: i64,
    message: jetstream::Message,
}

impl PulledOrder {
    /// Tells the server the order is being prepared: it stays this worker's
    /// for another `ack_wait`. Returns once the server has confirmed.
    pub async fn in_progress(&self) -> Result<(), DispatchError> {
        self.message
            .double_ack_with(AckKind::Progress)
            .await
            .map_err(|source| self.ack_error("extend", source))
    }

    /// The session runs under its lease: the order leaves the queue.
    /// Returns once the server has confirmed.
    pub async fn ack(self) -> Result<(), DispatchError> {
        self.message
            .double_ack()
            .await
            .map_err(|source| self.ack_error("ack", source))
    }

    /// This worker cannot run it after all (no room, the lease is held):
    /// another worker may take it, after `delay` if given.
    pub async fn give_back(self, delay: Option<Duration>) -> Result<(), DispatchError> {
        self.message
            .ack_with(AckKind::Nak(delay))
            .await
            .map_err(|source| self.ack_error("give back", source))
    }

    fn ack_error(&self, operation: &'static str, source: async_nats::Error) -> DispatchError {
        DispatchError::Ack {
            session_id: self.order.session_id.clone(),
            operation,
            source,
        }
    }
}

#[cfg(test)]
mod order_id_tests {
    use super::*;

    #[test]
    fn an_order_id_names_its_agent_session_and_run_and_nothing_else() {
        assert_eq!(order_id("rio", "20261127-100000", 1), "rio_20261127-100000");
        assert_eq!(order_id("rio", "20261127-100000", 0), "rio_20261127-100000");
        assert_eq!(
            order_id("rio", "20261127-100000", 3),
            "rio_20261127-100000-it3"
        );
        for (order, agent, session, want) in [
            ("rio_20261127-100000", "rio", "20261127-100000", true),
            ("rio_20261127-100000-it2", "rio", "20261127-100000", true),
            ("rio_20261127-1000001", "rio", "20261127-100000", false),
            ("rio_20261127-100000-it", "rio", "20261127-100000", false),
            ("rio_20261127-100000-itx", "rio", "20261127-100000", false),
            ("clay_20261127-100000", "rio", "20261127-100000", false),
            ("rio-x_20261127-100000", "rio", "20261127-100000", false),
            ("rio_20261127-100000.>", "rio", "20261127-100000", false),
            ("rio_s1-x", "rio", "s1", false),
            ("rios1", "rio", "s1", false),
        ] {
            assert_eq!(order_of_session(order, agent, session), want, "{order}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pull_nobody_answered_is_no_responders() {
        let pull = |text: &str| DispatchError::Pull {
            consumer: "workers-main".into(),
            source: Box::new(std::io::Error::other(text.to_string())),
        };
        let table = [
            (
                pull("error while processing messages from the stream: 503, None"),
                true,
            ),
            (pull("no responders"), true),
            (
                pull(
                    "error while processing messages from the stream: 409, Some(\"Consumer Deleted\")",
                ),
                false,
            ),
            (pull("missing heartbeat"), false),
            (
                DispatchError::PullUnanswered {
                    consumer: "workers-main".into(),
                    waited: Duration::from_secs(8),
                },
                false,
            ),
            (
                DispatchError::InvalidGroup {
                    group: "503,".into(),
                },
                false,
            ),
        ];
        for (error, want) in table {
            assert_eq!(error.is_no_responders(), want, "{error}");
        }
    }
}
