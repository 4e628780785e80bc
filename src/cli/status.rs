//! `agent-state status [AGENT]`: one line per agent.

use crate::cli::display::{self, Style, say};
use serde::Serialize;

use crate::access;
use crate::catalogue as errors;
use crate::cli::{Context, print_json};
use crate::clock::{Timestamp, ago, in_time};
use crate::config::{AgentConfig, AgentKind};
use crate::daemon::files::Lowered;
use crate::error::{Result, exit};
use crate::inbox;
use crate::state::error_log;
use crate::state::journal;
use crate::state::metrics::ROLLING_WINDOW;
use crate::state::report::{LastSession, Report};
use crate::state::session::SessionVerdict;
use crate::state::tasks::{TaskFile, TaskStatus};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One agent (default: all)
    pub agent: Option<String>,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Line {
    agent: String,
    kind: &'static str,
    /// The report status, `mailbox` for a human, `missing` if not bootstrapped.
    status: String,
    current_session: Option<String>,
    /// The worker host its running session runs on (daemon.json), when
    /// sessions run on workers (`[cluster]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    last_session: Option<LastSession>,
    next_wake_at: Option<Timestamp>,
    tasks_pending: usize,
    tasks_active: usize,
    /// Messages waiting; null when this user may not read the inbox.
    inbox_waiting: Option<usize>,
    sessions_30d: u64,
    /// Sessions that ended in error in the last 30 days (the journal).
    errors_30d: u64,
    timeouts_30d: u64,
    /// Sessions a usage limit stopped in the last 30 days: in
    /// `sessions_30d`, not in `errors_30d` (not the agent's failure).
    usage_limited_30d: u64,
    /// Error records of this agent in `.daemon/errors.jsonl`, 30 days;
    /// null when this user may not read it.
    error_records_30d: Option<u64>,
    /// The latest of them.
    last_error: Option<LastError>,
    /// report.json `error`: retrying, backing off or disabled, and why.
    failing: Option<crate::state::report::ReportError>,
    /// report.json `lifecycle` (hatching, alive, sleeping, expired).
    lifecycle: Option<&'static str>,
    /// report.json `progress` (the agent's last PROGRESS signal).
    progress: Option<u64>,
    /// What it used today (days in `[budget] timezone`).
    today: crate::usage::DayUse,
    /// What is left of its daily budget, if it has one.
    budget_left: Option<crate::usage::Left>,
    /// The budget limit reached, if one is.
    budget_exceeded: Option<String>,
    /// With a `workspace`: the git worktrees under its workspaces root
    /// (kept after their session, or a running session's).
    worktrees: Option<usize>,
    /// A human mailbox: escalations (the daemon's and the flows' high
    /// priority flags and questions) waiting, not yet acknowledged.
    #[serde(skip_serializing_if = "Option::is_none")]
    escalations_waiting: Option<usize>,
    /// The flows' open cycles this agent works for, or (a human) that wait
    /// for it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    flows: Vec<FlowWork>,
    /// The hold of the credential its sessions use (a usage limit, an
    /// admin's cap, a failed login check): its wakes wait, whether or not
    /// one was refused yet. Absent when its credential is not held.
    #[serde(skip_serializing_if = "Option::is_none")]
    held: Option<HeldBy>,
    /// The concurrent-session limit a session's OOM kill lowered
    /// (daemon.json's `concurrency_lowered`: `limit`, `configured`,
    /// `until`), on every agent's line while it holds: the whole fleet
    /// runs one session fewer at once. Absent when it is as configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    concurrency_lowered: Option<Lowered>,
    /// Why some of this agent's files could not be read (damaged, or not
    /// what they should be: a link, a FIFO): the fields that come from them
    /// are left empty, and `status` exits 65. Null when all were read.
    unreadable: Option<String>,
}

#[derive(Serialize, Clone)]
struct FlowWork {
    flow: String,
    cycle: String,
    step: u32,
    /// The role at work (Planner, Actor, Judge), or `Human`.
    role: String,
    /// The cycle's status (running, awaiting_approval, blocked, paused).
    status: String,
}

/// A credential's hold as `status` shows it on each agent it holds.
#[derive(Serialize, Clone)]
struct HeldBy {
    credential: String,
    /// `usage_limit`, `disabled` (an admin's cap) or `credential` (login).
    cause: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    until: Option<Timestamp>,
    reason: String,
}

/// The saved hold of each credential the `agents` use (`.daemon/economy.json`,
/// kept across restarts: the daemon's own view). Unreadable: none shown (the
/// error log's note already says who may read `.daemon/`).
fn holds(ctx: &Context, agents: &[&AgentConfig]) -> std::collections::BTreeMap<String, HeldBy> {
    let mut out = std::collections::BTreeMap::new();
    for a in agents.iter().filter(|a| a.kind == AgentKind::Agent) {
        let name = &a.session.credential;
        if out.contains_key(name) {
            continue;
        }
        if let Ok(Some(h)) = crate::daemon::release::saved_hold(&ctx.root, name) {
            let cause = serde_json::to_value(h.cause)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            out.insert(
                name.clone(),
                HeldBy {
                    credential: name.clone(),
                    cause,
                    until: h.until,
                    reason: h.reason,
                },
            );
        }
    }
    out
}

/// The limit an OOM kill lowered, as the running daemon applies it
/// (daemon.json), while it holds at `now`; `None` without a daemon.json
/// or when it is as configured.
fn concurrency_lowered(ctx: &Context) -> Option<Lowered> {
    crate::daemon::files::read_heartbeat(&ctx.root)
        .ok()
        .flatten()?
        .concurrency_lowered
        .filter(|l| l.until > ctx.now)
}

#[derive(Serialize, Clone)]
struct LastError {
    ts: Timestamp,
    code: String,
    severity: String,
    message: String,
}

/// What `status --json` prints, as JSON (the web view's `/api/fleet` and
/// its page read this, so the two never disagree).
pub fn fleet_json(ctx: &Context, agent: Option<&str>) -> Result<serde_json::Value> {
    let (lines, _, _) = collect(ctx, agent)?;
    // A Line is strings, numbers and options: it always serializes.
    Ok(serde_json::to_value(&lines).unwrap_or_default())
}

/// Each agent's line, the credentials held, and the error records (none
/// when they may not be read).
type Fleet = (
    Vec<Line>,
    std::collections::BTreeMap<String, HeldBy>,
    Option<Vec<errors::ErrorRecord>>,
);

/// Each agent's line, and the credentials held.
fn collect(ctx: &Context, agent: Option<&str>) -> Result<Fleet> {
    let agents: Vec<&AgentConfig> = match agent {
        Some(a) => vec![ctx.config.agent_named(a)?],
        None => ctx.config.agents.iter().collect(),
    };
    let since = ctx.now.minus(ROLLING_WINDOW);
    // Read-only: a user who may read the agent directories but not the
    // daemon's (or an inbox) gets the rest, with `?` and a note on stderr.
    let records =
        match error_log::read_since(&ctx.root.store, &error_log::log_path(&ctx.root), since) {
            Ok(r) => Some(r),
            Err(e) if access::is_denied(&e) => {
                unreadable(&e);
                None
            }
            Err(_) => Some(Vec::new()),
        };
    let work = flow_work(ctx);
    let held = holds(ctx, &agents);
    let lowered = concurrency_lowered(ctx);
    // Which worker each remote session runs on, as the daemon last said.
    let hosts: std::collections::BTreeMap<String, (String, String)> =
        crate::daemon::files::read_heartbeat(&ctx.root)
            .ok()
            .flatten()
            .map(|hb| {
                hb.running
                    .into_iter()
                    .filter_map(|r| Some((r.agent, (r.session_id, r.host?))))
                    .collect()
            })
            .unwrap_or_default();
    let mut lines = Vec::new();
    for agent in agents {
        let mut l = line(ctx, agent);
        if let (Some(id), Some((running, host))) =
            (&l.current_session, hosts.get(agent.name.as_str()))
            && id == running
        {
            l.host = Some(host.clone());
        }
        if l.unreadable.is_some() && l.status != "corrupt" {
            l.status = "unreadable".into();
        }
        // Every agent of a held credential waits, not only the one whose
        // session met the limit; a running session is shown running.
        if let Some(h) = held.get(&agent.session.credential)
            && agent.kind == AgentKind::Agent
            && l.current_session.is_none()
            && !matches!(l.status.as_str(), "missing" | "unreadable" | "corrupt")
        {
            l.status = "held".into();
            l.held = Some(h.clone());
        }
        if agent.kind == AgentKind::Agent {
            l.concurrency_lowered = lowered;
        }
        l.flows = work
            .iter()
            .filter(|(a, _)| a == &l.agent)
            .map(|(_, w)| w.clone())
            .collect();
        l.error_records_30d = records.as_ref().map(|_| 0);
        for r in records
            .iter()
            .flatten()
            .filter(|r| r.context.agent.as_deref() == Some(l.agent.as_str()))
        {
            *l.error_records_30d.get_or_insert(0) += 1;
            l.last_error = Some(LastError {
                ts: r.ts,
                code: r.code.clone(),
                severity: r.severity.to_string(),
                message: r.message.clone(),
            });
        }
        lines.push(l);
    }
    Ok((lines, held, records))
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let (lines, held, records) = collect(ctx, args.agent.as_deref())?;
    // One agent's damaged file is that agent's problem: the others are
    // shown as usual, and the exit status says something is wrong.
    let code = if lines.iter().any(|l| l.unreadable.is_some()) {
        exit::DATAERR
    } else {
        exit::OK
    };
    if args.json {
        print_json(&lines)?;
        return Ok(code);
    }
    let now = ctx.now;
    // Each held credential first: what holds, until when, whom.
    for h in held.values() {
        let whom: Vec<&str> = lines
            .iter()
            .filter(|l| {
                l.held
                    .as_ref()
                    .is_some_and(|x| x.credential == h.credential)
            })
            .map(|l| l.agent.as_str())
            .collect();
        let until = h
            .until
            .map(|t| format!(" until {} ({})", t, in_time(&t, &now)))
            .unwrap_or_default();
        display::Line::new()
            .text(format!("credential {}: ", h.credential))
            .styled(Style::Warn, "held")
            .text(format!(" ({}){until}: ", h.cause.replace('_', " ")))
            .free(&h.reason)
            .text(if whom.is_empty() {
                String::new()
            } else {
                format!("; waiting: {}", whom.join(", "))
            })
            .print();
    }
    // An OOM kill lowered how many sessions run at once (daemon.json).
    if args.agent.is_none()
        && let Some(l) = concurrency_lowered(ctx)
    {
        display::Line::new()
            .text("concurrency: ")
            .styled(Style::Warn, "lowered")
            .text(format!(
                " to {} session(s) at once (max_concurrent_sessions = {}) until {} ({}): a session was OOM-killed",
                l.limit,
                l.configured,
                l.until,
                in_time(&l.until, &now)
            ))
            .print();
    }
    say!(
        "{:<12} {:<12} {:<44} {:>5} {:>5} {:>8} {:>8} {:>11} {:>10}  {}",
        "AGENT",
        "STATUS",
        "LAST SESSION",
        "TASKS",
        "INBOX",
        "SESS/30D",
        "FAIL/30D",
        "TIMEOUT/30D",
        "ERRORS/30D",
        "NEXT WAKE"
    );
    // The counts and the next wake, right of the last session.
    let numbers = |line: display::Line, cells: [&str; 6], next: &str| {
        line.text(" ")
            .cell_right(Style::Plain, cells[0], 5)
            .text(" ")
            .cell_right(Style::Plain, cells[1], 5)
            .text(" ")
            .cell_right(Style::Plain, cells[2], 8)
            .text(" ")
            .cell_right(Style::Plain, cells[3], 8)
            .text(" ")
            .cell_right(Style::Plain, cells[4], 11)
            .text(" ")
            .cell_right(Style::Plain, cells[5], 10)
            .text("  ")
            .text(next)
    };
    for l in &lines {
        let inbox = count(l.inbox_waiting);
        let start = display::Line::new()
            .cell(Style::Bold, &l.agent, 12)
            .text(" ")
            .cell(Style::of(&l.status), &l.status, 12)
            .text(" ");
        if l.kind == "human" || l.status == "missing" || l.status == "unreadable" {
            numbers(
                start.cell(Style::Plain, "-", 44),
                ["-", &inbox, "-", "-", "-", "-"],
                "-",
            )
            .print();
            continue;
        }
        // The outcome word coloured, then when and which session.
        let (outcome, rest) = match (&l.current_session, &l.last_session) {
            (Some(id), _) => (
                "running".to_string(),
                match &l.host {
                    Some(host) => format!(" ({id} on {host})"),
                    None => format!(" ({id})"),
                },
            ),
            // A usage limit says so, not `error`: it is not a failure.
            (None, Some(s)) => (
                match (s.verdict, s.outcome) {
                    (Some(v @ (SessionVerdict::UsageLimit | SessionVerdict::Stopped)), _) => {
                        v.as_str()
                    }
                    // A stop recorded by a script's trap: report.json's
                    // last_session.code says so.
                    _ if crate::catalogue::stopped(
                        s.extra
                            .get(crate::hooks::LAST_SESSION_CODE)
                            .and_then(|c| c.as_str()),
                    ) =>
                    {
                        "stopped"
                    }
                    (_, Some(o)) => o.as_str(),
                    (_, None) => "?",
                }
                .to_string(),
                format!(
                    " {} ({})",
                    s.ended_at.map(|t| ago(&t, &now)).unwrap_or_default(),
                    s.id
                ),
            ),
            (None, None) => ("-".to_string(), String::new()),
        };
        let next = l
            .next_wake_at
            .map(|t| in_time(&t, &now))
            .unwrap_or_else(|| "-".into());
        let last = start.styled(Style::of(&outcome), &outcome).cell(
            Style::Plain,
            &rest,
            44usize.saturating_sub(outcome.chars().count()),
        );
        numbers(
            last,
            [
                &l.tasks_pending.to_string(),
                &inbox,
                &l.sessions_30d.to_string(),
                &l.errors_30d.to_string(),
                &l.timeouts_30d.to_string(),
                &count(l.error_records_30d),
            ],
            &next,
        )
        .print();
    }
    // Agents whose files could not be read, and why.
    for l in &lines {
        if let Some(why) = &l.unreadable {
            display::Line::new()
                .styled(Style::Bold, &l.agent)
                .text(": ")
                .styled(Style::Bad, "unreadable")
                .text(": ")
                .free(why)
                .print();
        }
    }
    // What each agent used today, and what is left of its budget.
    for l in &lines {
        if l.today.sessions == 0 && l.budget_left.is_none() {
            continue;
        }
        let u = &l.today;
        let mut line = display::Line::new()
            .styled(Style::Bold, &l.agent)
            .text(format!(
                ": today {} session(s), {}, {} tokens, ${:.2}",
                u.sessions,
                crate::cli::usage::runtime(u.runtime_seconds),
                crate::cli::usage::tokens(u.tokens.total),
                u.cost_usd
            ));
        if let Some(e) = &l.budget_exceeded {
            line = line
                .text("; ")
                .styled(Style::Bad, "budget exhausted")
                .text(format!(" ({e})"));
        } else if let Some(left) = &l.budget_left {
            let mut parts = Vec::new();
            if let Some(n) = left.sessions {
                parts.push(format!("{n} session(s)"));
            }
            if let Some(s) = left.runtime_seconds {
                parts.push(crate::cli::usage::runtime(s));
            }
            if let Some(t) = left.tokens {
                parts.push(format!("{} tokens", crate::cli::usage::tokens(t)));
            }
            if let Some(c) = left.cost_usd {
                parts.push(format!("${c:.2}"));
            }
            line = line.text(format!("; budget left: {}", parts.join(", ")));
        }
        line.print();
    }
    // Escalations a human has not acknowledged yet.
    for l in &lines {
        if let Some(n) = l.escalations_waiting.filter(|n| *n > 0) {
            display::Line::new()
                .styled(Style::Bold, &l.agent)
                .text(format!(
                    ": {n} escalation(s) not acknowledged (agent-state inbox {}; inbox show / ack)",
                    l.agent
                ))
                .print();
        }
    }
    // Busy for a flow, or waited for by one (agent-state flow status).
    for l in &lines {
        for w in &l.flows {
            if w.role == "Human" {
                display::Line::new()
                    .styled(Style::Bold, &l.agent)
                    .text(format!(
                        ": flow {} cycle {} waits for you ({}): agent-state flow status {}",
                        w.flow, w.cycle, w.status, w.flow
                    ))
                    .print();
            } else {
                display::Line::new()
                    .styled(Style::Bold, &l.agent)
                    .text(format!(
                        ": busy for flow {}: cycle {} step {} ({})",
                        w.flow, w.cycle, w.step, w.role
                    ))
                    .print();
            }
        }
    }
    // Worktrees kept after their sessions (agent-state workspaces lists them).
    for l in &lines {
        if let Some(n) = l.worktrees.filter(|n| *n > 0) {
            display::Line::new()
                .styled(Style::Bold, &l.agent)
                .text(format!(
                    ": {n} worktree(s) kept or in use (agent-state workspaces --agent {})",
                    l.agent
                ))
                .print();
        }
    }
    // Why agents fail, and errors that are not about one agent.
    for l in &lines {
        if let Some(f) = &l.failing {
            let until = f
                .until
                .map(|t| format!(" until {}", in_time(&t, &now)))
                .unwrap_or_default();
            let line = display::Line::new()
                .styled(Style::Bold, &l.agent)
                .text(": ")
                .styled(Style::of(f.state.as_str()), &f.code);
            let line = if f.state == crate::state::report::ErrorState::Held {
                // Not a failure: a usage limit or a login check holds it.
                line.text(format!(" (held{until}): "))
            } else {
                line.text(format!(
                    " ({} failure(s) in a row, {}{until}): ",
                    f.failures, f.state
                ))
            };
            line.free(&f.message).print();
        } else if let Some(e) = &l.last_error {
            display::Line::new()
                .styled(Style::Bold, &l.agent)
                .text(": last error ")
                .styled(Style::of(&e.severity), &e.code)
                .text(format!(" {}: ", ago(&e.ts, &now)))
                .free(&e.message)
                .print();
        }
    }
    let daemon_wide: Vec<&errors::ErrorRecord> = records
        .iter()
        .flatten()
        .filter(|r| r.context.agent.is_none())
        .collect();
    if let Some(last) = daemon_wide.last() {
        display::Line::new()
            .text(format!(
                "daemon: {} error(s) in 30 days; last ",
                daemon_wide.len()
            ))
            .styled(Style::of(last.severity.as_str()), &last.code)
            .text(format!(" {}: ", ago(&last.ts, &now)))
            .free(&last.message)
            .print();
    }
    Ok(code)
}

/// A count, or `?` when it could not be read.
fn count<T: ToString>(n: Option<T>) -> String {
    n.map(|n| n.to_string()).unwrap_or_else(|| "?".into())
}

/// Say on stderr what this user may not read, and who may.
fn unreadable(e: &crate::error::Error) {
    let who = access::hint(e).unwrap_or_default();
    crate::cli::warn(format!("{e}; shown as ?. {who}"));
}

/// An agent's line; what cannot be read is said in `unreadable`, never an
/// error that would hide the other agents.
fn line(ctx: &Context, agent: &AgentConfig) -> Line {
    let dir = ctx.root.agent(&agent.name);
    let kind = match agent.kind {
        AgentKind::Agent => "agent",
        AgentKind::Human => "human",
    };
    let mut l = Line {
        agent: agent.name.to_string(),
        kind,
        status: String::new(),
        current_session: None,
        host: None,
        last_session: None,
        next_wake_at: None,
        tasks_pending: 0,
        tasks_active: 0,
        inbox_waiting: None,
        sessions_30d: 0,
        errors_30d: 0,
        timeouts_30d: 0,
        usage_limited_30d: 0,
        error_records_30d: None,
        last_error: None,
        failing: None,
        lifecycle: None,
        progress: None,
        today: Default::default(),
        budget_left: None,
        flows: Vec::new(),
        escalations_waiting: None,
        budget_exceeded: None,
        worktrees: None,
        held: None,
        concurrency_lowered: None,
        unreadable: None,
    };
    if let Some(w) = &agent.session.workspace {
        let root = crate::daemon::workspaces::root_of(w, agent, &dir);
        let root_real = std::fs::canonicalize(&root).unwrap_or_else(|_| root.clone());
        l.worktrees = crate::workspace::list(&w.repo).ok().map(|all| {
            all.iter()
                .filter(|t| t.path.starts_with(&root) || t.path.starts_with(&root_real))
                .count()
        });
    }
    match crate::fsx::metadata(&dir.path) {
        Ok(None) => {
            l.status = "missing".into();
            return l;
        }
        Ok(Some(st)) if crate::fsx::file_type(&st) != nix::sys::stat::SFlag::S_IFDIR => {
            l.status = "unreadable".into();
            l.unreadable = Some(format!(
                "{} is not a directory; run `agent-state check` for what to do",
                dir.path.display()
            ));
            return l;
        }
        _ => {}
    }
    l.inbox_waiting = match inbox::waiting_names(&dir) {
        Ok(names) => Some(names.len()),
        Err(e) if access::is_denied(&e) => {
            unreadable(&e);
            None
        }
        Err(e) => {
            l.unreadable = Some(e.to_string());
            None
        }
    };
    if agent.kind == AgentKind::Human {
        l.status = "mailbox".into();
        l.escalations_waiting = l.inbox_waiting.map(|_| escalations_waiting(agent, &dir));
        return l;
    }
    // A corrupt file is shown as such rather than failing the whole listing.
    match dir.read::<Report>() {
        Ok(report) => {
            let report = report.unwrap_or_else(|| Report::new(agent.name.as_str()));
            l.status = report.status.as_str().to_string();
            l.current_session = report.current_session;
            l.last_session = report.last_session;
            l.next_wake_at = report.next_wake_at;
            l.failing = report.error.clone();
            l.lifecycle = Some(
                report
                    .lifecycle
                    .unwrap_or(crate::state::report::Lifecycle::Sleeping)
                    .as_str(),
            );
            l.progress = report.extra.get("progress").and_then(|p| p.as_u64());
        }
        Err(e) => {
            l.status = "corrupt".into();
            l.unreadable.get_or_insert(e.to_string());
        }
    }
    if let Ok(Some(tasks)) = dir.read::<TaskFile>() {
        l.tasks_pending = tasks
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Pending)
            .count();
        l.tasks_active = tasks
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Active)
            .count();
    }
    let since: Timestamp = ctx.now.minus(ROLLING_WINDOW);
    let entries = match journal::read_since(&dir.store, &dir.journal(), since) {
        Ok(entries) => entries,
        Err(e) => {
            if access::is_denied(&e) {
                unreadable(&e);
            } else {
                l.unreadable.get_or_insert(e.to_string());
            }
            return l;
        }
    };
    let tz = ctx.config.budget.timezone;
    l.today = crate::usage::by_day(&crate::usage::sessions(&entries), tz)
        .get(&crate::usage::day_of(ctx.now, tz))
        .copied()
        .unwrap_or_default();
    let budget = agent.session.budget;
    if !budget.is_unlimited() {
        l.budget_left = Some(budget.left(&l.today));
        l.budget_exceeded = budget.first_exceeded(&l.today).map(|e| e.to_string());
    }
    for e in entries.iter() {
        // The daemon's verdict on an end its script recorded first.
        if let journal::Event::SessionVerdict(v) = &e.event {
            for (verdict, by) in [(v.was, -1i64), (v.verdict, 1)] {
                let n = match verdict {
                    SessionVerdict::Completed => continue,
                    SessionVerdict::Error => &mut l.errors_30d,
                    SessionVerdict::Timeout => &mut l.timeouts_30d,
                    SessionVerdict::UsageLimit => &mut l.usage_limited_30d,
                    SessionVerdict::Stopped => continue,
                };
                *n = n.saturating_add_signed(by);
            }
            continue;
        }
        let Some(verdict) = e.event.verdict() else {
            continue;
        };
        l.sessions_30d += 1;
        match verdict {
            SessionVerdict::Completed => {}
            SessionVerdict::Error => l.errors_30d += 1,
            SessionVerdict::Timeout => l.timeouts_30d += 1,
            SessionVerdict::UsageLimit => l.usage_limited_30d += 1,
            // An operator's stop is no failure of the agent.
            SessionVerdict::Stopped => {}
        }
    }
    l
}

/// Which agent each flow's open cycle waits for (the role at work, or the
/// human when it waits for approval, is blocked or paused). Unreadable
/// flow state is left out: `status` stays read-only and lenient.
fn flow_work(ctx: &Context) -> Vec<(String, FlowWork)> {
    let Ok(all) = crate::flow::status_of(&ctx.root, &ctx.config) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (settings, state) in all {
        let Some(c) = state.and_then(|s| s.current) else {
            continue;
        };
        let (agent, role) = match &c.awaiting {
            Some(w) => (w.agent.clone(), w.role.as_str().to_string()),
            None => (settings.human.to_string(), "Human".to_string()),
        };
        out.push((
            agent,
            FlowWork {
                flow: settings.name.to_string(),
                cycle: c.id.clone(),
                step: c.step,
                role,
                status: c.status.as_str().to_string(),
            },
        ));
    }
    out
}

/// Waiting messages of a human mailbox that the daemon or a flow sent to get
/// a human's attention: flags and questions whose `source_ref` is one of
/// agent-state's (`agent-state/session/…`, `agent-state/errors/…`,
/// `agent-state/flow/…`).
fn escalations_waiting(agent: &AgentConfig, dir: &crate::state::AgentDir) -> usize {
    let now = std::time::SystemTime::now();
    let intake = inbox::Intake::settle(agent.session.inbox_settle);
    inbox::waiting_names(dir)
        .unwrap_or_default()
        .iter()
        .filter(|name| match inbox::inspect(dir, name, now, intake) {
            inbox::Verdict::Valid(m) => m
                .source_ref
                .as_deref()
                .is_some_and(|r| r.starts_with("agent-state/")),
            _ => false,
        })
        .count()
}
