//! The worker's end of a session's hook calls (issue 24; the protocol and
//! its checks are [`agent_state_cluster::hooks`]).
//!
//! Each session gets a Unix socket in the worker's private directory
//! (`0700`, under `$RUNTIME_DIRECTORY`, `$XDG_RUNTIME_DIR` or the temp
//! directory) and `AGENT_STATE_HOOKS` naming it. The CLI of the session's
//! script sends a hook call there ([`HookCall`], at most
//! [`MAX_REQUEST_BYTES`]); the worker stamps it with the order's agent,
//! the agent's session id, the order id, its host name and the lease
//! revision it holds now, sends it to the controller as a NATS request and
//! hands the answer back. A call refused while the lease was being renewed
//! (the revision moved under it) is sent once more with the new revision.
//! No answer: [`HookAnswer::Unreachable`], the CLI says what failed.
//!
//! A session's calls are bounded: at most [`IN_FLIGHT`] at once (more wait
//! their turn), and a [`CallBudget`] of [`CallRate::DEFAULT`] (60 at once,
//! then one a second; `AGENT_STATE_TEST_HOOK_RATE=BURST/PERIOD` in tests):
//! a call over it is refused at once with exit 75 and when to call again,
//! so a script's runaway loop costs its own session, not the controller
//! every agent's hooks go through.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_state_cluster::async_nats;
use agent_state_cluster::hooks::{self, CallBudget, CallRate, MAX_REQUEST_BYTES};
use agent_state_cluster::{ClusterSettings, HookAnswer, HookCall, HookRequest, Refusal};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

/// How long the script has to send its call.
const READ_WITHIN: Duration = Duration::from_secs(30);
/// How long the controller has to answer (it runs the hook for at most
/// 60 s).
const ANSWER_WITHIN: Duration = Duration::from_secs(75);
/// A session's calls forwarded at once; more wait their turn.
pub const IN_FLIGHT: usize = 4;

/// The private directories' names: `agent-state-hooks-XXXXXX`.
const DIR_PREFIX: &str = "agent-state-hooks-";
/// Locked (flock) by the worker whose directory it is, for as long as it
/// lives; a directory whose lock is free was left by a killed worker.
const OWNER_LOCK: &str = "owner.lock";
/// A directory this young may be a starting worker's that has not locked
/// its `owner.lock` yet.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// Removes the directories killed workers left under `base` (a worker
/// stopped by SIGKILL cannot remove its own; under the unit systemd
/// removes `RuntimeDirectory=`, elsewhere they would pile up): ours (same
/// user), real directories (not links), at least [`STALE_AFTER`] old, with
/// an `owner.lock` nobody holds. Only their sockets and lock are removed;
/// a directory holding anything else is left as it is.
fn sweep_stale(base: &Path, now: std::time::SystemTime) {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    let uid = nix::unistd::geteuid().as_raw();
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let young = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_none_or(|age| age < STALE_AFTER);
        if !meta.is_dir() || meta.uid() != uid || young {
            continue;
        }
        let Ok(lock) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(path.join(OWNER_LOCK))
        else {
            continue;
        };
        if !lock.metadata().is_ok_and(|m| m.is_file()) || lock.try_lock().is_err() {
            continue;
        }
        if let Ok(inside) = std::fs::read_dir(&path) {
            for file in inside.flatten() {
                let name = file.file_name();
                let name = name.to_string_lossy();
                if name == OWNER_LOCK || name.ends_with(".sock") {
                    let _ = std::fs::remove_file(file.path());
                }
            }
        }
        if std::fs::remove_dir(&path).is_ok() {
            tracing::info!(dir = %path.display(), "removed the hook directory a stopped worker left");
        }
    }
}

/// What the worker stamps a session's calls with.
pub(super) struct Stamp {
    pub agent: String,
    pub session: String,
    pub order: String,
    pub holder: String,
    /// The lease revision it holds now (the keeper stores each renewal).
    pub revision: Arc<AtomicU64>,
}

/// Where the worker's hook sockets live, and its NATS line to the
/// controller.
pub(super) struct Hooks {
    dir: tempfile::TempDir,
    /// `owner.lock` in it, locked while this worker lives.
    _owner: std::fs::File,
    client: async_nats::Client,
    settings: ClusterSettings,
    next: AtomicU64,
    /// Each session's allowance of calls.
    rate: CallRate,
}

/// A session's socket: served until dropped, then removed.
pub(super) struct Listening {
    pub path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Hooks {
    /// Makes the private directory (`0700`, removed when the worker
    /// stops).
    /// Directories killed workers left there are swept first, judged old
    /// against `now`.
    pub(super) fn new(
        client: async_nats::Client,
        settings: ClusterSettings,
        now: std::time::SystemTime,
    ) -> std::io::Result<Hooks> {
        let base = ["RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"]
            .iter()
            .filter_map(std::env::var_os)
            // `RuntimeDirectory=a b` lists several; the first is ours.
            .map(|v| PathBuf::from(v.to_string_lossy().split(':').next().unwrap_or("")))
            .find(|p| p.is_absolute() && p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        sweep_stale(&base, now);
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir_in(&base)?;
        // tempfile makes it 0700; said here, not assumed.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
        let owner = std::fs::File::create_new(dir.path().join(OWNER_LOCK))?;
        owner.try_lock().map_err(std::io::Error::other)?;
        Ok(Hooks {
            dir,
            _owner: owner,
            client,
            settings,
            next: AtomicU64::new(1),
            rate: test_rate().unwrap_or(CallRate::DEFAULT),
        })
    }

    pub(super) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Listens for the calls of one session.
    pub(super) fn listen(self: &Arc<Self>, stamp: Stamp) -> std::io::Result<Listening> {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let path = self.dir.path().join(format!("{n}.sock"));
        let listener = UnixListener::bind(&path)?;
        let hooks = self.clone();
        let session = Arc::new(Session {
            stamp,
            budget: Mutex::new(CallBudget::new(self.rate, Instant::now())),
            turns: Semaphore::new(IN_FLIGHT),
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let hooks = hooks.clone();
                let session = session.clone();
                tokio::spawn(async move { hooks.serve(stream, &session).await });
            }
        });
        Ok(Listening { path, task })
    }

    async fn serve(&self, mut stream: UnixStream, session: &Session) {
        let answer = match read_call(&mut stream).await {
            Ok(call) => match session.allowed(Instant::now()) {
                Ok(()) => {
                    let _turn = session.turns.acquire().await;
                    self.forward(call, &session.stamp).await
                }
                Err(refusal) => {
                    super::log(format!(
                        "session {}: a hook call refused: {refusal}",
                        session.stamp.session
                    ));
                    refusal.answer()
                }
            },
            Err(refusal) => refusal.answer(),
        };
        let bytes = serde_json::to_vec(&answer).expect("an answer serialises");
        let _ = stream.write_all(&bytes).await;
        let _ = stream.shutdown().await;
    }

    /// Sends `call` to the controller; once more if the lease was renewed
    /// while it was refused.
    async fn forward(&self, call: HookCall, stamp: &Stamp) -> HookAnswer {
        let subject = hooks::subject(&self.settings, &stamp.agent);
        let mut answer = HookAnswer::Unreachable {
            reason: "not sent".into(),
        };
        for _ in 0..2 {
            let revision = stamp.revision.load(Ordering::SeqCst);
            let request = HookRequest {
                call: call.clone(),
                agent: stamp.agent.clone(),
                session: stamp.session.clone(),
                order: stamp.order.clone(),
                holder: stamp.holder.clone(),
                lease_revision: revision,
            };
            let bytes = serde_json::to_vec(&request).expect("a request serialises");
            if bytes.len() > MAX_REQUEST_BYTES {
                return Refusal::TooBig {
                    what: format!("the request ({} bytes)", bytes.len()),
                    limit: MAX_REQUEST_BYTES,
                }
                .answer();
            }
            let sent = self.client.send_request(
                subject.clone(),
                async_nats::Request::new()
                    .payload(bytes.into())
                    .timeout(Some(ANSWER_WITHIN)),
            );
            answer = match tokio::time::timeout(ANSWER_WITHIN + Duration::from_secs(1), sent).await
            {
                Ok(Ok(reply)) => match serde_json::from_slice::<HookAnswer>(&reply.payload) {
                    Ok(a) => a,
                    Err(e) => HookAnswer::Unreachable {
                        reason: format!("the controller's answer is not one: {e}"),
                    },
                },
                Ok(Err(e)) => HookAnswer::Unreachable {
                    reason: format!("NATS request on {subject}: {e}"),
                },
                Err(_) => HookAnswer::Unreachable {
                    reason: format!("no answer on {subject} within {ANSWER_WITHIN:?}"),
                },
            };
            let renewed = stamp.revision.load(Ordering::SeqCst) != revision;
            if !(matches!(answer, HookAnswer::Refused { .. }) && renewed) {
                break;
            }
        }
        answer
    }
}

/// One session's listener state: its stamp and its bounds.
struct Session {
    stamp: Stamp,
    budget: Mutex<CallBudget>,
    turns: Semaphore,
}

impl Session {
    /// Takes one call from the session's budget at `now`.
    fn allowed(&self, now: Instant) -> Result<(), Refusal> {
        let mut budget = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        let rate = budget.rate();
        budget.take(now).map_err(|wait| Refusal::TooManyCalls {
            burst: rate.burst,
            every: humantime::format_duration(rate.every).to_string(),
            wait: humantime::format_duration(round_up(wait)).to_string(),
        })
    }
}

/// Whole seconds, rounded up (a wait said in nanoseconds helps nobody).
fn round_up(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// The test hook `AGENT_STATE_TEST_HOOK_RATE=BURST/PERIOD`; a bad one is
/// said and ignored.
fn test_rate() -> Option<CallRate> {
    let text = std::env::var("AGENT_STATE_TEST_HOOK_RATE").ok()?;
    CallRate::parse(&text)
        .map_err(|e| super::log(format!("AGENT_STATE_TEST_HOOK_RATE refused: {e}")))
        .ok()
}

/// Reads one call, bounded in size and time.
async fn read_call(stream: &mut UnixStream) -> Result<HookCall, Refusal> {
    let mut bytes = Vec::new();
    let mut limited = (&mut *stream).take(MAX_REQUEST_BYTES as u64 + 1);
    let read = limited.read_to_end(&mut bytes);
    match tokio::time::timeout(READ_WITHIN, read).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(Refusal::Malformed(format!("cannot read it: {e}"))),
        Err(_) => {
            return Err(Refusal::Malformed(format!(
                "not sent within {READ_WITHIN:?}"
            )));
        }
    }
    if bytes.len() > MAX_REQUEST_BYTES {
        return Err(Refusal::TooBig {
            what: "the call".into(),
            limit: MAX_REQUEST_BYTES,
        });
    }
    serde_json::from_slice(&bytes).map_err(|e| Refusal::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn hook_dir(base: &Path, name: &str, files: &[&str]) -> PathBuf {
        let dir = base.join(format!("{DIR_PREFIX}{name}"));
        std::fs::create_dir(&dir).unwrap();
        for f in files {
            std::fs::write(dir.join(f), "").unwrap();
        }
        dir
    }

    #[test]
    fn only_the_directories_of_stopped_workers_are_swept() {
        let base = tempfile::tempdir().unwrap();
        let b = base.path();
        let stopped = hook_dir(b, "stopped", &[OWNER_LOCK, "1.sock", "2.sock"]);
        let live = hook_dir(b, "live", &[OWNER_LOCK, "1.sock"]);
        let held = std::fs::File::open(live.join(OWNER_LOCK)).unwrap();
        held.try_lock().unwrap();
        let no_lock = hook_dir(b, "older", &["1.sock"]);
        let other = hook_dir(b, "other", &[OWNER_LOCK, "notes.txt"]);
        let unrelated = b.join("somebody-else");
        std::fs::create_dir(&unrelated).unwrap();
        std::fs::write(unrelated.join(OWNER_LOCK), "").unwrap();
        let target = hook_dir(b, "target", &[OWNER_LOCK]);
        let link = b.join(format!("{DIR_PREFIX}link"));
        std::os::unix::fs::symlink(&target, &link).unwrap();

        // Just made: too young for any of them to be taken for stale.
        sweep_stale(b, SystemTime::now());
        assert!(
            stopped.exists(),
            "a starting worker's may not be locked yet"
        );

        sweep_stale(b, SystemTime::now() + STALE_AFTER * 2);
        assert!(!stopped.exists(), "a stopped worker's directory is removed");
        assert!(live.join("1.sock").exists(), "a live worker's is kept");
        assert!(no_lock.join("1.sock").exists(), "without owner.lock: kept");
        assert!(
            other.join("notes.txt").exists(),
            "only sockets and the lock go"
        );
        assert!(unrelated.join(OWNER_LOCK).exists(), "not a hook directory");
        assert!(link.symlink_metadata().is_ok(), "a link is not followed");
        // The target is a stale hook directory of its own, swept as such.
        assert!(!target.exists());
    }
}
