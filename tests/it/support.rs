//! Test environments: a temp dir with a config file and a state root, and
//! helpers to run the real binary against them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use tempfile::TempDir;

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-state");

/// Three research agents and a human mailbox.
pub const STANDARD_AGENTS: &str = r#"
[[agent]]
name = "rio"
domain = "internet-finance"
schedule = "0 22 * * *"

[[agent]]
name = "theseus"
domain = "ai-alignment"
schedule = "0 1 * * *"

[[agent]]
name = "leo"
domain = "grand-strategy"

[[agent]]
name = "marcus"
kind = "human"
"#;

/// A config for a daemon under test: `[daemon]` and `[defaults]` with
/// test-friendly values (agents run `command AGENT`, short grace periods,
/// inbox wakes on any message after 200 ms) overridden by `daemon` and
/// `defaults` (`key`, TOML value), then the `agents` tables.
pub fn daemon_config(
    command: &Path,
    daemon: &[(&str, &str)],
    defaults: &[(&str, &str)],
    agents: &str,
) -> String {
    fn section(name: &str, base: &[(&str, String)], over: &[(&str, &str)]) -> String {
        let mut out = format!("[{name}]\n");
        for (k, v) in base {
            let v = over
                .iter()
                .find(|(o, _)| o == k)
                .map(|(_, v)| v.to_string())
                .unwrap_or_else(|| v.clone());
            out.push_str(&format!("{k} = {v}\n"));
        }
        for (k, v) in over {
            if !base.iter().any(|(b, _)| b == k) {
                out.push_str(&format!("{k} = {v}\n"));
            }
        }
        out
    }
    let daemon_base = [
        ("max_concurrent_sessions", "2".to_string()),
        ("catch_up_window", "\"2h\"".to_string()),
        ("shutdown_grace", "\"2s\"".to_string()),
    ];
    let defaults_base = [
        (
            "command",
            format!("[{:?}, \"{{agent}}\"]", command.display().to_string()),
        ),
        ("timeout", "\"30s\"".to_string()),
        ("kill_grace", "\"1s\"".to_string()),
        ("wake_on_inbox", "\"any\"".to_string()),
        ("inbox_debounce", "\"200ms\"".to_string()),
    ];
    format!(
        "{}\n{}\n{agents}",
        section("daemon", &daemon_base, daemon),
        section("defaults", &defaults_base, defaults)
    )
}

pub struct Env {
    pub dir: TempDir,
    pub config: PathBuf,
    pub root: PathBuf,
}

impl Env {
    /// An environment whose config is `body` (agents, sections) under a
    /// `state_root` in the temp dir. Not bootstrapped.
    pub fn with_config(body: &str) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("state");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!("state_root = {:?}\n{body}", root.display().to_string()),
        )
        .expect("write config");
        Env { dir, config, root }
    }

    /// The standard agents, bootstrapped.
    pub fn standard() -> Env {
        let env = Env::with_config(STANDARD_AGENTS);
        env.ok(&["bootstrap"]);
        env
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--config").arg(&self.config).args(args);
        cmd.env_remove("AGENT_STATE_SESSION_ID");
        cmd.env_remove("AGENT_STATE_CONFIG");
        cmd.stdin(Stdio::null());
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run agent-state")
    }

    /// Run, assert exit 0, return stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "agent-state {args:?} failed with {:?}\nstdout: {}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Run, assert the exit code, return stderr.
    pub fn fails(&self, args: &[&str], code: i32) -> String {
        let out = self.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(
            out.status.code(),
            Some(code),
            "agent-state {args:?}: expected exit {code}\nstdout: {}\nstderr: {stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        stderr
    }

    pub fn agent(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn path(&self, agent: &str, rel: &str) -> PathBuf {
        self.agent(agent).join(rel)
    }

    /// Parse a JSON state file of an agent.
    pub fn json(&self, agent: &str, file: &str) -> Value {
        read_json(&self.path(agent, file))
    }

    pub fn write(&self, agent: &str, rel: &str, text: &str) {
        std::fs::write(self.path(agent, rel), text).expect("write");
    }

    pub fn read(&self, agent: &str, rel: &str) -> String {
        std::fs::read_to_string(self.path(agent, rel)).expect("read")
    }

    /// Journal events of an agent, parsed.
    pub fn journal(&self, agent: &str) -> Vec<Value> {
        self.read(agent, "journal.jsonl")
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("journal line {l:?}: {e}")))
            .collect()
    }

    pub fn events(&self, agent: &str, event: &str) -> Vec<Value> {
        self.journal(agent)
            .into_iter()
            .filter(|e| e["event"] == event)
            .collect()
    }

    /// Names of the files in a directory of an agent (sorted).
    pub fn files(&self, agent: &str, rel: &str) -> Vec<String> {
        list(&self.path(agent, rel))
    }

    /// Messages waiting in an inbox (`*.json`, not dotfiles).
    pub fn waiting(&self, agent: &str) -> Vec<String> {
        self.files(agent, "inbox")
            .into_iter()
            .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
            .collect()
    }

    /// `send` a message, return its id.
    pub fn send(&self, from: &str, to: &str, extra: &[&str]) -> String {
        let mut args = vec!["send", "--from", from, "--to", to, "--subject", "a subject"];
        args.extend_from_slice(extra);
        let out = self.ok(&args);
        out.split_whitespace().nth(1).expect("sent ID").to_string()
    }
}

pub fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}\n{text}", path.display()))
}

pub fn list(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(it) => it
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => vec![],
    };
    names.sort();
    names
}

/// The keys of a JSON object, in file order.
pub fn keys(v: &Value) -> Vec<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The JSON type of a value, as a word: what "value types" means in the tests.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

// ---- the daemon through the real binary (tests/it/daemon.rs) ---------------

/// Poll `cond` every 25 ms until it holds (true) or `timeout` passes (false).
pub fn poll_until(timeout: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
}

/// Is `pid` a live process (present and not a zombie)?
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

impl Env {
    /// A file in the test's temp dir, outside the state root.
    pub fn tmp(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Write an executable `sh` script (`body` after the `#!/bin/sh` line)
    /// into the temp dir; returns its absolute path.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.tmp(name);
        // Written aside and renamed in: a running daemon may exec it any moment.
        let aside = self.tmp(&format!(".{name}.tmp"));
        std::fs::write(&aside, format!("#!/bin/sh\n{body}\n")).expect("write script");
        std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o755))
            .expect("chmod script");
        std::fs::rename(&aside, &path).expect("rename script");
        path
    }

    /// Replace the config file with `body` under the same `state_root`.
    pub fn set_config(&self, body: &str) {
        let aside = self.tmp(".config.toml.tmp");
        std::fs::write(
            &aside,
            format!("state_root = {:?}\n{body}", self.root.display().to_string()),
        )
        .expect("write config");
        std::fs::rename(&aside, &self.config).expect("rename config");
    }

    /// The end lines of `agent`'s sessions in its journal (a completion, an
    /// error, a timeout).
    pub fn session_ends(&self, agent: &str) -> Vec<Value> {
        self.journal(agent)
            .into_iter()
            .filter(|e| {
                ["session_end", "error", "timeout"].contains(&e["event"].as_str().unwrap_or(""))
            })
            .collect()
    }

    /// `.daemon/errors.jsonl`, as text (empty when there is none).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.root.join(".daemon/errors.jsonl")).unwrap_or_default()
    }

    /// Start `agent-state daemon` on this environment (see [`Daemon::start`]).
    pub fn daemon(&self) -> Daemon {
        Daemon::start(self, &[])
    }
}

static DAEMON_LOGS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A running `agent-state --config … daemon`, its stderr in a log file.
/// Dropping it stops it (SIGTERM, then SIGKILL) and, when the test is
/// failing, prints its log.
pub struct Daemon {
    child: Option<std::process::Child>,
    pub pid: u32,
    pub log: PathBuf,
    pub root: PathBuf,
    status: Option<std::process::ExitStatus>,
}

impl Daemon {
    /// Spawn the daemon with extra environment `vars` and wait until it has
    /// written `.daemon/daemon.json` with its own pid (its watches and
    /// schedules are in place by then).
    pub fn start(env: &Env, vars: &[(&str, &str)]) -> Daemon {
        remember_panics();
        let n = DAEMON_LOGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = env.tmp(&format!("daemon-{n}.log"));
        let file = std::fs::File::create(&log).expect("create daemon log");
        let mut cmd = env.command(&["daemon"]);
        for var in [
            "NOTIFY_SOCKET",
            "JOURNAL_STREAM",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "AGENT_STATE_FAKE_NOW",
            "AGENT_STATE_LOG",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(vars.iter().copied());
        cmd.stdout(file.try_clone().expect("dup log"));
        cmd.stderr(file);
        let child = cmd.spawn().expect("spawn agent-state daemon");
        let pid = child.id();
        let mut daemon = Daemon {
            child: Some(child),
            pid,
            log,
            root: env.root.clone(),
            status: None,
        };
        let heartbeat = env.root.join(".daemon/daemon.json");
        // Generous: a large first start on a loaded machine took over 10 s;
        // a daemon that exits fails at once below.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let ready = std::fs::read_to_string(&heartbeat)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .is_some_and(|hb| hb["pid"] == pid);
            if ready {
                return daemon;
            }
            if !daemon.is_running() {
                panic!(
                    "the daemon exited with {:?} before it was ready\n{}",
                    daemon.status,
                    daemon.log_text()
                );
            }
            if std::time::Instant::now() >= deadline {
                panic!(
                    "the daemon wrote no daemon.json with its pid {pid} within 60s\n{}",
                    daemon.log_text()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `.daemon/daemon.json` (Null if missing or unreadable).
    pub fn heartbeat(&self) -> Value {
        std::fs::read_to_string(self.root.join(".daemon/daemon.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null)
    }

    /// Wait until `cond` holds, or fail naming `what` with the daemon's log.
    pub fn wait_until(&self, timeout: std::time::Duration, what: &str, cond: impl FnMut() -> bool) {
        if !poll_until(timeout, cond) {
            panic!(
                "timed out after {timeout:?} waiting until {what}\n---- daemon log ({}) ----\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }

    /// Still running (not exited)?
    pub fn is_running(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(Some(status))) => {
                self.status = Some(status);
                false
            }
            Some(Ok(None)) => true,
            _ => false,
        }
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if self.status.is_none() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), signal);
        }
    }

    /// Wait for the daemon to exit; fail with its log after `timeout`.
    pub fn wait_exit(&mut self, timeout: std::time::Duration) -> std::process::ExitStatus {
        if !poll_until(timeout, || !self.is_running()) {
            panic!(
                "the daemon did not exit within {timeout:?}\n---- daemon log ({}) ----\n{}",
                self.log.display(),
                self.log_text()
            );
        }
        self.status.expect("exit status")
    }

    /// No session is the daemon's any more (daemon.json's `running`).
    pub fn idle(&self) -> bool {
        self.heartbeat()["running"] == serde_json::json!([])
    }

    /// SIGKILL, and reap it (as systemd would).
    pub fn kill9(&mut self) -> std::process::ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.wait_exit(std::time::Duration::from_secs(10))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.is_running() {
            self.signal(nix::sys::signal::Signal::SIGTERM);
            if !poll_until(std::time::Duration::from_secs(15), || !self.is_running()) {
                self.signal(nix::sys::signal::Signal::SIGKILL);
                if let Some(c) = self.child.as_mut() {
                    let _ = c.wait();
                }
            }
        }
        if std::thread::panicking() {
            // The failure said again after the log: a CI report that keeps
            // only the output's ends still shows why the test failed.
            let why = LAST_PANIC
                .with(|p| p.borrow_mut().take())
                .unwrap_or_default();
            eprintln!(
                "---- daemon log ({}) ----\n{}---- end of daemon log ----\nthe test failed: {why}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

thread_local! {
    /// This thread's last panic (message and place), for [`Daemon`]'s
    /// drop to repeat after the daemon's log.
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Keep each panic's message and place (besides printing it as usual).
fn remember_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let place = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            // Only the head: a message may carry a whole log.
            let head: String = message.chars().take(2_000).collect();
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{place}: {head}")));
            default(info);
        }));
    });
}

/// An agent's state file as JSON, or Null while it does not exist yet (or
/// does not parse): for polling a file the daemon is about to write.
pub fn state(env: &Env, agent: &str, file: &str) -> Value {
    std::fs::read_to_string(env.root.join(agent).join(file))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

/// `git ARGS` in `dir` with a fixed identity and no user or system config;
/// it must succeed. Returns stdout, trimmed.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A git repository at `{tmp}/repo` on branch main with one commit
/// (`README`).
pub fn git_repo(env: &Env) -> PathBuf {
    let repo = env.tmp("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README"), "base\n").unwrap();
    git(&repo, &["add", "README"]);
    git(&repo, &["commit", "-q", "-m", "base"]);
    repo
}

// ---- root tests: system accounts ----------------------------------------------

/// Whether the tests that make users and groups may run: as root, with
/// `AGENT_STATE_ROOT_TESTS=1` (`.ci/run` sets it). Says SKIPPED otherwise.
pub fn root_tests() -> bool {
    let on = std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() == Ok("1")
        && nix::unistd::geteuid().is_root();
    if !on {
        eprintln!(
            "SKIPPED: creates a user and a group; runs as root with AGENT_STATE_ROOT_TESTS=1"
        );
    }
    on
}

/// A system group with members and users in no group of ours, made for
/// one test (`groupadd`/`useradd --system`, no home) and removed when
/// dropped; what an earlier, killed run left under the same names is
/// removed first.
pub struct Accounts {
    group: String,
    users: Vec<String>,
}

impl Accounts {
    pub fn new(group: &str, members: &[&str], outsiders: &[&str]) -> Accounts {
        let accounts = Accounts {
            group: group.to_string(),
            users: members
                .iter()
                .chain(outsiders)
                .map(|u| u.to_string())
                .collect(),
        };
        accounts.remove();
        quiet("groupadd", &["--system", group]);
        for u in members {
            quiet(
                "useradd",
                &["--system", "-M", "-N", "-G", group, "-s", "/bin/sh", u],
            );
        }
        for u in outsiders {
            quiet("useradd", &["--system", "-M", "-N", "-s", "/bin/sh", u]);
        }
        accounts
    }

    fn remove(&self) {
        for u in &self.users {
            quiet("userdel", &[u]);
        }
        quiet("groupdel", &[&self.group]);
    }

    /// Give `env` to the group as an install does: the group in the
    /// config, the directories and config readable, the state root
    /// `root:GROUP`, and a copy of the binary anyone may run (returned).
    pub fn share(&self, env: &Env) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let text = std::fs::read_to_string(&env.config).unwrap();
        std::fs::write(&env.config, format!("group = {:?}\n{text}", self.group)).unwrap();
        env.ok(&["bootstrap"]);
        std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&env.config, std::fs::Permissions::from_mode(0o644)).unwrap();
        let bin = env.tmp("agent-state");
        std::fs::copy(BIN, &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let chown = Command::new("chown")
            .args([
                "-R",
                &format!("root:{}", self.group),
                env.root.to_str().unwrap(),
            ])
            .status()
            .unwrap();
        assert!(chown.success());
        bin
    }
}

impl Drop for Accounts {
    fn drop(&mut self) {
        self.remove();
    }
}

/// `bin ARGS` as `user` (runuser) on `env`'s config.
pub fn run_as(env: &Env, bin: &Path, user: &str, args: &[&str]) -> Output {
    Command::new("runuser")
        .args(["-u", user, "--"])
        .arg(bin)
        .args(["--config", env.config.to_str().unwrap()])
        .args(args)
        .env_remove("AGENT_STATE_CONFIG")
        .output()
        .unwrap()
}

/// An account tool whose failure is not the test's (a user already gone),
/// tried again while another run holds /etc/passwd's lock ([`run_tool`]).
fn quiet(program: &str, args: &[&str]) {
    let _ = run_tool(program, args);
}

/// The random numbers of a crash harness: xorshift from
/// `AGENT_STATE_CRASH_SEED` (to replay a run) or the time, the seed printed
/// under `harness`'s name. Returns the seed (for failure messages) and
/// `rand`, whose `rand(n)` is in `0..n`.
pub fn crash_rng(harness: &str) -> (u64, impl FnMut(u64) -> u64) {
    let seed: u64 = std::env::var("AGENT_STATE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("{harness} crash harness: seed {seed}");
    let mut x = seed | 1;
    let rand = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    (seed, rand)
}

/// `s` seconds.
pub fn secs(s: u64) -> std::time::Duration {
    std::time::Duration::from_secs(s)
}

/// The name of a system user or group a test makes: `base` and this test
/// process's id. Two test runs on one machine (two CI runs at once) never
/// make, use or delete each other's accounts. At most `base` + 6 characters.
pub fn account(base: &str) -> String {
    format!("{base}{:x}", std::process::id())
}

/// Run `program` with `args` (stdin from /dev/null) and return its output.
/// An account tool (`useradd`, `groupadd`, `userdel`, `groupdel`, …) is
/// tried again while another process holds the lock of /etc/passwd or
/// /etc/group (another test run's useradd), for at most a minute.
pub fn run_tool(program: &str, args: &[&str]) -> std::process::Output {
    let account_tool = matches!(
        program,
        "useradd" | "groupadd" | "userdel" | "groupdel" | "usermod" | "groupmod" | "gpasswd"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        let said = String::from_utf8_lossy(&out.stderr);
        let locked =
            account_tool && (said.contains("cannot lock") || said.contains("try again later"));
        if out.status.success() || !locked || std::time::Instant::now() >= deadline {
            return out;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
