//! The daemon's Prometheus metrics: what it counted since it started
//! (`Tally`) and what it knows now (sessions, schedules, backoff, the disk),
//! rendered into the exposition format (`daemon::exposition`) and handed to
//! the listener and the textfile (`daemon::exporter`).
//!
//! Counters are since the daemon started, as Prometheus expects of a
//! process (a restart is a counter reset, which `rate()` handles), except
//! `agent_state_sessions_total`, which is each agent's lifetime count from
//! metrics.json (scripts' sessions included). Names and units follow the
//! Prometheus conventions (`_total`, `_seconds`, `_bytes`, base units).

use super::*;

use crate::daemon::exporter::{self, Board};
use crate::daemon::exposition::{Exposition, Histogram, Kind};
use crate::daemon::health::DiskLevel;

/// Session durations, in seconds: a minute to a day.
const DURATION_BUCKETS: &[f64] = &[
    60.0, 300.0, 600.0, 1800.0, 3600.0, 5400.0, 7200.0, 14_400.0, 43_200.0, 86_400.0,
];

/// Iterations per session (issue 12's loop).
const ITERATION_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0];

/// What the daemon counts as it goes, per agent.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) wakes: BTreeMap<(AgentName, &'static str), u64>,
    pub(super) skips: BTreeMap<(AgentName, String), u64>,
    pub(super) durations: BTreeMap<AgentName, Histogram>,
    /// Iterations per session of agents with `verify`; the most in one
    /// session; verification failures.
    pub(super) iterations: BTreeMap<AgentName, Histogram>,
    pub(super) iterations_max: BTreeMap<AgentName, u32>,
    pub(super) verify_failures: BTreeMap<AgentName, u64>,
    pub(super) tokens: BTreeMap<(AgentName, &'static str), u64>,
    pub(super) cost_usd: BTreeMap<AgentName, f64>,
    pub(super) errors: BTreeMap<(String, String), u64>,
    pub(super) rejected: BTreeMap<AgentName, u64>,
    /// Messages waiting at the last scan.
    pub(super) waiting: BTreeMap<AgentName, usize>,
    /// Messages claimed by each running session.
    pub(super) claimed: BTreeMap<AgentName, usize>,
    /// The end of each agent's last successful session, as far as known.
    pub(super) last_success: BTreeMap<AgentName, Timestamp>,
    /// How late the loop woke for its last deadline.
    pub(super) loop_lag: Duration,
    /// report.json read once per agent for its last success (at the first
    /// render after start or after the agent was added).
    probed: std::collections::BTreeSet<AgentName>,
    /// metrics.json lifetime counters, by the file's mtime.
    lifetime: BTreeMap<AgentName, ((i64, i64), [u64; 4])>,
}

impl Tally {
    /// The lifetime counts of metrics.json in `dir`, read again only when
    /// the file changed.
    fn lifetime_counts(&mut self, dir: &AgentDir) -> Option<[u64; 4]> {
        let agent = &dir.name;
        let path =
            dir.file(<crate::state::metrics::Metrics as crate::state::StateDoc>::KIND.file_name());
        let st = crate::fsx::metadata(&path).ok()??;
        let mtime = (st.st_mtime, st.st_mtime_nsec);
        if let Some((seen, counts)) = self.lifetime.get(agent)
            && *seen == mtime
        {
            return Some(*counts);
        }
        let m: crate::state::metrics::Metrics = dir.read().ok()??;
        let counts = [
            m.lifetime.sessions_completed,
            m.lifetime.sessions_error,
            m.lifetime.sessions_timeout,
            m.lifetime.sessions_usage_limited,
        ];
        self.lifetime.insert(agent.clone(), (mtime, counts));
        Some(counts)
    }

    pub(super) fn session_ended(
        &mut self,
        agent: &AgentName,
        seconds: f64,
        success_at: Option<Timestamp>,
    ) {
        self.durations
            .entry(agent.clone())
            .or_insert_with(|| Histogram::new(DURATION_BUCKETS))
            .observe(seconds);
        if let Some(t) = success_at {
            self.last_success.insert(agent.clone(), t);
        }
    }

    pub(super) fn iterations(&mut self, agent: &AgentName, count: u32, verify_failures: u32) {
        self.iterations
            .entry(agent.clone())
            .or_insert_with(|| Histogram::new(ITERATION_BUCKETS))
            .observe(f64::from(count));
        let max = self.iterations_max.entry(agent.clone()).or_default();
        *max = (*max).max(count);
        *self.verify_failures.entry(agent.clone()).or_default() += u64::from(verify_failures);
    }

    pub(super) fn usage(&mut self, agent: &AgentName, result: &output::ClaudeResult) {
        if let Some(u) = result.usage {
            for (kind, n) in [
                ("input", u.input_tokens),
                ("output", u.output_tokens),
                ("cache_creation", u.cache_creation_input_tokens),
                ("cache_read", u.cache_read_input_tokens),
            ] {
                *self.tokens.entry((agent.clone(), kind)).or_default() += n;
            }
        }
        if let Some(c) = result.total_cost_usd.filter(|c| c.is_finite() && *c >= 0.0) {
            *self.cost_usd.entry(agent.clone()).or_default() += c;
        }
    }
}

/// Where the metrics go while the daemon runs.
pub(super) struct Publishing {
    pub(super) board: Board,
    pub(super) textfile: Option<PathBuf>,
    textfile_failing: bool,
}

impl Publishing {
    pub(super) fn new(textfile: Option<PathBuf>) -> Publishing {
        Publishing {
            board: Board::new(),
            textfile,
            textfile_failing: false,
        }
    }
}

/// What is left of a daily budget, one sample per configured limit.
fn budget_gauges(e: &mut Exposition, scope: &str, left: &crate::usage::Left) {
    for (limit, value) in [
        ("sessions", left.sessions.map(|n| n as f64)),
        ("runtime_seconds", left.runtime_seconds.map(|n| n as f64)),
        ("tokens", left.tokens.map(|n| n as f64)),
        ("cost_usd", left.cost_usd),
    ] {
        if let Some(v) = value {
            e.gauge(
                "agent_state_budget_remaining",
                "What is left today of a daily budget, by scope (an agent, or fleet) and limit.",
                vec![("scope", scope.to_string()), ("limit", limit.to_string())],
                v,
            );
        }
    }
}

fn agent_label(agent: &AgentName) -> Vec<(&'static str, String)> {
    vec![("agent", agent.to_string())]
}

fn seconds(t: &Timestamp) -> f64 {
    t.0.timestamp_millis() as f64 / 1000.0
}

impl Daemon {
    /// Render the metrics and publish them (listener and textfile).
    pub(super) fn publish_metrics(&mut self) {
        let Some(publishing) = self.metrics_out.as_ref() else {
            return;
        };
        let textfile = publishing.textfile.clone();
        let text = Rendering {
            tally: &mut self.tally,
            economy: &mut self.economy,
            core: &self.core,
            running: &self.running,
            streaks: &self.streaks,
            monitor: &self.monitor,
            root: &self.root,
            config: &self.config,
            agent_index: &self.agent_index,
            started_at: self.started_at,
            now: self.clock.now(),
            fleet: self.remote.as_ref().and_then(|r| r.fleet()),
        }
        .render();
        let publishing = self.metrics_out.as_mut().expect("checked above");
        publishing.board.publish(text.clone());
        if let Some(path) = textfile {
            match exporter::write_textfile(&path, &text) {
                Ok(()) => {
                    if std::mem::take(&mut publishing.textfile_failing) {
                        tracing::info!("metrics textfile {} is written again", path.display());
                    }
                }
                Err(e) => {
                    if !std::mem::replace(&mut publishing.textfile_failing, true) {
                        tracing::warn!(
                            "cannot write the metrics textfile {} (said once until it works again): {e}; check [metrics] textfile and that the directory is writable by the service user",
                            path.display()
                        );
                    }
                }
            }
        }
    }
}

/// What the metrics are rendered from, borrowed from the loop: the
/// caches of the tally (lifetime counts) and of the economy (today's use)
/// are refreshed as they are read.
pub(super) struct Rendering<'a> {
    pub(super) tally: &'a mut Tally,
    pub(super) economy: &'a mut super::economy::Economy,
    pub(super) core: &'a Core,
    pub(super) running: &'a BTreeMap<AgentName, Running>,
    pub(super) streaks: &'a BTreeMap<AgentName, Streak>,
    pub(super) monitor: &'a super::monitor::Monitor,
    pub(super) root: &'a StateRoot,
    pub(super) config: &'a Config,
    pub(super) agent_index: &'a std::collections::HashMap<AgentName, usize>,
    pub(super) started_at: Timestamp,
    pub(super) now: DateTime<Utc>,
    /// The worker registry (cluster mode: `[cluster] local_sessions = false`).
    pub(super) fleet: Option<crate::daemon::fleet::Fleet>,
}

impl Rendering<'_> {
    /// The metrics in Prometheus' text format.
    fn render(self) -> String {
        let mut e = Exposition::new();
        let now = self.now;
        e.gauge(
            "agent_state_build_info",
            "The running agent-state's version (always 1).",
            vec![("version", env!("CARGO_PKG_VERSION").to_string())],
            1.0,
        );
        e.gauge(
            "agent_state_start_time_seconds",
            "When the daemon started (Unix time).",
            vec![],
            seconds(&self.started_at),
        );
        e.gauge(
            "agent_state_agents",
            "Agents configured (human mailboxes excluded).",
            vec![],
            self.core.len() as f64,
        );
        e.gauge(
            "agent_state_sessions_running",
            "Sessions running now.",
            vec![],
            self.running.len() as f64,
        );
        e.gauge(
            "agent_state_loop_lag_seconds",
            "How late the daemon's loop woke for its last deadline.",
            vec![],
            self.tally.loop_lag.as_secs_f64(),
        );
        if let Some(h) = &self.monitor.health {
            e.gauge(
                "agent_state_disk_free_bytes",
                "Free space on the state root's file system.",
                vec![],
                h.free as f64,
            );
            for (state, level) in [
                ("ok", DiskLevel::Ok),
                ("low", DiskLevel::Low),
                ("paused", DiskLevel::Paused),
                ("stopped", DiskLevel::Stopped),
            ] {
                e.gauge(
                    "agent_state_disk_state",
                    "The health monitor's disk state (1 for the current one).",
                    vec![("state", state.to_string())],
                    f64::from(u8::from(h.level == level)),
                );
            }
        }
        // Every family is declared even while it has no sample, so a
        // dashboard or an alert rule can rely on its name.
        for (name, help) in [
            (
                "agent_state_credential_held",
                "1 while a credential's agents are held (a usage limit, an admin's cap, a failed login check).",
            ),
            (
                "agent_state_credential_hold_until_timestamp_seconds",
                "When a credential's hold ends by itself (a usage limit's reset plus jitter, or the probe's time).",
            ),
            (
                "agent_state_budget_remaining",
                "What is left today of a daily budget, by scope (an agent, or fleet) and limit.",
            ),
            (
                "agent_state_next_wake_timestamp_seconds",
                "The agent's next scheduled wake (Unix time).",
            ),
            (
                "agent_state_last_success_timestamp_seconds",
                "When the agent's last successful session ended (Unix time; known from the daemon's sessions and report.json).",
            ),
            (
                "agent_state_inbox_waiting_messages",
                "Valid messages waiting in the agent's inbox at the last scan.",
            ),
        ] {
            e.declare(name, help, Kind::Gauge);
        }
        for (group, hold) in &self.economy.holds.groups {
            let cause = match hold.cause {
                crate::daemon::economy::Cause::UsageLimit => "usage_limit",
                crate::daemon::economy::Cause::Disabled => "disabled",
                crate::daemon::economy::Cause::Credential => "credential",
            };
            e.gauge(
                "agent_state_credential_held",
                "1 while a credential's agents are held (a usage limit, an admin's cap, a failed login check).",
                vec![("credential", group.clone()), ("cause", cause.to_string())],
                1.0,
            );
            if let Some(t) = &hold.until {
                e.gauge(
                    "agent_state_credential_hold_until_timestamp_seconds",
                    "When a credential's hold ends by itself (a usage limit's reset plus jitter, or the probe's time).",
                    vec![("credential", group.clone())],
                    seconds(t),
                );
            }
        }
        e.declare(
            "agent_state_errors_total",
            "Errors raised, by catalogue code and severity (docs/errors.md).",
            Kind::Counter,
        );
        for ((code, severity), n) in &self.tally.errors {
            e.counter(
                "agent_state_errors_total",
                "",
                vec![("code", code.clone()), ("severity", severity.clone())],
                *n as f64,
            );
        }

        let agents: Vec<AgentName> = self.core.names().cloned().collect();
        for agent in &agents {
            if self.tally.probed.insert(agent.clone())
                && !self.tally.last_success.contains_key(agent)
                && let Ok(Some(report)) = self.root.agent(agent).read::<Report>()
                && let Some(last) = report.last_session
                && last.outcome == Some(crate::state::session::SessionStatus::Completed)
                && let Some(t) = last.ended_at
            {
                self.tally.last_success.insert(agent.clone(), t);
            }
            if let Some([completed, error, timeout, usage_limit]) =
                self.tally.lifetime_counts(&self.root.agent(agent))
            {
                for (outcome, n) in [
                    ("completed", completed),
                    ("error", error),
                    ("timeout", timeout),
                    ("usage_limit", usage_limit),
                ] {
                    e.counter(
                        "agent_state_sessions_total",
                        "Sessions ended, by agent and outcome (metrics.json's lifetime counts: scripts' sessions included).",
                        vec![("agent", agent.to_string()), ("outcome", outcome.to_string())],
                        n as f64,
                    );
                }
            }
        }
        for agent in &agents {
            let Some(slot) = self.core.slot(agent) else {
                continue;
            };
            e.gauge(
                "agent_state_session_running",
                "1 while the agent has a session running.",
                agent_label(agent),
                f64::from(u8::from(self.running.contains_key(agent))),
            );
            e.gauge(
                "agent_state_agent_disabled",
                "1 while the agent gets no automatic wakes (a failure that needs a human).",
                agent_label(agent),
                f64::from(u8::from(slot.disabled.is_some())),
            );
            e.gauge(
                "agent_state_backoff_until_timestamp_seconds",
                "Until when automatic wakes are held back after failures (0: not backing off).",
                agent_label(agent),
                slot.backoff_until
                    .filter(|t| *t > now)
                    .map_or(0.0, |t| t.timestamp_millis() as f64 / 1000.0),
            );
            e.gauge(
                "agent_state_failures_in_a_row",
                "Failed sessions in a row.",
                agent_label(agent),
                self.streaks
                    .get(agent)
                    .map_or(0.0, |s| f64::from(s.failures)),
            );
            if let Some(next) = slot.next_fire {
                e.gauge(
                    "agent_state_next_wake_timestamp_seconds",
                    "The agent's next scheduled wake (Unix time).",
                    agent_label(agent),
                    next.timestamp_millis() as f64 / 1000.0,
                );
            }
            e.gauge(
                "agent_state_inbox_claimed_messages",
                "Messages claimed by the agent's running session (0 when none runs).",
                agent_label(agent),
                if self.running.contains_key(agent) {
                    self.tally.claimed.get(agent).copied().unwrap_or(0) as f64
                } else {
                    0.0
                },
            );
            if let Some(n) = self.tally.waiting.get(agent) {
                e.gauge(
                    "agent_state_inbox_waiting_messages",
                    "Valid messages waiting in the agent's inbox at the last scan.",
                    agent_label(agent),
                    *n as f64,
                );
            }
            if let Some(t) = self.tally.last_success.get(agent) {
                e.gauge(
                    "agent_state_last_success_timestamp_seconds",
                    "When the agent's last successful session ended (Unix time; known from the daemon's sessions and report.json).",
                    agent_label(agent),
                    seconds(t),
                );
            }
        }
        let mut fleet_used = crate::usage::DayUse::default();
        let fleet = self.config.budget.limits;
        for agent in &agents {
            let Some(budget) =
                agent_in(self.config, self.agent_index, agent).map(|c| c.session.budget)
            else {
                continue;
            };
            if budget.is_unlimited() && fleet.is_unlimited() {
                continue;
            }
            let used = self.economy.used_today(
                &self.root.agent(agent),
                self.config.budget.timezone,
                self.now,
            );
            fleet_used.add(&used);
            if !budget.is_unlimited() {
                budget_gauges(&mut e, agent.as_str(), &budget.left(&used));
            }
        }
        if !fleet.is_unlimited() {
            budget_gauges(&mut e, "fleet", &fleet.left(&fleet_used));
        }
        e.declare(
            "agent_state_inbox_rejected_total",
            "Inbox files rejected (moved to inbox/rejected/).",
            Kind::Counter,
        );
        for (agent, n) in &self.tally.rejected {
            e.counter(
                "agent_state_inbox_rejected_total",
                "",
                agent_label(agent),
                *n as f64,
            );
        }
        e.declare(
            "agent_state_wakes_total",
            "Sessions the daemon started, by agent and reason.",
            Kind::Counter,
        );
        for ((agent, reason), n) in &self.tally.wakes {
            e.counter(
                "agent_state_wakes_total",
                "",
                vec![("agent", agent.to_string()), ("reason", reason.to_string())],
                *n as f64,
            );
        }
        e.declare(
            "agent_state_wakes_skipped_total",
            "Wakes not started, by agent and cause.",
            Kind::Counter,
        );
        for ((agent, cause), n) in &self.tally.skips {
            e.counter(
                "agent_state_wakes_skipped_total",
                "",
                vec![("agent", agent.to_string()), ("cause", cause.clone())],
                *n as f64,
            );
        }
        e.declare(
            "agent_state_session_duration_seconds",
            "How long the daemon's sessions ran.",
            Kind::Histogram,
        );
        for (agent, h) in &self.tally.durations {
            e.histogram(
                "agent_state_session_duration_seconds",
                "",
                agent_label(agent),
                h.clone(),
            );
        }
        e.declare(
            "agent_state_session_iterations",
            "Iterations per session of agents with verify (sum/count is the average).",
            Kind::Histogram,
        );
        for (agent, h) in &self.tally.iterations {
            e.histogram(
                "agent_state_session_iterations",
                "",
                agent_label(agent),
                h.clone(),
            );
        }
        e.declare(
            "agent_state_session_iterations_max",
            "The most iterations one session of the agent took.",
            Kind::Gauge,
        );
        for (agent, n) in &self.tally.iterations_max {
            e.gauge(
                "agent_state_session_iterations_max",
                "",
                agent_label(agent),
                f64::from(*n),
            );
        }
        e.declare(
            "agent_state_verify_failures_total",
            "Verification runs that failed (each started another iteration or ended the loop).",
            Kind::Counter,
        );
        for (agent, n) in &self.tally.verify_failures {
            e.counter(
                "agent_state_verify_failures_total",
                "",
                agent_label(agent),
                *n as f64,
            );
        }
        e.declare(
            "agent_state_tokens_total",
            "Tokens the daemon's sessions used (Claude Code's result), by agent and kind.",
            Kind::Counter,
        );
        for ((agent, kind), n) in &self.tally.tokens {
            e.counter(
                "agent_state_tokens_total",
                "",
                vec![("agent", agent.to_string()), ("kind", kind.to_string())],
                *n as f64,
            );
        }
        e.declare(
            "agent_state_cost_usd_total",
            "What the daemon's sessions reported they cost (for a subscription login, what the API would charge).",
            Kind::Counter,
        );
        for (agent, c) in &self.tally.cost_usd {
            e.counter("agent_state_cost_usd_total", "", agent_label(agent), *c);
        }
        crate::daemon::fleet::render(&mut e, self.fleet.as_ref());
        e.render()
    }
}
