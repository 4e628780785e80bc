//! A session's hook calls from a worker host (issue 24): the real daemon
//! with `[cluster]` and `local_sessions = false`, a real `agent-state
//! worker` and a real three-server NATS JetStream cluster. The worker runs
//! with a config of its own (its own state root, no agents) and the
//! session's script points `AGENT_STATE_CONFIG` at it: the controller's
//! state root is reached only through the hook forwarding.
//! Gated like `cluster_executor`: `AGENT_STATE_NATS_TESTS=1` (the server
//! from AGENT_STATE_NATS_SERVER or PATH), else SKIPPED.

#[path = "../../crates/cluster/tests/support/mod.rs"]
#[allow(clippy::duplicate_mod)]
mod nats;

use crate::support::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agent_state_cluster::{HookAnswer, HookCall, HookRequest, LeaseTiming, SessionOrder};
use serde_json::Value;

const AGENTS: &str = "[[agent]]\nname = \"rio\"\n[[agent]]\nname = \"theseus\"\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n";

/// The hooks a session calls, each one's exit code and output kept in
/// `DIR/NAME.rc` and `DIR/NAME.out`; it waits for `DIR/go` before its end.
/// With `worker_config`, the script's hooks are pointed at that config
/// (no state root of the controller's).
fn hook_script(dir: &Path, worker_config: Option<&Path>) -> String {
    let config = worker_config
        .map(|c| format!("export AGENT_STATE_CONFIG={c:?}\nunset AGENT_STATE_DIR\n"))
        .unwrap_or_default();
    format!(
        r#"dir={dir:?}
bin={BIN:?}
{config}echo "env: session=$AGENT_STATE_SESSION_ID agent=$AGENT_STATE_AGENT"
hook() {{
  name=$1; shift; t0=$(date +%s%N)
  "$bin" "$@" > "$dir/$name.out" 2>&1; echo $? > "$dir/$name.rc"
  echo $(( ($(date +%s%N) - t0) / 1000000 )) > "$dir/$name.ms"
}}
hook begin session begin "$AGENT_STATE_AGENT" --research-question "does it forward?"
hook record record "$AGENT_STATE_AGENT" --claims-proposed 2 --claims-accepted 1
hook event record "$AGENT_STATE_AGENT" orient_complete n=3
echo "hello from the session" | hook send send --from "$AGENT_STATE_AGENT" --to theseus --subject "from rio's session" --body-file -
while [ ! -e "$dir/go" ]; do sleep 0.05; done
hook end session end "$AGENT_STATE_AGENT" --summary "done where it ran" --tokens-used 1234
echo finished"#
    )
}

fn rc(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.rc")))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn out(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap_or_default()
}

/// rio's session is recorded, its script done, and its run over (the
/// daemon runs nothing: its log is complete).
fn ended(env: &Env, d: &Daemon, hooks: &Path) -> bool {
    session(env, "rio")["status"] == "completed"
        && !rc(hooks, "end").is_empty()
        && d.heartbeat()["running"]
            .as_array()
            .is_some_and(|r| r.is_empty())
}

fn session(env: &Env, agent: &str) -> Value {
    state(env, agent, "session.json")
}

/// The config of `servers` for the controller (its agents run
/// `agent.sh` of the temp dir, empty until the test writes it), and a
/// worker's own config: the same `[cluster]`, its own state root, no
/// agents.
fn cluster_env(servers: &nats::NatsCluster) -> (Env, PathBuf) {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "");
    let script = script.as_path();
    let cluster = format!(
        "[cluster]\nurls = {:?}\nreplicas = 3\nlocal_sessions = false\ndispatch_timeout = \"60s\"\n",
        servers.urls()
    );
    let config = daemon_config(script, &[], &[("wake_on_inbox", "\"never\"")], AGENTS);
    env.set_config(&format!("{config}\n{cluster}"));
    env.ok(&["bootstrap"]);
    let worker_config = env.tmp("worker.toml");
    std::fs::write(
        &worker_config,
        format!(
            "state_root = {:?}\n{cluster}",
            env.tmp("worker-root").display().to_string()
        ),
    )
    .unwrap();
    (env, worker_config)
}

/// `agent-state --config WORKER_CONFIG worker --host HOST`, killed when
/// dropped (its log printed if the test fails).
struct Worker {
    child: Child,
    log: PathBuf,
}

impl Worker {
    fn start(env: &Env, config: &Path, host: &str) -> Worker {
        Worker::start_with(env, config, host, &[])
    }

    /// [`Worker::start`] with these variables in its environment.
    fn start_with(env: &Env, config: &Path, host: &str, vars: &[(&str, &str)]) -> Worker {
        let log = env.tmp(&format!("worker-{host}.log"));
        let file = std::fs::File::create(&log).unwrap();
        // Its own directory: its output spool.
        let dir = env.tmp(&format!("worker-{host}"));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new(BIN)
            .current_dir(&dir)
            .arg("--config")
            .arg(config)
            .args(["worker", "--host", host, "--slots", "2"])
            .args(["--heartbeat", "300ms", "--min-free-disk", "0"])
            .args(["--min-free-memory", "0"])
            .env_remove("AGENT_STATE_SESSION_ID")
            .env_remove("AGENT_STATE_CONFIG")
            .env_remove("AGENT_STATE_HOOKS")
            .env("XDG_RUNTIME_DIR", env.dir.path())
            .envs(vars.iter().copied())
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start agent-state worker");
        let worker = Worker { child, log };
        let ok = poll_until(Duration::from_secs(90), || {
            worker.log().contains("registered")
        });
        assert!(ok, "the worker never registered:\n{}", worker.log());
        worker
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
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

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// What a session's run left in the controller's state root, in words
/// that do not depend on ids or times.
fn results(env: &Env, hooks: &Path) -> Value {
    let s = session(env, "rio");
    let sid = s["session_id"].as_str().unwrap().to_string();
    let journal = env.journal("rio");
    let events: Vec<&str> = journal
        .iter()
        .filter(|e| e["session_id"] == sid.as_str())
        .filter_map(|e| e["event"].as_str())
        .collect();
    let metrics = state(env, "rio", "metrics.json");
    let report = state(env, "rio", "report.json");
    let inbox: Vec<Value> = std::fs::read_dir(env.root.join("theseus/inbox"))
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "json")
                .then(|| serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap())
        })
        .collect();
    let log = std::fs::read_to_string(env.root.join(format!("rio/sessions/{sid}.log")))
        .unwrap_or_default();
    let rcs = ["begin", "record", "event", "send", "end"].map(|n| rc(hooks, n));
    serde_json::json!({
        "status": s["status"],
        "research_question": s["research_question"],
        "summary": report["last_session"]["summary"],
        "outcome": report["last_session"]["outcome"],
        "tokens": s["tokens_used"],
        "session_starts": journal.iter().filter(|e| e["event"] == "session_start").count(),
        "session_ends": env.session_ends("rio").len(),
        "events": events,
        "claims_proposed": metrics["lifetime"]["claims_proposed"],
        "claims_accepted": metrics["lifetime"]["claims_accepted"],
        "messages": inbox.iter().map(|m| serde_json::json!({
            "from": m["from"], "subject": m["subject"], "body": m["body"],
        })).collect::<Vec<_>>(),
        "env_is_the_session": log.contains(&format!("env: session={sid} agent=rio")),
        "rc": rcs,
    })
}

/// A session on a worker whose script cannot see the controller's state
/// root calls `session begin` (joining the daemon's session), `record`
/// (twice), `send theseus` and `session end`: the controller's state root
/// shows what the same script leaves there as a local session.
#[test]
fn a_remote_sessions_hooks_do_what_a_local_sessions_do() {
    let Some(binary) = nats::server_binary("cluster_hooks") else {
        return;
    };
    // The same script, run by a daemon on this host.
    let local = Env::with_config("");
    let local_hooks = local.tmp("hooks");
    std::fs::create_dir(&local_hooks).unwrap();
    let script = local.script("agent.sh", &hook_script(&local_hooks, None));
    local.set_config(&daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\"")],
        AGENTS,
    ));
    local.ok(&["bootstrap"]);
    std::fs::write(local_hooks.join("go"), "").unwrap();
    let expected = {
        let d = local.daemon();
        local.ok(&["wake", "rio"]);
        d.wait_until(Duration::from_secs(60), "the local session ended", || {
            ended(&local, &d, &local_hooks)
        });
        results(&local, &local_hooks)
    };
    assert_eq!(expected["rc"], serde_json::json!(["0", "0", "0", "0", "0"]));
    assert_eq!(expected["messages"].as_array().unwrap().len(), 1);

    let servers = nats::NatsCluster::start(&binary, 3);
    let (env, worker_config) = cluster_env(&servers);
    let hooks_dir = env.tmp("hooks");
    std::fs::create_dir(&hooks_dir).unwrap();
    // The controller's command; its hooks see only the worker's config.
    env.script("agent.sh", &hook_script(&hooks_dir, Some(&worker_config)));
    let worker = Worker::start(&env, &worker_config, "w1");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(
        Duration::from_secs(60),
        "the remote session's send went through",
        || !rc(&hooks_dir, "send").is_empty(),
    );
    // While it runs: joined, not a second session.
    assert_eq!(session(&env, "rio")["status"], "running");
    assert!(
        out(&hooks_dir, "begin").contains(session(&env, "rio")["session_id"].as_str().unwrap()),
        "begin printed the daemon's session id: {}",
        out(&hooks_dir, "begin")
    );
    std::fs::write(hooks_dir.join("go"), "").unwrap();
    d.wait_until(Duration::from_secs(60), "the remote session ended", || {
        ended(&env, &d, &hooks_dir)
    });
    let got = results(&env, &hooks_dir);
    assert_eq!(
        got,
        expected,
        "remote (left) and local (right) differ\nhook outputs: begin {:?} end {:?} send {:?}\nworker log:\n{}",
        out(&hooks_dir, "begin"),
        out(&hooks_dir, "end"),
        out(&hooks_dir, "send"),
        worker.log()
    );
    // The figures (not asserted): each hook's time in ms, locally and
    // forwarded.
    let ms = |dir: &Path| {
        ["begin", "record", "event", "send", "end"]
            .map(|n| std::fs::read_to_string(dir.join(format!("{n}.ms"))).unwrap_or_default())
            .map(|t| t.trim().to_string())
    };
    eprintln!(
        "hook calls in ms (begin, record, event, send, end): local {:?}, from the worker {:?}",
        ms(&local_hooks),
        ms(&hooks_dir)
    );
    assert_eq!(got["env_is_the_session"], true, "{got:#}");
    assert_eq!(got["session_starts"], 1);
    assert_eq!(got["session_ends"], 1);
    assert!(
        out(&hooks_dir, "end").contains("completed"),
        "{}",
        out(&hooks_dir, "end")
    );
    // Nothing was written in the worker's own root.
    assert!(!env.tmp("worker-root").join("rio").exists());
    assert!(
        d.log_text()
            .contains("a hook call from the worker: session end"),
        "{}",
        d.log_text()
    );
}

/// Requests that do not come from the lease's holder at its revision, or
/// are not a session's hooks, are refused, naming why, and change nothing;
/// the same request with the right stamp is run.
#[test]
fn forged_and_stale_hook_requests_are_refused() {
    let Some(binary) = nats::server_binary("cluster_hooks") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let (env, worker_config) = cluster_env(&servers);
    let go = env.tmp("go");
    env.script(
        "agent.sh",
        &format!("echo waiting\nwhile [ ! -e {go:?} ]; do sleep 0.05; done"),
    );
    let _worker = Worker::start(&env, &worker_config, "w1");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    let rt = rt();
    let settings = servers.settings();
    let (cluster, _, leases) =
        rt.block_on(servers.connect(&settings, "forger", LeaseTiming::DEFAULT));
    let sid = {
        let mut sid = String::new();
        d.wait_until(Duration::from_secs(60), "rio runs on w1", || {
            sid = session(&env, "rio")["session_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            rt.block_on(leases.current("rio"))
                .ok()
                .flatten()
                .is_some_and(|l| l.value.session == format!("rio_{sid}"))
        });
        sid
    };
    let before = |agent: &str| env.journal(agent).len();
    let (rio_lines, theseus_lines) = (before("rio"), before("theseus"));
    let client = cluster.client().clone();
    let ask = |call: HookCall, f: &dyn Fn(&mut HookRequest)| -> HookAnswer {
        rt.block_on(async {
            // Read just before: the worker renews every 10 s.
            let lease = leases.current("rio").await.unwrap().unwrap();
            let mut req = HookRequest {
                call,
                agent: "rio".into(),
                session: sid.clone(),
                order: format!("rio_{sid}"),
                holder: "w1".into(),
                lease_revision: lease.revision,
            };
            f(&mut req);
            let reply = client
                .request(
                    format!("{}.hooks.{}", settings.output_stream, req.agent),
                    serde_json::to_vec(&req).unwrap().into(),
                )
                .await
                .expect("the controller answers");
            serde_json::from_slice(&reply.payload).unwrap()
        })
    };
    let call = |command: &str, options: &[(&str, &str)], positionals: &[&str]| HookCall {
        command: command.split(' ').map(String::from).collect(),
        options: options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        positionals: positionals.iter().map(|s| s.to_string()).collect(),
        stdin: None,
    };
    let record = || call("record", &[("claims-proposed", "5")], &["rio"]);
    let refused = |answer: HookAnswer, code: u8, word: &str| match answer {
        HookAnswer::Refused { code: c, reason } => {
            assert_eq!(c, code, "{reason}");
            assert!(reason.contains(word), "{word:?} not in {reason:?}");
        }
        other => panic!("not refused ({word}): {other:?}"),
    };
    // A stale revision, another holder, another order, a non-hook, another
    // agent, a file on the controller.
    refused(
        ask(record(), &|r| r.lease_revision -= 1),
        77,
        "this worker no longer holds it",
    );
    refused(ask(record(), &|r| r.holder = "w2".into()), 77, "held by w1");
    refused(
        ask(record(), &|r| r.order = format!("rio_{sid}-it2")),
        77,
        "not by w1 for",
    );
    refused(ask(call("stop", &[], &["rio"]), &|_| {}), 64, "not a hook");
    refused(
        ask(
            call("record", &[("claims-proposed", "5")], &["theseus"]),
            &|_| {},
        ),
        77,
        "acts only for rio",
    );
    refused(
        ask(
            call(
                "send",
                &[
                    ("from", "rio"),
                    ("to", "theseus"),
                    ("subject", "x"),
                    ("body-file", "/etc/passwd"),
                ],
                &[],
            ),
            &|_| {},
        ),
        64,
        "never a path on the controller",
    );
    refused(
        ask(record(), &|r| r.agent = "theseus".into()),
        77,
        "does not belong",
    );
    assert_eq!(
        env.journal("rio").len(),
        rio_lines,
        "{:#?}",
        env.journal("rio")
    );
    assert_eq!(env.journal("theseus").len(), theseus_lines);
    assert_eq!(
        state(&env, "rio", "metrics.json")["lifetime"]["claims_proposed"],
        0
    );
    // The right stamp: run.
    match ask(record(), &|_| {}) {
        HookAnswer::Ran {
            code: 0, stdout, ..
        } => {
            assert!(stdout.contains("claims proposed 5"), "{stdout}")
        }
        other => panic!("not run: {other:?}"),
    }
    assert_eq!(
        state(&env, "rio", "metrics.json")["lifetime"]["claims_proposed"],
        5
    );
    assert!(
        d.log_text()
            .contains("a hook call from a worker is refused")
    );
    std::fs::write(&go, "").unwrap();
    d.wait_until(Duration::from_secs(60), "rio's session ended", || {
        session(&env, "rio")["status"] == "completed"
    });
}

/// A session whose worker cannot reach a controller (none serves):
/// `begin`, `record` and `send` exit 75 naming what failed; `session end`
/// and `fail` warn and exit 0.
#[test]
fn hooks_without_a_controller_say_so() {
    let Some(binary) = nats::server_binary("cluster_hooks") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let (env, worker_config) = cluster_env(&servers);
    let hooks = env.tmp("hooks");
    std::fs::create_dir(&hooks).unwrap();
    std::fs::write(hooks.join("go"), "").unwrap();
    let script = env.script(
        "agent.sh",
        &format!(
            "{}\nhook fail session fail \"$AGENT_STATE_AGENT\" --outcome error --reason x",
            hook_script(&hooks, Some(&worker_config))
        ),
    );
    let rt = rt();
    let settings = servers.settings();
    let (_cluster, dispatch, _) =
        rt.block_on(servers.connect(&settings, "test", LeaseTiming::DEFAULT));
    let worker = Worker::start(&env, &worker_config, "w1");
    // An order as a controller would publish it, and no controller.
    rt.block_on(dispatch.publish(&SessionOrder {
        session_id: "rio_s1".into(),
        agent: "rio".into(),
        credential_group: "default".into(),
        spec: serde_json::json!({
            "command": script.to_str().unwrap(),
            "args": [],
            "env": { "AGENT_STATE_SESSION_ID": "s1", "AGENT_STATE_AGENT": "rio" },
            "cwd": env.dir.path().to_str().unwrap(),
            "timeout_secs": 120,
        }),
    }))
    .unwrap();
    let ok = poll_until(Duration::from_secs(60), || !rc(&hooks, "fail").is_empty());
    assert!(ok, "the script never finished\n{}", worker.log());
    for name in ["begin", "record", "event", "send"] {
        assert_eq!(rc(&hooks, name), "75", "{name}: {}", out(&hooks, name));
        let text = out(&hooks, name);
        assert!(
            text.contains("could not reach the controller")
                && text.contains("no responders")
                && text.contains("try again"),
            "{name}: {text}"
        );
    }
    for name in ["end", "fail"] {
        assert_eq!(rc(&hooks, name), "0", "{name}: {}", out(&hooks, name));
        let text = out(&hooks, name);
        assert!(
            text.contains("warning:") && text.contains("could not reach the controller"),
            "{name}: {text}"
        );
    }
    // Nothing anywhere: the controller's root untouched, the worker's not made.
    assert!(
        env.journal("rio")
            .iter()
            .all(|e| e["event"] != "session_start")
    );
    assert!(!env.tmp("worker-root").join("rio").exists());
}

/// Without the worker's socket (a worker gone): the same rule, naming the
/// socket. Needs no NATS.
#[test]
fn hooks_whose_worker_socket_is_gone_say_so() {
    let env = Env::with_config(AGENTS);
    env.ok(&["bootstrap"]);
    let socket = env.tmp("gone.sock");
    let run = |args: &[&str]| {
        let out = env
            .command(args)
            .env("AGENT_STATE_HOOKS", &socket)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["session", "begin", "rio"]);
    assert_eq!(code, Some(75), "{err}");
    assert!(
        err.contains("could not reach the controller") && err.contains(socket.to_str().unwrap()),
        "{err}"
    );
    let (code, err) = run(&["send", "--from", "rio", "--to", "theseus", "--subject", "s"]);
    assert_eq!(code, Some(75), "{err}");
    let (code, err) = run(&["session", "end", "rio"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("warning:"), "{err}");
    // Nothing was done here either.
    assert!(session(&env, "rio")["status"] != "running");
    assert!(
        env.journal("rio")
            .iter()
            .all(|e| e["event"] != "session_start")
    );
    assert!(
        std::fs::read_dir(env.root.join("theseus/inbox"))
            .unwrap()
            .all(|e| e.unwrap().path().extension().is_none_or(|x| x != "json"))
    );
}

/// A session's runaway loop of hook calls costs its own session: past its
/// allowance (`AGENT_STATE_TEST_HOOK_RATE=3/10m` here; 60 at once, then one
/// a second by default) each call is refused at once with 75 and when to
/// call again, and nothing of it reaches the controller.
#[test]
fn a_sessions_hook_calls_past_its_allowance_are_refused_with_75() {
    let Some(binary) = nats::server_binary("cluster_hooks") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let (env, worker_config) = cluster_env(&servers);
    let hooks = env.tmp("hooks");
    std::fs::create_dir(&hooks).unwrap();
    let bin = BIN;
    env.script(
        "agent.sh",
        &format!(
            r#"dir={hooks:?}
export AGENT_STATE_CONFIG={worker_config:?}
unset AGENT_STATE_DIR
for n in 1 2 3 4 5; do
  {bin:?} record "$AGENT_STATE_AGENT" --claims-proposed $n > "$dir/r$n.out" 2>&1; echo $? > "$dir/r$n.rc"
done
echo finished"#
        ),
    );
    let d = env.daemon();
    let worker = Worker::start_with(
        &env,
        &worker_config,
        "w1",
        &[("AGENT_STATE_TEST_HOOK_RATE", "3/10m")],
    );
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(90), "rio's session is recorded", || {
        session(&env, "rio")["status"] == "completed" && !rc(&hooks, "r5").is_empty()
    });
    for n in 1..=3 {
        let name = format!("r{n}");
        assert_eq!(rc(&hooks, &name), "0", "{name}: {}", out(&hooks, &name));
    }
    for n in 4..=5 {
        let name = format!("r{n}");
        assert_eq!(rc(&hooks, &name), "75", "{name}: {}", out(&hooks, &name));
        let text = out(&hooks, &name);
        assert!(
            text.contains("too many hook calls from this session")
                && text.contains("3 at once, then one every 10m")
                && text.contains("call again in"),
            "{name}: {text}"
        );
    }
    // The three allowed calls reached the controller (1 + 2 + 3 claims);
    // the refused ones did not.
    d.wait_until(
        Duration::from_secs(10),
        "metrics.json counts the claims",
        || state(&env, "rio", "metrics.json")["lifetime"]["claims_proposed"] == 6,
    );
    assert!(
        worker
            .log()
            .contains("a hook call refused: too many hook calls"),
        "{}",
        worker.log()
    );
}
