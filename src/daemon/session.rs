//! Starting and finishing one daemon session: the glue between the hooks
//! (the same code session scripts call), the prompt, and the runner.
//!
//! Start: instance id, `session begin` (owned by the daemon, which holds
//! the session's owner lock; a script calling the hook with
//! `AGENT_STATE_SESSION_ID` joins it), the prompt
//! written to `sessions/{id}.prompt.md`, the command with its placeholders
//! filled in. Finish: the runner's ending mapped onto `session end` or
//! `session fail`, which update every file exactly as for a script.

use std::path::{Path, PathBuf};

use super::files;
use super::runner::{Ending, RunReport, SessionSpec, StallAction};
use crate::clock::Timestamp;
use crate::config::{AgentConfig, Config};
use crate::error::Result;
use crate::hooks::{self, BeginRequest, EndRequest, FailRequest, Owner};
use crate::owner::OwnerLock;
use crate::prompt;
use crate::state::session::{SessionStatus, SessionVerdict};
use crate::state::{AgentDir, StateRoot, atomic, counters};

/// Which Claude Code conversation a session may continue (with `resume`).
#[derive(Debug, Clone, Default)]
pub struct Continuation {
    /// A retry after a timeout: that session's conversation.
    pub retry: Option<String>,
    /// The last session and its conversation: continued when a claimed
    /// message replies to that session's escalation.
    pub reply: Option<(String, String)>,
}

/// A session that has begun and is ready to run.
pub struct Prepared {
    pub session_id: String,
    pub instance: String,
    pub spec: SessionSpec,
    /// Inbox files the claim rejected.
    pub rejected: Vec<crate::inbox::Rejected>,
    /// The messages the session claimed, bodies dropped: what its end
    /// records (ids, flags) without reading them again.
    pub claimed: Vec<crate::inbox::Message>,
    /// The daemon's owner lock on the session, held until its end is
    /// recorded (see [`crate::owner`]).
    pub owner_lock: Option<OwnerLock>,
    /// The git worktree to make before the command runs (it is the
    /// command's working directory), with an agent's `workspace`.
    pub workspace: Option<crate::workspace::WorkspaceSpec>,
    /// Claude Code's conversation: its id and whether this session
    /// continues it (`{claude_session}`).
    pub conversation: (String, bool),
    /// With `resume`: the command line that continues the conversation
    /// (later iterations use it).
    pub resume_argv: Option<Vec<String>>,
}

/// What the daemon already knows of an agent's inbox, for the claim.
#[derive(Debug, Clone, Default)]
pub struct InboxSeen {
    /// Files a writer still has open: left waiting.
    pub writing: crate::inbox::Writing,
    /// Files already read: claimed without being read again.
    pub known: Option<std::sync::Arc<crate::inbox::Known>>,
    /// A big inbox's names, listed off the loop: claimed from these.
    pub listed: Option<std::sync::Arc<crate::inbox::Listed>>,
}

pub fn prepare(
    config: &Config,
    agent: &AgentConfig,
    root: &StateRoot,
    now: Timestamp,
    seen: InboxSeen,
    continuation: Continuation,
) -> Result<Prepared> {
    let dir = root.agent(&agent.name);
    let instance = counters::next_instance(root, &dir, now)?;
    let req = BeginRequest {
        owner: Some(Owner::of(std::process::id() as i32)),
        instance: Some(instance.clone()),
        // With `verify`, the daemon ends the session after verification:
        // the script's own `session end` of each run is kept until then.
        hold_end: !agent.session.iteration.verify.is_empty(),
        writing: seen.writing,
        known: seen.known,
        listed: seen.listed,
        files: crate::clock::FileClock::Real,
        ..BeginRequest::default()
    };
    let begun = hooks::begin(agent, &dir, &req, now)?;
    // The known files are not needed again until the next scan: let go of
    // them so that scan can update them in place.
    drop(req);
    let owner_lock = begun.owner_lock;
    let rejected = begun.claim.rejected.clone();
    let claimed: Vec<crate::inbox::Message> = begun
        .claim
        .claimed
        .iter()
        .map(|m| crate::inbox::Message {
            body: String::new(),
            extra: Default::default(),
            ..m.clone()
        })
        .collect();
    let session_id = begun.session_id;
    // The session has begun: if what follows fails, it must end (as an
    // error, its messages returned), or it would stay `running` and block
    // the agent.
    let mut options = prompt::PromptOptions::for_agent(config, agent);
    // What the claim read: the prompt quotes it without reading it again.
    options.claimed = Some(begun.claim.claimed.clone());
    let written = prompt::assemble_with(root, &dir, &options, now).and_then(|assembled| {
        if assembled.over_budget {
            tracing::warn!(agent = %agent.name, session_id, "the parts of the prompt that are never cut (rules, identity) are over prompt_budget");
        }
        if !assembled.cut.is_empty() {
            let lock = dir.lock()?;
            for cut in &assembled.cut {
                dir.journal_append(
                    &lock,
                    now,
                    crate::state::journal::Event::PromptCut(crate::state::journal::PromptCut {
                        session_id: session_id.clone(),
                        section: cut.section.clone(),
                        bytes_dropped: cut.bytes_dropped,
                        reason: cut.reason.clone(),
                    }),
                )?;
            }
        }
        let text = assembled.text;
        atomic::create_dir(&dir.sessions_dir(), 0o750)?;
        let file = dir.sessions_dir().join(format!("{session_id}.prompt.md"));
        // Regenerated for every session, and useless after a crash (which
        // interrupts the session): replaced atomically, not fsynced, to keep
        // two syncs off the path between a wake and the agent starting.
        atomic::write_file_unsynced(&dir.store, &file, text.as_bytes(), 0o640)?;
        Ok((text, file))
    });
    let (prompt_text, prompt_file) = match written {
        Ok(w) => w,
        Err(e) => {
            let failed = hooks::fail(
                agent,
                &dir,
                &FailRequest {
                    session: Some(session_id.clone()),
                    outcome: "error".into(),
                    reason: format!("the session could not start: {e}"),
                    code: Some(e.code().as_str().to_string()),
                    ..FailRequest::default()
                },
                now,
            );
            if let Err(f) = failed {
                tracing::error!(agent = %agent.name, session_id, "cannot end the session that could not start: {f}");
            }
            return Err(e);
        }
    };
    let model = agent.session.model.clone();
    // A flow's hand-off continues its cycle's branch; else a worktree of
    // the session's own.
    let workspace = agent.session.workspace.as_ref().map(|w| {
        crate::flow::session_worktree(root, config, agent, &claimed)
            .unwrap_or_else(|| super::workspaces::plan(w, agent, &dir, &session_id, &instance, now))
    });
    // The command runs in its worktree, or in the agent's directory.
    let cwd = workspace
        .as_ref()
        .map(|w| w.path.clone())
        .unwrap_or_else(|| dir.path.clone());
    let template: Vec<String> =
        command_line(config, agent, &session_id, &instance, &model, &prompt_file)
            .into_iter()
            .map(|a| a.replace("{workspace}", &cwd.display().to_string()))
            .collect();
    let resume = agent.session.iteration.resume;
    let replied = continuation.reply.filter(|(sid, _)| {
        let reference = super::alerts::reply_ref(sid);
        claimed
            .iter()
            .any(|m| m.source_ref.as_deref() == Some(reference.as_str()))
    });
    let conversation = match continuation.retry.or(replied.map(|(_, c)| c)) {
        Some(id) if resume => (id, true),
        _ => (uuid::Uuid::new_v4().to_string(), false),
    };
    let argv = conversation_args(&template, &conversation.0, conversation.1);
    let resume_argv = resume.then(|| conversation_args(&template, &conversation.0, true));
    let mut env = vec![
        ("AGENT_STATE_AGENT".to_string(), agent.name.to_string()),
        ("AGENT_STATE_SESSION_ID".to_string(), session_id.clone()),
        ("AGENT_STATE_INSTANCE".to_string(), instance.clone()),
        (
            "AGENT_STATE_DIR".to_string(),
            dir.path.display().to_string(),
        ),
        (
            "AGENT_STATE_PROMPT_FILE".to_string(),
            prompt_file.display().to_string(),
        ),
        (
            "AGENT_STATE_CONFIG".to_string(),
            config.source.display().to_string(),
        ),
    ];
    if let Some(w) = &workspace {
        env.push((
            "AGENT_STATE_WORKSPACE".to_string(),
            w.path.display().to_string(),
        ));
    }
    let spec = SessionSpec {
        argv,
        env,
        env_remove: vec![
            "NOTIFY_SOCKET".into(),
            "WATCHDOG_USEC".into(),
            "WATCHDOG_PID".into(),
            "LISTEN_FDS".into(),
            "LISTEN_PID".into(),
        ],
        cwd,
        stdin: prompt_text.into_bytes(),
        log_path: dir.sessions_dir().join(format!("{session_id}.log")),
        iteration: 1,
        max_output: agent.session.max_output,
        timeout: agent.session.timeout,
        kill_grace: agent.session.kill_grace,
        // The session's machine keeps the stall timer (the loop tells it
        // when the session last printed): the runner watches no silence.
        stall_timeout: None,
        stall_action: match agent.session.stall_action {
            crate::config::StallAction::Warn => StallAction::Warn,
            crate::config::StallAction::Stop => StallAction::Stop,
        },
        marker: (
            "AGENT_STATE_RUN".to_string(),
            format!("{}:{}:{}", std::process::id(), agent.name, session_id),
        ),
        agent_stall_timeout: agent.session.stall_timeout,
        memory_max: agent.session.memory_max,
    };
    Ok(Prepared {
        session_id,
        instance,
        spec,
        rejected,
        claimed,
        owner_lock,
        workspace,
        conversation,
        resume_argv,
    })
}

/// The configured command with `{agent}`, `{session_id}`, `{model}`,
/// `{prompt_file}` and `{instance}` filled in. A relative program path with a
/// `/` in it is relative to the config file's directory, like `state_root`.
pub fn command_line(
    config: &Config,
    agent: &AgentConfig,
    session_id: &str,
    instance: &str,
    model: &str,
    prompt_file: &Path,
) -> Vec<String> {
    // `{max_budget_usd}` only for a billed API key with a session cost
    // limit: a subscription reports no real cost, and `--max-budget-usd`
    // stops its runs that cost nothing. Otherwise the argument goes (and
    // the option before it, when the placeholder is a whole argument).
    let budget = config
        .credentials
        .get(&agent.session.credential)
        .filter(|c| c.api_key)
        .and(agent.session.session_budget.max_cost_usd)
        .map(|usd| format!("{usd:.2}"));
    let fill = |arg: &str| {
        arg.replace("{agent}", agent.name.as_str())
            .replace("{session_id}", session_id)
            .replace("{model}", model)
            .replace("{prompt_file}", &prompt_file.display().to_string())
            .replace("{instance}", instance)
            .replace("{max_turns}", &agent.session.max_turns.to_string())
            .replace("{max_budget_usd}", budget.as_deref().unwrap_or(""))
    };
    let mut argv: Vec<String> = Vec::new();
    for arg in &agent.session.command {
        if budget.is_none() && arg.contains("{max_budget_usd}") {
            let option_before = argv.len() > 1 && argv.last().is_some_and(|a| a.starts_with('-'));
            if arg == "{max_budget_usd}" && option_before {
                argv.pop();
            }
            continue;
        }
        argv.push(fill(arg));
    }
    if let Some(program) = argv.first_mut() {
        let p = PathBuf::from(&*program);
        if p.is_relative() && program.contains('/') {
            let base = config.source.parent().unwrap_or(Path::new("."));
            *program = base.join(p).display().to_string();
        }
    }
    argv
}

/// The program a session of `agent` runs (the command line's first word,
/// its placeholders filled in as far as they are known before a session
/// begins): what is checked before the claim.
pub fn program(config: &Config, agent: &AgentConfig) -> Option<String> {
    command_line(config, agent, "", "", &agent.session.model, Path::new(""))
        .into_iter()
        .next()
}

/// Claude Code's conversation in a command line: a whole argument
/// `{claude_session}` becomes `--session-id ID` (a new conversation) or
/// `--resume ID` (continuing one); `{claude_session_id}` is the id.
pub fn conversation_args(argv: &[String], id: &str, resume: bool) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len() + 1);
    for arg in argv {
        if arg == "{claude_session}" {
            out.push(if resume { "--resume" } else { "--session-id" }.to_string());
            out.push(id.to_string());
        } else {
            out.push(
                arg.replace("{claude_session_id}", id)
                    .replace("{claude_session}", id),
            );
        }
    }
    out
}

/// How the run ended, in the words session.json and the journal use.
pub fn describe(report: &RunReport, agent: &AgentConfig) -> (Option<&'static str>, String) {
    describe_ending(&report.ending, agent)
}

/// [`describe`] for an ending alone.
pub fn describe_ending(ending: &Ending, agent: &AgentConfig) -> (Option<&'static str>, String) {
    describe_with(ending, agent.session.timeout)
}

/// [`describe_ending`] with the session's `timeout`, the only setting it
/// reads (for the pure decisions in `machine`, crates/decide's `ending`).
pub use crate::ending::describe_with;

/// Note in session.json, before the runner signals the session, that the
/// daemon is ending it (`why`: its timeout, a stall, a stop): the session
/// script's trap, which reacts to the signal, then records the daemon's
/// outcome with both reasons (see [`hooks::note_daemon_ending`]).
pub fn note_ending(
    agent: &AgentConfig,
    dir: &AgentDir,
    session_id: &str,
    why: &Ending,
    now: Timestamp,
) -> Result<bool> {
    let (outcome, reason) = describe_ending(why, agent);
    let ending = hooks::DaemonEnding {
        outcome: outcome.unwrap_or("error").to_string(),
        reason,
        by_pid: std::process::id(),
        at: now,
        code: None,
    };
    hooks::note_daemon_ending(dir, session_id, &ending, now)
}

/// How a session's own script recorded its end (`session end|fail`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptEnd {
    Completed,
    /// `session fail` (or its trap), with the reason it gave.
    Failed {
        reason: String,
    },
}

/// Did the session's own script record its end, and how? Read before the
/// daemon records it.
pub fn script_end(dir: &AgentDir, session_id: &str) -> Option<ScriptEnd> {
    use crate::state::session::SessionStatus;
    let s = dir
        .read::<crate::state::session::Session>()
        .ok()
        .flatten()
        .filter(|s| s.session_id == session_id)?;
    // A held session runs on after its script's end: what it said is kept.
    if s.is_running()
        && let Some(said) = hooks::kept_word(&s)
    {
        return Some(if said.is_failure() {
            ScriptEnd::Failed {
                reason: said.reason.unwrap_or_default(),
            }
        } else {
            ScriptEnd::Completed
        });
    }
    match s.status? {
        SessionStatus::Completed => Some(ScriptEnd::Completed),
        SessionStatus::Error | SessionStatus::Timeout => Some(ScriptEnd::Failed {
            reason: s.reason.unwrap_or_default(),
        }),
        _ => None,
    }
}

/// How the daemon judged a session whose end it records ([`finish`]): its
/// machine's outcome, which session.json's status, reason and verdict are
/// written from (rendered once, by the outcome).
#[derive(Debug, Clone)]
pub struct Judged<'a> {
    pub outcome: &'a crate::daemon::machine::Outcome,
    /// The catalogue code the daemon judged a failure by (the error
    /// matrix's verdict): journaled in the line that commits the end (not
    /// for a success).
    pub code: Option<crate::catalogue::Code>,
}

impl Judged<'_> {
    /// What session.json says beside its status, when the status alone does
    /// not: a usage limit, an operator's stop.
    fn verdict(&self) -> Option<SessionVerdict> {
        use crate::daemon::machine::Outcome;
        match self.outcome {
            Outcome::UsageHeld { .. } => Some(SessionVerdict::UsageLimit),
            Outcome::Stopped { .. } => Some(SessionVerdict::Stopped),
            _ => None,
        }
    }
}

/// A session's end as recorded: what it counts as, and its words for the
/// log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub verdict: SessionVerdict,
    /// `completed`, `error: the session command exited with status 1`, …
    pub text: String,
    /// The session's script recorded its end first: the daemon's facts
    /// were not recorded with it (see `hooks::amend_ended`).
    pub by_script: bool,
}

/// Record the end of a daemon session through the same hooks a script uses.
/// If the script already ended or failed the session itself, this changes
/// nothing (the hooks are idempotent).
pub fn finish(
    agent: &AgentConfig,
    dir: &AgentDir,
    session_id: &str,
    judged: &Judged<'_>,
    claimed: Option<Vec<crate::inbox::Message>>,
    facts: hooks::Facts,
    now: Timestamp,
) -> Result<Finished> {
    let outcome = judged.outcome;
    let completed = outcome.is_completed();
    let text = outcome.reason();
    let result = if completed {
        hooks::end(
            agent,
            dir,
            &EndRequest {
                session: Some(session_id.to_string()),
                claimed,
                facts,
                ..EndRequest::default()
            },
            now,
        )?
    } else {
        hooks::fail(
            agent,
            dir,
            &FailRequest {
                session: Some(session_id.to_string()),
                outcome: outcome.status().as_str().to_string(),
                reason: text.clone(),
                code: judged.code.map(|c| c.as_str().to_string()),
                verdict: judged.verdict(),
                // A usage limit, a stop, an interruption, a command that
                // could not be executed (the file vanished between the
                // check before the claim and the spawn): the messages go
                // back as they were.
                not_an_attempt: !outcome.counts_attempt(),
                facts,
                ..FailRequest::default()
            },
            now,
        )?
    };
    for note in &result.notes {
        tracing::warn!(agent = %agent.name, session_id, "{note}");
    }
    // What was recorded: by this call, or by the session's own script
    // before it (then its verdict is session.json's, whatever the daemon
    // judged).
    let recorded = match (result.already_ended, result.outcome) {
        (true, _) => dir
            .read::<crate::state::session::Session>()
            .ok()
            .flatten()
            .filter(|s| s.session_id == session_id)
            .and_then(|s| Some(s.verdict.unwrap_or(verdict_of_status(s.status?)))),
        (false, Some(status)) => Some(match judged.verdict() {
            Some(SessionVerdict::UsageLimit) => SessionVerdict::UsageLimit,
            // An operator's stop is recorded with its own verdict (the
            // daemon's note in session.json, `hooks::finish`): read back.
            _ if status == SessionStatus::Error => dir
                .read::<crate::state::session::Session>()
                .ok()
                .flatten()
                .filter(|s| s.session_id == session_id)
                .and_then(|s| s.verdict)
                .filter(|v| *v == SessionVerdict::Stopped)
                .unwrap_or(SessionVerdict::Error),
            _ => verdict_of_status(status),
        }),
        (false, None) => None,
    };
    let verdict = recorded.unwrap_or(SessionVerdict::Error);
    let text = match result.outcome {
        Some(o) if result.already_ended => {
            format!("{} (recorded by the session itself)", o.as_str())
        }
        Some(o) if completed => o.as_str().to_string(),
        Some(o) => format!("{}: {text}", o.as_str()),
        None => text,
    };
    Ok(Finished {
        verdict,
        text,
        by_script: result.already_ended,
    })
}

/// The verdict a status says by itself.
fn verdict_of_status(status: SessionStatus) -> SessionVerdict {
    match status {
        SessionStatus::Completed | SessionStatus::Running => SessionVerdict::Completed,
        SessionStatus::Timeout => SessionVerdict::Timeout,
        SessionStatus::Error => SessionVerdict::Error,
    }
}

/// Write a wake request for the running daemon: a `.wake-{uuid}` file in
/// the agent's inbox, written atomically, holding `now`.
pub fn request_wake(dir: &AgentDir, now: Timestamp) -> Result<PathBuf> {
    let target = files::wake_request_path(&dir.inbox());
    // Written under a temp dotfile name beside it (never through a link)
    // and renamed in: the daemon ignores dotfiles.
    atomic::write_file(
        &dir.store,
        &target,
        format!("{now}\n").as_bytes(),
        crate::inbox::MESSAGE_MODE,
    )?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(config_text: &str, agent: usize) -> Vec<String> {
        let config = Config::parse(config_text, Path::new("/etc/agent-state/config.toml")).unwrap();
        command_line(
            &config,
            &config.agents[agent],
            "20261124-130000",
            "rio-007",
            "opus",
            Path::new("/s/rio/sessions/p.md"),
        )
    }

    #[test]
    fn max_budget_usd_is_filled_for_a_billed_key_only_and_max_turns_always() {
        let text = r#"
[credential.billed]
kind = "api_key"
[defaults]
command = ["claude", "-p", "--max-turns", "{max_turns}", "--max-budget-usd", "{max_budget_usd}", "--model={model}", "--x={max_budget_usd}"]
session_budget = { max_cost_usd = 2.5 }
[[agent]]
name = "rio"
credential = "billed"
max_turns = 30
[[agent]]
name = "leo"
"#;
        assert_eq!(
            argv(text, 0),
            [
                "claude",
                "-p",
                "--max-turns",
                "30",
                "--max-budget-usd",
                "2.50",
                "--model=opus",
                "--x=2.50"
            ]
        );
        // A subscription: the budget option is left out, the turns are not.
        assert_eq!(
            argv(text, 1),
            ["claude", "-p", "--max-turns", "100", "--model=opus"]
        );
    }
}
