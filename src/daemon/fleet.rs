//! The workers as the controller's metrics show them (issue 24): the
//! worker registry, read by the controller every metrics interval in
//! cluster mode, turned into one gauge family per fact an operator alerts
//! on — each worker's state, slots, sessions, heartbeat age, whether it
//! pulls orders, each credential group's login — and whether the registry
//! could be read at all. [`view`] is pure (the read time passed in);
//! [`render`] adds the families to the exposition.

use std::time::{Duration, SystemTime};

use agent_state_cluster::workers::{
    WorkerEntry, WorkerState, WorkerTiming, since_stored, worker_state,
};

use super::exposition::Exposition;

/// The registry as last read.
#[derive(Debug, Clone, PartialEq)]
pub struct Fleet {
    /// Every worker with a record, by host name; empty when `error`.
    pub workers: Vec<WorkerView>,
    /// Why the last read failed (the cluster unreachable), if it did.
    pub error: Option<String>,
}

/// One worker, as its metrics say it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerView {
    pub host: String,
    pub state: WorkerState,
    pub slots: usize,
    pub sessions: usize,
    pub heartbeat_age: Duration,
    /// It takes orders: alive, not short of room, some group working.
    pub pulling: bool,
    /// Each credential group it serves, and whether its login works.
    pub groups: Vec<(String, bool)>,
}

/// Pure: the registry's entries as read at `now` (the reader's clock).
pub fn view(entries: &[WorkerEntry], now: SystemTime) -> Vec<WorkerView> {
    entries
        .iter()
        .map(|entry| {
            let r = &entry.record;
            let age = since_stored(entry.stored_at, now);
            let timing =
                WorkerTiming::beating_every(Duration::from_millis(r.heartbeat_every_ms.max(1)));
            let state = worker_state(&timing, r, age, entry.drain_requested);
            let groups: Vec<(String, bool)> = r
                .credentials
                .iter()
                .map(|c| (c.group.clone(), c.working))
                .collect();
            WorkerView {
                host: r.host.clone(),
                state,
                slots: r.slots,
                sessions: r.sessions.len(),
                heartbeat_age: age,
                pulling: state == WorkerState::Alive
                    && r.not_pulling.is_none()
                    && groups.iter().any(|(_, ok)| *ok),
                groups,
            }
        })
        .collect()
}

const STATES: [WorkerState; 5] = [
    WorkerState::Alive,
    WorkerState::Draining,
    WorkerState::Drained,
    WorkerState::Stopped,
    WorkerState::Lost,
];

/// The worker families, from `fleet` (`None`: not read yet).
pub fn render(e: &mut Exposition, fleet: Option<&Fleet>) {
    let Some(fleet) = fleet else {
        return;
    };
    e.gauge(
        "agent_state_cluster_registry_up",
        "Whether the controller's last read of the worker registry succeeded (cluster mode).",
        vec![],
        if fleet.error.is_none() { 1.0 } else { 0.0 },
    );
    for w in &fleet.workers {
        let host = || vec![("host", w.host.clone())];
        for state in STATES {
            e.gauge(
                "agent_state_worker_state",
                "Each worker's state (1 for the current one): alive, draining, drained, stopped, lost.",
                vec![
                    ("host", w.host.clone()),
                    ("state", state.as_str().to_string()),
                ],
                if w.state == state { 1.0 } else { 0.0 },
            );
        }
        e.gauge(
            "agent_state_worker_slots",
            "Sessions each worker runs at most at once.",
            host(),
            w.slots as f64,
        );
        e.gauge(
            "agent_state_worker_sessions",
            "Sessions each worker runs now, as its last heartbeat says.",
            host(),
            w.sessions as f64,
        );
        e.gauge(
            "agent_state_worker_heartbeat_age_seconds",
            "How long ago each worker's record was last written (lost after four missed heartbeats).",
            host(),
            w.heartbeat_age.as_secs_f64(),
        );
        e.gauge(
            "agent_state_worker_pulling",
            "Whether each worker takes orders (alive, room enough, a credential group working).",
            host(),
            if w.pulling { 1.0 } else { 0.0 },
        );
        for (group, ok) in &w.groups {
            e.gauge(
                "agent_state_worker_credential_working",
                "Whether each worker's login for each credential group works.",
                vec![("host", w.host.clone()), ("group", group.clone())],
                if *ok { 1.0 } else { 0.0 },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_state_cluster::workers::{CredentialState, RunningSession, WorkerRecord};
    use std::time::UNIX_EPOCH;

    fn entry(host: &str, stored_secs: u64, f: impl FnOnce(&mut WorkerRecord)) -> WorkerEntry {
        let mut record = WorkerRecord {
            host: host.into(),
            version: "0.1.0".into(),
            slots: 4,
            sessions: vec![RunningSession {
                session_id: "rio_20261127-100000".into(),
                agent: "rio".into(),
                started_ms: 0,
            }],
            credentials: vec![
                CredentialState {
                    group: "default".into(),
                    working: true,
                    detail: None,
                },
                CredentialState {
                    group: "team-b".into(),
                    working: false,
                    detail: Some("not logged in".into()),
                },
            ],
            drained: false,
            stopped: false,
            not_pulling: None,
            heartbeat_ms: 0,
            heartbeat_every_ms: 5000,
        };
        f(&mut record);
        WorkerEntry {
            record,
            stored_at: UNIX_EPOCH + Duration::from_secs(stored_secs),
            revision: 1,
            drain_requested: false,
        }
    }

    #[test]
    fn each_worker_reads_as_its_metrics_say() {
        let now = UNIX_EPOCH + Duration::from_secs(1000);
        let entries = [
            entry("w1", 998, |_| {}),
            entry("w2", 900, |_| {}),
            entry("w3", 999, |r| r.not_pulling = Some("disk".into())),
            entry("w4", 999, |r| r.credentials[0].working = false),
            entry("w5", 999, |r| r.drained = true),
        ];
        let got: Vec<(String, WorkerState, bool, u64)> = view(&entries, now)
            .into_iter()
            .map(|w| (w.host, w.state, w.pulling, w.heartbeat_age.as_secs()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("w1".into(), WorkerState::Alive, true, 2),
                ("w2".into(), WorkerState::Lost, false, 100),
                ("w3".into(), WorkerState::Alive, false, 1),
                ("w4".into(), WorkerState::Alive, false, 1),
                ("w5".into(), WorkerState::Draining, false, 1),
            ]
        );
        let mut e = Exposition::new();
        render(
            &mut e,
            Some(&Fleet {
                workers: view(&entries[..1], now),
                error: None,
            }),
        );
        let text = e.render();
        for line in [
            "agent_state_cluster_registry_up 1",
            "agent_state_worker_state{host=\"w1\",state=\"alive\"} 1",
            "agent_state_worker_state{host=\"w1\",state=\"lost\"} 0",
            "agent_state_worker_slots{host=\"w1\"} 4",
            "agent_state_worker_sessions{host=\"w1\"} 1",
            "agent_state_worker_heartbeat_age_seconds{host=\"w1\"} 2",
            "agent_state_worker_pulling{host=\"w1\"} 1",
            "agent_state_worker_credential_working{host=\"w1\",group=\"team-b\"} 0",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
        let mut e = Exposition::new();
        render(
            &mut e,
            Some(&Fleet {
                workers: vec![],
                error: Some("no answer".into()),
            }),
        );
        assert!(e.render().contains("agent_state_cluster_registry_up 0"));
    }
}
