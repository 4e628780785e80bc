//! The worker's own keeping of a session (issue 24): stall detection, a
//! cgroup per session, and the output spool, through the real controller
//! daemon, a real `agent-state worker` and a real three-server NATS
//! cluster. Gated like `cluster_executor`: `AGENT_STATE_NATS_TESTS=1`,
//! else SKIPPED. The cgroup test also needs a cgroup v2 hierarchy it can
//! make a cgroup in (root here): else it says SKIPPED.

use crate::support::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cluster_executor::{log_of, nats, session};
use crate::cluster_worker::Worker;

/// A controller config running `script_body` on the workers, with
/// `defaults` added to `[defaults]`.
fn env_with(servers: &nats::NatsCluster, script_body: &str, defaults: &[(&str, &str)]) -> Env {
    let env = Env::with_config("");
    let script = env.script("agent.sh", script_body);
    let agents = "[[agent]]\nname = \"rio\"\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n";
    let mut all = vec![("wake_on_inbox", "\"never\"")];
    all.extend_from_slice(defaults);
    let config = daemon_config(&script, &[], &all, agents);
    env.set_config(&format!(
        "{config}\n[cluster]\nurls = {:?}\nreplicas = 3\nlocal_sessions = false\ndispatch_timeout = \"60s\"\n",
        servers.urls()
    ));
    env.ok(&["bootstrap"]);
    env
}

fn spool_files(env: &Env, host: &str) -> Vec<PathBuf> {
    std::fs::read_dir(env.tmp(&format!("worker-{host}/spool")))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// A session that prints, then nothing for its stall timeout (2 s, stall
/// action stop): the worker ends it, its end says stalled, and the
/// controller records what a local stall stop records: `stalled: no output
/// for 2s`, SESSION_STALLED. Its spool file is gone once its end is stored.
#[test]
fn a_silent_remote_session_is_ended_as_a_stall() {
    let Some(binary) = nats::server_binary("cluster_worker_runtime") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let env = env_with(
        &servers,
        "echo before\nexec sleep 1000",
        &[
            ("stall_timeout", "\"2s\""),
            ("stall_action", "\"stop\""),
            ("timeout", "\"10m\""),
        ],
    );
    let worker = Worker::start(&env, "w1");
    worker.wait_registered();
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(90), "rio's session recorded", || {
        let s = session(&env, "rio");
        s["status"] != "running" && s["session_id"].is_string() && s["reason"].is_string()
    });
    let s = session(&env, "rio");
    assert_eq!(
        s["reason"].as_str().unwrap_or_default(),
        "stalled: no output for 2s",
        "{s:#}\n{}",
        worker.log()
    );
    let end = env.session_ends("rio");
    assert_eq!(end.last().unwrap()["code"], "SESSION_STALLED", "{end:#?}");
    assert!(log_of(&env, "rio").contains("before"));
    // The worker ended it, on its own timer.
    worker.wait_log("printed nothing for its stall timeout (2s); ending it");
    worker.wait_log("Stalled { silent_for_secs: 2 }");
    // Its spool file is gone (the stall is retried: the next session may
    // have its own by now).
    let order = format!("rio_{}", s["session_id"].as_str().unwrap());
    let spooled = env.tmp(&format!("worker-w1/spool/{order}.spool"));
    assert!(
        poll_until(Duration::from_secs(30), || !spooled.exists()),
        "the spool file stays after the end is stored: {:?}",
        spool_files(&env, "w1")
    );
}

/// A delegated cgroup v2 made for the test (the `user.delegate` mark
/// systemd's `Delegate=yes` sets), removed with what is in it when dropped.
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn make() -> Option<TestCgroup> {
        let root = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .iter()
            .map(Path::new)
            .find(|p| {
                p.join("cgroup.procs").exists() && p.join("cgroup.subtree_control").exists()
            })?;
        let dir = root.join(format!("agent-state-it-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        if !dir.join("cgroup.procs").exists() {
            return None;
        }
        let cg = TestCgroup(dir);
        let path = std::ffi::CString::new(cg.0.to_str()?).ok()?;
        // SAFETY: NUL-terminated strings and a one-byte value.
        let set = unsafe {
            nix::libc::setxattr(
                path.as_ptr(),
                c"user.delegate".as_ptr(),
                b"1".as_ptr().cast(),
                1,
                0,
            )
        };
        (set == 0).then_some(cg)
    }

    fn kill_all(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.path().is_dir() {
                    TestCgroup::kill_all(&e.path());
                }
            }
        }
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
        for _ in 0..200 {
            if std::fs::remove_dir(dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        TestCgroup::kill_all(&self.0);
    }
}

/// With a delegated cgroup, a session's child that left its process group
/// (`setsid`) dies at the session's timeout with the session's cgroup.
#[test]
fn an_escaped_child_dies_with_its_session_cgroup_at_the_timeout() {
    let Some(binary) = nats::server_binary("cluster_worker_runtime") else {
        return;
    };
    let Some(cg) = TestCgroup::make() else {
        eprintln!(
            "SKIPPED (LOUDLY): cannot make a delegated cgroup v2 here (not root, or no cgroup v2 hierarchy): the session cgroup kill is not tested"
        );
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let env = Env::with_config("");
    let pid_file = env.tmp("escaped.pid");
    let env = env_with(
        &servers,
        &format!(
            "setsid sh -c 'echo $$ > {p:?}.tmp && mv {p:?}.tmp {p:?}; exec sleep 1000' </dev/null >/dev/null 2>&1 &\necho started\nexec sleep 1000",
            p = pid_file
        ),
        &[("timeout", "\"3s\"")],
    );
    let procs = cg.0.join("cgroup.procs");
    let worker = Worker::start_adjusted(&env, "w1", &[], |command| {
        let procs = std::ffi::CString::new(procs.to_str().unwrap()).unwrap();
        // SAFETY: open, write and close only.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || {
                let fd = nix::libc::open(procs.as_ptr(), nix::libc::O_WRONLY);
                if fd >= 0 {
                    nix::libc::write(fd, b"0".as_ptr().cast(), 1);
                    nix::libc::close(fd);
                }
                Ok(())
            });
        }
    });
    worker.wait_registered();
    worker.wait_log("sessions run in cgroups of their own under");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    assert!(
        poll_until(Duration::from_secs(60), || pid_file.exists()),
        "the escaping child never started:\n{}",
        worker.log()
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    d.wait_until(Duration::from_secs(90), "rio's session recorded", || {
        session(&env, "rio")["status"] == "timeout"
    });
    assert!(
        poll_until(Duration::from_secs(20), || !process_alive(pid)),
        "the escaped child {pid} outlived its session:\n{}",
        worker.log()
    );
    worker.wait_log("killed 1 process(es) left in its cgroup");
}

/// The worker's link to NATS cut (its TCP proxy) while its session prints
/// 4 MB (more than a pipe and the worker's channels hold): the session
/// goes on printing (the spool takes it), and once the link is back every
/// line reaches the controller's log, in order; the spool file is gone
/// once the end is stored.
#[test]
fn output_printed_while_nats_is_cut_arrives_in_order_after() {
    let Some(binary) = nats::server_binary("cluster_worker_runtime") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let dir = tempfile::tempdir().unwrap();
    let (go1, printed, go2) = (
        dir.path().join("go1"),
        dir.path().join("printed"),
        dir.path().join("go2"),
    );
    const LINES: usize = 40_000;
    let pad = "x".repeat(88);
    let env = env_with(
        &servers,
        &format!(
            "echo before\nwhile [ ! -e {go1:?} ]; do sleep 0.05; done\ni=0\nwhile [ $i -lt {LINES} ]; do echo \"line $i {pad}\"; i=$((i+1)); done\ntouch {printed:?}\nwhile [ ! -e {go2:?} ]; do sleep 0.05; done\necho after"
        ),
        &[("timeout", "\"10m\"")],
    );
    let ports: Vec<u16> = servers.nodes.iter().map(|n| n.port).collect();
    let proxy = crate::cluster_chaos::Proxy::start(ports);
    let text = std::fs::read_to_string(&env.config).unwrap();
    let urls_line = format!("urls = {:?}", servers.urls());
    assert!(text.contains(&urls_line));
    let worker_config = env.tmp("worker-w1.toml");
    std::fs::write(
        &worker_config,
        text.replace(
            &urls_line,
            &format!("urls = [\"nats://127.0.0.1:{}\"]", proxy.port),
        ),
    )
    .unwrap();
    let worker = Worker::start_configured(&env, &worker_config, "w1", &[], |_| {});
    worker.wait_registered();
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(90), "rio prints on the worker", || {
        log_of(&env, "rio").contains("before")
    });
    proxy.cut();
    std::fs::write(&go1, "").unwrap();
    // The session printed all of it with NATS unreachable.
    assert!(
        poll_until(Duration::from_secs(60), || printed.exists()),
        "the session blocked on its output while NATS was cut:\n{}",
        worker.log()
    );
    worker.wait_log("its output stays in its spool");
    let spooled: u64 = spool_files(&env, "w1")
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    assert!(spooled > 1 << 20, "{spooled} bytes spooled");
    proxy.restore();
    std::fs::write(&go2, "").unwrap();
    d.wait_until(Duration::from_secs(120), "rio's session completed", || {
        session(&env, "rio")["status"] == "completed"
    });
    worker.wait_log("NATS stores its output again");
    let log = log_of(&env, "rio");
    let lines: Vec<&str> = log.lines().filter(|l| l.starts_with("line ")).collect();
    assert_eq!(lines.len(), LINES, "lines in the controller's log");
    for (i, l) in lines.iter().enumerate() {
        assert!(l.starts_with(&format!("line {i} ")), "line {i}: {l:?}");
    }
    assert!(log.contains("after"));
    assert!(
        poll_until(Duration::from_secs(30), || spool_files(&env, "w1")
            .is_empty()),
        "the spool file stays after the end is stored: {:?}",
        spool_files(&env, "w1")
    );
}

/// A worker SIGKILLed while its session runs, with output only in its
/// spool (its NATS link cut): started again (same host, same delegated
/// cgroup), it kills what is left of the session with its cgroup, renews
/// the session's lease, publishes the spooled output and the end
/// "interrupted: worker restarted", and removes the file.
#[test]
fn a_restarted_worker_stores_a_leftover_spool_under_its_lease() {
    let Some(binary) = nats::server_binary("cluster_worker_runtime") else {
        return;
    };
    let Some(cg) = TestCgroup::make() else {
        eprintln!(
            "SKIPPED (LOUDLY): cannot make a delegated cgroup v2 here (not root, or no cgroup v2 hierarchy): a restarted worker's spool recovery is not tested"
        );
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    let dir = tempfile::tempdir().unwrap();
    let (go1, printed) = (dir.path().join("go1"), dir.path().join("printed"));
    let env = env_with(
        &servers,
        &format!(
            "echo before\nwhile [ ! -e {go1:?} ]; do sleep 0.05; done\necho during-the-cut\ntouch {printed:?}\nexec sleep 1000"
        ),
        &[("timeout", "\"10m\"")],
    );
    let ports: Vec<u16> = servers.nodes.iter().map(|n| n.port).collect();
    let proxy = crate::cluster_chaos::Proxy::start(ports);
    let worker_config =
        crate::cluster_worker::config_through_proxy(&env, &servers, proxy.port, "w1");
    let procs = cg.0.join("cgroup.procs");
    let start = || {
        let procs = std::ffi::CString::new(procs.to_str().unwrap()).unwrap();
        Worker::start_configured(&env, &worker_config, "w1", &[], move |command| {
            // SAFETY: open, write and close only.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(command, move || {
                    let fd = nix::libc::open(procs.as_ptr(), nix::libc::O_WRONLY);
                    if fd >= 0 {
                        nix::libc::write(fd, b"0".as_ptr().cast(), 1);
                        nix::libc::close(fd);
                    }
                    Ok(())
                });
            }
        })
    };
    let mut first = start();
    first.wait_registered();
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(90), "rio prints on the worker", || {
        log_of(&env, "rio").contains("before")
    });
    proxy.cut();
    std::fs::write(&go1, "").unwrap();
    assert!(poll_until(Duration::from_secs(60), || printed.exists()));
    // The line is in the spool, not in the stream.
    assert!(
        poll_until(Duration::from_secs(30), || spool_files(&env, "w1")
            .iter()
            .any(|p| std::fs::read(p)
                .unwrap_or_default()
                .windows(14)
                .any(|w| w == b"during-the-cut"))),
        "{:?}\n{}",
        spool_files(&env, "w1"),
        first.log()
    );
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    proxy.restore();
    let second = start();
    second.wait_log("storing its spooled output and its end under its lease");
    d.wait_until(Duration::from_secs(90), "rio's session recorded", || {
        session(&env, "rio")["status"] == "error"
    });
    let s = session(&env, "rio");
    assert!(
        s["reason"]
            .as_str()
            .unwrap_or_default()
            .starts_with("interrupted: worker restarted: w1"),
        "{s:#}\n{}",
        second.log()
    );
    assert!(log_of(&env, "rio").contains("during-the-cut"));
    assert!(
        poll_until(Duration::from_secs(30), || spool_files(&env, "w1")
            .is_empty()),
        "{:?}",
        spool_files(&env, "w1")
    );
}
