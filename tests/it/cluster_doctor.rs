//! `doctor` on the cluster's worker side (issue 24): the worker registry
//! and the output stream (said to be created at the first worker's start
//! until one starts), then each registered worker with its state — alive,
//! draining, lost — through the real binary against a real three-server
//! NATS JetStream cluster and a real `agent-state worker`. Gated like the
//! cluster crate's tests: `AGENT_STATE_NATS_TESTS=1` (the server from
//! AGENT_STATE_NATS_SERVER or PATH), else SKIPPED.

// The cluster crate's NATS helpers, as `cluster_worker` loads them.
#[path = "../../crates/cluster/tests/support/mod.rs"]
#[allow(clippy::duplicate_mod)]
mod nats;

use crate::cluster_worker::Worker;
use crate::support::*;
use std::time::Duration;

/// doctor's stdout (it exits non-zero when anything else on this test
/// machine fails; the lines are what is checked).
fn doctor(env: &Env) -> String {
    let out = env.run(&["doctor"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs doctor until its report has every line of `want` (bounded: 60 s).
fn wait_doctor(env: &Env, worker: Option<&Worker>, want: &[&str]) -> String {
    let mut said = String::new();
    let ok = poll_until(Duration::from_secs(60), || {
        said = doctor(env);
        want.iter().all(|w| said.contains(w))
    });
    assert!(
        ok,
        "doctor never said {want:?}; last report:\n{said}\nworker log:\n{}",
        worker.map(Worker::log).unwrap_or_default()
    );
    said
}

#[test]
fn doctor_checks_the_worker_registry_the_output_stream_and_each_worker() {
    let Some(binary) = nats::server_binary("cluster_doctor") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let env = Env::with_config("");
    let script = env.script("agent.sh", "exit 0\n");
    let mut config = daemon_config(&script, &[], &[], "[[agent]]\nname = \"rio\"\n");
    config.push_str(&format!(
        "\n[cluster]\nurls = {:?}\nreplicas = 3\n",
        servers.urls()
    ));
    env.set_config(&config);

    // No worker ever started: both are said to come with the first one
    // (doctor retried while the new cluster elects its JetStream leader).
    let said = wait_doctor(
        &env,
        None,
        &[
            "note  worker registry: agent_state_workers does not exist yet: it is created when the first worker starts",
            "note  output stream: AGENT_STATE_OUTPUT does not exist yet: it is created when the first worker starts",
        ],
    );
    assert!(!said.contains("worker: "), "{said}");

    // A worker starts: the registry, the stream and the worker itself.
    let mut worker = Worker::start(&env, "w1");
    let said = wait_doctor(
        &env,
        Some(&worker),
        &[
            "ok    worker registry: agent_state_workers: 3 replica(s)",
            "ok    output stream: AGENT_STATE_OUTPUT: 3 replica(s)",
            "ok    worker: w1: alive, 0/2 slot(s) busy",
        ],
    );
    assert!(
        !said.contains("does not exist yet: it is created when the first worker"),
        "{said}"
    );

    // The operator drains it: doctor says so and how to undo it. Idle, it
    // is drained one heartbeat after it is draining (a busy machine's
    // doctor may only see the second).
    env.ok(&["worker", "drain", "w1"]);
    let mut said = String::new();
    let drained = poll_until(Duration::from_secs(60), || {
        said = doctor(&env);
        said.contains("note  worker: w1: draining") || said.contains("note  worker: w1: drained")
    });
    assert!(
        drained,
        "doctor never said w1 is draining or drained; last report:\n{said}\nworker log:\n{}",
        worker.log()
    );
    assert!(
        said.contains("agent-state worker resume w1"),
        "doctor does not say how to undo the drain:\n{said}"
    );
    env.ok(&["worker", "resume", "w1"]);
    wait_doctor(&env, Some(&worker), &["ok    worker: w1: alive"]);

    // SIGKILL: no more heartbeats; after four periods (at least 3 s) the
    // worker is lost, a warning with its fix.
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    let said = wait_doctor(&env, None, &["w1: lost, 0/2 slot(s) busy"]);
    let line = said.lines().position(|l| l.contains("w1: lost")).unwrap();
    let lines: Vec<&str> = said.lines().collect();
    assert!(
        lines[line].to_lowercase().starts_with("warn"),
        "a lost worker is a warning:\n{said}"
    );
    assert!(
        lines[line..]
            .iter()
            .take(3)
            .any(|l| l.contains("check agent-state-worker.service on w1")),
        "the lost worker's line has no fix:\n{said}"
    );
}
