//! bench/cluster's controller restart: the real daemon (`agent-state
//! daemon`, cluster mode, no local sessions) runs agent `rio`'s session on
//! the bench's workers; the bench SIGKILLs it while the session prints a
//! line with `$EPOCHREALTIME` every 10 ms, starts the next daemon at once,
//! and measures from the kill until
//!
//! - the new daemon logs that it follows the session again
//!   (`daemon/service/adopted.rs`: "followed again after the controller's
//!   restart"), its start-up included;
//! - the session's log (`rio/sessions/<id>.log`, rewritten from the output
//!   stream) holds a line the session printed after the kill: the output
//!   no controller was there for is recorded;
//! - it holds a line printed after that figure's moment: live again.
//!
//! Then the session is let end and must be recorded completed. Every wait
//! is bounded (60 s).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

pub struct Figures {
    pub adopted_ms: f64,
    pub caught_up_ms: f64,
    pub live_ms: f64,
}

struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(bin: &Path, config: &Path, log: PathBuf) -> Daemon {
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(config)
            .arg("daemon")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} daemon: {e}", bin.display()));
        Daemon { child, log }
    }
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now_secs() -> f64 {
    super::now_secs()
}

/// Polls `cond` every 2 ms for at most 60 s; panics naming `what`.
fn until<T>(what: &str, logs: &dyn Fn() -> String, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "controller restart: {what} not within {WAIT:?}\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn agent_state(bin: &Path, config: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "agent-state {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The times (`$EPOCHREALTIME`) of the session's `tick` lines in its log.
fn ticks(root: &Path) -> Vec<f64> {
    let session: serde_json::Value = std::fs::read_to_string(root.join("rio/session.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let Some(id) = session["session_id"].as_str() else {
        return Vec::new();
    };
    std::fs::read_to_string(root.join(format!("rio/sessions/{id}.log")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            l.strip_prefix("tick ")?
                .trim()
                .replace(',', ".")
                .parse()
                .ok()
        })
        .collect()
}

/// One controller restart; `workers_log` gives the workers' logs for a
/// failure's message.
pub fn run(bin: &Path, dir: &Path, urls: &[String], workers_log: &dyn Fn() -> String) -> Figures {
    let dir = dir.join("controller");
    std::fs::create_dir_all(&dir).unwrap();
    let root = dir.join("state");
    let go = dir.join("go");
    let script = dir.join("session.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\nwhile [ ! -e {go:?} ]; do echo \"tick $EPOCHREALTIME\"; sleep 0.01; done\n"
        ),
    )
    .unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(
        &mut std::fs::metadata(&script).unwrap().permissions(),
        0o755,
    );
    Command::new("chmod")
        .arg("755")
        .arg(&script)
        .status()
        .unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "state_root = {root:?}\n\
             [daemon]\nmax_concurrent_sessions = 2\nshutdown_grace = \"2s\"\n\
             [defaults]\ncommand = [{script:?}, \"{{agent}}\"]\ntimeout = \"300s\"\nkill_grace = \"1s\"\nwake_on_inbox = \"never\"\n\
             [[agent]]\nname = \"rio\"\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n\
             [cluster]\nurls = {urls:?}\nreplicas = 3\nlocal_sessions = false\ndispatch_timeout = \"60s\"\n"
        ),
    )
    .unwrap();
    agent_state(bin, &config, &["bootstrap"]);

    let first = Daemon::start(bin, &config, dir.join("daemon-1.log"));
    let logs = |d: &Daemon| {
        format!(
            "--- {}\n{}\n{}",
            d.log.display(),
            d.log_text(),
            workers_log()
        )
    };
    until("the first daemon's daemon.json", &|| logs(&first), || {
        root.join(".daemon/daemon.json").exists().then_some(())
    });
    agent_state(
        bin,
        &config,
        &[
            "send",
            "--from",
            "marcus",
            "--to",
            "rio",
            "--subject",
            "bench",
        ],
    );
    agent_state(bin, &config, &["wake", "rio"]);
    until("rio's output in its session log", &|| logs(&first), || {
        (ticks(&root).len() >= 5).then_some(())
    });

    let mut first = first;
    let t_kill = now_secs();
    let _ = first.child.kill();
    let _ = first.child.wait();
    let second = Daemon::start(bin, &config, dir.join("daemon-2.log"));
    let adopted = until(
        "the new daemon follows rio's session",
        &|| logs(&second),
        || {
            second
                .log_text()
                .contains("followed again after the controller's restart")
                .then(now_secs)
        },
    );
    let caught_up = until(
        "a line printed after the kill, in the log",
        &|| logs(&second),
        || ticks(&root).iter().any(|&t| t > t_kill).then(now_secs),
    );
    let live = until(
        "a line printed after the catch-up, in the log",
        &|| logs(&second),
        || ticks(&root).iter().any(|&t| t > caught_up).then(now_secs),
    );
    std::fs::write(&go, "").unwrap();
    until(
        "rio's session recorded completed",
        &|| logs(&second),
        || {
            let session: serde_json::Value = std::fs::read_to_string(root.join("rio/session.json"))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            (session["status"] == "completed").then_some(())
        },
    );
    drop(first);
    drop(second);
    Figures {
        adopted_ms: (adopted - t_kill) * 1000.0,
        caught_up_ms: (caught_up - t_kill) * 1000.0,
        live_ms: (live - t_kill) * 1000.0,
    }
}
