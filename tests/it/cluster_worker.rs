//! `agent-state worker`, `workers` and `worker drain` through the real
//! binary against a real three-server NATS JetStream cluster (issue 24).
//! Gated like the cluster crate's tests: `AGENT_STATE_NATS_TESTS=1` (the
//! server from AGENT_STATE_NATS_SERVER or PATH), else SKIPPED.
//!
//! The test plays the controller with the cluster crate: it publishes
//! session orders and reads the output stream and the leases; the worker is
//! the real binary, its sessions real shell scripts.

#[path = "../../crates/cluster/tests/support/mod.rs"]
mod nats;

use crate::support::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agent_state_cluster::{
    Cluster, Dispatch, LeaseTiming, Leases, Outcome, Output, SessionEnd, SessionOrder,
};
use serde_json::Value;

/// The worker process, SIGKILLed if the test ends without stopping it
/// (shared by the cluster modules; its log printed if the test fails).
pub(crate) struct Worker {
    pub(crate) child: Child,
    log: std::path::PathBuf,
}

impl Worker {
    pub(crate) fn start(env: &Env, host: &str) -> Worker {
        Worker::start_with(env, host, &[])
    }

    /// [`Worker::start`] with `extra` arguments.
    pub(crate) fn start_with(env: &Env, host: &str, extra: &[&str]) -> Worker {
        Worker::start_adjusted(env, host, extra, |_| {})
    }

    /// [`Worker::start_with`], `adjust`ing the command before it runs. Its
    /// directory (its spool) is `worker-HOST` in the test's directory.
    pub(crate) fn start_adjusted(
        env: &Env,
        host: &str,
        extra: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> Worker {
        Worker::start_configured(env, &env.config, host, extra, adjust)
    }

    /// [`Worker::start_adjusted`] with its own `config` (e.g. NATS behind
    /// a proxy).
    pub(crate) fn start_configured(
        env: &Env,
        config: &std::path::Path,
        host: &str,
        extra: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> Worker {
        let log = env.tmp(&format!("worker-{host}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let dir = env.tmp(&format!("worker-{host}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut command = Command::new(BIN);
        command.current_dir(&dir);
        adjust(&mut command);
        let child = command
            .args(["--config", config.to_str().unwrap()])
            .args(["worker", "--host", host, "--slots", "2"])
            .args(["--heartbeat", "300ms"])
            .args(extra)
            .env_remove("AGENT_STATE_SESSION_ID")
            // Its hook sockets' directory in the test's, not /tmp.
            .env("XDG_RUNTIME_DIR", &dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start agent-state worker");
        Worker { child, log }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until its log says `what`.
    pub(crate) fn wait_log(&self, what: &str) {
        let ok = poll_until(Duration::from_secs(60), || self.log().contains(what));
        assert!(ok, "the worker never logged {what:?}; log:\n{}", self.log());
    }

    /// Waits until it registered (the cluster's streams and buckets exist
    /// and answer by then).
    pub(crate) fn wait_registered(&self) {
        let ok = poll_until(Duration::from_secs(90), || {
            self.log().contains("registered")
        });
        assert!(ok, "the worker never registered:\n{}", self.log());
    }
}

/// A config for worker `host` like `env`'s, reaching the NATS of
/// `servers` only through the proxy on `proxy_port` (which a test can
/// cut): its path.
pub(crate) fn config_through_proxy(
    env: &Env,
    servers: &crate::cluster_executor::nats::NatsCluster,
    proxy_port: u16,
    host: &str,
) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&env.config).unwrap();
    let path = env.tmp(&format!("worker-{host}.toml"));
    std::fs::write(
        &path,
        text.replace(
            &format!("urls = {:?}", servers.urls()),
            &format!("urls = [\"nats://127.0.0.1:{proxy_port}\"]"),
        ),
    )
    .unwrap();
    path
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- worker log ----\n{}---- end ----", self.log());
        }
    }
}

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A three-server cluster and the controller's side of it as a test plays
/// it without a daemon: orders published, ends, leases and the queue read.
pub(crate) struct Bare {
    pub(crate) servers: nats::NatsCluster,
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) cluster: Cluster,
    pub(crate) dispatch: Dispatch,
    pub(crate) leases: Leases,
    pub(crate) output: Output,
}

impl Bare {
    /// `None` where the NATS tests are not enabled (said SKIPPED by the
    /// cluster crate's helper, under `test`'s name).
    pub(crate) fn start(test: &str) -> Option<Bare> {
        let binary = nats::server_binary(test)?;
        let servers = nats::NatsCluster::start(&binary, 3);
        let rt = rt();
        let settings = servers.settings();
        let (cluster, dispatch, leases) =
            rt.block_on(servers.connect(&settings, "controller", LeaseTiming::DEFAULT));
        let output = rt.block_on(cluster.output()).unwrap();
        Some(Bare {
            servers,
            rt,
            cluster,
            dispatch,
            leases,
            output,
        })
    }

    /// A test environment whose config's `[cluster]` names these servers.
    pub(crate) fn env(&self) -> Env {
        Env::with_config(&format!(
            "[cluster]\nurls = {:?}\nreplicas = 3\n",
            self.servers.urls()
        ))
    }
}

/// `workers --json`, the entry of `host` if listed.
fn listed(env: &Env, host: &str) -> Option<Value> {
    let out = env.ok(&["workers", "--json"]);
    entry_of(&out, host)
}

pub(crate) fn entry_of(out: &str, host: &str) -> Option<Value> {
    let all: Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    all.as_array()
        .expect("an array")
        .iter()
        .find(|w| w["host"] == host)
        .cloned()
}

/// Like [`listed`], but NATS not answering within the command's 10 s (exit
/// 69: a two-core machine under load, a cluster busy creating the workers'
/// streams) is "not yet", said on stderr, not a failure.
pub(crate) fn listed_or_busy(env: &Env, host: &str) -> Option<Value> {
    let out = env.run(&["workers", "--json"]);
    match out.status.code() {
        Some(0) => entry_of(&String::from_utf8_lossy(&out.stdout), host),
        Some(69) => {
            eprintln!(
                "`workers` (retried): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        other => panic!(
            "agent-state workers --json exited {other:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

pub(crate) fn wait_listed(
    env: &Env,
    worker: &Worker,
    what: &str,
    cond: impl FnMut(&Value) -> bool,
) -> Value {
    wait_host(env, "w1", worker, what, cond)
}

fn wait_host(
    env: &Env,
    host: &str,
    worker: &Worker,
    what: &str,
    mut cond: impl FnMut(&Value) -> bool,
) -> Value {
    let mut last = None;
    let ok = poll_until(Duration::from_secs(60), || {
        last = listed_or_busy(env, host);
        last.as_ref().is_some_and(&mut cond)
    });
    assert!(
        ok,
        "`workers` never showed {what}; last {last:?}\nworker log:\n{}",
        worker.log()
    );
    last.unwrap()
}

fn order(id: &str, agent: &str, script: &Path, cwd: &Path) -> SessionOrder {
    SessionOrder {
        session_id: id.into(),
        agent: agent.into(),
        credential_group: "default".into(),
        spec: serde_json::json!({
            "command": script.to_str().unwrap(),
            "args": ["one arg"],
            "env": { "GREETING": "hello" },
            "cwd": cwd.to_str().unwrap(),
            "timeout_secs": 120,
            "kill_grace_secs": 2,
        }),
    }
}

/// Waits (bounded) for the end of `id` in the output stream.
pub(crate) fn wait_end(
    rt: &tokio::runtime::Runtime,
    output: &Output,
    id: &str,
    worker: &Worker,
) -> SessionEnd {
    let mut end = None;
    let ok = poll_until(Duration::from_secs(60), || {
        end = rt.block_on(output.ended(id)).unwrap();
        end.is_some()
    });
    assert!(ok, "no end of {id}\nworker log:\n{}", worker.log());
    end.unwrap()
}

pub(crate) fn lease_holder(
    rt: &tokio::runtime::Runtime,
    leases: &Leases,
    agent: &str,
) -> Option<String> {
    rt.block_on(leases.current(agent))
        .unwrap()
        .map(|r| format!("{} {}", r.value.holder, r.value.session))
}

pub(crate) fn queued(rt: &tokio::runtime::Runtime, cluster: &Cluster, dispatch: &Dispatch) -> u64 {
    rt.block_on(async {
        let mut stream = cluster
            .jetstream()
            .get_stream(dispatch.stream_name())
            .await
            .unwrap();
        stream.info().await.unwrap().state.messages
    })
}

#[test]
fn a_worker_runs_an_order_streams_it_releases_the_lease_and_drains() {
    let Some(bare) = Bare::start("cluster_worker") else {
        return;
    };
    let Bare {
        rt,
        cluster,
        dispatch,
        leases,
        output,
        ..
    } = &bare;

    let env = bare.env();
    // No worker yet: `workers` says so.
    assert!(env.ok(&["workers"]).contains("no workers"));
    assert!(
        env.fails(&["worker", "drain", "w1"], 66)
            .contains("no worker \"w1\"")
    );

    let work = env.tmp("work");
    std::fs::create_dir(&work).unwrap();
    let script = env.script(
        "session.sh",
        r#"echo "$AGENT_STATE_SESSION_ID $AGENT_STATE_AGENT $GREETING [$1] in $(pwd)"
echo "a warning" >&2
while [ ! -e "$(dirname "$0")/go-$AGENT_STATE_SESSION_ID" ]; do sleep 0.05; done
echo done
exit 3"#,
    );
    let go = |id: &str| std::fs::write(env.tmp(&format!("go-{id}")), "").unwrap();

    let mut worker = Worker::start(&env, "w1");
    let w = wait_listed(&env, &worker, "w1 alive", |w| w["state"] == "alive");
    assert_eq!(
        (w["slots"].as_u64(), w["slots_used"].as_u64()),
        (Some(2), Some(0))
    );
    assert_eq!(w["credentials"][0]["group"], "default");
    let table = env.ok(&["workers"]);
    assert!(
        table.contains("HOST")
            && table
                .lines()
                .any(|l| l.starts_with("w1 ") && l.contains("0/2") && l.ends_with("alive")),
        "{table}"
    );

    // One order: the worker runs it under the lease, and lists it.
    rt.block_on(dispatch.publish(&order("s-1", "rio", &script, &work)))
        .unwrap();
    let w = wait_listed(&env, &worker, "the session running", |w| {
        w["slots_used"] == 1
    });
    assert_eq!(w["sessions"][0]["agent"], "rio");
    assert_eq!(w["sessions"][0]["session_id"], "s-1");
    assert_eq!(lease_holder(rt, leases, "rio").as_deref(), Some("w1 s-1"));
    assert_eq!(
        queued(rt, cluster, dispatch),
        0,
        "the order was acked once it ran"
    );
    let table = env.ok(&["workers"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("w1 ") && l.contains("1/2") && l.contains("rio")),
        "{table}"
    );

    go("s-1");
    let end = wait_end(rt, output, "s-1", &worker);
    assert_eq!(
        end.outcome,
        Outcome::Exited {
            code: Some(3),
            signal: None
        }
    );
    assert_eq!((end.host.as_str(), end.agent.as_str()), ("w1", "rio"));
    assert!(end.lease_revision > 0 && end.ended_ms >= end.started_ms);
    let (chunks, _) = rt.block_on(output.replay("s-1")).unwrap();
    assert_eq!(chunks.last().map(|c| c.number), Some(end.last_chunk));
    let numbers: Vec<u64> = chunks.iter().map(|c| c.number).collect();
    assert_eq!(numbers, (1..=end.last_chunk).collect::<Vec<_>>());
    let text = |pipe: &str| -> String {
        chunks
            .iter()
            .filter(|c| c.pipe == pipe)
            .map(|c| String::from_utf8_lossy(&c.data).into_owned())
            .collect()
    };
    assert_eq!(
        text("stdout"),
        format!("s-1 rio hello [one arg] in {}\ndone\n", work.display())
    );
    assert_eq!(text("stderr"), "a warning\n");
    // The lease is released after the end is stored.
    assert!(
        poll_until(Duration::from_secs(10), || lease_holder(rt, leases, "rio")
            .is_none()),
        "the lease is still held: {:?}",
        lease_holder(rt, leases, "rio")
    );
    wait_listed(&env, &worker, "the slot free again", |w| {
        w["slots_used"] == 0
    });

    // A bad spec ends as not started, with the reason.
    let mut bad = order("s-bad", "clay", &script, &work);
    bad.spec = serde_json::json!({ "command": "/nonexistent/session.sh" });
    rt.block_on(dispatch.publish(&bad)).unwrap();
    let end = wait_end(rt, output, "s-bad", &worker);
    match &end.outcome {
        Outcome::NotStarted { detail } => {
            assert!(
                detail.contains("cannot start /nonexistent/session.sh"),
                "{detail}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(poll_until(Duration::from_secs(10), || lease_holder(
        rt, leases, "clay"
    )
    .is_none()));

    // Drain: the worker says so, then takes no new order.
    let said = env.ok(&["worker", "drain", "w1"]);
    assert!(said.contains("w1: drain requested"), "{said}");
    let w = wait_listed(&env, &worker, "w1 drained", |w| w["state"] == "drained");
    assert_eq!(w["drain_requested"], true);
    rt.block_on(dispatch.publish(&order("s-2", "rio", &script, &work)))
        .unwrap();
    go("s-2");
    // Three more heartbeat seconds later (about ten heartbeats, each a turn
    // of the worker's loop while drained), the order is still queued and
    // nothing of it ran.
    let beat = |w: &Value| w["heartbeat_at"].as_str().unwrap_or("").to_string();
    let mut seen = vec![beat(&w)];
    wait_listed(&env, &worker, "three more heartbeat seconds", |w| {
        let b = beat(w);
        if !seen.contains(&b) {
            seen.push(b);
        }
        seen.len() >= 4
    });
    assert_eq!(
        queued(rt, cluster, dispatch),
        1,
        "the order waits in the queue"
    );
    assert!(rt.block_on(output.ended("s-2")).unwrap().is_none());
    assert!(lease_holder(rt, leases, "rio").is_none());
    assert!(
        env.ok(&["workers"])
            .lines()
            .any(|l| l.starts_with("w1 ") && l.ends_with("drained"))
    );

    // Resumed, it takes it.
    assert!(
        env.ok(&["worker", "resume", "w1"])
            .contains("drain withdrawn")
    );
    let end = wait_end(rt, output, "s-2", &worker);
    assert_eq!(
        end.outcome,
        Outcome::Exited {
            code: Some(3),
            signal: None
        }
    );

    // The controller fences the lease of a running session: at its next
    // renewal (10 s after the take) the worker finds it stale, kills the
    // session and reports it lost, carrying no revision.
    rt.block_on(dispatch.publish(&order("s-f", "fen", &script, &work)))
        .unwrap();
    wait_listed(&env, &worker, "s-f running", |w| w["slots_used"] == 1);
    let held = rt.block_on(leases.current("fen")).unwrap().expect("held");
    rt.block_on(leases.fence("fen", held.revision)).unwrap();
    let end = wait_end(rt, output, "s-f", &worker);
    match &end.outcome {
        Outcome::LeaseLost { detail } => {
            assert!(
                detail.contains("run/fen no longer has revision"),
                "{detail}"
            )
        }
        other => panic!("s-f: {other:?}\n{}", worker.log()),
    }
    assert_eq!(end.lease_revision, 0);
    wait_listed(&env, &worker, "s-f gone", |w| w["slots_used"] == 0);

    // SIGTERM: it ends its running session, releases the lease, says it
    // stopped, and exits 0.
    rt.block_on(dispatch.publish(&order("s-3", "sky", &script, &work)))
        .unwrap();
    wait_listed(&env, &worker, "s-3 running", |w| w["slots_used"] == 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut status = None;
    assert!(
        poll_until(Duration::from_secs(30), || {
            status = worker.child.try_wait().unwrap();
            status.is_some()
        }),
        "the worker did not exit after SIGTERM:\n{}",
        worker.log()
    );
    assert_eq!(status.unwrap().code(), Some(0), "{}", worker.log());
    let end = wait_end(rt, output, "s-3", &worker);
    assert_eq!(end.outcome, Outcome::WorkerStopped);
    assert!(lease_holder(rt, leases, "sky").is_none());
    let w = listed(&env, "w1").expect("w1 listed");
    assert_eq!(w["state"], "stopped", "{w}");
    assert_eq!(w["slots_used"], 0, "{w}");
}

/// Two workers, two orders of one agent at once: the second runs only
/// after the first has ended (the lease, not the queue, keeps them apart);
/// the scripts themselves check that they never overlap.
#[test]
fn two_workers_never_run_one_agent_twice_at_once() {
    let Some(bare) = Bare::start("cluster_worker_lease") else {
        return;
    };
    let Bare {
        rt,
        cluster: _cluster,
        dispatch,
        leases,
        ..
    } = &bare;
    let env = bare.env();
    let output = rt.block_on(_cluster.output()).unwrap();
    let work = env.tmp("work");
    std::fs::create_dir(&work).unwrap();
    // `mkdir` is atomic: a second copy of the agent finds the directory.
    let script = env.script(
        "session.sh",
        r#"dir="$(dirname "$0")"
mkdir "$dir/running-$AGENT_STATE_AGENT" || { echo OVERLAP; exit 99; }
echo "$AGENT_STATE_WORKER" > "$dir/started-$AGENT_STATE_SESSION_ID"
while [ ! -e "$dir/go-$AGENT_STATE_SESSION_ID" ]; do sleep 0.05; done
rmdir "$dir/running-$AGENT_STATE_AGENT"
exit 0"#,
    );
    let w1 = Worker::start(&env, "w1");
    let w2 = Worker::start(&env, "w2");
    wait_host(&env, "w1", &w1, "w1 alive", |w| w["state"] == "alive");
    wait_host(&env, "w2", &w2, "w2 alive", |w| w["state"] == "alive");
    let logs = || format!("w1:\n{}\nw2:\n{}", w1.log(), w2.log());

    rt.block_on(dispatch.publish(&order("s-a", "rio", &script, &work)))
        .unwrap();
    rt.block_on(dispatch.publish(&order("s-b", "rio", &script, &work)))
        .unwrap();
    let started = |id: &str| std::fs::read_to_string(env.tmp(&format!("started-{id}"))).ok();
    let mut first = None;
    assert!(
        poll_until(Duration::from_secs(60), || {
            first = ["s-a", "s-b"].into_iter().find(|id| started(id).is_some());
            first.is_some()
        }),
        "neither session started\n{}",
        logs()
    );
    let first = first.unwrap();
    let second = if first == "s-a" { "s-b" } else { "s-a" };
    // The other order is pulled and given back while the lease is held:
    // the workers log it (at least once), and it has not started.
    assert!(
        poll_until(Duration::from_secs(60), || logs()
            .contains("the lease run/rio is held by")),
        "no worker was refused the lease\n{}",
        logs()
    );
    assert!(
        started(second).is_none(),
        "{second} started beside {first}\n{}",
        logs()
    );
    assert_eq!(
        lease_holder(rt, leases, "rio").map(|h| h.ends_with(first)),
        Some(true)
    );

    std::fs::write(env.tmp(&format!("go-{first}")), "").unwrap();
    let end = wait_end(rt, &output, first, &w1);
    assert_eq!(
        end.outcome,
        Outcome::Exited {
            code: Some(0),
            signal: None
        },
        "{}",
        logs()
    );
    // Given back for 5 s, the second order runs once the lease is free.
    assert!(
        poll_until(Duration::from_secs(60), || started(second).is_some()),
        "{second} never started\n{}",
        logs()
    );
    std::fs::write(env.tmp(&format!("go-{second}")), "").unwrap();
    let end = wait_end(rt, &output, second, &w1);
    assert_eq!(
        end.outcome,
        Outcome::Exited {
            code: Some(0),
            signal: None
        },
        "{}",
        logs()
    );
    assert!(poll_until(Duration::from_secs(10), || lease_holder(
        rt, leases, "rio"
    )
    .is_none()));
}

/// Without `[cluster]` each command says what to add (exit 78); a bad
/// worker option is refused by name (64) before anything is contacted.
/// No server needed.
#[test]
fn the_worker_commands_need_the_cluster_section_and_good_options() {
    let env = Env::with_config("");
    for (args, command) in [
        (&["workers"][..], "workers"),
        (&["workers", "--json"], "workers"),
        (&["worker"], "worker"),
        (&["worker", "drain", "w1"], "worker drain"),
        (&["worker", "resume", "w1"], "worker resume"),
    ] {
        let err = env.fails(args, 78);
        assert!(
            err.contains("[cluster]: is missing")
                && err.contains(&format!("`agent-state {command}` needs it"))
                && err.contains("urls = [\"nats://"),
            "{args:?}: {err}"
        );
    }
    // A port nothing listens on: the options are refused before connecting.
    let env = Env::with_config("[cluster]\nurls = [\"nats://127.0.0.1:9\"]\nreplicas = 1\n");
    for (args, want) in [
        (
            &["worker", "--host", "a b"][..],
            "name the worker with --host NAME",
        ),
        (
            &["worker", "--host", "w1", "--slots", "0"],
            "--slots 0 would run nothing",
        ),
        (
            &["worker", "--host", "w1", "--credential-group", "a.b"],
            "--credential-group \"a.b\"",
        ),
        (
            &["worker", "--host", "w1", "--heartbeat", "10ms"],
            "shorter than 100ms",
        ),
        (&["worker", "drain", "a/b"], "cannot be a worker key"),
    ] {
        let err = env.fails(args, 64);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // No server there: the operator's commands say so within their 10 s.
    let err = env.fails(&["workers"], 69);
    assert!(err.contains("check cluster.urls"), "{err}");
}

/// `systemd/agent-state-worker.service`: `systemd-analyze verify` has
/// nothing to say (with the binary under test in ExecStart=), and its
/// exposure is as low as the daemon's unit's (2.5 or lower).
#[test]
fn the_worker_unit_verifies_clean_and_its_exposure_is_low() {
    let Some(analyze) = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("systemd-analyze"))
            .find(|p| p.is_file())
    }) else {
        eprintln!(
            "SKIPPED: this test needs systemd-analyze on PATH (Debian: apt-get install systemd)"
        );
        return;
    };
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/agent-state-worker.service");
    let source = std::fs::read_to_string(&unit).expect("read the unit");
    assert!(
        source.contains(
            "ExecStart=/usr/bin/agent-state --config /etc/agent-state/config.toml worker\n"
        )
    );
    assert!(source.contains("Type=notify\n"));
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("agent-state-worker.service");
    std::fs::write(
        &copy,
        source.replace("=/usr/bin/agent-state ", &format!("={BIN} ")),
    )
    .unwrap();
    let out = Command::new(&analyze)
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&analyze)
        .args(["security", "--offline=yes"])
        .arg(&unit)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let score: f64 = report
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .and_then(|l| l.rsplit_once(':'))
        .and_then(|(_, s)| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no exposure in {report}"));
    assert!(score <= 2.5, "exposure {score}:\n{report}");
}

/// A session whose end cannot be stored when its worker stops (the output
/// stream gone while the lease bucket answers) keeps its lease: the
/// worker's next start stores the spooled output and the end under it.
/// Before: the stopping worker gave the lease back, and its next start
/// kept the spool for good ("the lease is gone"), the end never stored.
#[test]
fn a_worker_stopping_before_its_end_is_stored_keeps_the_lease_for_its_next_start() {
    let Some(bare) = Bare::start("cluster_worker") else {
        return;
    };
    let Bare {
        rt,
        cluster,
        dispatch,
        leases,
        ..
    } = &bare;
    let env = bare.env();
    let work = env.tmp("work");
    std::fs::create_dir(&work).unwrap();
    let script = env.script(
        "session.sh",
        r#"echo "first line"
while [ ! -e "$(dirname "$0")/go" ]; do sleep 0.05; done
echo "last line""#,
    );
    let first = Worker::start(&env, "w1");
    first.wait_registered();
    rt.block_on(dispatch.publish(&order("s-1", "rio", &script, &work)))
        .unwrap();
    first.wait_log("session s-1 of rio started");
    // The output stream goes; the session ends; its end cannot be stored.
    rt.block_on(
        cluster
            .jetstream()
            .delete_stream(&cluster.settings().output_stream),
    )
    .unwrap();
    std::fs::write(env.tmp("go"), "").unwrap();
    first.wait_log("session s-1: its process group is gone");
    first.wait_log("the server did not store chunk");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut first = first;
    let status = first.child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", first.log());
    assert!(
        first.log().contains("its lease is kept for that"),
        "{}",
        first.log()
    );
    assert_eq!(
        lease_holder(rt, leases, "rio").as_deref(),
        Some("w1 s-1"),
        "the lease stays with the unstored end\n{}",
        first.log()
    );

    // The next start (the stream made again) stores them under the lease.
    let second = Worker::start(&env, "w1");
    second.wait_log("storing its spooled output and its end under its lease");
    let output = rt.block_on(cluster.output()).unwrap();
    let end = wait_end(rt, &output, "s-1", &second);
    assert_eq!(
        end.outcome,
        Outcome::Exited {
            code: Some(0),
            signal: None
        },
        "{}",
        second.log()
    );
    assert!(poll_until(Duration::from_secs(30), || lease_holder(
        rt, leases, "rio"
    )
    .is_none()));
}

/// Two workers must never share a host name: the lease names the host, so
/// each would take the other's leases for its own. A second worker started
/// as `--host w1` while w1 beats refuses to start (exit 64, which the unit
/// does not restart), naming the fix, and w1 goes on; w1 killed and
/// started again under its name starts (its earlier self's record is not
/// written again while it watches).
#[test]
fn a_second_worker_of_a_live_host_name_refuses_to_start() {
    let Some(binary) = nats::server_binary("cluster_worker") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let env = Env::with_config(&format!(
        "[cluster]\nurls = {:?}\nreplicas = 3\n",
        servers.urls()
    ));
    let mut first = Worker::start(&env, "w1");
    first.wait_registered();

    let dir = env.tmp("second");
    std::fs::create_dir(&dir).unwrap();
    let mut second = Command::new(BIN)
        .current_dir(&dir)
        .args(["--config", env.config.to_str().unwrap()])
        .args([
            "worker",
            "--host",
            "w1",
            "--slots",
            "1",
            "--heartbeat",
            "300ms",
        ])
        .env_remove("AGENT_STATE_SESSION_ID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = None;
    let exited = poll_until(Duration::from_secs(60), || {
        status = second.try_wait().unwrap();
        status.is_some()
    });
    if !exited {
        let _ = second.kill();
    }
    let out = second.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(exited, "the second w1 kept running:\n{stderr}");
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("another worker runs as --host w1")
            && stderr.contains("give every worker a host name of its own"),
        "{stderr}"
    );
    assert!(first.child.try_wait().unwrap().is_none(), "{}", first.log());
    assert!(
        !first.log().contains("watching it"),
        "the first start found no record to watch:\n{}",
        first.log()
    );

    // Killed, then started again under its own name: it starts.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let again = Worker::start(&env, "w1");
    again.wait_log("in case another worker runs under this name");
    again.wait_registered();
    assert!(again.child.id() > 0);
}
