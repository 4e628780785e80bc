//! `agent-state reload`: validate the config file, have the running daemon
//! reload it, and wait for its verdict — what systemd's `ExecReload=` runs,
//! so that `systemctl reload` fails, with the reasons, when the new config
//! is refused.
//!
//! The file is validated here first (every problem printed, exit 78, the
//! daemon not bothered). Then SIGHUP goes to the daemon (`--pid`, or the pid
//! in `.daemon/daemon.json`), which re-reads the file and records its
//! verdict in `.daemon/reload.json` with a generation counter; this waits
//! (bounded) for a generation newer than the one before the signal.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::config::{Config, ConfigError};
use crate::daemon::files;
use crate::error::{Error, Result, exit};
use crate::state::StateRoot;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The daemon's pid (systemd: `--pid $MAINPID`); default: the pid in .daemon/daemon.json
    #[arg(long, value_name = "PID")]
    pub pid: Option<i32>,
    /// How long to wait for the daemon's verdict
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = crate::clock::parse_duration)]
    pub wait: Duration,
}

pub fn run(path: &Path, args: &Args) -> Result<u8> {
    // Every problem of the file, before anything is signalled.
    let config = Config::load(path)?;
    let root = StateRoot::new(&config.state_root);
    if !files::daemon_running(&root) {
        // systemd names the daemon (`--pid $MAINPID`): it runs, on another
        // root than the file now names.
        if let Some(pid) = args.pid {
            return Err(ConfigError::Refused {
                path: path.to_path_buf(),
                reasons: vec![format!(
                    "state_root: the file names {}, but the daemon (pid {pid}) runs on another state root; state_root cannot change while the daemon runs (restart it instead)",
                    root.path.display()
                )],
            }
            .into());
        }
        return Err(Error::Unavailable(format!(
            "no agent-state daemon is running on {}: nothing to reload (the config is valid; it is read when the daemon starts; if you changed state_root, restart the daemon instead)",
            root.path.display()
        )));
    }
    let pid = match args.pid {
        Some(pid) => pid,
        None => files::read_heartbeat(&root)?
            .map(|h| h.pid as i32)
            .ok_or_else(|| {
                Error::Unavailable(format!(
                    "the daemon on {} has written no daemon.json yet; pass --pid",
                    root.path.display()
                ))
            })?,
    };
    let before = files::read_reload_verdict(&root).map_or(0, |v| v.generation);
    kill(Pid::from_raw(pid), Signal::SIGHUP).map_err(|e| {
        Error::Unavailable(format!(
            "cannot signal the daemon (pid {pid}) to reload: {e}"
        ))
    })?;
    let deadline = Instant::now() + args.wait;
    loop {
        if let Some(verdict) = files::read_reload_verdict(&root)
            && verdict.generation > before
        {
            if verdict.accepted && !verdict.reasons.is_empty() {
                // In force, but not every agent could be set up.
                println!(
                    "config {} reloaded by the daemon (pid {}): {} agents, {} not set up:",
                    path.display(),
                    verdict.pid,
                    config.agents.len(),
                    verdict.reasons.len()
                );
                return Err(Error::CannotCreate(format!(
                    "{}; fix the state root's ownership and modes (as root: agent-state bootstrap, or systemd-tmpfiles --create agent-state.conf), then reload again",
                    verdict.reasons.join("; ")
                )));
            }
            if verdict.accepted {
                println!(
                    "config {} reloaded by the daemon (pid {}): {} agents",
                    path.display(),
                    verdict.pid,
                    config.agents.len()
                );
                return Ok(exit::OK);
            }
            return Err(ConfigError::Refused {
                path: path.to_path_buf(),
                reasons: verdict.reasons,
            }
            .into());
        }
        if Instant::now() >= deadline {
            return Err(Error::Unavailable(format!(
                "the daemon (pid {pid}) gave no verdict on the config within {}; see its log (journalctl -u agent-state) and {}",
                humantime::format_duration(args.wait),
                files::reload_verdict_path(&root).display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
