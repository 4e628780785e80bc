//! The tests of `schedule`: crontab(5) fields and their errors, next fire
//! times (against brute force around daylight-saving changes), jitter and
//! missed runs.

use super::*;
use std::collections::BTreeSet;

fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> NaiveDateTime {
    NaiveDate::from_ymd_opt(y, mo, d)
        .unwrap()
        .and_hms_opt(h, mi, 0)
        .unwrap()
}

#[test]
fn daily_at_a_time() {
    let s = Schedule::parse("0 22 * * *").unwrap();
    assert!(s.matches(&at(2026, 3, 31, 22, 0)));
    assert!(!s.matches(&at(2026, 3, 31, 22, 1)));
    assert!(!s.matches(&at(2026, 3, 31, 21, 0)));
}

#[test]
fn names_ranges_and_sunday_as_seven() {
    let s = Schedule::parse("30 9 * * mon-fri").unwrap();
    assert!(s.matches(&at(2026, 11, 23, 9, 30))); // Monday
    assert!(!s.matches(&at(2026, 11, 22, 9, 30))); // Sunday
    let sun7 = Schedule::parse("0 0 * * 7").unwrap();
    let sun0 = Schedule::parse("0 0 * * 0").unwrap();
    assert_eq!(sun7.days_of_week, sun0.days_of_week);
    assert!(sun7.matches(&at(2026, 11, 22, 0, 0)));
    let s = Schedule::parse("0 0 1 jan,JUL *").unwrap();
    assert!(s.matches(&at(2026, 7, 1, 0, 0)));
    assert!(!s.matches(&at(2026, 8, 1, 0, 0)));
}

#[test]
fn day_fields_or_when_both_restricted() {
    // The 13th of the month, or any Friday.
    let s = Schedule::parse("0 0 13 * fri").unwrap();
    assert!(s.matches(&at(2026, 11, 13, 0, 0))); // a Friday the 13th
    assert!(s.matches(&at(2026, 11, 20, 0, 0))); // a Friday
    assert!(s.matches(&at(2026, 12, 13, 0, 0))); // a Sunday the 13th
    assert!(!s.matches(&at(2026, 11, 21, 0, 0)));
    // A star-led field keeps the AND, as in Vixie cron.
    let s = Schedule::parse("0 0 */2 * fri").unwrap();
    assert!(!s.matches(&at(2026, 11, 20, 0, 0))); // Friday the 20th: even day
    assert!(s.matches(&at(2026, 11, 13, 0, 0))); // Friday the 13th: odd day
}

#[test]
fn steps_and_macros() {
    let s = Schedule::parse("*/15 * * * *").unwrap();
    assert!(s.matches(&at(2026, 1, 1, 5, 45)));
    assert!(!s.matches(&at(2026, 1, 1, 5, 46)));
    assert_eq!(
        Schedule::parse("@daily").unwrap().minutes,
        Schedule::parse("0 0 * * *").unwrap().minutes
    );
}

#[test]
fn errors_say_which_field() {
    let cases = [
        ("0 22 * *", "has 4 fields"),
        ("60 * * * *", "minute field: 60 is outside 0-59"),
        ("0 24 * * *", "hour field"),
        ("0 0 0 * *", "day of month field"),
        ("0 0 * 13 *", "month field"),
        ("0 0 * * 8", "day of week field"),
        ("0 0 * * fry", "day of week field: \"fry\""),
        ("*/0 * * * *", "step 0"),
        ("5-1 * * * *", "backwards"),
        ("@reboot", "@reboot"),
        ("@often", "unknown macro"),
    ];
    for (line, want) in cases {
        let err = Schedule::parse(line).unwrap_err().to_string();
        assert!(err.contains(want), "{line}: {err}");
    }
}

fn utc(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .with_timezone(&Utc)
}

fn tz(name: &str) -> Zone {
    name.parse().unwrap()
}

#[test]
fn wildcard_is_a_star_led_minute_or_hour() {
    let cases = [
        ("*/15 * * * *", true),
        ("0 * * * *", true),
        ("@hourly", true),
        ("*/5 9 * * *", true),
        ("* 2 * * *", true),
        ("30 2 * * *", false),
        ("@daily", false),
        ("0 9-17 * * mon-fri", false),
        ("0,30 1,2 * * *", false),
        ("0 0 * * *", false),
    ];
    for (line, want) in cases {
        assert_eq!(Schedule::parse(line).unwrap().is_wildcard(), want, "{line}");
    }
}

/// (schedule, zone, after, the next fire time) — each row one rule of the
/// module docs, on the 2026 daylight-saving days.
#[test]
fn next_after_table() {
    #[rustfmt::skip]
    let cases: &[(&str, &str, &str, Option<&str>)] = &[
        // Plain UTC: strictly after, whole minutes.
        ("0 22 * * *", "UTC", "2026-03-31T21:59:59Z", Some("2026-03-31T22:00:00Z")),
        ("0 22 * * *", "UTC", "2026-03-31T22:00:00Z", Some("2026-04-01T22:00:00Z")),
        ("0 22 * * *", "UTC", "2026-03-31T22:00:30Z", Some("2026-04-01T22:00:00Z")),
        ("*/5 * * * *", "UTC", "2026-12-31T23:58:00Z", Some("2027-01-01T00:00:00Z")),
        ("30 9 * * mon-fri", "UTC", "2026-11-20T10:00:00Z", Some("2026-11-23T09:30:00Z")),
        ("0 0 13 * fri", "UTC", "2026-11-13T00:00:00Z", Some("2026-11-20T00:00:00Z")),
        ("@monthly", "UTC", "2026-01-31T12:00:00Z", Some("2026-02-01T00:00:00Z")),
        // Rare and impossible days, found by skipping, not stepping.
        ("0 0 29 2 *", "UTC", "2026-03-01T00:00:00Z", Some("2028-02-29T00:00:00Z")),
        ("0 0 29 2 *", "UTC", "2096-03-01T00:00:00Z", Some("2104-02-29T00:00:00Z")),
        ("0 0 31 * *", "UTC", "2026-04-01T00:00:00Z", Some("2026-05-31T00:00:00Z")),
        ("0 0 31 * *", "UTC", "2026-07-31T00:00:00Z", Some("2026-08-31T00:00:00Z")),
        ("0 0 30 2 *", "UTC", "2026-01-01T00:00:00Z", None),
        ("0 0 31 4,6,9,11 *", "UTC", "2026-01-01T00:00:00Z", None),
        // Wildcard day-of-month keeps the AND: the 1st of February on a Sunday.
        ("0 0 */30 2 sun", "UTC", "2026-02-01T00:00:00Z", Some("2032-02-01T00:00:00Z")),
        ("0 0 */30 2 sun", "UTC", "2043-02-01T00:00:00Z", Some("2054-02-01T00:00:00Z")),
        // A half-hour zone without daylight saving: 22:00 IST is 16:30 UTC.
        ("0 22 * * *", "Asia/Kolkata", "2026-03-31T00:00:00Z", Some("2026-03-31T16:30:00Z")),
        ("0 0 1 1 *", "Asia/Kolkata", "2026-06-01T00:00:00Z", Some("2026-12-31T18:30:00Z")),
        // Europe/Berlin, spring: 02:00 CET jumps to 03:00 CEST on 2026-03-29.
        // Fixed time in the gap: once, at 03:00 CEST (01:00 UTC); next day normal.
        ("30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", Some("2026-03-29T01:00:00Z")),
        ("30 2 * * *", "Europe/Berlin", "2026-03-29T01:00:00Z", Some("2026-03-30T00:30:00Z")),
        // 02:00 (missing) and 03:00 land on one instant and fire once.
        ("0 2,3 * * *", "Europe/Berlin", "2026-03-28T23:00:00Z", Some("2026-03-29T01:00:00Z")),
        ("0 2,3 * * *", "Europe/Berlin", "2026-03-29T01:00:00Z", Some("2026-03-30T00:00:00Z")),
        ("0,30 2 * * *", "Europe/Berlin", "2026-03-29T01:00:00Z", Some("2026-03-30T00:00:00Z")),
        // Wildcard: the missing minutes are skipped, the interval goes on.
        ("*/15 * * * *", "Europe/Berlin", "2026-03-29T00:45:00Z", Some("2026-03-29T01:00:00Z")),
        ("5 * * * *", "Europe/Berlin", "2026-03-29T00:05:00Z", Some("2026-03-29T01:05:00Z")),
        ("*/10 2 * * *", "Europe/Berlin", "2026-03-28T23:00:00Z", Some("2026-03-30T00:00:00Z")),
        // Europe/Berlin, autumn: 03:00 CEST goes back to 02:00 CET on 2026-10-25.
        // Fixed time in the repeated hour: first occurrence only.
        ("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", Some("2026-10-25T00:30:00Z")),
        ("30 2 * * *", "Europe/Berlin", "2026-10-25T00:30:00Z", Some("2026-10-26T01:30:00Z")),
        // ... also when asked during the second pass through 02:xx.
        ("45 2 * * *", "Europe/Berlin", "2026-10-25T01:30:00Z", Some("2026-10-26T01:45:00Z")),
        // Wildcard: both occurrences, in real-time order.
        ("0 * * * *", "Europe/Berlin", "2026-10-24T23:30:00Z", Some("2026-10-25T00:00:00Z")),
        ("0 * * * *", "Europe/Berlin", "2026-10-25T00:00:00Z", Some("2026-10-25T01:00:00Z")),
        ("0 * * * *", "Europe/Berlin", "2026-10-25T01:00:00Z", Some("2026-10-25T02:00:00Z")),
        ("*/15 * * * *", "Europe/Berlin", "2026-10-25T00:45:00Z", Some("2026-10-25T01:00:00Z")),
        // At 02:30 CEST, 02:10 CET (an earlier wall clock) is next.
        ("10 * * * *", "Europe/Berlin", "2026-10-25T00:30:00Z", Some("2026-10-25T01:10:00Z")),
        // America/New_York: 02:00 EST -> 03:00 EDT on 2026-03-08,
        // 02:00 EDT -> 01:00 EST on 2026-11-01.
        ("30 2 * * *", "America/New_York", "2026-03-08T05:00:00Z", Some("2026-03-08T07:00:00Z")),
        ("30 2 * * *", "America/New_York", "2026-03-08T07:00:00Z", Some("2026-03-09T06:30:00Z")),
        ("30 1 * * *", "America/New_York", "2026-11-01T04:00:00Z", Some("2026-11-01T05:30:00Z")),
        ("30 1 * * *", "America/New_York", "2026-11-01T05:30:00Z", Some("2026-11-02T06:30:00Z")),
        ("30 * * * *", "America/New_York", "2026-11-01T05:30:00Z", Some("2026-11-01T06:30:00Z")),
        ("0 22 * * *", "America/New_York", "2026-11-01T12:00:00Z", Some("2026-11-02T03:00:00Z")),
        // Australia/Lord_Howe shifts by 30 minutes: 02:00 -> 02:30 (+11:00) on
        // 2026-10-04, 02:00 -> 01:30 (+10:30) on 2026-04-05.
        ("15 2 * * *", "Australia/Lord_Howe", "2026-10-03T12:00:00Z", Some("2026-10-03T15:30:00Z")),
        ("45 1 * * *", "Australia/Lord_Howe", "2026-04-04T12:00:00Z", Some("2026-04-04T14:45:00Z")),
        ("45 1 * * *", "Australia/Lord_Howe", "2026-04-04T14:45:00Z", Some("2026-04-05T15:15:00Z")),
        ("*/15 * * * *", "Australia/Lord_Howe", "2026-04-04T14:45:00Z", Some("2026-04-04T15:00:00Z")),
    ];
    for &(line, zone, after, want) in cases {
        let s = Schedule::parse(line).unwrap();
        let got = s.next_after(utc(after), tz(zone));
        assert_eq!(got, want.map(utc), "{line} in {zone} after {after}");
    }
}

/// Every fire time by brute force, straight from the module docs: a
/// wildcard schedule fires at each real minute whose wall clock matches;
/// a fixed-time schedule at the first occurrence of each matching wall
/// clock minute, or, for a missing one, at the first real minute whose
/// wall clock is later.
fn brute_force(
    s: &Schedule,
    zone: Zone,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> BTreeSet<DateTime<Utc>> {
    let minute = TimeDelta::minutes(1);
    let wall = |t: DateTime<Utc>| t.with_timezone(&zone).naive_local();
    let mut fires = BTreeSet::new();
    if s.is_wildcard() {
        let mut t = from;
        while t <= to {
            if s.matches(&wall(t)) {
                fires.insert(t);
            }
            t += minute;
        }
        return fires;
    }
    let (mut n, end) = (
        wall(from) - TimeDelta::hours(3),
        wall(to) + TimeDelta::hours(3),
    );
    while n <= end {
        if s.matches(&n) {
            let t = match zone.from_local_datetime(&n) {
                LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => t.with_timezone(&Utc),
                LocalResult::None => {
                    let mut u = from - TimeDelta::days(1);
                    while wall(u) < n {
                        u += minute;
                    }
                    u
                }
            };
            fires.insert(t);
        }
        n += minute;
    }
    fires
}

#[test]
fn next_after_agrees_with_brute_force_around_dst_changes() {
    let schedules = [
        "*/15 * * * *",
        "0 * * * *",
        "10 * * * *",
        "* 1-3 * * *",
        "*/10 2 * * *",
        "30 2 * * *",
        "45 1 * * *",
        "15 2 * * *",
        "0 2,3 * * *",
        "0,30 1,2 * * *",
        "59 1 * * *",
    ];
    let days = [
        ("Europe/Berlin", "2026-03-29"),
        ("Europe/Berlin", "2026-10-25"),
        ("America/New_York", "2026-03-08"),
        ("America/New_York", "2026-11-01"),
        ("Australia/Lord_Howe", "2026-04-05"),
        ("Australia/Lord_Howe", "2026-10-04"),
        ("Asia/Kolkata", "2026-03-29"),
        ("UTC", "2026-03-29"),
    ];
    for line in schedules {
        let s = Schedule::parse(line).unwrap();
        for (zone, day) in days {
            let zone = tz(zone);
            let midday = utc(&format!("{day}T12:00:00Z"));
            let (from, to) = (midday - TimeDelta::hours(36), midday + TimeDelta::hours(36));
            let fires = brute_force(&s, zone, from, to + TimeDelta::days(2));
            // Ask from every 7th minute (and a second into it), so the
            // question also falls inside gaps and repeated hours.
            let mut after = from;
            while after < to {
                for asked in [after, after + TimeDelta::seconds(1)] {
                    let want = fires.range(asked + TimeDelta::seconds(1)..).next().copied();
                    assert_eq!(
                        s.next_after(asked, zone),
                        want,
                        "{line} in {zone} after {asked}"
                    );
                }
                after += TimeDelta::minutes(7);
            }
        }
    }
}

#[test]
fn next_wake_adds_the_agents_jitter() {
    let s = Schedule::parse("0 22 * * *").unwrap();
    let after = utc("2026-03-31T12:00:00Z");
    let fire = utc("2026-03-31T22:00:00Z");
    let jitter = Duration::from_secs(600);
    let cases = [("rio", Duration::ZERO), ("rio", jitter), ("clay", jitter)];
    for (agent, jitter) in cases {
        let offset = TimeDelta::from_std(jitter_offset(agent, fire, jitter)).unwrap();
        assert_eq!(
            s.next_wake(after, Zone::UTC, agent, jitter),
            Some(fire + offset),
            "{agent} {jitter:?}"
        );
    }
    assert_eq!(
        s.next_wake(after, Zone::UTC, "rio", Duration::ZERO),
        Some(fire)
    );
    let never = Schedule::parse("0 0 30 2 *").unwrap();
    assert_eq!(never.next_wake(after, Zone::UTC, "rio", jitter), None);
}

#[test]
fn jitter_is_deterministic_bounded_and_zero_without_jitter() {
    let fire = utc("2026-03-31T22:00:00Z");
    let cases = [
        ("rio", Duration::ZERO),
        ("rio", Duration::from_millis(999)),
        ("rio", Duration::from_secs(1)),
        ("rio", Duration::from_secs(2)),
        ("rio", Duration::from_secs(600)),
        ("theseus", Duration::from_secs(3600)),
        ("", Duration::from_secs(3600)),
    ];
    for (agent, jitter) in cases {
        let offset = jitter_offset(agent, fire, jitter);
        assert_eq!(offset, jitter_offset(agent, fire, jitter), "{agent}");
        assert_eq!(offset.subsec_nanos(), 0, "{agent} {jitter:?}");
        if jitter.as_secs() == 0 {
            assert_eq!(offset, Duration::ZERO, "{agent} {jitter:?}");
        } else {
            assert!(offset < jitter, "{agent} {jitter:?}: {offset:?}");
        }
    }
    // Pinned, so a change of hash (which would move every announced wake
    // time across an upgrade) is a deliberate one.
    assert_eq!(
        jitter_offset("rio", fire, Duration::from_secs(3600)),
        Duration::from_secs(PINNED_RIO_OFFSET)
    );
    // Agents sharing a schedule are spread apart.
    let agents = [
        "rio", "clay", "theseus", "leo", "vida", "astra", "marcus", "iris",
    ];
    let offsets: BTreeSet<_> = agents
        .iter()
        .map(|a| jitter_offset(a, fire, Duration::from_secs(3600)))
        .collect();
    assert!(offsets.len() >= 7, "{offsets:?}");
}

const PINNED_RIO_OFFSET: u64 = 689;

#[test]
fn jitter_covers_every_decile() {
    let jitter = Duration::from_secs(600);
    for agent in ["rio", "clay"] {
        let mut deciles = [0u32; 10];
        let mut fire = utc("2026-01-01T00:00:00Z");
        for _ in 0..1000 {
            let offset = jitter_offset(agent, fire, jitter).as_secs();
            deciles[(offset / 60) as usize] += 1;
            fire += TimeDelta::hours(1);
        }
        // 100 expected per decile; a fair spread stays well inside this.
        for (i, n) in deciles.iter().enumerate() {
            assert!((50..=150).contains(n), "{agent} decile {i}: {deciles:?}");
        }
    }
}

/// (schedule, zone, last fire, now, window, decision)
type MissedCase = (
    &'static str,
    &'static str,
    Option<&'static str>,
    &'static str,
    Duration,
    Missed,
);

#[test]
fn missed_runs_table() {
    let hours = |h: u64| Duration::from_secs(h * 3600);
    #[rustfmt::skip]
    let cases: &[MissedCase] = &[
        // A new agent never catches up.
        ("0 22 * * *", "UTC", None, "2026-03-31T23:00:00Z", hours(2), Missed::Nothing),
        // No downtime: the last fire is the latest due one.
        ("0 22 * * *", "UTC", Some("2026-03-31T22:00:00Z"), "2026-03-31T23:00:00Z", hours(2), Missed::Nothing),
        ("*/5 * * * *", "UTC", Some("2026-03-31T22:55:00Z"), "2026-03-31T22:59:59Z", hours(2), Missed::Nothing),
        // A clock that went back changes nothing.
        ("0 22 * * *", "UTC", Some("2026-04-02T22:00:00Z"), "2026-03-31T23:00:00Z", hours(2), Missed::Nothing),
        // Down 21:50-22:20 over the 22:00 run: one catch-up.
        ("0 22 * * *", "UTC", Some("2026-03-30T22:00:00Z"), "2026-03-31T22:20:00Z", hours(2),
         Missed::CatchUp { scheduled: utc("2026-03-31T22:00:00Z") }),
        // Due exactly now, or exactly `window` ago: still caught up.
        ("0 22 * * *", "UTC", Some("2026-03-30T22:00:00Z"), "2026-03-31T22:00:00Z", hours(2),
         Missed::CatchUp { scheduled: utc("2026-03-31T22:00:00Z") }),
        ("0 22 * * *", "UTC", Some("2026-03-30T22:00:00Z"), "2026-04-01T00:00:00Z", hours(2),
         Missed::CatchUp { scheduled: utc("2026-03-31T22:00:00Z") }),
        ("0 22 * * *", "UTC", Some("2026-03-30T22:00:00Z"), "2026-04-01T00:00:01Z", hours(2),
         Missed::TooLate { scheduled: utc("2026-03-31T22:00:00Z"), count: 1 }),
        // Down three days over a daily run, back long after the last one.
        ("0 22 * * *", "UTC", Some("2026-03-01T22:00:00Z"), "2026-03-05T09:00:00Z", hours(2),
         Missed::TooLate { scheduled: utc("2026-03-04T22:00:00Z"), count: 3 }),
        // ... or back soon after it: one run, not four.
        ("0 22 * * *", "UTC", Some("2026-03-01T22:00:00Z"), "2026-03-05T22:30:00Z", hours(2),
         Missed::CatchUp { scheduled: utc("2026-03-05T22:00:00Z") }),
        // 100 missed */5 fires: exactly one catch-up, the latest.
        ("*/5 * * * *", "UTC", Some("2026-03-31T12:00:00Z"), "2026-03-31T20:22:00Z", hours(2),
         Missed::CatchUp { scheduled: utc("2026-03-31T20:20:00Z") }),
        ("*/5 * * * *", "UTC", Some("2026-03-31T12:00:00Z"), "2026-03-31T20:22:00Z", Duration::from_secs(60),
         Missed::TooLate { scheduled: utc("2026-03-31T20:20:00Z"), count: 100 }),
        // In the agent's zone: 22:00 Berlin (CEST) is 20:00 UTC.
        ("0 22 * * *", "Europe/Berlin", Some("2026-03-30T20:00:00Z"), "2026-03-31T20:30:00Z", hours(2),
         Missed::CatchUp { scheduled: utc("2026-03-31T20:00:00Z") }),
        // The count is capped, the latest fire time is still exact.
        ("* * * * *", "UTC", Some("2026-01-01T00:00:00Z"), "2026-03-31T22:07:30Z", hours(2),
         Missed::CatchUp { scheduled: utc("2026-03-31T22:07:00Z") }),
        ("* 3 * * *", "UTC", Some("2025-01-01T00:00:00Z"), "2026-03-31T22:07:30Z", hours(2),
         Missed::TooLate { scheduled: utc("2026-03-31T03:59:00Z"), count: MISSED_COUNT_CAP }),
        ("* * 1 * *", "UTC", Some("2025-01-01T00:00:00Z"), "2026-03-20T00:00:00Z", hours(2),
         Missed::TooLate { scheduled: utc("2026-03-01T23:59:00Z"), count: MISSED_COUNT_CAP }),
    ];
    for (line, zone, last, now, window, want) in cases {
        let s = Schedule::parse(line).unwrap();
        let got = missed_runs(&s, tz(zone), last.map(utc), utc(now), *window);
        assert_eq!(got, *want, "{line} in {zone}, last {last:?}, now {now}");
    }
}
