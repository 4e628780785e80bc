//! The error catalogue: every failure the service meets has a code, a
//! severity, a recovery and an escalation (seed 002's matrix, adapted to a
//! daemon without a web UI). `docs/errors.md` is generated from
//! [`CATALOGUE`] (`agent-state errors --catalogue`), and a test keeps the
//! two equal.
//!
//! An [`ErrorRecord`] is one occurrence, in the seed's error format. The
//! daemon's alerts append it to `.daemon/errors.jsonl` (through
//! [`crate::state::error_log`]), log it with `ERROR_CODE` and a priority
//! that follows the severity, run the on-error hook and escalate; this
//! module is only data.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;

/// How bad an error is. Ordered: `Low < Medium < High < Critical`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Logged; recovers by itself; nothing to do.
    Low,
    /// Recovers by itself (with retries); worth a look. Runs the on-error hook.
    Medium,
    /// Limited recovery; review recommended. Hook, and escalation where the
    /// catalogue says so.
    High,
    /// No automatic recovery: the daemon stops that work until an operator acts.
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }

    /// The syslog priority journald records: critical → crit (2),
    /// high → err (3), medium → warning (4), low → notice (5).
    pub fn journal_priority(self) -> u8 {
        match self {
            Severity::Critical => 2,
            Severity::High => 3,
            Severity::Medium => 4,
            Severity::Low => 5,
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of the catalogue.
#[derive(Debug)]
pub struct CodeInfo {
    pub code: Code,
    pub severity: Severity,
    /// Does the daemon recover without an operator?
    pub recoverable: bool,
    pub cause: &'static str,
    pub recovery: &'static str,
    pub escalation: &'static str,
    /// What an operator can do, most likely first.
    pub suggestions: &'static [&'static str],
}

macro_rules! codes {
    ($($variant:ident = $text:literal),* $(,)?) => {
        /// An error code. `as_str` gives the `SCREAMING_SNAKE` name used in
        /// errors.jsonl, the journal's `ERROR_CODE` and the hook environment.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Code { $($variant),* }

        impl Code {
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $text),* }
            }

            pub fn parse(text: &str) -> Option<Code> {
                match text { $($text => Some(Code::$variant),)* _ => None }
            }
        }
    };
}

codes! {
    AgentNotFound = "AGENT_NOT_FOUND",
    AgentPermissionDenied = "AGENT_PERMISSION_DENIED",
    AgentSpawnFailed = "AGENT_SPAWN_FAILED",
    WorkspaceNotARepo = "WORKSPACE_NOT_A_REPO",
    WorkspaceLocked = "WORKSPACE_LOCKED",
    WorkspaceFailed = "WORKSPACE_FAILED",
    WorkspaceInvalidCommits = "WORKSPACE_INVALID_COMMITS",
    MergeConflict = "MERGE_CONFLICT",
    MergeNothingToMerge = "MERGE_NOTHING_TO_MERGE",
    MergeNotMergeable = "MERGE_NOT_MERGEABLE",
    MergeProtectedBranch = "MERGE_PROTECTED_BRANCH",
    PublishFailed = "PUBLISH_FAILED",
    SessionTimeout = "SESSION_TIMEOUT",
    SessionFailed = "SESSION_FAILED",
    SessionEmptyOutput = "SESSION_EMPTY_OUTPUT",
    OutputTruncated = "OUTPUT_TRUNCATED",
    AgentLoginRequired = "AGENT_LOGIN_REQUIRED",
    AgentApiError = "AGENT_API_ERROR",
    SessionStalled = "SESSION_STALLED",
    SessionOom = "SESSION_OOM",
    SessionLoop = "SESSION_LOOP",
    SessionInterrupted = "SESSION_INTERRUPTED",
    SessionStopped = "SESSION_STOPPED",
    SessionIncomplete = "SESSION_INCOMPLETE",
    SessionSuspect = "SESSION_SUSPECT",
    VerifyFailed = "VERIFY_FAILED",
    SessionStuck = "SESSION_STUCK",
    UsageLimit = "USAGE_LIMIT",
    UsageDisabled = "USAGE_DISABLED",
    BudgetExhausted = "BUDGET_EXHAUSTED",
    CredentialFailed = "CREDENTIAL_FAILED",
    InboxRejected = "INBOX_REJECTED",
    StateCorrupt = "STATE_CORRUPT",
    JournalTorn = "JOURNAL_TORN",
    PathUnsafe = "PATH_UNSAFE",
    LockBusy = "LOCK_BUSY",
    DiskLow = "DISK_LOW",
    DiskCritical = "DISK_CRITICAL",
    DiskFull = "DISK_FULL",
    FsReadonly = "FS_READONLY",
    IoError = "IO_ERROR",
    ConfigInvalid = "CONFIG_INVALID",
    ConfigDefaulted = "CONFIG_DEFAULTED",
    HookFailed = "HOOK_FAILED",
    EscalationFailed = "ESCALATION_FAILED",
}

impl Code {
    /// Does this code say a session never ran: its command could not be
    /// started, or its workspace could not be made? (`wake --wait` exits 1
    /// on these, 75 for a workspace locked or not made, which is retried; a
    /// session that ran and failed is the daemon's to retry.)
    pub fn prevents_start(self) -> bool {
        matches!(
            self,
            Code::AgentNotFound
                | Code::AgentPermissionDenied
                | Code::AgentSpawnFailed
                | Code::WorkspaceNotARepo
                | Code::WorkspaceLocked
                | Code::WorkspaceFailed
        )
    }

    pub fn info(self) -> &'static CodeInfo {
        CATALOGUE
            .iter()
            .find(|i| i.code == self)
            .expect("every code has a catalogue row (tested)")
    }

    pub fn severity(self) -> Severity {
        self.info().severity
    }
}

/// Is `code` (a journal line's or session.json's text) `SESSION_STOPPED`:
/// an operator's stop, which counts neither as a failure of the agent nor
/// as a delivery attempt of its messages?
pub fn stopped(code: Option<&str>) -> bool {
    code.and_then(Code::parse) == Some(Code::SessionStopped)
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Every code, in the order of `docs/errors.md`.
pub static CATALOGUE: &[CodeInfo] = &[
    // Agent: spawning the session command.
    CodeInfo {
        code: Code::AgentNotFound,
        severity: Severity::High,
        recoverable: false,
        cause: "The session command (or the interpreter on its `#!` line) does not exist.",
        recovery: "Checked before a session claims anything: no session starts, the messages wait in the inbox untouched (no attempt counted), and the agent is held until the command can run. Checked again at every health check (`health.interval`), on reload and on `agent-state wake`, so installing the command is enough.",
        escalation: "At once, once per failure streak: human mailbox and on-error hook.",
        suggestions: &[
            "Install the command (Claude Code: `npm install -g @anthropic-ai/claude-code`)",
            "Check `command` in the config: a relative path is relative to the config file",
            "Check PATH in the unit's environment",
        ],
    },
    CodeInfo {
        code: Code::AgentPermissionDenied,
        severity: Severity::Critical,
        recoverable: false,
        cause: "The session command is not executable, or a directory on its path is not searchable.",
        recovery: "As for `AGENT_NOT_FOUND`: nothing is claimed, the agent is held until the command can run (checked at every health check, on reload and on `agent-state wake`), so `chmod +x` is enough.",
        escalation: "At once: human mailbox and on-error hook.",
        suggestions: &[
            "chmod +x the command",
            "Check that the service user can search every directory on the command's path",
        ],
    },
    CodeInfo {
        code: Code::AgentSpawnFailed,
        severity: Severity::Medium,
        recoverable: true,
        cause: "Any other spawn failure: missing working directory, session log not writable, fork failed.",
        recovery: "Retried up to `spawn_retries` times (default 3), `spawn_retry_delay` apart (default 2 s), doubling.",
        escalation: "When the retries are exhausted.",
        suggestions: &[
            "Read the details: they name the path",
            "Run `agent-state check` for the agent's directory",
        ],
    },
    // Agent: the session's workspace (a git worktree, `workspace = {...}`).
    CodeInfo {
        code: Code::WorkspaceNotARepo,
        severity: Severity::High,
        recoverable: false,
        cause: "The agent's `workspace.repo` is not a git repository (or does not exist): its session cannot get a worktree.",
        recovery: "The session is not started; the agent is disabled until its config changes (reload with SIGHUP) or `agent-state wake` is run.",
        escalation: "At once: human mailbox and on-error hook.",
        suggestions: &[
            "Point `workspace.repo` at a git repository the service user can read and write",
            "`git init` it, or clone it there, then `systemctl reload agent-state`",
        ],
    },
    CodeInfo {
        code: Code::WorkspaceLocked,
        severity: Severity::Medium,
        recoverable: true,
        cause: "A git lock (`index.lock`, a ref's `.lock`) in the repository stayed held through 5 retries 1 s apart while the session's worktree was made.",
        recovery: "Retried like a failed spawn (`spawn_retries`, `spawn_retry_delay`, doubling).",
        escalation: "When the retries are exhausted.",
        suggestions: &[
            "Check that no git process is still running in the repository",
            "Remove the stale `.lock` file the details name",
        ],
    },
    CodeInfo {
        code: Code::WorkspaceFailed,
        severity: Severity::Medium,
        recoverable: true,
        cause: "Any other failure making the session's worktree: the base does not exist, the workspaces root is not writable, git failed or timed out.",
        recovery: "Retried like a failed spawn (`spawn_retries`, `spawn_retry_delay`, doubling).",
        escalation: "When the retries are exhausted.",
        suggestions: &[
            "Read the details: they name the git command and its error",
            "Check `workspace.base` names a branch, tag or commit of the repository",
        ],
    },
    CodeInfo {
        code: Code::WorkspaceInvalidCommits,
        severity: Severity::Medium,
        recoverable: true,
        cause: "The session left its worktree in a broken git state (seed 002's `invalid_commits`): HEAD names no commit, is detached or on another branch, the base is not in its history (rewritten or unrelated), a merge, rebase, cherry-pick or revert is half done, or the index holds conflicts.",
        recovery: "The workspace is reset to the base: the worktree is removed and what it held set aside on a branch `BRANCH-invalid` (`-invalid-N`), never deleted; the session is retried once, from the base, after `retry_delay`. Checked whatever the exit status; a timeout or stop keeps its own code (the workspace is reset all the same).",
        escalation: "After 2 occurrences in a row (the retry left invalid commits too).",
        suggestions: &[
            "Read the details: they say what was broken",
            "Look at the branch set aside: `git log BRANCH-invalid`",
            "Tell the agent (its prompt, CLAUDE.md) to commit on its branch and never rewrite history below it",
        ],
    },
    // Git: publishing an approved flow cycle (`[[flow]] publish`).
    CodeInfo {
        code: Code::MergeConflict,
        severity: Severity::Medium,
        recoverable: false,
        cause: "The cycle's branch and the remote's branch changed the same lines: its rebase onto the remote's branch stopped on conflicts. The details give the seed's classification: SIMPLE (whitespace only), COMPLEX (a file renamed or deleted on one side, or more than 50 conflicting lines), MEDIUM (anything else), with the files and lines.",
        recovery: "SIMPLE: resolved automatically (the rebase again, ignoring whitespace) and published; the record says so. MEDIUM and COMPLEX: nothing is published, the branch stays as it was for a human to merge.",
        escalation: "MEDIUM and COMPLEX at once: human mailbox and on-error hook. SIMPLE never.",
        suggestions: &[
            "Rebase the cycle's branch onto the remote's branch by hand, resolve, push",
            "Read the flow's journal (`published` event): the files and the level",
        ],
    },
    CodeInfo {
        code: Code::MergeNothingToMerge,
        severity: Severity::Low,
        recoverable: true,
        cause: "The cycle's branch is already in the remote branch's history (already merged, or no change).",
        recovery: "Skipped and marked done: `on_approve` runs as after a publish.",
        escalation: "Never.",
        suggestions: &["Nothing to do; check the Actor made the change if one was expected"],
    },
    CodeInfo {
        code: Code::MergeNotMergeable,
        severity: Severity::High,
        recoverable: false,
        cause: "The histories cannot be joined: the cycle's branch shares no history with the remote's branch, or the remote's branch moved on while it was being published (its push was refused as not a fast-forward). Diverged histories with a common base are rebased first (the seed's \"rebase attempt\"): this code is what is left when that cannot be done.",
        recovery: "Nothing is published; the branch stays as it was.",
        escalation: "At once (human review): human mailbox and on-error hook.",
        suggestions: &[
            "Compare the branch with the remote's (`git log --oneline --graph BRANCH REMOTE/INTO`)",
            "Approve again once the remote's branch is quiet, or merge by hand",
        ],
    },
    CodeInfo {
        code: Code::MergeProtectedBranch,
        severity: Severity::High,
        recoverable: false,
        cause: "The remote refused the push itself (a protected branch, a pre-receive hook, missing rights): git's `[remote rejected]`.",
        recovery: "Nothing is published; a human pushes or opens a pull request (the seed's \"human push\").",
        escalation: "At once: human mailbox and on-error hook.",
        suggestions: &[
            "Push the cycle's branch to another branch and open a pull request",
            "Publish into a branch the service may push to (`publish.into`)",
        ],
    },
    CodeInfo {
        code: Code::PublishFailed,
        severity: Severity::Medium,
        recoverable: false,
        cause: "Any other failure publishing an approved cycle: the remote unreachable, git failed or timed out, the Actor's worktree gone.",
        recovery: "Nothing is published; `on_approve` does not run.",
        escalation: "At once: human mailbox and on-error hook.",
        suggestions: &[
            "Read the details: they name the git command and its error",
            "Check `publish.remote` is reachable by the service user",
        ],
    },
    // Agent: how the session ended.
    CodeInfo {
        code: Code::SessionTimeout,
        severity: Severity::Medium,
        recoverable: true,
        cause: "The session ran past `timeout` (SIGTERM, then SIGKILL after `kill_grace`).",
        recovery: "Recorded as `timeout`; retried up to `timeout_retries` times (default 2), `retry_delay` apart (default 30 s), doubling.",
        escalation: "When the retries are exhausted.",
        suggestions: &[
            "Raise `timeout` if sessions legitimately need longer",
            "Read the session log: sessions/{id}.log",
        ],
    },
    CodeInfo {
        code: Code::SessionFailed,
        severity: Severity::Medium,
        recoverable: true,
        cause: "The session command exited non-zero, was killed by a signal, or reported an error result.",
        recovery: "Recorded as `error`; automatic wakes back off (`retry_delay` doubling per failure, at most `max_backoff`); the first success clears it.",
        escalation: "After `escalate_after` failures in a row (default 3).",
        suggestions: &[
            "Read the session log: sessions/{id}.log",
            "Killed by SIGKILL without a timeout and not SESSION_OOM: someone's kill -9, or an OOM kill the daemon could not see (check the kernel log)",
        ],
    },
    CodeInfo {
        code: Code::SessionEmptyOutput,
        severity: Severity::Medium,
        recoverable: true,
        cause: "The session printed nothing at all (stdout and stderr).",
        recovery: "Recorded as `error` even after exit 0 (unless the script recorded its own end); retried up to `empty_output_retries` times (default 3), `retry_delay` apart, doubling.",
        escalation: "When the retries are exhausted.",
        suggestions: &["Run the command by hand with the prompt file on stdin"],
    },
    CodeInfo {
        code: Code::OutputTruncated,
        severity: Severity::Low,
        recoverable: true,
        cause: "The session printed more than `max_output`.",
        recovery: "The log keeps the first `max_output` bytes; the rest is read, parsed and dropped.",
        escalation: "Never.",
        suggestions: &["Raise `max_output` if the whole output is needed"],
    },
    CodeInfo {
        code: Code::AgentLoginRequired,
        severity: Severity::Critical,
        recoverable: false,
        cause: "Claude Code's JSON result says it is not logged in (or the API key is invalid or expired).",
        recovery: "No retry. Every agent of the credential is held (until its check passes, or without a check until one session tries after `[usage_limits] wait`); a session of the credential that succeeds, or `agent-state credential release NAME`, releases them.",
        escalation: "At once, once per failure streak: human mailbox and on-error hook.",
        suggestions: &[
            "Log in as the service user: `sudo -u agent-state -H claude` then /login",
            "Or set ANTHROPIC_API_KEY in the unit's environment file",
            "Then `agent-state wake AGENT` (a success releases the credential) or `agent-state credential release NAME`",
        ],
    },
    CodeInfo {
        code: Code::AgentApiError,
        severity: Severity::Medium,
        recoverable: true,
        cause: "Claude Code's JSON result reports an API error: overload, 5xx, connection failure (a usage or rate limit is `USAGE_LIMIT`: the credential waits instead).",
        recovery: "Retried with exponential backoff (`retry_delay` doubling) up to `api_retries` times (default 5).",
        escalation: "When the retries are exhausted.",
        suggestions: &["Check https://status.anthropic.com and the account's rate limits"],
    },
    CodeInfo {
        code: Code::SessionStalled,
        severity: Severity::Medium,
        recoverable: true,
        cause: "The session printed nothing for `stall_timeout`.",
        recovery: "`stall_action = \"warn\"`: logged, the session goes on. `\"stop\"`: ended like a timeout and retried like one.",
        escalation: "As for a timeout.",
        suggestions: &[
            "`claude -p --output-format json` prints only at the end: use stream-json, or leave stall_timeout unset",
        ],
    },
    CodeInfo {
        code: Code::SessionOom,
        severity: Severity::High,
        recoverable: true,
        cause: "The kernel's OOM killer ended the session: its cgroup's `memory.events` counts an `oom_kill` (under systemd with `Delegate=yes`), or, without a cgroup of its own, it died of a SIGKILL the daemon did not send while the kernel's `oom_kill` count in /proc/vmstat rose. SIGKILL alone is never taken for one.",
        recovery: "Retried once, after `retry_delay`; `daemon.max_concurrent_sessions` is lowered by one (never below one) for `daemon.oom_lower_for` (default 1h) from the last OOM kill, shown in `status` and daemon.json.",
        escalation: "If it recurs: the retry killed too.",
        suggestions: &[
            "Set or raise `memory_max` for the agent (the session cgroup's memory.max)",
            "Lower `daemon.max_concurrent_sessions`",
            "Read the session log and the kernel log (`journalctl -k | grep -i oom`)",
        ],
    },
    CodeInfo {
        code: Code::SessionLoop,
        severity: Severity::High,
        recoverable: false,
        cause: "A retry printed exactly the same output as the attempt before it.",
        recovery: "Retries stop at once; automatic wakes back off.",
        escalation: "At once: human mailbox and on-error hook.",
        suggestions: &["Read the session log; the agent repeats itself"],
    },
    CodeInfo {
        code: Code::SessionInterrupted,
        severity: Severity::Medium,
        recoverable: true,
        cause: "A session was left `running` by a process that is gone (daemon killed, script crashed), or its process died unseen.",
        recovery: "Recorded as `error`; its claimed messages go back to the inbox; leftover processes are killed.",
        escalation: "Never.",
        suggestions: &["Look for why the daemon or script died: `journalctl -u agent-state`"],
    },
    CodeInfo {
        code: Code::SessionStopped,
        severity: Severity::Low,
        recoverable: true,
        cause: "An operator stopped the running session (`agent-state stop AGENT --reason TEXT`).",
        recovery: "Not a failure: its processes get SIGTERM, then SIGKILL after `kill_grace` (the path of a timeout); recorded as `error` with this code, the reason and who stopped it; its messages go back to the inbox, no attempt counted, and wait for the next wake (a schedule, `agent-state wake`, a new message). No retry, no backoff.",
        escalation: "Never: the journal's `error` line and session.json's `errors` say it; errors.jsonl does not.",
        suggestions: &[
            "`agent-state wake AGENT` runs the agent again now, with the messages the stopped session had claimed",
        ],
    },
    CodeInfo {
        code: Code::SessionIncomplete,
        severity: Severity::Medium,
        recoverable: true,
        cause: "The session exited 0 without a COMPLETE signal, and the agent's config says `require_complete = true`.",
        recovery: "Recorded as `error`; automatic wakes back off like any failure.",
        escalation: "After `escalate_after` failures in a row (default 3).",
        suggestions: &[
            "Read the session log: did the agent stop early, or forget to print COMPLETE?",
            "Check that the agent's instructions ask for the COMPLETE signal",
        ],
    },
    CodeInfo {
        code: Code::SessionSuspect,
        severity: Severity::Low,
        recoverable: true,
        cause: "The session ended well, but Claude Code was refused tool uses (`permission_denials`): its work may be half done.",
        recovery: "The session counts as completed; the refused tools are named.",
        escalation: "Never.",
        suggestions: &[
            "Allow the tools the agent needs (`--allowedTools`, or settings.json permissions)",
            "Or tell the agent in its instructions which tools it may not use",
        ],
    },
    CodeInfo {
        code: Code::VerifyFailed,
        severity: Severity::High,
        recoverable: true,
        cause: "The agent's `verify` commands still failed after `max_iterations` iterations of the session (each iteration was given the last failure).",
        recovery: "The session is recorded as `error` with the last failure (command, exit, output tail); automatic wakes back off.",
        escalation: "At once: human mailbox and on-error hook, with the last failure.",
        suggestions: &[
            "Read the failure and the session's logs (`sessions/ID.log`, `ID.iter-N.log`)",
            "Raise `max_iterations`, or fix what the agent cannot",
        ],
    },
    CodeInfo {
        code: Code::SessionStuck,
        severity: Severity::High,
        recoverable: true,
        cause: "Iterations in a row changed nothing in the workspace (same tree): `stuck_threshold` reached, a nudge given, and the next changed nothing either.",
        recovery: "The loop stops; the session is recorded as `error`; automatic wakes back off.",
        escalation: "At once: human mailbox and on-error hook.",
        suggestions: &[
            "Read the last iteration's log: the agent may lack a tool or a permission",
            "Check the task is possible in the workspace",
        ],
    },
    // The subscription.
    CodeInfo {
        code: Code::UsageLimit,
        severity: Severity::Low,
        recoverable: true,
        cause: "Claude Code hit a usage or rate limit (the 5-hour or weekly window, extra usage, the API's rate limit).",
        recovery: "Not a failure: every agent of the credential is held until the limit resets (plus up to two minutes), then the session is run again. Without a known reset: `[usage_limits] wait`, then one probe session, doubling up to `max_wait`.",
        escalation: "One notice per hold (this record); never the human mailbox.",
        suggestions: &[
            "Nothing to do: the agents resume at the reset",
            "Lower `max_sessions` or `max_tokens` budgets if the limit is hit every day",
        ],
    },
    CodeInfo {
        code: Code::UsageDisabled,
        severity: Severity::Critical,
        recoverable: false,
        cause: "The account's usage is disabled or capped by an admin (allocation disabled, spend limit, seat); it does not reset by itself.",
        recovery: "Every agent of the credential is held until a session succeeds again (`agent-state wake` tries one) or `agent-state credential release NAME`.",
        escalation: "At once: human mailbox and on-error hook.",
        suggestions: &[
            "Ask the organisation's admin to restore the allocation or raise the spend limit",
            "Then `agent-state wake AGENT` to try again",
        ],
    },
    CodeInfo {
        code: Code::BudgetExhausted,
        severity: Severity::Low,
        recoverable: true,
        cause: "A daily budget (`budget` or `[budget]`: sessions, runtime, tokens or cost) is used up.",
        recovery: "Scheduled wakes are skipped (`wake_skipped` names the budget); inbox and manual wakes wait for the next day in `[budget] timezone`.",
        escalation: "Once a day per agent (or the fleet): a message to the human mailbox.",
        suggestions: &[
            "See what was used: `agent-state usage`",
            "Raise the budget in the config and `agent-state reload`",
        ],
    },
    CodeInfo {
        code: Code::CredentialFailed,
        severity: Severity::High,
        recoverable: true,
        cause: "The credential's check (`[credential.NAME] check`, e.g. `claude auth status --json`) failed, or a session found it logged out.",
        recovery: "Every agent of the credential is held; the check runs again every `check_every` and releases them when it passes, as does a session of the credential that succeeds or `agent-state credential release NAME`.",
        escalation: "At once, once per failure: human mailbox (with the runbook) and on-error hook.",
        suggestions: &[
            "Log in as the service user: `sudo -u agent-state -H claude` then /login",
            "Check the credential by hand: `sudo -u agent-state -H claude auth status`",
        ],
    },
    // State.
    CodeInfo {
        code: Code::InboxRejected,
        severity: Severity::Low,
        recoverable: true,
        cause: "An inbox file is not a valid message (bad JSON, wrong field, symlink, FIFO, over 1 MiB).",
        recovery: "Moved to inbox/rejected/ with a .reason.json naming the field; never lost.",
        escalation: "Never.",
        suggestions: &["Fix the sender; `agent-state inbox AGENT --rejected` lists them"],
    },
    CodeInfo {
        code: Code::StateCorrupt,
        severity: Severity::Medium,
        recoverable: true,
        cause: "A JSON state file does not parse (a crash during a non-atomic edit, a bad hand edit).",
        recovery: "Set aside as name.corrupt-TIMESTAMP and rebuilt from the journal; counters from the highest ids found, never reset.",
        escalation: "Never (automatic); the set-aside file is kept for review.",
        suggestions: &["Compare the .corrupt-* file with the rebuilt one, then delete it"],
    },
    CodeInfo {
        code: Code::JournalTorn,
        severity: Severity::Low,
        recoverable: true,
        cause: "A journal line is incomplete or invalid (a crash mid-append, a bad hand edit).",
        recovery: "The line is skipped and counted; the next append starts on a fresh line.",
        escalation: "Never.",
        suggestions: &["`agent-state check` reports the count per agent"],
    },
    CodeInfo {
        code: Code::PathUnsafe,
        severity: Severity::High,
        recoverable: false,
        cause: "Something below the state root is not what it should be: a symbolic link, a FIFO or device, a directory in the place of a file, or a file in the place of a directory (a mistake, or an inbox-group member trying to redirect the daemon).",
        recovery: "Refused without following or blocking; nothing outside the root is touched. The agent's work that needs the path is deferred; other agents are served.",
        escalation: "On-error hook; human mailbox.",
        suggestions: &[
            "Look at who made it (`ls -la`), move it aside (`mv PATH PATH.suspect`), then `agent-state check --repair`",
        ],
    },
    CodeInfo {
        code: Code::LockBusy,
        severity: Severity::Medium,
        recoverable: true,
        cause: "An agent's `.lock` is held by another process for longer than a state change ever takes (a stuck hook, or anyone who can read the file holding it).",
        recovery: "The daemon never waits on its loop: that agent's work is deferred and retried; every other agent is served.",
        escalation: "On-error hook.",
        suggestions: &["`fuser -v STATE_ROOT/AGENT/.lock` shows the holder; stop it"],
    },
    // System.
    CodeInfo {
        code: Code::DiskLow,
        severity: Severity::Medium,
        recoverable: true,
        cause: "Free space on the state root's file system is below `disk_warn`.",
        recovery: "Warning only; sessions go on.",
        escalation: "On-error hook.",
        suggestions: &["Free space, or grow the file system"],
    },
    CodeInfo {
        code: Code::DiskCritical,
        severity: Severity::High,
        recoverable: true,
        cause: "Free space is below `disk_pause`.",
        recovery: "No new sessions; processed messages and session logs past their retention are pruned; resumes by itself above `disk_pause`.",
        escalation: "Human mailbox and on-error hook.",
        suggestions: &["Free space; lower `processed_retention` / `session_log_retention`"],
    },
    CodeInfo {
        code: Code::DiskFull,
        severity: Severity::Critical,
        recoverable: false,
        cause: "Free space is below `disk_stop`, or a write failed with ENOSPC.",
        recovery: "Running sessions are ended cleanly and nothing is woken; a failed write leaves the old file intact and is retried once after pruning; resumes above `disk_pause`.",
        escalation: "At once: on-error hook (the mailbox may not be writable).",
        suggestions: &["Free space now: `df -h` the state root"],
    },
    CodeInfo {
        code: Code::FsReadonly,
        severity: Severity::Critical,
        recoverable: false,
        cause: "The state root's file system is read-only (EROFS): remounted after I/O errors, or mounted so.",
        recovery: "All writes and wakes stop; the monitor checks again every `health.interval` and resumes when it is writable.",
        escalation: "At once: on-error hook.",
        suggestions: &["Check `dmesg` for the file system's errors, fsck, remount rw"],
    },
    CodeInfo {
        code: Code::IoError,
        severity: Severity::High,
        recoverable: true,
        cause: "Any other I/O failure (EIO, EACCES on a state file, ...).",
        recovery: "EIO is retried once; then the operation fails and is recorded; other agents go on.",
        escalation: "If it persists: on-error hook.",
        suggestions: &[
            "Read the details: they name the operation and the path",
            "Check `dmesg` for EIO",
        ],
    },
    // Configuration and hooks.
    CodeInfo {
        code: Code::ConfigInvalid,
        severity: Severity::High,
        recoverable: false,
        cause: "The config file does not load or validate.",
        recovery: "At start: the daemon refuses to start (exit 78). On reload: refused, the old config stays in force. Every problem is listed with its path.",
        escalation: "User fix.",
        suggestions: &["`agent-state --config FILE check` lists every problem"],
    },
    CodeInfo {
        code: Code::ConfigDefaulted,
        severity: Severity::Low,
        recoverable: true,
        cause: "An optional setting is missing or out of its safe range.",
        recovery: "Its default is used.",
        escalation: "Never (a warning).",
        suggestions: &["Set the value in the config to silence the warning"],
    },
    CodeInfo {
        code: Code::HookFailed,
        severity: Severity::Medium,
        recoverable: true,
        cause: "The on-error hook could not run, exited non-zero, or ran past `hooks.timeout`.",
        recovery: "Logged; never fatal; the hook is not run for its own failure.",
        escalation: "Never.",
        suggestions: &["Run the hook by hand with the AGENT_STATE_ERROR_* variables set"],
    },
    CodeInfo {
        code: Code::EscalationFailed,
        severity: Severity::High,
        recoverable: true,
        cause: "An escalation could not be delivered to the human mailbox.",
        recovery: "Logged with the escalation's text; the on-error hook still runs.",
        escalation: "On-error hook.",
        suggestions: &["Check the human mailbox's inbox directory"],
    },
];

/// Where and to whom an error happened.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorContext {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// 1 for a first attempt, 2 for the first retry, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

/// One occurrence: a line of `.daemon/errors.jsonl`, in seed 002's error
/// format with a timestamp.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRecord {
    pub ts: Timestamp,
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
    pub severity: Severity,
    pub recoverable: bool,
    #[serde(default)]
    pub suggestions: Vec<String>,
    #[serde(default)]
    pub context: ErrorContext,
    /// Sent to the human mailbox.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub escalated: bool,
}

/// The time of a record not stamped yet: [`ErrorRecord::new`] reads no
/// clock; whoever raises it stamps it with the time of its loop turn
/// ([`ErrorRecord::stamp`]), or [`ErrorRecord::at`] sets the time it is
/// about.
pub const UNSTAMPED: Timestamp = Timestamp(chrono::DateTime::UNIX_EPOCH);

impl ErrorRecord {
    /// A record of `code` with the catalogue's severity and suggestions,
    /// its time [`UNSTAMPED`].
    pub fn new(code: Code, message: impl Into<String>) -> ErrorRecord {
        let info = code.info();
        ErrorRecord {
            ts: UNSTAMPED,
            code: code.as_str().to_string(),
            message: message.into(),
            details: None,
            severity: info.severity,
            recoverable: info.recoverable,
            suggestions: info.suggestions.iter().map(|s| s.to_string()).collect(),
            context: ErrorContext::default(),
            escalated: false,
        }
    }

    pub fn at(mut self, ts: Timestamp) -> Self {
        self.ts = ts;
        self
    }

    /// Its time is `now` unless it was given one ([`ErrorRecord::at`]).
    pub fn stamp(&mut self, now: Timestamp) {
        if self.ts == UNSTAMPED {
            self.ts = now;
        }
    }

    pub fn agent(mut self, agent: impl fmt::Display) -> Self {
        self.context.agent = Some(agent.to_string());
        self
    }

    pub fn session(mut self, session: impl Into<String>) -> Self {
        let session = session.into();
        // The catalogue's `sessions/{id}.log` names this session's log.
        for s in &mut self.suggestions {
            *s = s.replace("{id}", &session);
        }
        self.context.session = Some(session);
        self
    }

    pub fn attempt(mut self, attempt: u32) -> Self {
        self.context.attempt = Some(attempt);
        self
    }

    pub fn details(mut self, details: impl Into<String>) -> Self {
        let mut d: String = details.into();
        truncate_on_char(&mut d, MAX_DETAILS);
        self.details = Some(d);
        self
    }

    /// Put `first` first; a catalogue suggestion it makes precise (the same
    /// words before the colon: "Read the session log: …") goes.
    pub fn suggest(mut self, first: impl Into<String>) -> Self {
        let first = first.into();
        if let Some((head, _)) = first.split_once(": ") {
            self.suggestions
                .retain(|s| s.split_once(": ").is_none_or(|(h, _)| h != head));
        }
        self.suggestions.insert(0, first);
        self
    }

    pub fn code(&self) -> Option<Code> {
        Code::parse(&self.code)
    }
}

/// Details are for a journal line and a hook's environment, not an archive.
pub const MAX_DETAILS: usize = 4096;

pub fn truncate_on_char(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
}

/// The catalogue as the Markdown table in `docs/errors.md`.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| Code | Severity | Recoverable | Cause | Recovery | Escalation |\n\
         |------|----------|-------------|-------|----------|------------|\n",
    );
    for i in CATALOGUE {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            i.code,
            i.severity,
            if i.recoverable { "yes" } else { "no" },
            i.cause.replace('|', "\\|"),
            i.recovery.replace('|', "\\|"),
            i.escalation.replace('|', "\\|"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_exactly_one_row() {
        let mut seen = std::collections::BTreeSet::new();
        for row in CATALOGUE {
            assert!(seen.insert(row.code), "{} twice", row.code);
            assert_eq!(Code::parse(row.code.as_str()), Some(row.code));
            assert!(
                !row.suggestions.is_empty(),
                "{} has no suggestion",
                row.code
            );
        }
        // Every variant is in the table (the macro's parse covers them all).
        for text in [
            "AGENT_NOT_FOUND",
            "AGENT_PERMISSION_DENIED",
            "AGENT_SPAWN_FAILED",
            "WORKSPACE_NOT_A_REPO",
            "WORKSPACE_LOCKED",
            "WORKSPACE_FAILED",
            "WORKSPACE_INVALID_COMMITS",
            "MERGE_CONFLICT",
            "MERGE_NOTHING_TO_MERGE",
            "MERGE_NOT_MERGEABLE",
            "MERGE_PROTECTED_BRANCH",
            "PUBLISH_FAILED",
            "SESSION_TIMEOUT",
            "SESSION_FAILED",
            "SESSION_EMPTY_OUTPUT",
            "OUTPUT_TRUNCATED",
            "AGENT_LOGIN_REQUIRED",
            "AGENT_API_ERROR",
            "SESSION_STALLED",
            "SESSION_OOM",
            "SESSION_LOOP",
            "SESSION_INTERRUPTED",
            "SESSION_STOPPED",
            "SESSION_INCOMPLETE",
            "SESSION_SUSPECT",
            "VERIFY_FAILED",
            "SESSION_STUCK",
            "USAGE_LIMIT",
            "USAGE_DISABLED",
            "BUDGET_EXHAUSTED",
            "CREDENTIAL_FAILED",
            "INBOX_REJECTED",
            "STATE_CORRUPT",
            "JOURNAL_TORN",
            "PATH_UNSAFE",
            "LOCK_BUSY",
            "DISK_LOW",
            "DISK_CRITICAL",
            "DISK_FULL",
            "FS_READONLY",
            "IO_ERROR",
            "CONFIG_INVALID",
            "CONFIG_DEFAULTED",
            "HOOK_FAILED",
            "ESCALATION_FAILED",
        ] {
            let code = Code::parse(text).unwrap_or_else(|| panic!("{text} is not a code"));
            let _ = code.info();
        }
        assert_eq!(seen.len(), 45);
    }

    #[test]
    fn docs_table_matches_the_code() {
        let docs =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/errors.md"))
                .expect("docs/errors.md");
        assert!(
            docs.contains(&markdown_table()),
            "docs/errors.md is out of date: regenerate its table with \
             `cargo run -- errors --catalogue` and paste it in"
        );
    }

    #[test]
    fn priority_follows_severity() {
        assert!(Severity::Low < Severity::Medium && Severity::High < Severity::Critical);
        assert_eq!(Severity::Critical.journal_priority(), 2);
        assert_eq!(Severity::Low.journal_priority(), 5);
    }

    #[test]
    fn record_has_the_seed_shape() {
        let r = ErrorRecord::new(Code::AgentSpawnFailed, "Failed to spawn agent rio-003")
            .at(Timestamp::parse("2026-01-25T10:00:00Z").unwrap())
            .details("Process exited with code 1")
            .agent("rio")
            .session("20260125-100000")
            .attempt(2);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["code"], "AGENT_SPAWN_FAILED");
        assert_eq!(v["severity"], "medium");
        assert_eq!(v["recoverable"], true);
        assert_eq!(v["context"]["agent"], "rio");
        assert_eq!(v["context"]["session"], "20260125-100000");
        assert_eq!(v["context"]["attempt"], 2);
        assert!(v["suggestions"].as_array().is_some_and(|s| !s.is_empty()));
        let back: ErrorRecord = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn a_record_is_stamped_once_by_whoever_raises_it() {
        let (then, now) = (
            Timestamp::parse("2026-01-25T10:00:00Z").unwrap(),
            Timestamp::parse("2026-01-25T10:05:00Z").unwrap(),
        );
        let mut fresh = ErrorRecord::new(Code::IoError, "x");
        assert_eq!(fresh.ts, UNSTAMPED, "no clock read");
        fresh.stamp(now);
        assert_eq!(fresh.ts, now);
        let mut dated = ErrorRecord::new(Code::IoError, "x").at(then);
        dated.stamp(now);
        assert_eq!(dated.ts, then, "a record about an earlier time keeps it");
    }

    #[test]
    fn details_are_bounded() {
        let r = ErrorRecord::new(Code::IoError, "x").details("é".repeat(10_000));
        assert!(r.details.unwrap().len() <= MAX_DETAILS + '…'.len_utf8());
    }
}
