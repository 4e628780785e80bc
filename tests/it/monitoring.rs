//! What monitoring sees: `agent-state health` (one line, exit 0/1/2/3) against
//! a real daemon that is missing, healthy, and killed; and the metrics the
//! daemon publishes.

use std::time::Duration;

use crate::support::*;

fn agent_script(env: &Env, body: &str) -> std::path::PathBuf {
    env.script("agent.sh", &format!("#!/bin/sh\necho working\n{body}\n"))
}

const RIO: &str = "[[agent]]\nname = \"rio\"\nschedule = \"0 3 * * *\"\n";

/// `health`'s exit status and its one line of stdout.
fn health(env: &Env, args: &[&str]) -> (i32, String) {
    let mut all = vec!["health"];
    all.extend_from_slice(args);
    let out = env.run(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout:?}");
    (out.status.code().unwrap_or(-1), stdout.trim().to_string())
}

#[test]
fn health_says_critical_without_a_daemon_ok_with_one_and_critical_once_it_is_killed() {
    let env = Env::with_config("");
    let script = agent_script(&env, "exit 0");
    env.set_config(&daemon_config(&script, &[], &[], RIO));
    env.ok(&["bootstrap"]);

    let (code, line) = health(&env, &[]);
    assert_eq!(code, 2, "{line}");
    assert!(line.starts_with("CRITICAL: no daemon is running"), "{line}");

    let mut d = env.daemon();
    let (code, line) = health(&env, &[]);
    assert_eq!(code, 0, "{line}");
    assert!(line.starts_with("OK: daemon "), "{line}");
    assert!(line.contains(&format!("(pid {})", d.pid)), "{line}");

    // A successful session, then a window shorter than its age: a warning
    // that names the agent.
    env.ok(&["wake", "rio", "--wait", "5s"]);
    d.wait_until(Duration::from_secs(10), "the session completed", || {
        env.events("rio", "session_end").len() == 1
    });
    let (code, line) = health(&env, &["--success-within", "1h"]);
    assert_eq!(code, 0, "{line}");
    // Kept: the success must grow older than the 1 s window (ages are
    // counted in whole seconds): that age is the time under test.
    std::thread::sleep(Duration::from_millis(2100));
    let (code, line) = health(&env, &["--success-within", "1s"]);
    assert_eq!(code, 1, "{line}");
    assert_eq!(line, "WARNING: rio: no successful session in the last 1s");
    let out = env.run(&["health", "--success-within", "1s", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the same exit status with --json"
    );
    let json = String::from_utf8_lossy(&out.stdout).to_string();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["level"], "warning", "{json}");

    d.kill9();
    let (code, line) = health(&env, &["--success-within", "off"]);
    assert_eq!(code, 2, "{line}");
    assert!(
        line.contains(&format!("(pid {}) is not running", d.pid)),
        "{line}"
    );
}

// ---- metrics: a real Prometheus scraping the daemon -------------------------------------------

pub(crate) fn prometheus_tests_enabled() -> bool {
    if std::env::var("AGENT_STATE_PROMETHEUS_TESTS").as_deref() == Ok("1") {
        return true;
    }
    eprintln!(
        "SKIPPED: needs Debian's prometheus and promtool (AGENT_STATE_PROMETHEUS_TESTS=1; .ci/run installs them)"
    );
    false
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET over HTTP/1.0 (no chunked answers): status and body.
pub(crate) fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

fn percent_encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `promtool check metrics` on `text`: its exit status and what it said.
pub(crate) fn promtool_check(text: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// A Prometheus server on loopback scraping one target every second; killed
/// when dropped.
struct Prometheus {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Prometheus {
    fn start(env: &Env, target: u16) -> Prometheus {
        let dir = env.tmp("prometheus");
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: agent-state\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = dir.join("prometheus.log");
        let child = std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.join("prometheus.err")).unwrap())
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { child, port, log };
        assert!(
            poll_until(Duration::from_secs(30), || {
                http_get(p.port, "/-/ready").is_some_and(|(s, _)| s == 200)
            }),
            "prometheus did not become ready: {}",
            std::fs::read_to_string(dir.join("prometheus.err")).unwrap_or_default()
        );
        p
    }

    /// The value of an instant query that returns one series, if it does.
    fn value(&self, query: &str) -> Option<f64> {
        let (status, body) = http_get(
            self.port,
            &format!("/api/v1/query?query={}", percent_encode(query)),
        )?;
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let result = v["data"]["result"].as_array()?;
        if result.len() != 1 {
            return None;
        }
        result[0]["value"][1].as_str()?.parse().ok()
    }

    /// Wait until `query` has the value `want` (scrapes come every second).
    fn wait_for(&self, query: &str, want: f64) {
        let mut last = None;
        let ok = poll_until(Duration::from_secs(30), || {
            last = self.value(query);
            last == Some(want)
        });
        assert!(
            ok,
            "Prometheus: {query} is {last:?}, not {want} (log: {})",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const RESULT: &str = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"done","total_cost_usd":0.0421,"usage":{"input_tokens":12,"cache_creation_input_tokens":3000,"cache_read_input_tokens":14000,"output_tokens":250}}"#;

#[test]
fn a_real_prometheus_scrapes_the_sessions_the_daemon_ran() {
    if !prometheus_tests_enabled() {
        return;
    }
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        &format!(
            "#!/bin/sh\ncat >/dev/null\nif [ \"$1\" = leo ]; then echo boom >&2; exit 3; fi\nprintf '%s\\n' '{RESULT}'\n"
        ),
    );
    let port = free_port();
    let textfile = env.tmp("agent-state.prom");
    let mut config = daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"rio\"\nschedule = \"0 3 * * *\"\nbudget = { max_sessions = 5 }\n\n[[agent]]\nname = \"leo\"\n",
    );
    config.push_str(&format!(
        "\n[metrics]\nlisten = \"127.0.0.1:{port}\"\ntextfile = {:?}\ninterval = \"1s\"\n",
        textfile.display().to_string()
    ));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    env.ok(&["wake", "rio", "--wait", "5s"]);
    env.ok(&["wake", "leo", "--wait", "5s"]);
    d.wait_until(Duration::from_secs(15), "both sessions ended", || {
        env.events("rio", "session_end").len() == 1 && env.events("leo", "error").len() == 1
    });

    // The listener: what a scrape gets, clean by promtool's lint.
    let (status, body) = http_get(port, "/metrics").expect("the metrics listener answers");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("# TYPE agent_state_sessions_total counter"),
        "{body}"
    );
    let (clean, said) = promtool_check(&body);
    assert!(
        clean,
        "promtool check metrics on the listener's output: {said}\n{body}"
    );
    assert_eq!(http_get(port, "/nothing").map(|r| r.0), Some(404));
    // The textfile: the same families, replaced whole, lint-clean.
    assert!(
        poll_until(Duration::from_secs(5), || std::fs::read_to_string(
            &textfile
        )
        .is_ok_and(
            |t| t.contains("agent_state_wakes_total{agent=\"leo\",reason=\"manual\"} 1")
        )),
        "the textfile is written"
    );
    let (clean, said) = promtool_check(&std::fs::read_to_string(&textfile).unwrap());
    assert!(clean, "promtool check metrics on the textfile: {said}");

    // A real Prometheus scraping it finds the series with the right values.
    let prom = Prometheus::start(&env, port);
    prom.wait_for("up{job=\"agent-state\"}", 1.0);
    prom.wait_for(
        "agent_state_sessions_total{agent=\"rio\",outcome=\"completed\"}",
        1.0,
    );
    prom.wait_for(
        "agent_state_sessions_total{agent=\"leo\",outcome=\"error\"}",
        1.0,
    );
    prom.wait_for(
        "agent_state_sessions_total{agent=\"rio\",outcome=\"error\"}",
        0.0,
    );
    prom.wait_for(
        "agent_state_wakes_total{agent=\"rio\",reason=\"manual\"}",
        1.0,
    );
    prom.wait_for(
        "agent_state_session_duration_seconds_count{agent=\"leo\"}",
        1.0,
    );
    prom.wait_for(
        "agent_state_tokens_total{agent=\"rio\",kind=\"cache_read\"}",
        14000.0,
    );
    prom.wait_for("agent_state_cost_usd_total{agent=\"rio\"}", 0.0421);
    prom.wait_for("agent_state_failures_in_a_row{agent=\"leo\"}", 1.0);
    prom.wait_for("agent_state_failures_in_a_row{agent=\"rio\"}", 0.0);
    prom.wait_for("agent_state_errors_total{code=\"SESSION_FAILED\"}", 1.0);
    prom.wait_for("agent_state_session_running{agent=\"rio\"}", 0.0);
    prom.wait_for(
        "agent_state_budget_remaining{scope=\"rio\",limit=\"sessions\"}",
        4.0,
    );
    let next = prom
        .value("agent_state_next_wake_timestamp_seconds{agent=\"rio\"}")
        .expect("rio's next wake");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        next > now && next < now + 86_400.0,
        "next wake {next} vs now {now}"
    );
    // The Grafana dashboard in ops/: every query parses in this Prometheus
    // and every metric it names is one the daemon serves.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/ops/grafana-dashboard.json"
        ))
        .expect("ops/grafana-dashboard.json"),
    )
    .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 15, "{exprs:?}");
    for expr in &exprs {
        let q = expr.replace("$job", ".*").replace("$agent", ".*");
        let (status, answer) = http_get(
            prom.port,
            &format!("/api/v1/query?query={}", percent_encode(&q)),
        )
        .expect("prometheus answers");
        assert_eq!(status, 200, "{q}: {answer}");
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("agent_state_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let family = name.trim_end_matches("_bucket");
            assert!(
                body.contains(&format!("# TYPE {family} ")),
                "the dashboard uses {name}, which the daemon does not serve"
            );
            rest = &rest[at + name.len()..];
        }
    }
    let success = prom
        .value("agent_state_last_success_timestamp_seconds{agent=\"rio\"}")
        .expect("rio's last success");
    assert!(
        (now - success).abs() < 120.0,
        "last success {success} vs now {now}"
    );
    assert_eq!(
        prom.value("agent_state_last_success_timestamp_seconds{agent=\"leo\"}"),
        None,
        "leo never succeeded"
    );
}

#[test]
fn a_metrics_address_in_use_fails_the_start_with_the_reason() {
    let env = Env::with_config("");
    let script = agent_script(&env, "exit 0");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut config = daemon_config(&script, &[], &[], RIO);
    config.push_str(&format!("\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let out = env.run(&["daemon"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen for metrics on 127.0.0.1:{port}"))
            && err.contains("[metrics] listen"),
        "{err}"
    );
}
