//! Starting one order's process on this worker: its command (arguments,
//! environment, directory, the socket of its hook calls), its output's
//! spool (made first: a session whose output cannot be kept does not run),
//! its cgroup, the relay of its pipes and the prompt on its stdin.

use std::path::Path;

use super::*;
use crate::daemon::cgroup::SessionCgroup;

/// The order being started, as its process sees it.
pub(super) struct Launch<'a> {
    /// The order's id.
    pub id: &'a str,
    pub agent: &'a str,
    pub host: &'a str,
    pub spec: &'a SessionSpec,
    /// Its directory: the worktree made for it, or the spec's `cwd`.
    pub dir: Option<&'a Path>,
    /// The lease's revision at the take.
    pub revision: u64,
    /// The wall clock now (the worker's loop reads it).
    pub at: SystemTime,
}

/// Why the process was not started.
#[derive(Debug, thiserror::Error)]
pub(super) enum SpawnError {
    #[error("cannot create its output spool in {}: {source}", dir.display())]
    Spool {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start {command}: {source}")]
    Start {
        command: String,
        source: std::io::Error,
    },
}

/// A session's process, started, and what lives as long as it does.
pub(super) struct Started {
    pub child: tokio::process::Child,
    pub relay: relay::Relay,
    /// The socket its hook calls come in on (none: they reach no
    /// controller); closed once its end is on its way.
    pub hook_socket: Option<hooks::Listening>,
    pub cgroup: Option<SessionCgroup>,
    /// The wall clock at its start.
    pub at: SystemTime,
    /// The lease revision its hook calls carry, updated by each renewal.
    pub revision: Arc<AtomicU64>,
}

/// Starts it. `Err`: why it could not (its spool removed and its cgroup
/// killed already; nothing of it runs).
pub(super) async fn start(shared: &Shared, launch: Launch<'_>) -> Result<Started, SpawnError> {
    let Launch {
        id,
        agent,
        host,
        spec,
        dir,
        revision,
        at,
    } = launch;
    // The agent's session id, as a local session has it: the controller's
    // order says it; a bare order (no controller) has its order id.
    let agent_session = spec
        .env
        .get("AGENT_STATE_SESSION_ID")
        .cloned()
        .unwrap_or_else(|| id.to_string());
    let revision = Arc::new(AtomicU64::new(revision));
    let hook_socket = shared.hooks.as_ref().and_then(|h| {
        h.listen(hooks::Stamp {
            agent: agent.to_string(),
            session: agent_session.clone(),
            order: id.to_string(),
            holder: host.to_string(),
            revision: revision.clone(),
        })
        .map_err(|e| {
            log(format!(
                "session {id}: cannot listen for its hook calls: {e}; they reach no controller"
            ))
        })
        .ok()
    });
    let mut command = tokio::process::Command::new(&spec.command);
    command
        .args(&spec.args)
        .envs(&spec.env)
        .env("AGENT_STATE_SESSION_ID", &agent_session)
        .env("AGENT_STATE_AGENT", agent)
        .env("AGENT_STATE_WORKER", host)
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    match &hook_socket {
        Some(socket) => command.env(agent_state_cluster::hooks::HOOKS_ENV, &socket.path),
        None => command.env_remove(agent_state_cluster::hooks::HOOKS_ENV),
    };
    // Its output's local copy first: a session whose output could not be
    // kept does not run.
    let header = spool::Header {
        session_id: id.to_string(),
        agent: agent.to_string(),
        host: host.to_string(),
        started_ms: unix_ms(at),
    };
    let spool_file = spool::SpoolFile::create(&shared.spool_dir, &header).map_err(|source| {
        SpawnError::Spool {
            dir: shared.spool_dir.clone(),
            source,
        }
    })?;
    let session_cgroup = cgroup::session(id, spec.memory_max);
    if let Some(cg) = &session_cgroup {
        cgroup::join_at_exec(&mut command, cg);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(source) => {
            let _ = std::fs::remove_file(spool::path(&shared.spool_dir, id));
            cgroup::kill(session_cgroup).await;
            return Err(SpawnError::Start {
                command: spec.command.clone(),
                source,
            });
        }
    };
    if let (Some(cg), Some(pid)) = (&session_cgroup, child.id()) {
        cgroup::after_spawn(id, cg, pid);
    }
    let pipes: Vec<(&'static str, Box<dyn tokio::io::AsyncRead + Unpin + Send>)> = [
        child.stdout.take().map(|p| {
            (
                "stdout",
                Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            )
        }),
        child.stderr.take().map(|p| {
            (
                "stderr",
                Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            )
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    let relay = relay::Relay::start(
        shared.output.clone(),
        id,
        spool_file,
        shared.options.spool_limit,
        pipes,
    );
    // The prompt, written beside the session (a child that does not read
    // it must not hold the worker up); closed once written.
    if let (Some(mut stdin), Some(text)) = (child.stdin.take(), spec.stdin.clone()) {
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = stdin.write_all(text.as_bytes()).await;
            let _ = stdin.shutdown().await;
        });
    }
    Ok(Started {
        child,
        relay,
        hook_socket,
        cgroup: session_cgroup,
        at,
        revision,
    })
}
