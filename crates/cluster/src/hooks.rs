//! A session's hook calls from a worker host (issue 24): `session
//! begin|end|fail`, `record` and `send`, forwarded to the controller, the
//! only writer of the state root.
//!
//! The path of one call:
//!
//! 1. the session's script runs `agent-state session end rio …` on the
//!    worker; the CLI sees `AGENT_STATE_HOOKS` (a Unix socket of the
//!    worker's, private to it) and sends the parsed call ([`HookCall`]:
//!    the subcommand, its options by long name, its positional words, a
//!    bounded stdin) there instead of touching a state root;
//! 2. the worker stamps it with what it holds: the order's agent, the
//!    agent's session id, the order id, its host name and the lease
//!    revision ([`HookRequest`]), and sends it as a NATS request on
//!    [`subject`] (`<output_stream>.hooks.<agent>`: beside the output
//!    stream's subjects, never stored);
//! 3. the controller accepts it only if the lease `run/<agent>` is held by
//!    that worker for that order at that revision ([`check_lease`]), and
//!    only a hook subcommand with its own options, for the order's agent
//!    and session ([`check_call`], which also builds the command line:
//!    the agent and the session are the order's, whatever the call said);
//!    then runs the hook as the local runner's script would and answers
//!    with its exit code, stdout and stderr ([`HookAnswer`]).
//!
//! Everything here is pure: the decisions are table-tested, the IO is the
//! worker's and the controller's.

use serde::{Deserialize, Serialize};

use crate::config::ClusterSettings;
use crate::lease::LeaseRecord;

mod rate;
pub use rate::{CallBudget, CallRate, RateError};

/// The most a call's stdin (`send --body-file -`) may hold: below NATS's
/// default 1 MiB payload with the rest of the request.
pub const MAX_STDIN: usize = 768 << 10;
/// The most words (options and positionals) a call may have.
pub const MAX_WORDS: usize = 256;
/// The longest single word.
pub const MAX_WORD_BYTES: usize = 64 << 10;
/// The most a whole request may take, encoded.
pub const MAX_REQUEST_BYTES: usize = 960 << 10;
/// The most of a hook's stdout and of its stderr an answer carries.
pub const MAX_OUTPUT_BYTES: usize = 64 << 10;

/// The environment variable that names the worker's socket for a session's
/// hook calls.
pub const HOOKS_ENV: &str = "AGENT_STATE_HOOKS";

/// sysexits: the catalogue's "try again" (the controller cannot be
/// reached), "usage" (not a hook, a bad word) and "permission denied" (not
/// this session's to do).
pub const EXIT_TEMPFAIL: u8 = 75;
pub const EXIT_USAGE: u8 = 64;
pub const EXIT_NOPERM: u8 = 77;

/// A hook subcommand a session may call from a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Begin,
    End,
    Fail,
    Record,
    Send,
}

impl Hook {
    /// The hook a command's words name (`["session", "end"]`), if any.
    pub fn of(command: &[String]) -> Option<Hook> {
        let words: Vec<&str> = command.iter().map(String::as_str).collect();
        match words.as_slice() {
            ["session", "begin"] => Some(Hook::Begin),
            ["session", "end"] => Some(Hook::End),
            ["session", "fail"] => Some(Hook::Fail),
            ["record"] => Some(Hook::Record),
            ["send"] => Some(Hook::Send),
            _ => None,
        }
    }

    pub fn words(self) -> &'static [&'static str] {
        match self {
            Hook::Begin => &["session", "begin"],
            Hook::End => &["session", "end"],
            Hook::Fail => &["session", "fail"],
            Hook::Record => &["record"],
            Hook::Send => &["send"],
        }
    }

    /// The options a call may carry (long names). The session's own
    /// (`--join`, `--session`) and `--owner-pid` are the controller's to
    /// set; `--config` is never a caller's.
    pub fn options(self) -> &'static [&'static str] {
        match self {
            Hook::Begin => &[
                "type",
                "branch",
                "model",
                "timeout",
                "research-question",
                "belief-targeted",
                "disconfirmation-target",
                "sources-expected",
            ],
            Hook::End => &[
                "outcome",
                "sources-archived",
                "branch",
                "pr",
                "summary",
                "next-priority",
                "handoff-notes",
                "tokens-used",
                "cost-usd",
            ],
            Hook::Fail => &["outcome", "reason"],
            Hook::Record => &[
                "claims-proposed",
                "claims-accepted",
                "claims-challenged",
                "claims-rejected",
                "disconfirmation-hits",
            ],
            Hook::Send => &[
                "from",
                "to",
                "type",
                "priority",
                "subject",
                "body",
                "body-file",
                "source-ref",
                "expires-in",
            ],
        }
    }

    /// `session end` and `fail` never fail a script for want of the
    /// controller: they warn and exit 0 (the daemon records the end when
    /// the session's process exits).
    pub fn lenient(self) -> bool {
        matches!(self, Hook::End | Hook::Fail)
    }

    pub fn name(self) -> String {
        self.words().join(" ")
    }
}

/// One hook call as the CLI parsed it on the worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookCall {
    /// The subcommand's words: `["session", "begin"]`, `["record"]`.
    pub command: Vec<String>,
    /// Options by long name, with their values, as given.
    pub options: Vec<(String, String)>,
    /// The positional words (the agent first, where the hook has one).
    pub positionals: Vec<String>,
    /// What the hook reads on stdin (`send --body-file -`).
    pub stdin: Option<String>,
}

/// A call as the worker forwards it, stamped with what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookRequest {
    pub call: HookCall,
    /// The order's agent.
    pub agent: String,
    /// The agent's session id (the order's `AGENT_STATE_SESSION_ID`).
    pub session: String,
    /// The order id (the lease's `session`).
    pub order: String,
    /// The worker's host name (the lease's holder).
    pub holder: String,
    /// The lease revision the worker holds.
    pub lease_revision: u64,
}

/// What comes back to the CLI.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum HookAnswer {
    /// The hook ran on the controller: print these, exit with `code`.
    Ran {
        code: u8,
        stdout: String,
        stderr: String,
    },
    /// The controller (or the worker) refused it: nothing changed.
    Refused { code: u8, reason: String },
    /// The controller could not be reached, or did not answer.
    Unreachable { reason: String },
}

/// Why a call is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "`{0}` is not a hook a session on a worker may call (session begin|end|fail, record, send)"
    )]
    NotAHook(String),
    #[error("`{hook}` takes no option --{option} from a session on a worker")]
    Option { hook: String, option: String },
    #[error("a session of {agent} acts only for {agent}: `{hook}` names {named:?} (the {what})")]
    OtherAgent {
        hook: String,
        agent: String,
        named: String,
        what: &'static str,
    },
    #[error("a session on a worker ends only its own session {session}: --session names {named:?}")]
    OtherSession { session: String, named: String },
    #[error("`{hook}` takes {expected} positional word(s) here, not {given}")]
    Positionals {
        hook: String,
        expected: &'static str,
        given: usize,
    },
    #[error(
        "send --body-file {0:?}: a session on a worker sends a body from a file through its stdin (--body-file -), never a path on the controller"
    )]
    BodyFile(String),
    #[error("the call is too big: {what} over {limit} bytes")]
    TooBig { what: String, limit: usize },
    #[error("the order id {order:?} does not belong to agent {agent}'s session {session}")]
    Order {
        order: String,
        agent: String,
        session: String,
    },
    #[error("the lease run/{agent} is not held: the session is over or was stopped")]
    NoLease { agent: String },
    #[error(
        "the lease run/{agent} is held by {holder} for {held_for}, not by {caller} for {order}: the session is over or was stopped"
    )]
    NotHolder {
        agent: String,
        holder: String,
        held_for: String,
        caller: String,
        order: String,
    },
    #[error(
        "the lease run/{agent} has revision {current}, not {sent}: this worker no longer holds it as it said"
    )]
    StaleRevision {
        agent: String,
        sent: u64,
        current: u64,
    },
    #[error("the request is not one: {0}")]
    Malformed(String),
    #[error(
        "too many hook calls from this session: {burst} at once, then one every {every}; call again in {wait}"
    )]
    TooManyCalls {
        burst: u32,
        every: String,
        wait: String,
    },
}

impl Refusal {
    /// The exit code the CLI exits with.
    pub fn code(&self) -> u8 {
        match self {
            Refusal::NotAHook(_)
            | Refusal::Option { .. }
            | Refusal::Positionals { .. }
            | Refusal::BodyFile(_)
            | Refusal::TooBig { .. }
            | Refusal::Malformed(_) => EXIT_USAGE,
            Refusal::OtherAgent { .. }
            | Refusal::OtherSession { .. }
            | Refusal::Order { .. }
            | Refusal::NoLease { .. }
            | Refusal::NotHolder { .. }
            | Refusal::StaleRevision { .. } => EXIT_NOPERM,
            Refusal::TooManyCalls { .. } => EXIT_TEMPFAIL,
        }
    }

    pub fn answer(&self) -> HookAnswer {
        HookAnswer::Refused {
            code: self.code(),
            reason: self.to_string(),
        }
    }
}

/// The NATS subject hook calls for `agent` go to.
pub fn subject(settings: &ClusterSettings, agent: &str) -> String {
    format!("{}.hooks.{agent}", settings.output_stream)
}

/// The subject the controller listens on (every agent).
pub fn subject_all(settings: &ClusterSettings) -> String {
    format!("{}.hooks.*", settings.output_stream)
}

/// Checks a request against the lease as the controller reads it now
/// (`None`: nobody holds it).
pub fn check_lease(req: &HookRequest, current: Option<&LeaseRecord>) -> Result<(), Refusal> {
    if !crate::order_of_session(&req.order, &req.agent, &req.session) {
        return Err(Refusal::Order {
            order: req.order.clone(),
            agent: req.agent.clone(),
            session: req.session.clone(),
        });
    }
    let Some(current) = current else {
        return Err(Refusal::NoLease {
            agent: req.agent.clone(),
        });
    };
    if current.value.holder != req.holder || current.value.session != req.order {
        return Err(Refusal::NotHolder {
            agent: req.agent.clone(),
            holder: current.value.holder.clone(),
            held_for: current.value.session.clone(),
            caller: req.holder.clone(),
            order: req.order.clone(),
        });
    }
    if current.revision != req.lease_revision {
        return Err(Refusal::StaleRevision {
            agent: req.agent.clone(),
            sent: req.lease_revision,
            current: current.revision,
        });
    }
    Ok(())
}

/// Checks a call for `agent`'s session `session` and returns the command
/// line to run it with (after the program and `--config`): the hook's
/// words, its options as `--name=value`, the session forced, `--`, the
/// positional words.
pub fn check_call(call: &HookCall, agent: &str, session: &str) -> Result<Vec<String>, Refusal> {
    let hook = Hook::of(&call.command).ok_or_else(|| Refusal::NotAHook(call.command.join(" ")))?;
    let name = hook.name();
    let words = call.options.len() + call.positionals.len();
    if words > MAX_WORDS {
        return Err(Refusal::TooBig {
            what: format!("{words} words"),
            limit: MAX_WORDS,
        });
    }
    if call.stdin.as_ref().is_some_and(|s| s.len() > MAX_STDIN) {
        return Err(Refusal::TooBig {
            what: "its stdin".into(),
            limit: MAX_STDIN,
        });
    }
    for word in call
        .options
        .iter()
        .flat_map(|(k, v)| [k, v])
        .chain(&call.positionals)
    {
        if word.len() > MAX_WORD_BYTES {
            return Err(Refusal::TooBig {
                what: format!("a word of {} bytes", word.len()),
                limit: MAX_WORD_BYTES,
            });
        }
        if word.contains('\0') {
            return Err(Refusal::Malformed("a word holds a NUL byte".into()));
        }
    }
    let mut argv: Vec<String> = hook.words().iter().map(|w| w.to_string()).collect();
    for (option, value) in &call.options {
        match (hook, option.as_str()) {
            (Hook::End | Hook::Fail, "session") => {
                if value != session {
                    return Err(Refusal::OtherSession {
                        session: session.to_string(),
                        named: value.clone(),
                    });
                }
                continue;
            }
            (Hook::Send, "from") if value != agent => {
                return Err(Refusal::OtherAgent {
                    hook: name,
                    agent: agent.to_string(),
                    named: value.clone(),
                    what: "sender, --from",
                });
            }
            (Hook::Send, "body-file") if value != "-" => {
                return Err(Refusal::BodyFile(value.clone()));
            }
            _ => {}
        }
        if !hook.options().contains(&option.as_str()) {
            return Err(Refusal::Option {
                hook: name,
                option: option.clone(),
            });
        }
        argv.push(format!("--{option}={value}"));
    }
    match hook {
        Hook::Begin => argv.push(format!("--join={session}")),
        Hook::End | Hook::Fail => argv.push(format!("--session={session}")),
        Hook::Record | Hook::Send => {}
    }
    let (expected, fits) = match hook {
        Hook::Begin | Hook::End | Hook::Fail => ("1 (the agent)", call.positionals.len() == 1),
        Hook::Record => ("at least 1 (the agent)", !call.positionals.is_empty()),
        Hook::Send => ("no", call.positionals.is_empty()),
    };
    if !fits {
        return Err(Refusal::Positionals {
            hook: name,
            expected,
            given: call.positionals.len(),
        });
    }
    if let Some(named) = call.positionals.first()
        && hook != Hook::Send
    {
        if named != agent {
            return Err(Refusal::OtherAgent {
                hook: name,
                agent: agent.to_string(),
                named: named.clone(),
                what: "agent",
            });
        }
        argv.push("--".into());
        argv.extend(call.positionals.iter().cloned());
    }
    Ok(argv)
}

/// What the CLI says and exits with when the controller cannot be reached:
/// `begin`, `record` and `send` fail with "try again" (75); `session end`
/// and `fail` warn and exit 0 (the daemon records the session's end when
/// its process exits). The message, whether it is a warning, the code.
pub fn unreachable(hook: Hook, reason: &str) -> (String, bool, u8) {
    if hook.lenient() {
        (
            format!(
                "`{}` could not reach the controller ({reason}); not recorded by this call: the controller records the session's end when its process exits",
                hook.name()
            ),
            true,
            0,
        )
    } else {
        (
            format!(
                "`{}` could not reach the controller ({reason}); nothing was changed: try again",
                hook.name()
            ),
            false,
            EXIT_TEMPFAIL,
        )
    }
}

/// `text` cut to at most `max` bytes at a character boundary, saying so.
pub fn bounded(text: &[u8], max: usize) -> String {
    if text.len() <= max {
        return String::from_utf8_lossy(text).into_owned();
    }
    let mut end = max;
    let s = String::from_utf8_lossy(&text[..end]).into_owned();
    // A character cut in two is one replacement character; drop it.
    if s.ends_with('\u{FFFD}') {
        end = s.len() - '\u{FFFD}'.len_utf8();
    } else {
        end = s.len();
    }
    format!(
        "{}\n[… {} more bytes not forwarded]\n",
        &s[..end],
        text.len() - max
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseValue;

    fn call(command: &str, options: &[(&str, &str)], positionals: &[&str]) -> HookCall {
        HookCall {
            command: command.split(' ').map(String::from).collect(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            positionals: positionals.iter().map(|s| s.to_string()).collect(),
            stdin: None,
        }
    }

    #[test]
    fn only_hooks_for_the_orders_agent_and_session_are_run() {
        let s = "20261127-120000";
        // (call, Ok(argv) or Err(code, a word of the reason))
        type Row = (HookCall, Result<&'static str, (u8, &'static str)>);
        let table: Vec<Row> = vec![
            (
                call("session begin", &[("type", "research")], &["rio"]),
                Ok("session begin --type=research --join=20261127-120000 -- rio"),
            ),
            (
                call("session end", &[("summary", "done -- ok")], &["rio"]),
                Ok("session end --summary=done -- ok --session=20261127-120000 -- rio"),
            ),
            // Its own session, named: fine; another: refused.
            (
                call(
                    "session fail",
                    &[("session", s), ("outcome", "error"), ("reason", "x")],
                    &["rio"],
                ),
                Ok("session fail --outcome=error --reason=x --session=20261127-120000 -- rio"),
            ),
            (
                call("session end", &[("session", "20261127-110000")], &["rio"]),
                Err((77, "only its own session")),
            ),
            (
                call(
                    "record",
                    &[("claims-proposed", "2")],
                    &["rio", "orient", "k=-1"],
                ),
                Ok("record --claims-proposed=2 -- rio orient k=-1"),
            ),
            (
                call(
                    "send",
                    &[
                        ("from", "rio"),
                        ("to", "theseus"),
                        ("subject", "hi"),
                        ("body-file", "-"),
                    ],
                    &[],
                ),
                Ok("send --from=rio --to=theseus --subject=hi --body-file=-"),
            ),
            // Another agent's name, as the hook's agent or the sender.
            (
                call("session end", &[], &["theseus"]),
                Err((77, "acts only for rio")),
            ),
            (
                call("record", &[], &["theseus"]),
                Err((77, "names \"theseus\"")),
            ),
            (
                call("send", &[("from", "theseus"), ("to", "rio")], &[]),
                Err((77, "sender")),
            ),
            // A file on the controller is not a session's to read.
            (
                call(
                    "send",
                    &[("from", "rio"), ("body-file", "/etc/passwd")],
                    &[],
                ),
                Err((64, "--body-file \"/etc/passwd\"")),
            ),
            // Not a hook; an option the hook does not take here.
            (
                call("stop", &[], &["rio"]),
                Err((64, "`stop` is not a hook")),
            ),
            (call("session keep", &[], &["x"]), Err((64, "not a hook"))),
            (
                call("session begin", &[("config", "/tmp/other.toml")], &["rio"]),
                Err((64, "no option --config")),
            ),
            (
                call("session begin", &[("owner-pid", "1")], &["rio"]),
                Err((64, "--owner-pid")),
            ),
            (call("session begin", &[], &[]), Err((64, "1 (the agent)"))),
            (
                call("send", &[("from", "rio")], &["x"]),
                Err((64, "no positional")),
            ),
        ];
        for (i, (c, want)) in table.into_iter().enumerate() {
            let got = check_call(&c, "rio", s);
            match (got, want) {
                (Ok(argv), Ok(line)) => assert_eq!(argv.join(" "), line, "row {i}"),
                (Err(e), Err((code, word))) => {
                    assert_eq!(e.code(), code, "row {i}: {e}");
                    assert!(e.to_string().contains(word), "row {i}: {e}");
                }
                (got, want) => panic!("row {i}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn oversized_calls_are_refused() {
        let mut c = call("record", &[], &["rio"]);
        c.positionals
            .extend((0..MAX_WORDS).map(|i| format!("k{i}=1")));
        assert!(matches!(
            check_call(&c, "rio", "s"),
            Err(Refusal::TooBig { .. })
        ));
        let c = call(
            "send",
            &[("from", "rio"), ("body", &"x".repeat(MAX_WORD_BYTES + 1))],
            &[],
        );
        assert!(matches!(
            check_call(&c, "rio", "s"),
            Err(Refusal::TooBig { .. })
        ));
        let mut c = call("send", &[("from", "rio"), ("body-file", "-")], &[]);
        c.stdin = Some("x".repeat(MAX_STDIN + 1));
        let e = check_call(&c, "rio", "s").unwrap_err();
        assert!(e.to_string().contains("stdin"), "{e}");
        c.stdin = Some("x".repeat(MAX_STDIN));
        assert!(check_call(&c, "rio", "s").is_ok());
    }

    #[test]
    fn only_the_lease_holder_at_its_revision_is_heard() {
        let req = HookRequest {
            call: call("record", &[], &["rio"]),
            agent: "rio".into(),
            session: "20261127-120000".into(),
            order: "rio_20261127-120000".into(),
            holder: "w1".into(),
            lease_revision: 7,
        };
        let lease = |holder: &str, session: &str, revision: u64| LeaseRecord {
            value: LeaseValue {
                holder: holder.into(),
                session: session.into(),
                renewal: 3,
                run: String::new(),
            },
            revision,
        };
        let with = |f: &dyn Fn(&mut HookRequest)| {
            let mut r = req.clone();
            f(&mut r);
            r
        };
        // (request, lease now, refused with a word of the reason)
        let table: Vec<(HookRequest, Option<LeaseRecord>, Option<&str>)> = vec![
            (
                req.clone(),
                Some(lease("w1", "rio_20261127-120000", 7)),
                None,
            ),
            (
                with(&|r| r.order = "rio_20261127-120000-it2".into()),
                Some(lease("w1", "rio_20261127-120000-it2", 7)),
                None,
            ),
            (
                req.clone(),
                Some(lease("w1", "rio_20261127-120000", 9)),
                Some("revision 9, not 7"),
            ),
            (req.clone(), None, Some("not held")),
            (
                req.clone(),
                Some(lease("w2", "rio_20261127-120000", 7)),
                Some("held by w2"),
            ),
            (
                req.clone(),
                Some(lease("w1", "rio_20261127-130000", 7)),
                Some("for rio_20261127-130000"),
            ),
            // The order must be the agent's session's: a worker cannot
            // speak for theseus with rio's lease.
            (
                with(&|r| r.agent = "theseus".into()),
                Some(lease("w1", "rio_20261127-120000", 7)),
                Some("does not belong"),
            ),
            (
                with(&|r| r.session = "20261127-110000".into()),
                Some(lease("w1", "rio_20261127-120000", 7)),
                Some("does not belong"),
            ),
        ];
        for (i, (r, current, refused)) in table.into_iter().enumerate() {
            let got = check_lease(&r, current.as_ref());
            match (got, refused) {
                (Ok(()), None) => {}
                (Err(e), Some(word)) => {
                    assert_eq!(e.code(), EXIT_NOPERM, "row {i}");
                    assert!(e.to_string().contains(word), "row {i}: {e}");
                }
                (got, want) => panic!("row {i}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn without_the_controller_begin_fails_and_end_warns() {
        for (hook, code, warning) in [
            (Hook::Begin, 75, false),
            (Hook::Record, 75, false),
            (Hook::Send, 75, false),
            (Hook::End, 0, true),
            (Hook::Fail, 0, true),
        ] {
            let (text, warns, got) = unreachable(hook, "no responders");
            assert_eq!((warns, got), (warning, code), "{hook:?}");
            assert!(text.contains("could not reach the controller (no responders)"));
        }
    }

    #[test]
    fn output_is_bounded_at_a_character() {
        assert_eq!(bounded(b"abc", 3), "abc");
        let cut = bounded("aé".as_bytes(), 2);
        assert!(cut.starts_with("a\n[… 1 more bytes"), "{cut:?}");
    }
}
