//! `agent-state wake AGENT`: ask the running daemon for a session now.
//!
//! The request is a file (`inbox/.wake-*`) that the daemon's inbox watch
//! sees at once: it needs write access to the agent's inbox and nothing
//! else — no root, no socket.

use std::time::{Duration, Instant};

use crate::cli::Context;
use crate::daemon::{files, session};
use crate::error::{Error, Result, exit};
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
            // A session that could not start at all (its command missing,
            // not executable, its workspace refused) has ended within a
            // moment, with the daemon's verdict in report.json: say so. A
            // session that ran and failed is the daemon's to handle.
            let settle = Instant::now() + Duration::from_millis(1000);
            loop {
                let report = dir.read::<crate::state::report::Report>().ok().flatten();
                let code = report
                    .as_ref()
                    .and_then(|r| r.error.as_ref())
                    .map(|e| e.code.clone())
                    .unwrap_or_default();
                let ended = dir
                    .read::<Session>()
                    .ok()
                    .flatten()
                    .filter(|now| now.session_id == s.session_id)
                    .is_some_and(|now| !now.is_running());
                let could_not_start =
                    crate::errors::Code::parse(&code).is_some_and(|c| c.prevents_start());
                if ended && could_not_start {
                    let message = report
                        .and_then(|r| r.error)
                        .map(|e| e.message)
                        .unwrap_or_default();
                    crate::cli::warn(format!(
                        "{}: session {} could not start ({code}): {message}",
                        dir.name, s.session_id
                    ));
                    return Ok(exit::FAILED);
                }
                if ended || Instant::now() >= settle {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            return Ok(exit::OK);
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
