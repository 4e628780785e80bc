//! The values of both blocks (confidence, risk, blockers) and the line and
//! Markdown helpers their scanners share.

use super::*;

// ---------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------

/// The seed's `1-5 scale`: a whole number from 1 to 5 at the start, maybe as
/// `4/5`, maybe followed by words (`4 (tests pass)`). A decimal, a range, a
/// percentage or another scale (`4.5`, `1-5`, `80%`, `4/10`) is not a level.
pub(super) fn parse_confidence(value: &str) -> Option<u8> {
    let value = unwrap_value(value).trim_start_matches(|c: char| !c.is_alphanumeric());
    let digits = value.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 3 {
        return None;
    }
    let level: u8 = value[..digits].parse().ok()?;
    let mut rest = &value[digits..];
    if let Some(scale) = rest.trim_start().strip_prefix('/') {
        let scale = scale.trim_start();
        let scale_digits = scale.bytes().take_while(u8::is_ascii_digit).count();
        if &scale[..scale_digits] != "5" {
            return None;
        }
        rest = &scale[scale_digits..];
    }
    let mut chars = rest.chars();
    match chars.next() {
        None => {}
        Some(c) if c.is_alphanumeric() || c == '%' => return None,
        Some('.' | ',' | '-' | '–' | '—' | '/')
            if chars.next().is_some_and(|d| d.is_ascii_digit()) =>
        {
            return None;
        }
        Some(_) => {}
    }
    (1..=5).contains(&level).then_some(level)
}

/// The seed's `[low | medium | high]`, in any case, maybe followed by words
/// (`Low (docs only)`). Two levels offered as alternatives (`low | medium |
/// high`, `low/medium`, `low or medium`) are not a level.
pub(super) fn parse_risk(value: &str) -> Option<RiskLevel> {
    let value = unwrap_value(value).trim_start_matches(|c: char| !c.is_alphabetic());
    let (word, rest) = split_word(value);
    let level = RiskLevel::from_word(word)?;
    let rest = rest.trim_start();
    let separated = rest.trim_start_matches(['|', '/', '-', '–', ',']);
    let mut alternative = separated.len() < rest.len();
    let mut next = separated.trim_start();
    if next
        .get(..3)
        .is_some_and(|or| or.eq_ignore_ascii_case("or "))
    {
        (alternative, next) = (true, next[3..].trim_start());
    }
    let offers_two = alternative && RiskLevel::from_word(split_word(next).0).is_some();
    (!offers_two).then_some(level)
}

/// The letters at the start of `text`, and the rest.
pub(super) fn split_word(text: &str) -> (&str, &str) {
    text.split_at(
        text.find(|c: char| !c.is_alphabetic())
            .unwrap_or(text.len()),
    )
}

/// `None`, `-`, `N/A`, `No blockers`, `None identified`, `None (all green)`:
/// nothing blocks. `None of the keys work` is a blocker.
pub(super) fn is_no_blocker(value: &str) -> bool {
    let value = unwrap_value(value)
        .trim()
        .trim_end_matches(['.', '!'])
        .trim();
    let lower = value.to_lowercase();
    const NONE: [&str; 12] = [
        "",
        "-",
        "–",
        "—",
        "n/a",
        "na",
        "nil",
        "null",
        "nothing",
        "no",
        "no blocker",
        "no blockers",
    ];
    if NONE.contains(&lower.as_str()) {
        return true;
    }
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric() && c != '/')
        .filter(|w| !w.is_empty())
        .collect();
    match words.as_slice() {
        ["none", "of", ..] => false,
        ["none", ..] | ["n/a", ..] | ["no", "blocker" | "blockers", ..] => true,
        [
            "no",
            "known" | "current" | "critical",
            "blocker" | "blockers" | "issues",
            ..,
        ] => true,
        _ => false,
    }
}

/// A value without the markdown around it: bold, italics, code, and the
/// seed template's `[...]` (`**4**`, `` `low` ``, `[None]`).
pub(super) fn unwrap_value(value: &str) -> &str {
    const WRAPS: [(&str, &str); 5] = [
        ("**", "**"),
        ("__", "__"),
        ("`", "`"),
        ("*", "*"),
        ("[", "]"),
    ];
    let mut value = value.trim();
    for _ in 0..4 {
        let inner = WRAPS.iter().find_map(|(open, close)| {
            let inner = value.strip_prefix(open)?.strip_suffix(close)?;
            (*open != "[" || !inner.contains(['[', ']'])).then_some(inner)
        });
        match inner {
            Some(inner) => value = inner.trim(),
            None => break,
        }
    }
    value
}

pub(super) fn first_word(value: &str) -> Option<&str> {
    let word = split_word(value.trim_start_matches(|c: char| !c.is_alphabetic())).0;
    (!word.is_empty()).then_some(word)
}

// ---------------------------------------------------------------------------
// Lines and markdown
// ---------------------------------------------------------------------------

/// Lines without their `\n` or `\r\n`.
pub(super) fn split_lines(text: &str) -> Vec<&str> {
    text.split('\n')
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .collect()
}

/// `s` without a leading list marker (`-`, `*`, `+`, `•`, `1.`, `1)`), if it
/// has one.
pub(super) fn strip_list_marker(s: &str) -> Option<&str> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let rest = match s.strip_prefix(['-', '*', '+', '•']) {
        Some(rest) => rest,
        None if (1..=3).contains(&digits) => s[digits..].strip_prefix(['.', ')'])?,
        None => return None,
    };
    (rest.is_empty() || rest.starts_with([' ', '\t'])).then_some(rest)
}

/// A markdown heading (`## …`), or a line that is only the words Context
/// Summary (bold, with a colon, with `Block`): `Some(true)` when it names the
/// Context Summary.
pub(super) fn heading(trimmed: &str) -> Option<bool> {
    let hashes = trimmed.bytes().take_while(|&b| b == b'#').count();
    if hashes == 0 {
        return (trimmed.len() <= 80 && names_context_summary(trimmed, false)).then_some(true);
    }
    let title = &trimmed[hashes..];
    let ok = hashes <= 6 && (title.is_empty() || title.starts_with([' ', '\t']));
    ok.then(|| names_context_summary(title, true))
}

/// The words of `title` are "context summary" (then anything, when it is a
/// `#` heading; only "block" otherwise). Emoji, numbering and markdown
/// around them do not count.
pub(super) fn names_context_summary(title: &str, then_anything: bool) -> bool {
    if title.len() > 200 {
        return false;
    }
    let words: Vec<String> = title
        .split(|c: char| !c.is_alphabetic())
        .filter(|w| !w.is_empty())
        .take(4)
        .map(str::to_lowercase)
        .collect();
    match words.as_slice() {
        [context, summary, rest @ ..] if context == "context" && summary == "summary" => {
            then_anything || rest.is_empty() || rest == ["block"]
        }
        _ => false,
    }
}

pub(super) fn is_fence(trimmed: &str) -> bool {
    trimmed.starts_with("```") || trimmed.starts_with("~~~")
}

/// A thematic break: `---`, `***`, `___`, `- - -`.
pub(super) fn is_rule(trimmed: &str) -> bool {
    let mut marks = trimmed.chars().filter(|c| !c.is_whitespace());
    let first = marks.next();
    matches!(first, Some('-' | '*' | '_'))
        && marks
            .try_fold(1, |n, c| (Some(c) == first).then_some(n + 1))
            .is_some_and(|n| n >= 3)
}

/// `Key: value` with the key bold or plain: `**Goal**: x`, `**Goal:** x`,
/// `Goal: x`. A plain key needs a space after the colon, so that `10:30`
/// and `https://` are not keys.
pub(super) fn key_value(body: &str) -> Option<(String, &str)> {
    let (before, mut after) = body.split_once(':')?;
    let marker = ["**", "__", "*", "_", "`"]
        .into_iter()
        .find(|m| before.trim_start().starts_with(m));
    match marker {
        Some(marker) => after = after.strip_prefix(marker).unwrap_or(after),
        None if !(after.is_empty() || after.starts_with(char::is_whitespace)) => return None,
        None => {}
    }
    let key: String = before.chars().filter(|c| !matches!(c, '*' | '`')).collect();
    let key = key.trim().trim_matches('_').trim();
    let key_ok = (1..=KEY_MAX_CHARS).contains(&key.chars().count())
        && key.starts_with(char::is_alphabetic)
        && key.chars().all(|c| {
            c.is_alphanumeric() || matches!(c, ' ' | '_' | '-' | '/' | '(' | ')' | '&' | '\'' | '.')
        })
        && key.split_whitespace().count() <= KEY_MAX_WORDS;
    key_ok.then(|| (key.to_string(), after.trim()))
}

/// `Current_State`, `current-state`, `Confidence (1-5)` → `current state`,
/// `current state`, `confidence`.
pub(super) fn normalize_key(key: &str) -> String {
    let key = key
        .split('(')
        .next()
        .unwrap_or(key)
        .to_lowercase()
        .replace(['_', '-'], " ");
    key.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Several lines as one: joined with `; ` (or a space after punctuation),
/// whitespace runs made one space.
pub(super) fn one_line(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if line.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push_str(if out.ends_with(['.', ';', ':', '!', '?', ',']) {
                " "
            } else {
                "; "
            });
        }
        out.push_str(&line);
    }
    out
}

/// At most `limit` characters, the last one `…` when cut.
pub(super) fn truncate_chars(text: &str, limit: usize) -> String {
    if text.chars().nth(limit).is_none() {
        return text.to_string();
    }
    let cut = text
        .char_indices()
        .nth(limit.saturating_sub(1))
        .map_or(text.len(), |(i, _)| i);
    format!("{}…", &text[..cut])
}

/// `Vec<(String, String)>` as a JSON object, keeping the order.
pub(super) mod pairs {
    use serde::ser::SerializeMap;
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_json::{Map, Value};

    pub fn serialize<S: Serializer>(pairs: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(pairs.len()))?;
        for (key, value) in pairs {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
        let map = Map::<String, Value>::deserialize(d)?;
        let text = |value| match value {
            Value::String(text) => text,
            other => other.to_string(),
        };
        Ok(map
            .into_iter()
            .map(|(key, value)| (key, text(value)))
            .collect())
    }
}
