//! The worker registry and the output stream against a real three-server
//! JetStream cluster (issue 24). Gated by `AGENT_STATE_NATS_TESTS=1`, like
//! `jetstream.rs`.

mod support;

use std::time::{Duration, SystemTime};

use agent_state_cluster::workers::{since_stored, unix_ms};
use agent_state_cluster::{
    CredentialState, LeaseTiming, Outcome, RunningSession, SessionEnd, WorkerRecord, WorkerState,
    WorkerTiming, worker_state,
};
use support::{NatsCluster, server_binary};

fn record(host: &str, sessions: usize, drained: bool) -> WorkerRecord {
    WorkerRecord {
        host: host.into(),
        version: "test".into(),
        slots: 2,
        sessions: (0..sessions)
            .map(|i| RunningSession {
                session_id: format!("s-{i}"),
                agent: format!("a{i}"),
                started_ms: unix_ms(SystemTime::now()),
            })
            .collect(),
        credentials: vec![CredentialState {
            group: "main".into(),
            working: true,
            detail: None,
        }],
        drained,
        stopped: false,
        not_pulling: None,
        heartbeat_ms: unix_ms(SystemTime::now()),
        heartbeat_every_ms: 5000,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_register_beat_and_are_asked_to_drain() {
    let Some(binary) = server_binary("worker_registry") else {
        return;
    };
    let nats = NatsCluster::start(&binary, 3);
    let (cluster, _, _) = nats
        .connect(&nats.settings(), "operator", LeaseTiming::DEFAULT)
        .await;
    // Nothing registered yet: a reader creates nothing.
    assert!(cluster.existing_workers().await.unwrap().is_none());

    let (w1, _, _) = nats
        .connect(&nats.settings(), "w1", LeaseTiming::DEFAULT)
        .await;
    let registry = w1.workers().await.unwrap();
    let first = registry
        .beat(&record("w1.example", 1, false))
        .await
        .unwrap();
    registry.beat(&record("w0", 0, false)).await.unwrap();
    let second = registry
        .beat(&record("w1.example", 2, false))
        .await
        .unwrap();
    assert!(second > first);

    let reader = cluster
        .existing_workers()
        .await
        .unwrap()
        .expect("the bucket");
    let all = reader.list().await.unwrap();
    let hosts: Vec<&str> = all.iter().map(|e| e.record.host.as_str()).collect();
    assert_eq!(hosts, ["w0", "w1.example"], "by host, one record each");
    let w1e = &all[1];
    assert_eq!(w1e.record.sessions.len(), 2, "the last heartbeat's record");
    assert_eq!(w1e.revision, second);
    let age = since_stored(w1e.stored_at, SystemTime::now());
    assert!(age < Duration::from_secs(5), "stored {age:?} ago");
    let t = WorkerTiming::DEFAULT;
    assert_eq!(
        worker_state(&t, &w1e.record, age, w1e.drain_requested),
        WorkerState::Alive
    );

    // The operator asks; the worker's next heartbeat does not undo it.
    reader.request_drain("w1.example", true).await.unwrap();
    assert!(registry.drain_requested("w1.example").await.unwrap());
    assert!(!registry.drain_requested("w0").await.unwrap());
    registry.beat(&record("w1.example", 2, true)).await.unwrap();
    let e = reader.get("w1.example").await.unwrap().expect("w1");
    assert!(e.drain_requested && e.record.drained);
    assert_eq!(
        worker_state(&t, &e.record, Duration::ZERO, e.drain_requested),
        WorkerState::Draining
    );
    registry.beat(&record("w1.example", 0, true)).await.unwrap();
    let e = reader.get("w1.example").await.unwrap().expect("w1");
    assert_eq!(
        worker_state(&t, &e.record, Duration::ZERO, e.drain_requested),
        WorkerState::Drained
    );
    reader.request_drain("w1.example", false).await.unwrap();
    assert!(!registry.drain_requested("w1.example").await.unwrap());
    assert!(reader.get("nobody").await.unwrap().is_none());
    assert!(reader.request_drain("a b", true).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_chunks_and_the_end_are_replayed_in_order_once_each() {
    let Some(binary) = server_binary("output_stream") else {
        return;
    };
    let nats = NatsCluster::start(&binary, 3);
    let (worker, _, _) = nats
        .connect(&nats.settings(), "w1", LeaseTiming::DEFAULT)
        .await;
    let output = worker.output().await.unwrap();
    assert!(output.ended("s-1").await.unwrap().is_none());
    for (n, pipe, text) in [
        (1, "stdout", "one\n"),
        (2, "stderr", "two\n"),
        (3, "stdout", "three\n"),
    ] {
        output
            .chunk("s-1", n, pipe, text.as_bytes().to_vec().into())
            .await
            .unwrap();
    }
    // Chunk 2 sent again (its ack lost): stored once.
    output
        .chunk("s-1", 2, "stderr", "two\n".as_bytes().to_vec().into())
        .await
        .unwrap();
    output
        .chunk("s-2", 1, "stdout", "other\n".as_bytes().to_vec().into())
        .await
        .unwrap();
    let end = SessionEnd {
        session_id: "s-1".into(),
        agent: "rio".into(),
        host: "w1".into(),
        outcome: Outcome::Exited {
            code: Some(0),
            signal: None,
        },
        started_ms: 1,
        ended_ms: 2,
        last_chunk: 3,
        lease_revision: 9,
        workspace: None,
    };
    output.end(&end).await.unwrap();
    output.end(&end).await.unwrap();

    let (controller, _, _) = nats
        .connect(&nats.settings(), "controller", LeaseTiming::DEFAULT)
        .await;
    let (chunks, got) = controller
        .output()
        .await
        .unwrap()
        .replay("s-1")
        .await
        .unwrap();
    let seen: Vec<(u64, &str, &[u8])> = chunks
        .iter()
        .map(|c| (c.number, c.pipe.as_str(), c.data.as_ref()))
        .collect();
    assert_eq!(
        seen,
        [
            (1, "stdout", &b"one\n"[..]),
            (2, "stderr", &b"two\n"[..]),
            (3, "stdout", &b"three\n"[..])
        ]
    );
    assert_eq!(got, Some(end));
    assert!(
        output
            .chunk("a.b", 1, "stdout", Vec::new().into())
            .await
            .is_err()
    );
}
