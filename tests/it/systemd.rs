//! The unit file and the packaging files, checked by systemd itself.
//!
//! On the host, whenever `systemd-analyze` is there: `verify` finds nothing
//! to say about `systemd/agent-state.service` and `security --offline`
//! rates its exposure 2.5 or lower.
//!
//! Under a real systemd (PID 1 in a container made by `sdbox`, a tool kept
//! in `../shared/tools/`), gated by `AGENT_STATE_SYSTEMD_TESTS=1` because it
//! needs root: the binary, the unit, sysusers.d and tmpfiles.d installed as a
//! package would; the unit active only after READY=1; a session whose
//! journal entries carry `AGENT=`; a Node.js stand-in for `claude` reaching
//! its credentials and an HTTP API through the sandbox; `systemctl reload`
//! picking up a new agent; `systemctl stop` letting a running session finish
//! (EXTEND_TIMEOUT_USEC beats a short TimeoutStopSec=) and exiting 0; and a
//! stalled main loop restarted by the watchdog; the metrics listener holding
//! idle connections in the kernel (`TCP_DEFER_ACCEPT`) under the sandbox.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::sdbox::{CONFIG, STATE, SdBox, UNIT, UNIT_BIN, describe, repo_file, sdbox_tool, text};
use crate::support::{BIN, poll_until};

/// The worst `systemd-analyze security` exposure accepted ("OK" is < 4.0).
const MAX_EXPOSURE: f64 = 2.5;

/// A program on PATH, if there is one.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// "Overall exposure level for agent-state.service: 1.5 OK" → 1.5
fn exposure(output: &str) -> Option<f64> {
    let line = output
        .lines()
        .find(|l| l.contains("Overall exposure level"))?;
    line.rsplit_once(':')?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

// ---- on the host -----------------------------------------------------------------

#[test]
fn the_unit_file_verifies_clean_and_its_exposure_is_low() {
    let Some(analyze) = on_path("systemd-analyze") else {
        eprintln!(
            "SKIPPED: this test needs systemd-analyze on PATH (Debian: apt-get install systemd)"
        );
        return;
    };
    let unit = repo_file(UNIT);
    let source = std::fs::read_to_string(&unit).expect("read the unit");
    assert!(
        source.contains(&format!("ExecStart={UNIT_BIN} ")),
        "the unit starts {UNIT_BIN} (where packaging/README.md installs it)"
    );

    // `verify` wants the ExecStart= and ExecReload= programs to exist: a
    // copy of the unit that runs the binary under test.
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("agent-state.service");
    std::fs::write(
        &copy,
        source.replace(&format!("={UNIT_BIN} "), &format!("={BIN} ")),
    )
    .expect("write the unit copy");
    let out = Command::new(&analyze)
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
        .expect("run systemd-analyze verify");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "systemd-analyze verify has something to say:\n{}",
        describe(&out)
    );

    let out = Command::new(&analyze)
        .args(["security", "--offline=yes"])
        .arg(&unit)
        .output()
        .expect("run systemd-analyze security");
    let report = text(&out.stdout);
    let score = exposure(&report)
        .unwrap_or_else(|| panic!("no overall exposure level in:\n{}", describe(&out)));
    assert!(
        score <= MAX_EXPOSURE,
        "exposure {score} is above {MAX_EXPOSURE}:\n{report}"
    );
    eprintln!("systemd-analyze security --offline=yes {UNIT}: exposure {score}");
}

// ---- under a real systemd ----------------------------------------------------------

/// A stand-in for the model's HTTP API on the host's loopback (the box
/// shares the host's network): answers every POST with 200 and keeps each
/// request's head.
struct FakeApi {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeApi {
    fn start() -> FakeApi {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("local addr").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            let _ = stream.set_nonblocking(false);
                            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                            let head = read_request(&mut stream);
                            requests.lock().expect("lock").push(head);
                            let body =
                                r#"{"type":"message","content":[{"type":"text","text":"ok"}]}"#;
                            let _ = write!(
                                stream,
                                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            );
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
        };
        FakeApi {
            port,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("lock").clone()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Read a request's head and its body (Content-Length); return the head.
fn read_request(stream: &mut std::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut head_end = None;
    while head_end.is_none() {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        head_end = buf.windows(4).position(|w| w == b"\r\n\r\n");
    }
    let Some(end) = head_end else {
        return text(&buf);
    };
    let head = text(&buf[..end]);
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < end + 4 + length {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    head
}

/// What Claude Code needs from the sandbox, in Node.js: its JIT (W+X
/// memory), its credentials and state under $HOME/.claude, a private /tmp,
/// os.cpus() and os.networkInterfaces() (netlink), and HTTP to its API.
/// Prints a result line like `claude -p --output-format json` and exits 0
/// only if all of that worked.
const FAKE_CLAUDE_JS: &str = r#"'use strict';
const fs = require('fs'), os = require('os'), http = require('http'), path = require('path');
const api = process.argv[2];
const home = os.homedir();
const cred = JSON.parse(fs.readFileSync(path.join(home, '.claude', '.credentials.json'), 'utf8'));
let x = 0;
for (let i = 0; i < 3e7; i++) x = (x + i * 7) % 1000003;   // hot enough for optimized code
const projects = path.join(home, '.claude', 'projects');
fs.mkdirSync(projects, { recursive: true });
fs.writeFileSync(path.join(projects, process.env.AGENT_STATE_SESSION_ID + '.jsonl'), '{"type":"summary"}\n');
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), 'claude-'));
fs.writeFileSync(path.join(scratch, 'x'), 'x');
const cpus = os.cpus().length;
const interfaces = Object.keys(os.networkInterfaces());
if (cpus < 1) { console.error('os.cpus() is empty'); process.exit(2); }
const req = http.request(api, { method: 'POST', headers: { 'x-api-key': cred.apiKey, 'content-type': 'application/json' } }, (res) => {
  let body = '';
  res.on('data', (c) => { body += c; });
  res.on('end', () => {
    console.log(JSON.stringify({ type: 'result', is_error: res.statusCode !== 200, result: body, cpus, interfaces, home, x }));
    process.exit(res.statusCode === 200 ? 0 : 1);
  });
});
req.on('error', (e) => { console.error('API request failed: ' + e.message); process.exit(1); });
req.end(JSON.stringify({ model: 'sonnet', messages: [{ role: 'user', content: 'hello' }] }));
"#;

const API_KEY: &str = "sk-test-agent-state-0123456789";

fn box_config(node_api: Option<u16>) -> String {
    let mut config = String::from(
        r#"state_root = "/opt/teleo-eval/agent-state"
group = "teleo"

[daemon]
max_concurrent_sessions = 2
shutdown_grace = "30s"

[defaults]
command = ["/opt/teleo-eval/demo-agent.sh", "{agent}"]
timeout = "2m"
kill_grace = "5s"
wake_on_inbox = "never"

[[agent]]
name = "rio"
domain = "internet-finance"

[[agent]]
name = "marcus"
kind = "human"
"#,
    );
    if let Some(port) = node_api {
        config.push_str(&format!(
            r#"
[[agent]]
name = "theseus"
domain = "ai-alignment"
command = ["/usr/local/bin/node", "/opt/teleo-eval/fake-claude.js", "http://127.0.0.1:{port}/v1/messages"]
"#
        ));
    }
    config
}

/// Installed as the package would install it, with the demo agent and
/// `config`: the files, the unit's user and group (sysusers.d), its
/// directories (tmpfiles.d). Not started.
fn install_demo(sdbox: &SdBox, config: &str) {
    sdbox.install_package_files();
    sdbox.install(
        &repo_file("ops/demo-agent.sh"),
        "/opt/teleo-eval/demo-agent.sh",
        0o755,
    );
    sdbox.write(CONFIG, config, 0o644);
    sdbox.ok(&["systemd-sysusers"]);
    sdbox.ok(&["systemd-tmpfiles", "--create", "agent-state.conf"]);
}

/// clay, added by a reload: three steps of a second each, so a stop meets
/// its session running.
const CLAY: &str = r#"
[[agent]]
name = "clay"
domain = "entertainment"
command = ["/usr/bin/env", "DEMO_STEP_SECONDS=1", "/opt/teleo-eval/demo-agent.sh", "{agent}"]

[[agent]]
name = "leo"
domain = "grand-strategy"
command = ["/opt/teleo-eval/no-such-claude", "{agent}"]
"#;

/// For every start: the demo agent never fails and is quick; a stop timeout
/// far shorter than a session (only EXTEND_TIMEOUT_USEC lets the daemon wait
/// for it); and a check that runs only after READY=1 (ExecStartPost=), so
/// the start fails if READY=1 came before the state root was in place.
const TEST_DROP_IN: &str = r#"[Service]
Environment=DEMO_FAIL_RATE=0 DEMO_STEP_SECONDS=0.2
TimeoutStopSec=2s
ExecStartPost=/bin/sh -c 'test -d /opt/teleo-eval/agent-state/rio/inbox && test -s /opt/teleo-eval/agent-state/.daemon/daemon.json'
"#;

/// The daemon's test hook (SIGUSR2 blocks the main loop) and a short watchdog.
const STALL_DROP_IN: &str = r#"[Service]
Environment=AGENT_STATE_TEST_STALL=1
WatchdogSec=3s
RestartSec=1s
"#;

/// Wake `agent` as the agent-state user, wait for its session to start and
/// end; returns the session id.
fn run_session(sdbox: &SdBox, agent: &str) -> String {
    let out = sdbox.agent_state(&["wake", agent, "--wait", "10s"]);
    assert!(out.status.success(), "wake {agent}:\n{}", describe(&out));
    let id = text(&out.stdout).trim().to_string();
    let session = format!("{STATE}/{agent}/session.json");
    let report = format!("{STATE}/{agent}/report.json");
    // session.json is written before report.json: the end is recorded when
    // both say so.
    sdbox.wait_until(
        Duration::from_secs(20),
        &format!("{agent}'s session {id} has ended"),
        || {
            let s = sdbox.json(&session);
            let r = sdbox.json(&report);
            s["session_id"] == id.as_str()
                && s["status"] != "running"
                && r["current_session"] != id.as_str()
                && r["last_session"]["id"] == id.as_str()
        },
    );
    id
}

/// session.json, report.json and the journal of a completed session.
fn assert_completed(sdbox: &SdBox, agent: &str, id: &str) {
    let dir = format!("{STATE}/{agent}");
    let session = sdbox.json(&format!("{dir}/session.json"));
    assert_eq!(
        session["status"],
        "completed",
        "{agent}'s session.json:\n{session:#}\n---- session log ----\n{}",
        sdbox.read(&format!("{dir}/sessions/{id}.log"))
    );
    let report = sdbox.json(&format!("{dir}/report.json"));
    assert_eq!(report["status"], "idle", "{report:#}");
    assert_eq!(report["last_session"]["outcome"], "completed", "{report:#}");
    let journal = sdbox.read(&format!("{dir}/journal.jsonl"));
    let events: Vec<(String, String)> = journal
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["session_id"] == id)
        .map(|e| {
            (
                e["event"].as_str().unwrap_or_default().to_string(),
                e["outcome"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(
        events.iter().any(|(e, _)| e == "session_start")
            && events
                .iter()
                .any(|(e, o)| e == "session_end" && o == "completed"),
        "{agent}'s journal has no session_start and session_end (completed) for {id}:\n{journal}"
    );
}

#[test]
fn under_systemd_the_unit_starts_ready_logs_reloads_stops_and_is_restarted_by_the_watchdog() {
    let Some(tool) = sdbox_tool() else {
        return;
    };
    let t0 = Instant::now();
    let node = on_path("node");
    let api = node.as_ref().map(|_| FakeApi::start());
    if node.is_none() {
        eprintln!(
            "note: no node on PATH here; the Node.js session through the sandbox is not tried"
        );
    }
    let sdbox = SdBox::up(tool);

    // ---- installed as a package would install it ----
    install_demo(&sdbox, &box_config(api.as_ref().map(|a| a.port)));
    if let Some(node) = &node {
        sdbox.install(node, "/usr/local/bin/node", 0o755);
        sdbox.write("/opt/teleo-eval/fake-claude.js", FAKE_CLAUDE_JS, 0o644);
    }
    let id = sdbox.ok(&["id", "agent-state"]);
    assert!(
        id.contains("(agent-state)") && id.contains("gid=") && id.contains("(teleo)"),
        "sysusers.d made agent-state with primary group teleo: {id}"
    );
    let passwd = sdbox.ok(&["getent", "passwd", "agent-state"]);
    assert!(
        passwd
            .trim_end()
            .ends_with(":/var/lib/agent-state:/usr/sbin/nologin"),
        "{passwd}"
    );
    let modes = sdbox.ok(&[
        "stat",
        "-c",
        "%n %U:%G %a",
        STATE,
        "/etc/agent-state",
        CONFIG,
    ]);
    assert_eq!(
        modes,
        format!(
            "{STATE} agent-state:teleo 755\n/etc/agent-state root:teleo 755\n{CONFIG} root:teleo 644\n"
        ),
        "tmpfiles.d made the directories"
    );

    // ---- systemd's own checks, with the program in place ----
    let out = sdbox.exec(&["systemd-analyze", "verify", "agent-state.service"]);
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "systemd-analyze verify in the box:\n{}",
        describe(&out)
    );
    let security = sdbox.ok(&["systemd-analyze", "security", "agent-state.service"]);
    let score = exposure(&security).expect("an exposure level");
    assert!(score <= MAX_EXPOSURE, "exposure {score}:\n{security}");

    // The API key the Node stand-in must find in its home.
    sdbox.ok(&[
        "install",
        "-d",
        "-o",
        "agent-state",
        "-g",
        "teleo",
        "-m",
        "0700",
        "/var/lib/agent-state",
        "/var/lib/agent-state/.claude",
    ]);
    sdbox.write(
        "/var/lib/agent-state/.claude/.credentials.json",
        &format!("{{\"apiKey\": \"{API_KEY}\"}}\n"),
        0o600,
    );
    sdbox.ok(&[
        "chown",
        "agent-state:teleo",
        "/var/lib/agent-state/.claude/.credentials.json",
    ]);
    sdbox.write(
        "/etc/systemd/system/agent-state.service.d/10-test.conf",
        TEST_DROP_IN,
        0o644,
    );
    sdbox.ok(&["systemctl", "daemon-reload"]);

    // ---- start: `systemctl start` returns once READY=1 (and the
    // ExecStartPost= check after it) have come ----
    let started = Instant::now();
    sdbox.ok(&["systemctl", "start", "agent-state.service"]);
    eprintln!("systemctl start took {:?}", started.elapsed());
    let state = sdbox.show(&[
        "ActiveState",
        "SubState",
        "MainPID",
        "NRestarts",
        "StatusText",
    ]);
    assert_eq!(state["ActiveState"], "active", "{state:?}");
    assert_eq!(state["SubState"], "running", "{state:?}");
    assert_eq!(state["NRestarts"], "0", "{state:?}");
    let main_pid = state["MainPID"].clone();
    assert_ne!(main_pid, "0");
    assert!(
        state["StatusText"].contains("agents") && state["StatusText"].contains("running"),
        "STATUS= reaches systemd: {state:?}"
    );
    let heartbeat = sdbox.json(&format!("{STATE}/.daemon/daemon.json"));
    let expected_agents: Vec<&str> = if node.is_some() {
        vec!["rio", "theseus"]
    } else {
        vec!["rio"]
    };
    assert_eq!(heartbeat["agents"], serde_json::json!(expected_agents));
    // The daemon made the rest under the sandbox, the setgid inboxes too
    // (RestrictSUIDSGID= would forbid them).
    let daemon_dir = format!("{STATE}/.daemon");
    let inbox = format!("{STATE}/rio/inbox");
    assert_eq!(
        sdbox.ok(&["stat", "-c", "%n %U:%G %a", &daemon_dir, &inbox]),
        format!("{daemon_dir} agent-state:teleo 750\n{inbox} agent-state:teleo 3770\n")
    );
    let journal = sdbox.journal(&[]);
    assert!(!journal.contains("cannot bootstrap"), "{journal}");

    // ---- a session, and its journal entries by AGENT= ----
    let rio = run_session(&sdbox, "rio");
    assert_completed(&sdbox, "rio", &rio);
    assert!(
        sdbox
            .read(&format!("{STATE}/rio/memory.md"))
            .contains(&format!("demo session {rio}")),
        "the demo agent wrote to memory.md"
    );
    let mut entries: Vec<Value> = Vec::new();
    sdbox.wait_until(
        Duration::from_secs(10),
        "journalctl -u agent-state AGENT=rio shows the session's end",
        || {
            entries = sdbox
                .journal(&["AGENT=rio", "-o", "json"])
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            entries
                .iter()
                .any(|e| e["MESSAGE"] == format!("rio: session {rio} completed").as_str())
        },
    );
    assert!(
        entries
            .iter()
            .all(|e| e["AGENT"] == "rio" && e["_SYSTEMD_UNIT"] == "agent-state.service"),
        "only rio's entries of the unit"
    );
    let start = entries
        .iter()
        .find(|e| {
            e["MESSAGE"]
                .as_str()
                .is_some_and(|m| m.starts_with(&format!("rio: session {rio} started")))
        })
        .unwrap_or_else(|| panic!("no 'rio: session {rio} started' entry: {entries:#?}"));
    assert_eq!(start["SESSION_ID"], rio.as_str());
    assert_eq!(start["INSTANCE"], "rio-001");

    // ---- a person in the inbox group drops mail with `cat >`: under the
    // unit's sandbox the daemon still sees who wrote the file (the kernel's
    // owner, never "nobody": no PrivateUsers=) ----
    sdbox.ok(&["useradd", "-m", "-G", "teleo", "alice"]);
    sdbox.ok(&[
        "runuser",
        "-u",
        "alice",
        "--",
        "sh",
        "-c",
        &format!(
            "echo '{{\"from\":\"alice\",\"to\":\"rio\",\"subject\":\"hello\",\"body\":\"read this\"}}' > {STATE}/rio/inbox/from-alice.json"
        ),
    ]);
    let mut received = Value::Null;
    sdbox.wait_until(
        Duration::from_secs(20),
        "alice's message journaled as received",
        || {
            received = sdbox
                .read(&format!("{STATE}/rio/journal.jsonl"))
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|e| e["event"] == "message_received" && e["message_id"] == "from-alice")
                .unwrap_or(Value::Null);
            !received.is_null()
        },
    );
    assert_eq!(received["sender"], "alice", "{received:#}");

    // ---- a Node.js program through the sandbox: JIT, credentials, API ----
    if let Some(api) = &api {
        let theseus = run_session(&sdbox, "theseus");
        assert_completed(&sdbox, "theseus", &theseus);
        let requests = api.requests();
        assert!(
            requests.len() == 1
                && requests[0].starts_with("POST /v1/messages ")
                && requests[0].contains(&format!("x-api-key: {API_KEY}")),
            "the fake API got {requests:#?}"
        );
        assert!(
            sdbox
                .path(&format!(
                    "/var/lib/agent-state/.claude/projects/{theseus}.jsonl"
                ))
                .is_file(),
            "the Node program wrote under its home"
        );
    }

    // ---- reload: a new agent is picked up, the daemon is not restarted ----
    let config = format!("{}{CLAY}", sdbox.read(CONFIG));
    sdbox.write(CONFIG, &config, 0o644);
    sdbox.ok(&["systemctl", "reload", "agent-state.service"]);
    sdbox.wait_until(
        Duration::from_secs(5),
        "daemon.json lists clay after the reload",
        || {
            sdbox.json(&format!("{STATE}/.daemon/daemon.json"))["agents"]
                .as_array()
                .is_some_and(|a| a.iter().any(|n| n == "clay"))
        },
    );
    let state = sdbox.show(&["ActiveState", "MainPID"]);
    assert_eq!(state["ActiveState"], "active", "{state:?}");
    assert_eq!(state["MainPID"], main_pid, "a reload is not a restart");
    assert!(sdbox.journal(&[]).contains("config reloaded"));

    // ---- an error in the journal: ERROR_CODE, and PRIORITY by severity ----
    let out = sdbox.agent_state(&["wake", "leo"]);
    assert!(out.status.success(), "wake leo:\n{}", describe(&out));
    let mut errors: Vec<Value> = Vec::new();
    sdbox.wait_until(
        Duration::from_secs(10),
        "journalctl ERROR_CODE=AGENT_NOT_FOUND has leo's error",
        || {
            errors = sdbox
                .journal(&["ERROR_CODE=AGENT_NOT_FOUND", "-o", "json"])
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            !errors.is_empty()
        },
    );
    let e = &errors[0];
    assert_eq!(e["PRIORITY"], "3", "high severity is err (3): {e:#}");
    assert_eq!(e["SEVERITY"], "high", "{e:#}");
    assert_eq!(e["AGENT"], "leo", "{e:#}");
    assert_eq!(e["_SYSTEMD_UNIT"], "agent-state.service", "{e:#}");
    assert!(
        e["MESSAGE"]
            .as_str()
            .is_some_and(|m| m.contains("/opt/teleo-eval/no-such-claude")),
        "{e:#}"
    );
    assert!(
        sdbox
            .read(&format!("{STATE}/.daemon/errors.jsonl"))
            .contains("AGENT_NOT_FOUND"),
        "errors.jsonl has it too"
    );

    // ---- stop while clay's session runs: the session finishes (about
    // 3s, against TimeoutStopSec=2s), the daemon exits 0 ----
    let out = sdbox.agent_state(&["wake", "clay", "--wait", "10s"]);
    assert!(out.status.success(), "wake clay:\n{}", describe(&out));
    let clay = text(&out.stdout).trim().to_string();
    let stopping = Instant::now();
    sdbox.ok(&["systemctl", "stop", "agent-state.service"]);
    let took = stopping.elapsed();
    let state = sdbox.show(&["ActiveState", "Result", "ExecMainStatus"]);
    assert_eq!(state["ActiveState"], "inactive", "{state:?}");
    assert_eq!(
        state["Result"], "success",
        "a clean stop (\"timeout\" means the daemon was killed at TimeoutStopSec=): {state:?}"
    );
    assert_eq!(state["ExecMainStatus"], "0", "{state:?}");
    assert!(
        took >= Duration::from_secs(1),
        "the stop did not wait for clay's session ({took:?})"
    );
    assert_completed(&sdbox, "clay", &clay);
    let heartbeat = sdbox.json(&format!("{STATE}/.daemon/daemon.json"));
    assert_eq!(heartbeat["running"], serde_json::json!([]), "{heartbeat:#}");
    let check = sdbox.agent_state(&["check"]);
    assert!(
        check.status.success(),
        "agent-state check after the stop:\n{}",
        describe(&check)
    );
    let journal = sdbox.journal(&[]);
    assert!(
        journal.contains("SIGTERM: stopping")
            && journal.contains("stopped: every session has ended"),
        "{journal}"
    );

    // ---- a stalled main loop: the watchdog kills it, Restart= restarts it ----
    sdbox.write(
        "/etc/systemd/system/agent-state.service.d/30-stall.conf",
        STALL_DROP_IN,
        0o644,
    );
    sdbox.ok(&["systemctl", "daemon-reload"]);
    sdbox.ok(&["systemctl", "start", "agent-state.service"]);
    let before = sdbox.show(&["MainPID", "NRestarts", "WatchdogUSec"]);
    assert_eq!(before["WatchdogUSec"], "3s", "{before:?}");
    sdbox.ok(&[
        "systemctl",
        "kill",
        "-s",
        "SIGUSR2",
        "--kill-whom=main",
        "agent-state.service",
    ]);
    let stalled = Instant::now();
    let mut after = BTreeMap::new();
    sdbox.wait_until(
        Duration::from_secs(30),
        "the watchdog restarted the stalled daemon",
        || {
            after = sdbox.show(&["MainPID", "NRestarts", "ActiveState", "SubState"]);
            after["NRestarts"] != before["NRestarts"]
                && after["MainPID"] != before["MainPID"]
                && after["MainPID"] != "0"
                && after["ActiveState"] == "active"
        },
    );
    eprintln!(
        "watchdog restart after {:?}: {before:?} -> {after:?}",
        stalled.elapsed()
    );
    assert_eq!(after["NRestarts"], "1", "{after:?}");
    assert!(
        stalled.elapsed() >= Duration::from_secs(2),
        "restarted before WatchdogSec=3s could pass"
    );
    let journal = sdbox.journal(&[]);
    assert!(journal.contains("Watchdog timeout"), "{journal}");
    sdbox.wait_until(Duration::from_secs(5), "the new daemon's heartbeat", || {
        sdbox.json(&format!("{STATE}/.daemon/daemon.json"))["pid"]
            .as_u64()
            .map(|p| p.to_string())
            == Some(after["MainPID"].clone())
    });
    sdbox.ok(&["systemctl", "stop", "agent-state.service"]);
    assert_eq!(sdbox.prop("Result"), "success");
    eprintln!("the systemd test took {:?}", t0.elapsed());
}

/// `systemctl reload` under a real systemd runs `agent-state reload`
/// (ExecReload=): after a typo it fails and the journal names the problem,
/// the old config stays in force and the CLI works on it (saying so); once
/// the file is fixed the reload succeeds.
#[test]
fn under_systemd_a_refused_reload_fails_systemctl_reload_with_the_reasons() {
    let Some(tool) = sdbox_tool() else {
        return;
    };
    let sdbox = SdBox::up(tool);
    let good = box_config(None);
    install_demo(&sdbox, &good);
    sdbox.write(
        "/etc/systemd/system/agent-state.service.d/10-test.conf",
        TEST_DROP_IN,
        0o644,
    );
    sdbox.ok(&["systemctl", "daemon-reload"]);
    sdbox.ok(&["systemctl", "start", "agent-state.service"]);
    let main_pid = sdbox.prop("MainPID");

    // A typo: `systemctl reload` fails, and the journal says why.
    let typo = good.replace("timeout = \"2m\"", "timeout = \"two minutes\"");
    sdbox.write(CONFIG, &typo, 0o644);
    let out = sdbox.exec(&["systemctl", "reload", "agent-state.service"]);
    assert!(
        !out.status.success(),
        "systemctl reload of a broken config must fail:\n{}",
        describe(&out)
    );
    // journald may store the reload's stderr a moment after systemctl
    // returns: wait for it, not for a fixed time.
    let names_it = |said: &str| said.contains("defaults.timeout") && said.contains("two minutes");
    let mut said = String::new();
    poll_until(Duration::from_secs(20), || {
        said = format!("{}{}", describe(&out), sdbox.journal(&["-n", "40"]));
        names_it(&said)
    });
    assert!(
        names_it(&said),
        "the output or the journal names the problem:\n{said}"
    );
    let state = sdbox.show(&["ActiveState", "MainPID"]);
    assert_eq!(state["ActiveState"], "active", "{state:?}");
    assert_eq!(state["MainPID"], main_pid, "still the same daemon");
    // The CLI works on the accepted config meanwhile, and says so.
    let out = sdbox.agent_state(&["status"]);
    assert!(out.status.success(), "status:\n{}", describe(&out));
    assert!(
        text(&out.stderr).contains("using the last configuration the daemon accepted"),
        "{}",
        describe(&out)
    );

    // Fixed: the reload goes through, with a new agent.
    sdbox.write(CONFIG, &format!("{good}{CLAY}"), 0o644);
    sdbox.ok(&["systemctl", "reload", "agent-state.service"]);
    assert!(
        sdbox.json(&format!("{STATE}/.daemon/daemon.json"))["agents"]
            .as_array()
            .is_some_and(|a| a.iter().any(|n| n == "clay")),
        "the reload had taken effect when systemctl reload returned"
    );
    assert_eq!(sdbox.prop("MainPID"), main_pid, "a reload is not a restart");
}

/// A session script started outside the unit, as cron would start it (a
/// transient unit of its own, as root): the daemon under the shipped
/// sandbox (`ProtectProc=invisible`, `PrivateUsers=`) cannot see its
/// process, and still a `wake` neither interrupts its session nor starts a
/// second one, and the script's own `session end` succeeds (issue 9 §3).
#[test]
fn under_systemd_a_script_session_started_outside_the_unit_survives_a_wake() {
    let Some(tool) = sdbox_tool() else {
        return;
    };
    let sdbox = SdBox::up(tool);
    install_demo(&sdbox, &box_config(None));
    sdbox.write(
        "/etc/systemd/system/agent-state.service.d/10-test.conf",
        TEST_DROP_IN,
        0o644,
    );
    sdbox.ok(&["systemctl", "daemon-reload"]);
    sdbox.ok(&["systemctl", "start", "agent-state.service"]);

    let dir = "/opt/teleo-eval/cron";
    sdbox.write(
        "/opt/teleo-eval/cron-session.sh",
        &format!(
            r#"#!/bin/sh
S=$({UNIT_BIN} --config {CONFIG} session begin rio) || exit 9
echo "$S" > {dir}/id
while [ ! -e {dir}/go ]; do sleep 0.1; done
{UNIT_BIN} --config {CONFIG} session end rio --session "$S" --sources-archived 1 >/dev/null 2>{dir}/end.err
echo "end=$?" > {dir}/status
"#
        ),
        0o755,
    );
    // The service user's cron job: its own transient unit, outside
    // agent-state.service, as the user that owns the state.
    sdbox.ok(&["install", "-d", "-o", "agent-state", "-g", "teleo", dir]);
    sdbox.ok(&[
        "systemd-run",
        "--unit",
        "cron-session",
        "--uid",
        "agent-state",
        "--gid",
        "teleo",
        "--quiet",
        "/opt/teleo-eval/cron-session.sh",
    ]);
    let id_file = format!("{dir}/id");
    sdbox.wait_until(
        Duration::from_secs(20),
        "the script's session has begun",
        || !sdbox.read(&id_file).trim().is_empty(),
    );
    let sid = sdbox.read(&id_file).trim().to_string();
    let script_pid = sdbox.prop_of("cron-session.service", "MainPID");
    // Whether the daemon could see the script at all: its /proc, as the
    // daemon's user in the daemon's namespaces.
    let daemon_pid = sdbox.prop("MainPID");
    let uid = sdbox.ok(&["id", "-u", "agent-state"]).trim().to_string();
    let gid = sdbox.ok(&["id", "-g", "agent-state"]).trim().to_string();
    let seen = sdbox.exec(&[
        "nsenter",
        "-t",
        &daemon_pid,
        "-m",
        "-U",
        "-S",
        &uid,
        "-G",
        &gid,
        "--",
        "test",
        "-e",
        &format!("/proc/{script_pid}"),
    ]);
    eprintln!(
        "the script's session {sid}, script pid {script_pid} (outside the unit); visible to the daemon: {} ({})",
        seen.status.success(),
        text(&seen.stderr).trim()
    );

    let journal_of = || -> Vec<Value> {
        sdbox
            .read(&format!("{STATE}/rio/journal.jsonl"))
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let count = |event: &str| journal_of().iter().filter(|e| e["event"] == event).count();
    let out = sdbox.agent_state(&["wake", "rio"]);
    assert!(out.status.success(), "wake:\n{}", describe(&out));
    sdbox.wait_until(
        Duration::from_secs(20),
        "the daemon skipped the wake: the script's session runs",
        || count("wake_skipped") == 1,
    );
    assert_eq!(count("session_start"), 1, "{:#?}", journal_of());
    assert_eq!(count("error"), 0, "not interrupted: {:#?}", journal_of());
    let session = sdbox.json(&format!("{STATE}/rio/session.json"));
    assert_eq!(session["session_id"], sid.as_str());
    assert_eq!(session["status"], "running");

    sdbox.write(&format!("{dir}/go"), "", 0o644);
    let status_file = format!("{dir}/status");
    sdbox.wait_until(Duration::from_secs(20), "the script has ended", || {
        !sdbox.read(&status_file).is_empty()
    });
    assert_eq!(
        sdbox.read(&status_file).trim(),
        "end=0",
        "{}",
        sdbox.read(&format!("{dir}/end.err"))
    );
    let session = sdbox.json(&format!("{STATE}/rio/session.json"));
    assert_eq!(session["session_id"], sid.as_str());
    assert_eq!(session["status"], "completed", "{session:#}");
    assert_eq!(count("session_end"), 1);
    assert_eq!(sdbox.prop("ActiveState"), "active");
}

/// A session command that leaves a grandchild behind, double-forked, which
/// starts a session of its own and clears its environment (so neither the
/// process group nor the `AGENT_STATE_SESSION_ID` marker finds it), then
/// exits once the grandchild has become `sleep 1000`.
const ESCAPING_AGENT: &str = r#"#!/bin/sh
(setsid sh -c 'exec env -i sleep 1000' </dev/null >/dev/null 2>&1 &)
sleep 1
echo "left an escaped grandchild behind <axiom>COMPLETE</axiom>"
exit 0
"#;

/// Processes in the box whose command line is `sleep 1000`.
fn escaped_sleeps(sdbox: &SdBox) -> Vec<String> {
    let out = sdbox.ok(&[
        "sh",
        "-c",
        r#"for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null); [ "$c" = "sleep 1000 " ] && echo "${p#/proc/}"; done; true"#,
    ]);
    out.lines().map(str::to_string).collect()
}

#[test]
fn under_systemd_a_session_s_escaped_grandchild_dies_with_its_cgroup() {
    let Some(tool) = sdbox_tool() else {
        return;
    };
    let sdbox = SdBox::up(tool);
    sdbox.install_package_files();
    sdbox.write("/opt/teleo-eval/escaping-agent.sh", ESCAPING_AGENT, 0o755);
    sdbox.write(
        CONFIG,
        &box_config(None).replace(
            r#"command = ["/opt/teleo-eval/demo-agent.sh", "{agent}"]"#,
            r#"command = ["/opt/teleo-eval/escaping-agent.sh", "{agent}"]"#,
        ),
        0o644,
    );
    sdbox.ok(&["systemd-sysusers"]);
    sdbox.ok(&["systemd-tmpfiles", "--create", "agent-state.conf"]);
    sdbox.ok(&["systemctl", "daemon-reload"]);
    sdbox.ok(&["systemctl", "start", "agent-state.service"]);
    assert!(
        sdbox
            .journal(&[])
            .contains("sessions run in cgroups of their own"),
        "the daemon found its delegated cgroup:\n{}",
        sdbox.journal(&[])
    );
    assert!(escaped_sleeps(&sdbox).is_empty());

    for _ in 0..2 {
        run_session(&sdbox, "rio");
        // The session's end is recorded after its cgroup was killed.
        let left = escaped_sleeps(&sdbox);
        assert!(
            left.is_empty(),
            "the escaped `sleep 1000` survived the session: pids {left:?}\n{}",
            sdbox.ok(&[
                "sh",
                "-c",
                "cat /proc/[0-9]*/cgroup 2>/dev/null | sort | uniq -c"
            ])
        );
    }
    // Nothing of the sessions is left in the unit's cgroup tree.
    let tree = sdbox.ok(&[
        "sh",
        "-c",
        "ls /sys/fs/cgroup/system.slice/agent-state.service /sys/fs/cgroup/unified/system.slice/agent-state.service 2>/dev/null; true",
    ]);
    assert!(tree.contains("daemon"), "the daemon's own cgroup:\n{tree}");
    // rio's; another agent's session may be running now.
    assert!(
        !tree
            .lines()
            .any(|l| l.starts_with("session-") && l.contains("-rio-")),
        "rio's session cgroups removed:\n{tree}"
    );
}

/// Connections to `port` on loopback that the kernel holds half-open (a
/// listener's `TCP_DEFER_ACCEPT`: SYN_RECV until they send something), from
/// /proc/net/tcp (the box shares the host's network).
fn held_by_the_kernel(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&local) && f[3] == "03"
        })
        .count()
}

/// The metrics listener under the unit's sandbox: the kernel holds
/// connections that send nothing (`TCP_DEFER_ACCEPT`, which the sandbox
/// lets the daemon set: no warning), and a scrape among them is answered.
#[test]
fn under_systemd_the_metrics_listener_holds_idle_connections_and_answers_a_scrape() {
    let Some(tool) = sdbox_tool() else {
        return;
    };
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let sdbox = SdBox::up(tool);
    install_demo(
        &sdbox,
        &format!(
            "{}\n[metrics]\nlisten = \"127.0.0.1:{port}\"\ninterval = \"1s\"\n",
            box_config(None)
        ),
    );
    sdbox.ok(&["systemctl", "start", "agent-state.service"]);

    let idle: Vec<std::net::TcpStream> = (0..20)
        .filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    assert_eq!(idle.len(), 20, "connected");
    sdbox.wait_until(
        Duration::from_secs(10),
        "the kernel holds the 20 idle connections",
        || held_by_the_kernel(port) >= 20,
    );
    let scrape = || -> String {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer
    };
    sdbox.wait_until(Duration::from_secs(30), "a scrape is answered", || {
        let answer = scrape();
        answer.starts_with("HTTP/1.1 200") && answer.contains("agent_state_sessions_running")
    });
    let journal = sdbox.journal(&[]);
    assert!(
        !journal.contains("cannot defer accepting"),
        "the sandbox refused TCP_DEFER_ACCEPT:\n{journal}"
    );
    drop(idle);
}
