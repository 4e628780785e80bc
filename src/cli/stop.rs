//! `agent-state stop AGENT [--reason TEXT] [--wait]`: stop an agent's
//! running session now.
//!
//! The request is a file in `.daemon/` ([`crate::daemon::stop`]) naming the
//! session seen running; this sends the daemon SIGUSR1 and waits until it
//! took the request. The daemon ends the session as at its timeout
//! (SIGTERM to its process group and cgroup, SIGKILL after `kill_grace`)
//! and records it as stopped (`SESSION_STOPPED`). `.daemon/` is the
//! service user's: only it and root can ask.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::agent_name::AgentName;
use crate::cli::Context;
use crate::daemon::files;
use crate::daemon::stop::{self, StopRequest};
use crate::error::{Error, Result, exit};
use crate::state::journal::Event;
use crate::state::session::Session;

/// How long the daemon may take to pick the request up once signalled.
const TAKEN_WITHIN: Duration = Duration::from_secs(10);

/// With `--wait`: how long past `kill_grace` the end may take to be
/// recorded (the runner's sweep, the script's trap, the end's fsyncs).
const RECORDED_WITHIN: Duration = Duration::from_secs(60);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent whose running session to stop
    pub agent: String,
    /// Why: recorded with who stopped it (session.json `reason` and `errors`, the journal's `error` line, the daemon's log)
    #[arg(long, value_name = "TEXT", default_value = "no reason given")]
    pub reason: String,
    /// Wait until the session's end is recorded (its journal line) and the daemon runs it no more (its processes are gone), and say how it ended
    #[arg(long)]
    pub wait: bool,
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let result = stop_session(ctx, &args);
    if let Err(e) = &result
        && crate::access::is_denied(e)
    {
        crate::cli::warn(operators_only(ctx, &args.agent));
    }
    result
}

fn operators_only(ctx: &Context, agent: &str) -> String {
    format!(
        "stopping a session is the operator's: run it as the service user that owns {} (e.g. `sudo -u agent-state agent-state stop {agent}`) or as root",
        ctx.root.daemon_dir().display(),
    )
}

fn stop_session(ctx: &Context, args: &Args) -> Result<u8> {
    let (agent, dir) = ctx.working_agent(&args.agent)?;
    dir.require()?;
    let name = &agent.name;
    // The request goes into `.daemon/`, the service user's: anyone else is
    // refused here, before anything is read or asked (a member of the
    // group may read it, and could not tell whether a daemon runs).
    crate::access::writer_only(&ctx.root.daemon_dir(), |_| operators_only(ctx, &args.agent))?;
    if !files::daemon_running(&ctx.root) {
        return Err(Error::Unavailable(format!(
            "no agent-state daemon is running on {}: only the daemon's sessions can be stopped (a script's session ends with its script; record it with `agent-state session fail {name} --session ID --reason ...`)",
            ctx.root.path.display()
        )));
    }
    let heartbeat = files::read_heartbeat(&ctx.root)?.ok_or_else(|| {
        Error::Unavailable(format!(
            "the daemon on {} has written no daemon.json yet; try again when it has started",
            ctx.root.path.display()
        ))
    })?;
    // The daemon's own list first: a session whose end a `session fail`
    // recorded already still runs until the daemon stops it.
    let recorded: Option<Session> = dir.read()?;
    let sid = match running_in(&heartbeat, name) {
        Some(sid) => sid,
        None => match recorded.filter(|s| s.is_running()) {
            None => {
                println!("{name}: no session is running; nothing to stop");
                return Ok(exit::OK);
            }
            Some(s) => {
                return Err(Error::NotPermitted(format!(
                    "{name}: session {} is not run by the daemon (owner pid {}): a script began it. Stop that process, then record its end with `agent-state session fail {name} --session {} --reason ...`",
                    s.session_id,
                    s.owner_pid.unwrap_or(0),
                    s.session_id
                )));
            }
        },
    };
    let request = StopRequest {
        session_id: sid.clone(),
        reason: match args.reason.trim() {
            "" => "no reason given".to_string(),
            r => r.to_string(),
        },
        by: asker(),
        asked_at: ctx.now,
    };
    // Refused to anyone but the service user and root (`.daemon/` is
    // theirs): main prints which directory refused and who may write it.
    let path = stop::request(&ctx.root, name, &request)?;
    let pid = heartbeat.pid as i32;
    if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGUSR1) {
        let _ = stop::done(&ctx.root, name);
        return Err(Error::Unavailable(format!(
            "cannot signal the daemon (pid {pid}): {e}; nothing was stopped"
        )));
    }
    let deadline = Instant::now() + TAKEN_WITHIN;
    while crate::fsx::metadata(&path)?.is_some() {
        if Instant::now() >= deadline {
            return Err(Error::Unavailable(format!(
                "the daemon (pid {pid}) did not take the request within {}; it stays in {} and is carried out within 5 minutes",
                humantime::format_duration(TAKEN_WITHIN),
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let grace = humantime::format_duration(agent.session.kill_grace);
    if !args.wait {
        println!(
            "{name}: stopping session {sid}: SIGTERM to its processes, SIGKILL after {grace} (kill_grace); `agent-state stop {name} --wait` waits for its end"
        );
        return Ok(exit::OK);
    }
    let within = agent.session.kill_grace + RECORDED_WITHIN;
    let deadline = Instant::now() + within;
    loop {
        // Its end recorded (a `session fail` may have recorded it before
        // the stop), and the daemon no longer runs it: its processes are
        // gone (the runner's sweep comes before).
        let end = crate::cli::wake::journaled_end(&dir, &sid);
        let still_run = files::daemon_running(&ctx.root)
            && files::read_heartbeat(&ctx.root)
                .ok()
                .flatten()
                .is_some_and(|h| running_in(&h, name).as_deref() == Some(sid.as_str()));
        match end {
            Some(Event::Error(f) | Event::Timeout(f)) if !still_run && f.is_stop() => {
                println!("{name}: session {sid} stopped ({})", f.reason);
                return Ok(exit::OK);
            }
            Some(Event::Error(f) | Event::Timeout(f)) if !still_run => {
                println!("{name}: session {sid} ended before the stop: {}", f.reason);
                return Ok(exit::OK);
            }
            Some(_) if !still_run => {
                println!("{name}: session {sid} completed before the stop");
                return Ok(exit::OK);
            }
            _ if Instant::now() >= deadline => {
                return Err(Error::Unavailable(format!(
                    "{name}: session {sid} was not over within {}; see `agent-state status {name}` and the daemon's log",
                    humantime::format_duration(within)
                )));
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The session of `agent` the daemon runs, by its daemon.json.
fn running_in(heartbeat: &files::Heartbeat, agent: &AgentName) -> Option<String> {
    heartbeat
        .running
        .iter()
        .find(|r| r.agent == agent.as_str())
        .map(|r| r.session_id.clone())
}

/// The session of `agent` the running daemon runs, if any (for `session
/// fail`, which records an end but stops no process).
pub(super) fn daemon_session(ctx: &Context, agent: &AgentName) -> Option<String> {
    if !files::daemon_running(&ctx.root) {
        return None;
    }
    let heartbeat = files::read_heartbeat(&ctx.root).ok()??;
    running_in(&heartbeat, agent)
}

/// Who asks, as this process sees itself (a label for the record): the
/// user and uid, and the user `sudo` ran it for.
fn asker() -> String {
    let uid = nix::unistd::getuid();
    let user = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| "?".into());
    match std::env::var("SUDO_USER") {
        Ok(by) if !by.is_empty() && by != user => format!("{user} (uid {uid}, sudo from {by})"),
        _ => format!("{user} (uid {uid})"),
    }
}
