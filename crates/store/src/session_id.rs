//! Session ids as path components. The store makes them
//! (`YYYYMMDD-HHMMSS`, then `-2`, `-3`, … in one second); every id read
//! back from a file (session.json, the journal, the daemon's records) or a
//! command line passes [`check`] before it names a path
//! (`inbox/.claimed/ID/`, `sessions/ID.log`, a worktree): an id such as
//! `..` or `../processed` written into session.json must never make a
//! recovery return every processed message, or a web view read a file
//! outside the agent's directory.

use serde::{Deserialize, Deserializer};

/// The longest id accepted (the store's are 15–20 characters).
pub const MAX_LEN: usize = 64;

/// Why `id` is not a session id; `None` if it is one: 1–64 ASCII letters,
/// digits, `-` and `_`, starting with a letter or a digit (one path
/// component, and one NATS subject token). Pure.
pub fn problem(id: &str) -> Option<&'static str> {
    if id.is_empty() {
        Some("it is empty")
    } else if id.len() > MAX_LEN {
        Some("it is longer than 64 characters")
    } else if !id.as_bytes()[0].is_ascii_alphanumeric() {
        Some("it does not start with a letter or a digit")
    } else if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        Some("it has a character other than letters, digits, '-' and '_'")
    } else {
        None
    }
}

/// Is `id` a session id ([`problem`])?
pub fn is_valid(id: &str) -> bool {
    problem(id).is_none()
}

/// `id`, or an error that names it and why it is refused.
pub fn check(id: &str) -> crate::error::Result<&str> {
    match problem(id) {
        None => Ok(id),
        Some(why) => Err(crate::error::Error::Data(format!(
            "{id:?} is not a session id ({why}); session ids look like 20260331-220000 or 20260331-220000-2"
        ))),
    }
}

/// serde's `deserialize_with` for a state file's `session_id`: a valid id,
/// or empty (no session yet); anything else makes the document (or the
/// journal line) unreadable, never a path.
pub fn de<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let id = String::deserialize(d)?;
    match problem(&id) {
        Some(why) if !id.is_empty() => Err(serde::de::Error::custom(format!(
            "session_id {id:?} is not a session id ({why})"
        ))),
        _ => Ok(id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_the_store_makes_pass_and_path_tricks_do_not() {
        let table: &[(&str, bool)] = &[
            ("20260331-220000", true),
            ("20260331-220000-2", true),
            ("s1", true),
            ("flow_step-3", true),
            ("", false),
            (".", false),
            ("..", false),
            ("../processed", false),
            ("a/b", false),
            ("-rf", false),
            (".hidden", false),
            ("20260331 220000", false),
            ("id\n", false),
            ("ü", false),
            (&"9".repeat(64), true),
            (&"9".repeat(65), false),
        ];
        for (id, ok) in table {
            assert_eq!(is_valid(id), *ok, "{id:?}");
            assert_eq!(check(id).is_ok(), *ok, "{id:?}");
        }
        let refused = check("../processed").unwrap_err().to_string();
        assert!(
            refused.contains("\"../processed\" is not a session id"),
            "{refused}"
        );
    }

    #[test]
    fn a_state_file_id_is_valid_or_empty() {
        #[derive(serde::Deserialize)]
        struct Doc {
            #[serde(deserialize_with = "de")]
            session_id: String,
        }
        let parse = |t: &str| serde_json::from_str::<Doc>(t).map(|d| d.session_id);
        assert_eq!(parse(r#"{"session_id":""}"#).unwrap(), "");
        assert_eq!(
            parse(r#"{"session_id":"20260101-000000"}"#).unwrap(),
            "20260101-000000"
        );
        let e = parse(r#"{"session_id":"../processed"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a session id"), "{e}");
    }
}
