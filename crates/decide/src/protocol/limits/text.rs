//! Text forms: the lines Claude Code prints ("You've hit your limit ·
//! resets 1pm (Europe/Lisbon)", "… usage limit reached|EPOCH", "API Error:
//! Rate limit reached", …) and the wall-clock resets in them.

use super::*;

/// Characters terminals and Claude Code's TUI put before a message.
const DECORATIONS: &[char] = &['⎿', '●', '⏺', '│', '>', '❯', '✗', '✘', '⚠', '*', '·'];

/// One line of text.
pub(super) fn text_line(line: &str, now: DateTime<Utc>) -> Option<Found> {
    let line = cut(line, MAX_TEXT_LINE_BYTES);
    if !mentions_any(line.as_bytes(), TEXT_MARKERS, true) {
        return None;
    }
    // Typographic apostrophes (`You’ve`) as ASCII ones.
    let normal: String = line
        .chars()
        .map(|c| {
            if matches!(c, '’' | '‘' | '`') {
                '\''
            } else {
                c
            }
        })
        .collect();
    let mut rest =
        normal.trim_start_matches(|c: char| c.is_whitespace() || DECORATIONS.contains(&c));
    let mut error_prefix = false;
    loop {
        let stripped = strip_ci(rest, "api error:")
            .or_else(|| strip_ci(rest, "error:"))
            .map(str::trim_start);
        match stripped {
            Some(after) => {
                rest = after;
                error_prefix = true;
            }
            None => break,
        }
    }
    let evidence = normal.trim();
    let lower = rest.to_ascii_lowercase();
    let limit = |kind, window: Option<&str>, reset: Reset| {
        let (resets_at, note, precision) = match reset {
            Reset::None => (None, None, 0),
            Reset::Missing => (None, Some("the message names no reset".to_string()), 0),
            Reset::Unreadable(why) => (None, Some(why), 0),
            Reset::At(at, precision) => match believe(at, now) {
                (Some(at), _) => (Some(at), None, precision),
                (None, note) => (None, note, 0),
            },
        };
        Some(Found::Limit(Candidate {
            limit: Limit {
                kind,
                resets_at,
                window: window.map(str::to_owned),
                evidence: truncate(evidence),
                note,
            },
            precision,
        }))
    };

    // Claude Code 1.0: `Claude AI usage limit reached|1755615600`.
    if let Some(after) = strip_ci(rest, "claude ai usage limit reached") {
        let digits: String = after
            .strip_prefix('|')
            .unwrap_or("")
            .chars()
            .take_while(char::is_ascii_digit)
            .take(14)
            .collect();
        let reset = match digits.parse::<i64>().ok().and_then(epoch) {
            Some(at) => Reset::At(at, 2),
            None => reset_in(after, now),
        };
        return limit(LimitKind::UsageLimit, None, reset);
    }
    // 1.0 text: `Claude usage limit reached. Your limit will reset at 5pm (Europe/Warsaw).`
    if let Some(after) = strip_ci(rest, "claude usage limit reached")
        .or_else(|| strip_ci(rest, "claude code usage limit reached"))
    {
        return limit(LimitKind::UsageLimit, None, reset_in(after, now));
    }
    // `5-hour limit reached ∙ resets 5am`, `Weekly limit reached`, `Opus weekly limit reached`.
    if let Some(at) = lower.find("limit reached")
        && at <= 24
        && !lower[..at].contains("rate")
        && !lower[..at].contains("usage")
    {
        let name = &lower[..at];
        let window = window_of(name)
            .or_else(|| name.contains("hour").then_some("five_hour"))
            .or_else(|| name.contains("week").then_some("seven_day"));
        if window.is_some() {
            return limit(
                LimitKind::UsageLimit,
                window,
                reset_in(&rest[at + "limit reached".len()..], now),
            );
        }
    }
    // `You've hit your session limit · resets 6:30pm (UTC)` and the like.
    if let Some(after) = strip_ci(rest, "you've hit your ")
        .or_else(|| strip_ci(rest, "you've reached your "))
        .or_else(|| strip_ci(rest, "you have hit your "))
    {
        // Names are one to four words ending in "limit": "limit",
        // "session limit", "org's monthly spend limit".
        let said = after.to_ascii_lowercase();
        let name_end = match said.find("limit") {
            Some(at) if at <= 40 => at + "limit".len(),
            _ => said
                .find([' ', '.', '/', '·', '∙', '•', ','])
                .unwrap_or(said.len()),
        };
        let name = &said[..name_end];
        if name.contains("fast limit") {
            return None;
        }
        let needs_human = name.contains("spend limit")
            || [
                "org's",
                "org ",
                "individual",
                "team's",
                "channel's",
                "group's",
            ]
            .iter()
            .any(|p| name.starts_with(p))
            || said.contains("contact your admin")
            || said.contains("ask your admin");
        if needs_human {
            return limit(LimitKind::AdminDisabled, None, Reset::None);
        }
        return limit(
            LimitKind::UsageLimit,
            window_of(name),
            reset_in(&after[name_end..], now),
        );
    }
    if let Some(after) = strip_ci(rest, "you're out of extra usage")
        .or_else(|| strip_ci(rest, "you're out of usage credits"))
        .or_else(|| strip_ci(rest, "you are out of extra usage"))
    {
        return limit(LimitKind::ExtraUsageExhausted, None, reset_in(after, now));
    }
    const ADMIN: &[&str] = &[
        "your usage allocation has been disabled",
        "your group's usage limit is set to $0",
        "your seat type doesn't include",
        "this service is disabled for your org",
        "your org is out of usage",
        "your organization is out of usage",
    ];
    if ADMIN.iter().any(|p| lower.starts_with(p)) {
        return limit(LimitKind::AdminDisabled, None, Reset::None);
    }
    // Warnings: `You've used 90% of your weekly limit · resets …`,
    // `Approaching Opus limit · resets …`, `You're close to your …`.
    if let Some(after) = strip_ci(rest, "you've used ")
        && let Some(percent_at) = after.find("% of your ")
        && let Ok(percent) = after[..percent_at].trim().parse::<u8>()
    {
        let after_name = &after[percent_at + "% of your ".len()..];
        return Some(Found::Warning(Warning {
            window: window_of(&after_name.to_ascii_lowercase()).map(str::to_owned),
            resets_at: match reset_in(after_name, now) {
                Reset::At(at, _) => believe(at, now).0,
                _ => None,
            },
            utilization: Some(f64::from(percent) / 100.0),
            evidence: truncate(evidence),
        }));
    }
    if let Some(after) =
        strip_ci(rest, "approaching ").or_else(|| strip_ci(rest, "you're close to your "))
        && let Some(name_end) = after.to_ascii_lowercase().find("limit")
    {
        let name = after[..name_end + "limit".len()].to_ascii_lowercase();
        return Some(Found::Warning(Warning {
            window: window_of(&name).map(str::to_owned),
            resets_at: match reset_in(after, now) {
                Reset::At(at, _) => believe(at, now).0,
                _ => None,
            },
            utilization: None,
            evidence: truncate(evidence),
        }));
    }
    // API rate limits: only after an error prefix (or as an API error body),
    // never in free text.
    let api_body = lower.starts_with("429 ")
        || lower.starts_with("429:")
        || lower.starts_with("(429")
        || lower.starts_with("{\"type\":\"error\"");
    if error_prefix || api_body {
        const API: &[&str] = &[
            "rate limit reached",
            "rate limited",
            "rate_limit_error",
            "exceed your account's rate limit",
            "rate limit exceeded",
            "too many requests",
        ];
        if API.iter().any(|p| lower.contains(p)) {
            return Some(api_rate_limit(evidence));
        }
    }
    None
}

/// The window a limit's name stands for.
fn window_of(name: &str) -> Option<&'static str> {
    if name.contains("session") || name.contains("5-hour") || name.contains("five") {
        Some("five_hour")
    } else if name.contains("opus") {
        Some("seven_day_opus")
    } else if name.contains("sonnet") {
        Some("seven_day_sonnet")
    } else if name.contains("weekly") {
        Some("seven_day")
    } else if name.contains("extra usage") {
        Some("overage")
    } else {
        None
    }
}

enum Reset {
    /// Not applicable (a limit that is not timed).
    None,
    /// The message names no reset.
    Missing,
    /// It names one that cannot be read: why.
    Unreadable(String),
    /// A reset and its precision (1 wall clock, 2 epoch in text).
    At(DateTime<Utc>, u8),
}

/// The reset named in the text after a limit's name: `· resets 1pm
/// (Europe/Lisbon)`, `Your limit will reset at 5pm (Europe/Warsaw).`
fn reset_in(text: &str, now: DateTime<Utc>) -> Reset {
    let lower = text.to_ascii_lowercase();
    let Some((at, word)) = ["resets ", "reset at ", "reset "]
        .iter()
        .filter_map(|w| lower.find(w).map(|i| (i, *w)))
        .min_by_key(|(i, _)| *i)
    else {
        return Reset::Missing;
    };
    let after = &text[at + word.len()..];
    let after = strip_ci(after, "at ").unwrap_or(after);
    let (clock, zone) = match after.find('(') {
        Some(open) => {
            let zone = after[open + 1..].split(')').next().unwrap_or("").trim();
            (&after[..open], Some(zone))
        }
        None => {
            let end = after
                .find(['·', '∙', '•', '/', '\n'])
                .unwrap_or(after.len());
            (after[..end].trim_end_matches(['.', ' ']), None)
        }
    };
    let clock = clock.trim().trim_end_matches('.');
    let shown = truncate(clock);
    let Some(spec) = ClockSpec::parse(clock) else {
        return Reset::Unreadable(format!("cannot read the reset time {shown:?}"));
    };
    let Some(zone) = zone else {
        return Reset::Unreadable(format!("the reset time {shown:?} names no time zone"));
    };
    let Ok(tz) = zone.parse::<Zone>() else {
        return Reset::Unreadable(format!("unknown time zone {:?}", truncate(zone)));
    };
    match spec.resolve(tz, now) {
        Some(at) => Reset::At(at, 1),
        None => Reset::Unreadable(format!("cannot place the reset time {shown:?} in {zone}")),
    }
}

/// A wall-clock reset as printed: a time, with a date or a weekday.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ClockSpec {
    date: Option<(u32, u32)>,
    weekday: Option<Weekday>,
    time: NaiveTime,
}

impl ClockSpec {
    /// `1pm`, `1:30pm`, `1:30 pm`, `9:30 AM`, `13:00`, `12am`, with
    /// `Jan 30,` / `Apr 23 at` / `Mon` before it. `None` for anything else.
    fn parse(text: &str) -> Option<ClockSpec> {
        let lower = text.to_ascii_lowercase();
        let tokens: Vec<&str> = lower
            .split([' ', ',', '\u{a0}', '\u{202f}'])
            .filter(|t| !t.is_empty())
            .collect();
        if tokens.len() > 6 {
            return None;
        }
        let (mut date, mut weekday, mut time) = (None, None, None);
        let mut i = 0;
        while i < tokens.len() {
            let token = tokens[i];
            if token == "at" || token == "on" {
                i += 1;
            } else if let Some(month) = month_of(token) {
                let day: u32 = tokens.get(i + 1)?.parse().ok()?;
                if date.is_some() || !(1..=31).contains(&day) {
                    return None;
                }
                date = Some((month, day));
                i += 2;
            } else if let Some(day) = weekday_of(token) {
                if weekday.is_some() {
                    return None;
                }
                weekday = Some(day);
                i += 1;
            } else if time.is_none() {
                let (parsed, used) = parse_time(token, tokens.get(i + 1).copied())?;
                time = Some(parsed);
                i += used;
            } else {
                return None;
            }
        }
        Some(ClockSpec {
            date,
            weekday,
            time: time?,
        })
    }

    /// The instant it names in `tz`, seen at `now` (see the module docs).
    fn resolve(self, tz: Zone, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // `now.with_timezone(&tz)` would panic at the ends of time.
        let offset = tz.offset_from_utc_datetime(&now.naive_utc()).fix();
        let today = now.naive_utc().checked_add_offset(offset)?.date();
        if let Some((month, day)) = self.date {
            return [-1, 0, 1]
                .iter()
                .filter_map(|dy| NaiveDate::from_ymd_opt(today.year() + dy, month, day))
                .filter_map(|date| localize(tz, date.and_time(self.time)))
                .min_by_key(|at| (*at - now).abs());
        }
        let days = (0..=8).filter_map(|d| today.checked_add_days(Days::new(d)));
        let mut candidates = days
            .filter(|date| self.weekday.is_none_or(|w| date.weekday() == w))
            .filter_map(|date| localize(tz, date.and_time(self.time)));
        let first = candidates.next()?;
        if first > now || now - first < JUST_PASSED {
            return Some(first);
        }
        candidates.next()
    }
}

/// Hours and minutes from `1pm`, `1:30pm`, `13:00`, or `1:30` + `pm`;
/// returns the time and how many tokens it used.
fn parse_time(token: &str, next: Option<&str>) -> Option<(NaiveTime, usize)> {
    let meridiem = |s: &str| match s.trim_end_matches('.') {
        "am" | "a.m" | "a" => Some(false),
        "pm" | "p.m" | "p" => Some(true),
        _ => None,
    };
    let digits_end = token
        .find(|c: char| !c.is_ascii_digit() && c != ':')
        .unwrap_or(token.len());
    let (number, suffix) = token.split_at(digits_end);
    let (pm, used) = if suffix.is_empty() {
        match next.and_then(meridiem) {
            Some(pm) => (Some(pm), 2),
            None => (None, 1),
        }
    } else {
        (Some(meridiem(suffix)?), 1)
    };
    let (hour, minute) = match number.split_once(':') {
        Some((h, m)) if m.len() == 2 => (h.parse::<u32>().ok()?, m.parse::<u32>().ok()?),
        Some(_) => return None,
        None => (number.parse::<u32>().ok()?, 0),
    };
    if number.is_empty() || minute > 59 {
        return None;
    }
    let hour = match pm {
        Some(pm) if (1..=12).contains(&hour) => hour % 12 + if pm { 12 } else { 0 },
        Some(_) => return None,
        // A 24-hour time needs its minutes: a bare "13" is no time.
        None if number.contains(':') && hour <= 23 => hour,
        None => return None,
    };
    Some((NaiveTime::from_hms_opt(hour, minute, 0)?, used))
}

fn month_of(token: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let token = token.trim_end_matches('.');
    if token.len() < 3 || !token.is_ascii() {
        return None;
    }
    let index = MONTHS.iter().position(|m| token.starts_with(m))?;
    // "sept" and full names, but not "mayday".
    const FULL: [&str; 12] = [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    ];
    (FULL[index].starts_with(token) || token == "sept").then_some(index as u32 + 1)
}

fn weekday_of(token: &str) -> Option<Weekday> {
    const DAYS: [(&str, Weekday); 7] = [
        ("monday", Weekday::Mon),
        ("tuesday", Weekday::Tue),
        ("wednesday", Weekday::Wed),
        ("thursday", Weekday::Thu),
        ("friday", Weekday::Fri),
        ("saturday", Weekday::Sat),
        ("sunday", Weekday::Sun),
    ];
    let token = token.trim_end_matches('.');
    if token.len() < 3 {
        return None;
    }
    DAYS.iter()
        .find(|(name, _)| name.starts_with(token))
        .map(|(_, day)| *day)
}

/// A wall-clock time in `tz` as an instant: a time a DST change skips is
/// read one hour later, one it repeats is the first.
fn localize(tz: Zone, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&wall) {
        LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Some(t.with_timezone(&Utc)),
        LocalResult::None => match tz
            .from_local_datetime(&wall.checked_add_signed(TimeDelta::hours(1))?)
        {
            LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Some(t.with_timezone(&Utc)),
            LocalResult::None => None,
        },
    }
}

/// `text` without `prefix`, compared ASCII-case-insensitively.
fn strip_ci<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// At most `max` bytes of `text`, cut on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// At most [`EVIDENCE_CHARS`] characters, with `…` if it was longer.
pub(super) fn truncate(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(EVIDENCE_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}
