//! The metrics listener under a connection flood from the scraper's own
//! address (issue 20): any local user can open connections to a loopback
//! listener. 200 that send nothing and 50 that send a byte a second
//! (slow-loris), each opened again as soon as it is closed, must not keep
//! Prometheus out: 20 scrapes over 5 s all get their metrics within a
//! scrape timeout, half of them from a client that pauses between its
//! connect and its request (as one descheduled on a loaded machine does).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::*;

const IDLE: usize = 200;
const SLOW: usize = 50;
/// Prometheus's default scrape timeout.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What the attacking threads did.
#[derive(Default)]
struct Tally {
    /// Connections open now (each attacker keeps its own count current).
    open: AtomicUsize,
    /// Connections opened again after the listener closed them.
    reopened: AtomicUsize,
}

fn connect(port: u16) -> Option<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_nonblocking(true).ok()?;
    Some(s)
}

/// Whether the listener has closed `s` (a read says end of file or fails).
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        // End of file; or an answer (to a request cut short): done with.
        Ok(0) => true,
        Ok(_) => true,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    }
}

/// `n` connections, each opened again when closed; every `trickle`, one
/// byte of a request that never ends is sent on each (slow-loris), if any.
/// Runs until `stop`.
fn attack(
    port: u16,
    n: usize,
    trickle: Option<Duration>,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut conns: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        let mut next_byte = Instant::now();
        let mut counted = 0;
        while !stop.load(Ordering::Relaxed) {
            let send = trickle.is_some() && Instant::now() >= next_byte;
            for slot in conns.iter_mut() {
                if let Some(s) = slot
                    && (closed(s) || (send && s.write_all(b"X").is_err()))
                {
                    *slot = None;
                    tally.reopened.fetch_add(1, Ordering::Relaxed);
                }
                if slot.is_none() {
                    *slot = connect(port);
                    if let (Some(s), Some(_)) = (slot.as_mut(), trickle) {
                        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ");
                    }
                }
            }
            if let Some(t) = trickle.filter(|_| send) {
                next_byte = Instant::now() + t;
            }
            let open = conns.iter().filter(|c| c.is_some()).count();
            tally.open.fetch_add(open, Ordering::Relaxed);
            tally.open.fetch_sub(counted, Ordering::Relaxed);
            counted = open;
            // The attacker's own pace, not a synchronisation.
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

/// A scrape as Prometheus does it: connect, ask, read to the end, within
/// the scrape timeout. The status and body, or what went wrong.
fn scrape(port: u16) -> Result<(u16, String), String> {
    scrape_after(port, Duration::ZERO)
}

/// A scrape whose client waits `pause` between its connect and its request.
fn scrape_after(port: u16, pause: Duration) -> Result<(u16, String), String> {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), SCRAPE_TIMEOUT)
        .map_err(|e| format!("connect: {e}"))?;
    std::thread::sleep(pause);
    s.set_read_timeout(Some(SCRAPE_TIMEOUT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("read after {:?}: {e}", started.elapsed()))?;
    if started.elapsed() > SCRAPE_TIMEOUT {
        return Err(format!("took {:?}", started.elapsed()));
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no answer ({} bytes)", raw.len()))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_string()))
}

#[test]
fn scrapes_get_through_a_flood_of_idle_and_slow_connections() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "exit 0\n");
    let port = free_port();
    let mut config = daemon_config(&script, &[], &[], "[[agent]]\nname = \"rio\"\n");
    config.push_str(&format!(
        "\n[metrics]\nlisten = \"127.0.0.1:{port}\"\ninterval = \"1s\"\n"
    ));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    d.wait_until(
        Duration::from_secs(20),
        "the listener serves metrics",
        || scrape(port).is_ok_and(|(status, body)| status == 200 && body.contains("agent_state_")),
    );

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let attackers = [
        attack(port, IDLE, None, tally.clone(), stop.clone()),
        attack(
            port,
            SLOW,
            Some(Duration::from_secs(1)),
            tally.clone(),
            stop.clone(),
        ),
    ];
    // The flood is on: every attacking connection has been opened, and the
    // listener has started closing some (more than it keeps).
    assert!(
        poll_until(Duration::from_secs(30), || tally
            .reopened
            .load(Ordering::Relaxed)
            >= IDLE + SLOW),
        "the attack never got going: {} open, {} reopened",
        tally.open.load(Ordering::Relaxed),
        tally.reopened.load(Ordering::Relaxed)
    );

    // Spread over 5 s, the listener's request timeout: the slow
    // connections are cut and opened again meanwhile. Every other client
    // pauses 100 ms between its connect and its request: a flood opens
    // hundreds of connections in that time, so a listener that took the
    // connection at once would close it as the oldest idle one.
    let results: Vec<Result<(u16, String), String>> = (0..20)
        .map(|i| {
            let pause = Duration::from_millis(if i % 2 == 1 { 100 } else { 0 });
            let r = scrape_after(port, pause);
            std::thread::sleep(Duration::from_millis(250));
            r
        })
        .collect();
    let reopened = tally.reopened.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Ok((200, body)) if body.contains("agent_state_sessions_running") => None,
            Ok((status, _)) => Some(format!("scrape {i}: status {status}")),
            Err(e) => Some(format!("scrape {i}: {e}")),
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 20 scrapes failed under the flood ({reopened} attacking connections reopened):\n{}",
        failed.len(),
        failed.join("\n")
    );
}
