//! `agent-state wake AGENT`: ask the running daemon for a session now.
//!
//! The request is a file (`inbox/.wake-*`) that the daemon's inbox watch
//! sees at once: it needs write access to the agent's inbox and nothing
//! else — no root, no socket.
//!
//! With `--wait`, the answer is read from what the daemon writes anyway:
//! the session it began (session.json), the journal line that refused the
//! wake (`wake_skipped` with a cause, after the request) or ended the
//! session (with the daemon's code and verdict), and daemon.json, which
//! lists a running session's process once its command is spawned. Never
//! from a guess about how long a start takes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::agent_name::AgentName;
use crate::catalogue::Code;
use crate::cli::Context;
use crate::daemon::{files, release, session};
use crate::error::{Error, Result, exit};
use crate::events::{Cursor, Reader, SourceId};
use crate::state::AgentDir;
use crate::state::journal::{Entry, Event, SessionFailed, WakeSkipped};
use crate::state::session::{Session, SessionStatus, SessionVerdict};

const WAIT_HELP: &str = "\
Wait up to this long for the session to start, and print its id. Exit status: \
0 it started (or ran and completed); \
1 it could not start (its command missing or not executable, its workspace not a repository: fix the config); \
75 not now, and it will pass: the wake was refused by a daily budget (until the budget's next day), \
the credential is still held (a usage limit, an admin's cap or a failed login: with a held credential, \
--wait waits for the session's end, which tells whether the hold is over), \
the session's workspace is locked or could not be made (retried), \
a session of the agent is running (the wake is skipped), \
or no slot came free within DUR; the message names which and until when; \
69 no daemon runs";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent
    pub agent: String,
    #[arg(long, value_name = "DUR", value_parser = crate::clock::parse_duration, help = WAIT_HELP)]
    pub wait: Option<Duration>,
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let (agent, dir) = ctx.working_agent(&args.agent)?;
    dir.require()?;
    if !files::daemon_running(&ctx.root) {
        return Err(Error::Unavailable(format!(
            "no agent-state daemon is running on {}; start it (systemctl start agent-state, or `agent-state daemon`), or run the session script by hand",
            ctx.root.path.display()
        )));
    }
    let before: Option<Session> = dir.read().ok().flatten();
    let before_id = before.map(|s| s.session_id);
    // Where the journal ends before the request: a refusal after it
    // answers this request.
    let mut refusals = Refusals::after_now(ctx, &dir);
    // A held credential: the session is the operator's try, and only its
    // end says whether the hold is over.
    let held = release::saved_hold(&ctx.root, &agent.session.credential)
        .ok()
        .flatten()
        .map(|h| (agent.session.credential.clone(), h));
    session::request_wake(&dir, ctx.now)?;
    let Some(wait) = args.wait else {
        println!(
            "{}: wake requested; the daemon starts a session as soon as a slot is free",
            dir.name
        );
        return Ok(exit::OK);
    };
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = dir.read::<Session>()
            && Some(&s.session_id) != before_id.as_ref()
        {
            println!("{}", s.session_id);
            let watch = Watch {
                ctx,
                dir: &dir,
                session_id: &s.session_id,
                held: held.as_ref().map(|(g, _)| g.as_str()),
            };
            return Ok(watch.judge(deadline));
        }
        if let Some(refused) = refusals.next() {
            if refused.cause.is_some_and(|c| c.cannot_start()) {
                // Its command cannot be executed: no session began, nothing
                // was claimed; it will not pass by itself.
                crate::cli::warn(format!(
                    "{}: could not start ({}): {}",
                    dir.name,
                    refused
                        .cause
                        .map_or("other", |c| c.as_str())
                        .to_ascii_uppercase(),
                    refused.detail.as_deref().unwrap_or("no detail")
                ));
                return Ok(exit::FAILED);
            }
            if refused.cause.is_none() {
                // A session of the agent's runs (begun by the daemon a
                // moment ago, or by a script): this wake was not served.
                crate::cli::warn(format!(
                    "{}: session {} is running; this wake was skipped (one follow-up session runs when it ends if messages are waiting); wake again after it ends",
                    dir.name, refused.running_session
                ));
                return Ok(exit::TEMPFAIL);
            }
            crate::cli::warn(refusal_message(&dir.name, &refused));
            return Ok(exit::TEMPFAIL);
        }
        std::thread::sleep(POLL);
    }
    crate::cli::warn(format!(
        "{}: no session started within {} (all slots busy, or a session of {} is running; see `agent-state status`); the wake stays queued",
        dir.name,
        humantime::format_duration(wait),
        dir.name
    ));
    Ok(exit::TEMPFAIL)
}

const POLL: Duration = Duration::from_millis(50);

/// How long a session that has begun may take to show whether it started,
/// past `--wait`: its command is spawned in the daemon's loop right after
/// `begin` (a workspace first, on the session's task: git may wait out a
/// lock), and daemon.json lists its process at the loop's next turn.
const START_SHOWN_WITHIN: Duration = Duration::from_secs(2);

/// How long a session must have been running before `wake --wait` calls
/// it started, when its end is not journaled yet.
const RUNNING_FOR: Duration = Duration::from_secs(1);

/// The refusals of manual wakes journaled after a point.
struct Refusals {
    reader: Option<Reader>,
    only: BTreeSet<SourceId>,
}

impl Refusals {
    fn after_now(ctx: &Context, dir: &AgentDir) -> Refusals {
        let source = SourceId::Agent(dir.name.clone());
        let mut position = Cursor::start();
        let end = journal_end(dir);
        position.set(&source, end.unwrap_or(0));
        Refusals {
            // An unreadable journal: no refusal can be read, the wait says so.
            reader: end.map(|_| Reader::new(ctx.root.clone(), position, Some(dir.name.clone()))),
            only: BTreeSet::from([source]),
        }
    }

    /// A manual wake refused since the last call.
    fn next(&mut self) -> Option<WakeSkipped> {
        let batch = self.reader.as_mut()?.read(Some(&self.only)).ok()?;
        batch.events.into_iter().find_map(|e| {
            match serde_json::from_value::<Entry>(e.event).ok()?.event {
                Event::WakeSkipped(w)
                    if w.reason == "manual"
                        && (w.cause.is_some_and(|c| c.refuses() || c.cannot_start())
                            || (w.cause.is_none() && !w.running_session.is_empty())) =>
                {
                    Some(w)
                }
                _ => None,
            }
        })
    }
}

/// Where the agent's journal ends now, in its whole history's offsets.
fn journal_end(dir: &AgentDir) -> Option<u64> {
    match crate::fsx::open_read(&dir.journal()) {
        Ok(Some(file)) => {
            let base = crate::state::rotation::base_of(&file).ok()?;
            Some(base + file.metadata().ok()?.len())
        }
        Ok(None) => Some(0),
        Err(_) => None,
    }
}

fn refusal_message(agent: &AgentName, w: &WakeSkipped) -> String {
    let until = match w.until {
        Some(t) => format!("; it runs at {t} (the wake stays queued)"),
        None => "; it runs when that is cleared (the wake stays queued)".into(),
    };
    format!(
        "{agent}: wake refused ({}): {}{until}",
        w.cause.map_or("other", |c| c.as_str()),
        w.detail.as_deref().unwrap_or("no detail")
    )
}

/// A session `wake --wait` saw begin.
struct Watch<'a> {
    ctx: &'a Context,
    dir: &'a AgentDir,
    session_id: &'a str,
    /// The credential's group, held when the wake was asked for.
    held: Option<&'a str>,
}

impl Watch<'_> {
    /// The exit status for the session: by the journal line that ended
    /// it (the daemon's code and verdict, final and about this session
    /// only), else 0 once daemon.json shows its process running. With a
    /// held credential, only its end answers (until `deadline`).
    fn judge(&self, deadline: Instant) -> u8 {
        let begun = Instant::now();
        let settle = deadline.max(begun + START_SHOWN_WITHIN);
        loop {
            match journaled_end(self.dir, self.session_id) {
                Some(Event::Error(f)) => {
                    return self.failed(&f, f.verdict_of(SessionStatus::Error));
                }
                Some(Event::Timeout(f)) => {
                    return self.failed(&f, f.verdict_of(SessionStatus::Timeout));
                }
                Some(_) => return exit::OK,
                // Running a moment after it began: started. (A command
                // that cannot be spawned is known at once; the moment
                // keeps a quick session's end, when there is one, the
                // answer.)
                None if self.held.is_none() && begun.elapsed() >= RUNNING_FOR && self.spawned() => {
                    return exit::OK;
                }
                None if Instant::now() >= settle => return exit::OK,
                None => std::thread::sleep(POLL),
            }
        }
    }

    /// Is the session's command running (daemon.json lists its process)?
    /// A daemon.json this user cannot read says nothing: taken as yes
    /// (the rule before daemon.json was read here: running a second after
    /// it began).
    fn spawned(&self) -> bool {
        match files::read_heartbeat(&self.ctx.root) {
            Ok(Some(h)) => h
                .running
                .iter()
                .any(|r| r.session_id == self.session_id && r.pid.is_some()),
            Ok(None) | Err(_) => true,
        }
    }

    fn failed(&self, f: &SessionFailed, verdict: SessionVerdict) -> u8 {
        let (name, sid) = (&self.dir.name, self.session_id);
        let code = f.code.as_deref().and_then(Code::parse);
        // The operator's try of a held credential: the hold answers.
        let hold = self
            .held
            .and_then(|group| release::saved_hold(&self.ctx.root, group).ok().flatten());
        let answer = answer(code, verdict, self.held.is_some(), hold.is_some());
        let reason = &f.reason;
        match answer {
            Answer::Started => {}
            Answer::WorkspaceRefused(c) => crate::cli::warn(format!(
                "{name}: session {sid} could not start: its workspace was refused ({c}): {reason}; the daemon retries it"
            )),
            Answer::CouldNotStart(c) => crate::cli::warn(format!(
                "{name}: session {sid} could not start ({c}): {reason}"
            )),
            Answer::StillHeld => {
                let still = hold.map_or(String::new(), |h| {
                    let until = h.until.map_or(String::new(), |t| format!(" until {t}"));
                    format!(
                        "; credential {} is still held{until}: {}",
                        self.held.unwrap_or_default(),
                        h.reason
                    )
                });
                let what = match verdict {
                    SessionVerdict::UsageLimit => "stopped at the usage limit (not a failure)",
                    _ => "failed",
                };
                crate::cli::warn(format!("{name}: session {sid} {what}: {reason}{still}"));
            }
        }
        answer.exit_code()
    }
}

/// What `wake --wait` answers for a session whose end is journaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// It started (and ended: a failure is the daemon's to retry, a first
    /// usage limit the daemon's to wait out; `status` shows them).
    Started,
    /// Its command could not be started: the config needs a fix.
    CouldNotStart(Code),
    /// Its workspace was locked or could not be made: retried.
    WorkspaceRefused(Code),
    /// The operator's try of a held credential, and it is held still.
    StillHeld,
}

impl Answer {
    fn exit_code(self) -> u8 {
        match self {
            Answer::Started => exit::OK,
            Answer::CouldNotStart(_) => exit::FAILED,
            Answer::WorkspaceRefused(_) | Answer::StillHeld => exit::TEMPFAIL,
        }
    }
}

/// The answer for an ended session: by its catalogue code and verdict,
/// whether its credential was held when the wake was asked for
/// (`tried_held`) and whether it is held now (`held_now`). Pure.
fn answer(code: Option<Code>, verdict: SessionVerdict, tried_held: bool, held_now: bool) -> Answer {
    match code {
        Some(c @ (Code::WorkspaceLocked | Code::WorkspaceFailed)) => Answer::WorkspaceRefused(c),
        Some(c) if c.prevents_start() => Answer::CouldNotStart(c),
        _ if tried_held && (verdict == SessionVerdict::UsageLimit || held_now) => Answer::StillHeld,
        _ => Answer::Started,
    }
}

/// The journal event that ended `session_id`, if it has ended (and the
/// journal could be read).
pub(super) fn journaled_end(dir: &crate::state::AgentDir, session_id: &str) -> Option<Event> {
    crate::hooks::journaled_end(dir, session_id)
        .ok()
        .flatten()
        .map(|e| e.event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_end_has_its_answer() {
        use SessionVerdict::*;
        let table = [
            // (code, verdict, tried held, held now) → answer, exit
            (None, Completed, false, false, Answer::Started, 0),
            (
                Some(Code::SessionFailed),
                Error,
                false,
                false,
                Answer::Started,
                0,
            ),
            (
                Some(Code::SessionTimeout),
                Timeout,
                false,
                false,
                Answer::Started,
                0,
            ),
            // A first usage limit: it ran (the daemon waits it out).
            (
                Some(Code::UsageLimit),
                UsageLimit,
                false,
                true,
                Answer::Started,
                0,
            ),
            (
                Some(Code::AgentNotFound),
                Error,
                false,
                false,
                Answer::CouldNotStart(Code::AgentNotFound),
                1,
            ),
            (
                Some(Code::WorkspaceNotARepo),
                Error,
                false,
                false,
                Answer::CouldNotStart(Code::WorkspaceNotARepo),
                1,
            ),
            (
                Some(Code::WorkspaceLocked),
                Error,
                false,
                false,
                Answer::WorkspaceRefused(Code::WorkspaceLocked),
                75,
            ),
            (
                Some(Code::WorkspaceFailed),
                Error,
                true,
                true,
                Answer::WorkspaceRefused(Code::WorkspaceFailed),
                75,
            ),
            // The operator's try of a held credential.
            (
                Some(Code::UsageLimit),
                UsageLimit,
                true,
                true,
                Answer::StillHeld,
                75,
            ),
            (
                Some(Code::UsageDisabled),
                UsageLimit,
                true,
                true,
                Answer::StillHeld,
                75,
            ),
            (
                Some(Code::AgentLoginRequired),
                Error,
                true,
                true,
                Answer::StillHeld,
                75,
            ),
            // ...that ended the hold, or failed for another reason once
            // the hold was lifted.
            (None, Completed, true, false, Answer::Started, 0),
            (
                Some(Code::SessionFailed),
                Error,
                true,
                false,
                Answer::Started,
                0,
            ),
        ];
        for (code, verdict, tried, now, want, exit) in table {
            let got = answer(code, verdict, tried, now);
            assert_eq!(got, want, "{code:?} {verdict:?} {tried} {now}");
            assert_eq!(got.exit_code(), exit, "{got:?}");
        }
    }
}
