//! The controller's remote executor (issue 24): the real daemon with
//! `[cluster]` and `local_sessions = false` runs its sessions on a real
//! `agent-state worker` through a real three-server NATS JetStream cluster.
//! Gated like `cluster_worker`: `AGENT_STATE_NATS_TESTS=1` (the server
//! from AGENT_STATE_NATS_SERVER or PATH), else SKIPPED.
//!
//! The worker runs on this machine and shares the state root's paths, so
//! a session's working directory (its agent's directory) exists there; its
//! output reaches the daemon only through the output stream.

// The cluster crate's NATS helpers, as `cluster_worker` loads them.
#[path = "../../crates/cluster/tests/support/mod.rs"]
#[allow(clippy::duplicate_mod)]
pub(crate) mod nats;

use crate::support::*;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::cluster_worker::Worker;

/// Waits until the cluster can hold the streams and buckets (a loaded
/// machine takes seconds to elect the JetStream leaders), and makes them.
pub(crate) fn wait_ready(servers: &nats::NatsCluster) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let settings = servers.settings();
    rt.block_on(async {
        let (cluster, _, _) = servers
            .connect(&settings, "test", agent_state_cluster::LeaseTiming::DEFAULT)
            .await;
        cluster.output().await.expect("the output stream");
    });
}

/// A config whose agents run `script` on the workers of `servers`.
pub(crate) fn cluster_env(
    servers: &nats::NatsCluster,
    dispatch_timeout: &str,
    script_body: &str,
) -> Env {
    let env = Env::with_config("");
    let script = env.script("agent.sh", script_body);
    cluster_config(&env, servers, dispatch_timeout, &script, "");
    env
}

/// `env`'s config: agents rio and theseus running `command` on the workers
/// of `servers`, a human marcus, and `extra` (more sections) at its end;
/// the state root bootstrapped.
pub(crate) fn cluster_config(
    env: &Env,
    servers: &nats::NatsCluster,
    dispatch_timeout: &str,
    command: &Path,
    extra: &str,
) {
    let agents = "[[agent]]\nname = \"rio\"\n[[agent]]\nname = \"theseus\"\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n";
    let config = daemon_config(command, &[], &[("wake_on_inbox", "\"never\"")], agents);
    env.set_config(&format!(
        "{config}\n[cluster]\nurls = {:?}\nreplicas = 3\nlocal_sessions = false\ndispatch_timeout = {dispatch_timeout:?}\n{extra}",
        servers.urls()
    ));
    env.ok(&["bootstrap"]);
}

pub(crate) fn session(env: &Env, agent: &str) -> Value {
    state(env, agent, "session.json")
}

pub(crate) fn log_of(env: &Env, agent: &str) -> String {
    let id = session(env, agent)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    std::fs::read_to_string(env.root.join(agent).join(format!("sessions/{id}.log")))
        .unwrap_or_default()
}

pub(crate) fn go(env: &Env, agent: &str) {
    std::fs::write(env.tmp(&format!("go-{agent}")), "").unwrap();
}

/// A runtime and a client of `servers` named `test`: the cluster, its
/// dispatch queue and its leases.
pub(crate) fn test_client(
    servers: &nats::NatsCluster,
) -> (
    tokio::runtime::Runtime,
    agent_state_cluster::Cluster,
    agent_state_cluster::Dispatch,
    agent_state_cluster::Leases,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let settings = servers.settings();
    let (cluster, dispatch, leases) =
        rt.block_on(servers.connect(&settings, "test", agent_state_cluster::LeaseTiming::DEFAULT));
    (rt, cluster, dispatch, leases)
}

/// Stores a copy of rio's order `order_id` of session `sid` (`env`'s
/// agent.sh with `args`) in the dispatch stream without the order id as
/// `Nats-Msg-Id`: within the dedup window the server would drop it.
fn publish_copy_of_rios_order(
    env: &Env,
    servers: &nats::NatsCluster,
    order_id: &str,
    sid: &Value,
    args: &[&str],
) {
    let (rt, cluster, dispatch, _) = test_client(servers);
    let order = serde_json::to_vec(&agent_state_cluster::SessionOrder {
        session_id: order_id.to_string(),
        agent: "rio".into(),
        credential_group: "default".into(),
        spec: serde_json::json!({
            "command": env.tmp("agent.sh").to_str().unwrap(),
            "args": args,
            "env": { "AGENT_STATE_SESSION_ID": sid, "AGENT_STATE_AGENT": "rio" },
            "cwd": env.dir.path().to_str().unwrap(),
            "timeout_secs": 120,
        }),
    })
    .unwrap();
    rt.block_on(async {
        cluster
            .jetstream()
            .publish(format!("{}.default", dispatch.stream_name()), order.into())
            .await
            .unwrap()
            .await
            .unwrap()
    });
}

fn secs_f(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// `wake rio`: the session runs on worker w1, its output streams back
/// (a PROGRESS signal reaches report.json while it runs), it completes,
/// and its log and journal are those of a local session; theseus's command
/// exits 3 on the worker: an error recorded as for a local one.
#[test]
fn a_session_runs_on_a_worker_and_is_recorded_as_a_local_one() {
    let Some(binary) = nats::server_binary("cluster_executor") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let env = cluster_env(&servers, "30s", "");
    env.script(
        "agent.sh",
        &format!(
            r#"dir={:?}
echo "$1 on ${{AGENT_STATE_WORKER:-this host}} in $(pwd)"
echo "<axiom>PROGRESS:40</axiom>"
while [ ! -e "$dir/go-$1" ]; do sleep 0.05; done
if [ "$1" = theseus ]; then echo "it went wrong" >&2; exit 3; fi
echo "<axiom>PROGRESS:100</axiom>"
echo finished"#,
            env.dir.path()
        ),
    );
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let d = env.daemon();

    env.ok(&["wake", "rio"]);
    // Live: the signal printed on the worker is in report.json while the
    // session still runs there.
    d.wait_until(secs_f(60), "rio's PROGRESS:40 in report.json", || {
        state(&env, "rio", "report.json")["progress"] == 40
    });
    assert_eq!(session(&env, "rio")["status"], "running");
    assert!(
        worker.log().contains("of rio started"),
        "the worker runs it:\n{}",
        worker.log()
    );
    let sid = session(&env, "rio")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    // daemon.json and `status` name the worker it runs on.
    d.wait_until(secs_f(20), "daemon.json names w1", || {
        d.heartbeat()["running"][0]["host"] == "w1"
    });
    assert_eq!(d.heartbeat()["running"][0]["session_id"], sid.as_str());
    let status = env.ok(&["status"]);
    assert!(
        status.contains(&format!("running ({sid} on w1)")),
        "{status}"
    );
    let listed: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let rio = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["agent"] == "rio")
        .unwrap();
    assert_eq!(rio["host"], "w1", "{rio:#}");
    go(&env, "rio");
    d.wait_until(secs_f(60), "rio's session completed", || {
        session(&env, "rio")["status"] == "completed"
            && state(&env, "rio", "report.json")["last_session"]["outcome"] == "completed"
    });
    let log = log_of(&env, "rio");
    let agent_dir = env.root.join("rio");
    assert!(
        log.contains(&format!("rio on w1 in {}", agent_dir.display())),
        "{log}"
    );
    assert!(log.contains("finished"), "{log}");
    let report = state(&env, "rio", "report.json");
    assert_eq!(report["progress"], 100, "{report:#}");
    let journal = env.journal("rio");
    let events: Vec<&str> = journal
        .iter()
        .filter(|e| e["session_id"] == sid.as_str())
        .filter_map(|e| e["event"].as_str())
        .collect();
    assert!(
        events.contains(&"session_start") && events.contains(&"session_end"),
        "{events:?}"
    );
    assert_eq!(
        journal
            .iter()
            .filter(|e| e["event"] == "signal" && e["type"] == "PROGRESS")
            .count(),
        2,
        "{journal:#?}"
    );

    // A command that fails on the worker: an error, its stderr quoted.
    go(&env, "theseus");
    env.ok(&["wake", "theseus"]);
    d.wait_until(secs_f(60), "theseus's session ended", || {
        session(&env, "theseus")["status"] == "error"
    });
    let s = session(&env, "theseus");
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("exited with status 3") && reason.contains("it went wrong"),
        "{s:#}"
    );
    let end = env.session_ends("theseus");
    assert_eq!(end.last().unwrap()["event"], "error", "{end:#?}");
    assert!(log_of(&env, "theseus").contains("theseus on w1"));
}

/// No worker: the order waits the dispatch timeout, the session ends as
/// not started, and its message is back in the inbox. A worker started
/// afterwards does not run the withdrawn order.
#[test]
fn an_order_no_worker_takes_ends_not_started_and_its_message_returns() {
    let Some(binary) = nats::server_binary("cluster_executor") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    wait_ready(&servers);
    let env = cluster_env(&servers, "3s", "echo ran; touch \"$0.ran\"");
    let d = env.daemon();
    let id = env.send("marcus", "rio", &[]);
    env.ok(&["wake", "rio"]);
    d.wait_until(secs_f(60), "rio's session ended", || {
        session(&env, "rio")["status"] == "error"
    });
    let s = session(&env, "rio");
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("not started") && reason.contains("dispatch timeout"),
        "{s:#}"
    );
    d.wait_until(secs_f(20), "the message back in the inbox", || {
        env.waiting("rio").iter().any(|m| m.contains(&id))
    });

    // The withdrawn order stays unrun when a worker comes.
    let worker = Worker::start(&env, "w1");
    // (The order's id: the agent's, then its session's.)
    let sid = format!("rio_{}", s["session_id"].as_str().unwrap());
    let seen = poll_until(secs_f(30), || {
        worker
            .log()
            .contains(&format!("session {sid} already ended"))
    });
    assert!(seen, "the worker never saw the order:\n{}", worker.log());
    assert!(!Path::new(&format!("{}.ran", env.tmp("agent.sh").display())).exists());
}

/// `agent-state stop rio` on a session running on a worker: the worker's
/// process ends (the lease fenced) and the session is recorded stopped.
#[test]
fn stop_ends_a_remote_session() {
    let Some(binary) = nats::server_binary("cluster_executor") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let env = cluster_env(&servers, "30s", "");
    let pid_file = env.tmp("pid");
    env.script(
        "agent.sh",
        &format!(
            "echo $$ > {:?}.tmp && mv {:?}.tmp {:?}\necho working\nwhile true; do sleep 0.1; done",
            pid_file, pid_file, pid_file
        ),
    );
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    // Its output in the session log: the daemon follows it running.
    d.wait_until(secs_f(60), "rio runs on the worker", || {
        pid_file.exists() && log_of(&env, "rio").contains("working")
    });
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(process_alive(pid));
    env.ok(&["stop", "rio", "--reason", "operator"]);
    d.wait_until(secs_f(60), "rio's session recorded", || {
        session(&env, "rio")["status"] == "error"
    });
    let s = session(&env, "rio");
    assert!(
        s["errors"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["code"] == "SESSION_STOPPED"),
        "{s:#}"
    );
    assert!(
        poll_until(secs_f(30), || !process_alive(pid)),
        "the session's process {pid} still runs on the worker\n{}",
        worker.log()
    );
    assert!(
        d.log_text().contains("fencing its lease (revision"),
        "stopped while running, not while waiting for a worker"
    );
}

/// A worker SIGKILLed while its session runs: its lease is no longer
/// renewed, and after the fence time (5 s here through a test hook; 300 s
/// by default) the controller fences it and records the session
/// "interrupted: worker lost"; its message returns to the inbox.
#[test]
fn a_lost_worker_is_fenced_and_its_session_recorded_interrupted() {
    let Some(binary) = nats::server_binary("cluster_executor") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let env = cluster_env(&servers, "30s", "");
    let pid_file = env.tmp("pid");
    env.script(
        "agent.sh",
        &format!(
            "echo $$ > {:?}.tmp && mv {:?}.tmp {:?}\necho working\nwhile true; do sleep 0.1; done",
            pid_file, pid_file, pid_file
        ),
    );
    let mut worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let d = Daemon::start(&env, &[("AGENT_STATE_TEST_CONTROLLER_FENCES", "5s")]);
    let id = env.send("marcus", "rio", &[]);
    env.ok(&["wake", "rio"]);
    d.wait_until(secs_f(60), "rio runs on the worker", || {
        pid_file.exists() && log_of(&env, "rio").contains("working")
    });
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The session's process outlives its worker: killed when the test ends.
    struct Reap(i32);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(self.0),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let _reap = Reap(pid);
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();

    d.wait_until(secs_f(60), "rio's session recorded", || {
        session(&env, "rio")["status"] == "error"
    });
    let s = session(&env, "rio");
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("interrupted: worker lost") && reason.contains("w1"),
        "{s:#}"
    );
    let end = env.session_ends("rio");
    assert_eq!(
        end.last().unwrap()["code"],
        "SESSION_INTERRUPTED",
        "{end:#?}"
    );
    d.wait_until(secs_f(20), "the message back in the inbox", || {
        env.waiting("rio").iter().any(|m| m.contains(&id))
    });

    // The fenced session's order comes back to a worker (as one given back
    // unstarted by a worker that could not read under the lease, then
    // redelivered): the controller stored its end before the agent's next
    // session, so the order is not run a second time, and its lease is not
    // left held by a session nobody follows (which held rio off its workers
    // until the sessions timed out, chaos round 41).
    let order_id = agent_state_cluster::order_id("rio", s["session_id"].as_str().unwrap(), 1);
    std::fs::remove_file(&pid_file).unwrap();
    let w2 = Worker::start(&env, "w2");
    w2.wait_registered();
    // Its copy as the stream holds it.
    publish_copy_of_rios_order(&env, &servers, &order_id, &s["session_id"], &[]);
    w2.wait_log(&format!(
        "session {order_id} already ended on controller; not run again"
    ));
    assert!(
        !pid_file.exists(),
        "the ended order ran again:\n{}",
        w2.log()
    );
    // The agent's next session runs on w2: nothing holds its lease.
    env.ok(&["wake", "rio"]);
    d.wait_until(secs_f(60), "rio's next session runs on w2", || {
        pid_file.exists()
    });
    let next: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _reap_next = Reap(next);
}

/// The same order delivered twice to the worker running it (as when the
/// worker was stopped past the server's ack wait and resumed: chaos round
/// 6 ran a3's session twice on w1, both copies under one lease revision,
/// the second read as the worker's own take). The second delivery is not
/// run: the script ran once, and the session completes.
#[test]
fn an_order_delivered_again_to_the_worker_running_it_is_not_run_twice() {
    let Some(binary) = nats::server_binary("cluster_executor") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let env = cluster_env(&servers, "60s", "");
    env.script(
        "agent.sh",
        &format!(
            r#"dir={:?}
echo "$1 ran" >> "$dir/runs-$1"
while [ ! -e "$dir/go-$1" ]; do sleep 0.05; done
echo "$1 done""#,
            env.dir.path()
        ),
    );
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    let runs = env.tmp("runs-rio");
    d.wait_until(secs_f(60), "rio's session runs on w1", || runs.exists());
    let s = session(&env, "rio");
    let sid = s["session_id"].as_str().unwrap().to_string();
    let order_id = agent_state_cluster::order_id("rio", &sid, 1);
    // A second copy in the stream.
    publish_copy_of_rios_order(&env, &servers, &order_id, &s["session_id"], &["rio"]);
    worker.wait_log(&format!(
        "session {order_id} (rio): delivered again while this worker runs it; not run twice"
    ));
    go(&env, "rio");
    d.wait_until(secs_f(60), "rio's session completed", || {
        session(&env, "rio")["status"] == "completed"
    });
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap(),
        "rio ran\n",
        "the script ran once:\n{}",
        worker.log()
    );
}

/// A lease in this worker's own name, of an order it does not run and has
/// no spool of (its session ended here, its release lost while NATS was
/// away), holds the agent's next order off no longer: the worker gives it
/// back and runs the order. Before: the order went back every 5 s until
/// the lease's TTL or the reconcile, and the session timed out waiting.
#[test]
fn a_lease_this_worker_left_behind_is_given_back_and_the_next_order_runs() {
    let Some(binary) = nats::server_binary("cluster_executor") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let env = cluster_env(&servers, "60s", "echo \"$1 ran\"");
    let (rt, _cluster, _, leases) = test_client(&servers);
    let left = rt
        .block_on(leases.take("rio", "w1", "rio_20200101-000000"))
        .expect("the left-behind lease");
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs_f(45), "rio's session completed", || {
        session(&env, "rio")["status"] == "completed"
    });
    assert!(
        worker.log().contains(
            "the lease run/rio is still held for rio_20200101-000000, which ended on this worker (its release was lost): given back"
        ),
        "{}",
        worker.log()
    );
    assert!(log_of(&env, "rio").contains("rio ran"));
    // Another holder's lease is not this worker's to give back.
    let theirs = rt
        .block_on(leases.take("theseus", "w2", "theseus_20200101-000000"))
        .expect("w2's lease");
    env.ok(&["wake", "theseus"]);
    worker.wait_log("the lease run/theseus is held by w2");
    let now = rt
        .block_on(leases.current("theseus"))
        .unwrap()
        .expect("still held");
    assert_eq!(now.revision, theirs.revision);
    assert!(left.revision > 0);
}
