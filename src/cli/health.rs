//! `agent-state health`: one line and an exit status for monitoring systems
//! (Nagios, Icinga, Zabbix, a cron mail): 0 ok, 1 warning, 2 critical,
//! 3 unknown (the state could not be read), by the plugin convention.
//!
//! Read-only and cheap: daemon.json (the heartbeat the daemon rewrites at
//! least every five minutes), the root lock, and for each scheduled agent the
//! end of its journal. The judgement is [`assess`], a pure function of what
//! was read and `now`.

use std::ops::ControlFlow;
use std::time::Duration;

use serde::Serialize;

use crate::access;
use crate::cli::display::{self, Style};
use crate::cli::{Context, print_json};
use crate::clock::{Timestamp, ago};
use crate::daemon::files::{self, Heartbeat};
use crate::daemon::health::DiskLevel;
use crate::error::Result;
use crate::state::journal::{self, Event};

/// The daemon rewrites daemon.json at every change and at least every five
/// minutes (its reconcile pass): older than this, it is not looking.
const DEFAULT_MAX_AGE: &str = "15m";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A heartbeat (daemon.json) older than this is critical
    #[arg(long, value_name = "DUR", default_value = DEFAULT_MAX_AGE, value_parser = crate::clock::parse_duration)]
    pub max_age: Duration,
    /// A scheduled agent with no successful session for this long is a
    /// warning ("off" to skip; default: [health] success_within)
    #[arg(long, value_name = "DUR|off")]
    pub success_within: Option<String>,
    /// Print the findings as JSON (the exit status is the same)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warning,
    Critical,
    Unknown,
}

impl Level {
    fn exit_code(self) -> u8 {
        match self {
            Level::Ok => 0,
            Level::Warning => 1,
            Level::Critical => 2,
            Level::Unknown => 3,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Level::Ok => "OK",
            Level::Warning => "WARNING",
            Level::Critical => "CRITICAL",
            Level::Unknown => "UNKNOWN",
        }
    }
}

/// What [`assess`] judges.
#[derive(Debug, Default)]
pub struct Seen {
    /// daemon.json, if there is one; `Err` if it could not be read.
    pub heartbeat: Option<std::result::Result<Heartbeat, crate::error::Error>>,
    /// Whether the daemon's root lock is held (`None`: not knowable here).
    pub lock_held: Option<bool>,
    /// Whether the heartbeat's pid is alive (`None`: not knowable).
    pub pid_alive: Option<bool>,
    /// Scheduled agents, as their journals tell.
    pub agents: Vec<AgentSeen>,
    /// How many agents (not human mailboxes) the config names, and the
    /// file (`None`: not looked at).
    pub configured: Option<(usize, String)>,
    /// Agents still hatching (no identity.md) after this many completed
    /// sessions, at least [`crate::state::report::HATCH_LIMIT`].
    pub hatching: Vec<(String, u64)>,
}

#[derive(Debug)]
pub struct AgentSeen {
    pub agent: String,
    /// The end of its last successful session within the window.
    pub last_success: Option<Timestamp>,
    /// Its journal could be read.
    pub readable: bool,
    /// Its journal is younger than the window: a new agent is not judged.
    pub young: bool,
}

#[derive(Debug, Serialize)]
pub struct Finding {
    pub level: Level,
    pub what: String,
}

#[derive(Debug, Serialize)]
pub struct Assessment {
    pub level: Level,
    pub findings: Vec<Finding>,
    /// What is fine, for the OK line.
    pub summary: String,
}

/// Judge what was seen (pure).
pub fn assess(
    seen: &Seen,
    now: Timestamp,
    max_age: Duration,
    success_within: Option<Duration>,
) -> Assessment {
    let mut findings = Vec::new();
    let mut add = |level: Level, what: String| findings.push(Finding { level, what });
    let mut summary = String::new();
    match &seen.heartbeat {
        None => add(
            Level::Critical,
            match seen.lock_held {
                Some(true) => "a daemon holds the state root's lock but has written no daemon.json (starting?)".into(),
                _ => "no daemon is running (no daemon.json): systemctl status agent-state".into(),
            },
        ),
        Some(Err(e)) => add(Level::Unknown, format!("cannot read daemon.json: {e}")),
        Some(Ok(hb)) => {
            let age = Duration::from_secs(now.seconds_since(&hb.updated_at).max(0) as u64);
            if seen.pid_alive == Some(false) || seen.lock_held == Some(false) {
                add(
                    Level::Critical,
                    format!(
                        "the daemon (pid {}) is not running; its last heartbeat was {}: systemctl status agent-state",
                        hb.pid,
                        ago(&hb.updated_at, &now)
                    ),
                );
            } else if age > max_age {
                add(
                    Level::Critical,
                    format!(
                        "the daemon (pid {}) last wrote its heartbeat {} (more than {} ago): stuck? journalctl -u agent-state",
                        hb.pid,
                        ago(&hb.updated_at, &now),
                        crate::clock::length(max_age)
                    ),
                );
            }
            if hb.stopping {
                add(Level::Warning, "the daemon is stopping".into());
            }
            if let Some(h) = &hb.health {
                let free = bytes(h.free);
                match h.level {
                    DiskLevel::Ok => {}
                    DiskLevel::Low => add(Level::Warning, format!("disk low: {free} free")),
                    DiskLevel::Paused => add(
                        Level::Critical,
                        format!("disk nearly full ({free} free): no new sessions start"),
                    ),
                    DiskLevel::Stopped => add(
                        Level::Critical,
                        if h.read_only {
                            "the state root's file system is read-only: sessions stopped".into()
                        } else {
                            format!("disk full ({free} free): sessions stopped")
                        },
                    ),
                }
            }
            if let Some(why) = &hb.paused {
                add(Level::Warning, format!("waking is paused: {why}"));
            }
            for (credential, held) in &hb.held {
                let level = if held.cause == files::HeldCause::Known(crate::daemon::economy::Cause::UsageLimit) {
                    Level::Warning
                } else {
                    Level::Critical
                };
                add(level, format!("credential {credential}: {}", held.reason));
            }
            for (agent, why) in &hb.failing {
                let level = if files::failing_disabled(why) {
                    Level::Critical
                } else {
                    Level::Warning
                };
                add(level, format!("{agent}: {why}"));
            }
            summary = format!(
                "daemon {} (pid {}) started {}, {} agents, {} running, heartbeat {}",
                hb.version,
                hb.pid,
                ago(&hb.started_at, &now),
                hb.agents.len(),
                hb.running.len(),
                ago(&hb.updated_at, &now)
            );
        }
    }
    // A daemon with nothing to wake is up, and useless: monitoring says so.
    if let Some((0, config)) = &seen.configured {
        add(
            Level::Critical,
            format!(
                "no agents are configured in {config}: nothing is woken; add [[agent]] entries (agent-state.toml(5)), then agent-state reload"
            ),
        );
    }
    for (agent, completed) in &seen.hatching {
        add(
            Level::Warning,
            format!(
                "{agent}: still hatching after {completed} completed sessions: no identity.md yet (its birth prompt asks for one)"
            ),
        );
    }
    if let Some(within) = success_within {
        for a in &seen.agents {
            let agent = &a.agent;
            if !a.readable {
                add(Level::Unknown, format!("{agent}: cannot read its journal"));
            } else if a.last_success.is_none() && !a.young {
                add(
                    Level::Warning,
                    format!(
                        "{agent}: no successful session in the last {}",
                        crate::clock::length(within)
                    ),
                );
            }
        }
    }
    let level = findings.iter().map(|f| f.level).max().unwrap_or(Level::Ok);
    Assessment {
        level,
        findings,
        summary,
    }
}

impl Assessment {
    /// The one line: the level, the findings worst first, or the summary.
    pub fn line(&self) -> String {
        format!("{}: {}", self.level.word(), self.what())
    }

    /// The line after its level word.
    fn what(&self) -> String {
        if self.findings.is_empty() {
            return self.summary.clone();
        }
        let mut sorted: Vec<&Finding> = self.findings.iter().collect();
        sorted.sort_by_key(|f| std::cmp::Reverse(f.level));
        let what: Vec<&str> = sorted.iter().map(|f| f.what.as_str()).collect();
        what.join("; ")
    }

    /// [`Assessment::line`] for a person: cleaned (the findings quote the
    /// daemon's records), the level word coloured, never cut.
    fn shown(&self) -> display::Line {
        let style = match self.level {
            Level::Ok => Style::Good,
            Level::Warning => Style::Warn,
            Level::Critical | Level::Unknown => Style::Bad,
        };
        display::Line::new()
            .styled(style, self.level.word())
            .text(": ")
            .text(self.what())
    }
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let success_within =
        match args.success_within.as_deref() {
            None => ctx.config.health.success_within,
            Some("off" | "none") => None,
            Some(text) => Some(crate::clock::parse_duration(text).map_err(|e| {
                crate::error::Error::Usage(format!("--success-within: {e}, or off"))
            })?),
        };
    let mut seen = Seen {
        heartbeat: match files::read_heartbeat(&ctx.root) {
            Ok(Some(hb)) => Some(Ok(hb)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        },
        lock_held: files::daemon_lock_state(&ctx.root),
        configured: Some((
            ctx.config.working_agents().count(),
            ctx.config.source.display().to_string(),
        )),
        ..Seen::default()
    };
    if let Some(Ok(hb)) = &seen.heartbeat {
        seen.pid_alive = pid_alive(hb.pid);
    }
    // Agents asked to write who they are (a birth prompt) and still not.
    for agent in ctx
        .config
        .working_agents()
        .filter(|a| !a.session.birth_prompt.trim().is_empty())
    {
        let dir = ctx.root.agent(&agent.name);
        if crate::state::report::Lifecycle::at_rest(&dir)
            != crate::state::report::Lifecycle::Hatching
        {
            continue;
        }
        let completed = dir
            .read::<crate::state::metrics::Metrics>()
            .ok()
            .flatten()
            .map_or(0, |m| m.lifetime.sessions_completed);
        if completed >= crate::state::report::HATCH_LIMIT {
            seen.hatching.push((agent.name.to_string(), completed));
        }
    }
    if let Some(within) = success_within {
        let since = ctx.now.minus(within);
        for agent in ctx.config.working_agents().filter(|a| a.schedule.is_some()) {
            let dir = ctx.root.agent(&agent.name);
            let mut last = None;
            let mut young = true;
            let read = journal::scan_backwards(&dir.store, &dir.journal(), |entry| {
                if entry.ts < since {
                    young = false;
                    return ControlFlow::Break(());
                }
                if let Event::SessionEnd(end) = &entry.event
                    && end.outcome == crate::state::session::SessionStatus::Completed
                {
                    last = Some(entry.ts);
                    return ControlFlow::Break(());
                }
                ControlFlow::Continue(())
            });
            let readable = match read {
                Ok(()) => true,
                Err(e) => !access::is_denied(&e) && !dir.journal().exists(),
            };
            seen.agents.push(AgentSeen {
                agent: agent.name.to_string(),
                last_success: last,
                readable,
                young: young && last.is_none(),
            });
        }
    }
    let verdict = assess(&seen, ctx.now, args.max_age, success_within);
    if args.json {
        #[derive(Serialize)]
        struct Out<'a> {
            level: Level,
            line: String,
            findings: &'a [Finding],
        }
        print_json(&Out {
            level: verdict.level,
            line: verdict.line(),
            findings: &verdict.findings,
        })?;
    } else {
        verdict.shown().print();
    }
    Ok(verdict.level.exit_code())
}

/// `512 MiB`, `3.2 GiB`.
pub(crate) fn bytes(n: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if n >= 1 << 30 {
        format!("{:.1} GiB", n as f64 / GIB)
    } else {
        format!("{} MiB", n >> 20)
    }
}

/// `kill(pid, 0)`: alive if it succeeds or is refused (another user's).
fn pid_alive(pid: u32) -> Option<bool> {
    let pid = i32::try_from(pid).ok().filter(|p| *p > 0)?;
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => Some(true),
        Err(nix::errno::Errno::EPERM) => Some(true),
        Err(nix::errno::Errno::ESRCH) => Some(false),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hb(now: Timestamp, age: i64) -> Heartbeat {
        let t = now.minus(Duration::from_secs(age as u64));
        serde_json::from_value(serde_json::json!({
            "pid": 4242, "version": "0.1.0", "started_at": t.to_string(), "updated_at": t.to_string(),
            "state_root": "/x", "config": "/x/c.toml", "agents": ["rio", "leo"], "running": [],
            "waiting": [], "next_wakes": {}, "paused": null, "stopping": false
        }))
        .unwrap()
    }

    fn seen_agent(agent: &str, last_success: Option<Timestamp>, readable: bool) -> AgentSeen {
        AgentSeen {
            agent: agent.into(),
            last_success,
            readable,
            young: false,
        }
    }

    const MAX: Duration = Duration::from_secs(900);

    #[test]
    fn a_daemon_with_no_agents_configured_is_critical() {
        let now = Timestamp::now();
        for (configured, level) in [
            (None, Level::Ok),
            (Some(2), Level::Ok),
            (Some(0), Level::Critical),
        ] {
            let seen = Seen {
                heartbeat: Some(Ok(hb(now, 30))),
                lock_held: Some(true),
                pid_alive: Some(true),
                configured: configured.map(|n| (n, "/etc/agent-state/config.toml".to_string())),
                ..Seen::default()
            };
            let a = assess(&seen, now, MAX, None);
            assert_eq!(a.level, level, "{configured:?}: {}", a.line());
            if level == Level::Critical {
                assert!(
                    a.line()
                        .contains("no agents are configured in /etc/agent-state/config.toml"),
                    "{}",
                    a.line()
                );
            }
        }
    }

    #[test]
    fn a_fresh_heartbeat_of_a_live_daemon_is_ok() {
        let now = Timestamp::now();
        let seen = Seen {
            heartbeat: Some(Ok(hb(now, 30))),
            lock_held: Some(true),
            pid_alive: Some(true),
            agents: vec![seen_agent("rio", Some(now), true)],
            configured: Some((1, "c.toml".into())),
            hatching: Vec::new(),
        };
        let a = assess(&seen, now, MAX, Some(Duration::from_secs(172_800)));
        assert_eq!(a.level, Level::Ok, "{}", a.line());
        assert!(
            a.line().starts_with("OK: daemon 0.1.0 (pid 4242)"),
            "{}",
            a.line()
        );
    }

    #[test]
    fn no_daemon_a_dead_pid_or_an_old_heartbeat_is_critical() {
        let now = Timestamp::now();
        let a = assess(&Seen::default(), now, MAX, None);
        assert_eq!(a.level, Level::Critical);
        assert!(a.line().contains("no daemon is running"), "{}", a.line());
        let dead = Seen {
            heartbeat: Some(Ok(hb(now, 30))),
            pid_alive: Some(false),
            ..Seen::default()
        };
        let a = assess(&dead, now, MAX, None);
        assert_eq!(a.level, Level::Critical);
        assert!(
            a.line().contains("(pid 4242) is not running"),
            "{}",
            a.line()
        );
        let stuck = Seen {
            heartbeat: Some(Ok(hb(now, 3600))),
            pid_alive: Some(true),
            ..Seen::default()
        };
        let a = assess(&stuck, now, MAX, None);
        assert_eq!(a.level, Level::Critical);
        assert!(
            a.line()
                .contains("last wrote its heartbeat 60m ago (more than 15m ago)"),
            "{}",
            a.line()
        );
    }

    #[test]
    fn an_agent_without_a_recent_success_is_a_warning_and_an_unreadable_one_unknown() {
        let now = Timestamp::now();
        let mut seen = Seen {
            heartbeat: Some(Ok(hb(now, 30))),
            pid_alive: Some(true),
            agents: vec![seen_agent("rio", None, true)],
            ..Seen::default()
        };
        let a = assess(&seen, now, MAX, Some(Duration::from_secs(172_800)));
        assert_eq!(a.level, Level::Warning);
        assert_eq!(
            a.line(),
            "WARNING: rio: no successful session in the last 2d"
        );
        assert_eq!(assess(&seen, now, MAX, None).level, Level::Ok);
        seen.agents[0].young = true;
        assert_eq!(
            assess(&seen, now, MAX, Some(Duration::from_secs(172_800))).level,
            Level::Ok
        );
        seen.agents.push(seen_agent("leo", None, false));
        let a = assess(&seen, now, MAX, Some(Duration::from_secs(172_800)));
        assert_eq!(a.level, Level::Unknown);
    }
}
