//! bench/cluster: a real three-server nats-server cluster on 127.0.0.1 and
//! real `agent-state worker` processes; this program plays the controller
//! with the cluster crate. Run through `bench/cluster/run.sh`.
//!
//! Environment: AGENT_STATE_BIN (the agent-state binary, required),
//! AGENT_STATE_NATS_SERVER or `nats-server` on PATH; QUICK=1 for small
//! sizes; DISPATCH_N, RATE_N, STREAMS, STREAM_LINES to change them;
//! LEADER_KILL=0 skips the NATS leader's kill, CONTROLLER_RESTART=0 the
//! controller restart (the real daemon).
//!
//! Figures (printed as `figure NAME VALUE UNIT` lines for run.sh):
//! - dispatch: one order at a time, from just before `Dispatch::publish`
//!   to the session's first line (`$EPOCHREALTIME` written to a file by
//!   the session's bash script), same host and clock;
//! - the dispatch floor: the same path bare in this process
//!   (`cluster_bench/floor.rs`);
//! - sessions/s through one, then two workers: RATE_N orders for distinct
//!   agents published at once, until the last end is seen;
//! - output latency with STREAMS concurrent sessions, each printing
//!   `$EPOCHREALTIME` lines every 50 ms: the line's time until a
//!   subscriber of the output stream's subjects has the chunk;
//! - worker lost: SIGKILL the worker running an agent's session, fence its
//!   lease as the controller does at its deadline, dispatch that agent again:
//!   time from the fence to the new session's start on the other worker;
//! - NATS stream leader killed: time from the SIGKILL of the server leading
//!   the dispatch stream until an order published (retried) runs;
//! - controller restart: the real daemon SIGKILLed while its session runs
//!   on a worker, until the next one follows it again
//!   (`cluster_bench/restart.rs`).
//!
//! Every wait is bounded: a session that never starts or ends fails the run.

#[path = "cluster_bench/floor.rs"]
mod floor;
#[path = "cluster_bench/restart.rs"]
mod restart;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agent_state_cluster::{Dispatch, LeaseTiming, SessionEnd, SessionOrder};
use futures_util::StreamExt;
use support::{NatsCluster, find_server};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(60);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub(crate) fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// utime + stime of `pid` in seconds (0 when gone).
fn cpu_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(after) = stat.rsplit_once(") ").map(|(_, a)| a) else {
        return 0.0;
    };
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

struct Worker {
    host: String,
    child: Option<Child>,
}

impl Worker {
    fn start(bin: &Path, config: &Path, dir: &Path, host: &str, slots: usize) -> Worker {
        let log = dir.join(format!("worker-{host}.log"));
        let file = std::fs::File::create(&log).unwrap();
        // Its own work directory (its spool), not the directory the bench
        // was started in.
        let work = dir.join(format!("work-{host}"));
        std::fs::create_dir_all(&work).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(config)
            .args(["worker", "--host", host, "--slots", &slots.to_string()])
            .arg("--work-dir")
            .arg(&work)
            .args(["--heartbeat", "1s"])
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        Worker {
            host: host.into(),
            child: Some(child),
        }
    }
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Bench {
    dir: PathBuf,
    script: PathBuf,
    dispatch: Dispatch,
    ends: mpsc::UnboundedReceiver<SessionEnd>,
    seen_ends: HashSet<String>,
    lines: mpsc::UnboundedReceiver<f64>,
}

impl Bench {
    fn order(&self, id: &str, agent: &str, lines: usize, sleep: &str) -> SessionOrder {
        SessionOrder {
            session_id: id.into(),
            agent: agent.into(),
            credential_group: "default".into(),
            spec: serde_json::json!({
                "command": self.script.to_str().unwrap(),
                "env": { "BENCH_DIR": self.dir.to_str().unwrap(), "LINES_N": lines.to_string(), "HOLD": sleep },
                "cwd": self.dir.to_str().unwrap(),
                "timeout_secs": 300,
                "kill_grace_secs": 1,
            }),
        }
    }

    fn started_at(&self, id: &str) -> Option<f64> {
        std::fs::read_to_string(self.dir.join(format!("start-{id}")))
            .ok()
            .and_then(|s| s.trim().replace(',', ".").parse().ok())
    }

    /// Waits (bounded) until every id in `ids` has ended.
    async fn wait_ends(&mut self, ids: &[String], what: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            if ids.iter().all(|id| self.seen_ends.contains(id)) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.ends.recv()).await {
                Ok(Some(end)) => {
                    self.seen_ends.insert(end.session_id);
                }
                _ => {
                    let missing: Vec<&String> = ids
                        .iter()
                        .filter(|i| !self.seen_ends.contains(*i))
                        .collect();
                    panic!(
                        "{what}: no end within {WAIT:?} for {} session(s), e.g. {:?}\n{}",
                        missing.len(),
                        missing.first(),
                        worker_logs(&self.dir)
                    );
                }
            }
        }
    }

    async fn wait_started(&self, id: &str, what: &str) -> f64 {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(t) = self.started_at(id) {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: session {id} never started\n{}",
                worker_logs(&self.dir)
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The last lines of each worker's log, for a failure's message.
fn worker_logs(dir: &Path) -> String {
    let mut out = String::new();
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    logs.sort();
    for log in logs {
        let name = log.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("worker-") {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out.push_str(&format!("--- {name}\n"));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}

fn quantiles(name: &str, unit: &str, mut v: Vec<f64>) {
    assert!(!v.is_empty(), "{name}: no samples");
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    println!("figure {name}_p50 {:.3} {unit}", at(0.5));
    println!("figure {name}_p99 {:.3} {unit}", at(0.99));
    println!("figure {name}_max {:.3} {unit}", v[v.len() - 1]);
    println!("samples {name} {}", v.len());
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::var("QUICK").as_deref() == Ok("1");
    let bin = PathBuf::from(std::env::var("AGENT_STATE_BIN").expect("set AGENT_STATE_BIN"));
    let dispatch_n = env_usize("DISPATCH_N", if quick { 20 } else { 200 });
    let rate_n = env_usize("RATE_N", if quick { 20 } else { 200 });
    let streams = env_usize("STREAMS", if quick { 10 } else { 40 });
    let stream_lines = env_usize("STREAM_LINES", if quick { 10 } else { 60 });
    let slots = streams.div_ceil(2).max(4);

    let server = find_server();
    let mut nats = NatsCluster::start(&server, 3);
    let settings = nats.settings();
    let (cluster, dispatch, leases) = nats
        .connect(&settings, "bench-controller", LeaseTiming::DEFAULT)
        .await;
    let output = cluster.output().await.expect("the output stream");
    let _ = output;
    println!(
        "nats-server {:?}, 3 servers, replicas 3; agent-state {}",
        support::server_version(&server),
        bin.display()
    );

    let dir = nats.dir.path().join("bench");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("session.sh");
    std::fs::write(
        &script,
        "#!/bin/bash\necho \"$EPOCHREALTIME\" > \"$BENCH_DIR/start-$AGENT_STATE_SESSION_ID\"\n\
         for ((i = 0; i < LINES_N; i++)); do echo \"T $EPOCHREALTIME\"; sleep 0.05; done\n\
         [ \"$HOLD\" = 0 ] || sleep \"$HOLD\"\n",
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
            "state_root = {:?}\n[cluster]\nurls = {:?}\nreplicas = 3\n",
            dir.join("state").display().to_string(),
            settings.urls
        ),
    )
    .unwrap();

    // The reader: a subscriber of the output stream's subjects (ends and
    // chunks), as a controller's live view would be.
    let (end_tx, ends) = mpsc::unbounded_channel();
    let (line_tx, lines) = mpsc::unbounded_channel();
    let mut sub = cluster
        .client()
        .subscribe(format!("{}.>", settings.output_stream))
        .await
        .expect("subscribe to the output subjects");
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            let seen = now_secs();
            if m.subject.contains(".end.") {
                if let Ok(end) = serde_json::from_slice::<SessionEnd>(&m.payload) {
                    let _ = end_tx.send(end);
                }
            } else {
                for l in String::from_utf8_lossy(&m.payload).lines() {
                    if let Some(t) = l.strip_prefix("T ").and_then(|t| t.parse::<f64>().ok()) {
                        let _ = line_tx.send((seen - t) * 1000.0);
                    }
                }
            }
        }
    });
    let mut b = Bench {
        dir: dir.clone(),
        script,
        dispatch,
        ends,
        seen_ends: HashSet::new(),
        lines,
    };
    let pids = |ws: &[&Worker]| -> Vec<u32> { ws.iter().filter_map(|w| w.pid()).collect() };
    let nats_pids: Vec<u32> = nats.nodes.iter().filter_map(|n| n.pid()).collect();
    let cpu = |p: &[u32]| -> f64 { p.iter().map(|&p| cpu_of(p)).sum() };

    // ---- one worker: warm-up, dispatch latency, sessions/s ----
    let mut w1 = Worker::start(&bin, &config, &dir, "w1", slots);
    let warm: Vec<String> = (0..3).map(|i| format!("warm-{i}")).collect();
    for id in &warm {
        b.dispatch.publish(&b.order(id, id, 0, "0")).await.unwrap();
    }
    b.wait_ends(&warm, "warm-up").await;

    let (c_w, c_n) = (cpu(&pids(&[&w1])), cpu(&nats_pids));
    let mut lat = Vec::new();
    for i in 0..dispatch_n {
        let id = format!("d-{i}");
        let t0 = now_secs();
        b.dispatch
            .publish(&b.order(&id, &format!("a{}", i % 50), 0, "0"))
            .await
            .unwrap();
        b.wait_ends(std::slice::from_ref(&id), "dispatch").await;
        lat.push((b.started_at(&id).expect("start file") - t0) * 1000.0);
    }
    quantiles("dispatch_ms", "ms", lat);
    println!(
        "figure dispatch_cpu_worker_ms_per_session {:.2} ms",
        (cpu(&pids(&[&w1])) - c_w) * 1000.0 / dispatch_n as f64
    );
    println!(
        "figure dispatch_cpu_nats_ms_per_session {:.2} ms",
        (cpu(&nats_pids) - c_n) * 1000.0 / dispatch_n as f64
    );

    // ---- the floor: the same path, bare, in this process ----
    let c_n = cpu(&nats_pids);
    let c_self = cpu_of(std::process::id());
    let floor = floor::run(&b.dispatch, &leases, &b.dir, &b.script, dispatch_n).await;
    quantiles("dispatch_floor_ms", "ms", floor.started);
    quantiles("dispatch_floor_in_hand_ms", "ms", floor.in_hand);
    quantiles("dispatch_floor_lease_ms", "ms", floor.leased);
    println!(
        "figure dispatch_floor_cpu_client_ms_per_session {:.2} ms",
        (cpu_of(std::process::id()) - c_self) * 1000.0 / dispatch_n as f64
    );
    println!(
        "figure dispatch_floor_cpu_nats_ms_per_session {:.2} ms",
        (cpu(&nats_pids) - c_n) * 1000.0 / dispatch_n as f64
    );

    // The worker that survives the worker-lost part, kept for the parts
    // after it (the NATS leader's kill needs one).
    let mut survivor: Option<Worker> = None;
    for (workers, tag) in [(1usize, "1w"), (2, "2w")] {
        let mut w2 = None;
        if workers == 2 {
            let w = Worker::start(&bin, &config, &dir, "w2", slots);
            let id = "warm-w2".to_string();
            // Until w2 has taken one, w1 alone answers: warm with enough.
            let ids: Vec<String> = (0..slots * 2).map(|i| format!("{id}-{i}")).collect();
            for i in &ids {
                b.dispatch.publish(&b.order(i, i, 0, "0.2")).await.unwrap();
            }
            b.wait_ends(&ids, "warm-up w2").await;
            w2 = Some(w);
        }
        let all: Vec<&Worker> = std::iter::once(&w1).chain(w2.as_ref()).collect();
        let (c_w, c_n) = (cpu(&pids(&all)), cpu(&nats_pids));
        let ids: Vec<String> = (0..rate_n).map(|i| format!("r{tag}-{i}")).collect();
        let t0 = Instant::now();
        for (i, id) in ids.iter().enumerate() {
            b.dispatch
                .publish(&b.order(id, &format!("r{i}"), 0, "0"))
                .await
                .unwrap();
        }
        b.wait_ends(&ids, "sessions/s").await;
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "figure sessions_per_s_{tag} {:.1} sessions/s",
            rate_n as f64 / secs
        );
        println!(
            "figure sessions_cpu_{tag}_workers_ms_per_session {:.2} ms",
            (cpu(&pids(&all)) - c_w) * 1000.0 / rate_n as f64
        );
        println!(
            "figure sessions_cpu_{tag}_nats_ms_per_session {:.2} ms",
            (cpu(&nats_pids) - c_n) * 1000.0 / rate_n as f64
        );
        if let Some(w) = w2 {
            // ---- output latency with two workers ----
            while b.lines.try_recv().is_ok() {}
            let ids: Vec<String> = (0..streams).map(|i| format!("o-{i}")).collect();
            for (i, id) in ids.iter().enumerate() {
                b.dispatch
                    .publish(&b.order(id, &format!("o{i}"), stream_lines, "0"))
                    .await
                    .unwrap();
            }
            b.wait_ends(&ids, "output streams").await;
            let mut v = Vec::new();
            while let Ok(x) = b.lines.try_recv() {
                v.push(x);
            }
            assert_eq!(
                v.len(),
                streams * stream_lines,
                "output: lines seen by the reader"
            );
            quantiles(&format!("output_{streams}_streams_ms"), "ms", v);

            // ---- worker lost ----
            let id = "lost-1".to_string();
            b.dispatch
                .publish(&b.order(&id, "victim", 0, "600"))
                .await
                .unwrap();
            b.wait_started(&id, "worker lost").await;
            let rec = leases.current("victim").await.unwrap().expect("the lease");
            let mut w2 = w;
            let (victim, other) = if rec.value.holder == w1.host {
                (&mut w1, &w2.host)
            } else {
                (&mut w2, &w1.host)
            };
            victim.kill();
            println!(
                "killed {} (it held run/victim at revision {}); {other} remains",
                victim.host, rec.revision
            );
            // The controller fences at LeaseTiming::controller_fences after
            // the last renewal (300 s by default); the bench fences now.
            let t0 = now_secs();
            leases.fence("victim", rec.revision).await.unwrap();
            let id = "lost-2".to_string();
            b.dispatch
                .publish(&b.order(&id, "victim", 0, "0"))
                .await
                .unwrap();
            let started = b.wait_started(&id, "after the fence").await;
            println!(
                "figure worker_lost_fence_to_rerun_ms {:.1} ms",
                (started - t0) * 1000.0
            );
            println!(
                "figure worker_lost_fence_deadline {} s",
                LeaseTiming::DEFAULT.controller_fences.as_secs()
            );
            b.wait_ends(std::slice::from_ref(&id), "after the fence")
                .await;
            survivor = Some(w2);
            break;
        }
    }

    // Alive until the end (the worker that is not in `w1`, if w1 was lost).
    let _survivor = survivor;

    // ---- controller restart, the real daemon (CONTROLLER_RESTART=0 skips it) ----
    if std::env::var("CONTROLLER_RESTART").as_deref() != Ok("0") {
        let (bin, dir, urls) = (bin.clone(), dir.clone(), settings.urls.clone());
        let f = tokio::task::spawn_blocking(move || {
            restart::run(&bin, &dir, &urls, &|| worker_logs(&dir))
        })
        .await
        .expect("the controller restart part");
        println!(
            "figure controller_killed_to_adopted_ms {:.1} ms",
            f.adopted_ms
        );
        println!(
            "figure controller_killed_to_output_caught_up_ms {:.1} ms",
            f.caught_up_ms
        );
        println!(
            "figure controller_killed_to_live_output_ms {:.1} ms",
            f.live_ms
        );
    } else {
        println!("controller restart SKIPPED (CONTROLLER_RESTART=0)");
    }

    // ---- NATS leader killed (LEADER_KILL=0 skips it) ----
    if std::env::var("LEADER_KILL").as_deref() == Ok("0") {
        println!("leader kill SKIPPED (LEADER_KILL=0)");
        println!("bench done");
        return;
    }
    let mut info = cluster
        .jetstream()
        .get_stream(&settings.dispatch_stream)
        .await
        .unwrap();
    let leader = info
        .info()
        .await
        .unwrap()
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .expect("a stream leader");
    nats.kill(&leader);
    let t0 = now_secs();
    let id = "leader-1".to_string();
    let order = b.order(&id, "leaderless", 0, "0");
    let deadline = Instant::now() + WAIT;
    loop {
        match b.dispatch.publish(&order).await {
            Ok(_) => break,
            Err(e) => {
                assert!(Instant::now() < deadline, "publish after the leader: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    let started = b.wait_started(&id, "after the leader's kill").await;
    println!(
        "figure leader_killed_to_dispatch_ms {:.1} ms (stream leader {leader})",
        (started - t0) * 1000.0
    );
    b.wait_ends(std::slice::from_ref(&id), "after the leader's kill")
        .await;
    println!("bench done");
}
