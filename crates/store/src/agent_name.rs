//! Agent names: the one place a name from the outside world is checked.
//!
//! A name becomes a directory under the state root, so anything that could
//! escape it (`/`, `..`), hide it (a leading dot) or collide with another on a
//! case-insensitive copy (uppercase) is refused here, before any path is built.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Longest accepted name: `^[a-z][a-z0-9_-]{0,62}$`.
pub const MAX_LEN: usize = 63;

/// Names that mean something else on the command line.
const RESERVED: &[&str] = &["all"];

/// A validated agent name. The only way to build one is [`AgentName::parse`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AgentName(String);

impl AgentName {
    pub fn parse(name: &str) -> Result<Self, Error> {
        match problem(name) {
            None => Ok(AgentName(name.to_string())),
            Some(reason) => Err(Error::InvalidName {
                name: name.to_string(),
                reason,
            }),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `rio` → `Rio`, as memory.md headings and flag lines write names.
    pub fn title(&self) -> String {
        title_case(&self.0)
    }
}

pub fn title_case(name: &str) -> String {
    let mut chars = name.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Why `name` is not a valid agent name, or `None` if it is.
pub fn problem(name: &str) -> Option<String> {
    let fix = "names match ^[a-z][a-z0-9_-]{0,62}$, e.g. `rio`";
    if name.is_empty() {
        return Some(format!("the name is empty; {fix}"));
    }
    if name.contains('/') || name.contains('\\') {
        return Some(format!(
            "contains a path separator, which would leave the state root; {fix}"
        ));
    }
    if name == "." || name == ".." || name.contains("..") {
        return Some(format!("`..` would leave the state root; {fix}"));
    }
    if name.starts_with('.') {
        return Some(format!(
            "names starting with `.` are reserved for daemon files (.daemon, .shared); {fix}"
        ));
    }
    if name.chars().any(|c| c.is_uppercase()) {
        return Some(format!(
            "uppercase letters are not allowed; use `{}`",
            name.to_lowercase()
        ));
    }
    if name.len() > MAX_LEN {
        return Some(format!("longer than {MAX_LEN} characters; {fix}"));
    }
    let first = name.chars().next().unwrap_or(' ');
    if !first.is_ascii_lowercase() {
        return Some(format!("must start with a letter a-z; {fix}"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == '-'))
    {
        return Some(format!("character {bad:?} is not allowed; {fix}"));
    }
    if RESERVED.contains(&name) {
        return Some(format!(
            "`{name}` is reserved (`send --to all` addresses every agent)"
        ));
    }
    None
}

impl TryFrom<String> for AgentName {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        match problem(&value) {
            None => Ok(AgentName(value)),
            Some(reason) => Err(format!("invalid agent name {value:?}: {reason}")),
        }
    }
}

impl From<AgentName> for String {
    fn from(value: AgentName) -> String {
        value.0
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for AgentName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names() {
        for name in ["rio", "theseus", "a", "agent_2", "x-y", &"a".repeat(63)] {
            assert!(problem(name).is_none(), "{name} should be valid");
        }
    }

    #[test]
    fn refuses_hostile_names() {
        let cases = [
            ("", "empty"),
            ("../etc", "path separator"),
            ("..", "`..`"),
            ("a/b", "path separator"),
            (".daemon", "reserved for daemon"),
            (".hidden", "reserved for daemon"),
            ("Rio", "uppercase"),
            ("1rio", "start with a letter"),
            ("rio cat", "not allowed"),
            ("rïo", "not allowed"),
            ("all", "reserved"),
        ];
        for (name, why) in cases {
            let got = problem(name).unwrap_or_else(|| panic!("{name:?} accepted"));
            assert!(got.contains(why), "{name:?}: {got}");
        }
        assert!(problem(&"a".repeat(64)).unwrap().contains("longer"));
    }
}
