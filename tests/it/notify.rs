//! The systemd notification protocol, against a real datagram socket: the
//! test binds a `UnixDatagram` as systemd would, runs the real daemon with
//! `NOTIFY_SOCKET` (and `WATCHDOG_USEC`) pointing at it, and reads what
//! arrives. READY=1 only once the inboxes are watched; STATUS= lines;
//! WATCHDOG=1 from the main loop (and none once the loop is stuck);
//! RELOADING=1 then READY=1 on SIGHUP; STOPPING=1 with EXTEND_TIMEOUT_USEC
//! while a session winds down on SIGTERM; and sessions never see the socket.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::json;

use crate::support::{Daemon, Env};

/// 200 ms: the daemon pings every 100 ms.
const WATCHDOG_USEC: &str = "200000";

/// The systemd end of the notification socket. A thread reads every
/// datagram as it comes (so the daemon never blocks on a full socket queue)
/// and hands it over with the time it arrived.
pub struct NotifySocket {
    path: PathBuf,
    rx: mpsc::Receiver<(Instant, String)>,
    /// Every datagram so far, in order of arrival.
    got: Vec<(Instant, String)>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl NotifySocket {
    pub fn bind(env: &Env) -> NotifySocket {
        let path = env.tmp("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("set a read timeout");
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                while !stop.load(Ordering::Relaxed) {
                    match socket.recv(&mut buf) {
                        Ok(n) => {
                            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                            if tx.send((Instant::now(), text)).is_err() {
                                break;
                            }
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) => {}
                        Err(_) => break,
                    }
                }
            })
        };
        NotifySocket {
            path,
            rx,
            got: Vec::new(),
            stop,
            reader: Some(reader),
        }
    }

    /// The environment that points the daemon at this socket.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("NOTIFY_SOCKET", self.path.display().to_string()),
            ("WATCHDOG_USEC", WATCHDOG_USEC.to_string()),
        ]
    }

    /// Take what has arrived; returns how many datagrams there are now.
    pub fn drain(&mut self) -> usize {
        while let Ok(d) = self.rx.try_recv() {
            self.got.push(d);
        }
        self.got.len()
    }

    /// Everything received so far, one datagram per paragraph, for failure
    /// messages (WATCHDOG=1 pings are counted, not listed).
    pub fn transcript(&mut self) -> String {
        self.drain();
        let pings = self.got.iter().filter(|(_, d)| is_ping(d)).count();
        let mut out = format!("{} datagrams ({pings} WATCHDOG=1 pings):\n", self.got.len());
        for (_, d) in self.got.iter().filter(|(_, d)| !is_ping(d)) {
            out.push_str(&format!("  {}\n", d.trim_end().replace('\n', " | ")));
        }
        out
    }

    /// Wait for the first datagram at index `from` or later that has the
    /// line `line` (`READY=1`) or, if `line` ends with `=`, a line starting
    /// with it (`STATUS=`); returns its index. Fails with the transcript.
    pub fn wait_for(&mut self, from: usize, line: &str, timeout: Duration) -> usize {
        self.wait_until(from, line, timeout, |d| has_line(d, line))
    }

    /// Wait for the first datagram at index `from` or later for which
    /// `pred` holds; returns its index. Fails naming `what`.
    pub fn wait_until(
        &mut self,
        from: usize,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            self.drain();
            if let Some(i) = (from..self.got.len()).find(|&i| pred(&self.got[i].1)) {
                return i;
            }
            if Instant::now() >= deadline {
                panic!(
                    "no datagram with {what} within {timeout:?} (looking from #{from})\n{}",
                    self.transcript()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn datagram(&self, i: usize) -> &str {
        &self.got[i].1
    }

    /// The value of `KEY=` in datagram `i`.
    fn field(&self, i: usize, key: &str) -> Option<String> {
        self.got[i]
            .1
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
    }

    /// Datagrams from index `from` on that have a line starting with `prefix`.
    fn with_line_from(&mut self, from: usize, prefix: &str) -> Vec<String> {
        self.drain();
        self.got[from.min(self.got.len())..]
            .iter()
            .filter(|(_, d)| d.lines().any(|l| l.starts_with(prefix)))
            .map(|(_, d)| d.clone())
            .collect()
    }

    /// WATCHDOG=1 pings that arrived in the next `window`.
    pub fn pings_during(&mut self, window: Duration) -> usize {
        let from = self.drain();
        std::thread::sleep(window);
        self.drain();
        self.got[from..].iter().filter(|(_, d)| is_ping(d)).count()
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        if std::thread::panicking() {
            eprintln!("---- notify socket ----\n{}", self.transcript());
        }
    }
}

fn has_line(datagram: &str, line: &str) -> bool {
    if line.ends_with('=') {
        datagram.lines().any(|l| l.starts_with(line))
    } else {
        datagram.lines().any(|l| l == line)
    }
}

/// The STATUS= text of a datagram, if it has one.
fn status_of(datagram: &str) -> Option<&str> {
    datagram.lines().find_map(|l| l.strip_prefix("STATUS="))
}

fn is_ping(datagram: &str) -> bool {
    datagram.trim_end() == "WATCHDOG=1"
}

/// rio runs `agent.sh`: it writes its environment to `env-SESSION`, touches
/// `running-SESSION`, then sleeps `nap` seconds. marcus is a mailbox.
fn setup(nap: f64, shutdown_grace: &str) -> Env {
    let env = Env::with_config("");
    let out = env.tmp("out");
    std::fs::create_dir(&out).expect("mkdir out");
    let script = env.script(
        "agent.sh",
        &format!(
            "echo at work\nenv > {out:?}/env-$AGENT_STATE_SESSION_ID\ntouch {out:?}/running-$AGENT_STATE_SESSION_ID\nsleep {nap}",
            out = out.display().to_string()
        ),
    );
    env.set_config(&config(&script, shutdown_grace, ""));
    env
}

fn config(script: &std::path::Path, shutdown_grace: &str, more_agents: &str) -> String {
    format!(
        r#"[daemon]
shutdown_grace = "{shutdown_grace}"

[defaults]
command = [{script:?}, "{{agent}}"]
timeout = "30s"
kill_grace = "2s"
wake_on_inbox = "any"
inbox_debounce = "100ms"

[[agent]]
name = "rio"

[[agent]]
name = "marcus"
kind = "human"
{more_agents}"#,
        script = script.display().to_string()
    )
}

fn start(env: &Env, notify: &NotifySocket, extra: &[(&str, &str)]) -> Daemon {
    let vars = notify.vars();
    let mut all: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.extend_from_slice(extra);
    Daemon::start(env, &all)
}

/// The environment a session's command saw.
fn session_env(env: &Env, session_id: &str) -> String {
    std::fs::read_to_string(env.tmp("out").join(format!("env-{session_id}")))
        .unwrap_or_else(|e| panic!("the agent wrote no env-{session_id}: {e}"))
}

fn session_status(env: &Env) -> String {
    std::fs::read_to_string(env.path("rio", "session.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|s| s["status"].as_str().map(str::to_string))
        .unwrap_or_default()
}

#[test]
fn ready_comes_once_the_inboxes_are_watched_and_sessions_never_see_the_socket() {
    let env = setup(0.5, "10s");
    let mut notify = NotifySocket::bind(&env);
    let d = start(&env, &notify, &[]);

    let ready = notify.wait_for(0, "READY=1", Duration::from_secs(10));
    // At READY the daemon has bootstrapped every agent (it was given a bare
    // config) and written its heartbeat: its watches and schedules are set.
    assert!(
        env.path("rio", "inbox").is_dir(),
        "rio's inbox exists at READY"
    );
    assert!(env.path("marcus", "inbox").is_dir());
    assert_eq!(d.heartbeat()["agents"], json!(["rio"]));
    assert!(
        notify.field(ready, "STATUS").is_some(),
        "READY=1 comes with a STATUS= line: {:?}",
        notify.datagram(ready)
    );
    assert_eq!(
        notify.with_line_from(0, "READY=1").len(),
        1,
        "one READY=1 at start\n{}",
        notify.transcript()
    );

    // A message renamed into the inbox after READY is seen by the watch (the
    // next full scan would be minutes away) and starts a session.
    let after_ready = notify.drain();
    let t0 = Instant::now();
    env.send("marcus", "rio", &["--priority", "high"]);
    d.wait_until(Duration::from_secs(5), "rio's session has begun", || {
        !session_status(&env).is_empty()
    });
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "the session started {:?} after the message",
        t0.elapsed()
    );
    let session_id = env.json("rio", "session.json")["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    // STATUS= names the running session while it runs.
    let busy = notify.wait_until(
        after_ready,
        "a STATUS= naming the running session",
        Duration::from_secs(5),
        |d| status_of(d).is_some_and(|s| s.contains("1 running (rio)")),
    );
    d.wait_until(Duration::from_secs(5), "the session has completed", || {
        session_status(&env) == "completed"
    });

    // The session's command never talks to systemd as if it were the daemon.
    let seen = session_env(&env, &session_id);
    for var in ["NOTIFY_SOCKET=", "WATCHDOG_USEC=", "WATCHDOG_PID="] {
        assert!(
            !seen.lines().any(|l| l.starts_with(var)),
            "the session saw {var}\n{seen}"
        );
    }
    assert!(
        seen.lines()
            .any(|l| l == format!("AGENT_STATE_SESSION_ID={session_id}")),
        "{seen}"
    );
    // Back to idle: STATUS= says so.
    notify.wait_until(
        busy + 1,
        "a STATUS= saying nothing runs",
        Duration::from_secs(5),
        |d| status_of(d).is_some_and(|s| s.contains(" 0 running")),
    );
}

#[test]
fn watchdog_pings_come_from_the_main_loop() {
    let env = setup(0.0, "10s");
    let mut notify = NotifySocket::bind(&env);
    let mut d = start(&env, &notify, &[("AGENT_STATE_TEST_STALL", "1")]);
    notify.wait_for(0, "READY=1", Duration::from_secs(10));

    // WATCHDOG_USEC=200000: a ping every 100 ms, half the interval.
    let pings = notify.pings_during(Duration::from_secs(1));
    assert!(
        (4..=15).contains(&pings),
        "{pings} WATCHDOG=1 pings in 1s with WATCHDOG_USEC={WATCHDOG_USEC}; expected about 10\n{}",
        notify.transcript()
    );

    // The test hook blocks the main loop: the pings stop, as they must for
    // systemd's watchdog to see a stuck daemon (a ping from a side thread
    // would keep a dead loop alive).
    d.signal(Signal::SIGUSR2);
    d.wait_until(Duration::from_secs(5), "the stall is logged", || {
        d.log_text().contains("blocking the main loop")
    });
    // Kept: a ping sent just before the stall may still be in flight; what
    // is measured is a window of wall time (the subject), not a state.
    std::thread::sleep(Duration::from_millis(150));
    let pings = notify.pings_during(Duration::from_secs(1));
    assert_eq!(pings, 0, "WATCHDOG=1 kept coming from a stalled main loop");
    assert!(d.is_running());
    d.kill9();
}

#[test]
fn sighup_sends_reloading_then_ready() {
    let env = setup(0.0, "10s");
    let mut notify = NotifySocket::bind(&env);
    let d = start(&env, &notify, &[]);
    notify.wait_for(0, "READY=1", Duration::from_secs(10));
    let before = notify.drain();

    let script = env.tmp("agent.sh");
    env.set_config(&config(&script, "10s", "\n[[agent]]\nname = \"clay\"\n"));
    d.signal(Signal::SIGHUP);
    let reloading = notify.wait_for(before, "RELOADING=1", Duration::from_secs(5));
    // systemd ≥ 253 (Type=notify-reload) wants the monotonic time with it.
    let usec = notify.field(reloading, "MONOTONIC_USEC");
    assert!(
        usec.as_deref().is_some_and(|u| u.parse::<u64>().is_ok()),
        "RELOADING=1 without MONOTONIC_USEC: {:?}",
        notify.datagram(reloading)
    );
    let ready = notify.wait_for(reloading, "READY=1", Duration::from_secs(5));
    assert!(ready > reloading);
    assert!(
        notify.with_line_from(before, "READY=1").len() == 1
            && notify.with_line_from(before, "RELOADING=1").len() == 1,
        "one RELOADING=1 and one READY=1 per SIGHUP\n{}",
        notify.transcript()
    );
    d.wait_until(Duration::from_secs(5), "clay is in daemon.json", || {
        d.heartbeat()["agents"] == json!(["clay", "rio"])
    });
    assert!(env.path("clay", "inbox").is_dir());
}

#[test]
fn sigterm_sends_stopping_and_extends_the_timeout_while_a_session_winds_down() {
    // shutdown_grace 10s and kill_grace 2s: systemd must wait at least 12s.
    let env = setup(1.5, "10s");
    let mut notify = NotifySocket::bind(&env);
    let mut d = start(&env, &notify, &[]);
    notify.wait_for(0, "READY=1", Duration::from_secs(10));

    let out = env.ok(&["wake", "rio", "--wait", "5s"]);
    let session_id = out.trim().to_string();
    assert!(!session_id.is_empty(), "wake --wait printed no session id");
    let running = env.tmp("out").join(format!("running-{session_id}"));
    d.wait_until(Duration::from_secs(5), "the agent is running", || {
        running.exists()
    });

    let before = notify.drain();
    let t0 = Instant::now();
    d.signal(Signal::SIGTERM);
    let stopping = notify.wait_for(before, "STOPPING=1", Duration::from_secs(5));
    let extend: u64 = notify
        .field(stopping, "EXTEND_TIMEOUT_USEC")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "STOPPING=1 without EXTEND_TIMEOUT_USEC while a session runs: {:?}",
                notify.datagram(stopping)
            )
        });
    assert!(
        extend >= 12_000_000,
        "EXTEND_TIMEOUT_USEC={extend} does not cover shutdown_grace 10s + kill_grace 2s"
    );
    let status = notify.field(stopping, "STATUS").unwrap_or_default();
    assert!(
        status.contains("stopping") && status.contains("1 session"),
        "STATUS= at STOPPING=1 says what it waits for: {status:?}"
    );

    // The daemon waits for the session (it ends by itself well within the
    // grace), records it, and exits 0 — what systemd counts as a clean stop.
    let exit = d.wait_exit(Duration::from_secs(15));
    assert_eq!(exit.code(), Some(0), "exit status after SIGTERM");
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "stopped after {:?}",
        t0.elapsed()
    );
    assert_eq!(session_status(&env), "completed");
    let report = env.json("rio", "report.json");
    assert_eq!(report["status"], "idle");
    assert_eq!(d.heartbeat()["running"], json!([]));
    assert!(
        notify.with_line_from(stopping + 1, "READY=1").is_empty(),
        "no READY=1 after STOPPING=1\n{}",
        notify.transcript()
    );
}

#[test]
fn a_large_start_asks_systemd_for_more_time_before_ready() {
    let env = setup(0.1, "5s");
    let script = env.tmp("agent.sh");
    let many: String = (0..150)
        .map(|i| format!("\n[[agent]]\nname = \"a{i:03}\"\n"))
        .collect();
    env.set_config(&config(&script, "5s", &many));
    let mut notify = NotifySocket::bind(&env);
    let daemon = start(&env, &notify, &[]);
    let ready = notify.wait_for(0, "READY=1", Duration::from_secs(60));
    let extend = notify.wait_until(0, "EXTEND_TIMEOUT_USEC=", Duration::from_secs(1), |d| {
        d.lines().any(|l| l.starts_with("EXTEND_TIMEOUT_USEC="))
    });
    assert!(
        extend < ready,
        "the extension comes before READY=1\n{}",
        notify.transcript()
    );
    let usec: u64 = notify
        .field(extend, "EXTEND_TIMEOUT_USEC")
        .unwrap()
        .parse()
        .unwrap();
    // 60 s plus 50 ms for each of the 151 agents and the mailbox.
    assert!(usec >= 60_000_000 + 150 * 50_000, "{usec}");
    assert!(env.agent("a149").join("inbox").is_dir());
    drop(daemon);
}
