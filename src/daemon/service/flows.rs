//! The daemon as the flows' router (`crate::flow`): when a session that
//! claimed a flow's hand-off ends well, its answer is kept (durably, before
//! the session's end acknowledges the message), then applied off the loop;
//! at start-up every flow's leftover answers and outbox are applied.
//! A session that did not end well answers nothing: its messages go back to
//! the inbox and the role's next session gets the hand-off again.

use super::*;

/// Apply the flows' answers off the loop (git and files), one task per
/// flow; the flow's lock orders them with the CLI's commands.
pub(super) fn apply_flows(
    root: &StateRoot,
    config: &Config,
    now: DateTime<Utc>,
    names: &[AgentName],
    tx: &mpsc::UnboundedSender<Event>,
) {
    for name in names {
        let Some(settings) = config.flows.iter().find(|f| &f.name == name).cloned() else {
            continue;
        };
        let root = root.clone();
        let config = config.clone();
        let now = Timestamp::from_datetime(now);
        let tx = tx.clone();
        tokio::task::spawn_blocking(move || {
            match crate::flow::apply_answers(&root, &config, &settings, now) {
                Ok(applied) => {
                    for line in applied.lines {
                        tracing::info!(flow = %settings.name, "{line}");
                    }
                    // A publish that failed: raised on the loop.
                    if !applied.errors.is_empty() {
                        let _ = tx.send(Event::Raise(applied.errors));
                    }
                }
                Err(e) => tracing::warn!(flow = %settings.name, "flow {}: {e}", settings.name),
            }
        });
    }
}

/// Keep the answers of a session that ended well to the flows' hand-offs
/// it claimed; returns the flows to apply, and the errors to raise.
pub(super) fn keep_flow_answers(
    root: &StateRoot,
    config: &Config,
    agent: &AgentName,
    running: &Running,
    output: &OutputSummary,
    workspace: Option<&workspaces::Outcome>,
    now: Timestamp,
) -> (Vec<AgentName>, Vec<ErrorRecord>) {
    let mut flows = Vec::new();
    let mut errors = Vec::new();
    for m in &running.claimed {
        let Some((flow, cycle, step)) = m
            .source_ref
            .as_deref()
            .and_then(crate::flow::parse_source_ref)
        else {
            continue;
        };
        let Some(settings) = config.flows.iter().find(|f| f.name.as_str() == flow) else {
            tracing::warn!(agent = %agent, "a hand-off of flow {flow:?}, which is not configured, was claimed; ignored");
            continue;
        };
        let answer = crate::flow::Answer {
            flow: flow.clone(),
            cycle,
            step,
            message_id: m.id.clone(),
            agent: agent.to_string(),
            session_id: running.session_id.clone(),
            text: output.answer_text(),
            workspace: workspace.map(|w| crate::flow::AnswerWorkspace {
                path: w.path.display().to_string(),
                branch: w.branch.clone(),
                base_commit: w.base_commit.clone(),
            }),
            ended_at: now,
        };
        match crate::flow::record_answer(root, &answer) {
            Ok(_) => {
                if !flows.contains(&settings.name) {
                    flows.push(settings.name.clone());
                }
            }
            Err(e) => errors.push(
                ErrorRecord::new(
                    e.code(),
                    format!(
                        "flow {flow}: cannot keep the answer of {agent}'s session {}",
                        running.session_id
                    ),
                )
                .details(e.to_string())
                .agent(agent)
                .session(&running.session_id),
            ),
        }
    }
    (flows, errors)
}

impl super::intake::Intake {
    /// Humans' replies to a flow's messages, found in `agent`'s inbox: each
    /// handed once to the router, which carries out "approve", "reject …"
    /// or "stop" and moves the reply to `processed/` (or leaves it for the
    /// agent if it says none of them).
    pub(super) fn route_flow_replies(
        &mut self,
        root: &StateRoot,
        config: &Config,
        now: DateTime<Utc>,
        agent: &AgentName,
        replies: &[(String, inbox::Message)],
    ) {
        for (name, message) in replies {
            if self.flow_replies.contains(&message.id) {
                continue;
            }
            let Some(settings) = config.flows.iter().find(|f| {
                message
                    .source_ref
                    .as_deref()
                    .is_some_and(|r| crate::flow::cycle_of_message(f.name.as_str(), r).is_some())
            }) else {
                continue;
            };
            self.flow_replies.insert(message.id.clone());
            let (root, settings, agent) = (root.clone(), settings.clone(), agent.clone());
            let (name, message) = (name.clone(), message.clone());
            let now = Timestamp::from_datetime(now);
            tokio::task::spawn_blocking(move || {
                match crate::flow::reply(&root, &settings, &agent, &name, &message, now) {
                    Ok(Some(applied)) if applied.refused => {
                        for line in applied.lines {
                            tracing::warn!(flow = %settings.name, "{line}");
                        }
                    }
                    Ok(Some(applied)) => {
                        for line in applied.lines {
                            tracing::info!(flow = %settings.name, "{line}");
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(flow = %settings.name, "flow {}: a reply in {agent}'s inbox: {e}", settings.name)
                    }
                }
            });
        }
    }
}
