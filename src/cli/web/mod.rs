//! The read-only web view of the fleet (`[web] listen`). Pages are plain
//! HTML that works without JavaScript (`page`, `views`), kept live by one
//! script (`/app.js`) over `/events`:
//!
//! - `/` the fleet, `/api/fleet` (what `status --json` prints, from the same
//!   function); `/row/NAME` one row, for the script;
//! - `/agent/NAME`, `/api/agent/NAME`, `/agent/NAME/part` (`data`): an
//!   agent's sessions, tasks, inbox, memory.md, running session and log;
//! - `/flows`, `/api/flows` (what `flow status --json` prints);
//! - `/mailbox`, `/api/mailbox` (each human mailbox's `inbox --json`, only
//!   the escalations waiting, newest first);
//! - `/events`: the event stream as Server-Sent Events with the cursors of
//!   `agent-state events`, from one shared reader (`stream`).
//!
//! The daemon binds it before READY through a hook ([`listen`]) so that the
//! daemon layer does not depend on the CLI's readers; each request reads the
//! state like the CLI does, with the configuration the daemon accepted.
//!
//! Limits: at most [`MAX_CONNECTIONS`] connections, [`PER_PEER`] of them from
//! one address, a newcomer always let in and the oldest connection that has
//! sent no request closed for it (the metrics listener's admission table);
//! a request head within [`HEAD_TIMEOUT`]; no body; only GET and HEAD;
//! [`MAX_IN_FLIGHT`] requests answered at once, each within
//! [`ANSWER_TIMEOUT`] (an event stream's body is not timed).

mod data;
mod page;
mod stream;
mod views;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tower::ServiceExt as _;

use crate::cli::Context;
use crate::daemon::exporter::admission::{Admission, Limits};
use crate::error::{Error, Result};
use crate::events::{Cursor, Reader};

/// Connections kept open in all.
pub const MAX_CONNECTIONS: usize = 128;
/// Connections kept open from one address.
pub const PER_PEER: usize = 64;
/// Requests answered at once.
pub const MAX_IN_FLIGHT: usize = 32;
/// How long a client may take to send a request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an answer (its head) may take.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// What every request shares.
#[derive(Clone)]
struct Shared {
    config_path: PathBuf,
    token: Option<Arc<[u8]>>,
    show_bodies: bool,
    /// The one reader of the journals all event streams share.
    hub: stream::Hub,
}

/// The daemon's hook: bind `[web] listen` (if set) and serve it as a task.
/// Called before READY, inside the daemon's runtime; an address in use or an
/// unreadable token file fails the start with the reason.
pub fn listen(config: &crate::config::Config, config_path: &Path) -> Result<()> {
    let Some(addr) = config.web.listen else {
        return Ok(());
    };
    let token = match &config.web.token_file {
        None => None,
        Some(path) => Some(read_token(path, config_path)?),
    };
    let listener = crate::daemon::exporter::listen(addr, "web view").map_err(|e| {
        Error::Unavailable(format!(
            "cannot listen for the web view on {addr} ([web] listen in {}): {e}",
            config_path.display()
        ))
    })?;
    let bound: SocketAddr = listener.local_addr().unwrap_or(addr);
    tracing::info!("web view at http://{bound}/");
    let shared = Shared {
        config_path: config_path.to_path_buf(),
        token,
        show_bodies: config.web.show_bodies,
        hub: stream::Hub::start(
            crate::state::StateRoot::new(&config.state_root),
            config.web.show_bodies,
        ),
    };
    tokio::spawn(serve(listener, router(shared)));
    Ok(())
}

/// The token in `path`, trimmed; an empty or unreadable file is an error.
fn read_token(path: &Path, config_path: &Path) -> Result<Arc<[u8]>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::Unavailable(format!(
            "cannot read the web view's token from {} ([web] token_file in {}): {e}",
            path.display(),
            config_path.display()
        ))
    })?;
    let token = text.trim();
    if token.len() < 16 {
        return Err(Error::Unavailable(format!(
            "the web view's token in {} is shorter than 16 characters; write a long random one, e.g. `openssl rand -hex 32 > {}`",
            path.display(),
            path.display()
        )));
    }
    Ok(Arc::from(token.as_bytes()))
}

fn router(shared: Shared) -> Router {
    Router::new()
        .route("/", get(fleet_page))
        .route("/row/{agent}", get(row_fragment))
        .route("/api/fleet", get(api_fleet))
        .route("/agent/{agent}", get(agent_page))
        .route("/agent/{agent}/part", get(agent_part))
        .route("/api/agent/{agent}", get(api_agent))
        .route("/flows", get(flows_page))
        .route("/api/flows", get(api_flows))
        .route("/mailbox", get(mailbox_page))
        .route("/api/mailbox", get(api_mailbox))
        .route("/events", get(stream::events))
        .route("/app.js", get(app_js))
        .layer(middleware::from_fn_with_state(shared.clone(), guard))
        .layer(tower::limit::ConcurrencyLimitLayer::new(MAX_IN_FLIGHT))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(0))
        .with_state(shared)
}

/// Only GET and HEAD, the token when one is set, and the security headers
/// on every answer (refusals too).
async fn guard(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    let mut response = if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut r = (StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n").into_response();
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        r
    } else if !authorised(&shared, &request) {
        let mut r = (StatusCode::UNAUTHORIZED, "a bearer token is needed\n").into_response();
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"agent-state\""),
        );
        r
    } else {
        let streaming = request.uri().path() == "/events";
        let answer = next.run(request);
        if streaming {
            answer.await
        } else {
            match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
                Ok(r) => r,
                Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "timed out\n").into_response(),
            }
        }
    };
    let h = response.headers_mut();
    for (name, value) in page::SECURITY_HEADERS {
        h.insert(*name, HeaderValue::from_static(value));
    }
    response
}

/// The bearer token (`Authorization: Bearer …`, or `?token=` for a browser,
/// which can send no header on a page load or an EventSource), compared in
/// constant time.
fn authorised(shared: &Shared, request: &Request) -> bool {
    let Some(token) = &shared.token else {
        return true;
    };
    let from_header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let from_query = request
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=")));
    from_header
        .into_iter()
        .chain(from_query)
        .any(|given| constant_time_eq(given.as_bytes(), token))
}

/// Equal, in a time that depends only on the lengths (pure).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0
}

/// A refusal: its status and text.
struct Failure(StatusCode, String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

/// The state as the CLI reads it, with the configuration the daemon accepted.
fn context(shared: &Shared) -> std::result::Result<Context, Failure> {
    Context::load_or_accepted(&shared.config_path)
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")))
}

fn fleet(ctx: &Context) -> std::result::Result<serde_json::Value, Failure> {
    crate::cli::status::fleet_json(ctx, None)
        .map_err(|e| Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")))
}

async fn fleet_page(State(shared): State<Shared>) -> Response {
    let answer = tokio::task::spawn_blocking(move || {
        let ctx = context(&shared)?;
        let lines = fleet(&ctx)?;
        let usage = usage(&ctx, None);
        Ok::<_, Failure>(page::fleet(&lines, &usage, ctx.now, &cursor_now(&ctx)))
    })
    .await;
    html(answer)
}

async fn row_fragment(
    State(shared): State<Shared>,
    axum::extract::Path(agent): axum::extract::Path<String>,
) -> Response {
    let answer = tokio::task::spawn_blocking(move || {
        let ctx = context(&shared)?;
        let lines = fleet(&ctx)?;
        let row = lines
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l.get("agent").and_then(|a| a.as_str()) == Some(agent.as_str()))
            .ok_or_else(|| Failure(StatusCode::NOT_FOUND, "no such agent\n".into()))?;
        let usage = usage(&ctx, Some(&agent));
        Ok::<_, Failure>(page::row(row, &usage, ctx.now))
    })
    .await;
    html(answer)
}

/// The end of the event stream now: a page's `data-cursor`, from which its
/// script's stream starts (nothing between the read and the stream lost).
fn cursor_now(ctx: &Context) -> String {
    Reader::new(ctx.root.clone(), Cursor::start(), None)
        .read(None)
        .map(|b| b.end.encode())
        .unwrap_or_default()
}

/// `usage --json` for the sparklines (of a working agent, or all); an
/// empty report when it cannot be read (the row says the rest).
fn usage(ctx: &Context, agent: Option<&str>) -> serde_json::Value {
    let working = agent.is_none_or(|a| {
        ctx.config
            .agent_named(a)
            .is_ok_and(|c| c.kind == crate::config::AgentKind::Agent)
    });
    if !working {
        return serde_json::Value::Null;
    }
    crate::cli::usage::report_json(ctx, agent, page::SPARK_DAYS as u32)
        .map(|(v, _)| v)
        .unwrap_or_default()
}

/// The agent named in a URL, or 404 (an invalid name never becomes a path).
fn named(ctx: &Context, text: &str) -> std::result::Result<crate::agent_name::AgentName, Failure> {
    data::agent_name(ctx, text).map_err(|e| Failure(StatusCode::NOT_FOUND, format!("{e}\n")))
}

fn failure(e: Error) -> Failure {
    Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n"))
}

/// Run `f` off the loop with the state as the CLI reads it.
async fn blocking<T: Send + 'static>(
    shared: Shared,
    f: impl FnOnce(&Context, &Shared) -> std::result::Result<T, Failure> + Send + 'static,
) -> std::result::Result<std::result::Result<T, Failure>, tokio::task::JoinError> {
    tokio::task::spawn_blocking(move || {
        let ctx = context(&shared)?;
        f(&ctx, &shared)
    })
    .await
}

async fn agent_page(
    State(shared): State<Shared>,
    axum::extract::Path(agent): axum::extract::Path<String>,
) -> Response {
    html(
        blocking(shared, move |ctx, shared| {
            let name = named(ctx, &agent)?;
            let cursor = cursor_now(ctx);
            let a = data::agent(ctx, &name, shared.show_bodies).map_err(failure)?;
            Ok(views::agent(&a, ctx.now, &cursor, shared.show_bodies))
        })
        .await,
    )
}

async fn agent_part(
    State(shared): State<Shared>,
    axum::extract::Path(agent): axum::extract::Path<String>,
) -> Response {
    html(
        blocking(shared, move |ctx, shared| {
            let name = named(ctx, &agent)?;
            let a = data::agent(ctx, &name, shared.show_bodies).map_err(failure)?;
            Ok(views::agent_part(&a, ctx.now))
        })
        .await,
    )
}

async fn api_agent(
    State(shared): State<Shared>,
    axum::extract::Path(agent): axum::extract::Path<String>,
) -> Response {
    json(
        blocking(shared, move |ctx, shared| {
            let name = named(ctx, &agent)?;
            data::agent(ctx, &name, shared.show_bodies).map_err(failure)
        })
        .await,
    )
}

async fn flows_page(State(shared): State<Shared>) -> Response {
    html(
        blocking(shared, |ctx, _| {
            let rows = data::flows(ctx).map_err(failure)?;
            Ok(views::flows(&rows, ctx.now, &cursor_now(ctx)))
        })
        .await,
    )
}

async fn api_flows(State(shared): State<Shared>) -> Response {
    json(blocking(shared, |ctx, _| data::flows(ctx).map_err(failure)).await)
}

async fn mailbox_page(State(shared): State<Shared>) -> Response {
    html(
        blocking(shared, |ctx, shared| {
            let boxes = data::mailbox(ctx, shared.show_bodies).map_err(failure)?;
            Ok(views::mailbox(
                &boxes,
                ctx.now,
                &cursor_now(ctx),
                shared.show_bodies,
            ))
        })
        .await,
    )
}

async fn api_mailbox(State(shared): State<Shared>) -> Response {
    json(
        blocking(shared, |ctx, shared| {
            data::mailbox(ctx, shared.show_bodies).map_err(failure)
        })
        .await,
    )
}

fn json(
    answer: std::result::Result<
        std::result::Result<serde_json::Value, Failure>,
        tokio::task::JoinError,
    >,
) -> Response {
    match answer {
        Ok(Ok(v)) => (
            [(header::CONTENT_TYPE, "application/json")],
            format!("{v:#}\n"),
        )
            .into_response(),
        Ok(Err(r)) => r.into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

fn html(
    answer: std::result::Result<std::result::Result<String, Failure>, tokio::task::JoinError>,
) -> Response {
    match answer {
        Ok(Ok(text)) => {
            ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], text).into_response()
        }
        Ok(Err(r)) => r.into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn api_fleet(State(shared): State<Shared>) -> Response {
    json(blocking(shared, |ctx, _| fleet(ctx)).await)
}

async fn app_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        page::SCRIPT,
    )
        .into_response()
}

type Table = Arc<Mutex<Admission<tokio::task::AbortHandle>>>;

fn lock(table: &Table) -> std::sync::MutexGuard<'_, Admission<tokio::task::AbortHandle>> {
    table.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection's place in the table, given up when its task ends.
struct Seat {
    table: Table,
    id: u64,
}

impl Drop for Seat {
    fn drop(&mut self) {
        lock(&self.table).done(self.id);
    }
}

/// Accept connections: each served by hyper (HTTP/1.1, a request head within
/// [`HEAD_TIMEOUT`]); beyond the limits the oldest connection that has not
/// sent a request is closed, so idle ones cannot keep a client out.
async fn serve(listener: TcpListener, app: Router) {
    let table: Table = Arc::new(Mutex::new(Admission::new(Limits {
        per_peer: PER_PEER,
        total: MAX_CONNECTIONS,
    })));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("web listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let (id, closed) = lock(&table).admit(peer.ip(), |_| false);
        for handle in closed {
            handle.abort();
        }
        let seat = Seat {
            table: table.clone(),
            id,
        };
        let app = app.clone();
        let task = tokio::spawn(async move {
            let seat = seat;
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    lock(&seat.table).request_read(seat.id);
                    app.clone().oneshot(req.map(Body::new))
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(16 * 1024)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
        if let Err(handle) = lock(&table).set_handle(id, task.abort_handle()) {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn tokens_compare_whole() {
        for (a, b, same) in [
            ("abc", "abc", true),
            ("abc", "abd", false),
            ("abc", "ab", false),
            ("", "", true),
            ("", "a", false),
            ("abcdefghijklmnop", "abcdefghijklmnoq", false),
        ] {
            assert_eq!(
                constant_time_eq(a.as_bytes(), b.as_bytes()),
                same,
                "{a:?} {b:?}"
            );
        }
    }
}
