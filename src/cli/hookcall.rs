//! A hook call from a session on a cluster worker (issue 24): with
//! `AGENT_STATE_HOOKS` set (the worker sets it to its socket for the
//! session), `session begin|end|fail`, `record` and `send` touch no state
//! root here: the parsed call goes to the worker, which forwards it to the
//! controller, and what comes back is printed and exited with, so a script
//! cannot tell the difference.
//!
//! Without an answer (no socket, no controller) `begin`, `record` and
//! `send` fail with 75 (try again), naming what failed; `session end` and
//! `fail` warn and exit 0, the lenient rule of the ending hooks. A refused
//! call exits with the controller's code (64 not a hook or a bad word, 77
//! not this session's), naming why.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use agent_state_cluster::hooks::{self, MAX_OUTPUT_BYTES, MAX_STDIN, unreachable};
use agent_state_cluster::{Hook, HookAnswer, HookCall};

use crate::cli::{Command, send, session};
use crate::error::{Error, Result};

/// How long the call may take to send, and its answer to come (the
/// controller runs a hook for at most 60 s; the worker waits 75 s).
const SEND_WITHIN: Duration = Duration::from_secs(30);
const ANSWER_WITHIN: Duration = Duration::from_secs(90);

/// The socket a session on a worker sends its hook calls to, if set.
pub fn socket() -> Option<std::path::PathBuf> {
    std::env::var_os(hooks::HOOKS_ENV)
        .filter(|v| !v.is_empty())
        .map(Into::into)
}

fn options(pairs: &[(&str, Option<String>)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .filter_map(|(k, v)| Some((k.to_string(), v.clone()?)))
        .collect()
}

fn call(hook: Hook, options: Vec<(String, String)>, positionals: Vec<String>) -> HookCall {
    HookCall {
        command: hook.words().iter().map(|w| w.to_string()).collect(),
        options,
        positionals,
        stdin: None,
    }
}

/// The call a hook command makes (`None`: not a hook). Reads the body of
/// `send --body-file` here, on the worker, where the script meant it.
pub fn call_of(command: &Command) -> Result<Option<(Hook, HookCall)>> {
    let nonzero = |n: u64| (n != 0).then(|| n.to_string());
    Ok(Some(match command {
        Command::Session(session::Command::Begin(a)) => (
            Hook::Begin,
            call(
                Hook::Begin,
                options(&[
                    ("type", a.session_type.clone()),
                    ("branch", a.branch.clone()),
                    ("model", a.model.clone()),
                    ("timeout", a.timeout.clone()),
                    ("research-question", a.research_question.clone()),
                    ("belief-targeted", a.belief_targeted.clone()),
                    ("disconfirmation-target", a.disconfirmation_target.clone()),
                    ("sources-expected", a.sources_expected.clone()),
                ]),
                vec![a.agent.clone()],
            ),
        ),
        Command::Session(session::Command::End(a)) => (
            Hook::End,
            call(
                Hook::End,
                options(&[
                    ("session", a.session.clone()),
                    ("outcome", a.outcome.clone()),
                    ("sources-archived", a.sources_archived.clone()),
                    ("branch", a.branch.clone()),
                    ("pr", a.pr.clone()),
                    ("summary", a.summary.clone()),
                    ("next-priority", a.next_priority.clone()),
                    ("handoff-notes", a.handoff_notes.clone()),
                    ("tokens-used", a.tokens_used.clone()),
                    ("cost-usd", a.cost_usd.clone()),
                ]),
                vec![a.agent.clone()],
            ),
        ),
        Command::Session(session::Command::Fail(a)) => (
            Hook::Fail,
            call(
                Hook::Fail,
                options(&[
                    ("session", a.session.clone()),
                    ("outcome", Some(a.outcome.clone())),
                    ("reason", Some(a.reason.clone())),
                ]),
                vec![a.agent.clone()],
            ),
        ),
        Command::Record(a) => (
            Hook::Record,
            call(
                Hook::Record,
                options(&[
                    ("claims-proposed", nonzero(a.claims_proposed)),
                    ("claims-accepted", nonzero(a.claims_accepted)),
                    ("claims-challenged", nonzero(a.claims_challenged)),
                    ("claims-rejected", nonzero(a.claims_rejected)),
                    ("disconfirmation-hits", nonzero(a.disconfirmation_hits)),
                ]),
                std::iter::once(a.agent.clone())
                    .chain(a.event.clone())
                    .chain(a.fields.iter().cloned())
                    .collect(),
            ),
        ),
        Command::Send(a) => {
            let stdin = match &a.body_file {
                None => None,
                Some(p) => Some(send::body_of(p)?),
            };
            if let Some(body) = &stdin
                && body.len() > MAX_STDIN
            {
                return Err(Error::Data(format!(
                    "--body-file: a body of {} bytes cannot be sent from a session on a worker (at most {MAX_STDIN} bytes): put large content in a file and name it with --source-ref",
                    body.len()
                )));
            }
            let mut c = call(
                Hook::Send,
                options(&[
                    ("from", Some(a.from.clone())),
                    ("to", Some(a.to.clone())),
                    ("type", Some(a.kind.as_str().to_string())),
                    ("priority", Some(a.priority.as_str().to_string())),
                    ("subject", Some(a.subject.clone())),
                    ("body", a.body.clone()),
                    ("body-file", stdin.as_ref().map(|_| "-".to_string())),
                    ("source-ref", a.source_ref.clone()),
                    (
                        "expires-in",
                        a.expires_in
                            .map(|d| humantime::format_duration(d).to_string()),
                    ),
                ]),
                vec![],
            );
            c.stdin = stdin;
            (Hook::Send, c)
        }
        _ => return Ok(None),
    }))
}

/// Sends `call` to the worker's socket and carries out the answer: prints
/// what the hook printed, returns its exit code.
pub fn forward(socket: &Path, hook: Hook, call: &HookCall) -> u8 {
    let answer = ask(socket, call).unwrap_or_else(|reason| HookAnswer::Unreachable {
        reason: format!("the worker's socket {}: {reason}", socket.display()),
    });
    match answer {
        HookAnswer::Ran {
            code,
            stdout,
            stderr,
        } => {
            print!("{stdout}");
            eprint!("{stderr}");
            let _ = std::io::stdout().flush();
            code
        }
        HookAnswer::Refused { code, reason } => {
            eprintln!(
                "agent-state: error: the controller refused `{}`: {reason}",
                hook.name()
            );
            code
        }
        HookAnswer::Unreachable { reason } => {
            let (text, warning, code) = unreachable(hook, &reason);
            if warning {
                crate::cli::warn(text);
            } else {
                eprintln!("agent-state: error: {text}");
            }
            code
        }
    }
}

/// What went wrong talking to the worker's socket.
#[derive(Debug, thiserror::Error)]
enum SocketError {
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("cannot send the call: {0}")]
    Send(std::io::Error),
    #[error("no answer: {0}")]
    Answer(std::io::Error),
    #[error("it closed without an answer")]
    Closed,
    #[error("its answer is not one: {0}")]
    NotAnAnswer(serde_json::Error),
}

fn ask(socket: &Path, call: &HookCall) -> std::result::Result<HookAnswer, SocketError> {
    let mut stream = UnixStream::connect(socket).map_err(SocketError::Connect)?;
    stream
        .set_write_timeout(Some(SEND_WITHIN))
        .and_then(|()| stream.set_read_timeout(Some(ANSWER_WITHIN)))
        .map_err(SocketError::Connect)?;
    let bytes = serde_json::to_vec(call).expect("a call serialises");
    stream
        .write_all(&bytes)
        .and_then(|()| stream.shutdown(std::net::Shutdown::Write))
        .map_err(SocketError::Send)?;
    let mut answer = Vec::new();
    (&mut stream)
        // Each output at most MAX_OUTPUT_BYTES, JSON-escaped (at most six
        // bytes a byte), and the rest of the answer.
        .take(12 * MAX_OUTPUT_BYTES as u64 + 64 * 1024)
        .read_to_end(&mut answer)
        .map_err(SocketError::Answer)?;
    if answer.is_empty() {
        return Err(SocketError::Closed);
    }
    serde_json::from_slice(&answer).map_err(SocketError::NotAnAnswer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parsed(line: &str) -> Command {
        let args: Vec<&str> = std::iter::once("agent-state")
            .chain(line.split(' '))
            .collect();
        crate::cli::Cli::try_parse_from(args).unwrap().command
    }

    /// What the CLI sends, the controller runs: the call checked and its
    /// command line parsed back gives the same hook, the agent and session
    /// the order's.
    #[test]
    fn a_call_runs_on_the_controller_as_it_was_given() {
        for line in [
            "session begin rio --type research --branch b1 --sources-expected 3",
            "session end rio --summary done --tokens-used 12 --cost-usd -1",
            "session fail rio --outcome error --reason it-broke",
            "record rio --claims-proposed 2 --disconfirmation-hits 1",
            "record rio orient_complete n=-5 k=v",
            "send --from rio --to theseus --type task --priority high --subject hi --body hello --expires-in 2d",
        ] {
            let command = parsed(line);
            let (hook, call) = call_of(&command).unwrap().unwrap();
            let argv = hooks::check_call(&call, "rio", "S1").unwrap();
            let back = parsed(&argv.join(" "));
            let (hook_back, mut call_back) = call_of(&back).unwrap().unwrap();
            assert_eq!(hook, hook_back, "{line}");
            // The session is the order's, named once more by the controller.
            let mut call = call;
            for c in [&mut call, &mut call_back] {
                c.options.retain(|(k, _)| k != "session");
            }
            assert_eq!(call, call_back, "{line} -> {argv:?}");
            let forced = match hook {
                Hook::Begin => "--join=S1",
                Hook::End | Hook::Fail => "--session=S1",
                _ => "",
            };
            assert!(
                argv.iter().any(|a| a == forced) || forced.is_empty(),
                "{argv:?}"
            );
        }
        assert!(call_of(&parsed("status")).unwrap().is_none());
    }

    /// The options the controller takes are the hooks' own, every one.
    #[test]
    fn the_controller_knows_every_option_of_the_hooks() {
        use clap::CommandFactory;
        let cli = crate::cli::Cli::command();
        for hook in [Hook::Begin, Hook::End, Hook::Fail, Hook::Record, Hook::Send] {
            let mut c = &cli;
            for w in hook.words() {
                c = c.find_subcommand(w).unwrap();
            }
            for arg in c.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                let own = ["join", "session", "owner-pid", "config", "color", "help"];
                assert!(
                    hook.options().contains(&long) || own.contains(&long),
                    "{hook:?} --{long}"
                );
            }
        }
    }
}
