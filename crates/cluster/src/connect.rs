//! The connection to NATS and the two JetStream objects this crate uses:
//! the dispatch stream and the lease bucket, created (or brought to the
//! configured shape) when a host connects.
//!
//! Whether the servers keep a per-key TTL is asked of them (the JetStream
//! API level, 1 from nats-server 2.11 on); with an older server the leases
//! work without the server-side backstop and [`Cluster::per_key_ttl`] says
//! so, for `doctor` to report.

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use async_nats::{Client, ConnectOptions};

use crate::config::{ClusterSettings, Credentials};
use crate::dispatch::Dispatch;
use crate::lease::Leases;
use crate::liveness::LeaseTiming;
use crate::session::{Output, OutputError};
use crate::workers::{Workers, WorkersError};

/// How long a delete marker the server leaves for an expired lease stays
/// (so a watcher sees why the lease went).
const EXPIRY_MARKER_KEPT: Duration = Duration::from_secs(60);

/// Connecting or setting up failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "cannot read the NATS credentials file {path}: {source}; check cluster.{field} and the file's permissions"
    )]
    Credentials {
        field: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error(
        "cannot connect to NATS at {urls}: {source}; check cluster.urls and that nats-server runs there"
    )]
    Connect {
        urls: String,
        source: async_nats::ConnectError,
    },
    #[error(
        "NATS at {urls} has no JetStream: {source}; start nats-server with `-js` (or `jetstream {{}}` in its config)"
    )]
    NoJetStream {
        urls: String,
        source: async_nats::jetstream::context::AccountError,
    },
    #[error("cannot create or update the dispatch stream {stream}: {source}")]
    Stream {
        stream: String,
        source: async_nats::jetstream::context::CreateStreamError,
    },
    #[error("cannot create or update the lease bucket {bucket}: {source}")]
    Bucket {
        bucket: String,
        source: async_nats::jetstream::context::CreateKeyValueError,
    },
    #[error(transparent)]
    Workers(#[from] WorkersError),
    #[error(transparent)]
    Output(#[from] OutputError),
}

/// A host's connection to the cluster.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    jetstream: jetstream::Context,
    settings: ClusterSettings,
    per_key_ttl: bool,
}

impl Cluster {
    /// Connects as `name` (the host's name, shown by `nats server report
    /// connections`) and checks that JetStream answers.
    pub async fn connect(settings: &ClusterSettings, name: &str) -> Result<Cluster, ClusterError> {
        let urls = settings.urls.join(",");
        let mut options = match &settings.credentials {
            Credentials::None => ConnectOptions::new(),
            Credentials::CredsFile(path) => ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|source| ClusterError::Credentials {
                    field: "creds_file",
                    path: path.display().to_string(),
                    source,
                })?,
            Credentials::NkeyFile(path) => {
                let seed = tokio::fs::read_to_string(path).await.map_err(|source| {
                    ClusterError::Credentials {
                        field: "nkey_file",
                        path: path.display().to_string(),
                        source,
                    }
                })?;
                ConnectOptions::with_nkey(seed.trim().to_string())
            }
        };
        if let Some(tls) = &settings.tls {
            if let Some(ca) = &tls.ca_file {
                options = options.add_root_certificates(ca.clone());
            }
            if let Some((cert, key)) = &tls.client_cert {
                options = options.add_client_certificate(cert.clone(), key.clone());
            }
            options = options.require_tls(tls.required);
        }
        let client = options
            .name(name)
            .connection_timeout(Duration::from_secs(5))
            .connect(settings.urls.as_slice())
            .await
            .map_err(|source| ClusterError::Connect {
                urls: urls.clone(),
                source,
            })?;
        let jetstream = jetstream::new(client.clone());
        let account =
            jetstream
                .query_account()
                .await
                .map_err(|source| ClusterError::NoJetStream {
                    urls: urls.clone(),
                    source,
                })?;
        Ok(Cluster {
            client,
            jetstream,
            settings: settings.clone(),
            per_key_ttl: account.requests.level >= 1,
        })
    }

    /// Whether the servers keep a TTL per key (nats-server 2.11 or later).
    pub fn per_key_ttl(&self) -> bool {
        self.per_key_ttl
    }

    /// The NATS connection (for the caller's own subjects: output chunks,
    /// hook calls).
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    /// The dispatch stream, created or updated to the configured shape: a
    /// work queue (an order is removed once a worker acks it), file storage,
    /// `replicas` copies, session ids remembered for `dedup_window`.
    pub async fn dispatch(&self) -> Result<Dispatch, ClusterError> {
        let name = self.settings.dispatch_stream.clone();
        let stream = self
            .jetstream
            .create_or_update_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.*")],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                num_replicas: self.settings.replicas,
                duplicate_window: self.settings.dedup_window,
                description: Some("agent-state: session orders for the workers".into()),
                ..Default::default()
            })
            .await
            .map_err(|source| ClusterError::Stream {
                stream: name.clone(),
                source,
            })?;
        let _ = stream;
        Ok(Dispatch::new(
            self.jetstream.clone(),
            name,
            self.settings.ack_wait,
            self.settings.replicas,
        ))
    }

    /// The lease bucket, created or updated: one revision kept per key (the
    /// revision is the fencing token, history is not needed), `replicas`
    /// copies, and where the server can, a TTL per key with delete markers.
    pub async fn leases(&self, timing: LeaseTiming) -> Result<Leases, ClusterError> {
        let bucket = self.settings.lease_bucket.clone();
        let store = self
            .jetstream
            .create_or_update_key_value(kv::Config {
                bucket: bucket.clone(),
                description: "agent-state: run/<agent> leases, one session per agent".into(),
                history: 1,
                storage: stream::StorageType::File,
                num_replicas: self.settings.replicas,
                limit_markers: self.per_key_ttl.then_some(EXPIRY_MARKER_KEPT),
                ..Default::default()
            })
            .await
            .map_err(|source| ClusterError::Bucket {
                bucket: bucket.clone(),
                source,
            })?;
        let ttl = self.per_key_ttl.then_some(timing.controller_fences);
        Ok(Leases::new(self.jetstream.clone(), store, bucket, ttl))
    }
}

impl Cluster {
    /// The worker registry, created or updated (a worker registers there).
    pub async fn workers(&self) -> Result<Workers, ClusterError> {
        Ok(Workers::create(
            &self.jetstream,
            &self.settings.worker_bucket,
            self.settings.replicas,
        )
        .await?)
    }

    /// The worker registry as found, `None` if no worker ever registered:
    /// for the operator's commands, which create nothing.
    pub async fn existing_workers(&self) -> Result<Option<Workers>, ClusterError> {
        Ok(Workers::open(&self.jetstream, &self.settings.worker_bucket).await?)
    }

    /// The output stream of the sessions' chunks and ends, created or
    /// updated.
    pub async fn output(&self) -> Result<Output, ClusterError> {
        Ok(Output::create(
            &self.jetstream,
            &self.settings.output_stream,
            self.settings.replicas,
            self.settings.dedup_window,
        )
        .await?)
    }
}

/// What `doctor` reports of the cluster, read without creating or changing
/// anything ([`Cluster::survey`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Survey {
    /// The server this host is connected to: its name and version.
    pub server: String,
    pub version: String,
    /// The name of the NATS cluster that server is part of, if any.
    pub cluster_name: Option<String>,
    /// Whether the servers keep a TTL per key ([`Cluster::per_key_ttl`]).
    pub per_key_ttl: bool,
    /// The dispatch stream (`cluster.dispatch_stream`).
    pub stream: Found,
    /// The stream behind the lease bucket (`KV_<cluster.lease_bucket>`).
    pub bucket: Found,
    /// The stream behind the worker registry (`KV_<cluster.worker_bucket>`).
    pub worker_bucket: Found,
    /// The output stream (`cluster.output_stream`).
    pub output: Found,
    /// The workers registered, as read (empty when the registry is
    /// missing), or why they could not be listed.
    pub workers: Result<Vec<crate::WorkerEntry>, WorkersUnread>,
}

/// Why [`Survey::workers`] could not be read: which step failed, and the
/// server's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkersUnread {
    #[error("cannot open the registry: {0}")]
    Registry(String),
    #[error("cannot list it: {0}")]
    List(String),
}

/// A JetStream object as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// It does not exist (yet).
    Missing,
    /// It exists: its shape.
    Present {
        /// A work queue (an acked message is removed).
        work_queue: bool,
        replicas: usize,
        messages: u64,
    },
    /// Asking for it failed: why.
    Unreadable(String),
}

impl Cluster {
    /// The server's name and version, per-key TTL, whether the dispatch
    /// stream, the lease bucket, the worker registry and the output stream
    /// exist and in what shape, and the workers registered: only read, so
    /// `doctor` changes nothing on the cluster.
    pub async fn survey(&self) -> Survey {
        let info = self.client.server_info();
        Survey {
            server: info.server_name.clone(),
            version: info.version.clone(),
            cluster_name: info.cluster.clone(),
            per_key_ttl: self.per_key_ttl,
            stream: self.find_stream(&self.settings.dispatch_stream).await,
            bucket: self
                .find_stream(&format!("KV_{}", self.settings.lease_bucket))
                .await,
            worker_bucket: self
                .find_stream(&format!("KV_{}", self.settings.worker_bucket))
                .await,
            output: self.find_stream(&self.settings.output_stream).await,
            workers: match self.existing_workers().await {
                Ok(None) => Ok(Vec::new()),
                Ok(Some(registry)) => registry
                    .list()
                    .await
                    .map_err(|e| WorkersUnread::List(e.to_string())),
                Err(e) => Err(WorkersUnread::Registry(e.to_string())),
            },
        }
    }

    async fn find_stream(&self, name: &str) -> Found {
        use async_nats::jetstream::ErrorCode;
        use async_nats::jetstream::context::GetStreamErrorKind;
        match self.jetstream.get_stream(name).await {
            Ok(stream) => {
                let info = stream.cached_info();
                Found::Present {
                    work_queue: info.config.retention == stream::RetentionPolicy::WorkQueue,
                    replicas: info.config.num_replicas,
                    messages: info.state.messages,
                }
            }
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(j)
                    if j.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                {
                    Found::Missing
                }
                _ => Found::Unreadable(e.to_string()),
            },
        }
    }
}
