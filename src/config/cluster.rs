//! `[cluster]`: the NATS JetStream cluster sessions will be dispatched
//! through (issue 24). The section is read and checked by
//! `agent-state-cluster`'s own validation, its problems reported here like
//! every other field's; without it nothing changes. The daemon does not use
//! it yet: it says so at its start, and every session runs on this host.

pub use agent_state_cluster::ClusterSettings;
use agent_state_cluster::config::{RawCluster, validate};

use super::Validator;

impl Validator {
    /// `[cluster]`, if the file has one: its settings, or every problem
    /// (each naming its field, `cluster.urls[1]`, and the fix).
    pub(super) fn cluster(&mut self, table: &toml::Table) -> Option<ClusterSettings> {
        let value = table.get("cluster")?;
        // A key the section does not know, a value of the wrong type: named
        // by serde ("[cluster]: unknown field `url`, expected one of …").
        let raw = match value.clone().try_into::<RawCluster>() {
            Ok(raw) => raw,
            Err(e) => {
                self.problem("[cluster]", e.to_string().trim().to_string());
                return None;
            }
        };
        match validate(&raw) {
            Ok(settings) => Some(settings),
            Err(problems) => {
                for p in problems {
                    self.problem(p.field, p.message);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> (Option<ClusterSettings>, Vec<String>) {
        let table: toml::Table = toml::from_str(text).expect("toml");
        let mut v = Validator::default();
        let got = v.cluster(&table);
        (got, v.problems.iter().map(ToString::to_string).collect())
    }

    /// (the file's text, the settings' URLs or none, the start of each problem)
    #[test]
    fn the_section_is_read_or_each_problem_names_its_field() {
        type Row<'a> = (&'a str, Option<&'a [&'a str]>, &'a [&'a str]);
        let table: &[Row] = &[
            // No section: nothing, no problem.
            ("", None, &[]),
            ("[web]\nlisten = \"127.0.0.1:1\"", None, &[]),
            (
                "[cluster]\nurls = [\"nats://10.0.0.1:4222\", \"10.0.0.2:4222\"]",
                Some(&["nats://10.0.0.1:4222", "10.0.0.2:4222"]),
                &[],
            ),
            // An empty section names no server.
            ("[cluster]", None, &["cluster.urls: names no server"]),
            (
                "[cluster]\nurls = [\"nats://a:1\", \"http://b:2\"]",
                None,
                &["cluster.urls[1]: \"http://b:2\" has a scheme other than"],
            ),
            (
                "[cluster]\nurls = [\"a:1\"]\nreplicas = 2\ncreds_file = \"w.creds\"",
                None,
                &[
                    "cluster.creds_file: \"w.creds\" must be an absolute path",
                    "cluster.replicas: 2 is not 1, 3 or 5",
                ],
            ),
            (
                "[cluster]\nurls = [\"a:1\"]\nurl = \"b:1\"",
                None,
                &["[cluster]: unknown field `url`"],
            ),
            (
                "[cluster]\nurls = \"nats://a:1\"",
                None,
                &["[cluster]: invalid type: string"],
            ),
            ("cluster = 3", None, &["[cluster]: invalid type"]),
        ];
        for (text, urls, want) in table {
            let (got, problems) = read(text);
            assert_eq!(
                got.as_ref().map(|s| s.urls.clone()),
                urls.map(|u| u.iter().map(ToString::to_string).collect::<Vec<_>>()),
                "{text:?}: {problems:?}"
            );
            assert_eq!(problems.len(), want.len(), "{text:?}: {problems:?}");
            for w in *want {
                assert!(
                    problems.iter().any(|p| p.starts_with(w)),
                    "{text:?}: no problem starts with {w:?}: {problems:?}"
                );
            }
        }
    }

    /// Through the whole file: `[cluster]` is a known section, its problem
    /// is one of the file's, named by its field.
    #[test]
    fn the_file_reports_a_cluster_problem_like_any_other() {
        let path = std::path::Path::new("/etc/agent-state/config.toml");
        let ok = crate::config::Config::parse(
            "[cluster]\nurls = [\"nats://127.0.0.1:4222\"]\nreplicas = 1\n",
            path,
        )
        .expect("a valid [cluster]");
        let cluster = ok.cluster.expect("[cluster] read");
        assert_eq!(cluster.replicas, 1);
        assert!(
            crate::config::Config::parse("", path)
                .unwrap()
                .cluster
                .is_none()
        );

        let err = crate::config::Config::parse("[cluster]\nurls = [\"nats://b\"]\n", path)
            .expect_err("a bad url");
        let text = err.to_string();
        assert!(
            text.contains("/etc/agent-state/config.toml")
                && text.contains("cluster.urls[0]: \"nats://b\" has no port"),
            "{text}"
        );
    }
}
