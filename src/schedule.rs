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
//! line means.

use chrono::{Datelike, NaiveDateTime, Timelike};

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

impl Schedule {
    pub fn parse(line: &str) -> Result<Schedule, String> {
        let trimmed = line.trim();
        let expanded = match trimmed {
            "@hourly" => "0 * * * *",
            "@daily" | "@midnight" => "0 0 * * *",
            "@weekly" => "0 0 * * 0",
            "@monthly" => "0 0 1 * *",
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@reboot" => {
                return Err(
                    "`@reboot` has no meaning for a daemon that runs continuously; use a time"
                        .into(),
                );
            }
            other if other.starts_with('@') => {
                return Err(format!(
                    "unknown macro `{other}`; use @hourly, @daily, @weekly, @monthly or @yearly"
                ));
            }
            other => other,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(format!(
                "{:?} has {} fields; crontab(5) schedules have 5: minute hour day-of-month month day-of-week (e.g. \"0 22 * * *\")",
                trimmed,
                parts.len()
            ));
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
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Does this schedule fire at the given wall-clock minute (seconds ignored)?
    pub fn matches(&self, t: &NaiveDateTime) -> bool {
        let bit = |set: u64, v: u32| set & (1u64 << v) != 0;
        if !bit(self.minutes, t.minute())
            || !bit(self.hours as u64, t.hour())
            || !bit(self.months as u64, t.month())
        {
            return false;
        }
        let dom = bit(self.days_of_month as u64, t.day());
        let dow = bit(self.days_of_week as u64, t.weekday().num_days_from_sunday());
        if self.dom_restricted && self.dow_restricted {
            dom || dow
        } else {
            dom && dow
        }
    }
}

fn parse_field(text: &str, field: &Field) -> Result<u64, String> {
    let mut set = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| {
                    format!(
                        "{} field: step {s:?} in {item:?} is not a number",
                        field.name
                    )
                })?;
                if step == 0 {
                    return Err(format!(
                        "{} field: step 0 in {item:?} never fires",
                        field.name
                    ));
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
            return Err(format!(
                "{} field: range {range:?} runs backwards ({lo} > {hi})",
                field.name
            ));
        }
        let mut v = lo;
        while v <= hi {
            set |= 1u64 << v;
            v += step;
        }
    }
    Ok(set)
}

fn value(text: &str, field: &Field) -> Result<u32, String> {
    if let Ok(v) = text.parse::<u32>() {
        if v < field.min || v > field.max {
            return Err(format!(
                "{} field: {v} is outside {}-{}",
                field.name, field.min, field.max
            ));
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
    Err(format!(
        "{} field: {text:?} is not a number {}-{}{hint}",
        field.name, field.min, field.max
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

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
            let err = Schedule::parse(line).unwrap_err();
            assert!(err.contains(want), "{line}: {err}");
        }
    }
}
