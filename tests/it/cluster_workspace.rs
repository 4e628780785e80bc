//! Workspaces on workers (issue 24): the real daemon with `[cluster]` and
//! `local_sessions = false` runs a session of an agent with
//! `[agent.session.workspace]` on a real `agent-state worker`, which makes
//! the git worktree of a real repository, runs the session in it and
//! judges it; session.json's `workspace` is what a local run records. A
//! worker without the repository ends the order WORKSPACE_NOT_A_REPO; a
//! hand-published order with a hostile worktree path is refused naming
//! the field. Gated like `cluster_executor`: `AGENT_STATE_NATS_TESTS=1`.
//!
//! The worker runs on this machine with the controller's config (the same
//! state root and repository paths), as a worker host with the same config
//! file and a clone of the repository at the same path would.

use crate::cluster_executor::nats;
use crate::cluster_worker::Worker;
use crate::support::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The fake agent: records where it ran (cwd, branch, the worker, the
/// files it saw), waits while a file `hold-AGENT` is there, commits a file
/// of its own, prints a line.
fn agent(env: &Env) -> PathBuf {
    let d = env.dir.path().display().to_string();
    env.script(
        "agent.sh",
        &format!(
            r#"D={d:?}
A="$AGENT_STATE_AGENT"
{{ echo "cwd=$(pwd -P)"; echo "ws=$AGENT_STATE_WORKSPACE"; echo "worker=$AGENT_STATE_WORKER";
   echo "branch=$(git branch --show-current)"; ls -A | grep -v '^.git$' | sed 's/^/file=/'; }} > "$D/.seen-$A"
mv "$D/.seen-$A" "$D/seen-$A-$AGENT_STATE_SESSION_ID"
while [ -e "$D/hold-$A" ]; do sleep 0.05; done
echo "mine: $A" > "own-$A.txt"
git add "own-$A.txt" && git -c user.name=a -c user.email=a@x commit -q -m "$A's work"
echo "$A: done"
"#
        ),
    )
}

/// An env whose agent rio has a workspace of `repo` (`None`: a repository
/// made here); on the workers of `servers` when given, else locally;
/// `extra`: more `[defaults]`.
fn setup(
    servers: Option<&nats::NatsCluster>,
    repo: Option<&Path>,
    extra: &[(&str, &str)],
) -> (Env, PathBuf) {
    setup_with(servers, repo, "", extra)
}

/// [`setup`] with more keys of the workspace (`ws_extra`, `, key = value`…).
fn setup_with(
    servers: Option<&nats::NatsCluster>,
    repo: Option<&Path>,
    ws_extra: &str,
    extra: &[(&str, &str)],
) -> (Env, PathBuf) {
    let env = Env::with_config("");
    let repo = repo
        .map(Path::to_path_buf)
        .unwrap_or_else(|| git_repo(&env));
    let script = agent(&env);
    let workspace = format!(
        "{{ repo = {:?}, base = \"main\"{ws_extra} }}",
        repo.display().to_string()
    );
    let mut defaults = vec![("wake_on_inbox", "\"never\""), ("workspace", &workspace)];
    defaults.extend_from_slice(extra);
    let body = daemon_config(
        &script,
        &[],
        &defaults,
        "[[agent]]\nname = \"rio\"\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    );
    let cluster = servers.map(cluster_of).unwrap_or_default();
    env.set_config(&format!("{body}\n{cluster}"));
    env.ok(&["bootstrap"]);
    (env, repo)
}

/// The `[cluster]` of a controller whose sessions all go to the workers
/// of `servers` (one replica, a minute to dispatch).
fn cluster_of(servers: &nats::NatsCluster) -> String {
    format!(
        "[cluster]\nurls = {:?}\nreplicas = 1\nlocal_sessions = false\ndispatch_timeout = \"60s\"\n",
        servers.urls()
    )
}

fn session(env: &Env) -> Value {
    read_json(&env.path("rio", "session.json"))
}

fn seen(env: &Env, sid: &str) -> Vec<String> {
    std::fs::read_to_string(env.tmp(&format!("seen-rio-{sid}")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Runs one session of rio to its recorded workspace; its session.json.
fn run_one(env: &Env, d: &Daemon) -> Value {
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(90), "rio's workspace recorded", || {
        let p = env.path("rio", "session.json");
        p.exists() && read_json(&p)["workspace"].is_object()
    });
    session(env)
}

/// What a run's `workspace` must be: the worktree under the agent's
/// directory on the planned branch, one commit (the agent's) on the base.
fn check_workspace(env: &Env, repo: &Path, s: &Value) {
    let sid = s["session_id"].as_str().unwrap();
    let ws = &s["workspace"];
    let branch = ws["branch"].as_str().unwrap();
    assert!(branch.starts_with("rio/"), "{ws:#}");
    assert_eq!(
        ws["path"],
        env.path("rio", &format!("workspaces/{sid}"))
            .display()
            .to_string()
    );
    assert_eq!(ws["state"], "kept", "{ws:#}");
    assert_eq!(ws["dirty"], false);
    assert_eq!(ws["commits_ahead"], 1);
    assert_eq!(ws["base_commit"], git(repo, &["rev-parse", "main"]));
    // Its commit is in the repository, on its branch.
    assert_eq!(ws["head_commit"], git(repo, &["rev-parse", branch]));
    assert_eq!(
        git(repo, &["log", "-1", "--format=%s", branch]),
        "rio's work"
    );
    // The session ran in the fresh worktree, on that branch, seeing the
    // base and nothing else.
    let seen = seen(env, sid);
    let real = env
        .path("rio", &format!("workspaces/{sid}"))
        .canonicalize()
        .unwrap();
    assert!(
        seen.contains(&format!("cwd={}", real.display())),
        "{seen:?}"
    );
    assert!(seen.contains(&format!("branch={branch}")), "{seen:?}");
    let files: Vec<&String> = seen.iter().filter(|l| l.starts_with("file=")).collect();
    assert_eq!(files, ["file=README"], "{seen:?}");
}

/// Whether an agent's command ran: it leaves a `seen-*` file in the
/// temp dir.
fn command_ran(env: &Env) -> bool {
    std::fs::read_dir(env.dir.path()).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("seen-")
    })
}

#[test]
fn a_remote_session_runs_in_a_worktree_its_worker_makes_and_is_recorded_as_a_local_one() {
    let Some(binary) = nats::server_binary("cluster_workspace") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 1);
    let (env, repo) = setup(Some(&servers), None, &[]);
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let d = env.daemon();
    let remote = run_one(&env, &d);
    assert_eq!(remote["status"], "completed", "{remote:#}");
    let sid = remote["session_id"].as_str().unwrap();
    assert!(
        seen(&env, sid).contains(&"worker=w1".to_string()),
        "it ran on the worker: {:?}",
        seen(&env, sid)
    );
    worker.wait_log(&format!(
        "worktree {} on branch",
        env.path("rio", &format!("workspaces/{sid}")).display()
    ));
    check_workspace(&env, &repo, &remote);
    drop(d);

    // The same session on one host: the same record, field by field.
    let (local_env, local_repo) = setup(None, None, &[]);
    let d = local_env.daemon();
    let local = run_one(&local_env, &d);
    assert_eq!(local["status"], "completed", "{local:#}");
    check_workspace(&local_env, &local_repo, &local);
    let (r, l) = (&remote["workspace"], &local["workspace"]);
    assert_eq!(keys(r), keys(l), "{r:#}\n{l:#}");
    for k in ["branch", "state", "dirty", "commits_ahead"] {
        assert_eq!(r[k], l[k], "{k}: {r:#}\n{l:#}");
    }
}

/// A worktree a session left (kept: its commit is ahead of the base) is
/// pruned by the worker that made it once past the agent's `retention`,
/// as the controller prunes its own: at the worker's start, and hourly.
#[test]
fn a_worker_prunes_the_worktrees_it_kept_past_their_retention() {
    let Some(binary) = nats::server_binary("cluster_workspace") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 1);
    let (env, _repo) = setup_with(
        Some(&servers),
        None,
        ", retention = \"1s\", prune_unpushed = true",
        &[],
    );
    let mut worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let d = env.daemon();
    let s = run_one(&env, &d);
    assert_eq!(s["status"], "completed", "{s:#}");
    assert_eq!(s["workspace"]["state"], "kept", "{s:#}");
    let path = PathBuf::from(s["workspace"]["path"].as_str().unwrap());
    assert!(path.is_dir(), "{s:#}");
    // Past its retention (by the worktree's modification time).
    let old = poll_until(Duration::from_secs(30), || {
        std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(1))
    });
    assert!(old, "{} never aged", path.display());
    // The next start of the worker prunes it.
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    let again = Worker::start(&env, "w1");
    again.wait_log(&format!("worktrees: rio: removed {}", path.display()));
    assert!(!path.exists(), "{} is still there", path.display());
}

/// The worker has no repository at the configured path: the session ends
/// WORKSPACE_NOT_A_REPO as a local one does (not started, the agent held
/// for a person), and its message is back in the inbox.
#[test]
fn a_worker_without_the_repository_ends_the_session_not_a_repo() {
    let Some(binary) = nats::server_binary("cluster_workspace") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 1);
    let missing = std::env::temp_dir().join(format!("agent-state-no-repo-{}", std::process::id()));
    let (env, _) = setup(Some(&servers), Some(&missing), &[]);
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let d = env.daemon();
    let id = env.send("marcus", "rio", &[]);
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(90), "rio's session ended", || {
        let p = env.path("rio", "session.json");
        p.exists() && read_json(&p)["status"] == "error"
    });
    let s = session(&env);
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("not started on w1")
            && reason.contains("WORKSPACE_NOT_A_REPO")
            && reason.contains(&missing.display().to_string()),
        "{s:#}"
    );
    assert!(s.get("workspace").is_none(), "{s:#}");
    d.wait_until(
        Duration::from_secs(20),
        "the message back in the inbox",
        || env.waiting("rio").iter().any(|m| m.contains(&id)),
    );
    d.wait_until(Duration::from_secs(20), "the error is recorded", || {
        std::fs::read_to_string(env.root.join(".daemon/errors.jsonl"))
            .unwrap_or_default()
            .contains("WORKSPACE_NOT_A_REPO")
    });
    d.wait_until(Duration::from_secs(20), "rio is disabled", || {
        read_json(&env.path("rio", "report.json"))["error"]["state"] == "disabled"
    });
    assert!(!command_ran(&env), "the command ran without its workspace");
}

/// Orders published by hand with hostile worktrees: each ends "not
/// started" naming the field, and nothing is made or removed there.
#[test]
fn a_hostile_workspace_in_an_order_is_refused_naming_the_field() {
    let Some(binary) = nats::server_binary("cluster_workspace") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 1);
    let (env, repo) = setup(Some(&servers), None, &[]);
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let (rt, cluster, dispatch, _) = crate::cluster_executor::test_client(&servers);
    let output = rt.block_on(cluster.output()).unwrap();

    let root = env.path("rio", "workspaces");
    std::fs::create_dir_all(&root).unwrap();
    // A victim outside the root, and a link to it inside.
    let victim = env.tmp("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("keep"), "mine").unwrap();
    std::os::unix::fs::symlink(&victim, root.join("evil")).unwrap();
    let repo = repo.display().to_string();
    let under = |name: &str| root.join(name).display().to_string();
    let cases: &[(&str, String, String, &str)] = &[
        (
            "h1",
            repo.clone(),
            "../../etc".into(),
            "`workspace.path` \"../../etc\"",
        ),
        (
            "h2",
            repo.clone(),
            format!("{}/../../../victim", root.display()),
            "`workspace.path`",
        ),
        (
            "h3",
            repo.clone(),
            victim.display().to_string(),
            "directly under agent rio's workspace root",
        ),
        ("h4", repo.clone(), under("evil"), "is a symbolic link"),
        (
            "h5",
            "/etc".into(),
            under("h5"),
            "`workspace.repo` /etc is not the repository",
        ),
    ];
    let script = env.tmp("agent.sh");
    for (id, repo, path, _) in cases {
        let order = agent_state_cluster::SessionOrder {
            session_id: id.to_string(),
            agent: "rio".into(),
            credential_group: "default".into(),
            spec: serde_json::json!({
                "command": script.display().to_string(),
                "workspace": { "repo": repo, "base": "main", "path": path, "branch": "rio/x" },
            }),
        };
        rt.block_on(dispatch.publish(&order)).unwrap();
    }
    for (id, _, _, want) in cases {
        let mut end = None;
        let ok = poll_until(Duration::from_secs(60), || {
            end = rt.block_on(output.ended(id)).unwrap();
            end.is_some()
        });
        assert!(ok, "no end of {id}:\n{}", worker.log());
        let end = end.unwrap();
        let detail = match &end.outcome {
            agent_state_cluster::Outcome::NotStarted { detail } => detail.clone(),
            other => panic!("{id}: {other:?}"),
        };
        assert!(detail.contains(want), "{id}: {want:?} not in {detail}");
        assert!(
            matches!(
                &end.workspace,
                Some(agent_state_cluster::WorkspaceEnd::NotMade { .. })
            ),
            "{id}: {end:?}"
        );
    }
    // Nothing ran, nothing was removed.
    assert_eq!(
        std::fs::read_to_string(victim.join("keep")).unwrap(),
        "mine"
    );
    assert!(
        std::fs::symlink_metadata(root.join("evil"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(!command_ran(&env), "a hostile order ran");
}

/// Wakes rio and checks that its session is refused before any order goes
/// out, naming the settings to change, its message back in the inbox.
fn verify_refused(env: &Env) {
    let d = env.daemon();
    assert!(
        d.log_text()
            .contains("rio has [agent.session.iteration] verify, which cannot run on a worker yet"),
        "said at the start: {}",
        d.log_text()
    );
    let id = env.send("marcus", "rio", &[]);
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(60), "rio's session ended", || {
        let p = env.path("rio", "session.json");
        p.exists() && read_json(&p)["status"] == "error"
    });
    let s = session(env);
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("`verify` commands cannot run on a worker yet")
            && reason.contains("local_sessions = true in [cluster]")
            && reason.contains("[agent.session.iteration] verify"),
        "{s:#}"
    );
    d.wait_until(
        Duration::from_secs(20),
        "the message back in the inbox",
        || env.waiting("rio").iter().any(|m| m.contains(&id)),
    );
    assert!(!command_ran(env), "the session command ran");
}

/// A workspace with `verify` commands does not run on a worker yet.
#[test]
fn a_workspace_with_verify_is_refused_on_workers_naming_the_setting() {
    let Some(binary) = nats::server_binary("cluster_workspace") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 1);
    let (env, _) = setup(
        Some(&servers),
        None,
        &[("verify", r#"[["true"]]"#), ("max_iterations", "2")],
    );
    verify_refused(&env);
}

/// Nor do `verify` commands without a workspace: they would run here, on
/// the controller, in a directory the session on its worker never touched.
/// On the code before: the order went out (and, with a worker, the
/// verification judged the controller's copy).
#[test]
fn verify_without_a_workspace_is_refused_on_workers_too() {
    let Some(binary) = nats::server_binary("cluster_workspace") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 1);
    let env = Env::with_config("");
    let script = agent(&env);
    let body = daemon_config(
        &script,
        &[],
        &[
            ("wake_on_inbox", "\"never\""),
            ("verify", r#"[["true"]]"#),
            ("max_iterations", "2"),
        ],
        "[[agent]]\nname = \"rio\"\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    );
    env.set_config(&format!("{body}\n{}", cluster_of(&servers)));
    env.ok(&["bootstrap"]);
    verify_refused(&env);
}

/// A worker whose link to NATS is cut when its session ends judges the
/// worktree and keeps the whole end, the judgement included, in its
/// spool; SIGKILLed then and started again, it stores that end, and
/// session.json has the worktree as a run that went well records it (not a
/// session without its workspace).
#[test]
fn a_worker_killed_before_its_end_is_stored_keeps_the_worktree_judgement() {
    let Some(binary) = nats::server_binary("cluster_workspace") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 1);
    let (env, repo) = setup(Some(&servers), None, &[]);
    let proxy = crate::cluster_chaos::Proxy::start(servers.nodes.iter().map(|n| n.port).collect());
    let worker_config =
        crate::cluster_worker::config_through_proxy(&env, &servers, proxy.port, "w1");
    let start = || Worker::start_configured(&env, &worker_config, "w1", &[], |_| {});
    let mut first = start();
    first.wait_registered();
    let hold = env.tmp("hold-rio");
    std::fs::write(&hold, "").unwrap();
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    let sid = || {
        std::fs::read_dir(env.dir.path())
            .unwrap()
            .flatten()
            .find_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                name.strip_prefix("seen-rio-").map(str::to_string)
            })
    };
    d.wait_until(Duration::from_secs(90), "rio runs on the worker", || {
        sid().is_some()
    });
    let sid = sid().unwrap();
    proxy.cut();
    std::fs::remove_file(&hold).unwrap();
    // The end, with the worktree's judgement, is in the spool.
    let spooled = env.tmp(&format!("worker-w1/spool/rio_{sid}.spool"));
    let judged = poll_until(Duration::from_secs(60), || {
        let bytes = std::fs::read(&spooled).unwrap_or_default();
        bytes.windows(10).any(|w| w == b"\"judged\":{")
    });
    assert!(
        judged,
        "no judged end in {}: {:?}\n{}",
        spooled.display(),
        String::from_utf8_lossy(&std::fs::read(&spooled).unwrap_or_default()),
        first.log()
    );
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    proxy.restore();
    let second = start();
    second.wait_log("storing its spooled output and its end under its lease");
    // Recorded with its worktree (without the judgement the session is
    // recorded, its `workspace` never).
    second.wait_log(&format!("session rio_{sid} of rio finished"));
    d.wait_until(Duration::from_secs(90), "rio's workspace recorded", || {
        d.log_text().contains(&format!("session {sid} completed"))
            && session(&env)["workspace"].is_object()
    });
    let s = session(&env);
    assert_eq!(s["session_id"], sid.as_str(), "{s:#}");
    assert_eq!(s["status"], "completed", "{s:#}\n{}", second.log());
    check_workspace(&env, &repo, &s);
}

/// The lines an agent's session wrote of where it ran (`seen-AGENT-SID`).
fn seen_of(env: &Env, agent: &str, sid: &str) -> Vec<String> {
    std::fs::read_to_string(env.tmp(&format!("seen-{agent}-{sid}")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// An agent with `verify` and `runs_on = "controller"` runs on the
/// controller's host, in a worktree made there, its verification judging
/// that worktree, while another agent's session goes to a worker. A
/// controller that stops ends the session it runs itself (a worker's it
/// leaves for the next controller). On the code before: rio's sessions
/// were refused ("`verify` commands cannot run on a worker yet") whatever
/// the setting, and `runs_on` was an unknown field.
#[test]
fn an_agent_placed_on_the_controller_runs_its_verify_there_beside_the_workers() {
    let Some(binary) = nats::server_binary("cluster_workspace") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 1);
    let env = Env::with_config("");
    let repo = git_repo(&env);
    let script = agent(&env);
    let workspace = format!(
        "{{ repo = {:?}, base = \"main\" }}",
        repo.display().to_string()
    );
    let body = daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\""), ("workspace", &workspace)],
        "[[agent]]\nname = \"rio\"\nruns_on = \"controller\"\nverify = [[\"test\", \"-f\", \"own-rio.txt\"]]\nmax_iterations = 2\n[[agent]]\nname = \"leo\"\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    );
    env.set_config(&format!("{body}\n{}", cluster_of(&servers)));
    env.ok(&["bootstrap"]);
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let mut d = env.daemon();
    let log = d.log_text();
    assert!(
        log.contains("the sessions of rio run on this host (runs_on = \"controller\")"),
        "{log}"
    );
    assert!(!log.contains("cannot run on a worker yet"), "{log}");

    env.ok(&["wake", "rio"]);
    env.ok(&["wake", "leo"]);
    let recorded = |a: &str| {
        let p = env.path(a, "session.json");
        p.exists() && read_json(&p)["workspace"].is_object()
    };
    // rio's iterations are written into session.json after its workspace
    // (ending.rs: the end, then the workspace, then the iterations, each a
    // write of its own): waited for too (a loaded CI saw the workspace
    // alone).
    d.wait_until(Duration::from_secs(90), "both sessions recorded", || {
        recorded("rio")
            && recorded("leo")
            && read_json(&env.path("rio", "session.json"))["iterations"].is_object()
    });
    let rio = read_json(&env.path("rio", "session.json"));
    let leo = read_json(&env.path("leo", "session.json"));
    assert_eq!(rio["status"], "completed", "{rio:#}");
    assert_eq!(leo["status"], "completed", "{leo:#}");
    // rio: on this host (no worker in its environment), in its worktree,
    // verified there at the first iteration (its file is only there).
    let rio_sid = rio["session_id"].as_str().unwrap();
    let seen = seen_of(&env, "rio", rio_sid);
    assert!(seen.contains(&"worker=".to_string()), "{seen:?}");
    let real = env
        .path("rio", &format!("workspaces/{rio_sid}"))
        .canonicalize()
        .unwrap();
    assert!(
        seen.contains(&format!("cwd={}", real.display())),
        "{seen:?}"
    );
    assert_eq!(rio["iterations"]["count"], 1, "{rio:#}");
    assert_eq!(rio["iterations"]["verify_failures"], 0, "{rio:#}");
    assert_eq!(rio["workspace"]["commits_ahead"], 1, "{rio:#}");
    let journal = std::fs::read_to_string(env.path("rio", "journal.jsonl")).unwrap();
    assert!(
        journal.contains("\"iteration_end\"") && journal.contains("\"passed\""),
        "{journal}"
    );
    // leo: on the worker.
    let leo_sid = leo["session_id"].as_str().unwrap();
    let seen = seen_of(&env, "leo", leo_sid);
    assert!(seen.contains(&"worker=w1".to_string()), "{seen:?}");

    // A session of rio's held running, then the controller stopped: it
    // stops with it, recorded, not left running for a next controller.
    std::fs::write(env.tmp("hold-rio"), "").unwrap();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(60), "rio's second session runs", || {
        let s = read_json(&env.path("rio", "session.json"));
        s["status"] == "running" && s["session_id"] != rio_sid && {
            let sid = s["session_id"].as_str().unwrap_or_default();
            env.tmp(&format!("seen-rio-{sid}")).exists()
        }
    });
    let second = read_json(&env.path("rio", "session.json"));
    let second_sid = second["session_id"].as_str().unwrap().to_string();
    d.signal(nix::sys::signal::Signal::SIGTERM);
    d.wait_exit(Duration::from_secs(60));
    let log = d.log_text();
    assert!(
        !log.contains(&format!("session {second_sid} left running")),
        "{log}"
    );
    let s = read_json(&env.path("rio", "session.json"));
    assert_eq!(s["session_id"], second_sid.as_str(), "{s:#}");
    assert_ne!(s["status"], "running", "{s:#}");
    assert!(
        !env.root.join(".daemon/remote.rio").exists(),
        "a record for a next controller was left"
    );
    // Its script is gone with it (it would wait on its hold file).
    let script_path = script.display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&script_path))
        .collect();
    assert!(left.is_empty(), "still running: {left:?}");
    std::fs::remove_file(env.tmp("hold-rio")).unwrap();
    drop(worker);
}

/// A flow in cluster mode: its Actor, whose cycle worktree a worker cannot
/// run yet, placed on the controller (`runs_on = "controller"`); its
/// Planner and Judge on a worker. The cycle runs to its archive as on one
/// host. On the code before: the Actor's step was refused ("a flow
/// cycle's step ... cannot run on a worker yet") and the cycle stopped.
#[test]
fn a_flow_whose_actor_runs_on_the_controller_completes_with_the_others_on_a_worker() {
    let Some(binary) = nats::server_binary("cluster_workspace") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 1);
    let lab = crate::flows::lab_with("", "runs_on = \"controller\"", &cluster_of(&servers));
    lab.env.ok(&["bootstrap"]);
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["* pass-low"]);
    let worker = Worker::start(&lab.env, "w1");
    worker.wait_registered();
    let d = lab.env.daemon();
    let cycle = lab.start("Add three notes to notes.md");
    let name = crate::flows::archive_name(&cycle, false);
    d.wait_until(
        crate::flows::LONG,
        "the cycle is archived and journaled",
        || {
            !lab.archived(&name).is_empty()
                && lab
                    .journal()
                    .iter()
                    .any(|e| e["event"] == "worktree_removed")
        },
    );
    let file = lab.archived(&name);
    for s in [
        "## Step 2 — Actor (rio",
        "+note 1",
        "PASS at low risk: approved",
    ] {
        assert!(file.contains(s), "{s:?} not in the cycle file:\n{file}");
    }
    assert_eq!(lab.played("theseus"), ["1 plan"]);
    assert_eq!(lab.played("rio"), ["2 small"]);
    assert_eq!(lab.played("leo"), ["3 pass-low"]);
    // The Planner and the Judge ran on the worker, the Actor here.
    let log = worker.log();
    for (agent, there) in [("theseus", true), ("leo", true), ("rio", false)] {
        assert_eq!(
            log.contains(&format!(" of {agent} started")),
            there,
            "{agent} on the worker: {there}\n{log}"
        );
    }
}
