//! `/events`: the event stream as Server-Sent Events, for every viewer from
//! one reader.
//!
//! One poller task per daemon ([`Hub`]) reads what is new in the journals
//! and sends it to every open stream through a tokio broadcast channel, so
//! N viewers cost one reader; with no viewer it sleeps until one comes.
//! While someone watches, it waits on inotify (the `notify` crate, the
//! watches of `agent-state events --follow`: the root, `.daemon/`, each
//! agent's directory, and the `sessions/` of each agent whose log a page
//! follows) and reads only the journals that changed; a read every
//! [`BACKSTOP`] catches what a lost event would miss. Only when a watch
//! cannot be set (inotify's limits) does it read every [`EVENT_POLL`], and
//! says so once in the daemon's log.
//!
//! Each stream keeps its own cursor: it starts by reading from its
//! `Last-Event-ID` (or `?after=`) itself, then takes the poller's events
//! past its cursor. When the poller's batch starts after the stream's
//! cursor (the poller was idle, the stream lagged behind the channel, or a
//! journal was rotated), the stream reads the gap itself, so nothing is
//! missed and nothing repeated.
//!
//! With `?log=AGENT` (an agent's page), the stream also follows the running
//! session's log: on each tick, what was appended, as `event: log`, from
//! where the page's tail ended (`log_file`, `log_from`); a character split
//! between two reads is sent whole with the second. Each `log` event names
//! its file and the byte it ends at: the page keeps how far it showed each
//! log and drops what a reconnect sends again.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use notify::{RecursiveMode, Watcher};
use tokio::sync::{Notify, broadcast, mpsc};

use super::{Shared, context, data, page};
use crate::agent_name::AgentName;
use crate::events::{Batch, Change, Cursor, Reader, SourceId, StreamEvent};
use crate::state::StateRoot;

/// How often the poller reads when the journals cannot be watched.
pub const EVENT_POLL: Duration = Duration::from_millis(300);
/// How often it reads everything while watching: a backstop for events
/// inotify lost (a full queue) or never gave (a directory made and filled
/// before its watch was set).
pub const BACKSTOP: Duration = Duration::from_secs(5);
/// The least time between two reads: a session writing its log or many
/// journal lines at once costs one read per this, not one per write.
const MIN_GAP: Duration = Duration::from_millis(40);
/// Time with nothing sent before a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Ticks a slow stream may fall behind before it reads the gap itself.
const CHANNEL: usize = 64;
/// The most of a log sent in one event.
const LOG_CHUNK: u64 = 64 * 1024;

/// What the poller read in one tick.
pub struct Tick {
    /// The poller's position before the read.
    before: Cursor,
    /// And after it.
    end: Cursor,
    events: Vec<StreamEvent>,
    /// The events as SSE for a stream whose cursor is `before` (most of
    /// them, most of the time): made once, for every such stream.
    chunk: Bytes,
    /// A source was read again from its start (rotated) or could not be
    /// read: every stream reads for itself.
    restarted: bool,
}

impl Tick {
    /// What a read from `before` found, with the chunk made once (pure).
    pub fn new(before: Cursor, batch: Batch, show_bodies: bool) -> Tick {
        let mut running = before.clone();
        let mut chunk = String::new();
        for e in &batch.events {
            running.set(&e.source, e.end);
            chunk.push_str(&page::sse_event(e, &running, show_bodies));
        }
        Tick {
            before,
            restarted: !batch.notes.is_empty(),
            end: batch.end,
            events: batch.events,
            chunk: Bytes::from(chunk),
        }
    }

    /// Nothing read (pure).
    fn empty(at: Cursor, restarted: bool) -> Tick {
        Tick {
            end: at.clone(),
            before: at,
            events: Vec::new(),
            chunk: Bytes::new(),
            restarted,
        }
    }
}

/// What the file watcher saw, for the poller.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Change(Change),
    /// A file in this agent's `sessions/` changed: a followed log grew.
    Log(AgentName),
}

/// What a watched path's event means for the poller (pure): the journals'
/// changes as `agent-state events --follow` sees them, and a `.log` file
/// in an agent's `sessions/`.
fn seen(root: &Path, event: notify::Result<notify::Event>) -> Vec<Seen> {
    let logs: Vec<Seen> = match &event {
        Ok(e) if !matches!(e.kind, notify::EventKind::Access(_)) => e
            .paths
            .iter()
            .filter_map(|p| log_of(root, p))
            .map(Seen::Log)
            .collect(),
        _ => Vec::new(),
    };
    let mut out: Vec<Seen> = crate::events::classify(root, event)
        .into_iter()
        .map(Seen::Change)
        .collect();
    for l in logs {
        if !out.contains(&l) {
            out.push(l);
        }
    }
    out
}

/// The agent whose session log `path` is (`ROOT/AGENT/sessions/*.log`).
fn log_of(root: &Path, path: &Path) -> Option<AgentName> {
    let name = path.file_name()?.to_str()?;
    let sessions = path.parent()?;
    let agent = sessions.parent()?;
    if !name.ends_with(".log") || sessions.file_name()? != "sessions" || agent.parent()? != root {
        return None;
    }
    AgentName::parse(agent.file_name()?.to_str()?).ok()
}

/// What the watcher reported since the last read.
#[derive(Default)]
struct Pending {
    dirty: BTreeSet<SourceId>,
    new_dirs: Vec<PathBuf>,
    rescan: bool,
}

impl Pending {
    fn add(&mut self, seen: Vec<Seen>) {
        for s in seen {
            match s {
                Seen::Change(Change::Source(source)) => {
                    self.dirty.insert(source);
                }
                Seen::Change(Change::NewDir(dir)) => self.new_dirs.push(dir),
                Seen::Change(Change::Rescan) => self.rescan = true,
                // A tick is enough: every stream drains its log on each.
                Seen::Log(_) => {}
            }
        }
    }
}

/// The watches of one watching spell (from the first viewer to the last).
struct Watches {
    watcher: notify::RecommendedWatcher,
    dirs: BTreeSet<PathBuf>,
    /// The `sessions/` directories watched for the logs pages follow.
    logs: BTreeMap<AgentName, PathBuf>,
    /// A watch could not be set: read every [`EVENT_POLL`].
    failed: Option<String>,
}

impl Watches {
    fn start(
        root: &StateRoot,
        tx: mpsc::UnboundedSender<Vec<Seen>>,
    ) -> Result<Watches, notify::Error> {
        let path = root.path.clone();
        let watcher = notify::recommended_watcher(move |event| {
            let seen = seen(&path, event);
            if !seen.is_empty() {
                let _ = tx.send(seen);
            }
        })?;
        let mut w = Watches {
            watcher,
            dirs: BTreeSet::new(),
            logs: BTreeMap::new(),
            failed: None,
        };
        w.dir(&root.path);
        w.sources(root);
        Ok(w)
    }

    /// Watch a directory (once); a failure is remembered.
    fn dir(&mut self, dir: &Path) {
        if self.dirs.contains(dir) || !crate::fsx::is_dir(dir) {
            return;
        }
        match self.watcher.watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => {
                self.dirs.insert(dir.to_path_buf());
            }
            Err(e) => {
                self.failed
                    .get_or_insert_with(|| format!("cannot watch {}: {e}", dir.display()));
            }
        }
    }

    /// `.daemon/` and every agent's directory there is now.
    fn sources(&mut self, root: &StateRoot) {
        self.dir(&root.daemon_dir());
        match Reader::new(root.clone(), Cursor::start(), None).sources() {
            Ok(sources) => {
                for s in sources {
                    if let SourceId::Agent(a) = s {
                        self.dir(&root.agent(&a).path);
                    }
                }
            }
            Err(e) => {
                self.failed.get_or_insert_with(|| e.to_string());
            }
        }
    }

    /// Watch the `sessions/` of exactly the agents whose logs are followed.
    fn logs(&mut self, root: &StateRoot, followed: &BTreeSet<AgentName>) {
        let gone: Vec<AgentName> = self
            .logs
            .keys()
            .filter(|a| !followed.contains(*a))
            .cloned()
            .collect();
        for a in gone {
            if let Some(dir) = self.logs.remove(&a) {
                let _ = self.watcher.unwatch(&dir);
            }
        }
        for a in followed {
            if self.logs.contains_key(a) {
                continue;
            }
            let dir = root.agent(a).sessions_dir();
            if !crate::fsx::is_dir(&dir) {
                continue;
            }
            match self.watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.logs.insert(a.clone(), dir);
                }
                Err(e) => {
                    self.failed
                        .get_or_insert_with(|| format!("cannot watch {}: {e}", dir.display()));
                }
            }
        }
    }
}

/// The poller's state between two reads (moved to a blocking thread for
/// each).
struct Poller {
    root: StateRoot,
    show_bodies: bool,
    reader: Option<Reader>,
    /// `None` while nobody watches, or when no watcher could be started.
    watches: Option<Watches>,
    /// Why the poller polls, once said.
    said: bool,
}

impl Poller {
    /// Set the watches (if not yet), then read what `pending` says changed
    /// (everything with `all`): the tick for the streams.
    fn turn(
        &mut self,
        tx: &mpsc::UnboundedSender<Vec<Seen>>,
        pending: Pending,
        all: bool,
        followed: &BTreeSet<AgentName>,
    ) -> Tick {
        let mut fresh = false;
        if self.watches.is_none() && self.reader.is_none() {
            // Watches first, then the reader's first read: nothing
            // appended in between is missed.
            match Watches::start(&self.root, tx.clone()) {
                Ok(w) => self.watches = Some(w),
                Err(e) => self.poll_because(&format!("cannot start a file watcher: {e}")),
            }
        }
        if let Some(w) = &mut self.watches {
            for dir in &pending.new_dirs {
                w.dir(dir);
            }
            if pending.rescan {
                w.sources(&self.root);
            }
            w.logs(&self.root, followed);
            if let Some(why) = w.failed.take() {
                self.poll_because(&why);
                // Remembered: the poller reads every EVENT_POLL from now on.
                if let Some(w) = &mut self.watches {
                    w.failed = Some(why);
                }
            }
        }
        let reader = self.reader.get_or_insert_with(|| {
            fresh = true;
            let mut r = Reader::new(self.root.clone(), Cursor::start(), None);
            let _ = r.read(None);
            r
        });
        let before = reader.position().clone();
        let mut dirty = pending.dirty;
        for dir in &pending.new_dirs {
            if let Some(Ok(a)) = dir
                .file_name()
                .and_then(|n| n.to_str())
                .map(AgentName::parse)
            {
                dirty.insert(SourceId::Agent(a));
            }
        }
        let read = if fresh || all || pending.rescan || !pending.new_dirs.is_empty() {
            reader.read(None)
        } else if dirty.is_empty() {
            return Tick::empty(before, false);
        } else {
            reader.read(Some(&dirty))
        };
        match read {
            Ok(batch) => Tick::new(before, batch, self.show_bodies),
            Err(_) => Tick::empty(before, true),
        }
    }

    /// Whether the poller reads every [`EVENT_POLL`] (a watch failed).
    fn polling(&self) -> bool {
        self.watches.as_ref().is_none_or(|w| w.failed.is_some())
    }

    fn poll_because(&mut self, why: &str) {
        if !self.said {
            self.said = true;
            tracing::warn!(
                "web view: {why}; the event streams read the journals every {} ms instead",
                EVENT_POLL.as_millis()
            );
        }
    }
}

/// The one reader of the journals all streams share.
#[derive(Clone)]
pub struct Hub {
    root: StateRoot,
    show_bodies: bool,
    sender: broadcast::Sender<Arc<Tick>>,
    wake: Arc<Notify>,
    /// The agents whose logs open streams follow, and how many follow each.
    followed: Arc<Mutex<BTreeMap<AgentName, usize>>>,
}

/// A stream's hold on its agent's log being watched; released when the
/// stream ends.
struct Following {
    hub: Hub,
    agent: AgentName,
}

impl Drop for Following {
    fn drop(&mut self) {
        let mut f = self.hub.followed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = f.get_mut(&self.agent) {
            *n -= 1;
            if *n == 0 {
                f.remove(&self.agent);
            }
        }
    }
}

impl Hub {
    /// The hub and its poller (a task of the daemon's runtime).
    pub fn start(root: StateRoot, show_bodies: bool) -> Hub {
        let (sender, _) = broadcast::channel(CHANNEL);
        let hub = Hub {
            root,
            show_bodies,
            sender,
            wake: Arc::new(Notify::new()),
            followed: Default::default(),
        };
        tokio::spawn(hub.clone().poll());
        hub
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<Tick>> {
        let rx = self.sender.subscribe();
        self.wake.notify_one();
        rx
    }

    /// Watch `agent`'s logs while the returned value lives.
    fn follow(&self, agent: &AgentName) -> Following {
        *self
            .followed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(agent.clone())
            .or_default() += 1;
        self.wake.notify_one();
        Following {
            hub: self.clone(),
            agent: agent.clone(),
        }
    }

    fn followed(&self) -> BTreeSet<AgentName> {
        self.followed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    async fn poll(self) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<Seen>>();
        let mut poller = Some(Poller {
            root: self.root.clone(),
            show_bodies: self.show_bodies,
            reader: None,
            watches: None,
            said: false,
        });
        let mut pending = Pending::default();
        let mut all = false;
        let mut last_read: Option<Instant> = None;
        loop {
            if self.sender.receiver_count() == 0 {
                // Nobody watches: no watches, no reads until a stream opens
                // (it reads what it missed itself).
                if let Some(p) = &mut poller {
                    p.reader = None;
                    p.watches = None;
                }
                while rx.try_recv().is_ok() {}
                pending = Pending::default();
                self.wake.notified().await;
                continue;
            }
            if let Some(at) = last_read {
                // Many changes at once: one read for them all.
                tokio::time::sleep_until((at + MIN_GAP).into()).await;
            }
            while let Ok(seen) = rx.try_recv() {
                pending.add(seen);
            }
            let Some(mut p) = poller.take() else {
                return;
            };
            let followed = self.followed();
            let (tx2, taken, everything) = (tx.clone(), std::mem::take(&mut pending), all);
            all = false;
            let read = tokio::task::spawn_blocking(move || {
                let tick = p.turn(&tx2, taken, everything, &followed);
                (p, tick)
            })
            .await;
            last_read = Some(Instant::now());
            let polling = match read {
                Ok((p, tick)) => {
                    let polling = p.polling();
                    poller = Some(p);
                    // No receiver left: the next turn sleeps.
                    let _ = self.sender.send(Arc::new(tick));
                    polling
                }
                // The read panicked: start afresh (new watches, a new reader).
                Err(_) => {
                    poller = Some(Poller {
                        root: self.root.clone(),
                        show_bodies: self.show_bodies,
                        reader: None,
                        watches: None,
                        said: true,
                    });
                    true
                }
            };
            let wait = if polling { EVENT_POLL } else { BACKSTOP };
            tokio::select! {
                seen = rx.recv() => {
                    if let Some(seen) = seen {
                        pending.add(seen);
                    }
                }
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait) => all = true,
            }
        }
    }
}

/// A running session's log, as a stream follows it.
struct Follow {
    agent: AgentName,
    session: Option<String>,
    path: Option<PathBuf>,
    offset: u64,
    /// Looked for once: a log found later is read from its start.
    known: bool,
    /// Where the page's tail of the log ended (`log_from`): the first read
    /// starts there ([`log_start`]), not at the log's end.
    from: Option<u64>,
    /// The start of a character the last read ended in the middle of.
    carry: Vec<u8>,
    /// Keeps the log's directory watched.
    _watched: Following,
}

/// The most of a log a stream sends that was written before it opened
/// (what a page rendered long ago missed): more is skipped.
const LOG_BACKLOG: u64 = 256 * 1024;

/// Where a stream starts reading a log `len` bytes long, given where the
/// page's tail of it ended (pure): there; the end when the page gave no
/// offset or one past the end (the log was replaced by a shorter one);
/// never more than [`LOG_BACKLOG`] before the end.
pub fn log_start(from: Option<u64>, len: u64) -> u64 {
    match from {
        Some(from) if from <= len => from.max(len.saturating_sub(LOG_BACKLOG)),
        _ => len,
    }
}

/// One stream's state.
struct Viewer {
    root: StateRoot,
    cursor: Cursor,
    show_bodies: bool,
    rx: broadcast::Receiver<Arc<Tick>>,
    follow: Option<Follow>,
    config_path: PathBuf,
    /// When something was last sent (a keep-alive after [`KEEP_ALIVE`]).
    sent: Instant,
    first: bool,
}

/// Read from `cursor` to the end, off the loop: the chunk to send and the
/// cursor after it.
async fn catch_up(root: StateRoot, cursor: Cursor, show_bodies: bool) -> (String, Cursor) {
    tokio::task::spawn_blocking(move || {
        let mut reader = Reader::new(root, cursor.clone(), None);
        match reader.read(None) {
            Ok(batch) => (page::sse_chunk(&batch, show_bodies), batch.end),
            Err(_) => (String::new(), cursor),
        }
    })
    .await
    .unwrap_or_default()
}

/// The poller's events past `cursor`, moving it (pure): `None` when the
/// tick starts after the cursor (a gap the stream must read itself).
pub fn take(tick: &Tick, cursor: &mut Cursor, show_bodies: bool) -> Option<Bytes> {
    if tick.restarted
        || tick
            .before
            .offsets()
            .any(|(source, offset)| offset > cursor.offset(source))
    {
        return None;
    }
    if *cursor == tick.before {
        // In step with the poller: its chunk, shared.
        *cursor = tick.end.clone();
        return Some(tick.chunk.clone());
    }
    let mut out = String::new();
    for e in &tick.events {
        if e.offset >= cursor.offset(&e.source) {
            cursor.set(&e.source, e.end);
            out.push_str(&page::sse_event(e, cursor, show_bodies));
        }
    }
    // Ahead nowhere past the poller: where it is now (so that the next
    // tick's chunk is this stream's too).
    if !cursor
        .offsets()
        .any(|(source, offset)| offset > tick.end.offset(source))
    {
        *cursor = tick.end.clone();
    }
    Some(Bytes::from(out))
}

impl Viewer {
    /// The next chunk to send; `None` ends the stream.
    async fn next(&mut self) -> Option<Bytes> {
        if self.first {
            self.first = false;
            let (chunk, cursor) =
                catch_up(self.root.clone(), self.cursor.clone(), self.show_bodies).await;
            self.cursor = cursor;
            let log = self.follow_log(true).await;
            return Some(Bytes::from(format!(": stream\n\n{chunk}{log}")));
        }
        let (chunk, mine) = match self.rx.recv().await {
            Ok(tick) => {
                let mine = self.follow.as_ref().is_some_and(|f| {
                    tick.events
                        .iter()
                        .any(|e| e.source == SourceId::Agent(f.agent.clone()))
                });
                let chunk = match take(&tick, &mut self.cursor, self.show_bodies) {
                    Some(c) => c,
                    None => {
                        let (c, cursor) =
                            catch_up(self.root.clone(), self.cursor.clone(), self.show_bodies)
                                .await;
                        self.cursor = cursor;
                        Bytes::from(c)
                    }
                };
                (chunk, mine)
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                let (c, cursor) =
                    catch_up(self.root.clone(), self.cursor.clone(), self.show_bodies).await;
                self.cursor = cursor;
                (Bytes::from(c), true)
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        // The log first: what a session printed before its end is shown
        // before the end's event makes the page fetch its part again.
        let log = self.follow_log(mine).await;
        let chunk = if log.is_empty() {
            chunk
        } else {
            Bytes::from([log.as_bytes(), &chunk].concat())
        };
        if !chunk.is_empty() {
            self.sent = Instant::now();
            return Some(chunk);
        }
        if self.sent.elapsed() >= KEEP_ALIVE {
            // Keeps proxies from closing the stream, and finds a viewer
            // that went away (its write fails).
            self.sent = Instant::now();
            return Some(Bytes::from_static(b": keep-alive\n\n"));
        }
        Some(Bytes::new())
    }

    /// What the followed log gained, as `log` events; `again`: find which
    /// log the running session writes (at the start, and after its agent's
    /// events: a new session or iteration).
    async fn follow_log(&mut self, again: bool) -> String {
        let Some(mut f) = self.follow.take() else {
            return String::new();
        };
        let config_path = self.config_path.clone();
        let answer = tokio::task::spawn_blocking(move || {
            // What the log it follows gained (to its end, also when the
            // session has just ended), then the log the session writes now.
            if let Some(p) = &f.path
                && let Some(from) = f.from.take()
            {
                // The page's log (`log_file`): from where its tail ended.
                f.offset = log_start(Some(from), file_len(p));
            }
            let mut out = drain(&mut f);
            if again && let Ok(ctx) = crate::cli::Context::load_or_accepted(&config_path) {
                let now = data::running_log(&ctx, &f.agent);
                let session = now.as_ref().map(|(s, _)| s.clone());
                let path = now.map(|(_, p)| p);
                if path != f.path {
                    // A new log: from its start, but the first one from
                    // where the page's tail of it ended (or from now).
                    f.offset = if !f.known {
                        log_start(f.from.take(), path.as_deref().map_or(0, file_len))
                    } else {
                        0
                    };
                    f.carry.clear();
                    f.path = path;
                    f.session = session;
                    out.push_str(&drain(&mut f));
                }
                f.known = true;
            }
            (f, out)
        })
        .await;
        match answer {
            Ok((f, out)) => {
                self.follow = Some(f);
                out
            }
            // The read panicked: the log is no longer followed.
            Err(_) => String::new(),
        }
    }
}

/// A file's length; 0 when it is missing or cannot be read.
fn file_len(path: &Path) -> u64 {
    crate::fsx::metadata(path)
        .ok()
        .flatten()
        .map_or(0, |st| st.st_size as u64)
}

/// What the followed log gained since its offset, as a `log` event.
fn drain(f: &mut Follow) -> String {
    let read = f
        .path
        .as_deref()
        .and_then(|p| read_from(p, f.offset))
        .unwrap_or_default();
    f.offset += read.len() as u64;
    match log_text(&mut f.carry, read) {
        Some(text) => {
            let file = f.path.as_deref().and_then(Path::file_name);
            let end = f.offset - f.carry.len() as u64;
            log_event(
                f.session.as_deref(),
                file.and_then(|n| n.to_str()),
                end,
                &text,
            )
        }
        None => String::new(),
    }
}

/// The text of what a read of a log gave after what the last one left
/// (`carry`, moved): up to its last complete character, the rest left in
/// `carry` for the next read; `None` when there is nothing to show yet
/// (pure).
pub fn log_text(carry: &mut Vec<u8>, read: Vec<u8>) -> Option<String> {
    let mut bytes = std::mem::take(carry);
    bytes.extend_from_slice(&read);
    let keep = page::incomplete_utf8(&bytes);
    *carry = bytes.split_off(bytes.len() - keep);
    if bytes.is_empty() {
        return None;
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// A `log` event (pure): `text` ends at byte `end` of the log `file`, so a
/// page given the same bytes again (its stream reconnected with the URL it
/// opened with, and the log is sent again from the page's offset) shows
/// them once.
pub fn log_event(session: Option<&str>, file: Option<&str>, end: u64, text: &str) -> String {
    let data = serde_json::json!({"session": session, "file": file, "end": end, "text": text});
    format!("event: log\ndata: {data}\n\n")
}

/// The bytes of a file below the root from `offset` (at most
/// [`LOG_CHUNK`]); none when it is missing, a link, or shorter.
fn read_from(path: &Path, offset: u64) -> Option<Vec<u8>> {
    let mut f = crate::fsx::open_read(path).ok().flatten()?;
    let len = f.metadata().ok()?.len();
    if len <= offset {
        return None;
    }
    f.seek(SeekFrom::Start(offset)).ok()?;
    let mut buf = Vec::new();
    f.take(LOG_CHUNK).read_to_end(&mut buf).ok()?;
    Some(buf)
}

/// Is `name` a session log's name (`ID.log`, `ID.iter-N.log`): one plain
/// file name, never a path (pure).
fn is_log_name(name: &str) -> bool {
    name.len() <= 255
        && name.ends_with(".log")
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// The session a log's name is of (pure).
fn session_of(name: &str) -> String {
    let stem = name.strip_suffix(".log").unwrap_or(name);
    match stem.rsplit_once(".iter-") {
        Some((session, _)) => session.to_string(),
        None => stem.to_string(),
    }
}

/// `/events`: from `Last-Event-ID` (a reconnect), `?after=CURSOR`, or the
/// end of the stream now; each event's `id` is the cursor that resumes
/// right after it, so a reconnect misses and repeats nothing.
pub async fn events(State(shared): State<Shared>, request: Request) -> Response {
    let q = request.uri().query().unwrap_or("").to_string();
    let query = |key: &str| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix(key).map(str::to_string))
    };
    let given = request
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| query("after="));
    let log = query("log=");
    let log_from = match query("log_from=").filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => match t.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                return (
                    StatusCode::BAD_REQUEST,
                    format!("bad log_from {t:?}: give the byte offset the page's log ended at\n"),
                )
                    .into_response();
            }
        },
    };
    let log_file = match query("log_file=").filter(|t| !t.is_empty()) {
        None => None,
        Some(t) if is_log_name(&t) => Some(t),
        Some(t) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("bad log_file {t:?}: give the name of a log in the agent's sessions/, like ID.log\n"),
            )
                .into_response();
        }
    };
    let ctx = match context(&shared) {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let follow = match log.as_deref() {
        None | Some("") => None,
        Some(name) => match data::agent_name(&ctx, name) {
            Ok(agent) => {
                // The log the page showed, when it names one: followed from
                // where its tail ended, then whatever the session writes now.
                let path = log_file
                    .as_deref()
                    .map(|n| ctx.root.agent(&agent).sessions_dir().join(n));
                Some(Follow {
                    session: log_file.as_deref().map(session_of),
                    known: path.is_some(),
                    path,
                    offset: 0,
                    from: log_from,
                    carry: Vec::new(),
                    _watched: shared.hub.follow(&agent),
                    agent,
                })
            }
            Err(e) => return (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        },
    };
    let root = ctx.root.clone();
    drop(ctx);
    let cursor = match given.as_deref() {
        Some(text) if !text.is_empty() => match Cursor::parse(text) {
            Ok(c) => c,
            Err(e) => {
                return (StatusCode::BAD_REQUEST, format!("bad cursor: {e}\n")).into_response();
            }
        },
        // No cursor: only what happens from now on.
        _ => {
            let root = root.clone();
            tokio::task::spawn_blocking(move || {
                let mut r = Reader::new(root, Cursor::start(), None);
                let _ = r.read(None);
                r.position().clone()
            })
            .await
            .unwrap_or_default()
        }
    };
    let viewer = Viewer {
        root,
        cursor,
        show_bodies: shared.show_bodies,
        rx: shared.hub.subscribe(),
        follow,
        config_path: shared.config_path.clone(),
        sent: Instant::now(),
        first: true,
    };
    let stream = futures_util::stream::unfold(viewer, |mut v| async move {
        let chunk = v.next().await?;
        Some((Ok::<_, std::convert::Infallible>(chunk), v))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(agent: &str, offset: u64, end: u64) -> StreamEvent {
        StreamEvent {
            source: SourceId::Agent(AgentName::parse(agent).unwrap()),
            kind: "session_start".into(),
            ts: chrono::Utc::now(),
            ts_text: "2026-11-20T10:00:00Z".into(),
            event: json!({"event": "session_start"}),
            offset,
            end,
        }
    }

    fn at(agent: &str, offset: u64) -> Cursor {
        let mut c = Cursor::start();
        c.set(&SourceId::Agent(AgentName::parse(agent).unwrap()), offset);
        c
    }

    fn tick(before: Cursor, events: Vec<StreamEvent>, end: Cursor) -> Tick {
        let batch = Batch {
            start: before.clone(),
            events,
            end,
            notes: Vec::new(),
        };
        Tick::new(before, batch, false)
    }

    fn text(b: Option<Bytes>) -> Option<String> {
        b.map(|b| String::from_utf8(b.to_vec()).unwrap())
    }

    #[test]
    fn a_stream_takes_what_is_past_its_cursor_and_reads_a_gap_itself() {
        let t = || {
            tick(
                at("rio", 100),
                vec![event("rio", 100, 150), event("rio", 150, 200)],
                at("rio", 200),
            )
        };
        // In step with the poller: both events, the id past each; the
        // poller's own chunk.
        let mut c = at("rio", 100);
        let out = text(take(&t(), &mut c, false)).unwrap();
        assert_eq!(out.matches("data: ").count(), 2, "{out}");
        assert_eq!(c, at("rio", 200));
        assert!(out.contains(&format!("id: {}\n", at("rio", 150).encode())));
        assert!(out.contains(&format!("id: {}\n", at("rio", 200).encode())));
        // Ahead (its own first read saw the first event): the second only,
        // the same text as the poller's for it; then in step.
        let mut c = at("rio", 150);
        let ahead = text(take(&t(), &mut c, false)).unwrap();
        assert_eq!(ahead.matches("data: ").count(), 1, "{ahead}");
        assert!(out.ends_with(&ahead), "{out}\n{ahead}");
        assert_eq!(c, at("rio", 200));
        // Ahead of it all: nothing, nothing repeated.
        let mut c = at("rio", 250);
        assert_eq!(text(take(&t(), &mut c, false)).unwrap(), "");
        assert_eq!(c, at("rio", 250));
        // Behind (the poller read from further on): a gap, read it.
        let mut c = at("rio", 50);
        assert!(take(&t(), &mut c, false).is_none());
        assert_eq!(c, at("rio", 50));
        // A rotated journal: read it.
        let mut r = t();
        r.restarted = true;
        assert!(take(&r, &mut at("rio", 100), false).is_none());
    }

    #[test]
    fn a_log_is_followed_from_where_the_page_ended_bounded() {
        for (from, len, want) in [
            // No offset from the page: from now.
            (None, 500, 500),
            // The page's offset.
            (Some(0), 500, 0),
            (Some(120), 500, 120),
            (Some(500), 500, 500),
            // Past the end (a log replaced by a shorter one): its end.
            (Some(501), 500, 500),
            (Some(u64::MAX), 0, 0),
            // Long ago: at most the backlog.
            (Some(0), LOG_BACKLOG + 10, 10),
            (Some(20), LOG_BACKLOG + 10, 20),
        ] {
            assert_eq!(log_start(from, len), want, "{from:?} {len}");
        }
    }

    #[test]
    fn a_character_split_between_two_reads_is_sent_whole_with_the_second() {
        let mut carry = Vec::new();
        // "été €" split inside the first "é" and inside "€".
        let text = "été €!".as_bytes();
        let (a, rest) = text.split_at(1);
        let (b, c) = rest.split_at(text.len() - 1 - 2);
        assert_eq!(log_text(&mut carry, a.to_vec()), None);
        assert_eq!(carry, a);
        assert_eq!(log_text(&mut carry, b.to_vec()).as_deref(), Some("été "));
        assert_eq!(carry, &b"\xE2\x82"[..]);
        assert_eq!(log_text(&mut carry, c.to_vec()).as_deref(), Some("€!"));
        assert!(carry.is_empty());
        // Bytes that are no character are shown as U+FFFD, not kept.
        assert_eq!(
            log_text(&mut carry, b"a\xFFb".to_vec()).as_deref(),
            Some("a\u{FFFD}b")
        );
        assert!(carry.is_empty());
    }

    #[test]
    fn the_watcher_wakes_the_poller_for_journals_and_followed_logs_only() {
        use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, ModifyKind};
        use notify::{Event, EventKind};
        let root = Path::new("/srv/state");
        let ev = |kind: EventKind, path: &str| Ok(Event::new(kind).add_path(root.join(path)));
        let write = EventKind::Modify(ModifyKind::Data(DataChange::Any));
        let rio = AgentName::parse("rio").unwrap();
        assert_eq!(
            seen(root, ev(write, "rio/journal.jsonl")),
            vec![Seen::Change(Change::Source(SourceId::Agent(rio.clone())))]
        );
        assert_eq!(
            seen(root, ev(write, "rio/sessions/s1.log")),
            vec![Seen::Log(rio.clone())]
        );
        assert_eq!(
            seen(root, ev(write, "rio/sessions/s1.iter-2.log")),
            vec![Seen::Log(rio.clone())]
        );
        assert_eq!(
            seen(root, ev(EventKind::Create(CreateKind::Folder), "ada")),
            vec![Seen::Change(Change::NewDir(root.join("ada")))]
        );
        // The poller's own reads, other files, logs elsewhere: nothing.
        for (kind, path) in [
            (
                EventKind::Access(AccessKind::Open(AccessMode::Read)),
                "rio/journal.jsonl",
            ),
            (
                EventKind::Access(AccessKind::Open(AccessMode::Read)),
                "rio/sessions/s1.log",
            ),
            (write, "rio/session.json"),
            (write, "rio/sessions/s1.prompt.md"),
            (write, "rio/other/s1.log"),
            (write, "rio/sessions/x/s1.log"),
        ] {
            assert_eq!(seen(root, ev(kind, path)), vec![], "{kind:?} {path}");
        }
        // Lost events: read everything.
        assert_eq!(
            seen(root, Err(notify::Error::generic("queue overflow"))),
            vec![Seen::Change(Change::Rescan)]
        );
    }

    #[test]
    fn log_file_is_one_plain_log_name() {
        for ok in ["s1.log", "rio-20261127T0400-ab12.iter-3.log"] {
            assert!(is_log_name(ok), "{ok}");
        }
        for bad in [
            "",
            ".log",
            "../x.log",
            "a/b.log",
            "s1.txt",
            "s1.log%00",
            "s 1.log",
        ] {
            assert!(!is_log_name(bad), "{bad}");
        }
        assert_eq!(session_of("s1.log"), "s1");
        assert_eq!(session_of("s1.iter-3.log"), "s1");
    }
}
