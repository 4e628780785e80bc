//! agent-state's cluster foundation (issue 24): sessions on worker hosts
//! through NATS JetStream, one session per agent fenced by a lease.
//!
//! - [`config`]: `[cluster]`, validated, every problem naming its field;
//! - [`connect`]: the connection, the dispatch stream and the lease bucket;
//! - [`lease`]: `run/<agent>`, taken by create, renewed by compare-and-set,
//!   released or fenced by delete-if-revision;
//! - [`dispatch`]: session orders, published with the session id as
//!   `Nats-Msg-Id`, pulled one at a time with in-progress acks;
//! - [`keeper`]: the worker's renewal loop over those decisions;
//! - [`liveness`]: when a lease counts as lost, for the worker and for the
//!   controller, as pure functions of monotonic instants;
//! - [`workers`]: the worker registry, each worker's record renewed as its
//!   heartbeat, the operator's drain requests, and when a worker counts as
//!   alive, draining or lost;
//! - [`session`]: what a worker runs for an order, and the stream its
//!   output and end go to;
//! - [`hooks`]: a session's hook calls, forwarded from its worker to the
//!   controller, and what the controller accepts of them.
//!
//! It knows nothing of the state root, the journal or the daemon: the
//! daemon's executor and the `worker` subcommand are built on it.

pub mod config;
pub mod connect;
pub mod dispatch;
pub mod hooks;
pub mod keeper;
pub mod lease;
pub mod liveness;
pub mod session;
pub mod workers;

pub use async_nats;
pub use bytes::Bytes;

/// The last message stored on `subject` in `stream` (`None`: none), in one
/// round trip (no stream info lookup): an end, a chunk, a queued order.
pub(crate) async fn last_on_subject(
    jetstream: &async_nats::jetstream::Context,
    stream: &str,
    subject: &str,
) -> Result<
    Option<async_nats::jetstream::message::StreamMessage>,
    Box<dyn std::error::Error + Send + Sync>,
> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let stream = jetstream.get_stream_no_info(stream).await?;
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(message) => Ok(Some(message)),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(Box::new(e)),
    }
}
/// A key's last message in a KV bucket: its revision, its value (`None`
/// for a delete, purge or expiry marker) and when the server stored it
/// (nanoseconds since the Unix epoch).
pub(crate) struct KvLast {
    pub revision: u64,
    pub value: Option<Bytes>,
    pub stored_nanos: i128,
}

/// The last message of `key` in the KV bucket `bucket`, read from the
/// bucket stream's leader (`STREAM.MSG.GET`), never by the KV client's
/// direct get: async-nats makes buckets with `allow_direct`, and a direct
/// get may be answered by a follower that has not applied the last write
/// yet (a loaded CI read a released lease back at its old revision). A
/// decision taken on a read (an end recorded, a lease fenced, a worker
/// shown draining right after `worker drain`) then sees every write
/// acknowledged before it.
pub(crate) async fn kv_last(
    store: &async_nats::jetstream::kv::Store,
    bucket: &str,
    key: &str,
) -> Result<Option<KvLast>, async_nats::jetstream::stream::LastRawMessageError> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let subject = format!("$KV.{bucket}.{key}");
    let message = match store.stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => message,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(KvLast {
        revision: message.sequence,
        value: (!is_marker(&message.headers)).then_some(message.payload),
        stored_nanos: message.time.unix_timestamp_nanos(),
    }))
}

/// Whether a stored KV message is a delete, purge or expiry marker rather
/// than a value: `KV-Operation: DEL|PURGE`, or the server's own marker
/// (`Nats-Marker-Reason`, where a per-key TTL ran out).
pub(crate) fn is_marker(headers: &async_nats::HeaderMap) -> bool {
    headers
        .get("KV-Operation")
        .is_some_and(|op| op.as_str() != "PUT")
        || headers
            .get(async_nats::header::NATS_MARKER_REASON)
            .is_some()
}

pub use config::{ClusterSettings, ConfigProblem, RawCluster};
pub use connect::{Cluster, ClusterError, Found, Survey, WorkersUnread};
pub use dispatch::{
    Dispatch, DispatchError, OrderQueue, Published, PulledOrder, SessionOrder, order_id,
    order_of_session,
};
pub use hooks::{Hook, HookAnswer, HookCall, HookRequest, Refusal};
pub use keeper::{KeepEnd, keep, keep_sharing};
pub use lease::{Lease, LeaseError, LeaseRecord, LeaseValue, Leases, process_run};
pub use liveness::{
    ControllerLeaseAction, LeaseTiming, Orphan, Reconciled, TimingError, WorkerLeaseAction,
    controller_lease_action, end_is_from_holder, reconcile, worker_lease_action,
};
pub use session::{
    Chunk, Follow, Outcome, Output, OutputError, SessionEnd, SessionSpec, SpecError, StallAction,
    WorkspaceEnd, WorkspaceJudged, WorkspaceOrder,
};
pub use workers::{
    CredentialState, NameCheck, RunningSession, WorkerEntry, WorkerRecord, WorkerState,
    WorkerTiming, Workers, WorkersError, name_check, worker_state,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_told_from_values_by_their_headers() {
        let table: &[(&[(&str, &str)], bool)] = &[
            (&[], false),
            (&[("Nats-TTL", "300s")], false),
            (&[("KV-Operation", "PUT")], false),
            (&[("KV-Operation", "DEL")], true),
            (&[("KV-Operation", "PURGE")], true),
            (&[("Nats-Marker-Reason", "MaxAge")], true),
            (&[("Nats-Marker-Reason", "Remove")], true),
        ];
        for (headers, marker) in table {
            let mut map = async_nats::HeaderMap::new();
            for (name, value) in *headers {
                map.insert(*name, *value);
            }
            assert_eq!(is_marker(&map), *marker, "{headers:?}");
        }
    }
}
