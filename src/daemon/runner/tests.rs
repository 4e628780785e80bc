//! The tests of `daemon::runner`: real processes from the fake agents of
//! `tests/fixtures/agents/` (exits, signals, timeouts, stalls, floods, escaped
//! grandchildren, spawn failures) and the sweep's process table reads.

use super::sweep::{ProcStat, is_dead, parse_stat, stat_of};
use super::*;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::time::Duration;

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/agents/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A spec running `sh fixture args...` with a log in `dir` and a marker
/// unique to this test.
fn spec(dir: &tempfile::TempDir, script: &str, args: &[&str]) -> SessionSpec {
    let mut argv = vec!["/bin/sh".to_string(), fixture(script)];
    argv.extend(args.iter().map(|a| a.to_string()));
    SessionSpec {
        argv,
        env: Vec::new(),
        env_remove: Vec::new(),
        cwd: dir.path().to_path_buf(),
        stdin: b"the prompt\n".to_vec(),
        log_path: dir.path().join("session.log"),
        iteration: 1,
        max_output: 1024 * 1024,
        timeout: Duration::from_secs(30),
        kill_grace: Duration::from_secs(5),
        stall_timeout: None,
        stall_action: StallAction::Warn,
        marker: (
            "AGENT_STATE_SESSION_ID".into(),
            format!("test/{}", uuid::Uuid::new_v4()),
        ),
        agent_stall_timeout: None,
        memory_max: None,
    }
}

/// Keeps everything it sees (the tests print little, except the flood).
#[derive(Default)]
struct Collect {
    seen: Vec<u8>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// `on_stall` calls: the silence, and how much output came before.
    stalls: Vec<(Duration, usize)>,
}

impl OutputObserver for Collect {
    fn on_output(&mut self, chunk: &[u8]) {
        self.seen.extend_from_slice(chunk);
    }
    fn on_stream_output(&mut self, stream: OutputStream, chunk: &[u8]) {
        match stream {
            OutputStream::Stdout => self.stdout.extend_from_slice(chunk),
            OutputStream::Stderr => self.stderr.extend_from_slice(chunk),
        }
        self.on_output(chunk);
    }
    fn on_stall(&mut self, silent_for: Duration) {
        self.stalls.push((silent_for, self.seen.len()));
    }
}

/// Counts bytes, keeps none.
#[derive(Default)]
struct Count(u64);

impl OutputObserver for Count {
    fn on_output(&mut self, chunk: &[u8]) {
        self.0 += chunk.len() as u64;
    }
}

fn no_stop() -> watch::Receiver<bool> {
    // The sender is dropped: a closed channel, no stop will come.
    watch::channel(false).1
}

async fn run_spec(spec: SessionSpec) -> (RunReport, Collect) {
    let mut seen = Collect::default();
    let report = run(spec, &mut seen, no_stop(), None).await;
    (report, seen)
}

fn log_of(spec: &SessionSpec) -> String {
    String::from_utf8_lossy(&std::fs::read(&spec.log_path).unwrap()).into_owned()
}

/// Alive means present and not a zombie (a killed process whose parent,
/// init here, has not reaped it yet is dead all the same).
fn alive(pid: i32) -> bool {
    stat_of(pid).is_some_and(|(state, _)| !is_dead(state))
}

/// The pid printed by a fixture on a line `label PID`.
fn printed_pid(output: &str, label: &str) -> i32 {
    output
        .lines()
        .find_map(|line| line.strip_prefix(label)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{label} PID` line in {output:?}"))
}

#[tokio::test]
async fn exit_zero_with_output_is_logged_and_observed() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(&dir, "exits.sh", &["0"]);
    let (pid_tx, pid_rx) = oneshot::channel();
    let mut seen = Collect::default();
    let report = run(spec.clone(), &mut seen, no_stop(), Some(pid_tx)).await;
    let pid_seen = pid_rx.await.ok();

    assert_eq!(report.ending, Ending::Exited { code: 0 });
    assert!(report.ending.is_success());
    assert!(report.pid.is_some());
    assert_eq!(
        pid_seen, report.pid,
        "the pid sent at spawn is the one in the report"
    );
    let log = log_of(&spec);
    assert!(
        log.contains("to stdout\n") && log.contains("to stderr\n"),
        "{log:?}"
    );
    assert_eq!(seen.stdout, b"to stdout\n");
    assert_eq!(seen.stderr, b"to stderr\n");
    assert_eq!(report.output_bytes, 20);
    assert_eq!(report.logged_bytes, 20);
    assert!(!report.truncated);
    assert_eq!(report.leftovers_killed, 0);
    assert_eq!(report.log_error, None);
}

#[tokio::test]
async fn an_existing_log_is_never_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(&dir, "exits.sh", &["0"]);
    std::fs::write(&spec.log_path, "another session's line\n").unwrap();
    let (report, _) = run_spec(spec.clone()).await;
    assert!(
        matches!(&report.ending, Ending::SpawnFailed { reason, .. } if reason.contains("session log")),
        "{:?}",
        report.ending
    );
    assert_eq!(log_of(&spec), "another session's line\n");
}

#[tokio::test]
async fn log_is_created_group_readable_only() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(&dir, "exits.sh", &["0"]);
    run_spec(spec.clone()).await;
    let mode = std::fs::metadata(&spec.log_path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode & !0o640, 0, "mode {mode:o} gives more than 0640");
}

#[tokio::test]
async fn nonzero_exit_code_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (report, _) = run_spec(spec(&dir, "exits.sh", &["3"])).await;
    assert_eq!(report.ending, Ending::Exited { code: 3 });
    assert_eq!(report.ending.to_string(), "exited with code 3");
}

#[tokio::test]
async fn death_by_signal_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (report, _) = run_spec(spec(&dir, "kills-itself.sh", &[])).await;
    assert_eq!(report.ending, Ending::Signaled { signal: 9 });
    assert_eq!(report.ending.to_string(), "killed by signal 9 (SIGKILL)");
}

#[tokio::test]
async fn silent_session_leaves_an_empty_log() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(&dir, "silent.sh", &[]);
    let (report, seen) = run_spec(spec.clone()).await;
    assert_eq!(report.ending, Ending::Exited { code: 0 });
    assert_eq!(report.output_bytes, 0);
    assert!(seen.seen.is_empty());
    assert_eq!(std::fs::metadata(&spec.log_path).unwrap().len(), 0);
}

#[tokio::test]
async fn the_group_is_swept_before_the_main_process_is_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "exits.sh", &[]);
    // The grandchild stays in the group but drops the marker with `env -i`:
    // only the group id finds it.
    spec.argv = [
        "/bin/sh",
        "-c",
        "env -i sleep 1000 & echo \"in-group $!\"; exit 0",
    ]
    .map(String::from)
    .to_vec();
    let (pid_tx, pid_rx) = oneshot::channel();
    let mut seen = Collect::default();
    let report = run(spec.clone(), &mut seen, no_stop(), Some(pid_tx)).await;
    let log = log_of(&spec);
    let main = pid_rx.await.unwrap() as i32;
    let grandchild = printed_pid(&log, "in-group");
    assert_eq!(report.ending, Ending::Exited { code: 0 }, "{log}");
    assert_eq!(report.leftovers_killed, 1, "{log}");
    assert!(!alive(grandchild), "the grandchild in the group is dead");
    // At the sweep's final killpg the main process was still a zombie: its
    // pid, the group id, not free for another process to take.
    assert_eq!(
        sweep::tests_hook::leader_state_at_sweep(main),
        Some(Some(b'Z')),
        "the main process {main} was reaped before the sweep"
    );
    assert_eq!(stat_of(main), None, "reaped after the sweep");
}

#[tokio::test]
async fn hung_session_times_out_with_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "hangs.sh", &[]);
    spec.timeout = Duration::from_secs(1);
    spec.kill_grace = Duration::from_secs(20);
    let (report, _) = run_spec(spec.clone()).await;
    assert_eq!(report.ending, Ending::TimedOut);
    // SIGTERM sufficed: well before the grace period would have ended.
    assert!(
        report.duration >= Duration::from_secs(1),
        "{:?}",
        report.duration
    );
    assert!(
        report.duration < Duration::from_secs(5),
        "{:?}",
        report.duration
    );
    assert!(log_of(&spec).contains("started"));
    let sleeper = printed_pid(&log_of(&spec), "sleeper");
    assert!(!alive(sleeper), "the group got SIGTERM, sleep included");
}

#[tokio::test]
async fn session_ignoring_sigterm_gets_sigkill_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "ignores-term.sh", &[]);
    spec.timeout = Duration::from_millis(500);
    spec.kill_grace = Duration::from_millis(700);
    let (report, _) = run_spec(spec.clone()).await;
    assert_eq!(report.ending, Ending::TimedOut);
    assert!(
        report.duration >= Duration::from_millis(1200),
        "{:?}",
        report.duration
    );
    assert!(
        report.duration < Duration::from_secs(5),
        "{:?}",
        report.duration
    );
    let main = report.pid.unwrap() as i32;
    let sleeper = printed_pid(&log_of(&spec), "sleeper");
    assert!(!alive(main) && !alive(sleeper));
}

#[tokio::test]
async fn escaped_grandchildren_are_killed() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(&dir, "escapes.sh", &[]);
    let started = Instant::now();
    let (report, _) = run_spec(spec.clone()).await;
    let log = log_of(&spec);
    assert_eq!(report.ending, Ending::Exited { code: 0 }, "{log}");
    let in_group = printed_pid(&log, "in-group");
    let escaped = printed_pid(&log, "escaped");
    assert_eq!(report.leftovers_killed, 2, "{log}");
    assert!(
        !alive(in_group),
        "the background process in the group is dead"
    );
    assert!(!alive(escaped), "the process that left with setsid is dead");
    // Both held the output pipe open; the run did not wait for them.
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn flood_is_capped_and_drained_without_growing_memory() {
    const FLOOD: u64 = 256 * 1024 * 1024;
    const CAP: u64 = 100 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "floods.sh", &[&FLOOD.to_string()]);
    spec.max_output = CAP;
    let rss_before = memory_kib("VmRSS:");
    let mut count = Count::default();
    let report = run(spec.clone(), &mut count, no_stop(), None).await;
    let peak_after = memory_kib("VmHWM:");

    // The flooder wrote everything and then exited by itself: it was
    // never blocked on a full pipe.
    assert_eq!(report.ending, Ending::Exited { code: 0 });
    assert!(report.truncated);
    assert_eq!(report.output_bytes, FLOOD + "done\n".len() as u64);
    assert_eq!(count.0, report.output_bytes, "the observer saw everything");
    assert_eq!(report.logged_bytes, CAP);
    let notice =
        format!("\n[agent-state: output truncated after {CAP} bytes; the rest was dropped]\n");
    let log = std::fs::read(&spec.log_path).unwrap();
    assert_eq!(log.len() as u64, CAP + notice.len() as u64);
    assert!(log.ends_with(notice.as_bytes()));
    // Memory stays bounded: nowhere near the 256 MiB that went through.
    assert!(
        peak_after < rss_before + 64 * 1024,
        "peak {peak_after} KiB, before {rss_before} KiB"
    );
}

#[tokio::test]
async fn stall_with_warn_tells_the_observer_once_per_silence_and_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "goes-quiet.sh", &["1.5", "1.5"]);
    spec.stall_timeout = Some(Duration::from_millis(500));
    let (report, seen) = run_spec(spec.clone()).await;
    let log = log_of(&spec);
    assert_eq!(report.ending, Ending::Exited { code: 0 }, "{log}");
    assert!(log.ends_with("after 1.5\n"), "{log}");
    // Two silences three times the stall timeout long: two calls, each
    // after some output (re-armed by it), none while the output flowed.
    assert_eq!(report.stalls, 2, "{log}");
    assert_eq!(seen.stalls.len(), 2, "{:?}", seen.stalls);
    let first_silence = "before\nsleeper ".len();
    let (silent_for, seen_before) = seen.stalls[0];
    assert_eq!(silent_for, Duration::from_millis(500));
    assert!(seen_before > first_silence, "{:?}", seen.stalls);
    assert!(seen.stalls[1].1 > seen_before, "{:?}", seen.stalls);
    assert!(report.duration >= Duration::from_secs(3));
}

#[tokio::test]
async fn stall_with_stop_terminates_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "goes-quiet.sh", &["1000"]);
    spec.stall_timeout = Some(Duration::from_millis(500));
    spec.stall_action = StallAction::Stop;
    spec.kill_grace = Duration::from_secs(20);
    let (report, seen) = run_spec(spec.clone()).await;
    let log = log_of(&spec);
    assert_eq!(
        report.ending,
        Ending::Stalled {
            silent_for: Duration::from_millis(500)
        },
        "{log}"
    );
    assert!(!report.ending.is_success());
    assert_eq!(report.ending.to_string(), "stalled: no output for 500ms");
    assert_eq!(report.stalls, 1);
    assert_eq!(seen.stalls.len(), 1);
    // SIGTERM sufficed, well before the grace would have ended.
    assert!(
        report.duration >= Duration::from_millis(500) && report.duration < Duration::from_secs(5),
        "{:?}",
        report.duration
    );
    assert!(!log.contains("after"), "{log}");
    assert!(
        !alive(printed_pid(&log, "sleeper")),
        "the group got SIGTERM"
    );
    assert!(!alive(report.pid.unwrap() as i32));
}

#[tokio::test]
async fn stall_before_any_output_counts_from_the_spawn() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "silent.sh", &[]);
    // Silent from the start, and never ending by itself.
    spec.argv = vec!["/bin/sh".into(), "-c".into(), "exec sleep 1000".into()];
    spec.stall_timeout = Some(Duration::from_millis(300));
    spec.stall_action = StallAction::Stop;
    let (report, seen) = run_spec(spec).await;
    assert_eq!(
        report.ending,
        Ending::Stalled {
            silent_for: Duration::from_millis(300)
        }
    );
    assert_eq!(seen.stalls, vec![(Duration::from_millis(300), 0)]);
    assert!(report.duration < Duration::from_secs(5));
}

#[tokio::test]
async fn regular_output_never_stalls() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "ticks.sh", &["10"]);
    spec.stall_timeout = Some(Duration::from_secs(1));
    spec.stall_action = StallAction::Stop;
    let (report, seen) = run_spec(spec.clone()).await;
    assert_eq!(
        report.ending,
        Ending::Exited { code: 0 },
        "{}",
        log_of(&spec)
    );
    assert!(log_of(&spec).ends_with("tick 9\n"));
    assert_eq!(report.stalls, 0);
    assert!(seen.stalls.is_empty());
    // It ran well past the stall timeout.
    assert!(report.duration >= Duration::from_secs(2));
}

#[tokio::test]
async fn shorter_timeout_wins_over_the_stall_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "goes-quiet.sh", &["1000"]);
    spec.timeout = Duration::from_millis(500);
    spec.stall_timeout = Some(Duration::from_secs(3));
    spec.stall_action = StallAction::Stop;
    let (report, seen) = run_spec(spec.clone()).await;
    assert_eq!(report.ending, Ending::TimedOut);
    assert_eq!(report.stalls, 0);
    assert!(seen.stalls.is_empty());
    assert!(report.duration < Duration::from_secs(3));
    assert!(!alive(printed_pid(&log_of(&spec), "sleeper")));
}

#[tokio::test]
async fn no_stall_timeout_means_silence_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "goes-quiet.sh", &["1"]);
    spec.stall_timeout = None;
    spec.stall_action = StallAction::Stop;
    let (report, seen) = run_spec(spec).await;
    assert_eq!(report.ending, Ending::Exited { code: 0 });
    assert_eq!(report.stalls, 0);
    assert!(seen.stalls.is_empty());
}

fn memory_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn output_exactly_at_the_cap_is_not_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "exits.sh", &["0"]);
    spec.max_output = 20;
    let (report, _) = run_spec(spec.clone()).await;
    assert!(!report.truncated);
    assert_eq!(log_of(&spec).len(), 20);
}

#[tokio::test]
async fn child_that_never_reads_stdin_does_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "ignores-stdin.sh", &[]);
    spec.stdin = vec![b'x'; 1024 * 1024];
    spec.timeout = Duration::from_secs(10);
    let (report, _) = run_spec(spec.clone()).await;
    assert_eq!(report.ending, Ending::Exited { code: 0 });
    assert!(log_of(&spec).contains("did not read stdin"));
}

#[tokio::test]
async fn child_that_closes_stdin_at_once_does_not_break_the_runner() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "closes-stdin.sh", &[]);
    spec.stdin = vec![b'x'; 1024 * 1024];
    let (report, _) = run_spec(spec.clone()).await;
    assert_eq!(report.ending, Ending::Exited { code: 0 });
    assert!(log_of(&spec).contains("still here"));
}

#[tokio::test]
async fn the_whole_prompt_arrives_on_stdin_then_eof() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "counts-stdin.sh", &[]);
    spec.stdin = vec![b'x'; 1024 * 1024];
    let (report, seen) = run_spec(spec).await;
    assert_eq!(report.ending, Ending::Exited { code: 0 });
    assert_eq!(String::from_utf8_lossy(&seen.stdout).trim(), "1048576");
}

#[tokio::test]
async fn missing_command_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "exits.sh", &[]);
    let missing = dir.path().join("no-such-agent").display().to_string();
    spec.argv = vec![missing.clone()];
    let (report, _) = run_spec(spec).await;
    assert_eq!(
        report.ending,
        Ending::SpawnFailed {
            reason: format!("command not found: {missing}"),
            kind: SpawnFailure::NotFound
        }
    );
    assert_eq!(report.pid, None);
}

#[tokio::test]
async fn missing_interpreter_is_not_found_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("agent.sh");
    std::fs::write(&script, "#!/no/such/interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut spec = spec(&dir, "exits.sh", &[]);
    spec.argv = vec![script.display().to_string()];
    let (report, _) = run_spec(spec).await;
    let Ending::SpawnFailed { reason, kind } = report.ending else {
        panic!("{:?}", report.ending)
    };
    assert_eq!(kind, SpawnFailure::NotFound);
    assert!(reason.contains("interpreter"), "{reason}");
}

#[tokio::test]
async fn non_executable_command_is_permission_denied() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("agent.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut spec = spec(&dir, "exits.sh", &[]);
    spec.argv = vec![script.display().to_string()];
    let (report, _) = run_spec(spec).await;
    assert_eq!(
        report.ending,
        Ending::SpawnFailed {
            reason: format!(
                "permission denied: {} (is it executable?)",
                script.display()
            ),
            kind: SpawnFailure::PermissionDenied
        }
    );
}

#[tokio::test]
async fn missing_working_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "exits.sh", &[]);
    spec.cwd = dir.path().join("gone");
    let (report, _) = run_spec(spec).await;
    let Ending::SpawnFailed { reason, kind } = report.ending else {
        panic!("{:?}", report.ending)
    };
    assert_eq!(kind, SpawnFailure::Other);
    assert!(
        reason.starts_with("working directory ") && reason.contains("gone"),
        "{reason}"
    );
}

#[tokio::test]
async fn empty_command_fails_to_spawn() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "exits.sh", &[]);
    spec.argv.clear();
    let (report, _) = run_spec(spec).await;
    assert!(matches!(
        report.ending,
        Ending::SpawnFailed {
            kind: SpawnFailure::Other,
            ..
        }
    ));
}

#[tokio::test]
async fn unwritable_log_fails_before_spawning() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "exits.sh", &["0"]);
    spec.log_path = dir.path().join("no-such-dir").join("session.log");
    let (report, _) = run_spec(spec).await;
    let Ending::SpawnFailed { reason, kind } = report.ending else {
        panic!("{:?}", report.ending)
    };
    assert_eq!(kind, SpawnFailure::Other);
    assert!(reason.contains("session log"), "{reason}");
    assert_eq!(report.pid, None);
}

#[tokio::test]
async fn stop_request_terminates_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(&dir, "hangs.sh", &[]);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut seen = Collect::default();
    let stopper = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop_tx.send(true).unwrap();
    };
    let (report, ()) = tokio::join!(run(spec.clone(), &mut seen, stop_rx, None), stopper);
    assert_eq!(report.ending, Ending::Stopped);
    assert!(report.duration < Duration::from_secs(5), "SIGTERM sufficed");
    assert!(!alive(printed_pid(&log_of(&spec), "sleeper")));
}

#[tokio::test]
async fn cancelled_run_kills_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(&dir, "hangs.sh", &[]);
    let (pid_tx, pid_rx) = oneshot::channel();
    let mut seen = Collect::default();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(500),
        run(spec, &mut seen, no_stop(), Some(pid_tx)),
    )
    .await;
    assert!(cancelled.is_err(), "the session was still running");
    let main = pid_rx.await.unwrap() as i32;
    let sleeper = printed_pid(&String::from_utf8_lossy(&seen.stdout), "sleeper");
    assert!(!alive(main) && !alive(sleeper));
}

#[tokio::test]
async fn stop_requested_before_the_start_spawns_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(&dir, "exits.sh", &["0"]);
    let (_stop_tx, stop_rx) = watch::channel(true);
    let (pid_tx, pid_rx) = oneshot::channel();
    let report = run(spec.clone(), &mut DiscardOutput, stop_rx, Some(pid_tx)).await;
    assert_eq!(report.ending, Ending::Stopped);
    assert_eq!(report.pid, None);
    assert!(pid_rx.await.is_err(), "no pid: nothing was spawned");
    assert!(!spec.log_path.exists());
}

/// Set once for the whole test process, so parallel tests agree.
fn inherited_notify_socket() -> &'static str {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: std synchronizes its own environment access (spawns
        // read it under the same lock), and nothing in this test binary
        // reads the environment through libc directly.
        unsafe { std::env::set_var("NOTIFY_SOCKET", "/run/systemd/notify-test") };
    });
    "/run/systemd/notify-test"
}

#[tokio::test]
async fn environment_adds_removes_and_marks() {
    let inherited = inherited_notify_socket();
    assert_eq!(std::env::var("NOTIFY_SOCKET").as_deref(), Ok(inherited));
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "prints-env.sh", &[]);
    spec.env = vec![("AGENT_STATE_AGENT".into(), "rio".into())];
    spec.env_remove = vec!["NOTIFY_SOCKET".into()];
    let (report, seen) = run_spec(spec.clone()).await;
    assert_eq!(report.ending, Ending::Exited { code: 0 });
    let env = String::from_utf8(seen.stdout).unwrap();
    let env: Vec<&str> = env.lines().collect();
    assert!(env.contains(&"AGENT_STATE_AGENT=rio"), "{env:?}");
    let marker = format!("{}={}", spec.marker.0, spec.marker.1);
    assert!(env.contains(&marker.as_str()), "{env:?}");
    assert!(
        !env.iter().any(|v| v.starts_with("NOTIFY_SOCKET=")),
        "{env:?}"
    );
}

#[tokio::test]
async fn child_gets_default_sigpipe_although_the_runner_ignores_it() {
    let dir = tempfile::tempdir().unwrap();
    let (report, seen) = run_spec(spec(&dir, "sigpipe.sh", &[])).await;
    assert_eq!(report.ending, Ending::Exited { code: 0 });
    let line = String::from_utf8(seen.stdout).unwrap();
    let mask = u64::from_str_radix(line.trim().trim_start_matches("SigIgn:").trim(), 16).unwrap();
    let sigpipe = 1u64 << (Signal::SIGPIPE as i32 - 1);
    assert_eq!(mask & sigpipe, 0, "SIGPIPE is ignored in the child: {line}");
}

#[test]
fn run_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let dir = tempfile::tempdir().unwrap();
    let mut observer = DiscardOutput;
    let future = run(
        spec(&dir, "exits.sh", &[]),
        &mut observer,
        no_stop(),
        Some(oneshot::channel().0),
    );
    assert_send(&future);
}

#[test]
fn stat_gives_state_and_process_group() {
    let (state, pgrp) = stat_of(std::process::id() as i32).unwrap();
    assert!(state.is_ascii_uppercase() && state != b'Z');
    assert_eq!(pgrp, nix::unistd::getpgrp().as_raw());
    assert_eq!(stat_of(i32::MAX), None);
}

#[test]
fn stat_lines_parse_past_any_command_name() {
    let tail = "S 1 42 42 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 2681717 3133440 413";
    let line = |name: &str| format!("123 ({name}) {tail}");
    let want = Some(ProcStat {
        state: b'S',
        pgrp: 42,
        started: 2681717,
    });
    for name in ["sh", "a b", "x) R 9 9 9 (y", ")", "((", ""] {
        assert_eq!(parse_stat(line(name).as_bytes()), want, "{name:?}");
    }
    // Cut short before the start time, or not a stat line at all.
    assert_eq!(parse_stat(b"123 (sh) S 1 42 42 0 -1"), None);
    assert_eq!(parse_stat(b"no parenthesis here"), None);
    assert_eq!(parse_stat(b"123 (sh) S 1 x 42"), None);
}

/// The sweep reads the environment only of the processes started since the
/// session's main process: one started before it that carries its marker
/// (copied by hand, or a recycled marker) is no descendant of the session
/// and is left alone, while a descendant that left the group is killed.
#[tokio::test]
async fn a_process_older_than_the_session_is_not_swept_for_its_marker() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(&dir, "escapes.sh", &[]);
    let mut older = std::process::Command::new("sleep")
        .arg("1000")
        .env(&spec.marker.0, &spec.marker.1)
        .process_group(0)
        .spawn()
        .unwrap();
    // Start times count clock ticks (10 ms): the session starts a tick later.
    std::thread::sleep(Duration::from_millis(25));
    let (report, _) = run_spec(spec.clone()).await;
    let log = log_of(&spec);
    let escaped = printed_pid(&log, "escaped");
    let older_alive = alive(older.id() as i32);
    let _ = older.kill();
    let _ = older.wait();
    assert_eq!(report.leftovers_killed, 2, "{log}");
    assert!(!alive(escaped), "the process that left with setsid is dead");
    assert!(older_alive, "the process older than the session was killed");
}

#[test]
fn the_log_says_what_memory_max_wrote_and_what_swap_does() {
    let with_swap = applied_note(&[
        ("memory.swap.max", 0),
        ("memory.high", 900),
        ("memory.max", 1000),
    ]);
    assert_eq!(
        with_swap,
        "memory.swap.max = 0, memory.high = 900, memory.max = 1000; a session past it is OOM-killed, not swapped"
    );
    let without = applied_note(&[("memory.high", 900), ("memory.max", 1000)]);
    assert!(
        without.starts_with("memory.high = 900, memory.max = 1000; no memory.swap.max"),
        "{without}"
    );
}

/// The grace counts from the SIGTERM the session really got: a kill
/// ordered together with the end (its grace spent while the SIGTERM was
/// held up, e.g. by the ending note's write on a busy disk) waits for it,
/// so the session's trap runs to its end.
#[tokio::test]
async fn a_kill_ordered_with_the_end_still_leaves_the_whole_grace() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(&dir, "slow-trap.sh", &[]);
    spec.kill_grace = Duration::from_secs(20);
    let iteration = spec.iteration;
    let (tx, rx) = watch::channel(Orders::default());
    let launched = launch(spec.clone(), &rx).unwrap_or_else(|r| panic!("{r:?}"));
    let mut seen = Collect::default();
    let orders = async {
        while !String::from_utf8_lossy(&std::fs::read(&spec.log_path).unwrap_or_default())
            .contains("ready")
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tx.send_modify(|o| {
            o.end = Some((iteration, Ending::TimedOut));
            o.kill = Some(iteration);
        });
    };
    let (report, ()) = tokio::join!(launched.run(&mut seen, rx, None), orders);
    assert_eq!(report.ending, Ending::TimedOut);
    let log = log_of(&spec);
    assert!(
        log.contains("cleaned up"),
        "the trap was cut short: {log:?}"
    );
    assert!(
        report.duration < Duration::from_secs(20),
        "{:?}",
        report.duration
    );
}

/// The pure decisions name signals without nix (crates/decide's
/// `ending::signal_name`): every number reads as nix's `Signal` names it,
/// so an ending reads as it did when it was rendered with nix.
#[test]
fn signal_names_are_nix_names() {
    for n in -1..=70 {
        let nix_name = nix::sys::signal::Signal::try_from(n)
            .ok()
            .map(|s| s.as_str());
        assert_eq!(crate::ending::signal_name(n), nix_name, "signal {n}");
    }
}
