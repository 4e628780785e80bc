//! `agent-state wake AGENT`: ask the running daemon for a session now.
//!
//! The request is a file (`inbox/.wake-*`) that the daemon's inbox watch
//! sees at once: it needs write access to the agent's inbox and nothing
//! else — no root, no socket.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::cli::Context;
use crate::daemon::{files, session};
use crate::error::{Error, Result, exit};
use crate::state::journal::{self, Event};
use crate::state::session::Session;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent
    pub agent: String,
    /// Wait up to this long for the session to start, and print its id
    #[arg(long, value_name = "DUR", value_parser = crate::clock::parse_duration)]
    pub wait: Option<Duration>,
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let (_, dir) = ctx.working_agent(&args.agent)?;
    dir.require()?;
    if !files::daemon_running(&ctx.root) {
        return Err(Error::Unavailable(format!(
            "no agent-state daemon is running on {}; start it (systemctl start agent-state, or `agent-state daemon`), or run the session script by hand",
            ctx.root.path.display()
        )));
    }
    let before: Option<Session> = dir.read().ok().flatten();
    let before_id = before.map(|s| s.session_id);
    session::request_wake(&dir)?;
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
            return Ok(judge_start(&dir, &s.session_id));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(Error::Unavailable(format!(
        "{}: no session started within {} (all slots busy, or a session of {} is running; see `agent-state status`)",
        dir.name,
        humantime::format_duration(wait),
        dir.name
    )))
}

/// How long a session that has begun may take to be recorded as one that
/// could not start; still running after this, it has started. Its command
/// is spawned in the daemon's loop right after `begin`, so a failed spawn is
/// known at once; recording it takes a thread hop, the agent's lock and a
/// few fsyncs (under 60 ms at a load average of 6 on 2 cores).
const COULD_NOT_START_WITHIN: Duration = Duration::from_secs(1);

/// The exit status of `wake --wait` for the session `session_id`, which
/// has begun: 1 if it could not start at all (its command missing or not
/// executable, its workspace refused), else 0 (a session that ran and
/// failed is the daemon's to handle).
///
/// Judged from the journal line that commits that session's end and
/// carries the daemon's code ([`crate::state::journal::SessionFailed`]
/// `code`): final, and about that session only. Not from session.json,
/// which says the session ended before the daemon's verdict reaches
/// report.json, nor from report.json, whose error may be a previous
/// session's, or the next one's once a retry has begun.
fn judge_start(dir: &crate::state::AgentDir, session_id: &str) -> u8 {
    let settle = Instant::now() + COULD_NOT_START_WITHIN;
    loop {
        match journaled_end(dir, session_id) {
            Some(Event::Error(f) | Event::Timeout(f)) => {
                let could_not_start = f
                    .code
                    .as_deref()
                    .and_then(crate::errors::Code::parse)
                    .is_some_and(|c| c.prevents_start());
                if could_not_start {
                    crate::cli::warn(format!(
                        "{}: session {session_id} could not start ({}): {}",
                        dir.name,
                        f.code.unwrap_or_default(),
                        f.reason
                    ));
                    return exit::FAILED;
                }
                return exit::OK;
            }
            Some(_) => return exit::OK,
            // Still running (or its end not yet recorded): it started,
            // unless its end comes within the settle time.
            None if Instant::now() >= settle => return exit::OK,
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The journal event that ended `session_id`, if it has ended: read from
/// the newest line back to the session's `session_start`.
pub(super) fn journaled_end(dir: &crate::state::AgentDir, session_id: &str) -> Option<Event> {
    let mut found = None;
    let read = journal::scan_backwards(&dir.journal(), |entry| {
        if entry.event.ended_session() == Some(session_id) {
            found = Some(entry.event);
            return ControlFlow::Break(());
        }
        match &entry.event {
            Event::SessionStart(s) if s.session_id == session_id => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        }
    });
    read.ok().and(found)
}
