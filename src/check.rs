//! `agent-state check [--repair]`: find every kind of damage the state can
//! have, and with `--repair` mend what can be mended without losing anything.
//!
//! Corrupt files are set aside and rebuilt from the journal; torn journal
//! lines are moved to a side file; sessions left running by a dead owner are
//! recorded as interrupted and their messages returned; malformed inbox files
//! go to `rejected/`; missing directories and files are re-created.

use std::fmt;

use serde::Serialize;

use crate::clock::{FileClock, Timestamp};
use crate::config::{AgentKind, Config};
use crate::error::IoContext;
use crate::error::Result;
use crate::hooks;
use crate::inbox::{self, Verdict};
use crate::state::journal;
use crate::state::rebuild::{self, StateFileKind};
use crate::state::session::Session;
use crate::state::{AgentDir, StateRoot, atomic, bootstrap, prune, set_aside_name};

pub mod needs;

/// What is wrong with a file or directory of the state, rendered once
/// ([`fmt::Display`]; JSON has the same sentence). `--repair` decides by
/// the kind, never by the words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The state root does not exist.
    RootMissing,
    /// An agent's directory does not exist.
    NotBootstrapped,
    MissingDirectory,
    /// A state file (or memory.md) is missing.
    Missing,
    /// A link, FIFO, file for a directory...: never followed or opened.
    Unsafe(String),
    /// An inbox directory or a daemon lock file with another mode.
    Mode {
        was: u32,
        wanted: u32,
    },
    /// A mode the store never writes (setuid, executable, world-writable).
    ForeignMode {
        mode: u32,
        wanted: u32,
    },
    /// A state file that does not parse.
    Corrupt(String),
    TornLine {
        line: usize,
        text: String,
    },
    /// A session recorded as running whose owner is gone.
    OwnerGone {
        session: String,
        pid: Option<i32>,
        why: String,
    },
    /// Messages claimed by a session that is not running.
    Claimed,
    /// A message whose name is not UTF-8.
    Undecodable,
    MalformedMessage(String),
    /// A temp file of an interrupted write.
    Temp,
    /// A rotated journal segment that cannot be read.
    BadSegment(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const PERMISSION_MODEL: &str = "(see the README's permission model)";
        match self {
            Problem::RootMissing => {
                f.write_str("the state root does not exist; run `agent-state bootstrap`")
            }
            Problem::NotBootstrapped => {
                f.write_str("not bootstrapped: the directory does not exist")
            }
            Problem::MissingDirectory => f.write_str("missing directory"),
            Problem::Missing => f.write_str("missing"),
            Problem::Unsafe(why) => write!(f, "unsafe: {why}"),
            Problem::Mode { was, wanted } => {
                write!(f, "mode {was:o}, should be {wanted:o} {PERMISSION_MODEL}")
            }
            Problem::ForeignMode { mode, wanted } => write!(
                f,
                "a mode the store never writes: {mode:o}, should be {wanted:o} {PERMISSION_MODEL}"
            ),
            Problem::Corrupt(why) => write!(f, "corrupt: {why}"),
            Problem::TornLine { line, text } => write!(f, "torn line {line}: {text:?}"),
            Problem::OwnerGone { session, pid, why } => write!(
                f,
                "session {session} is recorded as running, but its owner (pid {}) is gone: {why}",
                pid.map(|p| p.to_string())
                    .unwrap_or_else(|| "unknown".into())
            ),
            Problem::Claimed => f.write_str("messages claimed by a session that is not running"),
            Problem::Undecodable => f.write_str(
                "a message whose name is not UTF-8 (shown escaped): --repair rejects it under a safe name, its bytes recorded",
            ),
            Problem::MalformedMessage(why) => write!(f, "malformed message: {why}"),
            Problem::Temp => f.write_str(
                "a temp file left by a write that was interrupted (the file it was replacing is intact)",
            ),
            Problem::BadSegment(why) => write!(
                f,
                "a rotated journal segment that cannot be read, skipped by every reader: {why}"
            ),
        }
    }
}

impl Serialize for Problem {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[derive(Debug, Serialize)]
pub struct Finding {
    pub agent: String,
    /// The file or directory, relative to the agent's directory.
    pub file: String,
    pub problem: Problem,
    /// What `--repair` did about it, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repaired: Option<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct CheckReport {
    pub findings: Vec<Finding>,
    /// Things worth knowing that are not damage.
    pub notes: Vec<String>,
    /// What the daemon will need that the config names ([`needs`]).
    pub needs: Vec<needs::Need>,
}

impl CheckReport {
    pub fn unrepaired(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.repaired.is_none())
            .count()
    }

    /// Needs the daemon cannot work with as they stand.
    pub fn config_errors(&self) -> usize {
        self.needs
            .iter()
            .filter(|n| n.level() == needs::Level::Error)
            .count()
    }
}

/// Check every agent's files at `now`; inbox files settle and temp files
/// age by `files`, read when each agent is looked at.
pub fn check(
    config: &Config,
    repair: bool,
    now: Timestamp,
    files: FileClock,
) -> Result<CheckReport> {
    let root = StateRoot::new(&config.state_root);
    let mut report = CheckReport {
        needs: needs::check(config),
        ..Default::default()
    };
    // Before the daemon's first start (it leaves a heartbeat), what it will
    // create is not missing yet: said, not counted as a problem.
    let before_first_start = !crate::fsx::exists(&root.daemon_dir().join("daemon.json"));
    if !crate::fsx::is_dir(&root.path) && before_first_start && !repair {
        report.notes.push(format!(
            "{}: the state root does not exist yet; the daemon creates it and every agent's directory at its first start (or run `agent-state bootstrap`)",
            root.path.display()
        ));
        return Ok(report);
    }
    if !crate::fsx::is_dir(&root.path) {
        report.findings.push(Finding {
            agent: "-".into(),
            file: root.path.display().to_string(),
            problem: Problem::RootMissing,
            repaired: None,
        });
        if !repair {
            return Ok(report);
        }
        bootstrap::root(&root)?;
        report.findings.last_mut().expect("just pushed").repaired = Some("created".into());
    }
    daemon_lock_modes(&root, repair, &mut report.findings);
    let limited: Vec<&str> = config
        .agents
        .iter()
        .filter(|a| a.kind == crate::config::AgentKind::Agent && a.session.memory_max.is_some())
        .map(|a| a.name.as_str())
        .collect();
    let controllers = [
        "/sys/fs/cgroup/cgroup.controllers",
        "/sys/fs/cgroup/unified/cgroup.controllers",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok());
    report
        .notes
        .extend(memory_note(&limited, controllers.as_deref()));
    for agent in &config.agents {
        let dir = root.agent(&agent.name);
        if before_first_start && !repair && !crate::fsx::exists(&dir.path) {
            report.notes.push(format!(
                "{}: not bootstrapped yet; the daemon creates its directory at its first start (or run `agent-state bootstrap {}`)",
                agent.name, agent.name
            ));
            continue;
        }
        let mut found = Vec::new();
        check_agent(
            config,
            agent.kind,
            &dir,
            &mut found,
            &mut report.notes,
            now,
            files,
        )?;
        if repair && !found.is_empty() {
            repair_agent(config, &dir, &mut found, now, files)?;
        }
        report.findings.extend(found);
    }
    // Directories that look like agents but are not configured.
    if let Ok(entries) = crate::fsx::list(&root.path) {
        let mut extra: Vec<String> = entries
            .into_iter()
            .filter(|n| crate::fsx::is_dir(&root.path.join(n)))
            .filter_map(|n| n.into_string().ok())
            .filter(|n| !n.starts_with('.') && !config.agents.iter().any(|a| a.name.as_str() == n))
            .collect();
        extra.sort();
        for name in extra {
            report.notes.push(format!(
                "{name}: a directory in the state root that is not configured; it is kept as it is"
            ));
        }
    }
    Ok(report)
}

/// Whether `memory_max` can apply here: only in per-session cgroups with
/// the memory controller of cgroup v2 (`controllers`: its root's
/// `cgroup.controllers`, `None` without cgroup v2). Pure.
fn memory_note(agents: &[&str], controllers: Option<&str>) -> Option<String> {
    if agents.is_empty() {
        return None;
    }
    let who = agents.join(", ");
    Some(match controllers {
        Some(c) if c.split_whitespace().any(|c| c == "memory") => format!(
            "{who}: memory_max applies where the daemon runs under systemd with Delegate=yes (a cgroup per session: memory.max, memory.high at 90%, and memory.swap.max 0 where the kernel accounts swap, so a session past it is OOM-killed rather than swapped); run elsewhere, the daemon logs that it is not applied"
        ),
        _ => format!(
            "{who}: memory_max cannot apply on this host (no cgroup v2 memory controller); sessions run without it, and the daemon logs so"
        ),
    })
}

/// `.daemon/lock` and `.daemon/counters.lock` are the service user's alone
/// ([`crate::state::lock::LOCK_FILE_MODE`]): a wider mode (an install from
/// before) lets a member of the inbox group flock them and keep the daemon
/// from starting or sessions from being numbered. The daemon narrows them
/// when it opens them; `check` lists them, `--repair` narrows them (their
/// owner or root).
fn daemon_lock_modes(root: &StateRoot, repair: bool, found: &mut Vec<Finding>) {
    use nix::sys::stat::SFlag;
    let wanted = crate::state::lock::LOCK_FILE_MODE;
    for name in ["lock", "counters.lock"] {
        let path = root.daemon_dir().join(name);
        let Ok(Some(st)) = crate::fsx::metadata(&path) else {
            continue;
        };
        let was = st.st_mode & 0o7777;
        if crate::fsx::file_type(&st) != SFlag::S_IFREG || was == wanted {
            continue;
        }
        let repaired = repair
            .then(|| {
                let file = crate::state::lock::open_lock_file(&path, wanted).ok()?;
                crate::state::lock::narrow_mode(&file, &path)
                    .ok()?
                    .then(|| "mode set".to_string())
            })
            .flatten();
        found.push(Finding {
            agent: "-".into(),
            file: format!(".daemon/{name}"),
            problem: Problem::Mode { was, wanted },
            repaired,
        });
    }
}

fn finding(found: &mut Vec<Finding>, dir: &AgentDir, file: impl Into<String>, problem: Problem) {
    found.push(Finding {
        agent: dir.name.to_string(),
        file: file.into(),
        problem,
        repaired: None,
    });
}

fn check_agent(
    config: &Config,
    kind: AgentKind,
    dir: &AgentDir,
    found: &mut Vec<Finding>,
    notes: &mut Vec<String>,
    now: Timestamp,
    files: FileClock,
) -> Result<()> {
    if !crate::fsx::exists(&dir.path) {
        finding(found, dir, ".", Problem::NotBootstrapped);
        return Ok(());
    }
    // Anything that is not what it should be (a link, a FIFO, a file for a
    // directory or the reverse) is never followed or opened; --repair sets it
    // aside and recreates what belongs there.
    let mut unsafe_paths = Vec::new();
    for (path, want_dir) in expected_entries(dir) {
        // Only the outermost: what is below a refused path is never looked at.
        if unsafe_paths
            .iter()
            .any(|u: &std::path::PathBuf| path.starts_with(u))
        {
            continue;
        }
        let rel = match path.strip_prefix(&dir.path) {
            Ok(r) if r.as_os_str().is_empty() => ".".to_string(),
            Ok(r) => r.display().to_string(),
            Err(_) => path.display().to_string(),
        };
        match crate::fsx::metadata(&path) {
            Ok(Some(st)) => {
                let is_dir = crate::fsx::file_type(&st) == nix::sys::stat::SFlag::S_IFDIR;
                let is_file = crate::fsx::file_type(&st) == nix::sys::stat::SFlag::S_IFREG;
                if (want_dir && !is_dir) || (!want_dir && !is_file) {
                    let want = if want_dir {
                        "a directory"
                    } else {
                        "a regular file"
                    };
                    let rel = if want_dir && rel != "." {
                        rel + "/"
                    } else {
                        rel
                    };
                    finding(
                        found,
                        dir,
                        rel,
                        Problem::Unsafe(format!(
                            "is {}, not {want} (never followed or opened)",
                            crate::fsx::describe_stat(&st)
                        )),
                    );
                    unsafe_paths.push(path);
                }
            }
            Ok(None) if want_dir => finding(found, dir, rel + "/", Problem::MissingDirectory),
            Ok(None) => {}
            Err(e) => {
                finding(found, dir, rel, Problem::Unsafe(e.to_string()));
                unsafe_paths.push(path);
            }
        }
    }
    if unsafe_paths.contains(&dir.path) {
        return Ok(());
    }
    // Inbox directories with another mode (an install from before the
    // sticky bit, a hand-made directory): --repair sets it.
    for fix in bootstrap::wrong_modes(dir) {
        finding(
            found,
            dir,
            fix.dir,
            Problem::Mode {
                was: fix.was,
                wanted: fix.wanted,
            },
        );
    }
    foreign_modes(dir, found);
    if kind == AgentKind::Agent {
        for k in StateFileKind::ALL {
            let path = dir.file(k.file_name());
            if unsafe_paths.contains(&path) {
                continue;
            }
            let problem = match k {
                StateFileKind::Report => parse_problem::<crate::state::report::Report>(&path),
                StateFileKind::Tasks => parse_problem::<crate::state::tasks::TaskFile>(&path),
                StateFileKind::Session => parse_problem::<Session>(&path),
                StateFileKind::Metrics => parse_problem::<crate::state::metrics::Metrics>(&path),
            };
            match problem {
                Some(p) => finding(found, dir, k.file_name(), Problem::Corrupt(p)),
                None if !crate::fsx::exists(&path) && k != StateFileKind::Session => {
                    finding(found, dir, k.file_name(), Problem::Missing)
                }
                None => {}
            }
        }
        if !crate::fsx::exists(&dir.memory()) {
            finding(found, dir, "memory.md", Problem::Missing);
        }
    }
    if unsafe_paths.contains(&dir.journal()) {
        return Ok(());
    }
    check_segments(dir, found, notes)?;
    let scan = journal::read(&dir.store, &dir.journal())?;
    for t in &scan.torn {
        finding(
            found,
            dir,
            "journal.jsonl",
            Problem::TornLine {
                line: t.line,
                text: t.text.clone(),
            },
        );
    }
    for t in &scan.unreadable {
        notes.push(format!(
            "{}: journal.jsonl line {} is JSON but not an event this version reads; it is kept and skipped",
            dir.name, t.line
        ));
    }
    let session: Option<Session> = atomic::read_json(&dir.session()).unwrap_or(None);
    let running = session
        .as_ref()
        .filter(|s| s.is_running())
        .map(|s| s.session_id.clone());
    let timeout = config
        .agents
        .iter()
        .find(|a| a.name == dir.name)
        .map(|a| a.session.timeout)
        // An agent no longer configured: the default timeout (90m).
        .unwrap_or(std::time::Duration::from_secs(90 * 60));
    if let Some(s) = &session
        && let Some(why) = hooks::stale(dir, s, timeout, now)
    {
        finding(
            found,
            dir,
            "session.json",
            Problem::OwnerGone {
                session: s.session_id.to_string(),
                pid: s.owner_pid,
                why: why.to_string(),
            },
        );
    }
    // An inbox directory that is not what it should be is reported above
    // and never looked into.
    if unsafe_paths.iter().any(|p| p.starts_with(dir.inbox())) {
        return Ok(());
    }
    for claimed in inbox::claimed_sessions(dir)? {
        if running.as_deref() != Some(claimed.as_str()) {
            finding(
                found,
                dir,
                format!("inbox/.claimed/{claimed}/"),
                Problem::Claimed,
            );
        }
    }
    for name in inbox::undecodable_names(dir)? {
        finding(
            found,
            dir,
            format!("inbox/{}", inbox::escaped_name(&name)),
            Problem::Undecodable,
        );
    }
    let sys_now = files.now();
    let settle = config
        .agent(&dir.name)
        .map(|a| a.session.inbox_settle)
        .unwrap_or(inbox::SETTLE_TIME);
    for name in inbox::waiting_names(dir)? {
        match inbox::inspect(dir, &name, sys_now, inbox::Intake::settle(settle)) {
            Verdict::Valid(_) => {}
            Verdict::Unsettled(why) => notes.push(format!(
                "{}: inbox/{name} does not parse yet ({why}); it was written moments ago, so it is left to settle",
                dir.name
            )),
            Verdict::Invalid(r) => finding(found, dir, format!("inbox/{name}"), Problem::MalformedMessage(r.reason.to_string())),
        }
    }
    // Temp files of writes a crash interrupted (the old file is intact).
    let cutoff = files.now() - prune::STALE_TEMP_AGE;
    for sub in [
        dir.path.clone(),
        dir.inbox(),
        dir.sessions_dir(),
        dir.inbox_tmp(),
    ] {
        let Ok(entries) = crate::fsx::list(&sub) else {
            continue;
        };
        for name in entries {
            let path = sub.join(&name);
            let name = name.to_string_lossy().to_string();
            let in_tmp = sub == dir.inbox_tmp();
            let old = crate::fsx::metadata(&path)
                .ok()
                .flatten()
                .filter(|st| crate::fsx::file_type(st) == nix::sys::stat::SFlag::S_IFREG)
                .map(|st| crate::fsx::modified(&st))
                .is_some_and(|t| t < cutoff);
            if old && (in_tmp || prune::is_atomic_temp_name(&name)) {
                let rel = path
                    .strip_prefix(&dir.path)
                    .map(|p| p.display().to_string())
                    .unwrap_or(name);
                finding(found, dir, rel, Problem::Temp);
            }
        }
    }
    let _ = config;
    Ok(())
}

/// Rotated journal segments that cannot be read (`--repair` sets them
/// aside), and those already set aside (said, not counted: nothing more
/// can be done but read them by hand).
fn check_segments(dir: &AgentDir, found: &mut Vec<Finding>, notes: &mut Vec<String>) -> Result<()> {
    for (segment, why) in crate::state::rotation::bad_segments(&dir.journal())? {
        let name = segment
            .path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        finding(found, dir, name, Problem::BadSegment(why.to_string()));
    }
    let mut aside: Vec<String> = crate::fsx::list(&dir.path)?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| crate::state::rotation::is_set_aside_segment("journal.jsonl", n))
        .collect();
    aside.sort();
    for name in aside {
        notes.push(format!(
            "{}: {name} is a journal segment set aside as unreadable; the history it held is left out of usage, metrics and events (`zstd -d` may recover part of it); remove it when done",
            dir.name
        ));
    }
    Ok(())
}

/// Every directory and file an agent has, and whether it is a directory.
fn expected_entries(dir: &AgentDir) -> Vec<(std::path::PathBuf, bool)> {
    let mut out: Vec<_> = dir.directories().into_iter().map(|d| (d, true)).collect();
    for f in dir.state_files().into_iter().chain([dir.lock_file()]) {
        out.push((f, false));
    }
    out
}

fn parse_problem<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Option<String> {
    match atomic::read_json::<T>(path) {
        Ok(_) => None,
        Err(crate::error::Error::Corrupt { reason, .. }) => Some(reason),
        Err(e) => Some(e.to_string()),
    }
}

fn repair_agent(
    config: &Config,
    dir: &AgentDir,
    found: &mut [Finding],
    now: Timestamp,
    files: FileClock,
) -> Result<()> {
    let agent = config.agent(&dir.name)?;
    // What is not what it should be is set aside first (renamed, never
    // followed: a link is moved, its target untouched), then recreated.
    for f in found
        .iter_mut()
        .filter(|f| matches!(f.problem, Problem::Unsafe(_)))
    {
        let path = match f.file.trim_end_matches('/') {
            "." => dir.path.clone(),
            rel => dir.path.join(rel),
        };
        let aside = crate::state::set_aside_name(&path, "unsafe", &now.compact());
        crate::fsx::rename(&path, &aside, false)?;
        f.repaired = Some(format!(
            "set aside as {}",
            aside.file_name().unwrap_or_default().to_string_lossy()
        ));
    }
    let needs_bootstrap = found.iter().any(|f| {
        matches!(
            f.problem,
            Problem::Missing | Problem::MissingDirectory | Problem::Unsafe(_)
        ) || f.file == "."
    });
    if needs_bootstrap {
        bootstrap::root(&StateRoot::new(&config.state_root))?;
        let created = bootstrap::agent(agent, dir, now)?;
        for f in found.iter_mut().filter(|f| {
            (matches!(f.problem, Problem::Missing | Problem::MissingDirectory) || f.file == ".")
                && f.repaired.is_none()
        }) {
            f.repaired = Some(format!("created ({} item(s) in all)", created.len()));
        }
    }
    let is_mode = |p: &Problem| matches!(p, Problem::Mode { .. });
    if found.iter().any(|f| is_mode(&f.problem)) {
        // (Bootstrapping above may have set them already.)
        bootstrap::repair_modes(dir)?;
        let still = bootstrap::wrong_modes(dir);
        for f in found.iter_mut().filter(|f| is_mode(&f.problem)) {
            if !still.iter().any(|x| x.dir == f.file) {
                f.repaired = Some("mode set".into());
            }
        }
    }
    repair_foreign_modes(dir, found)?;
    if found.iter().any(|f| f.problem == Problem::Temp) {
        let now = files.now();
        let stats = prune::prune_stale_temps(dir, now - prune::STALE_TEMP_AGE, now)
            .at("removing temp files in", &dir.path)?;
        for f in found.iter_mut().filter(|f| f.problem == Problem::Temp) {
            f.repaired = Some(format!("removed ({} temp file(s) in all)", stats.files));
        }
    }
    for f in found
        .iter_mut()
        .filter(|f| matches!(f.problem, Problem::BadSegment(_)))
    {
        let path = dir.path.join(&f.file);
        let start = crate::state::rotation::parse_segment_name("journal.jsonl", &f.file);
        let segment = crate::state::rotation::Segment {
            start: start.unwrap_or_default(),
            path,
        };
        let aside = crate::state::rotation::set_aside(&segment, now)?;
        f.repaired = Some(format!(
            "set aside as {}",
            aside.file_name().unwrap_or_default().to_string_lossy()
        ));
    }
    // Torn journal lines first: rebuilding reads the journal.
    let is_torn = |p: &Problem| matches!(p, Problem::TornLine { .. });
    if found.iter().any(|f| is_torn(&f.problem)) {
        let note = set_torn_lines_aside(dir, now)?;
        for f in found.iter_mut().filter(|f| is_torn(&f.problem)) {
            f.repaired = Some(note.clone());
        }
    }
    for k in StateFileKind::ALL {
        if let Some(f) = found
            .iter_mut()
            .find(|f| f.file == k.file_name() && matches!(f.problem, Problem::Corrupt(_)))
        {
            let lock = dir.lock()?;
            f.repaired = Some(rebuild::repair(dir, k, now)?);
            drop(lock);
        }
    }
    if let Some(f) = found
        .iter_mut()
        .find(|f| matches!(f.problem, Problem::OwnerGone { .. }))
    {
        let result = hooks::recover_stale(
            agent,
            dir,
            "interrupted: owner process gone (found by `agent-state check --repair`)",
            now,
        )?;
        f.repaired = result.map(|r| {
            format!(
                "recorded session {} as an error; {} message(s) returned to the inbox",
                r.session_id,
                r.returned.len()
            )
        });
    }
    for f in found.iter_mut().filter(|f| f.problem == Problem::Claimed) {
        let session = f
            .file
            .trim_start_matches("inbox/.claimed/")
            .trim_end_matches('/')
            .to_string();
        let lock = dir.lock()?;
        let (returned, undeliverable) = inbox::return_claimed_counting(dir, &session, now, false)?;
        drop(lock);
        f.repaired = Some(format!(
            "{} message(s) returned to the inbox, {} set aside as undeliverable",
            returned.len(),
            undeliverable.len()
        ));
    }
    if found.iter().any(|f| f.problem == Problem::Undecodable) {
        let lock = dir.lock()?;
        let rejected = inbox::reject_undecodable(dir, now)?;
        drop(lock);
        for f in found
            .iter_mut()
            .filter(|f| f.problem == Problem::Undecodable)
        {
            f.repaired = Some(format!(
                "moved to inbox/rejected/ ({} name(s) in all)",
                rejected.len()
            ));
        }
    }
    for f in found
        .iter_mut()
        .filter(|f| matches!(f.problem, Problem::MalformedMessage(_)))
    {
        let Problem::MalformedMessage(reason) = &f.problem else {
            continue;
        };
        let reason = reason.clone();
        let lock = dir.lock()?;
        let path = dir.path.join(&f.file);
        if crate::fsx::exists(&path) {
            let moved = inbox::reject(dir, &path, &reason, now)?;
            f.repaired = Some(format!(
                "moved to inbox/rejected/{}",
                moved.file_name().unwrap_or_default().to_string_lossy()
            ));
        }
        drop(lock);
    }
    Ok(())
}

/// Move torn lines out of the journal into `journal.jsonl.torn-STAMP`, and
/// rewrite the journal without them (atomically, under the lock).
fn set_torn_lines_aside(dir: &AgentDir, now: Timestamp) -> Result<String> {
    let lock = dir.lock()?;
    let path = dir.journal();
    let bytes = crate::fsx::read(&path)?.unwrap_or_default();
    let mut kept = Vec::with_capacity(bytes.len());
    let mut torn = Vec::new();
    for line in bytes.split_inclusive(|b| *b == b'\n') {
        let text = String::from_utf8_lossy(line);
        let body = text.trim_end_matches(['\n', '\r']);
        if body.trim().is_empty() || serde_json::from_str::<serde_json::Value>(body).is_ok() {
            kept.extend_from_slice(body.as_bytes());
            kept.push(b'\n');
        } else {
            torn.extend_from_slice(body.as_bytes());
            torn.push(b'\n');
        }
    }
    let aside = set_aside_name(&path, "torn", &now.compact());
    atomic::write_file(&dir.store, &aside, &torn, 0o644)?;
    atomic::write_file(&dir.store, &path, &kept, 0o644)?;
    drop(lock);
    Ok(format!(
        "torn lines moved to {}",
        aside.file_name().unwrap_or_default().to_string_lossy()
    ))
}

/// Files and directories with a mode the store never writes (setuid or
/// setgid, executable, world-writable: a hand, an old restore).
fn foreign_modes(dir: &AgentDir, found: &mut Vec<Finding>) {
    for f in crate::state::modes::foreign_in(dir) {
        finding(
            found,
            dir,
            f.rel,
            Problem::ForeignMode {
                mode: f.mode,
                wanted: f.wanted,
            },
        );
    }
}

/// `--repair` of [`foreign_modes`]: each set to the store's mode through a
/// handle that follows no link.
fn repair_foreign_modes(dir: &AgentDir, found: &mut [Finding]) -> Result<()> {
    let is_foreign = |p: &Problem| matches!(p, Problem::ForeignMode { .. });
    if !found.iter().any(|f| is_foreign(&f.problem)) {
        return Ok(());
    }
    for f in crate::state::modes::foreign_in(dir) {
        crate::state::modes::repair(dir, &f)?;
    }
    let still = crate::state::modes::foreign_in(dir);
    for f in found.iter_mut().filter(|f| is_foreign(&f.problem)) {
        if !still.iter().any(|s| s.rel == f.file) {
            f.repaired = Some("mode set".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod memory_note_tests {
    #[test]
    fn memory_max_is_said_to_apply_only_with_a_memory_controller() {
        use super::memory_note;
        assert_eq!(memory_note(&[], Some("memory")), None);
        let with = memory_note(&["rio"], Some("cpuset cpu io memory pids")).unwrap();
        assert!(with.starts_with("rio: memory_max applies where"), "{with}");
        assert!(with.contains("memory.swap.max 0 where"), "{with}");
        for controllers in [None, Some("cpu io pids")] {
            let without = memory_note(&["rio", "leo"], controllers).unwrap();
            assert!(
                without.starts_with("rio, leo: memory_max cannot apply on this host"),
                "{without}"
            );
        }
    }
}
