//! bench/cluster's dispatch floor: the bare path the worker's dispatch
//! follows, in this process with the same async-nats client and the same
//! three servers — a pull outstanding, publish (stored, R3), the order in
//! hand, the lease's create (R3), fork/exec of the session's script, then
//! (off the clock) the order's ack, the child's exit and the release. No
//! in-progress ack, no check for a stored end, no pipes, no hook socket:
//! what the worker adds to it is the difference between the two figures.
//! The orders go to a credential group of their own (`floor`), which no
//! worker pulls.

use std::path::Path;
use std::time::Duration;

use agent_state_cluster::{Dispatch, Leases, SessionOrder};

/// `n` dispatches, one at a time: order published → the script's first
/// line (`$EPOCHREALTIME` in `start-<id>`), in ms.
pub async fn run(
    dispatch: &Dispatch,
    leases: &Leases,
    dir: &Path,
    script: &Path,
    n: usize,
) -> Vec<f64> {
    let queue = dispatch.queue("floor").await.expect("the floor's queue");
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("f-{i}");
        let agent = format!("f{}", i % 50);
        let order = SessionOrder {
            session_id: id.clone(),
            agent: agent.clone(),
            credential_group: "floor".into(),
            spec: serde_json::Value::Null,
        };
        // The pull goes out first, as a waiting worker's has.
        let (pulled, t0) = tokio::join!(queue.next(Duration::from_secs(10)), async {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let t0 = super::now_secs();
            dispatch.publish(&order).await.expect("publish");
            t0
        });
        let pulled = pulled.expect("pull").expect("the order within 10 s");
        let lease = leases.take(&agent, "floor", &id).await.expect("the lease");
        let mut child = tokio::process::Command::new(script)
            .env("BENCH_DIR", dir)
            .env("AGENT_STATE_SESSION_ID", &id)
            .env("LINES_N", "0")
            .env("HOLD", "0")
            .process_group(0)
            .spawn()
            .expect("spawn the script");
        pulled.ack().await.expect("ack");
        child.wait().await.expect("the script's exit");
        leases.release(&lease).await.expect("release");
        let started: f64 = std::fs::read_to_string(dir.join(format!("start-{id}")))
            .expect("the start file")
            .trim()
            .replace(',', ".")
            .parse()
            .expect("a time");
        lat.push((started - t0) * 1000.0);
    }
    lat
}
