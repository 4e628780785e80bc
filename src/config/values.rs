//! The values the file writes as text or numbers: durations (`"90m"`),
//! byte sizes (`"10MiB"`), bounded counts, group and credential names, and
//! a command's `{placeholder}`s. Each is parsed here, once; a bad one is a
//! problem with its field, and the default stands in so checking goes on.

use std::time::Duration;

use super::Validator;

impl Validator {
    /// A whole number in `range`: the value, else the inherited one, else
    /// the default.
    pub(super) fn count(
        &mut self,
        field: &str,
        value: Option<i64>,
        inherited: Option<u32>,
        default: u32,
        range: std::ops::RangeInclusive<i64>,
    ) -> u32 {
        match (value, inherited) {
            (None, Some(n)) => n,
            (None, None) => default,
            (Some(n), _) if range.contains(&n) => n as u32,
            (Some(n), _) => {
                self.problem(
                    field,
                    format!("{n} is not between {} and {}", range.start(), range.end()),
                );
                default
            }
        }
    }

    /// A length of time, at most [`crate::clock::MAX_DURATION`].
    pub(super) fn duration(&mut self, field: &str, value: Option<&str>, default: &str) -> Duration {
        let text = value.unwrap_or(default);
        match crate::clock::parse_duration(text) {
            Ok(d) => d,
            Err(e) => {
                self.problem(field, e);
                crate::clock::parse_duration(default).unwrap_or_default()
            }
        }
    }

    pub(super) fn size(&mut self, field: &str, value: Option<&str>, default: &str) -> u64 {
        let text = value.unwrap_or(default);
        match parse_size(text) {
            Ok(n) => n,
            Err(e) => {
                self.problem(field, e);
                parse_size(default).unwrap_or(0)
            }
        }
    }
}

/// A Unix group or credential name: letters, digits, `-` and `_`, at most
/// 32, not led by `-`.
pub(crate) fn valid_group(g: &str) -> bool {
    !g.is_empty()
        && g.len() <= 32
        && g.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !g.starts_with('-')
}

/// A unix user name as `useradd` accepts it by default: `[a-z_][a-z0-9_-]*`,
/// an optional final `$`, at most 32 characters.
pub fn check_user_name(name: &str) -> Result<(), &'static str> {
    let body = name.strip_suffix('$').unwrap_or(name);
    let mut chars = body.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    if name.is_empty() || name.len() > 32 {
        return Err("is not a unix user name (1 to 32 characters)");
    }
    if !first_ok
        || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    {
        return Err("is not a unix user name ([a-z_][a-z0-9_-]*)");
    }
    Ok(())
}

/// `{name}` placeholders in a command argument.
pub fn placeholders(arg: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = arg;
    while let Some(start) = rest.find('{') {
        match rest[start..].find('}') {
            Some(end) => {
                out.push(rest[start + 1..start + end].to_string());
                rest = &rest[start + end + 1..];
            }
            None => break,
        }
    }
    out
}

/// Parse a byte size: `10MiB`, `500 MiB`, `1GiB`, `4096`, `1MB` (SI).
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let multiplier: u64 = match unit {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => {
            return Err(SizeError::UnknownUnit {
                text: text.to_string(),
                unit: unit.to_string(),
            });
        }
    };
    let value: f64 = num.parse().map_err(|_| SizeError::NotASize {
        text: text.to_string(),
    })?;
    Ok((value * multiplier as f64) as u64)
}

/// A byte size that does not read, and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("{text:?} has an unknown unit {unit:?}; write e.g. \"10MiB\", \"1GiB\", \"500MiB\"")]
    UnknownUnit { text: String, unit: String },
    #[error("{text:?} is not a size; write e.g. \"10MiB\", \"1GiB\"")]
    NotASize { text: String },
}

/// Callers that still carry their errors as text.
impl From<SizeError> for String {
    fn from(e: SizeError) -> Self {
        e.to_string()
    }
}
