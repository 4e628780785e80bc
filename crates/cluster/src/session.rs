//! A remote session's spec, output and end.
//!
//! - [`SessionSpec`]: what a worker runs (the order's `spec`): a command,
//!   its arguments, environment, working directory and timeout. The seam
//!   the controller fills from the daemon's session spec.
//! - [`Output`]: the output stream (`cluster.output_stream`). A session's
//!   output goes to `<stream>.out.<session id>` in numbered chunks (header
//!   `Agent-State-Chunk`, from 1), its end to `<stream>.end.<session id>`
//!   (a [`SessionEnd`], carrying the last chunk's number and the lease
//!   revision). It is a JetStream stream, not core NATS: the controller
//!   that restarts, or that was cut off for a while, replays a session's
//!   output from chunk 1 (or from the last it has) instead of losing it,
//!   and a worker knows its chunk is stored once the server has acked it.
//!   Each chunk carries `Nats-Msg-Id` `<session>.<n>` (and the end
//!   `<session>.end`), so a chunk sent again after a lost ack is stored once.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, message::PublishMessage, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

/// How long the output stream keeps a session's output and end.
pub const OUTPUT_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The header that numbers a chunk.
pub const CHUNK_HEADER: &str = "Agent-State-Chunk";
/// The header naming the chunk's pipe: `stdout` or `stderr`.
pub const PIPE_HEADER: &str = "Agent-State-Pipe";

/// What a worker runs for an order (the order's `spec`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSpec {
    /// The program (absolute, or found on the worker's PATH).
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Added to the worker's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory (default: the worker's).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Killed after this many seconds (SIGTERM to its process group,
    /// SIGKILL `kill_grace_secs` later); none: no limit but the lease's.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub kill_grace_secs: Option<u64>,
    /// Written to the command's stdin, which is then closed (the session's
    /// prompt); none: stdin is /dev/null.
    #[serde(default)]
    pub stdin: Option<String>,
    /// The agent's `stall_timeout`: a session that prints nothing (on
    /// either pipe) for this many seconds is stalled. With `stall_action`
    /// `stop` the worker ends it like at its timeout and its end says
    /// [`Outcome::Stalled`]; with `warn` (or none) it only logs it (the
    /// controller's machine raises the warning). Added after the first
    /// release: a worker older than its controller refuses an order that
    /// carries it (`deny_unknown_fields`), so workers are updated first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_action: Option<StallAction>,
    /// The agent's `memory_max` in bytes: the session's cgroup's
    /// `memory.max` on a worker that gives sessions cgroups with the memory
    /// controller (logged as not applied elsewhere). Same rule as above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<u64>,
    /// The git worktree the session runs in (an agent with
    /// `[agent.session.workspace]`): made by the worker before the command
    /// runs, its cwd, judged after it ends ([`WorkspaceEnd`]). Absent from
    /// orders without one, so older workers still take those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceOrder>,
}

/// The worktree an order's session runs in, as the controller planned it:
/// the repository (its path on the worker), what the branch starts from,
/// the worktree's path and its branch. Someone else's input to the worker,
/// which checks it against its own config before git sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceOrder {
    pub repo: String,
    pub base: String,
    pub path: String,
    pub branch: String,
}

/// What became of an order's worktree, in its [`SessionEnd`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceEnd {
    /// It could not be made (or the order's was refused): the session did
    /// not start. `code`: the catalogue's (`WORKSPACE_NOT_A_REPO`,
    /// `WORKSPACE_LOCKED`, `WORKSPACE_FAILED`).
    NotMade { code: String, reason: String },
    /// Made, and judged after the session: session.json's `workspace`.
    Judged(WorkspaceJudged),
}

/// A worktree as judged after its session (the fields of session.json's
/// `workspace`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceJudged {
    pub path: String,
    pub branch: String,
    pub base_commit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_commit: Option<String>,
    pub dirty: bool,
    pub commits_ahead: u32,
    /// `kept`, `removed`, `reset` or `error`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set_aside: Vec<String>,
}

/// What a stall does on the worker (the agent's `stall_action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StallAction {
    /// Logged; the session runs on.
    Warn,
    /// Ended like at its timeout: [`Outcome::Stalled`].
    Stop,
}

impl SessionSpec {
    /// The spec of an order, or what is wrong with it.
    pub fn from_order(spec: &serde_json::Value) -> Result<SessionSpec, SpecError> {
        let spec: SessionSpec =
            serde_json::from_value(spec.clone()).map_err(|e| SpecError::Shape(e.to_string()))?;
        if spec.command.is_empty() {
            return Err(SpecError::NoCommand);
        }
        if let Some(cwd) = &spec.cwd
            && !cwd.starts_with('/')
        {
            return Err(SpecError::RelativeCwd(cwd.clone()));
        }
        spec.check_bounds()?;
        Ok(spec)
    }

    /// The spec is someone else's input: every string handed to exec is
    /// free of NUL and within Linux's bounds (one string at most
    /// [`MAX_STRING_BYTES`]), and the totals are bounded.
    fn check_bounds(&self) -> Result<(), SpecError> {
        let string = |field: String, text: &str, max: usize| {
            if text.contains('\0') {
                return Err(SpecError::Nul { field });
            }
            if text.len() > max {
                return Err(SpecError::TooBig {
                    field,
                    bytes: text.len(),
                    max,
                });
            }
            Ok(())
        };
        string("command".into(), &self.command, MAX_PATH_BYTES)?;
        if let Some(cwd) = &self.cwd {
            string("cwd".into(), cwd, MAX_PATH_BYTES)?;
        }
        if let Some(w) = &self.workspace {
            string("workspace.repo".into(), &w.repo, MAX_PATH_BYTES)?;
            string("workspace.path".into(), &w.path, MAX_PATH_BYTES)?;
            string("workspace.base".into(), &w.base, MAX_REF_BYTES)?;
            string("workspace.branch".into(), &w.branch, MAX_REF_BYTES)?;
        }
        if self.args.len() > MAX_ARGS {
            return Err(SpecError::TooMany {
                field: "args",
                count: self.args.len(),
                max: MAX_ARGS,
            });
        }
        let mut total = 0usize;
        for (i, arg) in self.args.iter().enumerate() {
            string(format!("args[{i}]"), arg, MAX_STRING_BYTES)?;
            total += arg.len() + 1;
        }
        if total > MAX_ARGS_BYTES {
            return Err(SpecError::TooBig {
                field: "args".into(),
                bytes: total,
                max: MAX_ARGS_BYTES,
            });
        }
        if self.env.len() > MAX_ENV_VARS {
            return Err(SpecError::TooMany {
                field: "env",
                count: self.env.len(),
                max: MAX_ENV_VARS,
            });
        }
        let mut total = 0usize;
        for (name, value) in &self.env {
            if name.is_empty() || name.contains('=') {
                return Err(SpecError::EnvName(name.clone()));
            }
            string(format!("env name {name:?}"), name, MAX_STRING_BYTES)?;
            string(format!("env.{name}"), value, MAX_STRING_BYTES)?;
            total += name.len() + value.len() + 2;
        }
        if total > MAX_ENV_BYTES {
            return Err(SpecError::TooBig {
                field: "env".into(),
                bytes: total,
                max: MAX_ENV_BYTES,
            });
        }
        if let Some(stdin) = &self.stdin
            && stdin.len() > MAX_STDIN_BYTES
        {
            return Err(SpecError::TooBig {
                field: "stdin".into(),
                bytes: stdin.len(),
                max: MAX_STDIN_BYTES,
            });
        }
        Ok(())
    }
}

/// At most this many arguments.
pub const MAX_ARGS: usize = 4096;
/// The arguments together (each with its NUL) at most this many bytes.
pub const MAX_ARGS_BYTES: usize = 1 << 20;
/// At most this many environment variables.
pub const MAX_ENV_VARS: usize = 1024;
/// The variables together (`NAME=value` and NUL) at most this many bytes.
pub const MAX_ENV_BYTES: usize = 512 * 1024;
/// One argument or value at most this long (Linux's MAX_ARG_STRLEN is
/// 128 KiB with its NUL).
pub const MAX_STRING_BYTES: usize = 128 * 1024 - 1;
/// `command` and `cwd` at most this long (PATH_MAX with its NUL).
pub const MAX_PATH_BYTES: usize = 4095;
/// A workspace's `base` and `branch` at most this long.
pub const MAX_REF_BYTES: usize = 255;
/// The prompt (`stdin`) at most this many bytes.
pub const MAX_STDIN_BYTES: usize = 8 << 20;

/// Is `cwd` a directory, and not a symlink to one? Checked on the worker
/// (the spec came from elsewhere) before the session starts.
pub fn check_cwd(cwd: &std::path::Path) -> Result<(), SpecError> {
    let why = match std::fs::symlink_metadata(cwd) {
        Err(e) => e.to_string(),
        Ok(m) if m.file_type().is_symlink() => {
            "is a symbolic link; give the directory itself".to_string()
        }
        Ok(m) if !m.is_dir() => "is not a directory".to_string(),
        Ok(_) => return Ok(()),
    };
    Err(SpecError::Cwd {
        cwd: cwd.display().to_string(),
        why,
    })
}

/// What is wrong with an order's spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("the order's spec: {0}")]
    Shape(String),
    #[error("the order's spec: `command` is empty")]
    NoCommand,
    #[error("the order's spec: `cwd` {0:?} is not an absolute path")]
    RelativeCwd(String),
    #[error("the order's spec: `{field}` contains a NUL byte, which no program can be given")]
    Nul { field: String },
    #[error("the order's spec: `{field}` is {bytes} bytes, more than {max}")]
    TooBig {
        field: String,
        bytes: usize,
        max: usize,
    },
    #[error("the order's spec: `{field}` has {count} entries, more than {max}")]
    TooMany {
        field: &'static str,
        count: usize,
        max: usize,
    },
    #[error("the order's spec: `env` name {0:?} is empty or contains '='")]
    EnvName(String),
    #[error("the order's spec: `cwd` {cwd}: {why}")]
    Cwd { cwd: String, why: String },
}

/// How a remote session ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Outcome {
    /// The process exited (by itself or by a signal).
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// Killed at its timeout.
    TimedOut,
    /// Killed because it printed nothing for its stall timeout (the spec's
    /// `stall_timeout_secs`, `stall_action` `stop`).
    Stalled { silent_for_secs: u64 },
    /// The worker restarted while the session ran: what was left of it was
    /// killed (its cgroup) and its spooled output and end stored by the
    /// next run of the worker, under the same lease.
    WorkerRestarted,
    /// The worker ended it because its output spool passed its limit while
    /// NATS stored none of it (a long outage and a session printing fast).
    SpoolFull { limit_bytes: u64 },
    /// Killed because the lease was fenced, taken or could not be renewed.
    LeaseLost { detail: String },
    /// Killed because the worker was told to stop (SIGTERM).
    WorkerStopped,
    /// It never ran: a bad spec, a command that would not start.
    NotStarted { detail: String },
    /// An end of a kind this version does not know (a newer worker's):
    /// read, never refused, so its session is still recorded (as
    /// interrupted) and its lease deleted. No worker writes it.
    #[serde(other)]
    Unknown,
}

/// A session's end, as the worker reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEnd {
    pub session_id: String,
    pub agent: String,
    /// The worker that ran it.
    pub host: String,
    pub outcome: Outcome,
    /// Milliseconds since the Unix epoch (the worker's clock).
    pub started_ms: u64,
    pub ended_ms: u64,
    /// The number of the last output chunk (0: none).
    pub last_chunk: u64,
    /// The lease's revision when the session ended (the fencing token the
    /// controller checks, [`crate::end_is_from_holder`]); 0 if it never
    /// held one.
    pub lease_revision: u64,
    /// The order's worktree (an order with a `workspace`): not made, or
    /// judged after the session. Absent otherwise; older controllers
    /// ignore it, and one this version cannot read (a newer worker's) is
    /// read as absent, never a reason to refuse the end.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_workspace"
    )]
    pub workspace: Option<WorkspaceEnd>,
}

fn lenient_workspace<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<WorkspaceEnd>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).ok())
}

/// One chunk of a session's output, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub number: u64,
    pub pipe: String,
    pub data: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot create or update the output stream {stream}: {source}")]
    Stream {
        stream: String,
        source: jetstream::context::CreateStreamError,
    },
    #[error(
        "session id {session:?} cannot be part of a subject: only letters, digits, '-' and '_'"
    )]
    InvalidSession { session: String },
    #[error("the server did not store {what} of session {session}: {source}")]
    Publish {
        session: String,
        what: String,
        source: jetstream::context::PublishError,
    },
    #[error("cannot read the output of session {session}: {source}")]
    Read {
        session: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The output stream.
#[derive(Clone)]
pub struct Output {
    jetstream: jetstream::Context,
    stream: String,
}

impl Output {
    pub(crate) async fn create(
        jetstream: &jetstream::Context,
        name: &str,
        replicas: usize,
        dedup_window: Duration,
    ) -> Result<Output, OutputError> {
        jetstream
            .create_or_update_stream(stream::Config {
                name: name.to_string(),
                subjects: vec![format!("{name}.out.*"), format!("{name}.end.*")],
                retention: stream::RetentionPolicy::Limits,
                storage: stream::StorageType::File,
                num_replicas: replicas,
                max_age: OUTPUT_KEPT,
                duplicate_window: dedup_window,
                description: Some("agent-state: remote sessions' output chunks and ends".into()),
                ..Default::default()
            })
            .await
            .map_err(|source| OutputError::Stream {
                stream: name.to_string(),
                source,
            })?;
        Ok(Output {
            jetstream: jetstream.clone(),
            stream: name.to_string(),
        })
    }

    /// `<stream>.out.<session>`
    pub fn output_subject(&self, session: &str) -> Result<String, OutputError> {
        check_session(session)?;
        Ok(format!("{}.out.{session}", self.stream))
    }

    /// `<stream>.end.<session>`
    pub fn end_subject(&self, session: &str) -> Result<String, OutputError> {
        check_session(session)?;
        Ok(format!("{}.end.{session}", self.stream))
    }

    /// Stores chunk `number` of `session`'s output; returns once the server
    /// has it.
    pub async fn chunk(
        &self,
        session: &str,
        number: u64,
        pipe: &str,
        data: Bytes,
    ) -> Result<(), OutputError> {
        let subject = self.output_subject(session)?;
        let mut headers = HeaderMap::new();
        headers.insert(CHUNK_HEADER, number.to_string().as_str());
        headers.insert(PIPE_HEADER, pipe);
        let message = PublishMessage::build()
            .payload(data)
            .headers(headers)
            .message_id(format!("{session}.{number}"));
        self.store(subject, message, session, format!("chunk {number}"))
            .await
    }

    /// Stores `end`; returns once the server has it. Its `Nats-Msg-Id`
    /// names the session and the host that stored it: the same end stored
    /// again (a restarted worker) is kept once, while a worker's end after
    /// the controller's own (an order it withdrew or fenced) is kept too,
    /// for the controller waiting to see that worker's session gone.
    pub async fn end(&self, end: &SessionEnd) -> Result<(), OutputError> {
        let subject = self.end_subject(&end.session_id)?;
        let payload = Bytes::from(serde_json::to_vec(end).expect("an end serialises"));
        let message = PublishMessage::build()
            .payload(payload)
            .message_id(format!("{}.end.{}", end.session_id, end.host));
        self.store(subject, message, &end.session_id, "the end".into())
            .await
    }

    async fn store(
        &self,
        subject: String,
        message: PublishMessage,
        session: &str,
        what: String,
    ) -> Result<(), OutputError> {
        let error = |source| OutputError::Publish {
            session: session.to_string(),
            what: what.clone(),
            source,
        };
        self.jetstream
            .send_publish(subject, message)
            .await
            .map_err(error)?
            .await
            .map_err(error)?;
        Ok(())
    }

    /// The end of `session`, if one is stored (one round trip, on the
    /// worker's path from the lease to the session's start).
    pub async fn ended(&self, session: &str) -> Result<Option<SessionEnd>, OutputError> {
        let subject = self.end_subject(session)?;
        let read = |source: Box<dyn std::error::Error + Send + Sync>| OutputError::Read {
            session: session.to_string(),
            source,
        };
        match crate::last_on_subject(&self.jetstream, &self.stream, &subject).await {
            Ok(Some(message)) => serde_json::from_slice(&message.payload)
                .map(Some)
                .map_err(|e| read(Box::new(e))),
            Ok(None) => Ok(None),
            Err(e) => Err(read(e)),
        }
    }

    /// The number of the last chunk of `session` stored (0: none): where a
    /// worker that restarted goes on from its spool.
    pub async fn last_chunk(&self, session: &str) -> Result<u64, OutputError> {
        let subject = self.output_subject(session)?;
        let last = crate::last_on_subject(&self.jetstream, &self.stream, &subject)
            .await
            .map_err(|source| OutputError::Read {
                session: session.to_string(),
                source,
            })?;
        Ok(last
            .and_then(|message| {
                message
                    .headers
                    .get(CHUNK_HEADER)
                    .and_then(|v| v.as_str().parse().ok())
            })
            .unwrap_or(0))
    }

    /// `session`'s chunks from chunk 1, as they are stored (an ordered
    /// consumer: no acks, recreated by the client after a gap).
    pub async fn follow(&self, session: &str) -> Result<Follow, OutputError> {
        let read = |source: Box<dyn std::error::Error + Send + Sync>| OutputError::Read {
            session: session.to_string(),
            source,
        };
        let subject = self.output_subject(session)?;
        let stream = self
            .jetstream
            .get_stream(&self.stream)
            .await
            .map_err(|e| read(Box::new(e)))?;
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: subject,
                deliver_policy: consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| read(Box::new(e)))?;
        let messages = consumer.messages().await.map_err(|e| read(Box::new(e)))?;
        Ok(Follow {
            messages,
            session: session.to_string(),
        })
    }

    /// Every chunk of `session` stored so far, in order, and its end if
    /// stored: a replay from chunk 1 through an ordered consumer.
    pub async fn replay(
        &self,
        session: &str,
    ) -> Result<(Vec<Chunk>, Option<SessionEnd>), OutputError> {
        let read = |source: Box<dyn std::error::Error + Send + Sync>| OutputError::Read {
            session: session.to_string(),
            source,
        };
        // The consumer `follow` makes, read until nothing is pending.
        let mut messages = self.follow(session).await?.messages;
        let mut chunks = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(2), messages.next()).await;
            let Ok(Some(message)) = next else { break };
            let message = message.map_err(|e| read(Box::new(e)))?;
            let pending = message.info().map(|i| i.pending).unwrap_or(0);
            chunks.push(chunk_of(&message));
            if pending == 0 {
                break;
            }
        }
        Ok((chunks, self.ended(session).await?))
    }
}

/// A session's output as it is stored, from chunk 1 on: what the
/// controller reads while a remote session runs ([`Output::follow`]).
pub struct Follow {
    messages: consumer::pull::Ordered,
    session: String,
}

impl Follow {
    /// The next chunk, waiting for it; `None` if the stream ended (the
    /// consumer was deleted).
    pub async fn next(&mut self) -> Option<Result<Chunk, OutputError>> {
        let message = self.messages.next().await?;
        Some(
            message
                .map(|message| chunk_of(&message))
                .map_err(|e| OutputError::Read {
                    session: self.session.clone(),
                    source: Box::new(e),
                }),
        )
    }
}

fn chunk_of(message: &jetstream::Message) -> Chunk {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default()
    };
    Chunk {
        number: header(CHUNK_HEADER).parse().unwrap_or(0),
        pipe: header(PIPE_HEADER),
        data: message.payload.clone(),
    }
}

/// A session id NATS accepts as one subject token.
pub fn check_session(session: &str) -> Result<(), OutputError> {
    if session.is_empty()
        || !session
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(OutputError::InvalidSession {
            session: session.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_of_a_newer_kind_is_read_as_unknown() {
        let end = serde_json::json!({
            "session_id": "20260101-000000", "agent": "rio", "host": "w1",
            "outcome": {"kind": "evicted_by_a_newer_rule", "detail": "x", "n": 3},
            "started_ms": 1, "ended_ms": 2, "last_chunk": 4, "lease_revision": 7,
            "a_newer_field": true
        });
        let end: SessionEnd = serde_json::from_value(end).unwrap();
        assert_eq!(end.outcome, Outcome::Unknown);
        assert_eq!((end.last_chunk, end.lease_revision), (4, 7));
        assert_eq!(end.workspace, None);
        let newer_workspace = serde_json::json!({
            "session_id": "20260101-000000", "agent": "rio", "host": "w1",
            "outcome": {"kind": "timed_out"}, "started_ms": 1, "ended_ms": 2,
            "last_chunk": 0, "lease_revision": 7,
            "workspace": {"moved_to_a_newer_place": {"path": "/x"}}
        });
        let end: SessionEnd = serde_json::from_value(newer_workspace).unwrap();
        assert_eq!((end.outcome, end.workspace), (Outcome::TimedOut, None));
        let known: Outcome = serde_json::from_str(r#"{"kind":"timed_out"}"#).unwrap();
        assert_eq!(known, Outcome::TimedOut);
    }

    #[test]
    fn specs() {
        let table: &[(serde_json::Value, Result<&str, &str>)] = &[
            (serde_json::json!({"command": "/bin/true"}), Ok("/bin/true")),
            (
                serde_json::json!({"command": "sh", "args": ["-c", "echo"], "env": {"A": "1"}, "cwd": "/tmp", "timeout_secs": 60}),
                Ok("sh"),
            ),
            (serde_json::json!({}), Err("missing field `command`")),
            (
                serde_json::json!({"command": ""}),
                Err("`command` is empty"),
            ),
            (
                serde_json::json!({"command": "x", "cwd": "rel"}),
                Err("not an absolute path"),
            ),
            (
                serde_json::json!({"command": "x", "timeout": "1h"}),
                Err("unknown field `timeout`"),
            ),
            (serde_json::json!("research.sh"), Err("invalid type")),
            // Hostile specs: NUL bytes, sizes and counts.
            (
                serde_json::json!({"command": "a\0b"}),
                Err("`command` contains a NUL byte"),
            ),
            (
                serde_json::json!({"command": "x", "args": ["ok", "a\0"]}),
                Err("`args[1]` contains a NUL byte"),
            ),
            (
                serde_json::json!({"command": "x", "env": {"A": "\0"}}),
                Err("`env.A` contains a NUL byte"),
            ),
            (
                serde_json::json!({"command": "x", "env": {"A\0": "1"}}),
                Err("`env name \"A\\0\"` contains a NUL byte"),
            ),
            (
                serde_json::json!({"command": "x", "cwd": "/tmp/\0"}),
                Err("`cwd` contains a NUL byte"),
            ),
            (
                serde_json::json!({"command": "x", "env": {"A=B": "1"}}),
                Err("`env` name \"A=B\" is empty or contains '='"),
            ),
            (
                serde_json::json!({"command": "x", "env": {"": "1"}}),
                Err("`env` name \"\" is empty"),
            ),
            (
                serde_json::json!({"command": "x".repeat(4096)}),
                Err("`command` is 4096 bytes, more than 4095"),
            ),
            (
                serde_json::json!({"command": "x", "args": vec!["a"; 4097]}),
                Err("`args` has 4097 entries, more than 4096"),
            ),
            (
                serde_json::json!({"command": "x", "args": vec!["a"; 4096]}),
                Ok("x"),
            ),
            (
                serde_json::json!({"command": "x", "args": ["y".repeat(128 * 1024)]}),
                Err("`args[0]` is 131072 bytes, more than 131071"),
            ),
            (
                serde_json::json!({"command": "x", "args": vec!["y".repeat(100_000); 11]}),
                Err("`args` is 1100011 bytes, more than 1048576"),
            ),
            (
                serde_json::json!({"command": "x", "env": (0..1025).map(|i| (format!("V{i}"), "1".to_string())).collect::<BTreeMap<_, _>>()}),
                Err("`env` has 1025 entries, more than 1024"),
            ),
            (
                serde_json::json!({"command": "x", "env": (0..6).map(|i| (format!("V{i}"), "v".repeat(100_000))).collect::<BTreeMap<_, _>>()}),
                Err("`env` is 600024 bytes, more than 524288"),
            ),
            (
                serde_json::json!({"command": "x", "env": {"BIG": "v".repeat(128 * 1024)}}),
                Err("`env.BIG` is 131072 bytes, more than 131071"),
            ),
            (
                serde_json::json!({"command": "x", "stdin": "p".repeat(8 << 20)}),
                Ok("x"),
            ),
            (
                serde_json::json!({"command": "x", "stdin": "p".repeat((8 << 20) + 1)}),
                Err("`stdin` is 8388609 bytes, more than 8388608"),
            ),
            // The fields added later (stall, memory) parse; an old order
            // without them too (above).
            (
                serde_json::json!({"command": "x", "stall_timeout_secs": 600, "stall_action": "stop", "memory_max": 1024}),
                Ok("x"),
            ),
            (
                serde_json::json!({"command": "x", "stall_action": "sometimes"}),
                Err("unknown variant `sometimes`"),
            ),
            // A NUL in the prompt is only bytes on a pipe: allowed.
            (
                serde_json::json!({"command": "x", "stdin": "a\0b"}),
                Ok("x"),
            ),
            // A workspace: every field, none other, each bounded.
            (
                serde_json::json!({"command": "x", "workspace": {"repo": "/r", "base": "main", "path": "/w/s", "branch": "rio/x"}}),
                Ok("x"),
            ),
            (
                serde_json::json!({"command": "x", "workspace": {"repo": "/r", "base": "main", "path": "/w/s"}}),
                Err("missing field `branch`"),
            ),
            (
                serde_json::json!({"command": "x", "workspace": {"repo": "/r", "base": "main", "path": "/w/s", "branch": "b", "root": "/"}}),
                Err("unknown field `root`"),
            ),
            (
                serde_json::json!({"command": "x", "workspace": {"repo": "/r", "base": "main", "path": "/w/\0", "branch": "b"}}),
                Err("`workspace.path` contains a NUL byte"),
            ),
            (
                serde_json::json!({"command": "x", "workspace": {"repo": "/r", "base": "m".repeat(256), "path": "/w/s", "branch": "b"}}),
                Err("`workspace.base` is 256 bytes, more than 255"),
            ),
        ];
        for (i, (value, want)) in table.iter().enumerate() {
            match (SessionSpec::from_order(value), want) {
                (Ok(spec), Ok(command)) => assert_eq!(spec.command, *command, "row {i}"),
                (Err(e), Err(part)) => assert!(e.to_string().contains(part), "row {i}: {e}"),
                (got, want) => panic!(
                    "row {i}: got {}, want {want:?}",
                    match got {
                        Ok(_) => "a spec".to_string(),
                        Err(e) => e.to_string(),
                    }
                ),
            }
        }
    }

    /// An order without a workspace is written as before it existed, so
    /// that workers older than the field still take it.
    #[test]
    fn an_order_without_a_workspace_has_no_such_field() {
        let spec = SessionSpec::from_order(&serde_json::json!({"command": "x"})).unwrap();
        let text = serde_json::to_string(&spec).unwrap();
        assert!(!text.contains("workspace"), "{text}");
        let end = SessionEnd {
            session_id: "s".into(),
            agent: "rio".into(),
            host: "w1".into(),
            outcome: Outcome::TimedOut,
            started_ms: 0,
            ended_ms: 0,
            last_chunk: 0,
            lease_revision: 0,
            workspace: None,
        };
        assert!(!serde_json::to_string(&end).unwrap().contains("workspace"));
    }

    #[test]
    fn a_cwd_must_be_a_directory_not_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let table: &[(&std::path::Path, Option<&str>)] = &[
            (&real, None),
            (&link, Some("is a symbolic link; give the directory itself")),
            (&file, Some("is not a directory")),
            (&dir.path().join("gone"), Some("No such file or directory")),
        ];
        for (path, want) in table {
            match (check_cwd(path), want) {
                (Ok(()), None) => {}
                (Err(e), Some(part)) => {
                    let text = e.to_string();
                    assert!(
                        text.starts_with("the order's spec: `cwd` ") && text.contains(part),
                        "{}: {text}",
                        path.display()
                    );
                }
                (got, want) => panic!("{}: got {got:?}, want {want:?}", path.display()),
            }
        }
    }

    #[test]
    fn session_ids_in_subjects() {
        for (id, ok) in [
            ("20261127T063000Z-rio-1a2b", true),
            ("s_1", true),
            ("", false),
            ("a.b", false),
            ("a*", false),
            ("a>", false),
        ] {
            assert_eq!(check_session(id).is_ok(), ok, "{id:?}");
        }
    }
}
