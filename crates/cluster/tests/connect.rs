//! Connecting fails with an error that names the setting to fix. No server
//! is needed: these run in every `cargo test`.

use std::net::TcpListener;

use agent_state_cluster::config::Credentials;
use agent_state_cluster::{Cluster, ClusterSettings};

/// A port nothing listens on (bound, then freed).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[tokio::test]
async fn an_unreachable_server_names_cluster_urls() {
    let url = format!("nats://127.0.0.1:{}", closed_port());
    let settings = ClusterSettings::with_urls(vec![url.clone()]);
    let err = Cluster::connect(&settings, "test")
        .await
        .err()
        .expect("no server there");
    let text = err.to_string();
    assert!(text.contains(&url), "{text}");
    assert!(text.contains("check cluster.urls"), "{text}");
}

#[tokio::test]
async fn a_missing_credentials_file_is_named_with_its_field() {
    let dir = tempfile::tempdir().unwrap();
    let table = [
        (
            Credentials::CredsFile(dir.path().join("worker.creds")),
            "worker.creds",
            "cluster.creds_file",
        ),
        (
            Credentials::NkeyFile(dir.path().join("worker.nk")),
            "worker.nk",
            "cluster.nkey_file",
        ),
    ];
    for (credentials, file, field) in table {
        let mut settings =
            ClusterSettings::with_urls(vec![format!("nats://127.0.0.1:{}", closed_port())]);
        settings.credentials = credentials;
        let err = Cluster::connect(&settings, "test")
            .await
            .err()
            .expect("no such file");
        let text = err.to_string();
        assert!(text.contains(file) && text.contains(field), "{text}");
    }
}
