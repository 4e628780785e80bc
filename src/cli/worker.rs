//! The cluster's workers (issue 24), from the command line:
//!
//! - `agent-state workers [--json]`: every worker in the registry, its
//!   slots, sessions, last heartbeat, credential groups and state;
//! - `agent-state worker drain HOST` / `worker resume HOST`: ask a worker to
//!   stop pulling orders (its sessions finish), or to pull again;
//! - `agent-state worker`: run this host as a worker ([`crate::worker`]).
//!
//! All of them need `[cluster]` in the config; the listing and the drain
//! create nothing on the cluster but the drain request itself.

use std::time::{Duration, SystemTime};

use agent_state_cluster::workers::since_stored;
use agent_state_cluster::{
    Cluster, ClusterSettings, LeaseTiming, WorkerEntry, WorkerState, WorkerTiming, Workers,
    worker_state,
};
use serde::Serialize;

use crate::cli::{Context, VERSION, print_json};
use crate::error::{ConfigError, Error, Problem, Result, exit};

/// How long the operator's commands wait for the servers.
const ASK_WITHIN: Duration = Duration::from_secs(10);

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Ask worker HOST to pull no more orders; its running sessions finish (`workers` shows it draining, then drained)
    Drain(HostArgs),
    /// Withdraw a drain: worker HOST pulls orders again
    Resume(HostArgs),
}

#[derive(clap::Args, Debug)]
pub struct HostArgs {
    /// The worker's host name, as `agent-state workers` lists it
    pub host: String,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// This worker's name in the registry and in the leases (default: the machine's host name); one live worker per name: a second one exits 64
    #[arg(long, env = "AGENT_STATE_WORKER_HOST", value_name = "NAME")]
    pub host: Option<String>,
    /// How many sessions it runs at once
    #[arg(
        long,
        env = "AGENT_STATE_WORKER_SLOTS",
        default_value_t = 1,
        value_name = "N"
    )]
    pub slots: usize,
    /// A credential group whose orders it takes (repeat for several; comma-separated in the variable). A group with `[credential.NAME] check` in the config is checked at start and every `check_every`; while its check fails the worker pulls none of its orders
    #[arg(
        long = "credential-group",
        env = "AGENT_STATE_WORKER_GROUPS",
        value_delimiter = ',',
        default_value = crate::config::DEFAULT_CREDENTIAL,
        value_name = "GROUP"
    )]
    pub groups: Vec<String>,
    /// How often it renews its record in the registry (it counts as lost after four missed)
    #[arg(long, env = "AGENT_STATE_WORKER_HEARTBEAT", default_value = "5s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub heartbeat: Duration,
    /// The worker's directory: its free space is checked before each pull, and each session's output is kept in DIR/spool until NATS has stored it (default: the current directory; the unit's is /var/lib/agent-state)
    #[arg(long, env = "AGENT_STATE_WORKER_DIR", value_name = "DIR")]
    pub work_dir: Option<std::path::PathBuf>,
    /// It pulls no order while the work directory has less free space than this, e.g. 1GiB (0: not checked)
    #[arg(long, env = "AGENT_STATE_WORKER_MIN_FREE_DISK", default_value = "1GiB", value_parser = crate::config::parse_size, value_name = "SIZE")]
    pub min_free_disk: u64,
    /// It pulls no order while MemAvailable (/proc/meminfo) is below this, e.g. 512MiB (0: not checked)
    #[arg(long, env = "AGENT_STATE_WORKER_MIN_FREE_MEMORY", default_value = "512MiB", value_parser = crate::config::parse_size, value_name = "SIZE")]
    pub min_free_memory: u64,
    /// The most of a session's output its spool holds while NATS stores none of it, e.g. 256MiB; past it the session is ended as an error
    #[arg(long, env = "AGENT_STATE_WORKER_MAX_SPOOL", default_value = "256MiB", value_parser = crate::config::parse_size, value_name = "SIZE")]
    pub max_spool: u64,
}

/// `[cluster]`, or the configuration error that says how to add it.
fn settings(ctx: &Context, command: &str) -> Result<ClusterSettings> {
    ctx.config.cluster.clone().ok_or_else(|| {
        Error::Config(ConfigError::Invalid {
            path: ctx.config.source.clone(),
            problems: vec![Problem {
                field: "[cluster]".into(),
                message: format!(
                    "is missing, and `agent-state {command}` needs it; add the NATS servers, e.g. [cluster] urls = [\"nats://10.0.0.1:4222\", \"nats://10.0.0.2:4222\", \"nats://10.0.0.3:4222\"]"
                ),
            }],
        })
    })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the async runtime for", "the worker", e))
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// The registry as found (`None`: no worker ever registered), within
/// [`ASK_WITHIN`].
async fn registry(settings: &ClusterSettings) -> Result<Option<Workers>> {
    let work = async {
        let name = format!("agent-state workers on {}", this_host());
        let cluster = Cluster::connect(settings, &name)
            .await
            .map_err(|e| e.to_string())?;
        cluster.existing_workers().await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(ASK_WITHIN, work).await {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(e)) => Err(Error::Unavailable(e)),
        Err(_) => Err(Error::Unavailable(format!(
            "NATS at {} did not answer within {ASK_WITHIN:?}; check cluster.urls and that nats-server runs there (`agent-state doctor`)",
            settings.urls.join(",")
        ))),
    }
}

#[derive(Serialize)]
struct Listed {
    host: String,
    state: WorkerState,
    version: String,
    slots: usize,
    slots_used: usize,
    sessions: Vec<ListedSession>,
    credentials: Vec<agent_state_cluster::CredentialState>,
    /// Seconds since the server stored the last heartbeat.
    heartbeat_age_secs: f64,
    /// The worker's clock at its last heartbeat, RFC 3339.
    heartbeat_at: String,
    drain_requested: bool,
    drained: bool,
    /// Why it pulls no order though it could (low disk or memory).
    #[serde(skip_serializing_if = "Option::is_none")]
    not_pulling: Option<String>,
}

#[derive(Serialize)]
struct ListedSession {
    session_id: String,
    agent: String,
    started: String,
}

fn rfc3339(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

fn listed(entry: &WorkerEntry, now: SystemTime) -> Listed {
    let r = &entry.record;
    let age = since_stored(entry.stored_at, now);
    let timing = WorkerTiming::beating_every(Duration::from_millis(r.heartbeat_every_ms.max(1)));
    Listed {
        host: r.host.clone(),
        state: worker_state(&timing, r, age, entry.drain_requested),
        version: r.version.clone(),
        slots: r.slots,
        slots_used: r.sessions.len(),
        sessions: r
            .sessions
            .iter()
            .map(|s| ListedSession {
                session_id: s.session_id.clone(),
                agent: s.agent.clone(),
                started: rfc3339(s.started_ms),
            })
            .collect(),
        credentials: r.credentials.clone(),
        heartbeat_age_secs: (age.as_millis() as f64 / 1000.0),
        heartbeat_at: rfc3339(r.heartbeat_ms),
        drain_requested: entry.drain_requested,
        drained: r.drained,
        not_pulling: r.not_pulling.clone(),
    }
}

fn age_text(secs: f64) -> String {
    let secs = secs as u64;
    if secs < 120 {
        format!("{secs}s ago")
    } else if secs < 7200 {
        format!("{}m ago", secs / 60)
    } else if secs < 172_800 {
        format!("{}h ago", secs / 3600)
    } else {
        format!("{}d ago", secs / 86_400)
    }
}

/// `agent-state workers`
pub fn list(ctx: &Context, args: ListArgs) -> Result<u8> {
    let settings = settings(ctx, "workers")?;
    let entries = runtime()?.block_on(async {
        let Some(registry) = registry(&settings).await? else {
            return Ok(Vec::new());
        };
        tokio::time::timeout(ASK_WITHIN, registry.list())
            .await
            .map_err(|_| {
                Error::Unavailable(format!(
                    "NATS did not list the workers within {ASK_WITHIN:?}"
                ))
            })?
            .map_err(|e| Error::Unavailable(e.to_string()))
    })?;
    let now = SystemTime::now();
    let listed: Vec<Listed> = entries.iter().map(|e| listed(e, now)).collect();
    if args.json {
        return print_json(&listed);
    }
    if listed.is_empty() {
        println!(
            "no workers: none has registered in {} (start `agent-state worker` on a worker host)",
            settings.worker_bucket
        );
        return Ok(exit::OK);
    }
    println!(
        "{:<24} {:>5}  {:<28} {:>10}  {:<20} STATE",
        "HOST", "SLOTS", "SESSIONS", "HEARTBEAT", "CREDENTIALS"
    );
    for l in &listed {
        let sessions = if l.sessions.is_empty() {
            "-".to_string()
        } else {
            l.sessions
                .iter()
                .map(|s| s.agent.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        let credentials = l
            .credentials
            .iter()
            .map(|c| {
                if c.working {
                    c.group.clone()
                } else {
                    format!("{}(not working)", c.group)
                }
            })
            .collect::<Vec<_>>()
            .join(",");
        println!(
            "{:<24} {:>5}  {:<28} {:>10}  {:<20} {}{}",
            l.host,
            format!("{}/{}", l.slots_used, l.slots),
            sessions,
            age_text(l.heartbeat_age_secs),
            credentials,
            l.state.as_str(),
            l.not_pulling
                .as_ref()
                .map(|why| format!(" (pulling no order: {why})"))
                .unwrap_or_default()
        );
    }
    Ok(exit::OK)
}

/// `agent-state worker …`
pub fn run(ctx: Context, args: Args) -> Result<u8> {
    match args.command {
        Some(Command::Drain(h)) => drain(&ctx, &h.host, true),
        Some(Command::Resume(h)) => drain(&ctx, &h.host, false),
        None => serve(ctx, args.run),
    }
}

fn drain(ctx: &Context, host: &str, on: bool) -> Result<u8> {
    let command = if on { "worker drain" } else { "worker resume" };
    let settings = settings(ctx, command)?;
    agent_state_cluster::workers::check_host(host).map_err(|e| Error::Usage(e.to_string()))?;
    runtime()?.block_on(async {
        let no_such = || {
            Error::NotFound(format!(
                "no worker {host:?} has registered; `agent-state workers` lists them"
            ))
        };
        let registry = registry(&settings).await?.ok_or_else(no_such)?;
        let work = async {
            let entry = registry.get(host).await?;
            if entry.is_none() {
                return Ok(None);
            }
            registry.request_drain(host, on).await?;
            Ok::<_, agent_state_cluster::WorkersError>(entry)
        };
        let entry = tokio::time::timeout(ASK_WITHIN, work)
            .await
            .map_err(|_| Error::Unavailable(format!("NATS did not answer within {ASK_WITHIN:?}")))?
            .map_err(|e| Error::Unavailable(e.to_string()))?
            .ok_or_else(no_such)?;
        let every = Duration::from_millis(entry.record.heartbeat_every_ms);
        if on {
            println!(
                "{host}: drain requested; it pulls no new order from its next heartbeat (within {every:?}), its {} running session(s) finish; `agent-state workers` shows it draining, then drained",
                entry.record.sessions.len()
            );
        } else {
            println!("{host}: drain withdrawn; it pulls orders again from its next heartbeat (within {every:?})");
        }
        Ok(exit::OK)
    })
}

fn serve(ctx: Context, args: RunArgs) -> Result<u8> {
    let settings = settings(&ctx, "worker")?;
    let credentials = ctx.config.credentials.clone();
    let workspaces = workspace_allowances(&ctx);
    // The worktrees it prunes: its own config's agents with a workspace.
    let prune = crate::daemon::workspaces::prune_jobs(ctx.config.agents.iter(), |a| {
        ctx.root.agent(&a.name)
    });
    let config = ctx.config.source.clone();
    drop(ctx);
    let host = args.host.unwrap_or_else(this_host);
    agent_state_cluster::workers::check_host(&host).map_err(|e| {
        Error::Usage(format!(
            "{e}; name the worker with --host NAME (or AGENT_STATE_WORKER_HOST)"
        ))
    })?;
    if args.slots == 0 {
        return Err(Error::Usage(
            "--slots 0 would run nothing; give at least 1".into(),
        ));
    }
    let mut groups = Vec::new();
    for g in args.groups {
        let g = g.trim().to_string();
        if g.is_empty()
            || !g
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(Error::Usage(format!(
                "--credential-group {g:?}: only letters, digits, '-' and '_'"
            )));
        }
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    if args.heartbeat < Duration::from_millis(100) {
        return Err(Error::Usage(format!(
            "--heartbeat {:?} is shorter than 100ms; write e.g. 5s",
            args.heartbeat
        )));
    }
    // A session that closes its end of a pipe must never kill the worker.
    // SAFETY: before the runtime and any other thread start.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    let work_dir = match args.work_dir {
        Some(d) => d,
        None => {
            std::env::current_dir().map_err(|e| Error::io("reading", "the current directory", e))?
        }
    };
    if args.max_spool < 1 << 20 {
        return Err(Error::Usage(format!(
            "--max-spool {} is less than 1MiB; write e.g. 256MiB",
            args.max_spool
        )));
    }
    if !work_dir.is_dir() {
        return Err(Error::Usage(format!(
            "--work-dir {}: not a directory; give the directory the sessions work in",
            work_dir.display()
        )));
    }
    let options = crate::worker::Options {
        host,
        slots: args.slots,
        groups: groups.clone(),
        heartbeat: args.heartbeat,
        version: VERSION.to_string(),
        lease_timing: LeaseTiming::DEFAULT,
        spool_limit: args.max_spool,
        minimums: crate::worker::Minimums {
            work_dir,
            disk_bytes: args.min_free_disk,
            memory_bytes: args.min_free_memory,
        },
        workspaces,
        prune,
        config,
        checks: groups
            .iter()
            .filter_map(|g| {
                let c = credentials.get(g)?;
                Some((
                    g.clone(),
                    crate::worker::GroupCheck {
                        command: c.check.clone()?,
                        every: c.check_every,
                    },
                ))
            })
            .collect(),
    };
    runtime()?
        .block_on(crate::worker::run(settings, options))
        .map_err(|e| match e {
            // A usage error (exit 64): the unit does not restart it.
            crate::worker::WorkerError::DuplicateHost { .. } => Error::Usage(e.to_string()),
            e => Error::Unavailable(e.to_string()),
        })?;
    Ok(exit::OK)
}

/// Where this host's config puts each agent's worktrees: the only places
/// an order's workspace is made ([`crate::worker::workspace`]).
fn workspace_allowances(ctx: &Context) -> crate::worker::workspace::Allowances {
    ctx.config
        .agents
        .iter()
        .filter_map(|a| {
            let w = a.session.workspace.as_ref()?;
            let dir = ctx.root.agent(&a.name);
            Some((
                a.name.to_string(),
                crate::worker::workspace::Allowed {
                    repo: w.repo.clone(),
                    root: crate::daemon::workspaces::root_of(w, a, &dir),
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_state_cluster::workers::unix_ms;

    #[test]
    fn heartbeat_ages() {
        let table: &[(f64, &str)] = &[
            (0.4, "0s ago"),
            (59.9, "59s ago"),
            (119.0, "119s ago"),
            (120.0, "2m ago"),
            (7199.0, "119m ago"),
            (7200.0, "2h ago"),
            (200_000.0, "2d ago"),
        ];
        for &(secs, want) in table {
            assert_eq!(age_text(secs), want, "{secs}");
        }
    }

    #[test]
    fn unix_ms_reads_back_as_rfc3339() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(rfc3339(unix_ms(t)), "2026-11-18T11:06:40Z");
    }
}
