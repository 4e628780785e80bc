//! The locks only the service user (and root) take — an agent's `.lock`,
//! `.daemon/counters.lock` — cannot be held by a member of the inbox group,
//! who may send mail but must not hold an agent back. An install from
//! before (`.lock` 0660) is mended when the daemon starts. With real users:
//! runs only as root with AGENT_STATE_ROOT_TESTS=1 (see permissions.rs).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::permissions::{World, enabled, show};
use crate::support::{daemon_config, poll_until};

/// What a member's `flock … CMD` runs once it holds the lock: it writes
/// `ready` (in /tmp, writable by every account), then sleeps. The test waits
/// on that file or on flock's exit (refused), whichever comes first, instead
/// of sleeping; true if the member holds the lock.
fn hold_then_sleep(ready: &std::path::Path) -> [String; 4] {
    let _ = std::fs::remove_file(ready);
    [
        "sh".into(),
        "-c".into(),
        "echo > \"$0\"; exec sleep 20".into(),
        ready.display().to_string(),
    ]
}

fn holds_the_lock(child: &mut std::process::Child, ready: &std::path::Path) -> bool {
    poll_until(Duration::from_secs(20), || {
        ready.exists() || !matches!(child.try_wait(), Ok(None))
    });
    let holds = ready.exists() && matches!(child.try_wait(), Ok(None));
    let _ = std::fs::remove_file(ready);
    holds
}

fn ready_file(what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("agentlock-{}-{what}.ready", std::process::id()))
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .map(|m| m.mode() & 0o7777)
        .unwrap_or(0)
}

#[test]
fn a_group_member_cannot_hold_an_agent_or_the_session_counter() {
    if !enabled("a_group_member_cannot_hold_an_agent_or_the_session_counter") {
        return;
    }
    let w = World::new("k");
    // The agent leaves a line in a file anyone may append to.
    let out = w.base.join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    let runs = out.join("runs");
    let script = w.base.join("agent.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"start $AGENT_STATE_AGENT\" >> {runs:?}\necho done\n"),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        &w.config,
        format!(
            "state_root = {:?}\ngroup = {:?}\n{}",
            w.root.display().to_string(),
            w.acc.group,
            daemon_config(
                &script,
                &[],
                &[],
                "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n"
            )
        ),
    )
    .unwrap();
    // An install from before: `.lock` open to the group.
    let lock = w.root.join("rio/.lock");
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o660)).unwrap();

    let log = std::fs::File::create(w.base.join("daemon.log")).unwrap();
    let mut daemon = Command::new("runuser")
        .args(["-u", &w.acc.svc, "--"])
        .arg(&w.bin)
        .arg("--config")
        .arg(&w.config)
        .arg("daemon")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let log_text = || std::fs::read_to_string(w.base.join("daemon.log")).unwrap_or_default();
    let heartbeat = w.root.join(".daemon/daemon.json");
    let ready = poll_until(Duration::from_secs(30), || heartbeat.exists());
    assert!(ready, "the daemon is ready\n{}", log_text());

    // Mended at start, and a member of the group cannot flock it.
    assert_eq!(mode(&lock), 0o600, "rio/.lock is the service user's alone");
    let held = w.sh(&w.acc.alice, "flock -n rio/.lock true");
    assert!(
        !held.status.success(),
        "a group member could flock rio/.lock: {}",
        show(&held)
    );
    assert!(
        String::from_utf8_lossy(&held.stderr).contains("Permission denied"),
        "{}",
        show(&held)
    );
    // Mail from that member is served: the agent was not held back.
    let sent = w.run(
        &w.acc.alice,
        &["send", "--from", "marcus", "--to", "rio", "--subject", "hi"],
    );
    assert!(sent.status.success(), "{}", show(&sent));
    let served = poll_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&runs).is_ok_and(|t| t.contains("start rio"))
    });
    assert!(served, "rio's session starts\n{}", log_text());
    // The session counter every start takes is not the group's either.
    let counters = w.root.join(".daemon/counters.lock");
    assert_eq!(mode(&counters), 0o600, "{}", counters.display());
    let held = w.sh(&w.acc.alice, "flock -n .daemon/counters.lock true");
    assert!(!held.status.success(), "{}", show(&held));
    // And mail still works for the member, as does reading the state.
    let status = w.run(&w.acc.alice, &["status"]);
    assert!(status.status.success(), "{}", show(&status));

    // Stop the daemon this test started: by the pid it wrote.
    let pid = std::fs::read_to_string(&heartbeat)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["pid"].as_i64())
        .expect("the daemon's pid");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let stopped = poll_until(Duration::from_secs(30), || {
        matches!(daemon.try_wait(), Ok(Some(_)))
    });
    if !stopped {
        let _ = daemon.kill();
        let _ = daemon.wait();
        panic!("the daemon did not stop\n{}", log_text());
    }
}

/// `.daemon/lock` is what keeps one daemon per root: anyone who can open it
/// can flock it, and a shared lock held by a member of the inbox group made
/// the next start fail with exit 64 ("another daemon is already running"),
/// which the unit does not restart. Now only the service user and root can
/// open it; members still learn whether a daemon runs, and which.
#[test]
fn a_group_member_cannot_hold_the_daemon_back() {
    if !enabled("a_group_member_cannot_hold_the_daemon_back") {
        return;
    }
    let w = World::new("m");
    let script = w.base.join("agent.sh");
    std::fs::write(&script, "#!/bin/sh\necho done\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        &w.config,
        format!(
            "state_root = {:?}\ngroup = {:?}\n{}",
            w.root.display().to_string(),
            w.acc.group,
            daemon_config(
                &script,
                &[],
                &[],
                "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n"
            )
        ),
    )
    .unwrap();
    let lock = w.root.join(".daemon/lock");
    let heartbeat = w.root.join(".daemon/daemon.json");
    let log_path = w.base.join("daemon.log");
    let log_text = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let start = || {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        let _ = std::fs::remove_file(&heartbeat);
        Reaped(
            Command::new("runuser")
                .args(["-u", &w.acc.svc, "--"])
                .arg(&w.bin)
                .arg("--config")
                .arg(&w.config)
                .arg("daemon")
                .env_remove("NOTIFY_SOCKET")
                .env_remove("WATCHDOG_USEC")
                .env_remove("XDG_RUNTIME_DIR")
                .env_remove("RUNTIME_DIRECTORY")
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    };
    let stop = |Reaped(daemon): &mut Reaped| {
        let pid = heartbeat_pid(&heartbeat).expect("the daemon's pid");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let stopped = poll_until(Duration::from_secs(30), || {
            matches!(daemon.try_wait(), Ok(Some(_)))
        });
        if !stopped {
            let _ = daemon.kill();
            let _ = daemon.wait();
            panic!("the daemon did not stop\n{}", log_text());
        }
    };
    // No daemon yet: a member's wake says so.
    let woken = w.run(&w.acc.alice, &["wake", "rio"]);
    assert_eq!(woken.status.code(), Some(69), "{}", show(&woken));

    // An install from before: `.daemon/lock` open to the group.
    std::fs::write(&lock, "").unwrap();
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o640)).unwrap();
    std::process::Command::new("chown")
        .arg(format!("{}:{}", w.acc.svc, w.acc.group))
        .arg(&lock)
        .status()
        .unwrap();

    // A member opened it then, and holds a shared lock on it for good:
    // narrowing the mode does not take that away.
    let early_ready = ready_file("early");
    let mut early = Command::new("runuser")
        .args(["-u", &w.acc.bob, "--", "flock", "-s", "-n"])
        .arg(&lock)
        .args(hold_then_sleep(&early_ready))
        .current_dir(&w.root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let early_holds = holds_the_lock(&mut early, &early_ready);

    let mut daemon = start();
    let ready = poll_until(Duration::from_secs(30), || heartbeat.exists());
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(early.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = early.wait();
    assert!(early_holds, "the member holds the old lock");
    assert!(ready, "the daemon is ready\n{}", log_text());
    let first = heartbeat_pid(&heartbeat).unwrap();
    assert_eq!(mode(&lock), 0o600, ".daemon/lock is mended at start");

    // A member cannot take it, shared or exclusive.
    for how in ["-s", "-x"] {
        let held = w.sh(&w.acc.alice, &format!("flock -n {how} .daemon/lock true"));
        assert!(
            !held.status.success()
                && String::from_utf8_lossy(&held.stderr).contains("Permission denied"),
            "a group member could open .daemon/lock: {}",
            show(&held)
        );
    }
    // It still learns that a daemon runs, and which.
    let woken = w.run(&w.acc.alice, &["wake", "rio"]);
    assert!(woken.status.success(), "{}", show(&woken));
    let health = w.run(&w.acc.alice, &["health", "--json"]);
    let seen: serde_json::Value = serde_json::from_slice(&health.stdout).unwrap_or_default();
    assert!(
        seen["level"] == "ok"
            && seen["line"]
                .as_str()
                .is_some_and(|l| l.contains(&format!("(pid {first})"))),
        "{}",
        show(&health)
    );
    stop(&mut daemon);

    // A member who waits for the lock to hold it as soon as the daemon is
    // gone (the attack, before a restart): refused, and the next start is
    // not blocked.
    let mut holder = Command::new("runuser")
        .args(["-u", &w.acc.alice, "--", "flock", "-s", "-w", "20"])
        .arg(&lock)
        .args(["sleep", "20"])
        .current_dir(&w.root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    // Kept: the member waits (-w) for the lock; while it is refused or still
    // waiting it writes nothing, so this is the head start it is given.
    std::thread::sleep(Duration::from_millis(500));
    let mut daemon = start();
    let ready = poll_until(Duration::from_secs(30), || {
        heartbeat_pid(&heartbeat).is_some_and(|p| p != first)
    });
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(holder.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = holder.wait();
    if !ready {
        panic!(
            "a member's flock kept the daemon from starting\n{}",
            log_text()
        );
    }
    let woken = w.run(&w.acc.alice, &["wake", "rio"]);
    assert!(woken.status.success(), "{}", show(&woken));
    stop(&mut daemon);

    // No daemon: the member's wake and health say so, even while a member
    // holds the last daemon's alive.lock exclusively (its pid is gone).
    let woken = w.run(&w.acc.alice, &["wake", "rio"]);
    assert_eq!(woken.status.code(), Some(69), "{}", show(&woken));
    let spoof_ready = ready_file("spoof");
    let mut spoof = Command::new("runuser")
        .args([
            "-u",
            &w.acc.bob,
            "--",
            "flock",
            "-x",
            "-n",
            ".daemon/alive.lock",
        ])
        .args(hold_then_sleep(&spoof_ready))
        .current_dir(&w.root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let spoofing = holds_the_lock(&mut spoof, &spoof_ready);
    let woken = w.run(&w.acc.alice, &["wake", "rio"]);
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(spoof.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = spoof.wait();
    assert!(spoofing, "a member holds the old .daemon/alive.lock");
    assert_eq!(woken.status.code(), Some(69), "{}", show(&woken));
    let health = w.run(&w.acc.alice, &["health", "--json"]);
    let seen: serde_json::Value = serde_json::from_slice(&health.stdout).unwrap_or_default();
    assert!(
        seen["level"] == "critical"
            && seen["line"]
                .as_str()
                .is_some_and(|l| l.contains("is not running")),
        "{}",
        show(&health)
    );
}

/// `runuser … daemon`, whose daemon (runuser's child) is killed if the
/// test ends before it was stopped.
pub(crate) struct Reaped(pub(crate) std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(Some(_))) {
            return;
        }
        let id = self.0.id();
        let children =
            std::fs::read_to_string(format!("/proc/{id}/task/{id}/children")).unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn heartbeat_pid(path: &std::path::Path) -> Option<i64> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["pid"].as_i64())
}

/// `sessions/{id}.owner` says whether a session's owner lives: held →
/// alive, for good (a held lock is believed past the session's timeout).
/// It was 0644 in the world-readable `sessions/`, so anyone who could read
/// the state root could wait in `flock -x` for a script's session to die
/// and then hold its lock: the dead session stayed "running" and the agent
/// never had another session. Now only the service user and root open it.
#[test]
fn a_reader_cannot_keep_a_dead_session_alive() {
    if !enabled("a_reader_cannot_keep_a_dead_session_alive") {
        return;
    }
    let w = World::new("o");
    let conf = w.config.display().to_string();
    let bin = w.bin.display().to_string();
    // A session script: begins its session, then is killed before its end.
    let mut script = Command::new("runuser")
        .args(["-u", &w.acc.svc, "--", "sh", "-c"])
        .arg(format!(
            "{bin:?} --config {conf:?} session begin rio >/dev/null && exec sleep 60"
        ))
        .current_dir(&w.root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let session_json = w.root.join("rio/session.json");
    let id = || {
        std::fs::read_to_string(&session_json)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .filter(|v| v["status"] == "running")
            .and_then(|v| v["session_id"].as_str().map(String::from))
    };
    let begun = poll_until(Duration::from_secs(20), || id().is_some());
    let kill_group = |child: &mut std::process::Child| {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.wait();
    };
    if !begun {
        kill_group(&mut script);
        panic!("the script's session did not begin");
    }
    let first = id().unwrap();
    let owner = format!("rio/sessions/{first}.owner");
    // Somebody outside the group waits for the owner lock...
    let mut holder = Command::new("runuser")
        .args(["-u", &w.acc.out, "--", "flock", "-x", "-w", "20", &owner])
        .args(["sleep", "20"])
        .current_dir(&w.root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    // Kept (both): the outsider waits (-w) for the lock and writes nothing
    // while it waits or is refused; these are its head starts.
    std::thread::sleep(Duration::from_millis(300));
    // ... the script dies without ending its session ...
    kill_group(&mut script);
    std::thread::sleep(Duration::from_millis(500));
    // ... and its next session begins: the dead one is recorded interrupted.
    let next = w.run(&w.acc.svc, &["session", "begin", "rio"]);
    // Refused, the outsider's flock exits at once with an error; had it
    // opened the file it would wait for the lock and then hold it (`sleep
    // 20`) past this bound. (On a busy machine `runuser` alone can take a
    // while: its exit is waited for, not assumed.)
    poll_until(Duration::from_secs(15), || {
        !matches!(holder.try_wait(), Ok(None))
    });
    let holding = match holder.try_wait() {
        Ok(None) => true,
        Ok(Some(status)) => status.success(),
        Err(_) => false,
    };
    kill_group(&mut holder);
    assert!(
        next.status.success(),
        "a reader holding {owner} kept the dead session alive: {}",
        show(&next)
    );
    assert!(!holding, "a reader could open {owner}");
    assert_eq!(
        mode(&w.root.join(&owner)),
        0,
        "the dead session's owner lock is gone"
    );
    let second = id().expect("the next session runs");
    assert_ne!(second, first);
    assert_eq!(
        mode(&w.root.join(format!("rio/sessions/{second}.owner"))),
        0o600
    );
    // Another process than the one that began it (that `runuser` has exited,
    // but its owner keeper may not have seen it yet on a busy machine): the
    // session is named, as a script that lost $SESSION would.
    let ended = w.run(
        &w.acc.svc,
        &[
            "session",
            "end",
            "rio",
            "--session",
            &second,
            "--summary",
            "x",
        ],
    );
    assert!(ended.status.success(), "{}", show(&ended));
}
