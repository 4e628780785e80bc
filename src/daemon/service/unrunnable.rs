//! Agents whose command cannot be executed: checked before each claim
//! (`runnable::probe`), refused without claiming anything, held (disabled)
//! until the command can run, and checked again at every health check and
//! at a reload. The decisions are `runnable`'s; this carries them out.

use super::*;
use crate::daemon::runnable::{self, Asker, BeforeClaim, Probe, Recheck};
use crate::state::journal::SkipCause;

impl Daemon {
    /// Before `agent`'s session claims anything: whether its command can
    /// run. If it cannot, nothing is claimed and nothing starts; the slot is
    /// freed, the agent held, and the error recorded (once per hold, and at
    /// every `agent-state wake`). Returns whether the start was refused.
    pub(super) fn refuse_unrunnable(
        &mut self,
        agent: &AgentName,
        cfg: &AgentConfig,
        reason: WakeReason,
    ) -> bool {
        let probe = probe_command(&self.config, &self.root, cfg);
        let asker = match reason {
            WakeReason::Manual => Asker::Operator,
            _ => Asker::Automatic,
        };
        match runnable::before_claim(&probe, self.unrunnable.get(agent), asker) {
            BeforeClaim::Start => {
                if self.unrunnable.remove(agent).is_some() {
                    tracing::info!(agent = %agent, "its command can run again");
                }
                false
            }
            BeforeClaim::Refuse { record } => {
                self.core
                    .session_ended(agent, InboxSummary::default(), self.clock.now());
                self.hold_unrunnable(agent, cfg, probe, Some(reason), record);
                true
            }
        }
    }

    /// Hold `agent` (disabled) for `probe`'s failure; `record`: raise the
    /// error (report.json first, then errors.jsonl and its escalation) and
    /// journal the refused `wake`, if one was refused (last: whoever reads
    /// that line finds the rest written).
    fn hold_unrunnable(
        &mut self,
        agent: &AgentName,
        cfg: &AgentConfig,
        probe: Probe,
        wake: Option<WakeReason>,
        record: bool,
    ) {
        let Some((code, what)) = probe.failure() else {
            return;
        };
        let why = format!(
            "{what}; nothing claimed: its messages wait in the inbox until the command can run \
             (checked again every {}, at a reload and at `agent-state wake {agent}`)",
            humantime::format_duration(self.config.health.interval)
        );
        if record {
            let ending = Ending::SpawnFailed {
                reason: why.clone(),
                kind: match probe.ending() {
                    Some(Ending::SpawnFailed { kind, .. }) => kind,
                    _ => runner::SpawnFailure::NotFound,
                },
            };
            let verdict = ending::judge_not_run(
                &mut self.streaks,
                agent,
                cfg,
                &ending,
                &OutputSummary::none(),
                Some(code),
                self.clock.now(),
            );
            let report = RunReport::not_run(ending.clone());
            self.apply_verdict(agent, cfg, None, verdict, &report);
        }
        // Held whatever the verdict's shape: no wake spends its messages.
        if let Some(mut slot) = self.core.slot_mut(agent) {
            slot.disabled = Some(why.clone());
            slot.backoff_until = None;
        }
        self.unrunnable.insert(agent.clone(), probe);
        if let (true, Some(reason)) = (record, wake) {
            publish::journal(
                &self.root,
                agent,
                journal::Event::WakeSkipped(WakeSkipped {
                    reason: reason.as_str().to_string(),
                    running_session: String::new(),
                    cause: Some(if code == Code::AgentPermissionDenied {
                        SkipCause::AgentPermissionDenied
                    } else {
                        SkipCause::AgentNotFound
                    }),
                    detail: Some(what),
                    until: None,
                }),
            );
        }
    }

    /// Probe every held agent's command again (the health check, a
    /// reload): release those that can run now (their waiting messages
    /// wake them), record a failure that changed.
    pub(super) fn recheck_unrunnable(&mut self) {
        let held: Vec<(AgentName, Probe)> = self
            .unrunnable
            .iter()
            .map(|(a, p)| (a.clone(), p.clone()))
            .collect();
        for (agent, was) in held {
            let Some(cfg) = self.agent_config(&agent).cloned() else {
                self.unrunnable.remove(&agent);
                continue;
            };
            if self.running.contains_key(&agent) {
                continue;
            }
            let now = probe_command(&self.config, &self.root, &cfg);
            match runnable::recheck(&was, &now) {
                Recheck::Keep => {
                    // Held still (a reload clears holds; this one stays).
                    if let (Some((_, what)), Some(mut slot)) =
                        (now.failure(), self.core.slot_mut(&agent))
                        && slot.disabled.is_none()
                    {
                        slot.disabled = Some(what);
                    }
                }
                Recheck::Record => {
                    self.hold_unrunnable(&agent, &cfg, now, None, true);
                }
                Recheck::Release => {
                    self.unrunnable.remove(&agent);
                    if let Some(mut slot) = self.core.slot_mut(&agent) {
                        slot.disabled = None;
                        slot.backoff_until = None;
                    }
                    tracing::info!(agent = %agent, "its command can run now: no longer held; its waiting messages wake it");
                    self.published.publish_agent(
                        &self.root,
                        &self.core,
                        self.clock.now(),
                        &agent,
                        None,
                    );
                    self.scan_inbox(&agent);
                }
            }
        }
    }
}

/// What `agent`'s command is now, resolved as its session's spawn will.
fn probe_command(config: &Config, root: &StateRoot, cfg: &AgentConfig) -> Probe {
    // Sessions on workers (`local_sessions = false`): the command is the
    // workers' to find, not this host's; a worker that cannot run it ends
    // the order "not started", naming why.
    if config.cluster.as_ref().is_some_and(|c| !c.local_sessions) {
        return Probe::Unknown;
    }
    let Some(program) = session::program(config, cfg) else {
        return Probe::Unknown;
    };
    // With a workspace, the command runs in a worktree made after the
    // claim: a lookup relative to it is left to the spawn.
    let dir = root.agent(&cfg.name);
    let cwd = cfg
        .session
        .workspace
        .is_none()
        .then_some(dir.path.as_path());
    runnable::probe(&program, cwd, std::env::var_os("PATH").as_deref())
}

/// The spawn of a session that claimed its messages found no command
/// that can be executed (it vanished after the check, or the check
/// could not see why): the session's end returns its messages without
/// counting an attempt and its verdict holds the agent; this keeps what
/// the command is now, so the health check releases the hold once it
/// changes.
pub(super) fn note_unrunnable_spawn(
    config: &Config,
    root: &StateRoot,
    unrunnable: &mut BTreeMap<AgentName, Probe>,
    agent: &AgentName,
    cfg: &AgentConfig,
) {
    let probe = probe_command(config, root, cfg);
    unrunnable.insert(agent.clone(), probe);
}
