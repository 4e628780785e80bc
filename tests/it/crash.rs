//! Crash consistency: a busy daemon SIGKILLed at random moments, restarted,
//! and checked after every restart.
//!
//! Four agents on `* * * * *` and `*/3 * * * *` schedules (the injected clock
//! `AGENT_STATE_FAKE_NOW` puts every start just before a minute, sometimes
//! minutes or hours after the last one, so schedules, catch-ups and missed
//! runs all happen), `wake_on_inbox = "any"` after 50 ms, at most two
//! sessions at once, and a fake agent (`tests/fixtures/crash/agent.sh`) that
//! works a few tens of ms, sometimes calls `record` / `task add`, sometimes
//! leaves a straggler process, sometimes is slow and sometimes fails. A
//! sender thread delivers messages all the time — into `inbox/.tmp/` then
//! renamed in, or with `agent-state send` — and wake requests (`.wake-*`
//! files, `agent-state wake`), to the agents and to a human mailbox.
//!
//! The loop: let the daemon work 30–400 ms, SIGKILL it (its sessions'
//! processes survive it), sometimes start one more daemon and SIGKILL it
//! again within 0–20 ms (mid start-up, mid recovery), start a daemon and wait
//! until it is ready (`daemon.json` names its pid), then, with the sender
//! paused and each agent's lock held (a consistent snapshot while the daemon
//! runs), check:
//!
//! 1. every state file parses (report, tasks, metrics, session, and
//!    `.daemon/` counters, schedule, daemon), no `*.corrupt-*` file was set
//!    aside, and every line of the journals and of `.daemon/errors.jsonl`
//!    parses except a torn last line (in a journal, also one the next
//!    append closed with its newline: a line cut short, never one glued to
//!    another or garbled);
//! 2. every delivered message id is in exactly one place — waiting in
//!    `inbox/` (returned claims included), claimed in
//!    `inbox/.claimed/{session}/` by the session that session.json says is
//!    running, in `inbox/processed/` (under any `-N` name), or in
//!    `inbox/rejected/` as undeliverable (3 failed attempts) — never lost,
//!    never in two places, never back out of processed/, and no file holds
//!    an id nobody sent; a human mailbox is never woken;
//! 3. a running session is owned by the new daemon, and no process of an
//!    old daemon's session (`AGENT_STATE_RUN={pid}:{agent}:{session}` in
//!    `/proc/PID/environ`) is alive;
//! 4. counters never go backwards (counters.json per agent, metrics.json
//!    `lifetime`), the instance counter is at least the highest instance in
//!    the journal, and instance ids in the journal are unique;
//!
//! and the extended invariants, which hold since a session's end is
//! committed by its journal line and recovery completes what a crash cut
//! short (`hooks::recover_stale`); they fail the test unless
//! `AGENT_STATE_CRASH_STRICT=0`, which only counts them:
//!
//! 5. report.json agrees with session.json (`current_session` is the
//!    running session, or none);
//! 6. every message in processed/ is listed by a `session_end` (or a
//!    `message_expired`) in the journal;
//! 7. a session ends once in the journal (one `session_end`, `error` or
//!    `timeout`), and every `session_start` but the running session's has
//!    its end;
//! 8. metrics.json `lifetime.sessions_total` counts every ending in the
//!    journal.
//! 9. a message in rejected/ has its `.reason.json` and a
//!    `message_rejected` event.
//!
//! At the end the sender stops, the daemon drains (wakes until the inboxes
//! are empty), gets SIGTERM and must exit 0; then the same checks with no
//! session running and nothing claimed, no session process alive, and
//! `agent-state check` must find no problem.
//!
//! `AGENT_STATE_CRASH_ITERATIONS` (default 20), `AGENT_STATE_CRASH_SEED`
//! (printed at the start; decimal or 0x hex) to replay the same choices
//! (the timing of a replay differs, so a failure may need a few runs),
//! `AGENT_STATE_CRASH_STRICT=0`, and `AGENT_STATE_CRASH_KEEP=1` to keep the
//! temp dir (it is kept anyway when an invariant fails).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::{BIN, Daemon, Env, list, poll_until, process_alive};

/// Names no other test uses: session markers (`{pid}:{agent}:{session}`)
/// are told apart by them when pids are reused.
const AGENTS: [&str; 4] = ["crash-kiln", "crash-quay", "crash-wren", "crash-yew"];
const HUMAN: &str = "crash-ward";

fn all_names() -> impl Iterator<Item = &'static str> {
    AGENTS.iter().copied().chain([HUMAN])
}

// ---- seeded randomness (xorshift64*, seeded through splitmix64) ---------------

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// 0..n
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// lo..=hi
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn parse_u64(text: &str) -> Option<u64> {
    let t = text.trim();
    match t.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---- the environment ----------------------------------------------------------

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/crash/agent.sh")
}

fn config(agent: &Path) -> String {
    let mut out = format!(
        r#"[daemon]
max_concurrent_sessions = 2
catch_up_window = "90s"
shutdown_grace = "5s"

[defaults]
command = [{agent:?}]
timeout = "10s"
kill_grace = "1s"
wake_on_inbox = "any"
inbox_debounce = "50ms"

# Journals and the error log rotated at every health check (5 a second)
# past 1 KiB: the kills land in rotations too.
[health]
interval = "200ms"

[logs]
rotate_size = "1KiB"
"#,
        agent = agent.display().to_string()
    );
    for a in AGENTS {
        // One agent every 3 minutes: after a jump of the clock its last
        // missed run may be older than the catch-up window.
        let schedule = if a == AGENTS[3] {
            "*/3 * * * *"
        } else {
            "* * * * *"
        };
        out.push_str(&format!(
            "\n[[agent]]\nname = \"{a}\"\nschedule = \"{schedule}\"\n"
        ));
    }
    out.push_str(&format!(
        "\n[[agent]]\nname = \"{HUMAN}\"\nkind = \"human\"\n"
    ));
    out
}

/// The daemon's injected clock: every start is just before a minute (so
/// the `* * * * *` schedules fire within 0.3 s), usually the next minute,
/// sometimes a few minutes or hours later (missed runs: one catch-up
/// session, or a `schedule_missed` event for the `*/3` agent when its last
/// missed run is older than the 90 s catch-up window). Never backwards.
struct FakeClock {
    base: chrono::DateTime<chrono::Utc>,
    minutes: i64,
}

impl FakeClock {
    fn new() -> FakeClock {
        let now = chrono::Utc::now().timestamp();
        let base = chrono::DateTime::from_timestamp(now - now % 60 + 60, 0).expect("a time");
        FakeClock { base, minutes: 0 }
    }

    fn next(&mut self, rng: &mut Rng) -> String {
        self.minutes += match rng.below(100) {
            0..=2 => 180,
            3..=19 => rng.range(2, 5) as i64,
            _ => 1,
        };
        let t = self.base + chrono::Duration::minutes(self.minutes)
            - chrono::Duration::milliseconds(rng.range(0, 300) as i64);
        t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    }
}

// ---- the sender ---------------------------------------------------------------

struct Delivered {
    agent: &'static str,
    id: String,
}

/// What the sender thread and the main thread share. The sender holds
/// `gate` for each delivery; a check holds it throughout, so nothing is
/// delivered while files are being looked at.
struct Shared {
    root: PathBuf,
    config: PathBuf,
    gate: Mutex<()>,
    stop: AtomicBool,
    delivered: Mutex<Vec<Delivered>>,
    wake_files: AtomicU64,
    cli_sends: AtomicU64,
    cli_wakes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stops the sender when dropped (also when the test panics).
struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::SeqCst);
    }
}

/// The documented way for a program to deliver: write in `inbox/.tmp/`,
/// fsync, rename into `inbox/`.
fn deliver_file(root: &Path, agent: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let inbox = root.join(agent).join("inbox");
    let tmp_dir = inbox.join(".tmp");
    std::fs::create_dir_all(&tmp_dir)?;
    let tmp = tmp_dir.join(name);
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, inbox.join(name))
}

fn cli(shared: &Shared, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("--config")
        .arg(&shared.config)
        .args(args)
        .env_remove("AGENT_STATE_SESSION_ID")
        .env_remove("AGENT_STATE_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run agent-state")
}

fn sender(shared: Arc<Shared>, seed: u64) {
    let mut rng = Rng::new(seed ^ 0x5E4D_E25E_4DE2_5E4D);
    let mut n = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        {
            let _gate = lock(&shared.gate);
            n += 1;
            let roll = rng.below(100);
            let to = if rng.percent(4) {
                HUMAN
            } else {
                rng.pick(&AGENTS)
            };
            let from = rng.pick(&AGENTS);
            let kind = rng.pick(&["flag", "flag", "flag", "question", "cascade", "task"]);
            match roll {
                // A message written the documented way.
                0..=79 => {
                    let id = format!("crash-{n:06}");
                    let mut msg = serde_json::json!({
                        "id": id,
                        "from": from,
                        "type": kind,
                        "subject": format!("message {n}"),
                        "body": format!("body of message {n} to {to}"),
                    });
                    if rng.percent(10) {
                        msg["priority"] = "high".into();
                    }
                    let bytes = serde_json::to_vec_pretty(&msg).expect("json");
                    deliver_file(&shared.root, to, &format!("{id}.json"), &bytes)
                        .unwrap_or_else(|e| panic!("delivering {id} to {to}: {e}"));
                    lock(&shared.delivered).push(Delivered { agent: to, id });
                }
                // `agent-state send`.
                80..=84 => {
                    let subject = format!("sent {n}");
                    let args = [
                        "send",
                        "--from",
                        from,
                        "--to",
                        to,
                        "--type",
                        kind,
                        "--subject",
                        &subject,
                    ];
                    // Exit 75 (the agent's lock held past `send`'s 10 s,
                    // e.g. by a restarted daemon returning thousands of
                    // claimed messages on a busy machine) delivers nothing
                    // and means "try again", as a pipeline would.
                    let mut out = cli(&shared, &args);
                    for _ in 0..5 {
                        if out.status.code() != Some(75) {
                            break;
                        }
                        out = cli(&shared, &args);
                    }
                    let stdout = String::from_utf8_lossy(&out.stdout);
                    assert!(
                        out.status.success(),
                        "agent-state send failed: {:?}\n{stdout}{}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    );
                    let id = stdout
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or_else(|| panic!("no id in {stdout:?}"))
                        .to_string();
                    lock(&shared.delivered).push(Delivered { agent: to, id });
                    shared.cli_sends.fetch_add(1, Ordering::Relaxed);
                }
                // A wake request, as `agent-state wake` drops it.
                85..=96 => {
                    let agent = rng.pick(&AGENTS);
                    deliver_file(
                        &shared.root,
                        agent,
                        &format!(".wake-crash-{n}"),
                        b"crash test\n",
                    )
                    .unwrap_or_else(|e| panic!("waking {agent}: {e}"));
                    shared.wake_files.fetch_add(1, Ordering::Relaxed);
                }
                // `agent-state wake` (69 when no daemon is running).
                _ => {
                    let agent = rng.pick(&AGENTS);
                    let out = cli(&shared, &["wake", agent]);
                    assert!(
                        matches!(out.status.code(), Some(0 | 69)),
                        "agent-state wake {agent}: {:?}\n{}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    );
                    shared.cli_wakes.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Kept: the sender's own random pace (the load), not a wait on state.
        std::thread::sleep(ms(rng.range(1, 6)));
    }
}

// ---- the checks ---------------------------------------------------------------

/// Where a message file was found.
#[derive(Debug, Clone, PartialEq)]
enum Place {
    Waiting,
    Claimed(String),
    Processed,
    Rejected(String),
}

#[derive(Debug, Clone)]
struct Found {
    agent: &'static str,
    place: Place,
    path: PathBuf,
}

/// The extended invariants (5-8): checked and counted always, failures
/// unless `AGENT_STATE_CRASH_STRICT=0` (see the module docs).
const EXTENDED: [(u8, &str); 5] = [
    (5, "report.json disagrees with session.json"),
    (6, "messages in processed/ that no journal event records"),
    (
        7,
        "sessions ended twice, or started and never ended, in a journal",
    ),
    (8, "metrics.json lifetime.sessions_total behind the journal"),
    (
        9,
        "messages in rejected/ without .reason.json or message_rejected",
    ),
];

const NO_REASON: &str = "(no .reason.json)";

/// What one check found.
#[derive(Default)]
struct Findings {
    /// Violations of invariants 1-4: always failures.
    bad: Vec<String>,
    /// (invariant 5-9, what is counted once, text).
    extended: Vec<(u8, String, String)>,
}

#[derive(Default)]
struct Stats {
    kills: u64,
    early_kills: u64,
    checks: u64,
    torn_last_lines: u64,
    temp_leftovers: usize,
    ready: Duration,
    slowest_ready: (Duration, PathBuf),
    checking: Duration,
    /// Extended findings seen over the run, by invariant (once each).
    extended: BTreeMap<u8, BTreeMap<String, String>>,
    // At the last check:
    sessions: u64,
    completed: u64,
    failed: u64,
    interrupted: u64,
    timeouts: u64,
    schedule_missed: u64,
    waiting: usize,
    human_waiting: usize,
    processed: usize,
    rejected: usize,
}

struct Checker {
    root: PathBuf,
    /// Ids of files in processed/ and rejected/ (those never change).
    ids: HashMap<PathBuf, String>,
    reasons: HashMap<PathBuf, String>,
    counters: BTreeMap<String, u64>,
    lifetime: BTreeMap<String, BTreeMap<String, u64>>,
    ever_processed: HashSet<String>,
    journals: BTreeMap<String, JournalFacts>,
    /// `.daemon/errors.jsonl`: bytes and lines checked so far.
    errors_log: (u64, usize),
    /// Every daemon this test started (their session markers).
    daemons: BTreeSet<u32>,
    stats: Stats,
}

/// The agent's lock, as every writer takes it: what is read under it is a
/// consistent snapshot of the agent.
fn agent_lock(dir: &Path) -> Flock<File> {
    let path = dir.join(".lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o660)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    Flock::lock(file, FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("lock {}: {e}", path.display()))
}

fn is_message_name(name: &str) -> bool {
    !name.starts_with('.') && name.ends_with(".json") && name.len() > ".json".len()
}

/// The id of a message file: its `id`, else its stem.
fn message_id(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("does not parse: {e}: {:?}", String::from_utf8_lossy(&bytes)))?;
    let stem = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .trim_end_matches(".json")
        .to_string();
    Ok(v["id"]
        .as_str()
        .filter(|s| !s.trim().is_empty())
        .map(str::to_string)
        .unwrap_or(stem))
}

fn parse_file(path: &Path) -> Result<Option<Value>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            format!(
                "{} does not parse: {e}\n{}",
                path.display(),
                String::from_utf8_lossy(&bytes)
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: cannot read: {e}", path.display())),
    }
}

/// Every file name under `dir`, recursively (relative).
fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let rel = format!("{prefix}{}", entry.file_name().to_string_lossy());
        // The type from the directory entry: no stat per file.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&entry.path(), &format!("{rel}/"), out);
        } else {
            out.push(rel);
        }
    }
}

/// Is `name` a temp file of `state::atomic` (`.report.json.XXXXXX.tmp`)?
fn is_atomic_temp(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    base.starts_with('.') && base.ends_with(".tmp")
}

/// Live processes whose environment marks them as part of a session of one
/// of `daemons`: (pid, marker, command line).
fn session_processes(daemons: &BTreeSet<u32>) -> Vec<(i32, String, String)> {
    let mut out = Vec::new();
    for name in list(Path::new("/proc")) {
        let Ok(pid) = name.parse::<i32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        for var in environ.split(|b| *b == 0) {
            let Some(value) = var.strip_prefix(b"AGENT_STATE_RUN=") else {
                continue;
            };
            let value = String::from_utf8_lossy(value).to_string();
            let mut parts = value.splitn(3, ':');
            let owner = parts.next().and_then(|p| p.parse::<u32>().ok());
            let agent = parts.next().unwrap_or_default();
            if owner.is_some_and(|o| daemons.contains(&o))
                && AGENTS.contains(&agent)
                && process_alive(pid)
            {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                    .unwrap_or_default();
                out.push((pid, value.clone(), cmdline));
            }
        }
    }
    out
}

/// The parts of a rotated log's history from stream offset `offset` on
/// (README "Rotation": segments `NAME.OFFSET.zst` beside the live file,
/// which starts with a `log_rotated` marker naming its offset): the
/// segments' bytes from `offset` (whole lines: a rotation closes a torn
/// line), then the live file's. Read independently of the daemon's code:
/// one open of the live file, its base from its own first line, then the
/// segments before that base, which must follow each other without a gap.
struct History {
    /// Each segment's part, then the live file's (`true`: a segment).
    parts: Vec<(Vec<u8>, bool)>,
}

fn read_history(path: &Path, offset: u64) -> Result<History, String> {
    use std::io::Read;
    let mut live = Vec::new();
    if let Ok(mut f) = File::open(path) {
        f.read_to_end(&mut live)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
    }
    let first = live.split(|b| *b == b'\n').next().unwrap_or_default();
    let base = serde_json::from_slice::<Value>(first)
        .ok()
        .filter(|v| v["event"] == "log_rotated")
        .and_then(|v| v["offset"].as_u64())
        .unwrap_or(0);
    let end = base + live.len() as u64;
    if offset > end {
        return Err(format!(
            "{} went back: its history ends at {end}, {offset} bytes were read before",
            path.display()
        ));
    }
    let mut parts = Vec::new();
    if offset < base {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let dir = path.parent().unwrap();
        let mut starts: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
            .map_err(|e| format!("listing {}: {e}", dir.display()))?
            .filter_map(|e| {
                let file = e.ok()?.file_name().to_string_lossy().to_string();
                let digits = file
                    .strip_prefix(&format!("{name}."))?
                    .strip_suffix(".zst")?;
                let start = digits.parse::<u64>().ok()?;
                (digits.len() >= 12 && start < base).then(|| (start, dir.join(file)))
            })
            .collect();
        starts.sort();
        let mut at = starts.first().map_or(base, |s| s.0);
        if at > offset {
            return Err(format!(
                "{}: bytes {offset}..{at} are in no segment",
                path.display()
            ));
        }
        for (start, file) in &starts {
            let bytes = zstd::stream::decode_all(
                File::open(file).map_err(|e| format!("{}: {e}", file.display()))?,
            )
            .map_err(|e| format!("decompressing {}: {e}", file.display()))?;
            if *start != at {
                return Err(format!(
                    "{} starts at {start}, but the part before it ends at {at}",
                    file.display()
                ));
            }
            at += bytes.len() as u64;
            if at > offset {
                let skip = offset.saturating_sub(*start) as usize;
                parts.push((bytes[skip..].to_vec(), true));
            }
        }
        if at != base {
            return Err(format!(
                "{}'s segments end at {at}, but the live file starts at {base}",
                path.display()
            ));
        }
    }
    let skip = offset.saturating_sub(base) as usize;
    parts.push((live[skip..].to_vec(), false));
    Ok(History { parts })
}

fn instance_number(agent: &str, instance: &str) -> Option<u64> {
    instance.strip_prefix(&format!("{agent}-"))?.parse().ok()
}

/// What one agent's journal says, read incrementally: the journal is
/// append-only, so each check parses only the lines added since the last.
#[derive(Default)]
struct JournalFacts {
    /// Bytes parsed so far (up to the end of the last whole line).
    offset: u64,
    lines: usize,
    sessions: u64,
    completed: u64,
    failed: u64,
    interrupted: u64,
    timeouts: u64,
    schedule_missed: u64,
    /// instance id -> session_start events with it.
    instances: HashMap<String, usize>,
    highest_instance: u64,
    /// session id -> its ending events ("session_end at line 79", …).
    endings: BTreeMap<String, Vec<String>>,
    /// session id -> the line of its session_start.
    starts: BTreeMap<String, usize>,
    /// Message ids a session_end processed or a message_expired recorded.
    processed: HashSet<String>,
    /// `moved_to` of message_rejected events (`inbox/rejected/NAME`).
    rejected: HashSet<String>,
}

/// What [`JournalFacts::line`] made of a whole line.
#[derive(PartialEq)]
enum Line {
    Taken,
    /// Cut short (a SIGKILL in the middle of a long line's write: a prefix
    /// of a JSON line, so it ends early): the torn last line, closed by the
    /// next append's newline (never glued to it); skipped, to be counted.
    ClosedTorn,
}

impl JournalFacts {
    /// Take in one whole line (1-based `n`).
    fn line(&mut self, agent: &str, n: usize, line: &str, bad: &mut Vec<String>) -> Line {
        if line.trim().is_empty() {
            return Line::Taken;
        }
        let e: Value = match serde_json::from_str(line) {
            Ok(e) => e,
            Err(err) if err.is_eof() => return Line::ClosedTorn,
            Err(err) => {
                bad.push(format!(
                    "1: {agent}/journal.jsonl line {n} does not parse ({err}), and it is not the last line: {line:?}"
                ));
                return Line::Taken;
            }
        };
        let event = e["event"].as_str().unwrap_or_default();
        if !e["ts"].is_string() || event.is_empty() {
            bad.push(format!(
                "1: {agent}/journal.jsonl line {n} has no ts or event: {line}"
            ));
        }
        let text = |key: &str| e[key].as_str().unwrap_or_default().to_string();
        match event {
            "session_start" => {
                self.sessions += 1;
                self.starts.insert(text("session_id"), n);
                if let Some(inst) = e["instance"].as_str() {
                    *self.instances.entry(inst.to_string()).or_default() += 1;
                    if let Some(k) = instance_number(agent, inst) {
                        self.highest_instance = self.highest_instance.max(k);
                    }
                }
            }
            "session_end" | "error" | "timeout" => {
                let reason = e["reason"].as_str();
                match event {
                    "session_end" => self.completed += 1,
                    "timeout" => self.timeouts += 1,
                    _ => {
                        self.failed += 1;
                        if reason.is_some_and(|r| r.contains("interrupted")) {
                            self.interrupted += 1;
                        }
                    }
                }
                let reason = reason.map(|r| format!(" ({r})")).unwrap_or_default();
                self.endings
                    .entry(text("session_id"))
                    .or_default()
                    .push(format!("{event} at line {n}{reason}"));
                for id in e["messages_processed"].as_array().into_iter().flatten() {
                    self.processed
                        .insert(id.as_str().unwrap_or_default().to_string());
                }
            }
            "message_expired" => {
                self.processed.insert(text("message_id"));
            }
            "message_rejected" => {
                self.rejected.insert(text("moved_to"));
            }
            "schedule_missed" => self.schedule_missed += 1,
            _ => {}
        }
        Line::Taken
    }
}

impl Checker {
    fn new(root: &Path) -> Checker {
        Checker {
            root: root.to_path_buf(),
            ids: HashMap::new(),
            reasons: HashMap::new(),
            counters: BTreeMap::new(),
            lifetime: BTreeMap::new(),
            ever_processed: HashSet::new(),
            journals: BTreeMap::new(),
            errors_log: (0, 0),
            daemons: BTreeSet::new(),
            stats: Stats::default(),
        }
    }

    fn cached_id(&mut self, path: &Path, bad: &mut Vec<String>) -> Option<String> {
        if let Some(id) = self.ids.get(path) {
            return Some(id.clone());
        }
        match message_id(path) {
            Ok(id) => {
                self.ids.insert(path.to_path_buf(), id.clone());
                Some(id)
            }
            Err(e) => {
                bad.push(format!("1: message file {}: {e}", path.display()));
                None
            }
        }
    }

    /// Every message file of `agent`, by id.
    fn scan_inbox(
        &mut self,
        agent: &'static str,
        found: &mut HashMap<String, Vec<Found>>,
        bad: &mut Vec<String>,
    ) {
        let inbox = self.root.join(agent).join("inbox");
        let mut add = |id: String, place: Place, path: PathBuf| {
            found
                .entry(id)
                .or_default()
                .push(Found { agent, place, path });
        };
        for name in list(&inbox).into_iter().filter(|n| is_message_name(n)) {
            let path = inbox.join(&name);
            match message_id(&path) {
                Ok(id) => add(id, Place::Waiting, path),
                Err(e) => bad.push(format!("1: message file {}: {e}", path.display())),
            }
        }
        let claimed_root = inbox.join(".claimed");
        for sid in list(&claimed_root) {
            let dir = claimed_root.join(&sid);
            for name in list(&dir).into_iter().filter(|n| is_message_name(n)) {
                let path = dir.join(&name);
                match message_id(&path) {
                    Ok(id) => add(id, Place::Claimed(sid.clone()), path),
                    Err(e) => bad.push(format!("1: message file {}: {e}", path.display())),
                }
            }
        }
        let processed = inbox.join("processed");
        for name in list(&processed).into_iter().filter(|n| is_message_name(n)) {
            let path = processed.join(&name);
            if let Some(id) = self.cached_id(&path, bad) {
                add(id, Place::Processed, path);
            }
        }
        let rejected = inbox.join("rejected");
        for name in list(&rejected)
            .into_iter()
            .filter(|n| is_message_name(n) && !n.ends_with(".reason.json"))
        {
            let path = rejected.join(&name);
            let Some(id) = self.cached_id(&path, bad) else {
                continue;
            };
            let reason = match self.reasons.get(&path) {
                Some(r) => r.clone(),
                None => {
                    let r = match parse_file(&rejected.join(format!("{name}.reason.json"))) {
                        Ok(Some(d)) => d["reason"].as_str().unwrap_or_default().to_string(),
                        Ok(None) => NO_REASON.to_string(),
                        Err(e) => {
                            bad.push(format!("1: {e}"));
                            String::new()
                        }
                    };
                    self.reasons.insert(path.clone(), r.clone());
                    r
                }
            };
            add(id, Place::Rejected(reason), path);
        }
    }

    /// Invariants 1 (every journal line parses but a torn last one) and 4
    /// (instance ids are unique). Call with the agent's lock held.
    fn read_journal(&mut self, agent: &str, bad: &mut Vec<String>) {
        let path = self.root.join(agent).join("journal.jsonl");
        let facts = self.journals.entry(agent.to_string()).or_default();
        let history = match read_history(&path, facts.offset) {
            Ok(h) => h,
            Err(e) => {
                bad.push(format!("1: {agent}/journal.jsonl: {e}"));
                *facts = JournalFacts::default();
                return;
            }
        };
        let before = facts.instances.clone();
        for (bytes, segment) in &history.parts {
            // Whole lines only: what follows the last newline is a torn
            // last line (or one being written), looked at again next time.
            let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
            if whole < bytes.len() {
                self.stats.torn_last_lines += 1;
            }
            let lines: Vec<&str> = std::str::from_utf8(&bytes[..whole])
                .unwrap_or_default()
                .lines()
                .collect();
            for (i, line) in lines.iter().enumerate() {
                facts.lines += 1;
                // A segment's last line may be a torn line the rotation
                // closed with a newline.
                if *segment && i + 1 == lines.len() && serde_json::from_str::<Value>(line).is_err()
                {
                    self.stats.torn_last_lines += 1;
                    continue;
                }
                if facts.line(agent, facts.lines, line, bad) == Line::ClosedTorn {
                    self.stats.torn_last_lines += 1;
                }
            }
            facts.offset += whole as u64;
        }
        for (inst, n) in &facts.instances {
            if *n > 1 && before.get(inst) != Some(n) {
                bad.push(format!(
                    "4: instance {inst} appears in {n} session_start events of {agent}/journal.jsonl"
                ));
            }
        }
    }

    /// Check every invariant. `daemon`: the pid of the daemon running now
    /// (None once it has stopped).
    fn check(&mut self, daemon: Option<u32>, delivered: &[Delivered]) -> Findings {
        self.stats.checks += 1;
        let mut out = Findings::default();
        let mut found: HashMap<String, Vec<Found>> = HashMap::new();
        // agent -> the session session.json says is running
        let mut running: BTreeMap<&str, String> = BTreeMap::new();
        let mut temp_leftovers = 0;

        for agent in all_names() {
            let dir = self.root.join(agent);
            let _lock = agent_lock(&dir);
            let human = agent == HUMAN;
            let bad = &mut out.bad;

            // 1. State files parse; nothing was found corrupt and set aside.
            let mut docs: BTreeMap<&str, Value> = BTreeMap::new();
            for file in ["report.json", "tasks.json", "metrics.json", "session.json"] {
                match parse_file(&dir.join(file)) {
                    Ok(Some(v)) => {
                        docs.insert(file, v);
                    }
                    Ok(None) if human || file == "session.json" => {}
                    Ok(None) => bad.push(format!("1: {agent}/{file} is missing")),
                    Err(e) => bad.push(format!("1: {e}")),
                }
            }
            let mut names = Vec::new();
            walk(&dir, "", &mut names);
            for name in &names {
                if name.contains(".corrupt-") || name.contains(".torn-") {
                    bad.push(format!(
                        "1: {agent}/{name}: a state file was found corrupt and set aside"
                    ));
                }
                if is_atomic_temp(name) {
                    temp_leftovers += 1;
                }
            }
            if human {
                if docs.contains_key("session.json") {
                    bad.push(format!("2: the human mailbox {agent} has a session.json"));
                }
                self.scan_inbox(agent, &mut found, bad);
                continue;
            }

            self.read_journal(agent, bad);
            let facts = &self.journals[agent];

            // 4. metrics.json lifetime counters never go backwards.
            if let Some(m) = docs.get("metrics.json") {
                let now: BTreeMap<String, u64> = m["lifetime"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                    .collect();
                for (k, was) in self.lifetime.get(agent).into_iter().flatten() {
                    let is = now.get(k).copied().unwrap_or(0);
                    if is < *was {
                        bad.push(format!(
                            "4: {agent}/metrics.json lifetime.{k} went back from {was} to {is}"
                        ));
                    }
                }
                // 8. Every ending in the journal was counted.
                let total = now.get("sessions_total").copied().unwrap_or(0);
                let ended: usize = facts.endings.values().map(Vec::len).sum();
                if total < ended as u64 {
                    out.extended.push((
                        8,
                        format!("{agent} {}", ended as u64 - total),
                        format!(
                            "{agent}: metrics.json lifetime.sessions_total is {total}, the journal has {ended} session endings"
                        ),
                    ));
                }
                self.lifetime.insert(agent.to_string(), now);
            }
            // 7. A session ends once, and every start has its end but the
            // running session's (a start journaled before a crash that cut
            // its files is recorded interrupted at the next start).
            for (sid, ends) in &facts.endings {
                if ends.len() > 1 {
                    out.extended.push((
                        7,
                        format!("{agent} {sid}"),
                        format!("{agent}: session {sid}: {}", ends.join(", ")),
                    ));
                }
            }
            let running_now = docs
                .get("session.json")
                .filter(|s| s["status"] == "running")
                .and_then(|s| s["session_id"].as_str());
            for (sid, line) in &facts.starts {
                if !facts.endings.contains_key(sid) && running_now != Some(sid.as_str()) {
                    out.extended.push((
                        7,
                        format!("{agent} {sid} unended"),
                        format!(
                            "{agent}: session {sid} (session_start at journal line {line}) has no end and is not running"
                        ),
                    ));
                }
            }

            // 3. A running session is the new daemon's; 5. report.json agrees.
            let null = Value::Null;
            let session = docs.get("session.json").unwrap_or(&null);
            let report = docs.get("report.json").unwrap_or(&null);
            let sid = session["session_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if session["status"] == "running" {
                let owner = session["owner_pid"].as_u64();
                match daemon {
                    Some(pid) if owner == Some(pid as u64) => {}
                    Some(pid) => bad.push(format!(
                        "3: {agent}: session {sid} is running with owner_pid {owner:?}, not the new daemon's pid {pid}"
                    )),
                    None => bad.push(format!(
                        "3: {agent}: session {sid} is still running (owner_pid {owner:?}) after the daemon stopped"
                    )),
                }
                if report["current_session"] != sid.as_str() {
                    out.extended.push((
                        5,
                        format!("{agent} {sid}"),
                        format!(
                            "{agent}: session.json says {sid} is running, report.json current_session is {}",
                            report["current_session"]
                        ),
                    ));
                }
                running.insert(agent, sid.clone());
            } else if !report["current_session"].is_null() {
                out.extended.push((
                    5,
                    format!("{agent} {sid}"),
                    format!(
                        "{agent}: report.json says status {} with current_session {}, but session.json says session {sid} is {}",
                        report["status"], report["current_session"], session["status"]
                    ),
                ));
            }

            self.scan_inbox(agent, &mut found, bad);
        }
        let journals = &self.journals;
        let bad = &mut out.bad;

        // 1, 4. The daemon's files, read after the journals: the counter is
        // taken before an instance is journaled, so it is never behind.
        let daemon_dir = self.root.join(".daemon");
        let mut daemon_names = Vec::new();
        walk(&daemon_dir, "", &mut daemon_names);
        temp_leftovers += daemon_names.iter().filter(|n| is_atomic_temp(n)).count();
        for name in daemon_names.iter().filter(|n| n.contains(".corrupt-")) {
            bad.push(format!(
                "1: .daemon/{name}: a daemon file was found corrupt and set aside"
            ));
        }
        match parse_file(&daemon_dir.join("counters.json")) {
            Ok(c) => {
                let c = c.unwrap_or(Value::Null);
                for agent in AGENTS {
                    let n = c[agent].as_u64().unwrap_or(0);
                    let was = self.counters.get(agent).copied().unwrap_or(0);
                    if n < was {
                        bad.push(format!(
                            "4: .daemon/counters.json: {agent} went back from {was} to {n}"
                        ));
                    }
                    let highest = journals.get(agent).map_or(0, |j| j.highest_instance);
                    if n < highest {
                        bad.push(format!(
                            "4: .daemon/counters.json: {agent} is {n}, but its journal has instance {agent}-{highest:03}: the next instance id would repeat one"
                        ));
                    }
                    self.counters.insert(agent.to_string(), n);
                }
            }
            Err(e) => bad.push(format!("1: {e}")),
        }
        if let Err(e) = parse_file(&daemon_dir.join("schedule.json")) {
            bad.push(format!("1: {e}"));
        }
        // The error log: every whole line parses (read incrementally).
        let (offset, lines) = &mut self.errors_log;
        match read_history(&daemon_dir.join("errors.jsonl"), *offset) {
            Err(e) => bad.push(format!("1: .daemon/errors.jsonl: {e}")),
            Ok(history) => {
                for (tail, segment) in history.parts {
                    let whole = tail.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                    let text = String::from_utf8_lossy(&tail[..whole]).to_string();
                    let count = text.lines().count();
                    for (i, line) in text.lines().enumerate() {
                        *lines += 1;
                        let closed_torn = segment && i + 1 == count;
                        if !line.trim().is_empty()
                            && !closed_torn
                            && serde_json::from_str::<Value>(line).is_err()
                        {
                            bad.push(format!(
                                "1: .daemon/errors.jsonl line {lines} does not parse, and it is not the last line: {line:?}"
                            ));
                        }
                    }
                    *offset += whole as u64;
                }
            }
        }
        match parse_file(&daemon_dir.join("daemon.json")) {
            Ok(Some(hb)) => {
                if let Some(pid) = daemon
                    && hb["pid"] != pid
                {
                    bad.push(format!(
                        "1: .daemon/daemon.json names pid {}, not the running daemon {pid}",
                        hb["pid"]
                    ));
                }
            }
            Ok(None) => bad.push("1: .daemon/daemon.json is missing".into()),
            Err(e) => bad.push(format!("1: {e}")),
        }

        // 2. Every delivered message is in exactly one place.
        let mut sent: HashSet<&str> = HashSet::new();
        let (mut waiting, mut human_waiting, mut processed, mut rejected) = (0, 0, 0, 0);
        for d in delivered {
            sent.insert(d.id.as_str());
            let places = found.get(&d.id).map(Vec::as_slice).unwrap_or_default();
            let [one] = places else {
                if places.is_empty() {
                    bad.push(format!(
                        "2: message {} to {} is lost: not waiting, claimed, processed or rejected",
                        d.id, d.agent
                    ));
                } else {
                    let where_: Vec<String> = places
                        .iter()
                        .map(|f| format!("{:?} at {}", f.place, f.path.display()))
                        .collect();
                    bad.push(format!(
                        "2: message {} to {} is in {} places: {}",
                        d.id,
                        d.agent,
                        places.len(),
                        where_.join("; ")
                    ));
                }
                continue;
            };
            if one.agent != d.agent {
                bad.push(format!(
                    "2: message {} to {} is in {}'s inbox: {}",
                    d.id,
                    d.agent,
                    one.agent,
                    one.path.display()
                ));
            }
            match &one.place {
                Place::Waiting if one.agent == HUMAN => human_waiting += 1,
                Place::Waiting => waiting += 1,
                Place::Claimed(sid) => {
                    if running.get(one.agent) != Some(sid) {
                        bad.push(format!(
                            "2: message {} is claimed by session {sid} of {}, which is not running (running: {:?}): {}",
                            d.id,
                            one.agent,
                            running.get(one.agent),
                            one.path.display()
                        ));
                    }
                }
                Place::Processed => {
                    processed += 1;
                    self.ever_processed.insert(d.id.clone());
                    // 6. The journal says which session processed it.
                    if !journals
                        .get(one.agent)
                        .is_some_and(|j| j.processed.contains(&d.id))
                    {
                        out.extended.push((
                            6,
                            d.id.clone(),
                            format!(
                                "{} is in processed/ but no session_end (or message_expired) in {}/journal.jsonl lists it",
                                one.path.display(),
                                one.agent
                            ),
                        ));
                    }
                }
                Place::Rejected(reason) => {
                    rejected += 1;
                    let name = one.path.file_name().unwrap_or_default().to_string_lossy();
                    let journaled = journals
                        .get(one.agent)
                        .is_some_and(|j| j.rejected.contains(&format!("inbox/rejected/{name}")));
                    if reason == NO_REASON || !journaled {
                        // 9. A rejection says why, in rejected/ and the journal.
                        out.extended.push((
                            9,
                            d.id.clone(),
                            format!(
                                "{}: {}, {}",
                                one.path.display(),
                                if reason == NO_REASON {
                                    "no .reason.json"
                                } else {
                                    "a .reason.json"
                                },
                                if journaled {
                                    "a message_rejected event"
                                } else {
                                    "no message_rejected event in the journal"
                                }
                            ),
                        ));
                    } else if !reason.starts_with("undeliverable") {
                        bad.push(format!(
                            "2: message {} was rejected, not as undeliverable: {reason} ({})",
                            d.id,
                            one.path.display()
                        ));
                    }
                }
            }
            if one.place != Place::Processed && self.ever_processed.contains(&d.id) {
                bad.push(format!(
                    "2: message {} was in processed/ and is now {:?}: {}",
                    d.id,
                    one.place,
                    one.path.display()
                ));
            }
        }
        for (id, places) in &found {
            if !sent.contains(id.as_str()) {
                let paths: Vec<String> = places
                    .iter()
                    .map(|f| f.path.display().to_string())
                    .collect();
                bad.push(format!(
                    "2: a message nobody sent, id {id}: {}",
                    paths.join("; ")
                ));
            }
        }

        // 3. Nothing of an old daemon's sessions is alive (after a stop,
        // nothing of any).
        let old: BTreeSet<u32> = self
            .daemons
            .iter()
            .copied()
            .filter(|p| Some(*p) != daemon)
            .collect();
        for (pid, marker, cmdline) in session_processes(&old) {
            bad.push(format!(
                "3: pid {pid} ({cmdline}) of session AGENT_STATE_RUN={marker} of a daemon that is gone is still alive"
            ));
        }

        let s = &mut self.stats;
        let sum = |f: fn(&JournalFacts) -> u64| self.journals.values().map(f).sum::<u64>();
        s.sessions = sum(|j| j.sessions);
        s.completed = sum(|j| j.completed);
        s.failed = sum(|j| j.failed);
        s.interrupted = sum(|j| j.interrupted);
        s.timeouts = sum(|j| j.timeouts);
        s.schedule_missed = sum(|j| j.schedule_missed);
        s.waiting = waiting;
        s.human_waiting = human_waiting;
        s.processed = processed;
        s.rejected = rejected;
        s.temp_leftovers = temp_leftovers;
        for (n, key, text) in &out.extended {
            s.extended
                .entry(*n)
                .or_default()
                .entry(key.clone())
                .or_insert_with(|| text.clone());
        }
        out
    }
}

// ---- the daemon ---------------------------------------------------------------

const DAEMON_ENV_REMOVED: [&str; 6] = [
    "NOTIFY_SOCKET",
    "JOURNAL_STREAM",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "AGENT_STATE_FAKE_NOW",
    "AGENT_STATE_LOG",
];

/// Start a daemon at the next fake time and wait until it is ready
/// (`daemon.json` names its pid). A daemon that refuses to start fails the
/// test, with the reason.
fn start_daemon(env: &Env, clock: &mut FakeClock, rng: &mut Rng, seed: &str) -> Daemon {
    let fake = clock.next(rng);
    let vars = [
        ("AGENT_STATE_FAKE_NOW", fake.as_str()),
        ("AGENT_STATE_BIN", BIN),
        ("AGENT_STATE_CRASH_SEED", seed),
    ];
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Daemon::start(env, &vars))) {
        Ok(d) => d,
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            if text.contains("another agent-state daemon is already running") {
                panic!(
                    "crash (seed {seed}): the restarted daemon refused to start, exit 64, although the \
                     previous one was SIGKILLed and reaped: `.daemon/lock` was held at that instant, most \
                     likely by the shared-lock probe of an `agent-state wake` of the sender \
                     (src/daemon/files.rs daemon_running). Under systemd, exit 64 is in \
                     RestartPreventExitStatus: the daemon would stay down.\n{text}"
                );
            }
            std::panic::resume_unwind(panic)
        }
    }
}

/// Start a daemon and SIGKILL it `after` later, whatever it is doing (most
/// likely recovering, or not yet ready). Returns its pid.
fn start_and_kill_early(env: &Env, vars: &[(&str, &str)], after: Duration, log: &Path) -> u32 {
    let file = File::create(log).expect("create daemon log");
    let mut cmd = env.command(&["daemon"]);
    for var in DAEMON_ENV_REMOVED {
        cmd.env_remove(var);
    }
    cmd.envs(vars.iter().copied());
    cmd.stdout(file.try_clone().expect("dup log"));
    cmd.stderr(file);
    let mut child = cmd.spawn().expect("spawn agent-state daemon");
    // Kept: the moment of the kill is the subject (whatever state it hits).
    std::thread::sleep(after);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGKILL,
    );
    let _ = child.wait();
    child.id()
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Fail the test with everything needed to look into it; keep the state.
fn fail(env: &mut Env, seed: u64, at: &str, bad: &[String], logs: &[PathBuf]) -> ! {
    env.dir.disable_cleanup(true);
    let mut text = format!(
        "crash: {} invariant violation(s) at {at} (seed {seed}; replay with AGENT_STATE_CRASH_SEED={seed}); state kept in {}\n",
        bad.len(),
        env.dir.path().display()
    );
    for b in bad.iter().take(40) {
        text.push_str(&format!("  - {b}\n"));
    }
    for log in logs.iter().rev().take(2).rev() {
        text.push_str(&format!(
            "---- {} (last 40 lines) ----\n{}\n",
            log.display(),
            tail(log, 40)
        ));
    }
    panic!("{text}");
}

/// The failures of a check: invariants 1-4, and 5-8 when strict.
fn failures(findings: Findings, strict: bool) -> Vec<String> {
    let mut bad = findings.bad;
    if strict {
        bad.extend(
            findings
                .extended
                .into_iter()
                .map(|(n, _, t)| format!("{n}: {t}")),
        );
    }
    bad
}

#[test]
fn crash_consistency_under_random_sigkills() {
    let seed = env_var("AGENT_STATE_CRASH_SEED")
        .map(|s| parse_u64(&s).unwrap_or_else(|| panic!("AGENT_STATE_CRASH_SEED={s:?}")))
        .unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            (t.as_nanos() as u64) ^ ((std::process::id() as u64) << 32)
        });
    let iterations = env_var("AGENT_STATE_CRASH_ITERATIONS")
        .map(|s| parse_u64(&s).unwrap_or_else(|| panic!("AGENT_STATE_CRASH_ITERATIONS={s:?}")))
        .unwrap_or(20);
    // The extended invariants hold since the journal is the commit record of
    // a session's end; AGENT_STATE_CRASH_STRICT=0 only counts them.
    let strict = env_var("AGENT_STATE_CRASH_STRICT").is_none_or(|v| v != "0");
    eprintln!(
        "crash: seed {seed} (replay: AGENT_STATE_CRASH_SEED={seed}), {iterations} iterations{}",
        if strict { ", strict" } else { "" }
    );
    let t0 = Instant::now();
    let mut rng = Rng::new(seed);
    let mut clock = FakeClock::new();
    let seed_text = seed.to_string();

    let mut env = Env::with_config("");
    env.set_config(&config(&fixture()));
    env.ok(&["bootstrap"]);

    let shared = Arc::new(Shared {
        root: env.root.clone(),
        config: env.config.clone(),
        gate: Mutex::new(()),
        stop: AtomicBool::new(false),
        delivered: Mutex::new(Vec::new()),
        wake_files: AtomicU64::new(0),
        cli_sends: AtomicU64::new(0),
        cli_wakes: AtomicU64::new(0),
    });
    let _stop = StopOnDrop(shared.clone());
    let sender_thread = {
        let shared = shared.clone();
        std::thread::spawn(move || sender(shared, seed))
    };

    let mut checker = Checker::new(&env.root);
    let mut logs: Vec<PathBuf> = Vec::new();
    let mut daemon = start_daemon(&env, &mut clock, &mut rng, &seed_text);
    checker.daemons.insert(daemon.pid);
    logs.push(daemon.log.clone());
    for i in 1..=iterations {
        // Kept: a random moment for the next SIGKILL, the subject.
        std::thread::sleep(ms(rng.range(30, 400)));
        if sender_thread.is_finished() {
            break; // it panicked: joined below
        }
        daemon.kill9();
        checker.stats.kills += 1;
        if rng.percent(10) {
            let fake = clock.next(&mut rng);
            let vars = [
                ("AGENT_STATE_FAKE_NOW", fake.as_str()),
                ("AGENT_STATE_BIN", BIN),
                ("AGENT_STATE_CRASH_SEED", seed_text.as_str()),
            ];
            let log = env.tmp(&format!("daemon-early-{i}.log"));
            let pid = start_and_kill_early(&env, &vars, ms(rng.range(0, 20)), &log);
            checker.daemons.insert(pid);
            logs.push(log);
            checker.stats.early_kills += 1;
        }
        drop(daemon);
        let t = Instant::now();
        daemon = start_daemon(&env, &mut clock, &mut rng, &seed_text);
        let took = t.elapsed();
        checker.stats.ready += took;
        if took > checker.stats.slowest_ready.0 {
            checker.stats.slowest_ready = (took, daemon.log.clone());
        }
        checker.daemons.insert(daemon.pid);
        logs.push(daemon.log.clone());
        let t = Instant::now();
        let findings = {
            let _gate = lock(&shared.gate);
            let delivered = lock(&shared.delivered);
            checker.check(Some(daemon.pid), &delivered)
        };
        checker.stats.checking += t.elapsed();
        let bad = failures(findings, strict);
        if !bad.is_empty() {
            fail(&mut env, seed, &format!("iteration {i}"), &bad, &logs);
        }
    }

    // Stop sending, and wake every agent with messages waiting until the
    // inboxes are empty (for at most 10 s: waiting messages are allowed).
    shared.stop.store(true, Ordering::SeqCst);
    if let Err(panic) = sender_thread.join() {
        std::panic::resume_unwind(panic);
    }
    let mut n = 0;
    let drained = poll_until(Duration::from_secs(10), || {
        let mut idle = true;
        for agent in AGENTS {
            let waiting = list(&env.path(agent, "inbox"))
                .iter()
                .any(|n| is_message_name(n));
            let claimed = !list(&env.path(agent, "inbox/.claimed")).is_empty();
            idle &= !waiting && !claimed;
            if waiting && !claimed {
                n += 1;
                let _ = deliver_file(&env.root, agent, &format!(".wake-drain-{n}"), b"drain\n");
            }
        }
        // Kept: gives the wakes just asked for a moment before the next
        // look (poll_until's own pause is 25 ms); the wait is on `idle`.
        std::thread::sleep(ms(50));
        idle
    });
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(60));
    if status.code() != Some(0) {
        let bad = [format!("the daemon exited with {status:?} after SIGTERM")];
        fail(&mut env, seed, "the final stop", &bad, &logs);
    }
    let mut bad = {
        let delivered = lock(&shared.delivered);
        failures(checker.check(None, &delivered), strict)
    };
    for agent in AGENTS {
        let mut left = Vec::new();
        walk(&env.path(agent, "inbox/.claimed"), "", &mut left);
        if !left.is_empty() {
            bad.push(format!(
                "2: {agent}/inbox/.claimed still holds {left:?} after a clean stop"
            ));
        }
    }
    for (pid, marker, cmdline) in session_processes(&checker.daemons) {
        bad.push(format!(
            "3: pid {pid} ({cmdline}) of session AGENT_STATE_RUN={marker} is alive after the daemon stopped"
        ));
    }
    let out = env.run(&["check"]);
    if !out.status.success() {
        bad.push(format!(
            "agent-state check after the final stop exited {:?}:\n{}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if !bad.is_empty() {
        fail(&mut env, seed, "the final stop", &bad, &logs);
    }

    if env_var("AGENT_STATE_CRASH_KEEP").is_some() {
        env.dir.disable_cleanup(true);
        eprintln!("crash: state kept in {}", env.dir.path().display());
    }
    let s = &checker.stats;
    let delivered = lock(&shared.delivered).len();
    let mut names = Vec::new();
    walk(&env.root, "", &mut names);
    let segments = names
        .iter()
        .filter(|n| n.contains(".jsonl.") && n.ends_with(".zst"))
        .count();
    if iterations >= 50 {
        assert!(
            segments > 0,
            "no log was rotated in {iterations} iterations: the harness no longer kills rotations"
        );
    }
    let per = |d: Duration| d.as_secs_f64() * 1000.0 / iterations.max(1) as f64;
    eprintln!(
        "crash: seed {seed}, {iterations} iterations in {:.1}s: {} SIGKILLs ({} of them during start-up), {} checks passed; \
         per iteration: ready after {:.0} ms, checked in {:.0} ms; slowest start {:.0} ms ({})\n\
         crash: sessions seen {} (completed {}, error {} of which interrupted {}, timeout {}), schedule_missed {}\n\
         crash: messages delivered {delivered} ({} with `agent-state send`): processed {}, rejected as undeliverable {}, \
         waiting {}{} (+{} in the human mailbox); wake requests {} (+{} `agent-state wake`)\n\
         crash: temp files left by killed writers: {}; torn last journal lines seen: {}; rotated log segments: {}",
        t0.elapsed().as_secs_f64(),
        s.kills + s.early_kills,
        s.early_kills,
        s.checks,
        per(s.ready),
        per(s.checking),
        s.slowest_ready.0.as_secs_f64() * 1000.0,
        s.slowest_ready.1.display(),
        s.sessions,
        s.completed,
        s.failed,
        s.interrupted,
        s.timeouts,
        s.schedule_missed,
        shared.cli_sends.load(Ordering::Relaxed),
        s.processed,
        s.rejected,
        s.waiting,
        if drained {
            ""
        } else {
            " (not drained in 10 s)"
        },
        s.human_waiting,
        shared.wake_files.load(Ordering::Relaxed),
        shared.cli_wakes.load(Ordering::Relaxed),
        s.temp_leftovers,
        s.torn_last_lines,
        segments,
    );
    for (n, what) in EXTENDED {
        let seen = s.extended.get(&n);
        eprintln!(
            "crash: invariant {n} ({what}): {}{}",
            match seen.map_or(0, BTreeMap::len) {
                0 => "held".to_string(),
                k => format!("{k} finding(s), e.g. "),
            },
            seen.and_then(|f| f.values().next())
                .cloned()
                .unwrap_or_default()
        );
    }
}
