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

    let (status, _, body) = request(port, "HEAD", "/", &[]).unwrap();
    assert_eq!((status, body.as_str()), (200, ""));
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
        Stream::open_at(port, "/events", last_event_id)
    }

    fn open_at(port: u16, target: &str, last_event_id: Option<&str>) -> Stream {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut text =
            format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n");
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

/// How many sockets process `pid` has open.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

#[test]
fn idle_and_slow_connections_do_not_keep_a_reader_out() {
    let env = Env::with_config("");
    let (d, port) = start(&env, "");
    assert_eq!(get(port, "/").0, 200);
    let before = sockets(d.pid);
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
    // And the daemon holds no more than the listener's cap of them open
    // (the idle ones wait in the kernel until they send something; beyond
    // the cap, the oldest that have not sent their request are closed).
    let held = sockets(d.pid) - before;
    assert!(
        held <= 128,
        "the daemon holds {held} more sockets under the flood of 230 (cap 128)"
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

/// A daemon with agents `rio` (its session prints a line, waits for
/// `GO-rio` in the temp dir, prints another, waits for `END-rio`) and `ada`, a human `marcus`,
/// and `[web]` on a free port.
fn start_waiting(env: &Env, web_extra: &str) -> (Daemon, u16) {
    let go = env.tmp("GO-rio");
    let script = env.script(
        "agent.sh",
        &format!(
            "if [ \"$1\" = rio ]; then\n  echo 'first line <b>'\n  while [ ! -f {go:?} ]; do sleep 0.05; done\n  echo second-line\n  while [ ! -f {end:?} ]; do sleep 0.05; done\nfi\necho PROGRESS 40\nexit 0\n",
            go = go.display().to_string(),
            end = env.tmp("END-rio").display().to_string()
        ),
    );
    let port = free_port();
    let mut config = daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"high\"")],
        "[[agent]]\nname = \"rio\"\n[[agent]]\nname = \"ada\"\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    );
    config.push_str(&format!(
        "\n[web]\nlisten = \"127.0.0.1:{port}\"\n{web_extra}"
    ));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    (env.daemon(), port)
}

/// The JSON of `/api/…`.
fn api(port: u16, target: &str) -> Value {
    let (status, _, body) = get(port, target);
    assert_eq!(status, 200, "{target}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn the_agent_page_shows_the_running_log_live_then_sessions_tasks_inbox_and_memory_as_text() {
    let env = Env::with_config("");
    let (d, port) = start_waiting(&env, "");
    env.ok(&["task", "add", "rio", "--description", HOSTILE]);
    let secret = "BODY-NOT-FOR-THE-PAGE";
    env.write(
        "rio",
        "memory.md",
        &format!("# Memory of rio\n\n## Notes {HOSTILE}\n- {HOSTILE}\n- plain item\n\n{HOSTILE}\n"),
    );
    env.ok(&["wake", "rio"]);
    d.wait_until(
        Duration::from_secs(30),
        "rio's session prints its first line",
        || {
            api(port, "/api/agent/rio")["running"]["log"]["tail"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("first line <b>"))
        },
    );
    // The running session, its log's tail as text.
    let (status, head, page) = get(port, "/agent/rio");
    assert_eq!(status, 200, "{page}");
    assert!(head.contains("content-security-policy: default-src 'none'; script-src 'self';"));
    assert!(
        page.contains("<pre id=\"log\" data-log-file=\"")
            && page.contains("\">first line &lt;b&gt;\n</pre>"),
        "{page}"
    );
    assert!(page.contains("data-agent=\"rio\""), "{page}");
    // The log, live: what the session prints next comes as a `log` event.
    let mut stream = Stream::open_at(port, "/events?log=rio", None);
    std::fs::write(env.tmp("GO-rio"), "").unwrap();
    assert!(
        stream.fill_until(Duration::from_secs(30), |b| b
            .contains("event: log\ndata: ")
            && b.contains("second-line")),
        "no log event: {}",
        stream.buf
    );
    assert!(
        !stream.buf.contains("first line"),
        "the tail again: {}",
        stream.buf
    );
    std::fs::write(env.tmp("END-rio"), "").unwrap();
    d.wait_until(Duration::from_secs(30), "rio's session ends", || {
        api(port, "/api/agent/rio")["running"].is_null()
    });
    // A message waiting (normal priority: no wake), its subject hostile.
    env.ok(&[
        "send",
        "--from",
        "ada",
        "--to",
        "rio",
        "--subject",
        HOSTILE,
        "--body",
        secret,
    ]);

    let a = api(port, "/api/agent/rio");
    // The parts that are the CLI's --json are the CLI's --json.
    let tasks: Value = serde_json::from_str(&env.ok(&["task", "list", "rio", "--json"])).unwrap();
    assert_eq!(a["tasks"], tasks);
    let status: Value = serde_json::from_str(&env.ok(&["status", "rio", "--json"])).unwrap();
    assert_eq!(keys(&a["status"]), keys(&status[0]));
    let inbox: Value = serde_json::from_str(&env.ok(&["inbox", "rio", "--json"])).unwrap();
    assert_eq!(keys(&a["inbox"]), keys(&inbox));
    let session = &a["sessions"][0];
    assert_eq!(session["outcome"], "completed", "{a:#}");
    assert!(
        session["session_id"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    // The subject, not the body.
    assert_eq!(a["inbox"]["waiting"][0]["message"]["subject"], HOSTILE);
    assert!(!a.to_string().contains(secret), "{a:#}");

    let (_, _, page) = get(port, "/agent/rio");
    assert!(page.contains("completed"), "{page}");
    assert!(!page.contains(secret), "{page}");
    let shown =
        "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(2)&gt;\u{FFFD}";
    assert!(page.contains(&format!("<h4>Notes {shown}</h4>")), "{page}");
    assert!(page.contains(&format!("<li>{shown}</li>")), "{page}");
    assert!(page.contains(&format!("<p>{shown}</p>")), "{page}");
    assert!(
        page.contains(&format!("<span class=\"subject\">{shown}</span>")),
        "{page}"
    );
    assert!(
        !page.contains("<img") && !page.contains("<script>") && !page.contains('\u{9b}'),
        "{page}"
    );
    assert_eq!(page.matches("<script").count(), 1, "{page}");
}

/// The value of `name="…"` in the first tag that has it.
fn attr(page: &str, name: &str) -> String {
    let start = page
        .find(&format!("{name}=\""))
        .unwrap_or_else(|| panic!("no {name} in {page}"))
        + name.len()
        + 2;
    page[start..].split('"').next().unwrap().to_string()
}

#[test]
fn the_live_log_goes_on_from_where_the_page_ended_and_a_bad_offset_from_the_end() {
    let env = Env::with_config("");
    let (d, port) = start_waiting(&env, "");
    env.ok(&["wake", "rio"]);
    d.wait_until(
        Duration::from_secs(30),
        "rio's session prints its first line",
        || {
            api(port, "/api/agent/rio")["running"]["log"]["tail"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("first line <b>"))
        },
    );
    // The page says which log it showed and where its tail ended.
    let (_, _, page) = get(port, "/agent/rio");
    let file = attr(&page, "data-log-file");
    let from = attr(&page, "data-log-from");
    assert!(file.ends_with(".log") && !file.contains('/'), "{file}");
    assert_eq!(from, "first line <b>\n".len().to_string(), "{page}");
    // The session prints its next line after the page was made and before
    // the page's stream opens.
    std::fs::write(env.tmp("GO-rio"), "").unwrap();
    let log = env.root.join("rio/sessions").join(&file);
    d.wait_until(Duration::from_secs(30), "the log's second line", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("second-line"))
    });
    let mut stream = Stream::open_at(
        port,
        &format!("/events?log=rio&log_file={file}&log_from={from}"),
        None,
    );
    assert!(
        stream.fill_until(Duration::from_secs(15), |b| b.contains("second-line")),
        "the line printed before the stream opened is missing: {}",
        stream.buf
    );
    assert!(
        !stream.buf.contains("first line"),
        "the page's tail again: {}",
        stream.buf
    );
    // An offset past the log's end (a log replaced by a shorter one):
    // from its end, no error.
    let mut past = Stream::open_at(port, "/events?log=rio&log_from=99999999", None);
    assert!(past.buf.starts_with("HTTP/1.1 200"), "{}", past.buf);
    // Nonsense is refused, naming the parameter.
    for target in [
        "/events?log=rio&log_from=abc",
        "/events?log=rio&log_from=-1",
        "/events?log=rio&log_file=..%2F..%2Fconfig.toml&log_from=0",
        "/events?log=rio&log_file=journal.jsonl&log_from=0",
    ] {
        let (status, _, body) = get(port, target);
        assert_eq!(status, 400, "{target}: {body}");
        assert!(body.contains("bad log_"), "{target}: {body}");
    }
    // What the session prints last reaches both streams, once.
    std::fs::write(env.tmp("END-rio"), "").unwrap();
    for s in [&mut stream, &mut past] {
        assert!(
            s.fill_until(Duration::from_secs(30), |b| b.contains("PROGRESS 40")),
            "no last line: {}",
            s.buf
        );
    }
    assert!(
        !past.buf.contains("first line") && !past.buf.contains("second-line"),
        "{}",
        past.buf
    );
    assert_eq!(
        stream.buf.matches("second-line").count(),
        1,
        "{}",
        stream.buf
    );
}

#[test]
fn the_agent_page_takes_only_configured_names_and_follows_no_link_out_of_the_root() {
    let env = Env::with_config("");
    let (_d, port) = start_waiting(&env, "");
    for target in [
        "/agent/nobody",
        "/agent/..%2F..%2Fetc",
        "/agent/.daemon",
        "/api/agent/Rio%20x",
        "/agent/rio%00",
        "/events?log=..%2Fetc",
    ] {
        let (status, _, body) = get(port, target);
        assert_eq!(status, 404, "{target}: {body}");
    }
    // memory.md a link to a file outside the root: not read, said so.
    let outside = env.tmp("outside.md");
    std::fs::write(&outside, "OUTSIDE-SECRET\n").unwrap();
    let memory = env.path("rio", "memory.md");
    std::fs::remove_file(&memory).unwrap();
    std::os::unix::fs::symlink(&outside, &memory).unwrap();
    let (status, _, page) = get(port, "/agent/rio");
    assert_eq!(status, 200, "{page}");
    assert!(!page.contains("OUTSIDE-SECRET"), "{page}");
    assert!(page.contains("cannot read"), "{page}");
    let a = api(port, "/api/agent/rio");
    assert!(!a.to_string().contains("OUTSIDE-SECRET"), "{a:#}");
    assert!(a["memory"]["error"].is_string(), "{a:#}");
    // A human mailbox's page: its inbox, no sessions.
    let a = api(port, "/api/agent/marcus");
    assert_eq!(a["kind"], "human");
    assert!(a.get("sessions").is_none(), "{a:#}");
}

#[test]
fn the_mailbox_shows_escalations_not_acknowledged_newest_first_without_bodies() {
    let env = Env::with_config("");
    let (_d, port) = start_waiting(&env, "");
    let send = |subject: &str, reference: Option<&str>| {
        let mut args = vec![
            "send",
            "--from",
            "rio",
            "--to",
            "marcus",
            "--type",
            "flag",
            "--subject",
            subject,
            "--body",
            "BODY-SECRET",
        ];
        if let Some(r) = reference {
            args.extend(["--source-ref", r]);
        }
        env.ok(&args)
    };
    send("just a note", None);
    send(HOSTILE, Some("agent-state/session/20261120-110000"));
    // An escalation an hour older, as a file a sender left (settled).
    let older = serde_json::json!({
        "id": "older-1", "from": "rio", "to": "marcus",
        "created_at": (chrono::Utc::now() - chrono::Duration::hours(1))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "type": "flag", "priority": "high", "subject": "older escalation",
        "body": "BODY-SECRET", "source_ref": "agent-state/session/20261120-100000",
        "expires_at": null
    });
    let file = env.path("marcus", "inbox/older-1.json");
    std::fs::write(&file, older.to_string()).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    let boxes = api(port, "/api/mailbox");
    let marcus = &boxes[0];
    assert_eq!(marcus["agent"], "marcus");
    let subjects: Vec<&str> = marcus["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["message"]["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, vec![HOSTILE, "older escalation"]);
    assert!(!boxes.to_string().contains("BODY-SECRET"), "{boxes:#}");
    let listing: Value = serde_json::from_str(&env.ok(&["inbox", "marcus", "--json"])).unwrap();
    assert_eq!(keys(marcus), keys(&listing));

    let (status, _, page) = get(port, "/mailbox");
    assert_eq!(status, 200);
    let shown = page.find("&lt;script&gt;alert(1)").expect(&page);
    let older = page.find("older escalation").expect(&page);
    assert!(shown < older, "{page}");
    assert!(
        !page.contains("just a note") && !page.contains("BODY-SECRET"),
        "{page}"
    );
    assert!(
        !page.contains("<img") && !page.contains("<script>"),
        "{page}"
    );
}

#[test]
fn bodies_are_shown_only_with_show_bodies() {
    let env = Env::with_config("");
    let (_d, port) = start_waiting(&env, "show_bodies = true\n");
    env.ok(&[
        "send",
        "--from",
        "rio",
        "--to",
        "marcus",
        "--type",
        "flag",
        "--subject",
        "s",
        "--source-ref",
        "agent-state/session/1",
        "--body",
        HOSTILE,
    ]);
    let boxes = api(port, "/api/mailbox");
    assert_eq!(boxes[0]["waiting"][0]["message"]["body"], HOSTILE);
    let (_, _, page) = get(port, "/mailbox");
    assert!(page.contains("<pre>&lt;script&gt;alert(1)"), "{page}");
    assert!(!page.contains("<img"), "{page}");
}

#[test]
fn the_flows_page_shows_the_cycle_its_step_and_who_is_at_work() {
    let env = Env::with_config("");
    let repo = git_repo(&env);
    let go = env.tmp("GO");
    // Every session waits until the test ends: the cycle stays where it is.
    let script = env.script(
        "agent.sh",
        &format!(
            "while [ ! -f {go:?} ]; do sleep 0.05; done\nexit 0\n",
            go = go.display().to_string()
        ),
    );
    let port = free_port();
    let agents = format!(
        "[[agent]]\nname = \"theseus\"\n[[agent]]\nname = \"rio\"\nworkspace = {{ repo = {repo:?}, base = \"main\" }}\n\
         [[agent]]\nname = \"leo\"\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n\
         [[flow]]\nname = \"notes\"\nplanner = \"theseus\"\nactor = \"rio\"\njudge = \"leo\"\n",
        repo = repo.display().to_string()
    );
    let mut config = daemon_config(&script, &[], &[("wake_on_inbox", "\"high\"")], &agents);
    config.push_str(&format!("\n[web]\nlisten = \"127.0.0.1:{port}\"\n"));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    let cycle = env.ok(&["flow", "start", "notes", "--goal", HOSTILE]);
    let cycle = cycle.trim();
    d.wait_until(Duration::from_secs(30), "the Planner is at work", || {
        api(port, "/api/flows")[0]["state"]["current"]["awaiting"]["agent"] == "theseus"
    });
    let flows = api(port, "/api/flows");
    let cli: Value = serde_json::from_str(&env.ok(&["flow", "status", "--json"])).unwrap();
    assert_eq!(flows, cli);
    assert_eq!(flows[0]["state"]["current"]["id"], cycle);
    let (status, _, page) = get(port, "/flows");
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(&format!("<td>{cycle}</td>")), "{page}");
    assert!(page.contains("theseus"), "{page}");
    assert!(page.contains("&lt;script&gt;alert(1)"), "{page}");
    assert!(
        !page.contains("<img") && !page.contains("<script>"),
        "{page}"
    );
    std::fs::write(&go, "").unwrap();
}

/// A cycle waiting for the human shows what the human is asked (the
/// question's subject, as text, linking to the mailbox), in the page, in
/// `/api/flows` and in `flow status`, not only its status.
#[test]
fn the_flows_page_shows_the_question_the_human_is_asked() {
    let port = free_port();
    let lab = crate::flows::lab(&format!("\n[web]\nlisten = \"127.0.0.1:{port}\"\n"));
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["* pass-medium"]);
    let d = lab.env.daemon();
    let cycle = lab.start("Ship <b>it</b>");
    d.wait_until(
        Duration::from_secs(60),
        "the cycle awaits approval and the human is asked",
        || {
            lab.current()["status"] == "awaiting_approval"
                && lab.mail().iter().any(|m| m["type"] == "question")
                && api(port, "/api/flows")[0]["state"]["outbox"] == serde_json::json!([])
        },
    );
    let asked = lab
        .mail()
        .into_iter()
        .find(|m| m["type"] == "question")
        .unwrap();
    let subject = asked["subject"].as_str().unwrap().to_string();
    let flows = api(port, "/api/flows");
    assert_eq!(flows[0]["questions"][0]["id"], asked["id"], "{flows:#}");
    assert_eq!(flows[0]["questions"][0]["subject"], subject.as_str());
    let cli: Value = serde_json::from_str(&lab.env.ok(&["flow", "status", "--json"])).unwrap();
    assert_eq!(flows, cli);
    let text = lab.env.ok(&["flow", "status"]);
    assert!(text.contains(&format!("asks marcus: {subject}")), "{text}");
    let (status, _, page) = get(port, "/flows");
    assert_eq!(status, 200, "{page}");
    let shown = subject
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;");
    assert!(
        page.contains(&format!(
            "<a href=\"/mailbox\" class=\"subject\">{shown}</a>"
        )),
        "{page}"
    );
    assert!(page.contains(&cycle), "{page}");
    // Approved: the question is answered and no longer shown.
    lab.env.ok(&["flow", "approve", &cycle]);
    let flows = api(port, "/api/flows");
    assert!(flows[0].get("questions").is_none(), "{flows:#}");
}

#[test]
fn the_fleet_page_shows_budget_bars_holds_and_sessions_per_day() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "echo PROGRESS 40\nexit 0\n");
    let port = free_port();
    let mut config = daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"rio\"\nbudget = { max_sessions = 4, max_cost_usd = 2.0 }\n[[agent]]\nname = \"ada\"\n",
    );
    config.push_str(&format!("\n[web]\nlisten = \"127.0.0.1:{port}\"\n"));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(30), "rio's session is counted", || {
        api(port, "/api/fleet")[0]["today"]["sessions"] == 1
    });
    let (_, _, page) = get(port, "/");
    let row = page
        .split("<tr id=\"agent-rio\"")
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .expect(&page)
        .to_string();
    assert!(
        row.contains("sessions <span class=\"bar\" title=\"1 of 4\">"),
        "{row}"
    );
    assert!(
        row.contains("cost <span class=\"bar\" title=\"$0.00 of $2.00\">"),
        "{row}"
    );
    // Today's bar of the sparkline is the one session.
    assert!(row.contains("<svg class=\"spark\""), "{row}");
    assert!(
        row.contains("last 14 days: 0 0 0 0 0 0 0 0 0 0 0 0 0 1</title>"),
        "{row}"
    );
    assert!(!page.contains("<img") && page.matches("<script").count() == 1);
    // ada has no budget: no bar.
    let ada = page.split("<tr id=\"agent-ada\"").nth(1).unwrap();
    assert!(!ada.split("</tr>").next().unwrap().contains("class=\"bar\""));
}

#[test]
fn a_slow_loris_does_not_stop_other_viewers() {
    let env = Env::with_config("");
    let (_d, port) = start(&env, "");
    // 20 clients that send their request heads a byte at a time, from a
    // thread, for as long as the test runs.
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let reopened = Arc::new(AtomicUsize::new(0));
    let loris = {
        let (stop, reopened) = (stop.clone(), reopened.clone());
        std::thread::spawn(move || {
            let mut conns: Vec<TcpStream> = (0..20)
                .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
                .collect();
            let head = b"GET /events HTTP/1.1\r\nHost: localhost\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
            let mut sent = 0;
            while !stop.load(Ordering::Relaxed) {
                for c in conns.iter_mut() {
                    if c.write_all(&head[sent % head.len()..sent % head.len() + 1])
                        .is_err()
                    {
                        // Closed by the server (head timeout): open another.
                        if let Ok(n) = TcpStream::connect(("127.0.0.1", port)) {
                            *c = n;
                            reopened.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                sent += 1;
                std::thread::park_timeout(Duration::from_millis(50));
            }
        })
    };
    // Viewers meanwhile: a stream sees a session, pages load.
    let mut viewer = Stream::open(port, None);
    let t = Instant::now();
    assert_eq!(get(port, "/").0, 200);
    assert_eq!(get(port, "/agent/rio").0, 200);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    env.ok(&["wake", "rio"]);
    assert!(
        viewer.fill_until(Duration::from_secs(30), |b| b
            .contains("\"kind\":\"session_end\"")),
        "the viewer saw no session end under the loris: {}",
        viewer.buf
    );
    // The server closes a head that takes too long (5 s): the loris opens
    // new ones, and viewers still come in.
    assert!(
        poll_until(Duration::from_secs(20), || reopened.load(Ordering::Relaxed)
            > 0),
        "the server never closed a slow head"
    );
    let _second = Stream::open(port, None);
    assert_eq!(get(port, "/api/fleet").0, 200);
    stop.store(true, Ordering::Relaxed);
    loris.join().unwrap();
}

/// A headless Chromium driven over the DevTools protocol on a pipe
/// (`--remote-debugging-pipe`: commands on fd 3, answers on fd 4, each a
/// JSON text ended by NUL).
struct Browser {
    child: std::process::Child,
    to: std::fs::File,
    from: std::io::BufReader<std::fs::File>,
    next: u64,
    session: Option<String>,
    /// The events (no `id`) that arrived while waiting for answers.
    events: Vec<Value>,
}

impl Browser {
    fn start(dir: &std::path::Path) -> Browser {
        use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
        use std::os::unix::process::CommandExt;
        let (cmd_read, cmd_write) = nix::unistd::pipe().unwrap();
        let (ans_read, ans_write) = nix::unistd::pipe().unwrap();
        let (cr, aw) = (cmd_read.as_raw_fd(), ans_write.as_raw_fd());
        let mut c = std::process::Command::new("chromium");
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-pipe",
            "--window-size=1400,500",
        ])
        .arg(format!("--user-data-dir={}", dir.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        unsafe {
            c.pre_exec(move || {
                if libc_dup2(cr, 3) < 0 || libc_dup2(aw, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = c.spawn().expect("chromium (apt-get install -y chromium)");
        drop(cmd_read);
        drop(ans_write);
        let to = unsafe { std::fs::File::from_raw_fd(cmd_write.into_raw_fd()) };
        let from = unsafe { std::fs::File::from_raw_fd(ans_read.into_raw_fd()) };
        Browser {
            child,
            to,
            from: std::io::BufReader::new(from),
            next: 0,
            session: None,
            events: Vec::new(),
        }
    }

    /// Send a command and wait for its answer (events in between kept in
    /// `events`).
    fn call(&mut self, method: &str, params: Value) -> Value {
        use std::io::BufRead;
        self.next += 1;
        let id = self.next;
        let mut msg = serde_json::json!({"id": id, "method": method, "params": params});
        if let Some(s) = &self.session {
            msg["sessionId"] = Value::String(s.clone());
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        loop {
            let mut buf = Vec::new();
            let n = self.from.read_until(0, &mut buf).unwrap();
            assert!(n > 0, "chromium closed the pipe");
            buf.pop();
            let v: Value = serde_json::from_slice(&buf).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
            if v.get("id").is_none() {
                self.events.push(v);
            }
        }
    }

    fn eval(&mut self, expression: &str) -> Value {
        self.call(
            "Runtime.evaluate",
            serde_json::json!({"expression": expression, "returnByValue": true}),
        )["result"]["value"]
            .clone()
    }
}

impl Browser {
    /// A new tab on `url`, attached; console and log events collected.
    fn open(&mut self, url: &str) {
        let target = self.call(
            "Target.createTarget",
            serde_json::json!({"url": "about:blank"}),
        )["targetId"]
            .clone();
        let session = self.call(
            "Target.attachToTarget",
            serde_json::json!({"targetId": target, "flatten": true}),
        )["sessionId"]
            .as_str()
            .unwrap()
            .to_string();
        self.session = Some(session);
        self.call("Runtime.enable", serde_json::json!({}));
        self.call("Log.enable", serde_json::json!({}));
        self.call("Page.enable", serde_json::json!({}));
        self.call("Page.navigate", serde_json::json!({"url": url}));
    }

    fn screenshot(&mut self, name: &str) {
        let shot = self.call(
            "Page.captureScreenshot",
            serde_json::json!({"format": "png"}),
        );
        let png = base64_decode(shot["data"].as_str().unwrap());
        let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join(name);
        std::fs::write(&out, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn libc_dup2(from: i32, to: i32) -> i32 {
    // In the child between fork and exec: only async-signal-safe calls.
    // SAFETY: `from` is open in the child (inherited) for this call.
    let from = unsafe { std::os::fd::BorrowedFd::borrow_raw(from) };
    // SAFETY: fd `to` (3 or 4) is free to be replaced in the child.
    match unsafe { nix::unistd::dup2_raw(from, to) } {
        Ok(fd) => {
            use std::os::fd::IntoRawFd;
            fd.into_raw_fd()
        }
        Err(_) => -1,
    }
}

/// Standard base64 (for the screenshot).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let bytes: Vec<u8> = text
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= u32::from(value(*c)) << (18 - 6 * i);
        }
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// In a real browser, the fleet page changes a row when its agent wakes,
/// without a reload (run with AGENT_STATE_BROWSER_TESTS=1; needs
/// `chromium`). Leaves target/web-fleet.png.
#[test]
fn a_browser_sees_a_row_change_when_its_agent_wakes() {
    if std::env::var("AGENT_STATE_BROWSER_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set AGENT_STATE_BROWSER_TESTS=1 (needs chromium)");
        return;
    }
    let env = Env::with_config("");
    let (_d, port) = start(&env, "");
    let mut b = Browser::start(&env.tmp("chromium"));
    let target = b.call(
        "Target.createTarget",
        serde_json::json!({"url": format!("http://127.0.0.1:{port}/")}),
    )["targetId"]
        .clone();
    let session = b.call(
        "Target.attachToTarget",
        serde_json::json!({"targetId": target, "flatten": true}),
    )["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    b.session = Some(session);
    let row = "(function(){var r=document.getElementById('agent-rio');return r?r.innerText:''})()";
    let live = "(document.getElementById('live')||{}).textContent";
    assert!(
        poll_until(Duration::from_secs(20), || b
            .eval(row)
            .as_str()
            .is_some_and(|t| !t.is_empty())),
        "the page never showed rio"
    );
    let before = b.eval(row);
    // A mark that a reload would lose.
    b.eval("window.__notReloaded = true");
    env.ok(&["wake", "rio"]);
    assert!(
        poll_until(Duration::from_secs(30), || {
            let now = b.eval(row);
            now != before
                && now
                    .as_str()
                    .is_some_and(|t| t.contains("success") || t.contains("completed"))
        }),
        "rio's row never changed: {before} -> {}",
        b.eval(row)
    );
    assert_eq!(b.eval("window.__notReloaded === true"), Value::Bool(true));
    assert_eq!(b.eval(live), Value::String("live".into()));
    let shot = b.call(
        "Page.captureScreenshot",
        serde_json::json!({"format": "png"}),
    );
    let png = base64_decode(shot["data"].as_str().unwrap());
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/web-fleet.png");
    std::fs::write(&out, png).unwrap();
}

/// In a real browser, an agent's page shows memory.md, a message subject
/// and the session's log with hostile markup as text (no script runs: the
/// payloads would set `window.__pwned`; the console has no message, no
/// exception and no CSP refusal), and the log grows live through SSE
/// without a reload. Leaves target/web-agent.png.
#[test]
fn a_browser_shows_hostile_content_on_the_agent_page_as_text_and_its_log_live() {
    if std::env::var("AGENT_STATE_BROWSER_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set AGENT_STATE_BROWSER_TESTS=1 (needs chromium)");
        return;
    }
    const PAYLOAD: &str =
        "<script>window.__pwned=1</script>\"><img src=x onerror=\"window.__pwned=2\">\u{9b}[31m";
    let env = Env::with_config("");
    let (d, port) = start_waiting(&env, "");
    env.write(
        "rio",
        "memory.md",
        &format!("# Memory {PAYLOAD}\n\n- {PAYLOAD}\n\n{PAYLOAD}\n"),
    );
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(30), "rio's session runs", || {
        api(port, "/api/agent/rio")["running"]["log"]["tail"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("first line"))
    });
    // Waiting (the session has claimed what was there before it).
    env.ok(&[
        "send",
        "--from",
        "ada",
        "--to",
        "rio",
        "--subject",
        PAYLOAD,
        "--body",
        PAYLOAD,
    ]);
    let mut b = Browser::start(&env.tmp("chromium"));
    b.open(&format!("http://127.0.0.1:{port}/agent/rio"));
    let text = |b: &mut Browser, id: &str| {
        b.eval(&format!(
            "(function(){{var e=document.getElementById('{id}');return e?e.textContent:''}})()"
        ))
        .as_str()
        .unwrap_or("")
        .to_string()
    };
    assert!(
        poll_until(Duration::from_secs(20), || text(&mut b, "log")
            .contains("first line <b>")),
        "the page never showed the log"
    );
    assert!(
        poll_until(Duration::from_secs(10), || b
            .eval("(document.getElementById('live')||{}).textContent")
            == Value::String("live".into())),
        "the event stream never opened"
    );
    b.eval("window.__notReloaded = true");
    std::fs::write(env.tmp("GO-rio"), "").unwrap();
    assert!(
        poll_until(Duration::from_secs(30), || text(&mut b, "log")
            .contains("second-line")),
        "the log never grew: {:?}",
        text(&mut b, "log")
    );
    std::fs::write(env.tmp("END-rio"), "").unwrap();
    // The session's end reaches the page's live part too.
    assert!(
        poll_until(Duration::from_secs(30), || text(&mut b, "part")
            .contains("completed")),
        "the page never showed the session's end: {}",
        text(&mut b, "part")
    );
    assert_eq!(b.eval("window.__notReloaded === true"), Value::Bool(true));

    // The payloads are text, where they were put.
    let shown = PAYLOAD.replace('\u{9b}', "\u{FFFD}");
    let memory = text(&mut b, "memory");
    assert_eq!(memory.matches(shown.as_str()).count(), 3, "{memory:?}");
    let subjects = b.eval(
        "Array.prototype.map.call(document.querySelectorAll('.subject'), function(e){return e.textContent})",
    );
    assert_eq!(subjects, serde_json::json!([shown]), "{subjects}");
    // Nothing ran, nothing was made of them.
    assert_eq!(
        b.eval("typeof window.__pwned"),
        Value::String("undefined".into())
    );
    assert_eq!(b.eval("document.images.length"), serde_json::json!(0));
    assert_eq!(b.eval("document.scripts.length"), serde_json::json!(1));
    b.screenshot("web-agent.png");
    let noise: Vec<&Value> = b
        .events
        .iter()
        .filter(|e| {
            matches!(
                e["method"].as_str(),
                Some("Runtime.consoleAPICalled" | "Runtime.exceptionThrown" | "Log.entryAdded")
            )
        })
        .collect();
    assert!(noise.is_empty(), "the console said: {noise:#?}");
}

/// A TCP proxy to `port` whose open connections the test can cut (the
/// listener stays): what a browser sees when a network drops its stream.
struct Proxy {
    port: u16,
    open: std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(to: u16) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::<TcpStream>::new()));
        let kept = open.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let mut list = kept.lock().unwrap();
                list.push(client.try_clone().unwrap());
                list.push(server.try_clone().unwrap());
                drop(list);
                for (mut a, mut b) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut a, &mut b);
                        let _ = b.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, open }
    }

    /// Cut every connection open now.
    fn cut(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A stream that reconnects (the network dropped it) opens again with the
/// URL it was opened with, so the server sends the log again from the
/// page's first offset: the page shows each line once, and a swap of the
/// page's part (mail came for the agent) keeps the log it shows.
#[test]
fn a_browser_whose_stream_reconnects_shows_each_log_line_once() {
    if std::env::var("AGENT_STATE_BROWSER_TESTS").as_deref() != Ok("1") {
        eprintln!("skipped: set AGENT_STATE_BROWSER_TESTS=1 (needs chromium)");
        return;
    }
    let env = Env::with_config("");
    let gate = |name: &str| env.tmp(name).display().to_string();
    let script = env.script(
        "agent.sh",
        &format!(
            "if [ \"$1\" = rio ]; then\n  echo 'first line'\n  while [ ! -f {a:?} ]; do sleep 0.05; done\n  echo second-line\n  while [ ! -f {b:?} ]; do sleep 0.05; done\n  echo third-line\n  while [ ! -f {c:?} ]; do sleep 0.05; done\n  echo fourth-line\n  while [ ! -f {d:?} ]; do sleep 0.05; done\nfi\nexit 0\n",
            a = gate("GO-1"),
            b = gate("GO-2"),
            c = gate("GO-3"),
            d = gate("END")
        ),
    );
    let port = free_port();
    let mut config = daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"high\""), ("timeout", "\"10m\"")],
        "[[agent]]\nname = \"rio\"\n[[agent]]\nname = \"ada\"\n",
    );
    config.push_str(&format!("\n[web]\nlisten = \"127.0.0.1:{port}\"\n"));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    let proxy = Proxy::start(port);
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(30), "rio's session runs", || {
        api(port, "/api/agent/rio")["running"]["log"]["tail"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("first line"))
    });
    let mut b = Browser::start(&env.tmp("chromium"));
    b.open(&format!("http://127.0.0.1:{}/agent/rio", proxy.port));
    let log = |b: &mut Browser| {
        b.eval("(document.getElementById('log')||{}).textContent||''")
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let live = |b: &mut Browser| b.eval("(document.getElementById('live')||{}).textContent");
    assert!(
        poll_until(Duration::from_secs(20), || live(&mut b) == "live"),
        "the event stream never opened"
    );
    // The page's tail ended at the first line; the second comes live.
    std::fs::write(gate("GO-1"), "").unwrap();
    assert!(
        poll_until(Duration::from_secs(30), || log(&mut b)
            .contains("second-line")),
        "the log never grew: {:?}",
        log(&mut b)
    );
    b.eval("window.__notReloaded = true");

    proxy.cut();
    assert!(
        poll_until(Duration::from_secs(20), || live(&mut b) == "reconnecting"),
        "the page never noticed its stream broke"
    );
    assert!(
        poll_until(Duration::from_secs(30), || live(&mut b) == "live"),
        "the stream never reconnected"
    );
    std::fs::write(gate("GO-2"), "").unwrap();
    assert!(
        poll_until(Duration::from_secs(30), || log(&mut b)
            .contains("third-line")),
        "the log never grew after the reconnect: {:?}",
        log(&mut b)
    );
    let shown = log(&mut b);
    for line in ["first line", "second-line", "third-line"] {
        assert_eq!(shown.matches(line).count(), 1, "{line:?} once: {shown:?}");
    }
    // Mail for rio: its part is fetched again while the log runs.
    b.eval("document.getElementById('part').__before = true");
    env.ok(&[
        "send",
        "--from",
        "ada",
        "--to",
        "rio",
        "--subject",
        "hello",
        "--body",
        "hi",
    ]);
    assert!(
        poll_until(Duration::from_secs(30), || b
            .eval("document.getElementById('part').__before === undefined")
            == Value::Bool(true)),
        "the page never fetched its part again"
    );
    std::fs::write(gate("GO-3"), "").unwrap();
    assert!(
        poll_until(Duration::from_secs(30), || log(&mut b)
            .contains("fourth-line")),
        "the log never grew after the part was fetched: {:?}",
        log(&mut b)
    );
    let shown = log(&mut b);
    assert_eq!(b.eval("window.__notReloaded === true"), Value::Bool(true));
    for line in ["first line", "second-line", "third-line", "fourth-line"] {
        assert_eq!(shown.matches(line).count(), 1, "{line:?} once: {shown:?}");
    }
    std::fs::write(gate("END"), "").unwrap();
}
