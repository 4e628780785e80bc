//! `agent-state session begin|end|fail`: the hooks session scripts call.
//!
//! All value arguments are taken as text and parsed leniently by the hooks,
//! so a bad optional value is recorded as such instead of losing the session
//! record (negative numbers too: `--cost-usd -1` is a bad value, not an
//! unknown flag). Exit status: 0 (`end` and `fail` also when an argument
//! was bad or unknown — [`parse_lenient`] drops an unknown one with a
//! warning: a warning on stderr, the session ended); `begin` 65 when an
//! argument was bad (everything else was still recorded); 77 when `end` or `fail` names no session and
//! the running one belongs to another live process (nothing changed).

use clap::Subcommand;

use crate::cli::{Context, print_notes, warn};
use crate::error::{Error, Result, exit};
use crate::hooks::{
    self, BadArgument, BeginRequest, Caller, EndRequest, FailRequest, FinishResult, Owner,
};
use crate::owner::{self, OwnerLock};
use crate::state::AgentDir;

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Pre-session hook: session.json running, report status, journal, claim inbox. Prints the session id
    Begin(BeginArgs),
    /// Post-session hook: record a completed session everywhere and process its messages (from a daemon session with `verify`: noted, and the daemon records it after verification)
    End(EndArgs),
    /// Error hook: record an error or timeout and return the session's messages to the inbox (stops no process: `agent-state stop` does; from a daemon session with `verify`: noted, and the daemon records it)
    ///
    /// It records the end only. A session the daemon runs goes on running
    /// until its command exits (its messages are back in the inbox already);
    /// to end its processes too, `agent-state stop AGENT` (SIGTERM to the
    /// session's process group, SIGKILL after kill_grace), which records
    /// the stop itself.
    Fail(FailArgs),
    /// (internal) Hold a session's owner lock until its script exits; started by `begin`
    #[command(hide = true)]
    Keep(KeepArgs),
}

#[derive(clap::Args, Debug)]
pub struct KeepArgs {
    /// The session (for people reading `ps`)
    pub session: String,
    /// The process whose life the session lasts (the script that began it)
    #[arg(long, value_name = "PID")]
    pub owner_pid: i32,
    /// Its start time in clock ticks since boot (/proc/PID/stat), so a reused pid is not mistaken for it
    #[arg(long, value_name = "TICKS")]
    pub owner_start: Option<u64>,
}

#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct BeginArgs {
    /// The agent
    pub agent: String,
    /// Session type: research, extract, evaluate or ad-hoc (default: the agent's session_type)
    #[arg(long = "type", value_name = "T")]
    pub session_type: Option<String>,
    /// The git branch the session works on
    #[arg(long, value_name = "B")]
    pub branch: Option<String>,
    /// The model (default: the agent's configured model)
    #[arg(long, value_name = "M")]
    pub model: Option<String>,
    /// Session timeout, e.g. 90m or 5400 (seconds)
    #[arg(long, value_name = "DUR")]
    pub timeout: Option<String>,
    /// The question this session researches (session.json)
    #[arg(long, value_name = "Q")]
    pub research_question: Option<String>,
    /// The belief it tests (session.json)
    #[arg(long, value_name = "X")]
    pub belief_targeted: Option<String>,
    /// What would disconfirm it (session.json)
    #[arg(long, value_name = "X")]
    pub disconfirmation_target: Option<String>,
    /// How many sources it expects to archive (a whole number)
    #[arg(long, value_name = "N")]
    pub sources_expected: Option<String>,
    /// Join this session if it is the one running (set by the daemon)
    #[arg(
        long = "join",
        env = "AGENT_STATE_SESSION_ID",
        value_name = "ID",
        hide_env_values = true
    )]
    pub join: Option<String>,
    /// The process that owns the session while it runs (default: the script that called this hook)
    #[arg(long, env = "AGENT_STATE_OWNER_PID", value_name = "PID")]
    pub owner_pid: Option<i32>,
}

#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct EndArgs {
    /// The agent
    pub agent: String,
    /// The session to end (default: the running one)
    #[arg(
        long,
        env = "AGENT_STATE_SESSION_ID",
        value_name = "ID",
        hide_env_values = true
    )]
    pub session: Option<String>,
    /// completed (timeout or error are recorded as with `session fail`)
    #[arg(long, value_name = "OUTCOME")]
    pub outcome: Option<String>,
    /// Sources archived in the session
    #[arg(long, value_name = "N")]
    pub sources_archived: Option<String>,
    /// The git branch the session worked on
    #[arg(long, value_name = "B")]
    pub branch: Option<String>,
    /// PR number: 247, #247 or a …/pull/247 URL
    #[arg(long, value_name = "N")]
    pub pr: Option<String>,
    /// One line for report.json (default: "Session ID completed — N sources archived")
    #[arg(long, value_name = "S")]
    pub summary: Option<String>,
    /// What the agent should do next (report.json next_priority)
    #[arg(long, value_name = "P")]
    pub next_priority: Option<String>,
    /// Notes for the next session; they end its prompt
    #[arg(long, value_name = "H")]
    pub handoff_notes: Option<String>,
    /// Tokens the session used (a whole number)
    #[arg(long, value_name = "N")]
    pub tokens_used: Option<String>,
    /// What the session cost, in US dollars
    #[arg(long, value_name = "X")]
    pub cost_usd: Option<String>,
}

#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct FailArgs {
    /// The agent
    pub agent: String,
    /// The session that failed (default: the running one; with none running, a failed run is still recorded)
    #[arg(
        long,
        env = "AGENT_STATE_SESSION_ID",
        value_name = "ID",
        hide_env_values = true
    )]
    pub session: Option<String>,
    /// error or timeout
    #[arg(long, value_name = "OUTCOME")]
    pub outcome: String,
    /// What went wrong, in a sentence
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
}

pub fn run(ctx: &Context, command: Command) -> Result<u8> {
    match command {
        Command::Begin(a) => {
            let (agent, dir) = hook_agent(ctx, &a.agent)?;
            let owner = match a.owner_pid {
                Some(pid) if pid <= 1 => {
                    return Err(Error::Usage(format!(
                        "--owner-pid {pid}: not a process that can own a session; give the pid of the script that runs it"
                    )));
                }
                Some(pid) => Owner::of(pid),
                None => Owner::parent(),
            };
            let req = BeginRequest {
                session_type: a.session_type,
                branch: a.branch,
                model: a.model,
                timeout: a.timeout,
                research_question: a.research_question,
                belief_targeted: a.belief_targeted,
                disconfirmation_target: a.disconfirmation_target,
                sources_expected: a.sources_expected,
                join: a.join,
                owner: Some(owner),
                instance: None,
                hold_end: false,
                writing: Default::default(),
                known: None,
                listed: None,
                files: crate::clock::FileClock::Real,
            };
            let mut r = hooks::begin(agent, &dir, &req, ctx.now)?;
            print_notes(&r.notes);
            if let Some(lock) = r.owner_lock.take() {
                hand_to_keeper(&dir, lock, &owner, agent.session.timeout);
            }
            for rejected in &r.claim.rejected {
                warn(format!(
                    "{}: inbox/{} rejected: {}",
                    dir.name,
                    rejected.shown(),
                    rejected.reason
                ));
            }
            for name in &r.claim.unsettled {
                warn(format!(
                    "{}: inbox/{name} does not parse yet and was written moments ago; left for the next session",
                    dir.name
                ));
            }
            println!("{}", r.session_id);
            free_replaced(&dir);
            Ok(bad_arguments(&dir.name, &r.bad_arguments))
        }
        Command::End(a) => {
            let (agent, dir) = hook_agent(ctx, &a.agent)?;
            let req = EndRequest {
                session: a.session,
                outcome: a.outcome,
                sources_archived: a.sources_archived,
                branch: a.branch,
                pr: a.pr,
                summary: a.summary,
                next_priority: a.next_priority,
                handoff_notes: a.handoff_notes,
                tokens_used: a.tokens_used,
                cost_usd: a.cost_usd,
                claimed: None,
                caller: Caller::this_process(),
                facts: Default::default(),
            };
            let r = hooks::end(agent, &dir, &req, ctx.now)?;
            let code = finished(&dir.name, &r);
            free_replaced(&dir);
            code
        }
        Command::Fail(a) => {
            let (agent, dir) = hook_agent(ctx, &a.agent)?;
            // A session the daemon runs, failed from outside its script:
            // its processes go on (said below).
            let own = std::env::var("AGENT_STATE_SESSION_ID").ok();
            let daemons = super::stop::daemon_session(ctx, &agent.name)
                .filter(|sid| own.as_deref() != Some(sid.as_str()));
            let req = FailRequest {
                session: a.session,
                outcome: a.outcome,
                reason: a.reason,
                // The daemon's verdict, not a script's to give.
                code: None,
                verdict: None,
                not_an_attempt: false,
                caller: Caller::this_process(),
                facts: Default::default(),
            };
            let r = hooks::fail(agent, &dir, &req, ctx.now)?;
            if !r.already_ended && daemons.as_ref() == Some(&r.session_id) {
                warn(format!(
                    "{}: session {} is the daemon's: its end is recorded, but its processes go on until they exit; `agent-state stop {}` stops them",
                    dir.name, r.session_id, dir.name
                ));
            }
            let code = finished(&dir.name, &r);
            free_replaced(&dir);
            code
        }
        Command::Keep(a) => Ok(keep(&a)),
    }
}

/// An agent for a hook: its store keeps the state files the hook replaces
/// until [`free_replaced`], so that the script waiting for the hook does not
/// wait for their blocks to be freed (`crates/store/src/state/replaced.rs`).
fn hook_agent<'c>(
    ctx: &'c Context,
    name: &str,
) -> Result<(&'c crate::config::AgentConfig, AgentDir)> {
    let (agent, mut dir) = ctx.agent(name)?;
    dir.store = dir.store.clone().deferring_removals();
    Ok((agent, dir))
}

/// The hook's output is written: its replaced files are removed by a child
/// it does not wait for.
fn free_replaced(dir: &AgentDir) {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    dir.store.take_replaced().remove_detached();
}

/// `session keep`: run by `begin` only, with the lock on fd 3.
pub fn keep(a: &KeepArgs) -> u8 {
    owner::keep(a.owner_pid, a.owner_start);
    exit::OK
}

/// Hand a new session's owner lock to a keeper that holds it while the
/// script runs. An owner this process cannot watch (an `--owner-pid` it
/// cannot see) gets no keeper: its lock file goes, and the session counts
/// as running until its timeout.
fn hand_to_keeper(dir: &AgentDir, lock: OwnerLock, owner: &Owner, timeout: std::time::Duration) {
    let session = lock.session_id.clone();
    let failed = if owner.start.is_none() {
        Some(format!("pid {} is not visible to this process", owner.pid))
    } else {
        owner::spawn_keeper(lock, owner)
            .err()
            .map(|e| e.to_string())
    };
    if let Some(why) = failed {
        let _ = owner::release(dir, &session);
        warn(format!(
            "{}: session {session}: its owner cannot be watched ({why}); it counts as running until its timeout of {}",
            dir.name,
            humantime::format_duration(timeout)
        ));
    }
}

fn finished(agent: &crate::agent_name::AgentName, r: &FinishResult) -> Result<u8> {
    print_notes(&r.notes);
    let outcome = r.outcome.map(|o| o.as_str()).unwrap_or("unrecorded");
    if r.kept {
        println!(
            "{} {outcome} (noted; the daemon ends the session after its verification)",
            r.session_id
        );
    } else if r.already_ended {
        warn(format!(
            "{agent}: session {} had already ended ({outcome}); nothing changed",
            r.session_id
        ));
    } else {
        let mut parts = vec![format!("{} {outcome}", r.session_id)];
        if !r.processed.is_empty() {
            parts.push(format!("{} message(s) processed", r.processed.len()));
        }
        if !r.returned.is_empty() {
            parts.push(format!(
                "{} message(s) returned to the inbox",
                r.returned.len()
            ));
        }
        if !r.undeliverable.is_empty() {
            parts.push(format!(
                "{} message(s) set aside as undeliverable",
                r.undeliverable.len()
            ));
        }
        println!("{}", parts.join(", "));
    }
    // The session ended whatever its optional arguments said: a bad one is
    // a warning, never a failed hook (a script under `set -e` goes on).
    warn_bad_arguments(agent, &r.bad_arguments);
    Ok(exit::OK)
}

fn warn_bad_arguments(agent: &crate::agent_name::AgentName, bad: &[BadArgument]) {
    for b in bad {
        warn(format!(
            "{agent}: bad argument {b} (noted in session.json errors; everything else was recorded)"
        ));
    }
}

/// `begin`'s exit status: 65 when an argument was bad (the session began).
fn bad_arguments(agent: &crate::agent_name::AgentName, bad: &[BadArgument]) -> u8 {
    warn_bad_arguments(agent, bad);
    if bad.is_empty() {
        exit::OK
    } else {
        exit::DATAERR
    }
}

/// The command line of a hook that may end a session: `session end` or
/// `session fail` (after any global options).
fn is_ending_hook(args: &[std::ffi::OsString]) -> bool {
    let words: Vec<&str> = args
        .iter()
        .skip(1)
        .filter_map(|a| a.to_str())
        .filter(|a| !a.starts_with('-'))
        .collect();
    // `--config PATH` / `--color WHEN` take a value: skip to `session`.
    words
        .windows(2)
        .any(|w| w[0] == "session" && (w[1] == "end" || w[1] == "fail"))
}

/// Parse the command line; for `session end|fail`, an argument clap does
/// not know (a newer script's flag, a typo) is dropped with a warning
/// instead of failing the hook, since a failed end hook loses the session's
/// record (issue 21, "a bad optional argument is a warning, never a failed
/// hook"). Returns what was parsed and the warnings; anything else clap
/// refuses is its usual error.
pub fn parse_lenient<P: clap::Parser>(
    mut args: Vec<std::ffi::OsString>,
) -> std::result::Result<(P, Vec<String>), clap::Error> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let mut warnings = Vec::new();
    loop {
        let e = match P::try_parse_from(&args) {
            Ok(p) => return Ok((p, warnings)),
            Err(e) => e,
        };
        if e.kind() != ErrorKind::UnknownArgument || !is_ending_hook(&args) || warnings.len() >= 32
        {
            return Err(e);
        }
        let Some(ContextValue::String(bad)) = e.get(ContextKind::InvalidArg) else {
            return Err(e);
        };
        // `--flag=value` is one argument; clap names it without the value.
        let Some(at) = args.iter().skip(1).position(|a| {
            a.to_str()
                .is_some_and(|a| a == bad || a.split_once('=').is_some_and(|(f, _)| f == bad))
        }) else {
            return Err(e);
        };
        let removed = args.remove(at + 1);
        warnings.push(format!(
            "ignored the unknown argument {:?} (the session is recorded without it; see --help)",
            removed.to_string_lossy()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> std::result::Result<Vec<String>, String> {
        let args = std::iter::once("agent-state")
            .chain(line.split(' '))
            .map(std::ffi::OsString::from)
            .collect();
        parse_lenient::<crate::cli::Cli>(args)
            .map(|(_, w)| w)
            .map_err(|e| e.kind().to_string())
    }

    #[test]
    fn unknown_arguments_of_ending_hooks_are_warnings_elsewhere_errors() {
        for (line, expected) in [
            ("session end rio --summary done", Ok(0)),
            ("session end rio --frobnicate", Ok(1)),
            ("session end rio --frobnicate=3 --summary x", Ok(1)),
            // A value after an unknown flag is an extra argument: dropped too.
            ("session end rio --frobnicate 3", Ok(2)),
            (
                "session fail rio --outcome error --reason x --new-flag",
                Ok(1),
            ),
            ("--config /x session end rio --new-flag", Ok(1)),
            // Only the ending hooks: a begin with a typo fails as before.
            ("session begin rio --frobnicate", Err(())),
            ("status --frobnicate", Err(())),
            // A missing agent is still an error.
            ("session end --frobnicate", Err(())),
        ] {
            let got = parse(line);
            match expected {
                Ok(n) => assert_eq!(got.as_ref().map(Vec::len).ok(), Some(n), "{line}: {got:?}"),
                Err(()) => assert!(got.is_err(), "{line}: {got:?}"),
            }
        }
    }
}
