//! The cluster's chaos test (issue 24): the real controller daemon
//! (`[cluster]`, `local_sessions = false`) runs bursts of sessions of ten
//! agents on two real `agent-state worker` processes, each reaching a real
//! three-server NATS JetStream cluster only through its own TCP proxy,
//! while one fault per round strikes:
//!
//! - a worker SIGKILLed, with its sessions (what systemd's control-group
//!   kill, or the host's death, does), and started again;
//! - a worker SIGSTOPped for 1–5 s, then SIGCONT (shorter than the
//!   controller's fence: a stopped worker cannot kill its session, so a
//!   pause past the fence is a second copy by design);
//! - a worker's proxy cut (every connection closed, new ones refused) for
//!   1–8 s, then restored;
//! - the NATS server leading the lease bucket SIGKILLed, started again 2–5 s
//!   later;
//! - with `AGENT_STATE_CHAOS_CONTROLLER=1` only: the controller daemon
//!   SIGKILLed and started again: the restarted controller adopts the
//!   remote sessions its `.daemon/remote.*` records name, follows their
//!   output from the stream and records their ends (an order it recorded
//!   but the servers never stored is published again).
//!
//! The lease times are shortened through the test-only variables
//! (`AGENT_STATE_TEST_WORKER_RENEWS` 1 s, `AGENT_STATE_TEST_WORKER_GIVES_UP`
//! 3 s, `AGENT_STATE_TEST_CONTROLLER_FENCES` 8 s; 10 s, 120 s and 300 s in
//! production: the same order). After each round, once nothing runs and
//! every message has left the inboxes, it checks:
//!
//! 1. no agent ever had two live sessions: the workers log each session's
//!    start and end with CLOCK_MONOTONIC (one clock: one machine); the
//!    intervals (from before the spawn to the group's SIGKILL after the
//!    child exited), merged, never overlap per agent (a killed worker's
//!    sessions end when the test has killed them);
//! 2. every `session_start` in an agent's journal has exactly one end
//!    (`session_end`, `error` or `timeout`) and every end a start;
//! 3. every message sent is in exactly one place (processed/ or rejected/;
//!    none left waiting or claimed);
//! 4. a session recorded as completed has the controller's log
//!    (`sessions/ID.log`) equal to what the script printed, line for line
//!    per pipe (the script keeps its own copy, named by its session id);
//! 5. every session ran: none timed out (a script runs at most 2 s of its
//!    30 s) or ended "not started" (the dispatch timeout is 60 s; an order
//!    a killed controller journaled and died before the servers stored is
//!    published again by the next one).
//!
//! Gated: `AGENT_STATE_NATS_TESTS=1` and `AGENT_STATE_CHAOS_ROUNDS=N`
//! (`.ci/run` sets both); else SKIPPED. `AGENT_STATE_CHAOS_SEED` replays a
//! run's faults (the seed is printed; the sessions' lengths are random);
//! `AGENT_STATE_CHAOS_FAULTS=kill-worker,stop-worker,cut-proxy,kill-leader,
//! kill-controller` picks the faults; `AGENT_STATE_CHAOS_VERBOSE=1` prints
//! each round's reasons and the workers' log lines.

#[path = "../../crates/cluster/tests/support/mod.rs"]
#[allow(clippy::duplicate_mod)]
mod nats;

use crate::support::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::Value;

const AGENTS: usize = 10;
/// Messages per round, one per session when the agent is free.
const BURST: usize = 40;
/// Slots per worker.
const SLOTS: usize = 4;
const RENEWS: &str = "1s";
const GIVES_UP: &str = "3s";
const FENCES: &str = "8s";
/// The longest a round may take to become quiet.
const QUIET_WITHIN: Duration = Duration::from_secs(240);

fn agent(i: usize) -> String {
    format!("a{i}")
}

fn monotonic_ns() -> u128 {
    Duration::from(
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC"),
    )
    .as_nanos()
}

/// xorshift: the faults' schedule, from a printed seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        let x = &mut self.0;
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x % n
    }
}

/// A TCP proxy to the NATS servers (the first that accepts, from
/// `first`; also `cluster_worker_runtime`'s): `cut` closes every connection and refuses new ones until
/// `restore`.
pub(crate) struct Proxy {
    pub(crate) port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    pub(crate) fn start(upstream: Vec<u16>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a proxy port");
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let (cut2, open2) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if cut2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Some(server) = upstream
                    .iter()
                    .find_map(|p| TcpStream::connect(("127.0.0.1", *p)).ok())
                else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                {
                    let mut open = open2.lock().unwrap();
                    open.retain(|s| s.peer_addr().is_ok());
                    open.push(client.try_clone().unwrap());
                    open.push(server.try_clone().unwrap());
                }
                // Cut while connecting: closed like the others.
                if cut2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    let _ = server.shutdown(Shutdown::Both);
                    continue;
                }
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, cut, open }
    }

    pub(crate) fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub(crate) fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// One session's life on a worker, from its log.
#[derive(Debug, Clone)]
struct Live {
    id: String,
    agent: String,
    host: String,
    pid: i32,
    from: u128,
    until: Option<u128>,
}

/// An `agent-state worker` process (each start a new log), behind its
/// proxy.
struct ChaosWorker {
    host: String,
    config: PathBuf,
    dir: PathBuf,
    child: Option<Child>,
    /// The logs of its runs, the last the current one's.
    logs: Vec<PathBuf>,
    /// Ends of the sessions of killed runs: (log, session) -> when the
    /// test had killed them.
    killed: HashMap<(usize, String), u128>,
    proxy: Proxy,
}

impl ChaosWorker {
    fn new(env: &Env, host: &str, body: &str, proxy: Proxy) -> ChaosWorker {
        let config = env.tmp(&format!("worker-{host}.toml"));
        std::fs::write(
            &config,
            format!(
                "state_root = {:?}\n{body}\n[cluster]\nurls = [\"nats://127.0.0.1:{}\"]\nreplicas = 3\nack_wait = \"5s\"\n",
                env.root.display().to_string(),
                proxy.port
            ),
        )
        .unwrap();
        let mut w = ChaosWorker {
            host: host.into(),
            config,
            dir: env.dir.path().to_path_buf(),
            child: None,
            logs: Vec::new(),
            killed: HashMap::new(),
            proxy,
        };
        w.start();
        w
    }

    fn start(&mut self) {
        let log = self
            .dir
            .join(format!("worker-{}-{}.log", self.host, self.logs.len()));
        let file = std::fs::File::create(&log).unwrap();
        let dir = self.dir.join(format!("worker-{}", self.host));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new(BIN)
            .current_dir(&dir)
            .args(["--config", self.config.to_str().unwrap()])
            .args(["worker", "--host", &self.host])
            .args(["--slots", &SLOTS.to_string(), "--heartbeat", "300ms"])
            .env_remove("AGENT_STATE_SESSION_ID")
            .env("AGENT_STATE_TEST_WORKER_RENEWS", RENEWS)
            .env("AGENT_STATE_TEST_WORKER_GIVES_UP", GIVES_UP)
            // Its hook sockets' directory in the test's, not /tmp.
            .env("XDG_RUNTIME_DIR", &dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start agent-state worker");
        self.child = Some(child);
        self.logs.push(log);
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.logs.last().unwrap()).unwrap_or_default()
    }

    fn wait_registered(&self) {
        let ok = poll_until(Duration::from_secs(90), || {
            self.log().contains("registered")
        });
        assert!(ok, "{} never registered:\n{}", self.host, self.log());
    }

    /// Every session of every run, from the logs.
    fn lives(&self) -> Vec<Live> {
        let mut out = Vec::new();
        for (n, path) in self.logs.iter().enumerate() {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let mut by_id: BTreeMap<String, Live> = BTreeMap::new();
            for line in text.lines() {
                let Some(rest) = line.strip_prefix("agent-state worker: session ") else {
                    continue;
                };
                let Some(ns) = rest
                    .rsplit_once(", monotonic ")
                    .and_then(|(_, ns)| ns.trim().parse::<u128>().ok())
                else {
                    continue;
                };
                // The process's end: its group gone (the end line comes
                // once its output is stored, which a cut delays).
                if let Some((id, _)) = rest.split_once(": its process group is gone")
                    && let Some(live) = by_id.get_mut(id)
                {
                    live.until = Some(ns);
                    continue;
                }
                let Some((id, rest)) = rest.split_once(" of ") else {
                    continue;
                };
                if let Some((agent, rest)) = rest.split_once(" started: pid ") {
                    let pid = rest
                        .split(',')
                        .next()
                        .and_then(|p| p.trim().parse().ok())
                        .unwrap_or(0);
                    by_id.insert(
                        id.to_string(),
                        Live {
                            id: id.to_string(),
                            agent: agent.to_string(),
                            host: format!("{} (run {n})", self.host),
                            pid,
                            from: ns,
                            until: None,
                        },
                    );
                } else if rest.contains(" ended: ")
                    && let Some(live) = by_id.get_mut(id)
                {
                    live.until.get_or_insert(ns);
                }
            }
            for (id, mut live) in by_id {
                if live.until.is_none() {
                    live.until = self.killed.get(&(n, id)).copied();
                }
                out.push(live);
            }
        }
        out
    }

    /// Sessions of the current run without an end line.
    fn running(&self) -> Vec<Live> {
        let current = format!("{} (run {})", self.host, self.logs.len() - 1);
        self.lives()
            .into_iter()
            .filter(|l| l.host == current && l.until.is_none())
            .collect()
    }

    /// SIGKILL, and its sessions with it (as systemd kills the unit's
    /// control group); their end is when they are gone.
    fn kill_all(&mut self) {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
        let run = self.logs.len() - 1;
        let open = self.running();
        for live in &open {
            if live.pid > 0 {
                let _ = killpg(Pid::from_raw(live.pid), Signal::SIGKILL);
            }
        }
        for live in &open {
            let gone = poll_until(Duration::from_secs(10), || !process_alive(live.pid));
            assert!(
                gone,
                "session {} (pid {}) outlived SIGKILL",
                live.id, live.pid
            );
            self.killed.insert((run, live.id.clone()), monotonic_ns());
        }
    }
}

impl Drop for ChaosWorker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
        for live in self.lives() {
            if live.until.is_none() && live.pid > 0 {
                let _ = killpg(Pid::from_raw(live.pid), Signal::SIGKILL);
            }
        }
        if std::thread::panicking() {
            for log in &self.logs {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                // An order held off by a lease repeats its line every few
                // seconds: the last three are kept, not forty of them.
                let mut held = 0;
                let tail: Vec<&str> = text
                    .lines()
                    .rev()
                    .filter(|l| {
                        if l.contains("the order goes back for") {
                            held += 1;
                            held <= 3
                        } else {
                            true
                        }
                    })
                    .take(40)
                    .collect();
                eprintln!("---- {} (last lines) ----", log.display());
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    KillWorker,
    StopWorker,
    CutProxy,
    KillNatsLeader,
    KillController,
}

/// A fault in progress: what ends it, and when.
enum Ongoing {
    Stopped(usize),
    Cut(usize),
    WorkerDown(usize),
    NodeDown(String),
}

/// What the journals said so far, per agent.
#[derive(Default)]
struct Journals {
    offsets: HashMap<String, usize>,
    starts: HashMap<String, usize>,
    /// session id -> its ending events.
    ends: HashMap<String, Vec<String>>,
    completed: HashSet<String>,
    outcomes: BTreeMap<String, usize>,
    /// Why sessions did not start, or were interrupted.
    reasons: HashSet<String>,
    /// Sessions that timed out or did not start, since the last round's
    /// check: session id -> reason.
    never_ran: BTreeMap<String, String>,
}

impl Journals {
    fn read(&mut self, env: &Env) {
        for i in 0..AGENTS {
            let a = agent(i);
            let text = std::fs::read_to_string(env.root.join(&a).join("journal.jsonl"))
                .unwrap_or_default();
            let offset = self.offsets.entry(a.clone()).or_default();
            let whole = text.rfind('\n').map_or(0, |i| i + 1);
            assert!(
                whole >= *offset,
                "{a}/journal.jsonl shrank (rotated?): the test reads one file"
            );
            for line in text[*offset..whole].lines() {
                let e: Value = serde_json::from_str(line)
                    .unwrap_or_else(|err| panic!("{a}/journal.jsonl line {line:?}: {err}"));
                let sid = format!("{a}/{}", e["session_id"].as_str().unwrap_or_default());
                match e["event"].as_str().unwrap_or_default() {
                    "session_start" => *self.starts.entry(sid).or_default() += 1,
                    event @ ("session_end" | "error" | "timeout") => {
                        let reason = e["reason"].as_str().unwrap_or_default();
                        let kind = if event == "session_end" {
                            self.completed.insert(sid.clone());
                            "completed".to_string()
                        } else if reason.contains("interrupted") {
                            self.reasons.insert(reason.to_string());
                            "interrupted".into()
                        } else if reason.contains("not started") {
                            self.reasons.insert(reason.to_string());
                            self.never_ran.insert(sid.clone(), reason.to_string());
                            "not started".into()
                        } else {
                            self.reasons.insert(format!("{event}: {reason}"));
                            if event == "timeout" {
                                self.never_ran.insert(sid.clone(), reason.to_string());
                            }
                            event.to_string()
                        };
                        *self.outcomes.entry(kind).or_default() += 1;
                        self.ends
                            .entry(sid)
                            .or_default()
                            .push(format!("{event} ({reason})"));
                    }
                    _ => {}
                }
            }
            *offset = whole;
        }
    }

    /// Invariant 2.
    fn check(&self, bad: &mut Vec<String>) {
        for (sid, n) in &self.starts {
            let ends = self.ends.get(sid).map_or(0, Vec::len);
            if *n != 1 || ends != 1 {
                bad.push(format!(
                    "2: session {sid}: {n} session_start, {ends} end(s): {:?}",
                    self.ends.get(sid)
                ));
            }
        }
        for (sid, ends) in &self.ends {
            if !self.starts.contains_key(sid) {
                bad.push(format!(
                    "2: session {sid} ended ({ends:?}) but never started"
                ));
            }
        }
    }
}

/// Invariant 1: per agent, no two intervals overlap.
fn overlaps(lives: &[Live], bad: &mut Vec<String>) {
    let mut by_agent: BTreeMap<&str, Vec<&Live>> = BTreeMap::new();
    for l in lives {
        by_agent.entry(&l.agent).or_default().push(l);
    }
    for (agent, mut ls) in by_agent {
        ls.sort_by_key(|l| l.from);
        let mut last: Option<&Live> = None;
        for l in ls {
            if let Some(prev) = last {
                let prev_end = prev.until.unwrap_or(u128::MAX);
                if l.from < prev_end {
                    bad.push(format!(
                        "1: agent {agent} had two live sessions: {} on {} until {:?} and {} on {} from {} ({} ms of overlap)",
                        prev.id,
                        prev.host,
                        prev.until,
                        l.id,
                        l.host,
                        l.from,
                        (prev_end.min(l.until.unwrap_or(u128::MAX)) - l.from) / 1_000_000
                    ));
                }
                if l.until.unwrap_or(u128::MAX) > prev_end {
                    last = Some(l);
                }
            } else {
                last = Some(l);
            }
        }
    }
}

/// Every message file of an agent's inbox, by id, with its place.
fn places(env: &Env, agent: &str, cache: &mut HashMap<PathBuf, String>) -> Vec<(String, String)> {
    let inbox = env.root.join(agent).join("inbox");
    let mut out = Vec::new();
    let mut add = |dir: PathBuf, place: String, cache: &mut HashMap<PathBuf, String>| {
        for name in list(&dir) {
            if name.starts_with('.') || !name.ends_with(".json") || name.ends_with(".reason.json") {
                continue;
            }
            let path = dir.join(&name);
            let stays = place == "processed" || place == "rejected";
            let id = match cache.get(&path) {
                Some(id) => id.clone(),
                None => {
                    let id = std::fs::read(&path)
                        .ok()
                        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                        .and_then(|v| v["id"].as_str().map(str::to_string))
                        .unwrap_or_else(|| name.trim_end_matches(".json").to_string());
                    if stays {
                        cache.insert(path.clone(), id.clone());
                    }
                    id
                }
            };
            out.push((id, place.clone()));
        }
    };
    add(inbox.clone(), "waiting".into(), cache);
    for sid in list(&inbox.join(".claimed")) {
        add(
            inbox.join(".claimed").join(&sid),
            format!("claimed by {sid}"),
            cache,
        );
    }
    add(inbox.join("processed"), "processed".into(), cache);
    add(inbox.join("rejected"), "rejected".into(), cache);
    out
}

/// The lines of one pipe (`out` or `err`) in `text`, in order.
fn pipe_lines<'a>(text: &'a str, pipe: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.split(' ').next() == Some(pipe))
        .collect()
}

/// The name of the server leading the lease bucket's stream.
fn lease_leader(rt: &tokio::runtime::Runtime, servers: &nats::NatsCluster) -> Option<String> {
    let settings = servers.settings();
    rt.block_on(async {
        let work = async {
            let cluster = agent_state_cluster::Cluster::connect(&settings, "chaos test")
                .await
                .ok()?;
            let mut stream = cluster
                .jetstream()
                .get_stream(format!("KV_{}", settings.lease_bucket))
                .await
                .ok()?;
            let info = stream.info().await.ok()?;
            info.cluster.as_ref().and_then(|c| c.leader.clone())
        };
        tokio::time::timeout(Duration::from_secs(10), work)
            .await
            .ok()
            .flatten()
    })
}

#[test]
fn sessions_survive_killed_stopped_and_cut_workers_and_a_killed_nats_leader() {
    let Some(binary) = nats::server_binary("cluster_chaos") else {
        return;
    };
    let Some(rounds) = std::env::var("AGENT_STATE_CHAOS_ROUNDS").ok().map(|r| {
        r.parse::<u64>()
            .unwrap_or_else(|_| panic!("AGENT_STATE_CHAOS_ROUNDS={r:?}: a number of rounds"))
    }) else {
        eprintln!(
            "SKIPPED cluster_chaos: set AGENT_STATE_CHAOS_ROUNDS=N (.ci/run sets it) to run N chaos rounds"
        );
        return;
    };
    let with_controller = std::env::var("AGENT_STATE_CHAOS_CONTROLLER").as_deref() == Ok("1");
    let seed: u64 = std::env::var("AGENT_STATE_CHAOS_SEED")
        .ok()
        .map(|s| s.parse().expect("AGENT_STATE_CHAOS_SEED: a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!(
        "cluster_chaos: seed {seed} (replay with AGENT_STATE_CHAOS_SEED={seed}), {rounds} round(s), controller kills {}",
        if with_controller { "on" } else { "off" }
    );
    let mut rng = Rng(seed | 1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let mut servers = nats::NatsCluster::start(&binary, 3);
    let env = Env::with_config("");
    std::fs::create_dir(env.tmp("copies")).unwrap();
    let script = env.script(
        "agent.sh",
        r#"copy="$(dirname "$0")/copies/${AGENT_STATE_AGENT}_$AGENT_STATE_SESSION_ID"
steps=$(( $(od -An -N2 -tu2 /dev/urandom) % 10 + 1 ))
i=1
while [ "$i" -le "$steps" ]; do
  echo "out $i $AGENT_STATE_SESSION_ID"
  echo "out $i $AGENT_STATE_SESSION_ID" >> "$copy"
  echo "err $i $AGENT_STATE_SESSION_ID" >&2
  echo "err $i $AGENT_STATE_SESSION_ID" >> "$copy"
  sleep 0.2
  i=$((i + 1))
done"#,
    );
    let mut agents = String::new();
    for i in 0..AGENTS {
        agents.push_str(&format!("[[agent]]\nname = \"{}\"\n", agent(i)));
    }
    agents.push_str("[[agent]]\nname = \"marcus\"\nkind = \"human\"\n");
    let body = daemon_config(
        &script,
        &[("max_concurrent_sessions", &(2 * SLOTS).to_string())],
        &[("retry_delay", "\"1s\""), ("max_backoff", "\"4s\"")],
        &agents,
    );
    env.set_config(&format!(
        "{body}\n[cluster]\nurls = {:?}\nreplicas = 3\nlocal_sessions = false\ndispatch_timeout = \"60s\"\nack_wait = \"5s\"\n",
        servers.urls()
    ));
    env.ok(&["bootstrap"]);
    let ports: Vec<u16> = servers.nodes.iter().map(|n| n.port).collect();
    let mut workers: Vec<ChaosWorker> = (0..2)
        .map(|w| {
            let mut upstream = ports.clone();
            upstream.rotate_left(w);
            ChaosWorker::new(&env, &format!("w{}", w + 1), &body, Proxy::start(upstream))
        })
        .collect();
    for w in &workers {
        w.wait_registered();
    }
    let daemon_vars = [("AGENT_STATE_TEST_CONTROLLER_FENCES", FENCES)];
    let mut d = Daemon::start(&env, &daemon_vars);

    let mut faults = vec![
        Fault::KillWorker,
        Fault::StopWorker,
        Fault::CutProxy,
        Fault::KillNatsLeader,
    ];
    if with_controller {
        faults.push(Fault::KillController);
    }
    // By hand: only some faults (`kill-worker,stop-worker,cut-proxy,
    // kill-leader,kill-controller`).
    if let Ok(only) = std::env::var("AGENT_STATE_CHAOS_FAULTS") {
        faults = only
            .split(',')
            .map(|f| match f.trim() {
                "kill-worker" => Fault::KillWorker,
                "stop-worker" => Fault::StopWorker,
                "cut-proxy" => Fault::CutProxy,
                "kill-leader" => Fault::KillNatsLeader,
                "kill-controller" => Fault::KillController,
                other => panic!("AGENT_STATE_CHAOS_FAULTS: no fault {other:?}"),
            })
            .collect();
    }
    let mut sent: Vec<(String, String)> = Vec::new();
    let mut journals = Journals::default();
    let mut id_cache = HashMap::new();
    let mut checked_logs: HashSet<String> = HashSet::new();
    let mut times = Vec::new();
    let mut printed: HashMap<PathBuf, usize> = HashMap::new();
    let started = Instant::now();
    for round in 0..rounds {
        let at = Instant::now();
        // Round-robin over an order shuffled anew for every cycle: each
        // fault once in every `faults.len()` rounds.
        if (round as usize).is_multiple_of(faults.len()) {
            for i in (1..faults.len()).rev() {
                faults.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        let fault = faults[round as usize % faults.len()];
        let fault_at = 4 + rng.below(BURST as u64 / 2) as usize;
        let which = rng.below(2) as usize;
        let mut ongoing: Option<(Ongoing, Instant)> = None;
        let mut what = String::new();
        let mut left: Vec<usize> = vec![BURST / AGENTS; AGENTS];
        let mut n_sent = 0usize;
        let burst_bound = Instant::now() + Duration::from_secs(120);
        while n_sent < BURST || ongoing.is_some() || what.is_empty() {
            // The fault strikes once `fault_at` messages are out and the
            // worker it aims at runs a session (or the burst is all out).
            let aimed = n_sent >= BURST || !workers[which].running().is_empty();
            if n_sent >= fault_at && aimed && what.is_empty() {
                let w = &mut workers[which];
                let there = w.running().len();
                what = match fault {
                    Fault::KillWorker => {
                        w.kill_all();
                        let down = 1 + rng.below(3);
                        ongoing = Some((
                            Ongoing::WorkerDown(which),
                            Instant::now() + Duration::from_secs(down),
                        ));
                        format!("SIGKILL {} and its sessions, {down} s down", w.host)
                    }
                    Fault::StopWorker => {
                        let secs = 1 + rng.below(5);
                        kill(w.pid(), Signal::SIGSTOP).unwrap();
                        ongoing = Some((
                            Ongoing::Stopped(which),
                            Instant::now() + Duration::from_secs(secs),
                        ));
                        format!("SIGSTOP {} for {secs} s", w.host)
                    }
                    Fault::CutProxy => {
                        let secs = 1 + rng.below(8);
                        w.proxy.cut();
                        ongoing = Some((
                            Ongoing::Cut(which),
                            Instant::now() + Duration::from_secs(secs),
                        ));
                        format!("cut {}'s proxy for {secs} s", w.host)
                    }
                    Fault::KillNatsLeader => {
                        let leader = lease_leader(&rt, &servers)
                            .unwrap_or_else(|| format!("n{}", 1 + rng.below(3)));
                        servers.kill(&leader);
                        let secs = 2 + rng.below(4);
                        ongoing = Some((
                            Ongoing::NodeDown(leader.clone()),
                            Instant::now() + Duration::from_secs(secs),
                        ));
                        format!(
                            "SIGKILL NATS server {leader} (the lease bucket's leader), {secs} s down"
                        )
                    }
                    Fault::KillController => {
                        d.kill9();
                        d = Daemon::start(&env, &daemon_vars);
                        "SIGKILL the controller, started again".to_string()
                    }
                };
                what.push_str(&format!(" ({there} session(s) on {})", workers[which].host));
            }
            if let Some((o, until)) = &ongoing
                && Instant::now() >= *until
            {
                match o {
                    Ongoing::Stopped(w) => kill(workers[*w].pid(), Signal::SIGCONT).unwrap(),
                    Ongoing::Cut(w) => workers[*w].proxy.restore(),
                    Ongoing::WorkerDown(w) => workers[*w].start(),
                    Ongoing::NodeDown(name) => {
                        servers.restart(name);
                        let port = servers.nodes.iter().find(|n| &n.name == name).unwrap().port;
                        let up = poll_until(Duration::from_secs(30), || {
                            TcpStream::connect(("127.0.0.1", port)).is_ok()
                        });
                        assert!(up, "{name} did not start again\n{}", servers.logs());
                    }
                }
                ongoing = None;
            }
            if n_sent < BURST {
                // The next message to each agent whose last one was
                // claimed: one session per message while the agent keeps up.
                let mut progressed = false;
                for (i, n) in left.iter_mut().enumerate() {
                    if *n == 0 || n_sent >= BURST {
                        continue;
                    }
                    if !env.waiting(&agent(i)).is_empty() && Instant::now() < burst_bound {
                        continue;
                    }
                    let id = env.send("marcus", &agent(i), &[]);
                    sent.push((agent(i), id));
                    *n -= 1;
                    n_sent += 1;
                    progressed = true;
                }
                if !progressed {
                    std::thread::sleep(Duration::from_millis(50));
                }
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
        }

        // Quiet: nothing runs, no message waits or is claimed, no worker
        // session is open.
        let mut last = String::new();
        let quiet = poll_until(QUIET_WITHIN, || {
            if !d.idle() {
                last = format!("daemon.json running: {}", d.heartbeat()["running"]);
                return false;
            }
            for i in 0..AGENTS {
                let a = agent(i);
                let busy: Vec<(String, String)> = places(&env, &a, &mut id_cache)
                    .into_iter()
                    .filter(|(_, p)| p != "processed" && p != "rejected")
                    .collect();
                if !busy.is_empty() {
                    last = format!("{a}: {busy:?}");
                    return false;
                }
            }
            for w in &workers {
                let open = w.running();
                if !open.is_empty() {
                    last = format!("{} runs {:?}", w.host, open);
                    return false;
                }
            }
            true
        });
        assert!(
            quiet,
            "round {round} (seed {seed}, fault: {what}): not quiet after {QUIET_WITHIN:?}: {last}"
        );

        // The invariants.
        let mut bad = Vec::new();
        let lives: Vec<Live> = workers.iter().flat_map(|w| w.lives()).collect();
        overlaps(&lives, &mut bad);
        let before = journals.starts.len();
        journals.read(&env);
        journals.check(&mut bad);
        let mut found: HashMap<String, Vec<String>> = HashMap::new();
        for i in 0..AGENTS {
            let a = agent(i);
            for (id, place) in places(&env, &a, &mut id_cache) {
                found.entry(format!("{a}/{id}")).or_default().push(place);
            }
        }
        for (a, id) in &sent {
            let at = found.get(&format!("{a}/{id}")).cloned().unwrap_or_default();
            if at.len() != 1 {
                bad.push(format!(
                    "3: message {id} to {a} is in {} places: {at:?}",
                    at.len()
                ));
            }
        }
        for sid in &journals.completed {
            if checked_logs.contains(sid) {
                continue;
            }
            let (a, s) = sid.split_once('/').unwrap();
            let log = std::fs::read_to_string(env.root.join(a).join(format!("sessions/{s}.log")))
                .unwrap_or_default();
            let copy =
                std::fs::read_to_string(env.tmp(&format!("copies/{a}_{s}"))).unwrap_or_default();
            for pipe in ["out", "err"] {
                if pipe_lines(&log, pipe) != pipe_lines(&copy, pipe) || copy.is_empty() {
                    bad.push(format!(
                        "4: session {sid} completed, but its log's {pipe} lines are not the script's:\nlog:\n{log}\nthe script's copy:\n{copy}"
                    ));
                }
            }
            checked_logs.insert(sid.clone());
        }
        if std::env::var("AGENT_STATE_CHAOS_VERBOSE").as_deref() == Ok("1") {
            for r in &journals.reasons {
                eprintln!("  why: {r}");
            }
            for w in &workers {
                for path in &w.logs {
                    let text = std::fs::read_to_string(path).unwrap_or_default();
                    let seen = printed.entry(path.clone()).or_insert(0);
                    for line in text
                        .lines()
                        .skip(*seen)
                        .filter(|l| !l.contains(" started: ") && !l.contains(" ended: Exited"))
                    {
                        eprintln!("  {}: {line}", w.host);
                    }
                    *seen = text.lines().count();
                }
            }
        }
        // 5. Every session ran: none timed out (a script runs at most 2 s
        // of its 30 s: a timeout is a session held off its workers, by a
        // lease left behind) and none ended "not started" (the dispatch
        // timeout is 60 s; a NATS server's death costs seconds; an order a
        // killed controller journaled and died before the servers stored
        // is published again by the next one from its kept copy). A session
        // recorded as not run whose script ran (its copy is there) is said
        // so.
        for (sid, reason) in std::mem::take(&mut journals.never_ran) {
            let (a, s) = sid.split_once('/').unwrap();
            let ran = env.tmp(&format!("copies/{a}_{s}")).exists();
            if ran {
                bad.push(format!(
                    "5: session {sid} is recorded as not run ({reason}), but its script ran"
                ));
            } else {
                bad.push(format!(
                    "5: session {sid} timed out or did not start though each runs at most 2 s: {reason}; all reasons so far: {:?}",
                    journals.reasons
                ));
            }
        }
        let secs = at.elapsed().as_secs_f64();
        times.push(secs);
        eprintln!(
            "round {round}: {what}; {} session(s), {secs:.1} s; outcomes so far {:?}",
            journals.starts.len() - before,
            journals.outcomes
        );
        assert!(
            bad.is_empty(),
            "round {round} (seed {seed}; replay with AGENT_STATE_CHAOS_SEED={seed}), fault {what}: {} violation(s):\n{}",
            bad.len(),
            bad.join("\n")
        );
        journals.reasons.clear();
    }
    let total = started.elapsed().as_secs_f64();
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    eprintln!(
        "cluster_chaos: {rounds} round(s) in {total:.0} s: {:.1} s per round (median {:.1}, max {:.1}); {} sessions, {} messages; outcomes {:?}",
        total / rounds.max(1) as f64,
        sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        sorted.last().copied().unwrap_or(0.0),
        journals.starts.len(),
        sent.len(),
        journals.outcomes
    );
    assert!(
        journals.outcomes.get("completed").copied().unwrap_or(0) > 0,
        "no session completed: {:?}",
        journals.outcomes
    );
    drop(d);
}
