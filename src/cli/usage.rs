//! `agent-state usage [--agent A] [--days N] [--json]`: sessions, runtime,
//! tokens and cost per agent per day, from the journals, and what is left
//! of today's budgets. Days are counted in `[budget] timezone`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::NaiveDate;
use serde::Serialize;

use crate::access;
use crate::cli::display::say;
use crate::cli::{Context, print_json};
use crate::config::AgentConfig;
use crate::error::Result;
use crate::usage::{self, DayUse, Left};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One agent (default: every working agent)
    #[arg(long)]
    pub agent: Option<String>,
    /// How many days, today included
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=366))]
    pub days: u32,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    timezone: String,
    /// `YYYY-MM-DD`.
    today: String,
    days: Vec<Day>,
    budgets: Vec<BudgetToday>,
    /// Agents whose journal could not be read: this user may not, or it
    /// is damaged or unsafe (see `unreadable_reasons`). Their use is left
    /// out of the days and budgets.
    unreadable: Vec<String>,
    /// Why each unreadable agent's journal could not be read.
    unreadable_reasons: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct Day {
    /// `YYYY-MM-DD`.
    date: String,
    agents: BTreeMap<String, DayUse>,
    total: DayUse,
}

#[derive(Serialize)]
struct BudgetToday {
    /// An agent's name, or `fleet`.
    scope: String,
    used: DayUse,
    left: Left,
    /// The limit reached, if one is.
    exceeded: Option<String>,
}

/// What `usage --json` prints, as JSON, and whether a journal was damaged
/// (the web view's fleet page reads its days and budgets from this).
pub fn report_json(
    ctx: &Context,
    agent: Option<&str>,
    days: u32,
) -> Result<(serde_json::Value, bool)> {
    let (report, damaged) = report(ctx, agent, days)?;
    // Strings, numbers and maps: it always serializes.
    Ok((serde_json::to_value(&report).unwrap_or_default(), damaged))
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let (report, damaged) = report(ctx, args.agent.as_deref(), args.days)?;
    let code = if damaged {
        crate::error::exit::DATAERR
    } else {
        crate::error::exit::OK
    };
    if args.json {
        print_json(&report)?;
        return Ok(code);
    }
    print_text(&report, args.days);
    Ok(code)
}

/// The report, and whether a journal was damaged (not only unreadable to
/// this user).
fn report(ctx: &Context, agent: Option<&str>, days_wanted: u32) -> Result<(Report, bool)> {
    let days_wanted = days_wanted.max(1);
    let agents: Vec<&AgentConfig> = match agent {
        Some(a) => vec![ctx.working_agent(a)?.0],
        None => ctx.config.working_agents().collect(),
    };
    let tz = ctx.config.budget.timezone;
    let today = usage::day_of(ctx.now, tz);
    let first = today - chrono::Days::new(u64::from(days_wanted - 1));
    // Read a day more than asked: the zone's offset moves the day's start.
    let since = ctx
        .now
        .minus(Duration::from_secs(86_400 * (u64::from(days_wanted) + 1)));
    let mut days: BTreeMap<NaiveDate, Day> = BTreeMap::new();
    let mut unreadable = Vec::new();
    let mut unreadable_reasons = BTreeMap::new();
    let mut damaged = false;
    let mut today_by_agent: Vec<(&AgentConfig, DayUse)> = Vec::new();
    for agent in &agents {
        let dir = ctx.root.agent(&agent.name);
        let sessions = match usage::read(&dir.store, &dir.journal(), since) {
            Ok(s) => s,
            Err(e) => {
                // One agent's journal never hides the others'; a damaged
                // one makes the exit status say so.
                damaged |= !access::is_denied(&e);
                unreadable.push(agent.name.to_string());
                unreadable_reasons.insert(agent.name.to_string(), e.to_string());
                continue;
            }
        };
        let per_day = usage::by_day(&sessions, tz);
        for (date, used) in &per_day {
            if *date < first || *date > today {
                continue;
            }
            let day = days.entry(*date).or_insert_with(|| Day {
                date: date.to_string(),
                agents: BTreeMap::new(),
                total: DayUse::default(),
            });
            day.agents.insert(agent.name.to_string(), *used);
            day.total.add(used);
        }
        today_by_agent.push((agent, per_day.get(&today).copied().unwrap_or_default()));
    }
    let mut budgets = Vec::new();
    for (agent, used) in &today_by_agent {
        let b = agent.session.budget;
        if b.is_unlimited() {
            continue;
        }
        budgets.push(BudgetToday {
            scope: agent.name.to_string(),
            used: *used,
            left: b.left(used),
            exceeded: b.first_exceeded(used).map(|e| e.to_string()),
        });
    }
    let fleet = ctx.config.budget.limits;
    if !fleet.is_unlimited() && agent.is_none() {
        let used = days.get(&today).map(|d| d.total).unwrap_or_default();
        budgets.push(BudgetToday {
            scope: "fleet".into(),
            used,
            left: fleet.left(&used),
            exceeded: fleet.first_exceeded(&used).map(|e| e.to_string()),
        });
    }
    let report = Report {
        timezone: tz.name().to_string(),
        today: today.to_string(),
        days: days.into_values().rev().collect(),
        budgets,
        unreadable,
        unreadable_reasons,
    };
    Ok((report, damaged))
}

fn print_text(r: &Report, days: u32) {
    say!(
        "usage, the last {days} day(s) (days in {}; cost as reported: for a subscription login, what the API would charge)",
        r.timezone
    );
    let row = |c: [&str; 9]| {
        say!(
            "{:<10}  {:<12} {:>8} {:>9} {:>9} {:>9} {:>11} {:>11} {:>9}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            c[6],
            c[7],
            c[8]
        )
    };
    row([
        "DAY", "AGENT", "SESSIONS", "RUNTIME", "INPUT", "OUTPUT", "CACHE W", "CACHE R", "COST",
    ]);
    for day in &r.days {
        let date = &day.date;
        for (agent, u) in &day.agents {
            row(cells(date, agent, u).each_ref().map(String::as_str));
        }
        if day.agents.len() > 1 {
            row(cells(date, "(all)", &day.total)
                .each_ref()
                .map(String::as_str));
        }
    }
    if r.days.is_empty() {
        say!("(no sessions)");
    }
    for b in &r.budgets {
        let mut parts = Vec::new();
        if let Some(n) = b.left.sessions {
            parts.push(format!("{n} session(s)"));
        }
        if let Some(s) = b.left.runtime_seconds {
            parts.push(format!("{} runtime", runtime(s)));
        }
        if let Some(t) = b.left.tokens {
            parts.push(format!("{} tokens", tokens(t)));
        }
        if let Some(c) = b.left.cost_usd {
            parts.push(format!("${c:.2}"));
        }
        let state = match &b.exceeded {
            Some(e) => format!("exhausted ({e}); no wakes until tomorrow"),
            None => format!("left today: {}", parts.join(", ")),
        };
        say!("budget {}: {state}", b.scope);
    }
    for a in &r.unreadable {
        let why = r.unreadable_reasons.get(a).map_or("", String::as_str);
        say!("{a}: ? (its journal cannot be read: {why})");
    }
}

fn cells(date: &str, agent: &str, u: &DayUse) -> [String; 9] {
    [
        date.to_string(),
        agent.to_string(),
        u.sessions.to_string(),
        runtime(u.runtime_seconds),
        tokens(u.tokens.input),
        tokens(u.tokens.output),
        tokens(u.tokens.cache_creation),
        tokens(u.tokens.cache_read),
        format!("${:.2}", u.cost_usd),
    ]
}

/// `2h05m`, `45m`, `30s`.
pub(super) fn runtime(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// `950`, `12.3k`, `4.56M`.
pub(super) fn tokens(n: u64) -> String {
    match n {
        n if n < 1000 => n.to_string(),
        n if n < 1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        n => format!("{:.2}M", n as f64 / 1e6),
    }
}
