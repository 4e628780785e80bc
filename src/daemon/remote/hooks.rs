//! The controller's end of the sessions' hook calls from workers (issue
//! 24; the protocol and its checks are [`agent_state_cluster::hooks`]).
//!
//! Started once the daemon is connected to the cluster: it listens on
//! `<output_stream>.hooks.*` and answers each request:
//!
//! 1. at most [`MAX_REQUEST_BYTES`], a [`HookRequest`] whose agent is the
//!    subject's;
//! 2. from the holder of the lease `run/<agent>`, for that order, at the
//!    revision it holds now ([`check_lease`]);
//! 3. a hook subcommand with its own options, for the order's agent and
//!    session ([`check_call`], which forces both);
//! 4. then the hook runs as the session's script would run it on this
//!    host: this binary (`/proc/self/exe`), a child of the daemon, with the
//!    daemon's config and the session's `AGENT_STATE_AGENT` and
//!    `AGENT_STATE_SESSION_ID`, at most [`RUN_WITHIN`]; its exit code, and
//!    its stdout and stderr (each at most [`MAX_OUTPUT_BYTES`]), are the
//!    answer. A script's `session begin` joins the running session, its
//!    `session end` is heard through session.json as a local script's.
//!
//! A refused request changes nothing; the answer says why.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use agent_state_cluster::async_nats;
use agent_state_cluster::hooks::{
    self, MAX_OUTPUT_BYTES, MAX_REQUEST_BYTES, bounded, check_call, check_lease,
};
use agent_state_cluster::{ClusterSettings, HookAnswer, HookRequest, Leases, Refusal};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

/// The longest a hook may run here (`session begin` may wait 10 s for a
/// lock).
pub const RUN_WITHIN: Duration = Duration::from_secs(60);
/// How long the lease may take to read.
const LEASE_WITHIN: Duration = Duration::from_secs(10);
/// Hooks run at once; more wait their turn.
const AT_ONCE: usize = 8;

/// What the service needs: the line to NATS, the lease bucket, and the
/// config the hooks run with.
pub struct HookService {
    pub client: async_nats::Client,
    pub settings: ClusterSettings,
    pub leases: Leases,
    pub config: PathBuf,
}

impl HookService {
    /// Subscribes (the subscription is in place when this returns) and
    /// serves in the background.
    pub async fn start(self) -> Result<(), async_nats::SubscribeError> {
        let subject = hooks::subject_all(&self.settings);
        let mut requests = self
            .client
            .queue_subscribe(subject.clone(), "agent-state-controller".into())
            .await?;
        let _ = self.client.flush().await;
        tracing::info!("serving the sessions' hook calls from workers on {subject}");
        let service = Arc::new(self);
        let turns = Arc::new(Semaphore::new(AT_ONCE));
        tokio::spawn(async move {
            while let Some(message) = requests.next().await {
                let Some(reply) = message.reply.clone() else {
                    continue;
                };
                let service = service.clone();
                let turns = turns.clone();
                tokio::spawn(async move {
                    let _turn = turns.acquire().await;
                    let answer = service.answer(&message.subject, &message.payload).await;
                    let bytes = serde_json::to_vec(&answer).expect("an answer serialises");
                    if let Err(e) = service.client.publish(reply, bytes.into()).await {
                        tracing::warn!("cannot answer a hook call: {e}");
                    }
                });
            }
        });
        Ok(())
    }

    async fn answer(&self, subject: &str, payload: &[u8]) -> HookAnswer {
        if payload.len() > MAX_REQUEST_BYTES {
            return Refusal::TooBig {
                what: format!("the request ({} bytes)", payload.len()),
                limit: MAX_REQUEST_BYTES,
            }
            .answer();
        }
        let req: HookRequest = match serde_json::from_slice(payload) {
            Ok(r) => r,
            Err(e) => return Refusal::Malformed(e.to_string()).answer(),
        };
        if subject.rsplit('.').next() != Some(req.agent.as_str()) {
            return Refusal::Malformed(format!("sent on {subject} for agent {:?}", req.agent))
                .answer();
        }
        let refused = |r: Refusal| {
            tracing::warn!(
                agent = %req.agent,
                session_id = %req.session,
                host = %req.holder,
                "a hook call from a worker is refused: {r}"
            );
            r.answer()
        };
        let current =
            match tokio::time::timeout(LEASE_WITHIN, self.leases.current(&req.agent)).await {
                Ok(Ok(current)) => current,
                Ok(Err(e)) => {
                    return HookAnswer::Unreachable {
                        reason: format!("the controller cannot read the lease: {e}"),
                    };
                }
                Err(_) => {
                    return HookAnswer::Unreachable {
                        reason: format!("the controller read no lease within {LEASE_WITHIN:?}"),
                    };
                }
            };
        if let Err(r) = check_lease(&req, current.as_ref()) {
            return refused(r);
        }
        let argv = match check_call(&req.call, &req.agent, &req.session) {
            Ok(argv) => argv,
            Err(r) => return refused(r),
        };
        tracing::info!(
            agent = %req.agent,
            session_id = %req.session,
            host = %req.holder,
            "a hook call from the worker: {}",
            req.call.command.join(" ")
        );
        self.run(&req, argv).await
    }

    /// Runs the hook as a child of the daemon, as its local script would.
    async fn run(&self, req: &HookRequest, argv: Vec<String>) -> HookAnswer {
        use std::os::unix::process::CommandExt as _;
        let mut command = std::process::Command::new("/proc/self/exe");
        command.arg0("agent-state");
        let mut command = tokio::process::Command::from(command);
        command
            .arg(format!("--config={}", self.config.display()))
            .args(&argv)
            .env_remove(hooks::HOOKS_ENV)
            .env_remove("AGENT_STATE_OWNER_PID");
        // As a local session's: the daemon's systemd sockets are not its.
        for name in [
            "NOTIFY_SOCKET",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "LISTEN_FDS",
            "LISTEN_PID",
        ] {
            command.env_remove(name);
        }
        command
            .env("AGENT_STATE_CONFIG", &self.config)
            .env("AGENT_STATE_AGENT", &req.agent)
            .env("AGENT_STATE_SESSION_ID", &req.session)
            .env("AGENT_STATE_WORKER", &req.holder)
            .stdin(if req.call.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match command.spawn() {
            Ok(c) => c,
            Err(e) => {
                return HookAnswer::Ran {
                    code: 71,
                    stdout: String::new(),
                    stderr: format!(
                        "agent-state: error: the controller cannot run the hook: {e}\n"
                    ),
                };
            }
        };
        if let (Some(mut pipe), Some(text)) = (child.stdin.take(), req.call.stdin.clone()) {
            tokio::spawn(async move {
                let _ = pipe.write_all(text.as_bytes()).await;
                let _ = pipe.shutdown().await;
            });
        }
        // The child is this binary running one hook: a few lines of output.
        match tokio::time::timeout(RUN_WITHIN, child.wait_with_output()).await {
            Ok(Ok(out)) => HookAnswer::Ran {
                code: out
                    .status
                    .code()
                    .and_then(|c| u8::try_from(c).ok())
                    .unwrap_or(70),
                stdout: bounded(&out.stdout, MAX_OUTPUT_BYTES),
                stderr: bounded(&out.stderr, MAX_OUTPUT_BYTES),
            },
            Ok(Err(e)) => HookAnswer::Ran {
                code: 71,
                stdout: String::new(),
                stderr: format!("agent-state: error: the controller lost the hook: {e}\n"),
            },
            Err(_) => HookAnswer::Ran {
                code: 75,
                stdout: String::new(),
                stderr: format!(
                    "agent-state: error: the hook did not finish within {RUN_WITHIN:?} on the controller and was killed; try again\n"
                ),
            },
        }
    }
}
