//! `[cluster]` (issue 24), when the config has one: connects to NATS with a
//! bounded wait ([`TIMEOUT`]) and reports whether the servers answer (naming
//! `cluster.urls` and the error when not), JetStream, the per-key TTL the
//! leases use (nats-server 2.11 or later), whether `cluster.replicas` fits
//! the servers, the dispatch stream and the lease bucket as found, the
//! worker registry and the output stream (both created at the first
//! worker's start), and each registered worker's state (alive, draining,
//! drained, stopped or lost) with its fix. Only reads: nothing is created on
//! the cluster. The first line says where sessions run: on this host
//! (`local_sessions`, the default) or on the workers.

use std::path::Path;
use std::time::{Duration, SystemTime};

use agent_state_cluster::workers::since_stored;
use agent_state_cluster::{
    Cluster, ClusterError, ClusterSettings, Found, Survey, WorkerEntry, WorkerState, WorkerTiming,
    worker_state,
};

use super::Report;

/// How long doctor waits for the servers, connection and questions together.
pub(super) const TIMEOUT: Duration = Duration::from_secs(10);

/// How far doctor got with the servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reach {
    /// Connected, JetStream answered: what was found.
    Surveyed(Box<Survey>),
    /// No answer within [`TIMEOUT`].
    Silent,
    /// The connection failed (the error names `cluster.urls`).
    Unreachable(String),
    /// A credentials file could not be read (the error names its field).
    Credentials(String),
    /// Connected, but JetStream does not answer.
    NoJetStream(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    Ok,
    Note,
    Warn,
    Fail,
}

/// One line of doctor's report: level, what, detail, fix.
pub(super) type Finding = (Level, &'static str, String, Option<String>);

/// Connects, surveys, prints.
pub(super) fn check(r: &mut Report, settings: &ClusterSettings, config: &Path) {
    let reach = reach(settings);
    for (level, what, detail, fix) in findings(settings, &reach, config, SystemTime::now()) {
        let fix = fix.unwrap_or_default();
        match level {
            Level::Ok => r.ok(what, detail),
            Level::Note => r.note(what, detail),
            Level::Warn => r.warn(what, detail, fix),
            Level::Fail => r.fail(what, detail, fix),
        }
    }
}

/// The connection and the survey, within [`TIMEOUT`].
fn reach(settings: &ClusterSettings) -> Reach {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return Reach::Unreachable(format!("cannot start an async runtime: {e}")),
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let name = format!("agent-state doctor on {host}");
    runtime.block_on(async {
        let work = async {
            let cluster = Cluster::connect(settings, &name).await?;
            Ok::<_, ClusterError>(cluster.survey().await)
        };
        match tokio::time::timeout(TIMEOUT, work).await {
            Err(_) => Reach::Silent,
            Ok(Ok(survey)) => Reach::Surveyed(Box::new(survey)),
            Ok(Err(e @ ClusterError::Credentials { .. })) => Reach::Credentials(e.to_string()),
            Ok(Err(e @ ClusterError::NoJetStream { .. })) => Reach::NoJetStream(e.to_string()),
            Ok(Err(e)) => Reach::Unreachable(e.to_string()),
        }
    })
}

/// What doctor says of `[cluster]` given how far it got (pure; `now` is
/// the wall clock the workers' heartbeat ages are read against).
pub(super) fn findings(
    settings: &ClusterSettings,
    reach: &Reach,
    config: &Path,
    now: SystemTime,
) -> Vec<Finding> {
    let urls = settings.urls.join(", ");
    let config = config.display();
    let mut out: Vec<Finding> = vec![(
        Level::Note,
        "cluster",
        if settings.local_sessions {
            "[cluster] is checked; local_sessions is true: every session runs on this host (set local_sessions = false to run them on the workers)"
        } else {
            "[cluster] is checked; local_sessions is false: every session runs on a worker"
        }
        .into(),
        None,
    )];
    let survey = match reach {
        Reach::Surveyed(s) => &**s,
        Reach::Silent => {
            out.push((
                Level::Fail,
                "cluster",
                format!(
                    "no answer from NATS at {urls} within {}s",
                    TIMEOUT.as_secs()
                ),
                Some(format!(
                    "check cluster.urls in {config} and that nats-server runs there and is reachable from this host"
                )),
            ));
            return out;
        }
        Reach::Unreachable(e) => {
            out.push((
                Level::Fail,
                "cluster",
                format!("not reachable: {e}"),
                Some(format!(
                    "check cluster.urls in {config} ({urls}) and that nats-server runs there (nats-server -js)"
                )),
            ));
            return out;
        }
        Reach::Credentials(e) => {
            out.push((
                Level::Fail,
                "cluster",
                e.clone(),
                Some(format!(
                    "fix the file's path in {config} or its permissions for this user"
                )),
            ));
            return out;
        }
        Reach::NoJetStream(e) => {
            out.push((Level::Ok, "cluster", format!("reachable at {urls}"), None));
            out.push((
                Level::Fail,
                "cluster JetStream",
                e.clone(),
                Some("start nats-server with -js (or `jetstream {}` in its config)".into()),
            ));
            return out;
        }
    };
    let in_cluster = survey
        .cluster_name
        .as_deref()
        .map(|c| format!(", cluster {c}"))
        .unwrap_or_default();
    out.push((
        Level::Ok,
        "cluster",
        format!(
            "reachable at {urls}: nats-server {} ({}{in_cluster})",
            survey.version, survey.server
        ),
        None,
    ));
    out.push((Level::Ok, "cluster JetStream", "answers".into(), None));
    if survey.per_key_ttl {
        out.push((
            Level::Ok,
            "cluster TTL",
            format!(
                "per-key TTL supported (nats-server {}): a lease left behind expires on the servers too",
                survey.version
            ),
            None,
        ));
    } else {
        out.push((
            Level::Warn,
            "cluster TTL",
            format!(
                "per-key TTL not supported by nats-server {}: a lease left behind is removed only by the controller's fence",
                survey.version
            ),
            Some("upgrade nats-server to 2.11 or later on every NATS host".into()),
        ));
    }
    let replicas = settings.replicas;
    if replicas > 1 && survey.cluster_name.is_none() {
        out.push((
            Level::Fail,
            "cluster replicas",
            format!(
                "cluster.replicas is {replicas}, but nats-server {} is not part of a cluster: the stream and the bucket cannot keep {replicas} copies",
                survey.server
            ),
            Some(format!(
                "set replicas = 1 under [cluster] in {config} for a single server, or cluster three servers"
            )),
        ));
    }
    let stream = &settings.dispatch_stream;
    out.push(match &survey.stream {
        Found::Missing => (
            Level::Note,
            "dispatch stream",
            format!("{stream} does not exist yet: it is created when cluster mode starts"),
            None,
        ),
        Found::Present {
            work_queue: false, ..
        } => (
            Level::Fail,
            "dispatch stream",
            format!(
                "{stream} exists but is not a work queue: an order would stay after a worker took it"
            ),
            Some(format!(
                "name another cluster.dispatch_stream in {config}, or remove this one (nats stream rm {stream})"
            )),
        ),
        Found::Present {
            replicas: r,
            messages,
            ..
        } => (
            Level::Ok,
            "dispatch stream",
            format!(
                "{stream}: a work queue, {r} replica(s){}, {messages} order(s) waiting",
                differs(*r, replicas)
            ),
            None,
        ),
        Found::Unreadable(why) => (
            Level::Fail,
            "dispatch stream",
            format!("{stream} cannot be read: {why}"),
            Some(format!(
                "allow this host's NATS user $JS.API.STREAM.INFO.{stream}"
            )),
        ),
    });
    let bucket = &settings.lease_bucket;
    out.push(match &survey.bucket {
        Found::Missing => (
            Level::Note,
            "lease bucket",
            format!("{bucket} does not exist yet: it is created when cluster mode starts"),
            None,
        ),
        Found::Present {
            replicas: r,
            messages,
            ..
        } => (
            Level::Ok,
            "lease bucket",
            format!(
                "{bucket}: {r} replica(s){}, {messages} entr{}",
                differs(*r, replicas),
                if *messages == 1 { "y" } else { "ies" }
            ),
            None,
        ),
        Found::Unreadable(why) => (
            Level::Fail,
            "lease bucket",
            format!("{bucket} cannot be read: {why}"),
            Some(format!(
                "allow this host's NATS user $JS.API.STREAM.INFO.KV_{bucket}"
            )),
        ),
    });
    out.extend(worker_findings(settings, survey, &config.to_string(), now));
    out
}

/// The worker registry, the output stream and each registered worker.
fn worker_findings(
    settings: &ClusterSettings,
    survey: &Survey,
    config: &str,
    now: SystemTime,
) -> Vec<Finding> {
    let replicas = settings.replicas;
    let mut out: Vec<Finding> = Vec::new();
    let registry = &settings.worker_bucket;
    let registry_exists = matches!(survey.worker_bucket, Found::Present { .. });
    out.push(match &survey.worker_bucket {
        Found::Missing => (
            Level::Note,
            "worker registry",
            format!(
                "{registry} does not exist yet: it is created when the first worker starts (agent-state worker)"
            ),
            None,
        ),
        Found::Present { replicas: r, .. } => (
            Level::Ok,
            "worker registry",
            format!("{registry}: {r} replica(s){}", differs(*r, replicas)),
            None,
        ),
        Found::Unreadable(why) => (
            Level::Fail,
            "worker registry",
            format!("{registry} cannot be read: {why}"),
            Some(format!(
                "allow this host's NATS user $JS.API.STREAM.INFO.KV_{registry}"
            )),
        ),
    });
    let output = &settings.output_stream;
    out.push(match &survey.output {
        Found::Missing => (
            Level::Note,
            "output stream",
            format!("{output} does not exist yet: it is created when the first worker starts"),
            None,
        ),
        Found::Present {
            work_queue: true, ..
        } => (
            Level::Fail,
            "output stream",
            format!(
                "{output} exists but is a work queue: a session's output could not be replayed after a controller restart"
            ),
            Some(format!(
                "name another cluster.output_stream in {config}, or remove this one (nats stream rm {output})"
            )),
        ),
        Found::Present {
            replicas: r,
            messages,
            ..
        } => (
            Level::Ok,
            "output stream",
            format!(
                "{output}: {r} replica(s){}, {messages} chunk(s) and end(s) kept",
                differs(*r, replicas)
            ),
            None,
        ),
        Found::Unreadable(why) => (
            Level::Fail,
            "output stream",
            format!("{output} cannot be read: {why}"),
            Some(format!(
                "allow this host's NATS user $JS.API.STREAM.INFO.{output}"
            )),
        ),
    });
    match &survey.workers {
        Err(why) => out.push((
            Level::Fail,
            "workers",
            format!("the workers in {registry} cannot be listed: {why}"),
            Some(format!(
                "allow this host's NATS user to read the bucket {registry} ($JS.API.CONSUMER.> and $KV.{registry}.>)"
            )),
        )),
        Ok(workers) if workers.is_empty() => {
            if registry_exists {
                out.push((
                    Level::Warn,
                    "workers",
                    format!("none registered in {registry}: no session can run on another host"),
                    Some("start agent-state worker on each worker host (systemctl enable --now agent-state-worker)".into()),
                ));
            }
        }
        Ok(workers) => {
            for entry in workers {
                out.push(worker_finding(entry, now));
            }
        }
    }
    out
}

/// One line for one registered worker: its state, sessions and heartbeat.
fn worker_finding(entry: &WorkerEntry, now: SystemTime) -> Finding {
    let r = &entry.record;
    let age = since_stored(entry.stored_at, now);
    let timing = WorkerTiming::beating_every(Duration::from_millis(r.heartbeat_every_ms.max(1)));
    let state = worker_state(&timing, r, age, entry.drain_requested);
    let host = &r.host;
    let detail = format!(
        "{host}: {}, {}/{} slot(s) busy, heartbeat {:.1}s ago (agent-state {})",
        state.as_str(),
        r.sessions.len(),
        r.slots,
        age.as_secs_f64(),
        r.version
    );
    match state {
        WorkerState::Alive => (Level::Ok, "worker", detail, None),
        WorkerState::Draining | WorkerState::Drained => (
            Level::Note,
            "worker",
            format!(
                "{detail}; a drain was requested: it pulls no order (undo: agent-state worker resume {host})"
            ),
            None,
        ),
        WorkerState::Stopped => (
            Level::Note,
            "worker",
            format!("{detail}; it stopped cleanly"),
            None,
        ),
        WorkerState::Lost => (
            Level::Warn,
            "worker",
            format!(
                "{detail}; lost: no heartbeat for {}s or more",
                timing.lost_after.as_secs()
            ),
            Some(format!(
                "check agent-state-worker.service on {host} (journalctl -u agent-state-worker) and that it reaches NATS; its sessions' leases are fenced by the controller"
            )),
        ),
    }
}

/// ` (cluster.replicas says N: updated when cluster mode starts)` when the
/// copies found are not the configured ones.
fn differs(found: usize, configured: usize) -> String {
    if found == configured {
        String::new()
    } else {
        format!(" (cluster.replicas says {configured}: updated when cluster mode starts)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn survey(ttl: bool, cluster: Option<&str>, stream: Found, bucket: Found) -> Survey {
        Survey {
            server: "n1".into(),
            version: "2.12.1".into(),
            cluster_name: cluster.map(String::from),
            per_key_ttl: ttl,
            stream,
            bucket,
            worker_bucket: Found::Missing,
            output: Found::Missing,
            workers: Ok(Vec::new()),
        }
    }

    fn present(work_queue: bool, replicas: usize, messages: u64) -> Found {
        Found::Present {
            work_queue,
            replicas,
            messages,
        }
    }

    /// (replicas, how far doctor got) -> each line's level, what, and a
    /// piece of its detail (or fix).
    #[test]
    fn each_state_of_the_cluster_gives_its_lines() {
        let config = Path::new("/etc/agent-state/config.toml");
        type Want = &'static [(Level, &'static str, &'static str)];
        let table: Vec<(usize, Reach, Want)> = vec![
            (
                1,
                Reach::Unreachable(
                    "cannot connect to NATS at nats://127.0.0.1:9: refused; check cluster.urls"
                        .into(),
                ),
                &[
                    (Level::Note, "cluster", "local_sessions is true"),
                    (
                        Level::Fail,
                        "cluster",
                        "not reachable: cannot connect to NATS at nats://127.0.0.1:9",
                    ),
                ],
            ),
            (
                1,
                Reach::Silent,
                &[
                    (Level::Note, "cluster", "every session runs on this host"),
                    (
                        Level::Fail,
                        "cluster",
                        "no answer from NATS at nats://127.0.0.1:9 within 10s",
                    ),
                ],
            ),
            (
                1,
                Reach::NoJetStream("NATS at x has no JetStream".into()),
                &[
                    (Level::Note, "cluster", ""),
                    (Level::Ok, "cluster", "reachable"),
                    (Level::Fail, "cluster JetStream", "has no JetStream"),
                ],
            ),
            (
                1,
                Reach::Credentials(
                    "cannot read the NATS credentials file /x: denied; check cluster.creds_file"
                        .into(),
                ),
                &[
                    (Level::Note, "cluster", ""),
                    (Level::Fail, "cluster", "cluster.creds_file"),
                ],
            ),
            (
                1,
                Reach::Surveyed(Box::new(survey(true, None, Found::Missing, Found::Missing))),
                &[
                    (Level::Note, "cluster", ""),
                    (
                        Level::Ok,
                        "cluster",
                        "reachable at nats://127.0.0.1:9: nats-server 2.12.1 (n1)",
                    ),
                    (Level::Ok, "cluster JetStream", "answers"),
                    (Level::Ok, "cluster TTL", "per-key TTL supported"),
                    (
                        Level::Note,
                        "dispatch stream",
                        "AGENT_STATE_DISPATCH does not exist yet",
                    ),
                    (
                        Level::Note,
                        "lease bucket",
                        "agent_state_leases does not exist yet",
                    ),
                ],
            ),
            (
                3,
                Reach::Surveyed(Box::new(survey(
                    false,
                    None,
                    present(true, 1, 2),
                    present(false, 1, 1),
                ))),
                &[
                    (Level::Note, "cluster", ""),
                    (Level::Ok, "cluster", "reachable"),
                    (Level::Ok, "cluster JetStream", "answers"),
                    (
                        Level::Warn,
                        "cluster TTL",
                        "per-key TTL not supported by nats-server 2.12.1",
                    ),
                    (
                        Level::Fail,
                        "cluster replicas",
                        "cluster.replicas is 3, but nats-server n1 is not part of a cluster",
                    ),
                    (
                        Level::Ok,
                        "dispatch stream",
                        "a work queue, 1 replica(s) (cluster.replicas says 3",
                    ),
                    (
                        Level::Ok,
                        "lease bucket",
                        "agent_state_leases: 1 replica(s) (cluster.replicas says 3: updated when cluster mode starts), 1 entry",
                    ),
                ],
            ),
            (
                3,
                Reach::Surveyed(Box::new(survey(
                    true,
                    Some("c"),
                    present(false, 3, 0),
                    Found::Unreadable("permissions violation".into()),
                ))),
                &[
                    (Level::Note, "cluster", ""),
                    (Level::Ok, "cluster", "(n1, cluster c)"),
                    (Level::Ok, "cluster JetStream", "answers"),
                    (Level::Ok, "cluster TTL", "supported"),
                    (Level::Fail, "dispatch stream", "is not a work queue"),
                    (
                        Level::Fail,
                        "lease bucket",
                        "cannot be read: permissions violation",
                    ),
                ],
            ),
        ];
        for (replicas, reach, want) in table {
            let mut settings = ClusterSettings::with_urls(vec!["nats://127.0.0.1:9".into()]);
            settings.replicas = replicas;
            let got = findings(&settings, &reach, config, SystemTime::UNIX_EPOCH);
            // The worker lines have their own table below.
            let got: Vec<Finding> = got
                .into_iter()
                .filter(|(_, w, _, _)| !matches!(*w, "worker registry" | "output stream"))
                .collect();
            let shape: Vec<(Level, &str)> = got.iter().map(|(l, w, _, _)| (*l, *w)).collect();
            let want_shape: Vec<(Level, &str)> = want.iter().map(|(l, w, _)| (*l, *w)).collect();
            assert_eq!(shape, want_shape, "{reach:?}: {got:#?}");
            for ((_, _, detail, _), (_, _, piece)) in got.iter().zip(want) {
                assert!(
                    detail.contains(piece),
                    "{reach:?}: {detail:?} lacks {piece:?}"
                );
            }
            // Every failure and warning says what to do.
            for (level, what, detail, fix) in &got {
                if matches!(level, Level::Fail | Level::Warn) {
                    assert!(fix.is_some(), "{what}: {detail}: no fix");
                }
            }
        }
    }

    /// A server that cannot be reached: the fix names cluster.urls and the file.
    #[test]
    fn an_unreachable_server_names_cluster_urls_in_the_file() {
        let settings = ClusterSettings::with_urls(vec!["nats://127.0.0.1:9".into()]);
        let got = findings(
            &settings,
            &Reach::Unreachable("refused".into()),
            Path::new("/etc/agent-state/config.toml"),
            SystemTime::UNIX_EPOCH,
        );
        let fix = got[1].3.as_deref().unwrap();
        assert!(
            fix.contains("cluster.urls in /etc/agent-state/config.toml (nats://127.0.0.1:9)"),
            "{fix}"
        );
    }

    fn entry(
        host: &str,
        sessions: usize,
        stored_secs_ago: u64,
        drain: bool,
        stopped: bool,
    ) -> WorkerEntry {
        use agent_state_cluster::{RunningSession, WorkerRecord};
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        WorkerEntry {
            record: WorkerRecord {
                host: host.into(),
                version: "0.9.0".into(),
                slots: 2,
                sessions: (0..sessions)
                    .map(|i| RunningSession {
                        session_id: format!("s{i}"),
                        agent: format!("a{i}"),
                        started_ms: 0,
                    })
                    .collect(),
                credentials: Vec::new(),
                drained: false,
                stopped,
                not_pulling: None,
                heartbeat_ms: 0,
                heartbeat_every_ms: 5_000,
            },
            stored_at: now - Duration::from_secs(stored_secs_ago),
            revision: 1,
            drain_requested: drain,
        }
    }

    /// (registry, output stream, workers) -> the lines after the lease
    /// bucket's: level, what, a piece of the detail. Heartbeats every 5 s,
    /// lost after 20 s.
    #[test]
    fn the_registry_the_output_stream_and_each_worker_give_their_lines() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let config = Path::new("/etc/agent-state/config.toml");
        type Want = &'static [(Level, &'static str, &'static str)];
        type Row = (
            Found,
            Found,
            Result<Vec<WorkerEntry>, agent_state_cluster::WorkersUnread>,
            Want,
        );
        let table: Vec<Row> = vec![
            (
                Found::Missing,
                Found::Missing,
                Ok(vec![]),
                &[
                    (
                        Level::Note,
                        "worker registry",
                        "agent_state_workers does not exist yet: it is created when the first worker starts",
                    ),
                    (
                        Level::Note,
                        "output stream",
                        "AGENT_STATE_OUTPUT does not exist yet",
                    ),
                ],
            ),
            (
                present(false, 3, 0),
                present(false, 3, 12),
                Ok(vec![]),
                &[
                    (
                        Level::Ok,
                        "worker registry",
                        "agent_state_workers: 3 replica(s)",
                    ),
                    (Level::Ok, "output stream", "12 chunk(s)"),
                    (Level::Warn, "workers", "none registered"),
                ],
            ),
            (
                present(false, 3, 2),
                present(true, 3, 0),
                Ok(vec![
                    entry("w1", 1, 1, false, false),
                    entry("w2", 1, 2, true, false),
                    entry("w3", 0, 25, false, false),
                    entry("w4", 0, 25, false, true),
                ]),
                &[
                    (Level::Ok, "worker registry", "3 replica(s)"),
                    (Level::Fail, "output stream", "is a work queue"),
                    (
                        Level::Ok,
                        "worker",
                        "w1: alive, 1/2 slot(s) busy, heartbeat 1.0s ago",
                    ),
                    (Level::Note, "worker", "w2: draining"),
                    (
                        Level::Warn,
                        "worker",
                        "w3: lost, 0/2 slot(s) busy, heartbeat 25.0s ago",
                    ),
                    (Level::Note, "worker", "w4: stopped"),
                ],
            ),
            (
                Found::Unreadable("permissions violation".into()),
                Found::Unreadable("timed out".into()),
                Err(agent_state_cluster::WorkersUnread::List(
                    "permissions violation".into(),
                )),
                &[
                    (
                        Level::Fail,
                        "worker registry",
                        "cannot be read: permissions violation",
                    ),
                    (Level::Fail, "output stream", "cannot be read: timed out"),
                    (Level::Fail, "workers", "cannot be listed"),
                ],
            ),
        ];
        for (worker_bucket, output, workers, want) in table {
            let mut s = survey(true, Some("c"), Found::Missing, Found::Missing);
            s.worker_bucket = worker_bucket;
            s.output = output;
            s.workers = workers;
            let mut settings = ClusterSettings::with_urls(vec!["nats://127.0.0.1:9".into()]);
            settings.replicas = 3;
            let got: Vec<Finding> = findings(&settings, &Reach::Surveyed(Box::new(s)), config, now)
                .into_iter()
                .skip_while(|(_, w, _, _)| *w != "worker registry")
                .collect();
            let shape: Vec<(Level, &str)> = got.iter().map(|(l, w, _, _)| (*l, *w)).collect();
            let want_shape: Vec<(Level, &str)> = want.iter().map(|(l, w, _)| (*l, *w)).collect();
            assert_eq!(shape, want_shape, "{got:#?}");
            for ((_, _, detail, _), (_, _, piece)) in got.iter().zip(want) {
                assert!(detail.contains(piece), "{detail:?} lacks {piece:?}");
            }
            for (level, what, detail, fix) in &got {
                if matches!(level, Level::Fail | Level::Warn) {
                    assert!(fix.is_some(), "{what}: {detail}: no fix");
                }
            }
        }
    }
}
