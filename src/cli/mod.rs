//! The command line: argument definitions and dispatch, one module per
//! subcommand. Commands print results on stdout and warnings on stderr, and
//! return a sysexits code; `main` prints errors.

mod backup;
mod bootstrap;
mod check;
mod credential;
mod daemon;
pub(crate) mod display;
mod doctor;
mod errors;
mod events;
mod flow;
mod health;
mod hookcall;
mod inbox;
pub(crate) mod json;
mod metrics;
mod migrate;
mod prompt;
mod record;
mod reload;
mod send;
mod session;
pub use session::parse_lenient;
pub(crate) mod status;
mod stop;
mod task;
mod usage;
mod wake;
pub(crate) mod web;
mod worker;
mod workspaces;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::clock::Timestamp;
use crate::config::{AgentConfig, Config, DEFAULT_PATH};
use crate::error::{Result, exit};
use crate::state::{AgentDir, StateRoot};

/// `agent-state --version`: the version and the commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("AGENT_STATE_COMMIT"),
    ")"
);

const ABOUT: &str = "Durable state, session hooks and messaging for headless LLM agents";

const LONG_ABOUT: &str = "\
Durable state, session hooks and messaging for headless LLM agents.

Every agent has a directory under the state root (report.json, tasks.json,
session.json, memory.md, journal.jsonl, metrics.json, inbox/). Session scripts
call `session begin|end|fail`; pipelines and people `send` messages; `status`
shows everyone at a glance.

Exit codes (sysexits(3)):
  0   success
  1   `doctor`: something failed; `wake --wait`: the session could not start
      (fix the config); `health`: WARNING (2 CRITICAL, 3 UNKNOWN)
  64  usage: a bad command line, or a request that cannot be carried out
  65  bad data: a value was refused (`session begin` records everything else;
      `session end`/`fail` only warn and exit 0); `check`:
      problems left; `status`, `usage`: an agent's files could not be read
      (shown as unreadable, with why; every other agent as usual)
  66  missing input: no such file, message or agent directory
  67  unknown agent: not in the config
  69  unavailable: no daemon runs, or another runs on the same root
  70  internal error
  71  operating system error
  73  cannot create a file
  74  I/O error
  75  try again: a session is running, or a lock is held; `wake --wait`: not
      now, and it will pass (refused by a budget, a held credential or a
      locked workspace, or no slot came free: the message says which); a
      hook of a session on a cluster worker could not reach the controller
      (`session end`/`fail` only warn and exit 0)
  77  permission denied, or a session that another live owner holds
  78  configuration error (every problem is printed)";

#[derive(Parser, Debug)]
#[command(name = "agent-state", version = VERSION, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    /// Configuration file.
    #[arg(long, global = true, env = "AGENT_STATE_CONFIG", default_value = DEFAULT_PATH, value_name = "PATH")]
    pub config: PathBuf,

    /// When to colour the human-readable output
    #[arg(long, global = true, value_enum, default_value_t = display::ColorChoice::Auto, value_name = "WHEN")]
    pub color: display::ColorChoice,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create the state root and every configured agent's directory (idempotent: repairs what is missing, never overwrites)
    Bootstrap(bootstrap::Args),
    /// Session hooks for session scripts: begin, end, fail
    #[command(subcommand)]
    Session(session::Command),
    /// Put a message in an agent's inbox (or every agent's, with --to all)
    Send(send::Args),
    /// List an agent's waiting, claimed and rejected messages
    Inbox(inbox::Args),
    /// Add, list and update an agent's tasks
    #[command(subcommand)]
    Task(task::Command),
    /// One line per agent: status, last session, tasks, inbox, 30-day counts (exit 65 if an agent's files cannot be read)
    Status(status::Args),
    /// One line and an exit status for monitoring: 0 ok, 1 warning, 2 critical, 3 unknown
    Health(health::Args),
    /// Sessions, runtime, tokens and cost per agent per day, and today's budget left
    Usage(usage::Args),
    /// The git worktrees of sessions that are kept (uncommitted changes or commits not on the base)
    Workspaces(workspaces::Args),
    /// Write a consistent snapshot of the state root (each agent's files under its lock) to DEST.tar.zst
    Backup(backup::BackupArgs),
    /// Restore a backup into an empty state root, then check it
    Restore(backup::RestoreArgs),
    /// Check everything a first session needs (user, group, modes, commands, login, git, disk, with [cluster] the NATS servers, the daemon), each failure with its fix
    Doctor(doctor::Args),
    /// Read a cron-era crontab's research-session.sh lines as [[agent]] entries; --apply writes them into the config and comments the lines out
    ///
    /// Each crontab line that runs `research-session.sh AGENT` (by its full
    /// path, or `./research-session.sh` after `cd DIR &&`; behind `timeout`,
    /// `flock` or `nice`) becomes an [[agent]] entry: the line's schedule,
    /// its zone (the CRON_TZ= or TZ= line above it, else the machine's), the
    /// script with the line's arguments as its command, and a `timeout
    /// DURATION` in front of the script as the agent's timeout. Output
    /// redirections are left out (the daemon keeps each session's output);
    /// every other line of the crontab is left alone.
    ///
    /// Without --apply nothing is changed: the entries and the lines that
    /// would be commented out are printed. With --apply the config is backed
    /// up beside itself (NAME.bak-STAMP) and the entries added (refused whole
    /// if the result is not a valid config), the crontab backed up (0600)
    /// and its lines commented out, each saying why. A line that also runs
    /// another command, a relative script without `cd DIR &&`, or an agent
    /// started on two lines is refused, naming the line, and nothing is
    /// written. Agents already in the config are left as they are. Then:
    /// `agent-state check` and `systemctl reload agent-state`.
    MigrateCrontab(migrate::Args),
    /// Planner → Actor → Judge flows: start a cycle, see them, approve, reject or stop one
    #[command(subcommand)]
    Flow(flow::Command),
    /// Print the rehydration prompt the agent's next session gets
    Prompt(prompt::Args),
    /// Record review outcomes learned after a session (claims, disconfirmations)
    Record(record::Args),
    /// Check the config (and what it names: commands, verify commands, workspace repositories) and every state file; --repair mends the state
    Check(check::Args),
    /// Recompute metrics.json from the journal
    #[command(subcommand)]
    Metrics(metrics::Command),
    /// Run the service: wake agents on schedules and inbox messages, run their sessions (systemd: Type=notify)
    Daemon(daemon::Args),
    /// Ask the running daemon to start a session of AGENT now
    Wake(wake::Args),
    /// Stop AGENT's running session now (SIGTERM to all its processes, SIGKILL after kill_grace), recorded as stopped; its messages wait for the next wake; run as the service user or root
    ///
    /// The running daemon ends the session as at its timeout: SIGTERM to
    /// its process group (and its cgroup under systemd), SIGKILL after the
    /// agent's `kill_grace`. It is recorded as `error` with the code
    /// SESSION_STOPPED, the reason and who stopped it (session.json
    /// `reason` and `errors`, the journal's `error` line): not the agent's
    /// failure (no retry, no backoff, not in the error counts). Its claimed
    /// messages go back to the inbox without counting an attempt and wait
    /// for the next wake: a schedule, `agent-state wake AGENT`, or a new
    /// message.
    ///
    /// Exit status: 0 the stop was taken (with --wait: the end is
    /// recorded), or no session was running (said on stdout); 64 a human
    /// mailbox; 67 no such agent in the config; 69 no daemon runs, it did
    /// not take the request within 10 s, or (--wait) the end was not
    /// recorded within kill_grace + 60 s; 77 not the service user or root,
    /// or the session is a script's, not the daemon's. `status` then shows
    /// the last session as "stopped".
    Stop(stop::Args),
    /// Credentials agents share: release one's hold (after logging in again, or once an admin's cap is lifted)
    #[command(subcommand)]
    Credential(credential::Command),
    /// Validate the config file, have the running daemon reload it (SIGHUP) and wait for its verdict (systemd: ExecReload)
    Reload(reload::Args),
    /// The cluster's worker hosts ([cluster]): host, slots used/total, sessions, last heartbeat, credential groups, state (alive, draining, drained, stopped, lost)
    Workers(worker::ListArgs),
    /// Run this host as a cluster worker ([cluster]; systemd: agent-state-worker.service), or drain one: `worker drain HOST`
    ///
    /// Without a subcommand: connect to the NATS servers of [cluster],
    /// register in the worker registry and renew the record every
    /// --heartbeat; pull one session order per free slot (--slots) from the
    /// queues of its credential groups, take the agent's lease, run the
    /// order's command in a process group of its own, stream its output and
    /// its end to the output stream, release the lease. A drain request
    /// (`worker drain HOST`) stops the pulling; running sessions finish.
    /// A credential group with `[credential.NAME] check` is checked at start
    /// and every `check_every`: while its check fails none of its orders is
    /// pulled (`workers` shows it "not working"). Below --min-free-disk on
    /// --work-dir or --min-free-memory it pulls nothing and says why. An
    /// order whose spec is malformed or too large, or whose cwd is a symlink
    /// or not a directory, ends "not started" naming the field.
    /// A session's hook calls (session begin|end|fail, record, send) go
    /// to the controller through a socket of the worker's
    /// (AGENT_STATE_HOOKS), stamped with the session's lease: they need no
    /// state root on this host.
    /// Until the servers answer, it retries every 2 s (and says so once).
    /// SIGTERM or SIGINT: it pulls no more, ends its sessions (SIGTERM to
    /// each group, SIGKILL after the grace), writes its last record
    /// ("stopped") and exits 0. systemd: Type=notify, READY=1 once
    /// registered.
    ///
    /// Exit status: 0 stopped by a signal; 64 a bad --host, --slots,
    /// --credential-group, --heartbeat, --work-dir, --min-free-disk or
    /// --min-free-memory, or another live worker of that --host; 69
    /// (drain, resume) NATS did not
    /// answer; 66 (drain, resume) no such worker; 78 no [cluster] in the
    /// config.
    Worker(worker::Args),
    /// Show the error log (.daemon/errors.jsonl), or the catalogue of error codes
    Errors(errors::Args),
    /// Every journal and the daemon's logs as one ordered stream, with cursors to resume from (--after) and --follow
    Events(events::Args),
}

/// What every command needs: the config, the root and one `now`.
pub struct Context {
    pub config: Config,
    pub root: StateRoot,
    pub now: Timestamp,
}

impl Context {
    pub fn load(path: &std::path::Path) -> Result<Context> {
        Ok(Context::with(Config::load(path)?))
    }

    /// [`Context::load`], or, if the file is invalid, the last configuration
    /// the daemon accepted (said on stderr): a typo in config.toml must not
    /// break the hooks of running sessions or reading the state.
    pub fn load_or_accepted(path: &std::path::Path) -> Result<Context> {
        let (config, fallback) = Config::load_or_accepted(path)?;
        if let Some(fallback) = fallback {
            warn(fallback);
        }
        Ok(Context::with(config))
    }

    fn with(config: Config) -> Context {
        let root = StateRoot::new(&config.state_root);
        Context {
            config,
            root,
            now: Timestamp::now(),
        }
    }

    /// Validate a name from the command line and find its config and dir.
    pub fn agent(&self, name: &str) -> Result<(&AgentConfig, AgentDir)> {
        let agent = self.config.agent_named(name)?;
        let dir = self.root.agent(&agent.name);
        Ok((agent, dir))
    }

    /// Like [`Context::agent`], but refuses a human mailbox: it has no
    /// sessions, tasks, metrics or prompt.
    pub fn working_agent(&self, name: &str) -> Result<(&AgentConfig, AgentDir)> {
        let (agent, dir) = self.agent(name)?;
        crate::hooks::refuse_human(agent)?;
        Ok((agent, dir))
    }
}

pub fn run(cli: Cli) -> Result<u8> {
    display::init(cli.color);
    if let Command::Errors(a) = &cli.command
        && a.catalogue
    {
        return Ok(errors::catalogue());
    }
    // The owner keeper needs no config: it only holds a lock.
    if let Command::Session(session::Command::Keep(a)) = &cli.command {
        return Ok(session::keep(a));
    }
    // A session on a cluster worker: its hook calls go to the controller
    // through the worker (no state root here).
    if let Some(socket) = hookcall::socket()
        && let Some((hook, call)) = hookcall::call_of(&cli.command)?
    {
        return Ok(hookcall::forward(&socket, hook, &call));
    }
    // What sets up state, runs from the config or installs it needs the file
    // itself to be valid; everything else works on the daemon's last
    // accepted config when the file has a typo.
    let ctx = match &cli.command {
        Command::Bootstrap(_) | Command::Check(_) | Command::Daemon(_) => {
            Context::load(&cli.config)?
        }
        Command::Reload(a) => return reload::run(&cli.config, a),
        Command::MigrateCrontab(a) => return migrate::run(&cli.config, a),
        _ => Context::load_or_accepted(&cli.config)?,
    };
    match cli.command {
        Command::Bootstrap(a) => bootstrap::run(&ctx, a),
        Command::Session(c) => session::run(&ctx, c),
        Command::Send(a) => send::run(&ctx, a),
        Command::Inbox(a) => inbox::run(&ctx, a),
        Command::Task(c) => task::run(&ctx, c),
        Command::Status(a) => status::run(&ctx, a),
        Command::Health(a) => health::run(&ctx, a),
        Command::Usage(a) => usage::run(&ctx, a),
        Command::Workspaces(a) => workspaces::run(&ctx, a),
        Command::Flow(c) => flow::run(&ctx, c),
        Command::Doctor(a) => doctor::run(&ctx, a),
        Command::Backup(a) => backup::backup(&ctx, a),
        Command::Restore(a) => backup::restore(&ctx, a),
        Command::Prompt(a) => prompt::run(&ctx, a),
        Command::Record(a) => record::run(&ctx, a),
        Command::Check(a) => check::run(&ctx, a),
        Command::Metrics(c) => metrics::run(&ctx, c),
        Command::Daemon(a) => daemon::run(ctx, a),
        Command::Wake(a) => wake::run(&ctx, a),
        Command::Stop(a) => stop::run(&ctx, a),
        Command::Credential(c) => credential::run(&ctx, c),
        Command::Reload(a) => reload::run(&cli.config, &a),
        Command::MigrateCrontab(_) => unreachable!("run before the config is loaded"),
        Command::Errors(a) => errors::run(&ctx, a),
        Command::Events(a) => events::run(&ctx, a),
        Command::Workers(a) => worker::list(&ctx, a),
        Command::Worker(a) => worker::run(ctx, a),
    }
}

pub fn warn(message: impl std::fmt::Display) {
    eprintln!(
        "agent-state: warning: {}",
        display::clean(&message.to_string())
    );
}

/// Print repair notes and the like on stderr.
pub fn print_notes(notes: &[String]) {
    for n in notes {
        warn(n);
    }
}

/// Print JSON on stdout, escaped by the CLI's one JSON printer ([`json`]).
pub fn print_json<T: serde::Serialize>(value: &T) -> Result<u8> {
    let text = json::to_string_pretty(value)?;
    println!("{text}");
    Ok(exit::OK)
}

#[cfg(test)]
mod help_tests {
    use clap::CommandFactory;

    /// `--help` lists every exit code the program uses.
    #[test]
    fn the_help_lists_every_exit_code() {
        use crate::error::exit;
        for code in [
            exit::OK,
            exit::FAILED,
            exit::USAGE,
            exit::DATAERR,
            exit::NOINPUT,
            exit::NOUSER,
            exit::UNAVAILABLE,
            exit::SOFTWARE,
            exit::OSERR,
            exit::CANTCREAT,
            exit::IOERR,
            exit::TEMPFAIL,
            exit::NOPERM,
            exit::CONFIG,
        ] {
            assert!(
                super::LONG_ABOUT.contains(&format!("\n  {code:<3} ")),
                "exit code {code} is not in the help"
            );
        }
    }

    /// Every argument of every subcommand says what it is for.
    #[test]
    fn every_argument_has_a_help_line() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() && !sub.is_hide_set() {
                    missing.push(format!("{path} {} (the subcommand)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "agent-state", &mut missing);
        assert!(
            missing.is_empty(),
            "arguments without a help line:\n{}",
            missing.join("\n")
        );
    }
}
