//! The read-only web view (`[web]`, issue 25), through the real daemon and
//! a plain TCP client: the fleet page and its escaping, the security
//! headers, the token, the event stream and its resumption, and a flood of
//! idle and slow connections.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

const HOSTILE: &str = "<script>alert(1)</script>\"><img src=x onerror=alert(2)>\u{9b}";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One request (`Connection: close`): status, head, body.
fn request(
    port: u16,
    method: &str,
    target: &str,
    headers: &[&str],
) -> Result<(u16, String, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut text =
        format!("{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for h in headers {
        text.push_str(h);
        text.push_str("\r\n");
    }
    text.push_str("\r\n");
    s.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(|e| e.to_string())?;
    let out = String::from_utf8_lossy(&out).to_string();
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no head in {out:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, head.to_ascii_lowercase(), body.to_string()))
}

fn get(port: u16, target: &str) -> (u16, String, String) {
    request(port, "GET", target, &[]).unwrap()
}

/// A daemon with agents `rio` and `ada` and `[web]` on a free port.
fn start(env: &Env, web_extra: &str) -> (Daemon, u16) {
    let script = env.script("agent.sh", "echo PROGRESS 40\nexit 0\n");
    let port = free_port();
    let mut config = daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"rio\"\n[[agent]]\nname = \"ada\"\n",
    );
    config.push_str(&format!(
        "\n[web]\nlisten = \"127.0.0.1:{port}\"\n{web_extra}"
    ));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    (d, port)
}

/// An error record about `rio` whose message is hostile markup, as a
/// damaged or malicious `.daemon/errors.jsonl` line could carry.
fn plant_hostile_error(env: &Env) {
    let record = serde_json::json!({
        "ts": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "code": "SESSION_FAILED",
        "message": HOSTILE,
        "severity": "medium",
        "recoverable": true,
        "context": {"agent": "rio"}
    });
    let path = env.root.join(".daemon/errors.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap();
    writeln!(f, "{record}").unwrap();
}

#[test]
fn fleet_page_shows_each_agent_escapes_hostile_text_and_is_locked_down() {
    let env = Env::with_config("");
    let (_d, port) = start(&env, "");
    plant_hostile_error(&env);

    let (status, head, body) = get(port, "/");
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(
        body.contains("id=\"agent-rio\"") && body.contains("id=\"agent-ada\""),
        "{body}"
    );
    // The hostile text is shown, as text.
    assert!(body.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(2)&gt;\u{FFFD}"), "{body}");
    assert!(
        !body.contains("<img") && !body.contains("<script>alert") && !body.contains('\u{9b}'),
        "{body}"
    );
    // Our one script, by URL; no inline script, no handler attribute.
    assert_eq!(body.matches("<script").count(), 1, "{body}");
    assert!(body.contains("<script src=\"/app.js\"></script>"));
    for h in [
        "content-security-policy: default-src 'none'; script-src 'self';",
        "x-content-type-options: nosniff",
        "referrer-policy: no-referrer",
        "x-frame-options: deny",
    ] {
        assert!(head.contains(h), "missing {h:?} in\n{head}");
    }

    // /api/fleet is what `status --json` prints.
    let (status, _, api) = get(port, "/api/fleet");
    assert_eq!(status, 200);
    let api: Value = serde_json::from_str(&api).unwrap();
    let cli: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let shape = |v: &Value| -> Vec<(String, Vec<String>)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|l| (l["agent"].as_str().unwrap().to_string(), keys(l)))
            .collect()
    };
    assert_eq!(shape(&api), shape(&cli));
    assert_eq!(api[0]["last_error"]["message"], HOSTILE);

    // Read-only: no other method.
    let (status, head, _) = request(port, "POST", "/", &["Content-Length: 0"]).unwrap();
    assert_eq!(status, 405, "{head}");
    assert!(head.contains("x-frame-options: deny"), "{head}");
    let (status, _, _) = request(port, "DELETE", "/api/fleet", &[]).unwrap();
    assert_eq!(status, 405);
}

#[test]
fn a_token_is_required_when_one_is_configured() {
    let env = Env::with_config("");
    let token = "0123456789abcdef0123456789abcdef";
    let file = env.tmp("web.token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let (_d, port) = start(
        &env,
        &format!("token_file = {:?}\n", file.display().to_string()),
    );

    let (status, head, _) = get(port, "/");
    assert_eq!(status, 401, "{head}");
    assert!(head.contains("www-authenticate: bearer"), "{head}");
    let (status, _, _) = request(
        port,
        "GET",
        "/api/fleet",
        &["Authorization: Bearer wrong-token-of-some-length"],
    )
    .unwrap();
    assert_eq!(status, 401);
    let (status, _, _) = request(
        port,
        "GET",
        "/api/fleet",
        &[&format!("Authorization: Bearer {token}x")],
    )
    .unwrap();
    assert_eq!(status, 401);
    let (status, _, body) = request(
        port,
        "GET",
        "/api/fleet",
        &[&format!("Authorization: Bearer {token}")],
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = get(port, &format!("/?token={token}"));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("id=\"agent-rio\""));
}

#[test]
fn an_address_others_can_reach_needs_a_token_file() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "exit 0\n");
    let mut config = daemon_config(&script, &[], &[], "[[agent]]\nname = \"rio\"\n");
    config.push_str("\n[web]\nlisten = \"0.0.0.0:8321\"\n");
    env.set_config(&config);
    let out = env.run(&["check"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("web.listen") && text.contains("token_file"),
        "{text}"
    );
}

/// An open event stream: reads `data:` events with their ids.
struct Stream {
    s: TcpStream,
    buf: String,
}

impl Stream {
    fn open(port: u16, last_event_id: Option<&str>) -> Stream {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut text =
            "GET /events HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n".to_string();
        if let Some(id) = last_event_id {
            text.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        text.push_str("\r\n");
        s.write_all(text.as_bytes()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut stream = Stream {
            s,
            buf: String::new(),
        };
        // The head, and the first chunk's comment: the stream is set up.
        assert!(
            stream.fill_until(Duration::from_secs(15), |b| b.contains(": stream")
                || b.contains("data:")),
            "no stream: {}",
            stream.buf
        );
        stream
    }

    fn fill_until(&mut self, timeout: Duration, mut done: impl FnMut(&str) -> bool) -> bool {
        let end = Instant::now() + timeout;
        let mut chunk = [0u8; 8192];
        while Instant::now() < end {
            if done(&self.buf) {
                return true;
            }
            match self.s.read(&mut chunk) {
                Ok(0) => return done(&self.buf),
                Ok(n) => self.buf.push_str(&String::from_utf8_lossy(&chunk[..n])),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return done(&self.buf),
            }
        }
        done(&self.buf)
    }

    /// Each event so far: (id, data).
    fn events(&self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        for block in self.buf.split("\n\n") {
            let id = block.lines().find_map(|l| l.strip_prefix("id: "));
            let data = block.lines().find_map(|l| l.strip_prefix("data: "));
            if let (Some(id), Some(data)) = (id, data) {
                out.push((id.to_string(), serde_json::from_str(data).unwrap()));
            }
        }
        out
    }
}

#[test]
fn the_event_stream_delivers_a_wake_and_resumes_after_the_last_event_id() {
    let env = Env::with_config("");
    let (_d, port) = start(&env, "");
    let mut first = Stream::open(port, None);
    env.ok(&["wake", "rio"]);
    // The session runs and ends: its journal says so, and so does the stream.
    let ended = |b: &str| {
        b.contains("\"kind\":\"session_end\"") || b.contains("\"kind\":\"session_ended\"")
    };
    assert!(
        first.fill_until(Duration::from_secs(30), |b| ended(b)),
        "no session end in the stream: {}",
        first.buf
    );
    let seen = first.events();
    assert!(seen.len() >= 2, "{seen:?}");
    assert!(seen.iter().any(|(_, d)| d["agent"] == "rio"), "{seen:?}");
    // No bodies unless show_bodies.
    assert!(
        seen.iter().all(|(_, d)| d.get("event").is_none()),
        "{seen:?}"
    );

    // A reconnect after the first event gets the others, each once.
    let mut again = Stream::open(port, Some(&seen[0].0));
    let want: Vec<Value> = seen[1..].iter().map(|(_, d)| d.clone()).collect();
    again.fill_until(Duration::from_secs(15), |b| {
        b.matches("data: {").count() >= want.len()
    });
    let got: Vec<Value> = again.events().into_iter().map(|(_, d)| d).collect();
    assert!(got.len() >= want.len(), "got {got:?}\nwant {want:?}");
    assert_eq!(got[..want.len()], want[..], "the resumed stream differs");
    // What came after in the first stream too is the same.
    first.fill_until(Duration::from_secs(1), |_| false);
    let later: Vec<Value> = first.events()[1..].iter().map(|(_, d)| d.clone()).collect();
    assert_eq!(got, later[..got.len().min(later.len())].to_vec());
}

#[test]
fn idle_and_slow_connections_do_not_keep_a_reader_out() {
    let env = Env::with_config("");
    let (_d, port) = start(&env, "");
    assert_eq!(get(port, "/").0, 200);
    // 200 connections that send nothing, 30 that dribble a request head.
    let mut idle: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    let mut slow: Vec<TcpStream> = (0..30)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    for s in &mut slow {
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n");
    }
    let start = Instant::now();
    for i in 0..5 {
        for s in &mut slow {
            let _ = s.write_all(format!("X-Slow-{i}: y\r\n").as_bytes());
        }
        let r = request(port, "GET", "/api/fleet", &[]);
        assert!(
            matches!(r, Ok((200, _, _))),
            "request {i} under the flood: {r:?}"
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    // And the listener keeps no more than its cap open: of the 230 idle
    // and slow connections (plus the requests), the oldest were closed.
    let closed = |mut s: &TcpStream| {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 64];
        !matches!(s.read(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock)
    };
    let shut = idle.iter().chain(slow.iter()).filter(|s| closed(s)).count();
    assert!(
        shut >= 230 - 128,
        "only {shut} of 230 idle connections were closed"
    );
    idle.clear();
}

#[test]
fn a_reload_that_changes_web_is_refused_naming_the_key() {
    let env = Env::with_config("");
    let (_d, port) = start(&env, "");
    let config = std::fs::read_to_string(&env.config).unwrap();
    let body = config.split_once('\n').unwrap().1;
    env.set_config(&format!("{body}show_bodies = true\n"));
    let out = env.run(&["reload"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("[web] show_bodies changed") && err.contains("restart"),
        "{err}"
    );
    // The view is still served as it was.
    assert_eq!(get(port, "/").0, 200);
}
