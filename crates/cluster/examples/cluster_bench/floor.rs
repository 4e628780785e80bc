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

/// The floor's figures, in ms, one per dispatch.
#[derive(Default)]
pub struct Floor {
    /// Order published → the script's first line (`$EPOCHREALTIME` in
    /// `start-<id>`): the whole bare path.
    pub started: Vec<f64>,
    /// Order published → in the waiting pull's hands: the publish (stored,
    /// R3) and the delivery, what the issue measured as dispatch (1.4 ms on
    /// its cluster).
    pub in_hand: Vec<f64>,
    /// Order in hand → the lease `run/<agent>` created (R3): the fence.
    pub leased: Vec<f64>,
}

/// `n` dispatches, one at a time.
pub async fn run(
    dispatch: &Dispatch,
    leases: &Leases,
    dir: &Path,
    script: &Path,
    n: usize,
) -> Floor {
    let queue = dispatch.queue("floor").await.expect("the floor's queue");
    let mut floor = Floor::default();
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
        let ((pulled, t_hand), t0) = tokio::join!(
            async {
                let pulled = queue.next(Duration::from_secs(10)).await;
                (pulled, super::now_secs())
            },
            async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                let t0 = super::now_secs();
                dispatch.publish(&order).await.expect("publish");
                t0
            }
        );
        let pulled = pulled.expect("pull").expect("the order within 10 s");
        let lease = leases.take(&agent, "floor", &id).await.expect("the lease");
        let t_lease = super::now_secs();
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
        floor.started.push((started - t0) * 1000.0);
        floor.in_hand.push((t_hand - t0) * 1000.0);
        floor.leased.push((t_lease - t_hand) * 1000.0);
    }
    floor
}
