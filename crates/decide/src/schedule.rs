//! Crontab(5) schedules: the syntax *and* the meaning, as Vixie cron / cronie
//! evaluate them, over plain values (no clock, no IO).
//!
//! Five fields (minute hour day-of-month month day-of-week), `*`, lists,
//! ranges, steps, month and weekday names (also in ranges: `mon-fri`), `0`
//! and `7` both Sunday, the `@daily`-style macros, and crontab's day rule:
//! when both day-of-month and day-of-week are restricted (neither starts with
//! `*`), a day matches if *either* matches.
//!
//! The `cron` crate was considered and not used: it wants a seconds field and
//! ANDs the two day fields, which silently changes what an existing crontab
//! line means. `croner` (4.0) was compared over these tests and a sweep of
//! daylight-saving days (issue 10) and not used either: it ORs the day fields
//! even when one starts with `*` (`0 0 */2 * fri` fires every Friday),
//! rejects cronie's `5/10`, accepts `L`, `W`, `#`, `?` and `+`, which
//! crontab(5) does not, names no field in its errors, and a fixed-time
//! schedule listing several hours around a change (`0 2,3 * * *`,
//! `0,30 1,2 * * *`) fires twice in a repeated hour or loses the runs of a
//! skipped one.
//!
//! # When a schedule fires
//!
//! A schedule names wall-clock minutes in the agent's time zone; the daemon
//! needs instants. [`Schedule::next_after`] turns one into the other, and
//! everything else here (jitter, the catch-up decision) is built on it. Every
//! function takes the time and the zone as values, so the same rules hold in
//! the daemon, in `report.json`'s `next_wake_at` and in the tests.
//!
//! Most wall-clock minutes happen exactly once, and the schedule fires at that
//! instant. Daylight-saving changes make two kinds of exception, and we treat
//! them as Vixie cron and cronie do, because a crontab line should mean on
//! this server what it means in the system crontab. Those crons distinguish
//! two kinds of entry (the `MIN_STAR | HR_STAR` flags), and so do we:
//!
//! - A **wildcard** schedule is one whose minute or hour field starts with
//!   `*`: `*/15 * * * *`, `0 * * * *` (also `@hourly`), `*/5 9 * * *`. It
//!   describes an interval, and it follows the clock on the wall minute by
//!   minute in real time.
//! - A **fixed-time** schedule is every other one: `30 2 * * *`, `@daily`,
//!   `0 9-17 * * mon-fri`. It describes appointments, and each appointment is
//!   kept once.
//!
//! The rules, for a wall-clock minute that the schedule matches:
//!
//! 1. **Repeated minutes** (the clock goes back, e.g. 02:00–02:59 on the last
//!    Sunday of October in Europe/Berlin, 01:00–01:59 on the first Sunday of
//!    November in America/New_York). A fixed-time schedule fires at the
//!    *first* occurrence only, so `30 2 * * *` runs once, at 02:30 summer
//!    time, never a second time at 02:30 winter time. A wildcard schedule
//!    fires at *both* occurrences, so `*/15 * * * *` keeps its 15-minute
//!    rhythm in real time and `0 * * * *` runs at 02:00 summer time and again
//!    one hour later at 02:00 winter time.
//! 2. **Missing minutes** (the clock jumps forward, e.g. 02:00–02:59 on the
//!    last Sunday of March in Europe/Berlin). A fixed-time schedule fires at
//!    the first instant after the gap (03:00 local in Berlin), so
//!    `30 2 * * *` still runs that day; several missing minutes, and a
//!    scheduled minute at the end of the gap itself, all land on that one
//!    instant and fire *once*. A wildcard schedule does not fire for missing
//!    minutes: the clock skipped them, and the interval goes on from the next
//!    minute that exists (`*/15 * * * *` runs at 01:45 winter time and then
//!    at 03:00 summer time, 15 real minutes later; `5 * * * *` runs at
//!    01:05 and then 03:05, and `*/10 2 * * *` does not run that day).
//!
//! Fire times are whole minutes of local time (seconds zero), and "next"
//! always means strictly after the given instant: at 22:00:30 the 22:00 run
//! is in the past.
//!
//! We considered the simpler rule "fire at every matching wall-clock minute,
//! first occurrence only, missing minutes moved to the end of the gap" and
//! rejected it for wildcard schedules: it leaves a 75-minute hole in a
//! `*/15 * * * *` schedule every autumn and runs `5 * * * *` at 03:00 *and*
//! 03:05 every spring.
//!
//! # Jitter and missed runs
//!
//! [`jitter_offset`] spreads agents that share a schedule over the configured
//! jitter, so ten agents on `0 22 * * *` do not start in the same second. The
//! offset is a hash of the agent name and the fire time, not a random draw,
//! so a restarted daemon computes the same wake time it announced in
//! `report.json`.
//!
//! [`missed_runs`] decides what to do about fire times that passed while the
//! daemon was down: at most one catch-up run, for the latest missed time, and
//! only if that time is recent enough to still be useful; otherwise the miss
//! is reported, not replayed. A burst of stale runs after an outage helps no
//! one and competes with the runs that are due now.

use std::time::Duration;

use crate::zone::Zone;
use chrono::{
    DateTime, Datelike, LocalResult, Months, NaiveDate, NaiveDateTime, TimeDelta, TimeZone,
    Timelike, Utc,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    source: String,
    minutes: u64,
    hours: u32,
    days_of_month: u32,
    months: u16,
    days_of_week: u8,
    dom_restricted: bool,
    dow_restricted: bool,
    /// Cronie's `MIN_STAR | HR_STAR`: the minute or the hour field starts
    /// with `*`. Decides the daylight-saving rules (module docs).
    wildcard: bool,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
    names_start: u32,
}

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
        names_start: 0,
    },
    Field {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
        names_start: 0,
    },
    Field {
        name: "day of month",
        min: 1,
        max: 31,
        names: &[],
        names_start: 1,
    },
    Field {
        name: "month",
        min: 1,
        max: 12,
        names: &MONTHS,
        names_start: 1,
    },
    // 7 is accepted as Sunday and folded onto 0 below.
    Field {
        name: "day of week",
        min: 0,
        max: 7,
        names: &DAYS,
        names_start: 0,
    },
];

/// Why a schedule line is not a crontab(5) schedule. Its text is what the
/// config check prints after the field's path (`agents.rio.schedule`), and
/// says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("`@reboot` has no meaning for a daemon that runs continuously; use a time")]
    Reboot,
    #[error("unknown macro `{0}`; use @hourly, @daily, @weekly, @monthly or @yearly")]
    UnknownMacro(String),
    #[error(
        "{line:?} has {count} fields; crontab(5) schedules have 5: minute hour day-of-month month day-of-week (e.g. \"0 22 * * *\")"
    )]
    FieldCount { line: String, count: usize },
    #[error("{field} field: step {step:?} in {item:?} is not a number")]
    StepNotANumber {
        field: &'static str,
        step: String,
        item: String,
    },
    #[error("{field} field: step 0 in {item:?} never fires")]
    StepZero { field: &'static str, item: String },
    #[error("{field} field: range {range:?} runs backwards ({lo} > {hi})")]
    Backwards {
        field: &'static str,
        range: String,
        lo: u32,
        hi: u32,
    },
    #[error("{field} field: {value} is outside {min}-{max}")]
    OutOfRange {
        field: &'static str,
        value: u32,
        min: u32,
        max: u32,
    },
    /// `hint`: the names the field also takes (", or a name (jan, …)"), or
    /// nothing.
    #[error("{field} field: {text:?} is not a number {min}-{max}{hint}")]
    NotANumber {
        field: &'static str,
        text: String,
        min: u32,
        max: u32,
        hint: String,
    },
}

impl Schedule {
    pub fn parse(line: &str) -> Result<Schedule, ScheduleError> {
        let trimmed = line.trim();
        let expanded = match trimmed {
            "@hourly" => "0 * * * *",
            "@daily" | "@midnight" => "0 0 * * *",
            "@weekly" => "0 0 * * 0",
            "@monthly" => "0 0 1 * *",
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@reboot" => {
                return Err(ScheduleError::Reboot);
            }
            other if other.starts_with('@') => {
                return Err(ScheduleError::UnknownMacro(other.to_string()));
            }
            other => other,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(ScheduleError::FieldCount {
                line: trimmed.to_string(),
                count: parts.len(),
            });
        }
        let mut sets = [0u64; 5];
        for (i, (part, field)) in parts.iter().zip(FIELDS.iter()).enumerate() {
            sets[i] = parse_field(part, field)?;
        }
        // Sunday is both 0 and 7.
        let mut dow = sets[4];
        if dow & (1 << 7) != 0 {
            dow = (dow | 1) & 0x7f;
        }
        Ok(Schedule {
            source: trimmed.to_string(),
            minutes: sets[0],
            hours: sets[1] as u32,
            days_of_month: sets[2] as u32,
            months: sets[3] as u16,
            days_of_week: dow as u8,
            dom_restricted: !parts[2].starts_with('*'),
            dow_restricted: !parts[4].starts_with('*'),
            wildcard: parts[0].starts_with('*') || parts[1].starts_with('*'),
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Does this schedule fire at the given wall-clock minute (seconds ignored)?
    pub fn matches(&self, t: &NaiveDateTime) -> bool {
        bit(self.minutes, t.minute())
            && bit(self.hours.into(), t.hour())
            && bit(self.months.into(), t.month())
            && self.day_matches(t.day(), t.weekday().num_days_from_sunday())
    }

    /// Crontab's day rule: OR when both day fields are restricted, else AND.
    fn day_matches(&self, day_of_month: u32, day_of_week: u32) -> bool {
        let dom = bit(self.days_of_month.into(), day_of_month);
        let dow = bit(self.days_of_week.into(), day_of_week);
        if self.dom_restricted && self.dow_restricted {
            dom || dow
        } else {
            dom && dow
        }
    }

    /// Is this a wildcard schedule in cronie's sense (minute or hour field
    /// starts with `*`)? See the module docs for what that changes.
    pub fn is_wildcard(&self) -> bool {
        self.wildcard
    }

    /// The first instant strictly after `after` at which this schedule fires,
    /// reading the schedule as wall-clock time in `tz`, with the
    /// daylight-saving rules of the module docs. Always a whole minute of
    /// local time. `None` if the schedule never fires (`0 0 30 2 *`): the
    /// search covers 400 years, one full cycle of the Gregorian calendar, so
    /// a schedule that fires at all fires within it.
    ///
    /// The search skips whole months, days and hours that the schedule rules
    /// out, so a rare schedule (`0 0 29 2 *`) costs a few hundred steps, not a
    /// step per minute.
    pub fn next_after(&self, after: DateTime<Utc>, tz: Zone) -> Option<DateTime<Utc>> {
        let local = after.with_timezone(&tz).naive_local();
        let mut cursor = local;
        // In the first pass through a repeated hour, the second occurrences
        // of wall-clock minutes *earlier* than now are still ahead in real
        // time; a wildcard schedule fires at those, so start looking there.
        if self.wildcard
            && let LocalResult::Ambiguous(first, second) = tz.from_local_datetime(&local)
        {
            cursor = local - (second - first);
        }
        let limit = cursor
            .date()
            .checked_add_months(Months::new(12 * SEARCH_YEARS))?;
        // Wall-clock order is real-time order except for second occurrences
        // of repeated minutes, so keep the earliest candidate and stop once a
        // wall-clock minute cannot produce anything earlier.
        let mut best: Option<DateTime<Utc>> = None;
        while let Some(wall) = self.next_wall_clock_match(cursor, limit) {
            let (earliest, fires) = self.instants(wall, tz);
            if let (Some(b), Some(e)) = (best, earliest)
                && e >= b
            {
                break;
            }
            for t in fires.into_iter().flatten() {
                if t > after && best.is_none_or(|b| t < b) {
                    best = Some(t);
                }
            }
            cursor = wall + TimeDelta::minutes(1);
        }
        best
    }

    /// [`next_after`](Self::next_after) plus this agent's
    /// [`jitter_offset`] for that fire time: when the daemon wakes the agent
    /// (`report.json` `next_wake_at`). Pass the last *fire* time as `after`,
    /// not the last wake time, or a jitter longer than the interval would
    /// skip fire times.
    pub fn next_wake(
        &self,
        after: DateTime<Utc>,
        tz: Zone,
        agent: &str,
        jitter: Duration,
    ) -> Option<DateTime<Utc>> {
        let fire = self.next_after(after, tz)?;
        let offset = TimeDelta::from_std(jitter_offset(agent, fire, jitter)).ok()?;
        fire.checked_add_signed(offset)
    }

    /// The instants at which the wall-clock minute `wall` fires under the
    /// daylight-saving rules, and the earliest instant `wall` denotes at all
    /// (a lower bound for every later wall-clock minute's instants; `None`
    /// when it is not needed).
    fn instants(
        &self,
        wall: NaiveDateTime,
        tz: Zone,
    ) -> (Option<DateTime<Utc>>, [Option<DateTime<Utc>>; 2]) {
        let utc = |t: DateTime<Zone>| t.with_timezone(&Utc);
        match tz.from_local_datetime(&wall) {
            LocalResult::Single(t) => (Some(utc(t)), [Some(utc(t)), None]),
            LocalResult::Ambiguous(first, second) => {
                let second = self.wildcard.then(|| utc(second));
                (Some(utc(first)), [Some(utc(first)), second])
            }
            LocalResult::None if self.wildcard => (None, [None, None]),
            LocalResult::None => {
                let end = gap_end(wall, tz);
                (end, [end, None])
            }
        }
    }

    /// The first wall-clock minute at or after `from` (seconds ignored) that
    /// matches, not later than the day `limit`.
    fn next_wall_clock_match(
        &self,
        from: NaiveDateTime,
        limit: NaiveDate,
    ) -> Option<NaiveDateTime> {
        let mut date = from.date();
        let (mut hour, mut minute) = (from.hour(), from.minute());
        loop {
            if date > limit {
                return None;
            }
            if !bit(self.months.into(), date.month()) {
                date = self.next_month_start(date)?;
                (hour, minute) = (0, 0);
                continue;
            }
            match self.next_day_in_month(date) {
                Some(day) if day == date => {}
                Some(day) => {
                    date = day;
                    (hour, minute) = (0, 0);
                }
                None => {
                    date = first_of_next_month(date)?;
                    (hour, minute) = (0, 0);
                    continue;
                }
            }
            match next_bit(self.hours.into(), hour) {
                Some(h) if h == hour => {}
                Some(h) => (hour, minute) = (h, 0),
                None => {
                    date = date.succ_opt()?;
                    (hour, minute) = (0, 0);
                    continue;
                }
            }
            match next_bit(self.minutes, minute) {
                Some(m) => return date.and_hms_opt(hour, m, 0),
                None if hour == 23 => {
                    date = date.succ_opt()?;
                    (hour, minute) = (0, 0);
                }
                None => (hour, minute) = (hour + 1, 0),
            }
        }
    }

    /// The first day of the next month (after `date`'s) that the month field
    /// allows.
    fn next_month_start(&self, date: NaiveDate) -> Option<NaiveDate> {
        match next_bit(self.months.into(), date.month() + 1) {
            Some(month) => NaiveDate::from_ymd_opt(date.year(), month, 1),
            None => {
                let month = next_bit(self.months.into(), 1)?;
                NaiveDate::from_ymd_opt(date.year().checked_add(1)?, month, 1)
            }
        }
    }

    /// The first day from `date` to the end of its month that the day
    /// fields allow, in plain integer arithmetic.
    fn next_day_in_month(&self, date: NaiveDate) -> Option<NaiveDate> {
        let last = days_in_month(date.year(), date.month());
        let weekday = date.weekday().num_days_from_sunday();
        (date.day()..=last)
            .find(|&day| self.day_matches(day, (weekday + day - date.day()) % 7))
            .and_then(|day| date.with_day(day))
    }
}

/// How many years [`Schedule::next_after`] searches before it concludes that
/// a schedule never fires. The Gregorian calendar (dates and weekdays)
/// repeats every 400 years, so one more than that is exhaustive.
const SEARCH_YEARS: u32 = 401;

/// The most missed runs [`missed_runs`] counts; a larger miss is reported as
/// this many ("at least").
pub const MISSED_COUNT_CAP: u32 = 10_000;

/// What to do, after the daemon was down, about the fire times it missed.
/// In both non-`Nothing` cases the daemon records `scheduled` as the new
/// last fire time, so the same miss is never acted on or reported twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// No fire time passed unseen.
    Nothing,
    /// Run once now, for the latest missed fire time (the others are
    /// dropped: never a burst).
    CatchUp { scheduled: DateTime<Utc> },
    /// The latest missed fire time is older than the catch-up window: do not
    /// run, record the miss. `count` is how many fire times were missed,
    /// at most [`MISSED_COUNT_CAP`].
    TooLate {
        scheduled: DateTime<Utc>,
        count: u32,
    },
}

/// The catch-up decision at daemon start. `last_fire` is the last fire time
/// the daemon acted on (the scheduled time, not the jittered wake time), or
/// `None` for an agent that never fired: a new agent waits for its next fire
/// time instead of running at once. Fire times in `(last_fire, now]` were
/// missed; if the latest of them is at most `window` before `now`, the agent
/// runs once for it, otherwise the miss is only reported.
pub fn missed_runs(
    schedule: &Schedule,
    tz: Zone,
    last_fire: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    window: Duration,
) -> Missed {
    let Some(last_fire) = last_fire else {
        return Missed::Nothing;
    };
    let mut count = 0;
    let mut latest = None;
    let mut cursor = last_fire;
    while count < MISSED_COUNT_CAP {
        match schedule.next_after(cursor, tz) {
            Some(fire) if fire <= now => {
                count += 1;
                latest = Some(fire);
                cursor = fire;
            }
            _ => break,
        }
    }
    let Some(mut latest) = latest else {
        return Missed::Nothing;
    };
    if count == MISSED_COUNT_CAP {
        latest = latest_fire_up_to(schedule, tz, latest, now);
    }
    let window = TimeDelta::from_std(window).unwrap_or(TimeDelta::MAX);
    if now - latest <= window {
        Missed::CatchUp { scheduled: latest }
    } else {
        Missed::TooLate {
            scheduled: latest,
            count,
        }
    }
}

/// The latest fire time in `[known, now]`, given that `known` is one:
/// look back from `now` over doubling windows, so the cost follows the
/// distance to the answer, not to `known`.
fn latest_fire_up_to(
    schedule: &Schedule,
    tz: Zone,
    known: DateTime<Utc>,
    now: DateTime<Utc>,
) -> DateTime<Utc> {
    let mut span = TimeDelta::minutes(1);
    loop {
        let start = now.checked_sub_signed(span).map_or(known, |t| t.max(known));
        let mut latest = None;
        let mut cursor = start;
        while let Some(fire) = schedule.next_after(cursor, tz).filter(|f| *f <= now) {
            latest = Some(fire);
            cursor = fire;
        }
        match latest {
            Some(fire) => return fire,
            None if start == known => return known,
            None => span = span.checked_mul(2).unwrap_or(TimeDelta::MAX),
        }
    }
}

/// A deterministic offset in `[0, jitter)`, in whole seconds (the precision
/// of every timestamp in the state files), for `agent`'s run at `fire`.
/// The same inputs give the same offset in every process and every release
/// that keeps this hash: FNV-1a over the agent name, a NUL and the fire time
/// (Unix seconds, little-endian), finished with SplitMix64's mixer so that
/// neighbouring fire times land far apart. A jitter under one second gives
/// zero.
pub fn jitter_offset(agent: &str, fire: DateTime<Utc>, jitter: Duration) -> Duration {
    const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let span = jitter.as_secs();
    if span == 0 {
        return Duration::ZERO;
    }
    let mut hash = FNV_OFFSET_BASIS;
    let bytes = agent
        .bytes()
        .chain([0])
        .chain(fire.timestamp().to_le_bytes());
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    let hash = splitmix64_mix(hash);
    // Scale the hash onto [0, span) by multiplication: unbiased enough and
    // no modulo.
    Duration::from_secs(((u128::from(hash) * u128::from(span)) >> 64) as u64)
}

/// SplitMix64's output function (Steele, Lea, Flood 2014).
fn splitmix64_mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The first instant after the daylight-saving gap that swallows `wall`,
/// found as the instant of the first wall-clock minute after it that exists.
/// Gaps are an hour or less in practice (a day at most, Samoa 2011); the
/// search gives up after three days.
fn gap_end(wall: NaiveDateTime, tz: Zone) -> Option<DateTime<Utc>> {
    (1..=3 * 24 * 60).find_map(|minutes| {
        tz.from_local_datetime(&(wall + TimeDelta::minutes(minutes)))
            .earliest()
            .map(|t| t.with_timezone(&Utc))
    })
}

fn bit(set: u64, v: u32) -> bool {
    set & (1u64 << v) != 0
}

/// The smallest member of `set` that is at least `from` (`from` < 64).
fn next_bit(set: u64, from: u32) -> Option<u32> {
    let rest = set & (!0u64 << from);
    (rest != 0).then(|| rest.trailing_zeros())
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn first_of_next_month(date: NaiveDate) -> Option<NaiveDate> {
    date.with_day(1)?.checked_add_months(Months::new(1))
}

fn parse_field(text: &str, field: &Field) -> Result<u64, ScheduleError> {
    let mut set = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| ScheduleError::StepNotANumber {
                    field: field.name,
                    step: s.to_string(),
                    item: item.to_string(),
                })?;
                if step == 0 {
                    return Err(ScheduleError::StepZero {
                        field: field.name,
                        item: item.to_string(),
                    });
                }
                (r, step)
            }
            None => (item, 1),
        };
        let (lo, hi) = if range == "*" {
            (field.min, field.max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a, field)?, value(b, field)?)
        } else {
            let v = value(range, field)?;
            // `5/10` means from 5 to the end in steps of 10, as cronie reads it.
            if step > 1 { (v, field.max) } else { (v, v) }
        };
        if lo > hi {
            return Err(ScheduleError::Backwards {
                field: field.name,
                range: range.to_string(),
                lo,
                hi,
            });
        }
        let mut v = lo;
        while v <= hi {
            set |= 1u64 << v;
            v += step;
        }
    }
    Ok(set)
}

fn value(text: &str, field: &Field) -> Result<u32, ScheduleError> {
    if let Ok(v) = text.parse::<u32>() {
        if v < field.min || v > field.max {
            return Err(ScheduleError::OutOfRange {
                field: field.name,
                value: v,
                min: field.min,
                max: field.max,
            });
        }
        return Ok(v);
    }
    let lower = text.to_ascii_lowercase();
    if let Some(i) = field.names.iter().position(|n| *n == lower) {
        return Ok(i as u32 + field.names_start);
    }
    let hint = if field.names.is_empty() {
        String::new()
    } else {
        format!(" or a name ({})", field.names.join(", "))
    };
    Err(ScheduleError::NotANumber {
        field: field.name,
        text: text.to_string(),
        min: field.min,
        max: field.max,
        hint,
    })
}

#[cfg(test)]
mod tests;
