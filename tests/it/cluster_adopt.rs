//! A controller restart in cluster mode (issue 24): the sessions it ran on
//! workers go on, and the next controller follows them again — their
//! output, signals and end recorded once, their messages acknowledged once.
//! Gated like `cluster_executor` (`AGENT_STATE_NATS_TESTS=1`).

use crate::cluster_executor::nats;
use crate::cluster_executor::{
    cluster_config, cluster_env, go, log_of, session, test_client, wait_ready,
};
use crate::cluster_worker::Worker;
use crate::support::*;
use nix::sys::signal::Signal;
use serde_json::Value;
use std::time::Duration;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Everything one session left, checked: one start and one end in the
/// journal, completed, each line of its output once in its log (the lines
/// before the restart were written again from the stream), each PROGRESS
/// carried out once, its message acknowledged once, no interruption.
fn recorded_once(env: &Env, agent: &str, sid: &str, message: &str) {
    let s = session(env, agent);
    assert_eq!(s["status"], "completed", "{s:#}");
    assert_eq!(s["session_id"], sid, "{s:#}");
    let journal = env.journal(agent);
    let of_it: Vec<&str> = journal
        .iter()
        .filter(|e| e["session_id"] == sid)
        .filter_map(|e| e["event"].as_str())
        .collect();
    let count = |name: &str| of_it.iter().filter(|e| **e == name).count();
    assert_eq!(count("session_start"), 1, "{of_it:?}");
    assert_eq!(count("session_end"), 1, "{of_it:?}");
    assert_eq!(count("error"), 0, "{of_it:?}");
    let progress: Vec<&Value> = journal
        .iter()
        .filter(|e| e["event"] == "signal" && e["type"] == "PROGRESS")
        .collect();
    assert_eq!(
        progress.len(),
        2,
        "each PROGRESS carried out once: {progress:#?}"
    );
    let log = log_of(env, agent);
    for line in [
        format!("{agent} before"),
        "<axiom>PROGRESS:40</axiom>".to_string(),
        "<axiom>PROGRESS:100</axiom>".to_string(),
        format!("{agent} after"),
    ] {
        assert_eq!(
            log.matches(&line).count(),
            1,
            "{line:?} once in the log:\n{log}"
        );
    }
    assert_eq!(state(env, agent, "report.json")["progress"], 100);
    let processed = env.files(agent, "inbox/processed");
    assert_eq!(
        processed.iter().filter(|n| n.contains(message)).count(),
        1,
        "the message acknowledged once: {processed:?}"
    );
    assert!(env.waiting(agent).is_empty(), "{:?}", env.waiting(agent));
    assert!(
        !env.error_log().contains("SESSION_INTERRUPTED"),
        "{}",
        env.error_log()
    );
}

/// rio's session runs on w1 when the controller is SIGKILLed; theseus's
/// when it gets SIGTERM (it exits without waiting for the session, saying
/// it leaves it running). Each time the next controller follows the
/// session again, and its end is recorded as if the controller had never
/// gone; the worker ran each session once.
#[test]
fn a_restarted_controller_follows_its_remote_sessions_again() {
    let Some(binary) = nats::server_binary("cluster_adopt") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    wait_ready(&servers);
    let env = cluster_env(&servers, "60s", "");
    env.script(
        "agent.sh",
        &format!(
            r#"dir={:?}
echo "$1 before"
echo "<axiom>PROGRESS:40</axiom>"
while [ ! -e "$dir/go-$1" ]; do sleep 0.05; done
echo "<axiom>PROGRESS:100</axiom>"
echo "$1 after""#,
            env.dir.path()
        ),
    );
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();

    // Killed outright.
    let mut d = env.daemon();
    let message = env.send("marcus", "rio", &[]);
    env.ok(&["wake", "rio"]);
    // Carried out whole: report.json first, then the journal's line.
    d.wait_until(secs(60), "rio's PROGRESS:40 journaled", || {
        env.events("rio", "signal").len() == 1
    });
    d.wait_until(secs(20), "daemon.json names w1", || {
        d.heartbeat()["running"][0]["host"] == "w1"
    });
    let sid = session(&env, "rio")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    d.kill9();
    let d2 = env.daemon();
    d2.wait_until(secs(30), "the new controller follows rio's session", || {
        d2.log_text()
            .contains("followed again after the controller's restart")
            && d2.heartbeat()["running"][0]["host"] == "w1"
    });
    assert_eq!(session(&env, "rio")["status"], "running");
    assert_eq!(
        session(&env, "rio")["owner_pid"],
        d2.pid,
        "the new controller owns it"
    );
    go(&env, "rio");
    d2.wait_until(secs(60), "rio's session completed", || {
        session(&env, "rio")["status"] == "completed" && d2.idle()
    });
    recorded_once(&env, "rio", &sid, &message);

    // Stopped (SIGTERM): it leaves the session running and exits.
    let mut d2 = d2;
    let message = env.send("marcus", "theseus", &[]);
    env.ok(&["wake", "theseus"]);
    d2.wait_until(secs(60), "theseus's PROGRESS:40 journaled", || {
        env.events("theseus", "signal").len() == 1 && d2.heartbeat()["running"][0]["host"] == "w1"
    });
    let sid = session(&env, "theseus")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    d2.signal(Signal::SIGTERM);
    d2.wait_exit(secs(30));
    assert!(
        d2.log_text()
            .contains("left running on w1 for the next controller"),
        "{}",
        d2.log_text()
    );
    assert_eq!(session(&env, "theseus")["status"], "running");
    assert!(
        !worker.log().contains("of theseus ended"),
        "the worker did not end it:\n{}",
        worker.log()
    );
    let d3 = env.daemon();
    d3.wait_until(
        secs(30),
        "the new controller follows theseus's session",
        || {
            d3.log_text()
                .contains("followed again after the controller's restart")
        },
    );
    go(&env, "theseus");
    d3.wait_until(secs(60), "theseus's session completed", || {
        session(&env, "theseus")["status"] == "completed" && d3.idle()
    });
    recorded_once(&env, "theseus", &sid, &message);
    assert!(
        !env.root.join(".daemon/remote.rio").exists()
            && !env.root.join(".daemon/remote.theseus").exists(),
        "the order records are removed once the ends are recorded"
    );
    let log = worker.log();
    assert_eq!(
        log.matches("of theseus started").count(),
        1,
        "the worker ran it once:\n{log}"
    );
    assert_eq!(log.matches("of rio started").count(), 1, "{log}");
}

/// A controller killed while it recorded a remote session's end, after the
/// end's journal line (its commit) and before session.json and its order
/// record: the next controller completes that end from the journal and
/// does not follow the session again (chaos round 4 found the end recorded
/// twice).
#[test]
fn a_controller_killed_recording_an_end_does_not_record_it_again() {
    let Some(binary) = nats::server_binary("cluster_adopt") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    wait_ready(&servers);
    let env = cluster_env(&servers, "60s", "");
    env.script(
        "agent.sh",
        &format!(
            r#"dir={:?}
echo "$1 before"
while [ ! -e "$dir/go-$1" ]; do sleep 0.05; done
echo "$1 after""#,
            env.dir.path()
        ),
    );
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let mut d = env.daemon();
    env.send("marcus", "rio", &[]);
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(60), "rio runs on w1", || {
        d.heartbeat()["running"][0]["host"] == "w1"
    });
    let sid = session(&env, "rio")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    // The files as they are while it runs (its owner lock, the
    // controller's, removed at the end's last step).
    let running = [
        env.path("rio", "session.json"),
        env.path("rio", &format!("sessions/{sid}.owner")),
        env.root.join(".daemon/remote.rio"),
    ]
    .map(|p| {
        let bytes = std::fs::read(&p).unwrap();
        (p, bytes)
    });
    go(&env, "rio");
    d.wait_until(secs(60), "rio's session completed", || {
        session(&env, "rio")["status"] == "completed" && d.idle()
    });
    d.kill9();
    // The crash's window: the journal has the end, the files do not.
    for (path, bytes) in &running {
        std::fs::write(path, bytes).unwrap();
    }
    let d2 = env.daemon();
    d2.wait_until(
        secs(30),
        "rio's session completed again from the journal",
        || session(&env, "rio")["status"] == "completed" && d2.idle(),
    );
    let ends: Vec<Value> = env
        .journal("rio")
        .into_iter()
        .filter(|e| {
            e["session_id"] == sid.as_str()
                && matches!(
                    e["event"].as_str(),
                    Some("session_end" | "error" | "timeout")
                )
        })
        .collect();
    assert_eq!(ends.len(), 1, "one end of {sid}: {ends:#?}");
    assert!(
        !d2.log_text()
            .contains("followed again after the controller's restart"),
        "{}",
        d2.log_text()
    );
    assert!(!env.root.join(".daemon/remote.rio").exists());
}

/// A controller killed after it recorded an order (`.daemon/remote.AGENT`,
/// the order kept in `remote.AGENT.order`) and before the servers stored it
/// (held there by the test-only AGENT_STATE_TEST_HOLD_PUBLISH), then
/// started again with no worker up: it finds the order not queued, with no
/// lease and no end. Another order of the same group waits in the stream
/// meanwhile: the check reads the orders themselves, so it decides at
/// once, not at the 60 s dispatch timeout. Returns the session id and the
/// message, and the second controller.
fn unstored_order_after_a_restart(
    servers: &nats::NatsCluster,
    env: &Env,
    keep_order: bool,
) -> (String, String, Daemon) {
    let worker = Worker::start(env, "w1");
    worker.wait_registered();
    let mut d = Daemon::start(env, &[("AGENT_STATE_TEST_HOLD_PUBLISH", "1")]);
    let message = env.send("marcus", "rio", &[]);
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(30), "rio's order recorded", || {
        env.root.join(".daemon/remote.rio").exists()
    });
    let kept = env.root.join(".daemon/remote.rio.order");
    let mode = std::fs::metadata(&kept)
        .expect("the order kept")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600,
        "the order carries the session's env"
    );
    let sid = session(env, "rio")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    d.kill9();
    if !keep_order {
        // A controller of before kept no order.
        std::fs::remove_file(&kept).unwrap();
    }
    // No worker pulls now; another order of the group waits in the stream
    // (its spec is no spec: a worker ends it "not started" later).
    drop(worker);
    let (rt, cluster, dispatch, _) = test_client(servers);
    let decoy = agent_state_cluster::SessionOrder {
        session_id: "leo_20200101-000000".into(),
        agent: "leo".into(),
        credential_group: "default".into(),
        spec: serde_json::json!({}),
    };
    rt.block_on(dispatch.publish(&decoy))
        .expect("the other order stored");
    assert!(
        rt.block_on(dispatch.queued("default", "leo_20200101-000000"))
            .unwrap()
    );
    drop(cluster);
    (sid, message, env.daemon())
}

/// The order kept: the next controller publishes it again at once (no
/// worker up yet), and once a worker starts, the session runs (the same
/// session, once) and its message is processed: a controller restart
/// loses no session it began. On the code before: "not started", the
/// message back in the inbox.
#[test]
fn an_order_recorded_but_never_stored_is_published_again_after_a_restart() {
    let Some(binary) = nats::server_binary("cluster_adopt") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    wait_ready(&servers);
    let env = cluster_env(&servers, "60s", "echo \"$1 ran\"");
    let (sid, message, d2) = unstored_order_after_a_restart(&servers, &env, true);
    let t = std::time::Instant::now();
    d2.wait_until(secs(20), "the order published again", || {
        d2.log_text().contains("published it again to the workers")
    });
    eprintln!("published again {:?} after the restart", t.elapsed());
    assert_eq!(session(&env, "rio")["status"], "running");
    let worker = Worker::start(&env, "w2");
    worker.wait_registered();
    d2.wait_until(secs(60), "rio's session completed", || {
        session(&env, "rio")["status"] == "completed"
    });
    let s = session(&env, "rio");
    assert_eq!(s["session_id"], sid.as_str(), "{s:#}");
    assert!(
        worker.log().contains(&format!("rio_{sid}")),
        "{}",
        worker.log()
    );
    d2.wait_until(secs(20), "the message processed", || {
        env.agent("rio")
            .join("inbox/processed")
            .join(format!("{message}.json"))
            .exists()
    });
    assert!(env.waiting("rio").is_empty(), "{:?}", env.waiting("rio"));
    let of_sid = |event: &str| {
        env.events("rio", event)
            .iter()
            .filter(|e| e["session_id"] == sid.as_str())
            .count()
    };
    assert_eq!(
        (of_sid("session_start"), of_sid("session_end")),
        (1, 1),
        "{:#?}",
        env.journal("rio")
    );
    d2.wait_until(secs(10), "the record and the kept order removed", || {
        !env.root.join(".daemon/remote.rio").exists()
            && !env.root.join(".daemon/remote.rio.order").exists()
    });
}

/// Without the kept order (a controller of before): the session ends "not
/// started" at once with its message back, instead of waiting out its
/// timeout (chaos round 9: three sessions "timed out"); the agent's next
/// session runs.
#[test]
fn an_order_recorded_but_never_stored_nor_kept_ends_not_started_after_a_restart() {
    let Some(binary) = nats::server_binary("cluster_adopt") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    wait_ready(&servers);
    let env = cluster_env(&servers, "60s", "echo \"$1 ran\"");
    let (sid, message, d2) = unstored_order_after_a_restart(&servers, &env, false);
    let t = std::time::Instant::now();
    d2.wait_until(secs(20), "rio's session ended not started", || {
        session(&env, "rio")["status"] == "error"
    });
    let s = session(&env, "rio");
    assert_eq!(s["session_id"], sid.as_str());
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("not started")
            && reason.contains("stopped before the servers stored its order"),
        "{s:#}"
    );
    eprintln!("ended {:?} after the restart", t.elapsed());
    d2.wait_until(secs(20), "the message back in the inbox", || {
        env.waiting("rio").iter().any(|m| m.contains(&message))
    });
    // Nothing holds rio: its next session runs on a worker.
    let worker = Worker::start(&env, "w2");
    worker.wait_registered();
    env.ok(&["wake", "rio"]);
    d2.wait_until(secs(60), "rio's next session completed", || {
        session(&env, "rio")["status"] == "completed"
    });
    assert!(worker.log().contains("of rio started"), "{}", worker.log());
}

/// The reconcile (its period shortened by the test-only
/// AGENT_STATE_TEST_RECONCILE): a lease held for an order the controller
/// does not run (theseus's, taken by a "ghost" host) is said at one
/// reconcile and fenced at the next; the lease of rio's session, running
/// on w1 meanwhile, is left alone, and the session completes.
#[test]
fn the_reconcile_fences_a_lease_held_for_no_session_of_the_controller() {
    let Some(binary) = nats::server_binary("cluster_adopt") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    wait_ready(&servers);
    let env = cluster_env(&servers, "60s", "");
    env.script(
        "agent.sh",
        &format!(
            r#"dir={:?}
echo "$1 before"
while [ ! -e "$dir/go-$1" ]; do sleep 0.05; done
echo "$1 after""#,
            env.dir.path()
        ),
    );
    let (rt, _cluster, _, leases) = test_client(&servers);
    let ghost = rt
        .block_on(leases.take("theseus", "ghost", "theseus_20200101-000000"))
        .expect("the ghost's lease");
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let d = Daemon::start(&env, &[("AGENT_STATE_TEST_RECONCILE", "2s")]);
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(60), "rio's session runs on w1", || {
        d.heartbeat()["running"][0]["host"] == "w1"
    });
    d.wait_until(secs(60), "the reconcile fenced the ghost's lease", || {
        d.log_text()
            .contains("fenced the lease run/theseus of order theseus_20200101-000000 on ghost")
    });
    let log = d.log_text();
    let said = log
        .find("the lease run/theseus is held by ghost for order theseus_20200101-000000, which this controller does not run")
        .expect("said at the first reconcile");
    let fenced = log.find("fenced the lease run/theseus").unwrap();
    assert!(said < fenced, "said before it is fenced:\n{log}");
    let current = |agent: &str| rt.block_on(leases.current(agent)).unwrap();
    assert!(current("theseus").is_none(), "the ghost's lease is gone");
    assert!(
        rt.block_on(leases.renew(&ghost)).is_err(),
        "the ghost can no longer renew it"
    );
    let rio = current("rio").expect("rio's lease is left alone");
    assert_eq!(rio.value.holder, "w1");
    assert!(!log.contains("fenced the lease run/rio"), "{log}");
    assert_eq!(session(&env, "rio")["status"], "running");
    go(&env, "rio");
    d.wait_until(secs(60), "rio's session completed", || {
        session(&env, "rio")["status"] == "completed"
    });
    assert!(log_of(&env, "rio").contains("rio after"));
}

/// With sessions on workers, the agent's command is the workers' to find:
/// the controller does not refuse a wake because the command is missing on
/// its own host (it held the agent as AGENT_NOT_FOUND). The command exists
/// only once the worker that runs it starts.
#[test]
fn the_controller_leaves_the_command_to_the_workers() {
    let Some(binary) = nats::server_binary("cluster_adopt") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    wait_ready(&servers);
    let env = Env::with_config("");
    let later = env.tmp("on-the-worker.sh");
    cluster_config(&env, &servers, "120s", &later, "");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(30), "rio's order is published", || {
        d.log_text().contains("order published to the workers")
    });
    assert_eq!(session(&env, "rio")["status"], "running");
    assert!(
        !env.error_log().contains("AGENT_NOT_FOUND"),
        "{}",
        env.error_log()
    );
    // The command exists on the worker's host now, and a worker starts.
    env.script("on-the-worker.sh", "echo ran on the worker");
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    d.wait_until(secs(60), "rio's session completed", || {
        session(&env, "rio")["status"] == "completed"
    });
    assert!(log_of(&env, "rio").contains("ran on the worker"));
}

/// Metrics per worker: the controller's /metrics says each worker's state,
/// slots, sessions, heartbeat age, whether it pulls, and each credential
/// group's login, from the registry; a worker that stops is said stopped.
/// (`promtool check metrics` too, where Prometheus' tools are installed.)
#[test]
fn the_controllers_metrics_say_each_workers_state() {
    use crate::monitoring::{free_port, http_get, prometheus_tests_enabled, promtool_check};
    let Some(binary) = nats::server_binary("cluster_adopt") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    wait_ready(&servers);
    let env = Env::with_config("");
    let script = env.script("agent.sh", "");
    let port = free_port();
    cluster_config(
        &env,
        &servers,
        "60s",
        &script,
        &format!("\n[metrics]\nlisten = \"127.0.0.1:{port}\"\ninterval = \"1s\"\n"),
    );
    let mut worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let d = env.daemon();
    let metrics = || {
        http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    };
    d.wait_until(secs(30), "w1 alive in the metrics", || {
        metrics().contains("agent_state_worker_state{host=\"w1\",state=\"alive\"} 1")
    });
    let text = metrics();
    for line in [
        "agent_state_cluster_registry_up 1",
        "agent_state_worker_slots{host=\"w1\"} 2",
        "agent_state_worker_sessions{host=\"w1\"} 0",
        "agent_state_worker_pulling{host=\"w1\"} 1",
        "agent_state_worker_credential_working{host=\"w1\",group=\"default\"} 1",
        "agent_state_worker_state{host=\"w1\",state=\"lost\"} 0",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
    assert!(text.contains("agent_state_worker_heartbeat_age_seconds{host=\"w1\"}"));
    if prometheus_tests_enabled() {
        let (ok, said) = promtool_check(&text);
        assert!(ok, "promtool check metrics: {said}\n{text}");
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker.child.id() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    assert!(
        poll_until(secs(30), || worker.child.try_wait().unwrap().is_some()),
        "the worker did not exit after SIGTERM:\n{}",
        worker.log()
    );
    d.wait_until(secs(30), "w1 stopped in the metrics", || {
        metrics().contains("agent_state_worker_state{host=\"w1\",state=\"stopped\"} 1")
    });
    assert!(metrics().contains("agent_state_worker_pulling{host=\"w1\"} 0"));
}
