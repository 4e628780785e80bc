//! A real OOM kill (seed 002's row, issue 22), where the host makes one safe
//! to cause: the session moves itself into a cgroup v1 memory cgroup of its
//! own, limited to 64 MiB without swap, and allocates 400 MiB; the kernel's
//! OOM killer ends it with SIGKILL and counts it in `/proc/vmstat`. Nothing
//! is faked: the daemon, outside any per-session cgroup, sees a SIGKILL it
//! did not send while the kernel's `oom_kill` count rose — `SESSION_OOM`,
//! retried, the concurrent-session limit lowered.
//!
//! Needs root (`AGENT_STATE_ROOT_TESTS=1`, set by `.ci/run`) and a cgroup v1
//! memory hierarchy (a hybrid host like this one); elsewhere it says
//! SKIPPED and why. (The cgroup v2 path, `memory.events`, is unit-tested;
//! sdbox's boxes have no memory controller.)

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Env, daemon_config};

/// A memory cgroup (v1) below this process's own, removed when dropped.
struct MemoryCgroup(PathBuf);

impl MemoryCgroup {
    /// `None` (said) where the host has no writable v1 memory hierarchy.
    fn make(limit: &str) -> Option<MemoryCgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let path = own.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        });
        let Some(path) = path else {
            eprintln!("SKIPPED: no cgroup v1 memory hierarchy on this host (cgroup v2 only)");
            return None;
        };
        let dir = PathBuf::from("/sys/fs/cgroup/memory")
            .join(path.trim_start_matches('/'))
            .join(format!("agent-state-oom-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        if let Err(e) = std::fs::create_dir(&dir) {
            eprintln!(
                "SKIPPED: cannot make the memory cgroup {}: {e}",
                dir.display()
            );
            return None;
        }
        let cg = MemoryCgroup(dir);
        std::fs::write(cg.0.join("memory.limit_in_bytes"), limit).unwrap();
        // No swap: the limit is reached, not swapped around.
        let _ = std::fs::write(cg.0.join("memory.swappiness"), "0");
        let _ = std::fs::write(cg.0.join("memory.memsw.limit_in_bytes"), limit);
        Some(cg)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..200 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

fn records(env: &Env, code: &str) -> Vec<Value> {
    let out = env.ok(&["errors", "--json"]);
    serde_json::from_str::<Vec<Value>>(&out)
        .expect("errors --json")
        .into_iter()
        .filter(|r| r["code"] == code)
        .collect()
}

#[test]
fn a_session_the_kernels_oom_killer_ends_is_session_oom_and_retried() {
    let root = std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() == Ok("1")
        && nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("SKIPPED: makes a memory cgroup; runs as root with AGENT_STATE_ROOT_TESTS=1");
        return;
    }
    let Some(cg) = MemoryCgroup::make("64M") else {
        return;
    };
    let env = Env::with_config("");
    let runs = env.tmp("runs");
    let script = env.script(
        "agent.sh",
        &format!(
            r#"cat > /dev/null
echo run >> {runs:?}
if [ "$(wc -l < {runs:?})" -eq 1 ]; then
  echo "allocating 400 MiB under a 64 MiB limit"
  echo $$ > {procs:?}
  exec python3 -c "x = b'a' * (400 << 20); print(len(x))"
fi
echo "done""#,
            runs = runs.display().to_string(),
            procs = cg.0.join("cgroup.procs").display().to_string(),
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[
            ("max_concurrent_sessions", "2"),
            ("oom_lower_for", "\"1h\""),
        ],
        &[("retry_delay", "\"300ms\""), ("max_backoff", "\"1h\"")],
        "[[agent]]\nname = \"rio\"\n",
    ));
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(60), "rio's retry completed", || {
        env.events("rio", "session_end")
            .iter()
            .any(|e| e["outcome"] == "completed")
    });
    let errors = env.events("rio", "error");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["code"], "SESSION_OOM", "{}", errors[0]);
    let oom = records(&env, "SESSION_OOM");
    assert_eq!(oom.len(), 1, "{oom:?}");
    assert!(
        oom[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("OOM killer")),
        "{}",
        oom[0]
    );
    assert!(records(&env, "SESSION_FAILED").is_empty());
    let lowered = d.heartbeat()["concurrency_lowered"].clone();
    assert_eq!(lowered["limit"], 1, "{lowered}");
}
