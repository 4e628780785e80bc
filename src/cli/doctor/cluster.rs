//! `[cluster]` (issue 24), when the config has one: connects to NATS with a
//! bounded wait ([`TIMEOUT`]) and reports whether the servers answer (naming
//! `cluster.urls` and the error when not), JetStream, the per-key TTL the
//! leases use (nats-server 2.11 or later), whether `cluster.replicas` fits
//! the servers, and the dispatch stream and the lease bucket as found. Only
//! reads: nothing is created on the cluster. Cluster mode is not active yet
//! (every session runs on this host), and the first line says so.

use std::path::Path;
use std::time::Duration;

use agent_state_cluster::{Cluster, ClusterError, ClusterSettings, Found, Survey};

use super::Report;

/// How long doctor waits for the servers, connection and questions together.
pub(super) const TIMEOUT: Duration = Duration::from_secs(10);

/// How far doctor got with the servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reach {
    /// Connected, JetStream answered: what was found.
    Surveyed(Survey),
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
    for (level, what, detail, fix) in findings(settings, &reach(settings), config) {
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
            Ok(Ok(survey)) => Reach::Surveyed(survey),
            Ok(Err(e @ ClusterError::Credentials { .. })) => Reach::Credentials(e.to_string()),
            Ok(Err(e @ ClusterError::NoJetStream { .. })) => Reach::NoJetStream(e.to_string()),
            Ok(Err(e)) => Reach::Unreachable(e.to_string()),
        }
    })
}

/// What doctor says of `[cluster]` given how far it got (pure).
pub(super) fn findings(settings: &ClusterSettings, reach: &Reach, config: &Path) -> Vec<Finding> {
    let urls = settings.urls.join(", ");
    let config = config.display();
    let mut out: Vec<Finding> = vec![(
        Level::Note,
        "cluster",
        "[cluster] is checked, but cluster mode is not active yet: every session runs on this host"
            .into(),
        None,
    )];
    let survey = match reach {
        Reach::Surveyed(s) => s,
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
    out
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
                    (Level::Note, "cluster", "not active yet"),
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
                Reach::Surveyed(survey(true, None, Found::Missing, Found::Missing)),
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
                Reach::Surveyed(survey(
                    false,
                    None,
                    present(true, 1, 2),
                    present(false, 1, 1),
                )),
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
                Reach::Surveyed(survey(
                    true,
                    Some("c"),
                    present(false, 3, 0),
                    Found::Unreadable("permissions violation".into()),
                )),
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
            let got = findings(&settings, &reach, config);
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
        );
        let fix = got[1].3.as_deref().unwrap();
        assert!(
            fix.contains("cluster.urls in /etc/agent-state/config.toml (nats://127.0.0.1:9)"),
            "{fix}"
        );
    }
}
