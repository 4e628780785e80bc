//! Verification after a session (issue 12, seed 000's iteration loop): the
//! agent's `verify` commands run one after the other in its workspace, each
//! under its own timeout, their output appended to the session's log; the
//! first failure stops the rest. What failed becomes the next iteration's
//! feedback ([`feedback`], pure).
//!
//! A command runs without a shell (its argv as configured), with stdin
//! from /dev/null, in its own process group: a timeout kills the group
//! (TERM, then KILL after `kill_grace`), so a test runner's children go too.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;

use super::runner::Orders;

/// The bytes of a failed command's output kept for the feedback.
pub const TAIL_BYTES: usize = 4096;

/// What one verification command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandResult {
    pub argv: Vec<String>,
    /// The exit code (`None`: killed by a signal, timed out, or not started).
    pub code: Option<i32>,
    pub timed_out: bool,
    /// Why it could not be started (not found, not executable).
    pub spawn_error: Option<String>,
    pub duration: Duration,
    /// The last [`TAIL_BYTES`] of its output (stdout and stderr as they came).
    pub tail: String,
}

impl CommandResult {
    pub fn passed(&self) -> bool {
        self.code == Some(0) && !self.timed_out && self.spawn_error.is_none()
    }

    /// `cargo test: exit 101`, `make check: timed out after 10m`, ...
    pub fn describe(&self) -> String {
        let cmd = self.argv.join(" ");
        if let Some(e) = &self.spawn_error {
            return format!("{cmd}: could not start: {e}");
        }
        if self.timed_out {
            return format!(
                "{cmd}: timed out after {}",
                humantime::format_duration(Duration::from_secs(self.duration.as_secs()))
            );
        }
        match self.code {
            Some(c) => format!("{cmd}: exit {c}"),
            None => format!("{cmd}: killed by a signal"),
        }
    }
}

/// The verification of one iteration: every command run, in order, up to
/// the first that failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verification {
    pub results: Vec<CommandResult>,
    /// Ended by the daemon stopping (its command's group killed): not a
    /// verdict on the work.
    pub stopped: bool,
}

impl Verification {
    pub fn passed(&self) -> bool {
        self.results.iter().all(CommandResult::passed)
    }

    pub fn failure(&self) -> Option<&CommandResult> {
        self.results.iter().find(|r| !r.passed())
    }
}

/// How to run the commands.
#[derive(Debug, Clone)]
pub struct Plan {
    pub commands: Vec<Vec<String>>,
    pub cwd: PathBuf,
    pub timeout: Duration,
    pub kill_grace: Duration,
    pub env: Vec<(String, String)>,
    /// The session's log: each command's output is appended under a header.
    pub log: Option<PathBuf>,
    /// The session's orders: once they stop it, the running command's
    /// group is ended (TERM, then KILL after `kill_grace`) and nothing else
    /// runs.
    pub stop: Option<tokio::sync::watch::Receiver<Orders>>,
}

/// Run the plan's commands in order; stop at the first failure.
pub async fn run(plan: &Plan) -> Verification {
    let mut out = Verification::default();
    let mut stop = plan.stop.clone();
    for argv in &plan.commands {
        if stop.as_ref().is_some_and(|s| s.borrow().stop) {
            out.stopped = true;
            break;
        }
        let (result, stopped) = run_one(plan, argv, stop.as_mut()).await;
        let passed = result.passed();
        out.results.push(result);
        if stopped {
            out.stopped = true;
            break;
        }
        if !passed {
            break;
        }
    }
    out
}

/// Resolves once `stop` says stop (never without one).
async fn stopping(stop: Option<&mut tokio::sync::watch::Receiver<Orders>>) {
    match stop {
        Some(s) => {
            let _ = s.wait_for(|o| o.stop).await;
        }
        None => std::future::pending().await,
    }
}

async fn run_one(
    plan: &Plan,
    argv: &[String],
    mut stop: Option<&mut tokio::sync::watch::Receiver<Orders>>,
) -> (CommandResult, bool) {
    let mut stopped = false;
    let started = Instant::now();
    let mut result = CommandResult {
        argv: argv.to_vec(),
        code: None,
        timed_out: false,
        spawn_error: None,
        duration: Duration::ZERO,
        tail: String::new(),
    };
    let mut log = plan.log.as_deref().and_then(open_log);
    if let Some(f) = log.as_mut() {
        let _ = writeln!(f, "\n--- agent-state: verify: {} ---", argv.join(" "));
    }
    let Some((program, args)) = argv.split_first() else {
        result.spawn_error = Some("an empty command".into());
        return (result, false);
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(&plan.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for (k, v) in &plan.env {
        cmd.env(k, v);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            result.spawn_error = Some(format!("{program}: {e}"));
            if let Some(f) = log.as_mut() {
                let _ = writeln!(f, "could not start: {e}");
            }
            return (result, false);
        }
    };
    let pgid = child.id().map(|p| Pid::from_raw(p as i32));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    for stream in [
        child
            .stdout
            .take()
            .map(Box::new)
            .map(|s| s as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child
            .stderr
            .take()
            .map(Box::new)
            .map(|s| s as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut stream = stream;
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let mut tail: Vec<u8> = Vec::new();
    let mut keep = |chunk: &[u8], log: &mut Option<std::fs::File>| {
        if let Some(f) = log.as_mut() {
            let _ = f.write_all(chunk);
        }
        tail.extend_from_slice(chunk);
        if tail.len() > 2 * TAIL_BYTES {
            tail.drain(..tail.len() - TAIL_BYTES);
        }
    };
    let deadline = tokio::time::Instant::now() + plan.timeout;
    let mut output_open = true;
    let status = loop {
        tokio::select! {
            chunk = rx.recv(), if output_open => match chunk {
                Some(c) => keep(&c, &mut log),
                None => output_open = false,
            },
            status = child.wait() => break status.ok(),
            _ = stopping(stop.as_deref_mut()) => {
                stopped = true;
                if let Some(pg) = pgid {
                    let _ = killpg(pg, Signal::SIGTERM);
                }
                let status = match tokio::time::timeout(plan.kill_grace, child.wait()).await {
                    Ok(s) => s.ok(),
                    Err(_) => {
                        if let Some(pg) = pgid {
                            let _ = killpg(pg, Signal::SIGKILL);
                        }
                        child.wait().await.ok()
                    }
                };
                break status;
            }
            _ = tokio::time::sleep_until(deadline) => {
                result.timed_out = true;
                if let Some(pg) = pgid {
                    let _ = killpg(pg, Signal::SIGTERM);
                }
                let status = match tokio::time::timeout(plan.kill_grace, child.wait()).await {
                    Ok(s) => s.ok(),
                    Err(_) => {
                        if let Some(pg) = pgid {
                            let _ = killpg(pg, Signal::SIGKILL);
                        }
                        child.wait().await.ok()
                    }
                };
                break status;
            }
        }
    };
    // Whatever the group still prints goes too, then nothing is left of it.
    if let Some(pg) = pgid {
        let _ = killpg(pg, Signal::SIGKILL);
    }
    while let Ok(Some(c)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
        keep(&c, &mut log);
    }
    result.duration = started.elapsed();
    if !result.timed_out {
        result.code = status.and_then(|s| s.code());
    }
    let start = tail.len().saturating_sub(TAIL_BYTES);
    result.tail = String::from_utf8_lossy(&tail[start..]).into_owned();
    if let Some(f) = log.as_mut() {
        let what = if stopped {
            format!("{}: stopped (the daemon is stopping)", argv.join(" "))
        } else {
            result.describe()
        };
        let _ = writeln!(f, "\n--- agent-state: verify: {what} ---");
    }
    (result, stopped)
}

/// The session's log, appended to; never through a link (it is below the
/// state root).
fn open_log(path: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .ok()
}

/// The prompt section that tells the next iteration what failed: which
/// command, its exit, the tail of its output (quoted, as data), and how
/// many iterations are left. Pure.
pub fn feedback(v: &Verification, iteration: u32, max_iterations: u32) -> String {
    let Some(failed) = v.failure() else {
        return String::new();
    };
    let passed: Vec<String> = v
        .results
        .iter()
        .filter(|r| r.passed())
        .map(|r| format!("`{}`", r.argv.join(" ")))
        .collect();
    let mut text = format!(
        "## Verification feedback (iteration {iteration} of {max_iterations})\n\n\
         Your previous iteration ended, and its verification failed: `{}`.\n",
        failed.describe()
    );
    if !passed.is_empty() {
        text.push_str(&format!("Passed before it: {}.\n", passed.join(", ")));
    }
    let tail = failed.tail.trim_end();
    if !tail.is_empty() {
        let fence = if tail.contains("```") { "~~~~" } else { "```" };
        text.push_str(&format!(
            "\nThe end of its output:\n\n{fence}\n{tail}\n{fence}\n"
        ));
    }
    text.push_str(&format!(
        "\nFix what makes it fail, in the same workspace. {} iteration(s) left after this one.\n",
        max_iterations.saturating_sub(iteration)
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(dir: &Path, commands: &[&[&str]], timeout_ms: u64) -> Plan {
        Plan {
            commands: commands
                .iter()
                .map(|c| c.iter().map(|s| s.to_string()).collect())
                .collect(),
            cwd: dir.to_path_buf(),
            timeout: Duration::from_millis(timeout_ms),
            kill_grace: Duration::from_millis(300),
            env: vec![("VERIFY_MARK".into(), "x".into())],
            log: Some(dir.join("session.log")),
            stop: None,
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn commands_run_in_order_in_the_workspace_and_stop_at_the_first_failure() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("session.log"), "").unwrap();
        let p = plan(
            dir.path(),
            &[
                &["sh", "-c", "pwd; echo ok-$VERIFY_MARK"],
                &["sh", "-c", "echo failing test >&2; exit 3"],
                &["sh", "-c", "touch never-ran"],
            ],
            5000,
        );
        let v = rt().block_on(run(&p));
        assert!(!v.passed());
        assert_eq!(v.results.len(), 2, "{v:?}");
        assert!(v.results[0].passed());
        assert!(v.results[0].tail.contains("ok-x"));
        let cwd = dir.path().canonicalize().unwrap();
        assert!(v.results[0].tail.contains(cwd.to_str().unwrap()));
        let failed = v.failure().unwrap();
        assert_eq!(failed.code, Some(3));
        assert_eq!(
            failed.describe(),
            "sh -c echo failing test >&2; exit 3: exit 3"
        );
        assert!(failed.tail.contains("failing test"));
        assert!(!dir.path().join("never-ran").exists());
        let log = std::fs::read_to_string(dir.path().join("session.log")).unwrap();
        assert!(log.contains("--- agent-state: verify: sh -c pwd; echo ok-$VERIFY_MARK ---"));
        assert!(log.contains("failing test"));
        assert!(log.contains(": exit 3 ---"));
    }

    #[test]
    fn a_timeout_kills_the_whole_group_and_a_missing_program_is_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("child-survived");
        let script = format!(
            "(sleep 2; touch {}) & echo started; sleep 30",
            marker.display()
        );
        let p = plan(dir.path(), &[&["sh", "-c", &script]], 300);
        let v = rt().block_on(run(&p));
        let r = &v.results[0];
        assert!(r.timed_out && !r.passed(), "{r:?}");
        assert!(r.describe().contains("timed out"), "{}", r.describe());
        assert!(r.tail.contains("started"));
        assert!(r.duration < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(2500));
        assert!(
            !marker.exists(),
            "a child of the timed-out command lived on"
        );

        let p = plan(dir.path(), &[&["/nonexistent/verify"]], 1000);
        let v = rt().block_on(run(&p));
        assert!(!v.passed());
        assert!(v.results[0].spawn_error.is_some());
        assert!(v.results[0].describe().contains("could not start"));
    }

    #[test]
    fn a_stop_ends_the_running_command_and_runs_nothing_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = plan(
            dir.path(),
            &[
                &["sh", "-c", "echo started; sleep 30"],
                &["touch", "never-ran"],
            ],
            60_000,
        );
        let (tx, rx) = tokio::sync::watch::channel(Orders::default());
        p.stop = Some(rx);
        let started = std::time::Instant::now();
        let v = rt().block_on(async {
            let stopper = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                tx.send_modify(|o| o.stop = true);
                tx
            });
            let v = run(&p).await;
            drop(stopper.await);
            v
        });
        assert!(v.stopped, "{v:?}");
        assert_eq!(v.results.len(), 1);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the stop was not prompt"
        );
        assert!(!dir.path().join("never-ran").exists());
    }

    #[test]
    fn the_tail_is_bounded_and_feedback_names_the_command_exit_and_output() {
        let dir = tempfile::tempdir().unwrap();
        let p = plan(
            dir.path(),
            &[
                &["true"],
                &[
                    "sh",
                    "-c",
                    "yes line | head -n 5000; echo LAST LINE; exit 1",
                ],
            ],
            5000,
        );
        let v = rt().block_on(run(&p));
        let failed = v.failure().unwrap();
        assert!(failed.tail.len() <= TAIL_BYTES);
        assert!(failed.tail.trim_end().ends_with("LAST LINE"));
        let text = feedback(&v, 1, 3);
        assert!(text.starts_with("## Verification feedback (iteration 1 of 3)"));
        assert!(text.contains("exit 1"));
        assert!(text.contains("Passed before it: `true`."));
        assert!(text.contains("LAST LINE"));
        assert!(text.contains("2 iteration(s) left"));
        assert_eq!(feedback(&Verification::default(), 1, 3), "");
    }
}
