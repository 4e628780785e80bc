//! Where the metrics go: an opt-in plain-HTTP listener (`[metrics] listen`)
//! that answers `GET /metrics`, and a node_exporter textfile
//! (`[metrics] textfile`) replaced atomically.
//!
//! The daemon's loop renders the text ([`super::exposition`]) and publishes
//! it here; the listener only ever serves the last published text, so a
//! scrape never waits for the loop and never sees half an update. The
//! listener is read-only and small on purpose: one request per connection,
//! a request head of at most 8 KiB read within 5 s (a third of the usual
//! scrape interval), no body accepted, at most 32 connections per peer
//! address and 64 in all, a newcomer always let in and the oldest idle
//! connection closed for it ([`admission`]), so connections that send
//! nothing cannot keep a scrape out; the kernel holds a connection back
//! until its client has sent something ([`defer_accept`]). It is meant for
//! loopback or a trusted network; put a reverse proxy in front for TLS or
//! authentication.

pub(crate) mod admission;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use admission::{Admission, Limits};

use super::exposition::CONTENT_TYPE;

/// The largest request head read (a scrape's is a few hundred bytes).
const MAX_HEAD: usize = 8 * 1024;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long writing a response may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections kept open: beyond them, the oldest idle one is closed.
const LIMITS: Limits = Limits {
    per_peer: 32,
    total: 64,
};

/// The last rendered exposition, shared with the listener.
#[derive(Clone)]
pub struct Board {
    tx: Arc<watch::Sender<Arc<str>>>,
}

impl Default for Board {
    fn default() -> Self {
        Board::new()
    }
}

impl Board {
    pub fn new() -> Board {
        let (tx, _) = watch::channel(Arc::from(""));
        Board { tx: Arc::new(tx) }
    }

    /// Publish a new text (replaces the last one).
    pub fn publish(&self, text: String) {
        self.tx.send_replace(Arc::from(text));
    }

    fn current(&self) -> Arc<str> {
        self.tx.borrow().clone()
    }
}

/// Bind the listener (before READY, so a bad address fails the start with
/// a clear error rather than later).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    listen(addr, "metrics")
}

/// How many connections the kernel may hold for a listener, accepted or
/// waiting for their first byte ([`defer_accept`]); the kernel caps it at
/// `net.core.somaxconn` (4096 by default). The 128 of `TcpListener::bind`
/// is filled by as many idle connections, and past it the kernel answers
/// with SYN cookies, whose connections reach the listener at once, empty.
const BACKLOG: u32 = 4096;

/// A listener on `addr` (address reuse as `TcpListener::bind`) with a deep
/// backlog whose connections are handed over once they have sent something
/// ([`defer_accept`]). Inside a tokio runtime.
pub(crate) fn listen(addr: SocketAddr, what: &str) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(BACKLOG)?;
    defer_accept(&listener, what);
    Ok(listener)
}

/// Have the kernel hand a connection to `listener` only once its client
/// has sent something, or after [`HEAD_TIMEOUT`] (Linux's
/// `TCP_DEFER_ACCEPT`, as nginx's `deferred`). A scrape sends its request
/// as it connects, so it arrives with its request waiting and counts as
/// answered from the start ([`admission`]): a flood of connections that
/// send nothing cannot close it as idle even when its client was
/// descheduled between its connect and its request, and the flood itself
/// waits in the kernel instead of the table. If the option cannot be set,
/// the listener works as before (and says so).
fn defer_accept(listener: &impl std::os::fd::AsRawFd, what: &str) {
    use nix::libc;
    let secs = HEAD_TIMEOUT.as_secs() as libc::c_int;
    // SAFETY: a valid descriptor, and a pointer to a c_int with its size.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&secs as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(
            "{what} listener: cannot defer accepting idle connections (TCP_DEFER_ACCEPT): {e}"
        );
    }
}

/// Serve `board` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, board: Board) {
    let table: Table = Arc::new(Mutex::new(Admission::new(LIMITS)));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: wait a little rather than spin.
                tracing::warn!("metrics listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        // A scrape sends its request as it connects: if it is here already,
        // the connection counts as answered from the start, so a flood of
        // newer connections (accepted before its task first runs) cannot
        // close it as idle.
        let arrived = request_waiting(&stream);
        // A second descriptor of the socket, for the table to look at.
        let socket = std::os::fd::AsFd::as_fd(&stream).try_clone_to_owned();
        let (id, closed) = {
            let mut table = lock(&table);
            let (id, closed) = table.admit(peer.ip(), Seated::request_waiting);
            if arrived {
                table.request_read(id);
            }
            (id, closed)
        };
        for seated in closed {
            seated.abort.abort();
        }
        let board = board.clone();
        let seat = Seat {
            table: table.clone(),
            id,
        };
        let task = tokio::spawn(async move {
            let _ = answer(stream, &board, &seat).await;
        });
        let seated = match socket {
            Ok(socket) => Seated {
                abort: task.abort_handle(),
                socket,
            },
            Err(e) => {
                // No descriptor left for the table: the connection is not
                // served (the flood it would join is what exhausted them).
                tracing::warn!("metrics listener: cannot keep a connection: {e}");
                task.abort();
                lock(&table).done(id);
                continue;
            }
        };
        if let Err(seated) = lock(&table).set_handle(id, seated) {
            seated.abort.abort();
        }
    }
}

/// Whether a whole request head is waiting on `socket` (looked at without
/// reading it, without waiting).
fn request_waiting(socket: &impl std::os::fd::AsRawFd) -> bool {
    use nix::sys::socket::{MsgFlags, recv};
    let mut buf = [0u8; 2048];
    match recv(
        socket.as_raw_fd(),
        &mut buf,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    ) {
        Ok(n) => head_complete(&buf[..n]),
        Err(_) => false,
    }
}

/// Whether `head` holds the end of a request head (pure).
fn head_complete(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n")
}

/// The listener's connections, shared with their tasks.
type Table = Arc<Mutex<Admission<Seated>>>;

/// What the table keeps of a connection: what closes it (its task's abort
/// handle) and a second descriptor of its socket, to look for its request
/// without its task (see [`Admission::admit`]). The socket closes once
/// both are gone: its task ends, and the table lets go of it then
/// ([`Seat`]'s drop) or when it closes the connection.
struct Seated {
    abort: AbortHandle,
    socket: std::os::fd::OwnedFd,
}

impl Seated {
    fn request_waiting(&self) -> bool {
        request_waiting(&self.socket)
    }
}

fn lock(table: &Table) -> std::sync::MutexGuard<'_, Admission<Seated>> {
    // The table stays consistent between calls: a panic cannot leave it half
    // updated, so a poisoned lock is still usable.
    table.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection's place in the table, given up when its task ends or is
/// aborted (dropped).
struct Seat {
    table: Table,
    id: u64,
}

impl Seat {
    fn request_read(&self) {
        lock(&self.table).request_read(self.id);
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        lock(&self.table).done(self.id);
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    Metrics { head_only: bool },
    Index { head_only: bool },
    NotFound,
    MethodNotAllowed,
    Bad,
}

/// Read the request line of a request head (pure).
fn parse(head: &[u8]) -> Request {
    let Some(line) = head.split(|b| *b == b'\n').next() else {
        return Request::Bad;
    };
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Request::Bad;
    };
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return Request::Bad;
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Request::MethodNotAllowed,
    };
    let path = target.split('?').next().unwrap_or("");
    match path {
        "/metrics" => Request::Metrics { head_only },
        "/" => Request::Index { head_only },
        _ => Request::NotFound,
    }
}

async fn answer(mut stream: TcpStream, board: &Board, seat: &Seat) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let read = tokio::time::timeout(HEAD_TIMEOUT, async {
        let mut buf = [0u8; 1024];
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buf[..n]);
            if head_complete(&head) {
                return Ok(true);
            }
            if head.len() > MAX_HEAD {
                return Ok(true);
            }
        }
    })
    .await;
    let complete = matches!(read, Ok(Ok(true)));
    if !complete {
        return Ok(());
    }
    seat.request_read();
    let request = if head.len() > MAX_HEAD {
        Request::Bad
    } else {
        parse(&head)
    };
    let (status, content_type, body, head_only): (&str, &str, Arc<str>, bool) = match request {
        Request::Metrics { head_only } => ("200 OK", CONTENT_TYPE, board.current(), head_only),
        Request::Index { head_only } => (
            "200 OK",
            "text/plain; charset=utf-8",
            Arc::from("agent-state metrics: GET /metrics\n"),
            head_only,
        ),
        Request::NotFound => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            Arc::from("not found: the metrics are at /metrics\n"),
            false,
        ),
        Request::MethodNotAllowed => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            Arc::from("only GET and HEAD\n"),
            false,
        ),
        Request::Bad => (
            "400 Bad Request",
            "text/plain; charset=utf-8",
            Arc::from("bad request\n"),
            false,
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n",
        body.len()
    );
    if status.starts_with("405") {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let write = async {
        stream.write_all(out.as_bytes()).await?;
        if !head_only {
            stream.write_all(body.as_bytes()).await?;
        }
        stream.shutdown().await
    };
    tokio::time::timeout(WRITE_TIMEOUT, write)
        .await
        .unwrap_or(Ok(()))
}

/// Replace the textfile at `path` with `text`: a temp file in the same
/// directory (named without `.prom`, so node_exporter never reads it half
/// written), fsynced, mode 0644, renamed over the target.
pub fn write_textfile(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut temp = tempfile::Builder::new()
        .prefix(".agent-state-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    temp.write_all(text.as_bytes())?;
    temp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    temp.as_file().sync_all()?;
    temp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_from_their_first_line() {
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Request::Metrics { head_only: false }
        );
        assert_eq!(
            parse(b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Request::Metrics { head_only: true }
        );
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n\r\n"),
            Request::Index { head_only: false }
        );
        assert_eq!(
            parse(b"GET /etc/passwd HTTP/1.1\r\n\r\n"),
            Request::NotFound
        );
        assert_eq!(
            parse(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Request::MethodNotAllowed
        );
        assert_eq!(parse(b"GET /metrics\r\n\r\n"), Request::Bad);
        assert_eq!(parse(b"\xff\xfe garbage"), Request::Bad);
        assert_eq!(parse(b""), Request::Bad);
    }

    #[test]
    fn the_textfile_is_replaced_whole_and_readable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent-state.prom");
        write_textfile(&path, "a 1\n").unwrap();
        write_textfile(&path, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 2\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temp file left beside it");
    }

    #[tokio::test]
    async fn the_listener_serves_the_last_published_text() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let board = Board::new();
        board.publish("first 1\n".into());
        board.publish("agent_state_up 1\n".into());
        let task = tokio::spawn(serve(listener, board));
        let ask = |req: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let got = ask("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        assert!(
            got.contains("Content-Type: text/plain; version=0.0.4"),
            "{got}"
        );
        assert!(got.ends_with("\r\n\r\nagent_state_up 1\n"), "{got}");
        let got = ask("DELETE /metrics HTTP/1.1\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 405"), "{got}");
        let got = ask("GET /x HTTP/1.1\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 404"), "{got}");
        task.abort();
    }
}
