//! An agent's session settings: its command (and the placeholders it may
//! use), timeouts, model, inbox policy, retries and backoff, stalls, the
//! prompt's budget and birth prompt, and the economy's, workspace's and
//! iteration's settings. Written in `[defaults]`, overridden field by field
//! in an `[[agent]]`.

use std::time::Duration;

use serde::Deserialize;

use super::economy::{RawBudget, RawSessionBudget, RawWakeIf};
use super::workspace::RawWorkspace;
use super::{
    Budget, BudgetAction, DEFAULT_CREDENTIAL, IterationSettings, SessionBudget, Validator, WakeIf,
    WorkspaceSettings, iteration, placeholders, valid_group,
};
use crate::state::session::SessionType;

/// Placeholders a session command may use.
pub const COMMAND_PLACEHOLDERS: &[&str] = &[
    "agent",
    "session_id",
    "model",
    "prompt_file",
    "instance",
    "max_turns",
    "max_budget_usd",
    "workspace",
    "claude_session",
    "claude_session_id",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeOnInbox {
    High,
    Any,
    Never,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SessionSettings {
    pub command: Vec<String>,
    pub timeout: Duration,
    pub kill_grace: Duration,
    pub model: String,
    pub session_type: SessionType,
    pub wake_on_inbox: WakeOnInbox,
    pub inbox_debounce: Duration,
    /// How long a message file that does not parse yet (or still has a
    /// second link) may still be being written before it is judged.
    pub inbox_settle: Duration,
    /// A wake request (`inbox/.wake-*`, what `agent-state wake` drops)
    /// starts a session at most once per this long: one arriving sooner
    /// after the last session a wake request started waits (collapsed into
    /// one) until this has passed. `0s`: no limit.
    pub wake_request_interval: Duration,
    pub max_output: u64,
    pub jitter: Duration,
    pub retries: RetrySettings,
    /// No output for this long is a stall (`None`: never).
    pub stall_timeout: Option<Duration>,
    pub stall_action: StallAction,
    /// The prompt is kept under this many bytes (what is cut is said).
    pub prompt_budget: u64,
    /// What a hatching agent's first session gets instead of its identity.
    pub birth_prompt: String,
    /// Daily limits of this agent (`budget = { ... }`).
    pub budget: Budget,
    /// Limits of one session, as its usage streams.
    pub session_budget: SessionBudget,
    pub budget_action: BudgetAction,
    /// The credential group (`[credential.NAME]`) this agent's sessions use.
    pub credential: String,
    /// Whether a scheduled wake starts a session.
    pub wake_if: WakeIf,
    /// An exit 0 without a COMPLETE signal is a failure (SESSION_INCOMPLETE).
    pub require_complete: bool,
    /// `{max_turns}` in the command.
    pub max_turns: u32,
    /// Each daemon session in its own git worktree (`workspace = {...}`).
    pub workspace: Option<WorkspaceSettings>,
    /// The iteration loop: `verify`, `max_iterations`, ...
    pub iteration: IterationSettings,
    /// The session cgroup's `memory.max` (`memory.high` at 90% of it);
    /// `None`: no limit. Applied where sessions get cgroups of their own.
    pub memory_max: Option<u64>,
    /// Where its sessions run when `[cluster]` sends sessions to workers
    /// (`local_sessions = false`); ignored otherwise (every session runs
    /// on this host).
    pub runs_on: RunsOn,
}

/// `runs_on`: where an agent's sessions run in cluster mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunsOn {
    /// On a worker (the default): ordered through the dispatch stream.
    #[default]
    Workers,
    /// On the controller's own host, with the local runner: what a worker
    /// cannot run yet (`verify` commands, a flow's steps) still runs, beside
    /// the sessions on workers.
    Controller,
}

/// The smallest `memory_max` accepted.
const MIN_MEMORY_MAX: u64 = 16 << 20;

/// The default `wake_request_interval`: a person's `agent-state wake` a
/// second after the last one waits at most that second; a flood of wake
/// requests (any member of the inbox group can make one) starts at most one
/// session of that agent per second instead of one after another.
pub const DEFAULT_WAKE_REQUEST_INTERVAL: &str = "1s";

/// The default birth prompt: the first session of an agent without an
/// identity asks it to write one.
pub const DEFAULT_BIRTH_PROMPT: &str = "You are a new agent on this team and have no identity yet. \
Before anything else, decide who you are: your domain, what you are for, how you work and \
what you will not do. Write it to identity.md in your state directory (the directory in the \
AGENT_STATE_DIR environment variable) in a few short sections; every later session starts \
from it. Then begin your work.";

/// How failed sessions are retried: the error matrix's own settings
/// (crates/decide's `failure`, which decides on them).
pub use crate::failure::RetrySettings;

/// What happens when a session stalls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StallAction {
    /// A `SESSION_STALLED` warning; the session goes on.
    #[default]
    Warn,
    /// The warning, then the session is ended like a timeout and retried.
    Stop,
}

/// `[defaults]`, or an agent's overrides (filled by `agent.rs` from its
/// `[[agent]]` table).
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSession {
    pub(super) command: Option<Vec<String>>,
    pub(super) timeout: Option<String>,
    pub(super) kill_grace: Option<String>,
    pub(super) model: Option<String>,
    pub(super) session_type: Option<String>,
    pub(super) wake_on_inbox: Option<String>,
    pub(super) inbox_debounce: Option<String>,
    pub(super) inbox_settle: Option<String>,
    pub(super) wake_request_interval: Option<String>,
    pub(super) max_output: Option<String>,
    pub(super) jitter: Option<String>,
    pub(super) timeout_retries: Option<i64>,
    pub(super) empty_output_retries: Option<i64>,
    pub(super) api_retries: Option<i64>,
    pub(super) spawn_retries: Option<i64>,
    pub(super) escalate_after: Option<i64>,
    pub(super) max_backoff: Option<String>,
    pub(super) network_retry_for: Option<String>,
    pub(super) retry_delay: Option<String>,
    pub(super) spawn_retry_delay: Option<String>,
    pub(super) stall_timeout: Option<String>,
    pub(super) stall_action: Option<String>,
    pub(super) prompt_budget: Option<String>,
    pub(super) birth_prompt: Option<String>,
    pub(super) budget: Option<RawBudget>,
    pub(super) session_budget: Option<RawSessionBudget>,
    pub(super) budget_action: Option<String>,
    pub(super) credential: Option<String>,
    pub(super) wake_if: Option<RawWakeIf>,
    pub(super) require_complete: Option<bool>,
    pub(super) max_turns: Option<i64>,
    pub(super) workspace: Option<RawWorkspace>,
    pub(super) verify: Option<Vec<Vec<String>>>,
    pub(super) verify_timeout: Option<String>,
    pub(super) max_iterations: Option<i64>,
    pub(super) stuck_threshold: Option<i64>,
    pub(super) resume: Option<bool>,
    pub(super) memory_max: Option<String>,
    pub(super) runs_on: Option<String>,
}

impl Validator {
    /// Resolve `overrides` over `base`. Values inherited from `[defaults]`
    /// were already checked there, so only overridden ones are reported here.
    pub(super) fn session_settings(
        &mut self,
        field: &str,
        _raw_base: &RawSession,
        raw: &RawSession,
        base: Option<&SessionSettings>,
    ) -> SessionSettings {
        let f = |name: &str| format!("{field}.{name}");
        let command = match &raw.command {
            Some(cmd) => {
                self.check_command(&f("command"), cmd);
                cmd.clone()
            }
            None => base.map(|b| b.command.clone()).unwrap_or_else(|| {
                vec![
                    "/opt/teleo-eval/research-session.sh".to_string(),
                    "{agent}".to_string(),
                ]
            }),
        };
        let dur = |v: &mut Self,
                   name: &str,
                   value: &Option<String>,
                   inherited: Option<Duration>,
                   default: &str| match (value, inherited) {
            (None, Some(d)) => d,
            (value, _) => v.duration(&f(name), value.as_deref(), default),
        };
        let timeout = dur(
            self,
            "timeout",
            &raw.timeout,
            base.map(|b| b.timeout),
            "90m",
        );
        if timeout.is_zero() {
            self.problem(f("timeout"), "must be longer than 0s");
        }
        let kill_grace = dur(
            self,
            "kill_grace",
            &raw.kill_grace,
            base.map(|b| b.kill_grace),
            "30s",
        );
        let inbox_debounce = dur(
            self,
            "inbox_debounce",
            &raw.inbox_debounce,
            base.map(|b| b.inbox_debounce),
            "30s",
        );
        let inbox_settle = dur(
            self,
            "inbox_settle",
            &raw.inbox_settle,
            base.map(|b| b.inbox_settle),
            "60s",
        );
        let wake_request_interval = dur(
            self,
            "wake_request_interval",
            &raw.wake_request_interval,
            base.map(|b| b.wake_request_interval),
            DEFAULT_WAKE_REQUEST_INTERVAL,
        );
        let jitter = dur(self, "jitter", &raw.jitter, base.map(|b| b.jitter), "0s");
        let model = match &raw.model {
            Some(m) if !m.trim().is_empty() => m.clone(),
            Some(_) => {
                self.warn(
                    f("model"),
                    "is empty; using the default, \"sonnet\" (set e.g. model = \"opus\")",
                );
                "sonnet".into()
            }
            None => base
                .map(|b| b.model.clone())
                .unwrap_or_else(|| "sonnet".into()),
        };
        let session_type = match &raw.session_type {
            Some(t) => t.parse::<SessionType>().unwrap_or_else(|e| {
                self.problem(f("session_type"), e.to_string());
                SessionType::Research
            }),
            None => base
                .map(|b| b.session_type)
                .unwrap_or(SessionType::Research),
        };
        let wake_on_inbox = match raw.wake_on_inbox.as_deref() {
            Some("high") => WakeOnInbox::High,
            Some("any") => WakeOnInbox::Any,
            Some("never") => WakeOnInbox::Never,
            Some(other) => {
                self.problem(
                    f("wake_on_inbox"),
                    format!("{other:?} is not a policy; use \"high\", \"any\" or \"never\""),
                );
                WakeOnInbox::High
            }
            None => base.map(|b| b.wake_on_inbox).unwrap_or(WakeOnInbox::High),
        };
        let max_output = match (&raw.max_output, base) {
            (None, Some(b)) => b.max_output,
            (value, _) => self.size(&f("max_output"), value.as_deref(), "10MiB"),
        };
        let d = RetrySettings::default();
        let b = base.map(|b| b.retries);
        let retries = RetrySettings {
            timeout: self.count(
                &f("timeout_retries"),
                raw.timeout_retries,
                b.map(|b| b.timeout),
                d.timeout,
                0..=100,
            ),
            empty_output: self.count(
                &f("empty_output_retries"),
                raw.empty_output_retries,
                b.map(|b| b.empty_output),
                d.empty_output,
                0..=100,
            ),
            api: self.count(
                &f("api_retries"),
                raw.api_retries,
                b.map(|b| b.api),
                d.api,
                0..=100,
            ),
            spawn: self.count(
                &f("spawn_retries"),
                raw.spawn_retries,
                b.map(|b| b.spawn),
                d.spawn,
                0..=100,
            ),
            escalate_after: self.count(
                &f("escalate_after"),
                raw.escalate_after,
                b.map(|b| b.escalate_after),
                d.escalate_after,
                1..=1000,
            ),
            retry_delay: dur(
                self,
                "retry_delay",
                &raw.retry_delay,
                b.map(|b| b.retry_delay),
                "30s",
            ),
            spawn_retry_delay: dur(
                self,
                "spawn_retry_delay",
                &raw.spawn_retry_delay,
                b.map(|b| b.spawn_retry_delay),
                "2s",
            ),
            max_backoff: dur(
                self,
                "max_backoff",
                &raw.max_backoff,
                b.map(|b| b.max_backoff),
                "1h",
            ),
            network_retry_for: dur(
                self,
                "network_retry_for",
                &raw.network_retry_for,
                b.map(|b| b.network_retry_for),
                "10m",
            ),
        };
        if retries.retry_delay.is_zero() || retries.spawn_retry_delay.is_zero() {
            self.problem(
                f("retry_delay"),
                "retry_delay and spawn_retry_delay must be longer than 0s (a retry storm otherwise)",
            );
        }
        if retries.max_backoff < retries.retry_delay {
            self.problem(
                f("max_backoff"),
                "must be at least retry_delay (the first backoff step)",
            );
        }
        let stall_timeout = match raw.stall_timeout.as_deref() {
            None => base.and_then(|b| b.stall_timeout),
            Some("off" | "none" | "0" | "0s") => None,
            Some(text) => Some(self.duration(&f("stall_timeout"), Some(text), "0s")),
        };
        let stall_action = match raw.stall_action.as_deref() {
            None => base.map(|b| b.stall_action).unwrap_or_default(),
            Some("warn") => StallAction::Warn,
            Some("stop") => StallAction::Stop,
            Some(other) => {
                self.problem(
                    f("stall_action"),
                    format!("{other:?} is not an action; use \"warn\" or \"stop\""),
                );
                StallAction::Warn
            }
        };
        let prompt_budget = match (&raw.prompt_budget, base) {
            (None, Some(b)) => b.prompt_budget,
            (value, _) => self.size(&f("prompt_budget"), value.as_deref(), "200KiB"),
        };
        if prompt_budget < 4096 {
            self.problem(
                f("prompt_budget"),
                "must be at least 4KiB (rules and identity are never cut)",
            );
        }
        let birth_prompt = match (&raw.birth_prompt, base) {
            (Some(t), _) if !t.trim().is_empty() => t.clone(),
            (Some(_), _) => {
                self.warn(
                    f("birth_prompt"),
                    "is empty; using the built-in birth prompt",
                );
                DEFAULT_BIRTH_PROMPT.to_string()
            }
            (None, Some(b)) => b.birth_prompt.clone(),
            (None, None) => DEFAULT_BIRTH_PROMPT.to_string(),
        };
        let budget = self.budget(&f("budget"), raw.budget.as_ref(), base.map(|b| b.budget));
        let session_budget = self.session_budget(
            &f("session_budget"),
            raw.session_budget.as_ref(),
            base.map(|b| b.session_budget),
        );
        let budget_action = self.budget_action(
            &f("budget_action"),
            raw.budget_action.as_deref(),
            base.map(|b| b.budget_action),
        );
        let credential = match &raw.credential {
            Some(c) if valid_group(c) => c.clone(),
            Some(c) => {
                self.problem(
                    f("credential"),
                    format!("{c:?} is not a credential name (letters, digits, - and _)"),
                );
                DEFAULT_CREDENTIAL.to_string()
            }
            None => base
                .map(|b| b.credential.clone())
                .unwrap_or_else(|| DEFAULT_CREDENTIAL.to_string()),
        };
        let wake_if = self.wake_if(
            &f("wake_if"),
            raw.wake_if.as_ref(),
            base.map(|b| &b.wake_if),
        );
        let require_complete = raw
            .require_complete
            .or(base.map(|b| b.require_complete))
            .unwrap_or(false);
        let max_turns = self.count(
            &f("max_turns"),
            raw.max_turns,
            base.map(|b| b.max_turns),
            100,
            1..=100_000,
        );
        let workspace = self.workspace(
            &f("workspace"),
            raw.workspace.as_ref(),
            base.and_then(|b| b.workspace.as_ref()),
        );
        let iteration = self.iteration(
            &f,
            iteration::RawIteration {
                verify: raw.verify.as_ref(),
                verify_timeout: raw.verify_timeout.as_deref(),
                max_iterations: raw.max_iterations,
                stuck_threshold: raw.stuck_threshold,
                resume: raw.resume,
            },
            base.map(|b| &b.iteration),
        );
        let memory_max = match raw.memory_max.as_deref() {
            None => base.and_then(|b| b.memory_max),
            Some("none" | "off") => None,
            Some(text) => {
                let n = self.size(&f("memory_max"), Some(text), "0");
                if n != 0 && n < MIN_MEMORY_MAX {
                    self.problem(
                        f("memory_max"),
                        format!("{text:?} is below 16MiB: no session command starts in that; write e.g. \"2G\", or \"none\""),
                    );
                }
                (n != 0).then_some(n)
            }
        };
        let runs_on = match raw.runs_on.as_deref() {
            None => base.map(|b| b.runs_on).unwrap_or_default(),
            Some("workers") => RunsOn::Workers,
            Some("controller") => RunsOn::Controller,
            Some(other) => {
                self.problem(
                    f("runs_on"),
                    format!("{other:?} is not a place; use \"workers\" (the default) or \"controller\" (this host, beside the workers)"),
                );
                RunsOn::Workers
            }
        };
        SessionSettings {
            runs_on,
            memory_max,
            iteration,
            workspace,
            max_turns,
            credential,
            wake_if,
            require_complete,
            budget,
            session_budget,
            budget_action,
            prompt_budget,
            birth_prompt,
            command,
            timeout,
            kill_grace,
            model,
            session_type,
            wake_on_inbox,
            inbox_debounce,
            inbox_settle,
            wake_request_interval,
            max_output,
            jitter,
            retries,
            stall_timeout,
            stall_action,
        }
    }

    fn check_command(&mut self, field: &str, cmd: &[String]) {
        if cmd.is_empty() || cmd[0].trim().is_empty() {
            self.problem(
                field,
                "must name a program: [\"/opt/teleo-eval/research-session.sh\", \"{agent}\"]",
            );
            return;
        }
        for arg in cmd {
            for placeholder in placeholders(arg) {
                if !COMMAND_PLACEHOLDERS.contains(&placeholder.as_str()) {
                    self.problem(
                        field,
                        format!(
                            "unknown placeholder {{{placeholder}}} in {arg:?}; known: {}",
                            COMMAND_PLACEHOLDERS
                                .iter()
                                .map(|p| format!("{{{p}}}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                }
            }
        }
    }
}
