//! `[cluster]`: where the NATS servers are, how this host proves who it is,
//! the names of the dispatch stream and the lease bucket, and whether this
//! host also runs sessions itself (issue 24).
//!
//! [`RawCluster`] is what serde reads (`deny_unknown_fields`, every value
//! optional); [`validate`] turns it into [`ClusterSettings`] or into every
//! problem at once, each naming its field (`cluster.urls[1]`) and the fix, as
//! the daemon's own config validation does. Validation is pure: it reads no
//! file. Whether the credential files can be read is found out when
//! connecting ([`crate::Cluster::connect`]), with an error naming the file.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The dispatch stream's name when `[cluster]` names none.
pub const DEFAULT_DISPATCH_STREAM: &str = "AGENT_STATE_DISPATCH";
/// The lease bucket's name when `[cluster]` names none.
pub const DEFAULT_LEASE_BUCKET: &str = "agent_state_leases";
/// The worker registry's bucket when `[cluster]` names none.
pub const DEFAULT_WORKER_BUCKET: &str = "agent_state_workers";
/// The stream of the sessions' output and ends when `[cluster]` names none.
pub const DEFAULT_OUTPUT_STREAM: &str = "AGENT_STATE_OUTPUT";

/// `[cluster]` as written: every key optional, no unknown key.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    /// The NATS servers, `nats://host:port` (or `tls://`); several for a cluster.
    pub urls: Option<Vec<String>>,
    /// A `.creds` file (user JWT and nkey seed), as `nsc` writes them.
    pub creds_file: Option<String>,
    /// A file holding a user nkey seed (`SU…`), for servers that use nkeys without JWTs.
    pub nkey_file: Option<String>,
    /// TLS towards the servers.
    pub tls: Option<RawTls>,
    /// The work-queue stream session orders go through.
    pub dispatch_stream: Option<String>,
    /// The KV bucket of the leases `run/<agent>`.
    pub lease_bucket: Option<String>,
    /// The KV bucket where each worker keeps its record (`worker/<host>`)
    /// and the operator's drain requests (`drain/<host>`).
    pub worker_bucket: Option<String>,
    /// The stream of the sessions' output chunks and ends.
    pub output_stream: Option<String>,
    /// How many servers keep each copy of the stream and the bucket (1, 3 or 5).
    pub replicas: Option<u32>,
    /// Whether this host also runs sessions itself (default: true).
    pub local_sessions: Option<bool>,
    /// How long an order handed to a worker waits for its next ack before it
    /// goes to another worker (a duration, default "30s").
    pub ack_wait: Option<String>,
    /// How long a session id is remembered to drop a second publication of
    /// the same order (a duration, default "10m").
    pub dedup_window: Option<String>,
    /// How long the controller waits for a worker to start an order before
    /// the session ends as not started and its messages return to the
    /// inbox (a duration, default "60s").
    pub dispatch_timeout: Option<String>,
}

/// `[cluster.tls]` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// The CA that signed the servers' certificates (PEM).
    pub ca_file: Option<String>,
    /// This host's client certificate (PEM); needs `key_file`.
    pub cert_file: Option<String>,
    /// The client certificate's private key (PEM); needs `cert_file`.
    pub key_file: Option<String>,
    /// Refuse a server that does not offer TLS (default: true when `[cluster.tls]` is present).
    pub required: Option<bool>,
}

/// `[cluster]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    pub urls: Vec<String>,
    pub credentials: Credentials,
    pub tls: Option<TlsSettings>,
    pub dispatch_stream: String,
    pub lease_bucket: String,
    pub worker_bucket: String,
    pub output_stream: String,
    pub replicas: usize,
    pub local_sessions: bool,
    pub ack_wait: Duration,
    pub dedup_window: Duration,
    pub dispatch_timeout: Duration,
}

/// How this host proves who it is to NATS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// No credentials (a server on loopback or a private network).
    None,
    /// A `.creds` file: a user JWT and its nkey seed.
    CredsFile(PathBuf),
    /// A file holding a user nkey seed.
    NkeyFile(PathBuf),
}

/// `[cluster.tls]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub required: bool,
}

/// One thing wrong with `[cluster]`: the field and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The field's path, `cluster.urls[1]`.
    pub field: String,
    /// What is wrong and the fix.
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl ClusterSettings {
    /// A cluster on `urls` with every other value at its default (tests and
    /// benchmarks).
    pub fn with_urls(urls: Vec<String>) -> ClusterSettings {
        let raw = RawCluster {
            urls: Some(urls),
            ..RawCluster::default()
        };
        validate(&raw).expect("the defaults are valid")
    }
}

/// Checks `[cluster]` and returns it typed, or every problem found.
pub fn validate(raw: &RawCluster) -> Result<ClusterSettings, Vec<ConfigProblem>> {
    let mut problems = Vec::new();
    let mut problem =
        |field: String, message: String| problems.push(ConfigProblem { field, message });

    let urls = raw.urls.clone().unwrap_or_default();
    if urls.is_empty() {
        problem(
            "cluster.urls".into(),
            "names no server; write the NATS servers, e.g. urls = [\"nats://10.0.0.1:4222\", \"nats://10.0.0.2:4222\", \"nats://10.0.0.3:4222\"]".into(),
        );
    }
    for (i, url) in urls.iter().enumerate() {
        if let Err(why) = check_url(url) {
            problem(
                format!("cluster.urls[{i}]"),
                format!("{url:?} {why}; write e.g. \"nats://10.0.0.1:4222\" (or \"tls://…\")"),
            );
        }
    }

    let mut absolute = |field: &str, text: &str| -> Option<PathBuf> {
        let path = PathBuf::from(text);
        if path.is_absolute() {
            Some(path)
        } else {
            problem(
                format!("cluster.{field}"),
                format!(
                    "{text:?} must be an absolute path, e.g. \"/etc/agent-state/nats/worker.creds\""
                ),
            );
            None
        }
    };
    let creds = raw.creds_file.as_deref().map(|t| absolute("creds_file", t));
    let nkey = raw.nkey_file.as_deref().map(|t| absolute("nkey_file", t));
    let tls = raw.tls.as_ref().map(|tls| {
        let ca_file = tls
            .ca_file
            .as_deref()
            .and_then(|t| absolute("tls.ca_file", t));
        let cert = tls
            .cert_file
            .as_deref()
            .and_then(|t| absolute("tls.cert_file", t));
        let key = tls
            .key_file
            .as_deref()
            .and_then(|t| absolute("tls.key_file", t));
        (tls, ca_file, cert, key)
    });
    let credentials = match (creds, nkey) {
        (Some(_), Some(_)) => {
            problem(
                "cluster.nkey_file".into(),
                "is set together with cluster.creds_file; keep one: creds_file for a JWT account (nsc), nkey_file for a bare nkey user".into(),
            );
            Credentials::None
        }
        (Some(Some(path)), None) => Credentials::CredsFile(path),
        (None, Some(Some(path))) => Credentials::NkeyFile(path),
        _ => Credentials::None,
    };
    let tls = tls.map(|(raw_tls, ca_file, cert, key)| {
        let client_cert = match (raw_tls.cert_file.is_some(), raw_tls.key_file.is_some()) {
            (true, false) => {
                problem(
                    "cluster.tls.key_file".into(),
                    "is missing while cluster.tls.cert_file is set; name the certificate's private key (PEM)".into(),
                );
                None
            }
            (false, true) => {
                problem(
                    "cluster.tls.cert_file".into(),
                    "is missing while cluster.tls.key_file is set; name the client certificate (PEM)".into(),
                );
                None
            }
            _ => cert.zip(key),
        };
        TlsSettings {
            ca_file,
            client_cert,
            required: raw_tls.required.unwrap_or(true),
        }
    });

    let dispatch_stream = raw
        .dispatch_stream
        .clone()
        .unwrap_or_else(|| DEFAULT_DISPATCH_STREAM.into());
    if let Err(why) = check_name(&dispatch_stream) {
        problem(
            "cluster.dispatch_stream".into(),
            format!("{dispatch_stream:?} {why}; write e.g. \"{DEFAULT_DISPATCH_STREAM}\""),
        );
    }
    let lease_bucket = raw
        .lease_bucket
        .clone()
        .unwrap_or_else(|| DEFAULT_LEASE_BUCKET.into());
    if let Err(why) = check_name(&lease_bucket) {
        problem(
            "cluster.lease_bucket".into(),
            format!("{lease_bucket:?} {why}; write e.g. \"{DEFAULT_LEASE_BUCKET}\""),
        );
    }

    let worker_bucket = raw
        .worker_bucket
        .clone()
        .unwrap_or_else(|| DEFAULT_WORKER_BUCKET.into());
    if let Err(why) = check_name(&worker_bucket) {
        problem(
            "cluster.worker_bucket".into(),
            format!("{worker_bucket:?} {why}; write e.g. \"{DEFAULT_WORKER_BUCKET}\""),
        );
    }
    let output_stream = raw
        .output_stream
        .clone()
        .unwrap_or_else(|| DEFAULT_OUTPUT_STREAM.into());
    if let Err(why) = check_name(&output_stream) {
        problem(
            "cluster.output_stream".into(),
            format!("{output_stream:?} {why}; write e.g. \"{DEFAULT_OUTPUT_STREAM}\""),
        );
    }

    let replicas = raw.replicas.unwrap_or(3);
    if !matches!(replicas, 1 | 3 | 5) {
        problem(
            "cluster.replicas".into(),
            format!(
                "{replicas} is not 1, 3 or 5; write 3 for a three-server cluster (a majority must survive), 1 for a single server"
            ),
        );
    }

    let mut duration = |field: &str, text: Option<&str>, default: &str, min: Duration| {
        let text = text.unwrap_or(default);
        match humantime::parse_duration(text) {
            Ok(d) if d >= min => d,
            Ok(_) => {
                problem(
                    format!("cluster.{field}"),
                    format!(
                        "{text:?} is shorter than {}; write e.g. {default:?}",
                        humantime::format_duration(min)
                    ),
                );
                humantime::parse_duration(default).expect("the default parses")
            }
            Err(_) => {
                problem(
                    format!("cluster.{field}"),
                    format!("{text:?} is not a duration; write e.g. {default:?}"),
                );
                humantime::parse_duration(default).expect("the default parses")
            }
        }
    };
    let ack_wait = duration(
        "ack_wait",
        raw.ack_wait.as_deref(),
        "30s",
        Duration::from_secs(1),
    );
    let dedup_window = duration(
        "dedup_window",
        raw.dedup_window.as_deref(),
        "10m",
        Duration::from_secs(1),
    );

    let dispatch_timeout = duration(
        "dispatch_timeout",
        raw.dispatch_timeout.as_deref(),
        "60s",
        Duration::from_secs(1),
    );

    if problems.is_empty() {
        Ok(ClusterSettings {
            urls,
            credentials,
            tls,
            dispatch_stream,
            lease_bucket,
            worker_bucket,
            output_stream,
            replicas: replicas as usize,
            local_sessions: raw.local_sessions.unwrap_or(true),
            ack_wait,
            dedup_window,
            dispatch_timeout,
        })
    } else {
        Err(problems)
    }
}

/// `nats://host:port`, `tls://host:port` or `host:port`.
fn check_url(url: &str) -> Result<(), &'static str> {
    let rest = match url.split_once("://") {
        Some(("nats" | "tls", rest)) => rest,
        Some(_) => return Err("has a scheme other than nats:// or tls://"),
        None => url,
    };
    // user:password@ is allowed by NATS but would put a secret in the config.
    if rest.contains('@') {
        return Err("carries credentials; put them in cluster.creds_file or cluster.nkey_file");
    }
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err("has no port");
    };
    if host.is_empty() {
        return Err("has no host");
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err("has no valid port"),
    }
}

/// A stream or bucket name: letters, digits, `-` and `_` (NATS refuses `.`,
/// `*`, `>` and spaces in both).
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.len() > 64 {
        return Err("is longer than 64 characters");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err("may hold only letters, digits, '-' and '_'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ClusterSettings, Vec<String>> {
        let raw: RawCluster = toml::from_str(text).expect("toml");
        validate(&raw).map_err(|p| p.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn the_defaults_of_a_section_with_urls_alone() {
        let s = parse(r#"urls = ["nats://10.0.0.1:4222", "10.0.0.2:4222"]"#).unwrap();
        assert_eq!(s.dispatch_stream, DEFAULT_DISPATCH_STREAM);
        assert_eq!(s.lease_bucket, DEFAULT_LEASE_BUCKET);
        assert_eq!(s.worker_bucket, DEFAULT_WORKER_BUCKET);
        assert_eq!(s.output_stream, DEFAULT_OUTPUT_STREAM);
        assert_eq!(s.replicas, 3);
        assert!(s.local_sessions);
        assert_eq!(s.credentials, Credentials::None);
        assert_eq!(s.tls, None);
        assert_eq!(s.ack_wait, Duration::from_secs(30));
        assert_eq!(s.dedup_window, Duration::from_secs(600));
        assert_eq!(s.dispatch_timeout, Duration::from_secs(60));
    }

    #[test]
    fn a_full_section() {
        let s = parse(
            r#"
            urls = ["tls://nats1:4222"]
            creds_file = "/etc/agent-state/nats/w.creds"
            dispatch_stream = "ORDERS"
            lease_bucket = "leases"
            replicas = 1
            local_sessions = false
            ack_wait = "10s"
            dedup_window = "1h"
            [tls]
            ca_file = "/etc/ca.pem"
            cert_file = "/etc/c.pem"
            key_file = "/etc/k.pem"
            "#,
        )
        .unwrap();
        assert_eq!(
            s.credentials,
            Credentials::CredsFile("/etc/agent-state/nats/w.creds".into())
        );
        let tls = s.tls.unwrap();
        assert!(tls.required);
        assert_eq!(
            tls.client_cert,
            Some(("/etc/c.pem".into(), "/etc/k.pem".into()))
        );
        assert_eq!(s.replicas, 1);
        assert!(!s.local_sessions);
        assert_eq!(s.ack_wait, Duration::from_secs(10));
    }

    /// Each bad value: the problem names its field and says what to write.
    #[test]
    fn each_problem_names_its_field_and_the_fix() {
        let table: &[(&str, &str, &str)] = &[
            ("", "cluster.urls: names no server", "urls = ["),
            (
                r#"urls = ["http://x:1"]"#,
                "cluster.urls[0]: \"http://x:1\" has a scheme other than",
                "nats://10.0.0.1:4222",
            ),
            (
                r#"urls = ["nats://a:1", "nats://b"]"#,
                "cluster.urls[1]: \"nats://b\" has no port",
                "write e.g.",
            ),
            (
                r#"urls = ["nats://u:p@b:4222"]"#,
                "cluster.urls[0]",
                "put them in cluster.creds_file",
            ),
            (
                r#"urls = ["a:1"]
                   creds_file = "w.creds""#,
                "cluster.creds_file: \"w.creds\" must be an absolute path",
                "/etc/agent-state/nats/worker.creds",
            ),
            (
                r#"urls = ["a:1"]
                   creds_file = "/a"
                   nkey_file = "/b""#,
                "cluster.nkey_file: is set together with cluster.creds_file",
                "keep one",
            ),
            (
                r#"urls = ["a:1"]
                   dispatch_stream = "orders.v1""#,
                "cluster.dispatch_stream: \"orders.v1\" may hold only",
                "AGENT_STATE_DISPATCH",
            ),
            (
                r#"urls = ["a:1"]
                   lease_bucket = """#,
                "cluster.lease_bucket: \"\" is empty",
                "agent_state_leases",
            ),
            (
                r#"urls = ["a:1"]
                   worker_bucket = "w.x""#,
                "cluster.worker_bucket: \"w.x\" may hold only",
                "agent_state_workers",
            ),
            (
                r#"urls = ["a:1"]
                   output_stream = "o x""#,
                "cluster.output_stream: \"o x\" may hold only",
                "AGENT_STATE_OUTPUT",
            ),
            (
                r#"urls = ["a:1"]
                   replicas = 2"#,
                "cluster.replicas: 2 is not 1, 3 or 5",
                "a majority must survive",
            ),
            (
                r#"urls = ["a:1"]
                   dispatch_timeout = "0s""#,
                "cluster.dispatch_timeout: \"0s\" is shorter than 1s",
                "\"60s\"",
            ),
            (
                r#"urls = ["a:1"]
                   ack_wait = "soon""#,
                "cluster.ack_wait: \"soon\" is not a duration",
                "\"30s\"",
            ),
            (
                r#"urls = ["a:1"]
                   ack_wait = "10ms""#,
                "cluster.ack_wait: \"10ms\" is shorter than 1s",
                "\"30s\"",
            ),
            (
                r#"urls = ["a:1"]
                   [tls]
                   cert_file = "/c.pem""#,
                "cluster.tls.key_file: is missing",
                "private key",
            ),
        ];
        for (text, start, fix) in table {
            let problems = parse(text).expect_err(text);
            let found = problems.iter().find(|p| p.starts_with(start));
            let Some(found) = found else {
                panic!("{text:?}: no problem starts with {start:?}: {problems:?}");
            };
            assert!(found.contains(fix), "{text:?}: {found:?} lacks {fix:?}");
        }
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let problems = parse(
            r#"urls = ["x"]
               replicas = 4
               dispatch_stream = "a b""#,
        )
        .unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
    }

    #[test]
    fn an_unknown_key_is_refused_by_name() {
        let err = toml::from_str::<RawCluster>("urls = [\"a:1\"]\nurl = \"b\"").unwrap_err();
        assert!(err.to_string().contains("unknown field `url`"), "{err}");
    }
}
