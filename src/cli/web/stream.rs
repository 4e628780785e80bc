//! `/events`: the event stream as Server-Sent Events, for every viewer from
//! one reader.
//!
//! One poller task per daemon ([`Hub`]) reads what is new in the journals
//! every [`EVENT_POLL`] and sends it to every open stream through a tokio
//! broadcast channel, so N viewers cost one reader; with no viewer it
//! sleeps until one comes. Each stream keeps its own cursor: it starts by
//! reading from its `Last-Event-ID` (or `?after=`) itself, then takes the
//! poller's events past its cursor. When the poller's batch starts after
//! the stream's cursor (the poller was idle, the stream lagged behind the
//! channel, or a journal was rotated), the stream reads the gap itself, so
//! nothing is missed and nothing repeated.
//!
//! With `?log=AGENT` (an agent's page), the stream also follows the running
//! session's log: on each tick, what was appended, as `event: log`.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::{Notify, broadcast};

use super::{Shared, context, data, page};
use crate::agent_name::AgentName;
use crate::events::{Batch, Cursor, Reader, SourceId, StreamEvent};
use crate::state::StateRoot;

/// How often the poller looks for new events.
pub const EVENT_POLL: Duration = Duration::from_millis(300);
/// Ticks with nothing sent before a keep-alive comment (15 s).
const KEEP_ALIVE: u32 = 50;
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
}

/// The one reader of the journals all streams share.
#[derive(Clone)]
pub struct Hub {
    root: StateRoot,
    show_bodies: bool,
    sender: broadcast::Sender<Arc<Tick>>,
    wake: Arc<Notify>,
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
        };
        tokio::spawn(hub.clone().poll());
        hub
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<Tick>> {
        let rx = self.sender.subscribe();
        self.wake.notify_one();
        rx
    }

    async fn poll(self) {
        let mut reader: Option<Reader> = None;
        loop {
            if self.sender.receiver_count() == 0 {
                // Nobody watches: no reads until a stream opens (it reads
                // what it missed itself).
                reader = None;
                self.wake.notified().await;
                continue;
            }
            let root = self.root.clone();
            let taken = reader.take();
            let show_bodies = self.show_bodies;
            let read = tokio::task::spawn_blocking(move || {
                let mut r = taken.unwrap_or_else(|| {
                    let mut fresh = Reader::new(root, Cursor::start(), None);
                    let _ = fresh.read(None);
                    fresh
                });
                let before = r.position().clone();
                let tick = match r.read(None) {
                    Ok(batch) => Tick::new(before, batch, show_bodies),
                    Err(_) => Tick {
                        end: before.clone(),
                        before,
                        events: Vec::new(),
                        chunk: Bytes::new(),
                        restarted: true,
                    },
                };
                (r, tick)
            })
            .await;
            if let Ok((r, tick)) = read {
                reader = Some(r);
                // No receiver left: the next turn sleeps.
                let _ = self.sender.send(Arc::new(tick));
            }
            tokio::time::sleep(EVENT_POLL).await;
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
}

/// One stream's state.
struct Viewer {
    root: StateRoot,
    cursor: Cursor,
    show_bodies: bool,
    rx: broadcast::Receiver<Arc<Tick>>,
    follow: Option<Follow>,
    config_path: PathBuf,
    quiet: u32,
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
            self.quiet = 0;
            return Some(chunk);
        }
        self.quiet += 1;
        if self.quiet >= KEEP_ALIVE {
            // Keeps proxies from closing the stream, and finds a viewer
            // that went away (its write fails).
            self.quiet = 0;
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
            let mut out = drain(&mut f);
            if again && let Ok(ctx) = crate::cli::Context::load_or_accepted(&config_path) {
                let now = data::running_log(&ctx, &f.agent);
                let session = now.as_ref().map(|(s, _)| s.clone());
                let path = now.map(|(_, p)| p);
                if path != f.path {
                    // A new log: from its start, but the first one from now
                    // (the page shows its tail already).
                    f.offset = if !f.known {
                        path.as_deref()
                            .and_then(|p| crate::fsx::metadata(p).ok().flatten())
                            .map(|st| st.st_size as u64)
                            .unwrap_or(0)
                    } else {
                        0
                    };
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

/// What the followed log gained since its offset, as a `log` event.
fn drain(f: &mut Follow) -> String {
    let text = f
        .path
        .as_deref()
        .and_then(|p| read_from(p, f.offset))
        .unwrap_or_default();
    f.offset += text.len() as u64;
    if text.is_empty() {
        return String::new();
    }
    let data = serde_json::json!({
        "session": f.session,
        "text": String::from_utf8_lossy(&text),
    });
    format!("event: log\ndata: {data}\n\n")
}

/// The bytes of a file below the root from `offset` (at most
/// [`LOG_CHUNK`]); none when it is missing, a link, or shorter.
fn read_from(path: &std::path::Path, offset: u64) -> Option<Vec<u8>> {
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
    let ctx = match context(&shared) {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let follow = match log.as_deref() {
        None | Some("") => None,
        Some(name) => match data::agent_name(&ctx, name) {
            Ok(agent) => Some(Follow {
                agent,
                session: None,
                path: None,
                offset: 0,
                known: false,
            }),
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
        quiet: 0,
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
}
