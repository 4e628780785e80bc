use super::*;
use agent_state_cluster::LeaseValue;
use agent_state_cluster::{LeaseRecord, Outcome, SessionEnd};

fn end(outcome: Outcome, revision: u64) -> SessionEnd {
    SessionEnd {
        session_id: "s1".into(),
        agent: "rio".into(),
        host: "w1".into(),
        outcome,
        started_ms: 0,
        ended_ms: 1,
        last_chunk: 0,
        lease_revision: revision,
        workspace: None,
    }
}

fn lease(session: &str, revision: u64) -> LeaseRecord {
    LeaseRecord {
        value: LeaseValue {
            holder: "w1".into(),
            session: session.into(),
            renewal: 0,
            run: String::new(),
        },
        revision,
    }
}

/// Each worker outcome, accepted from the holder, and the ending it is
/// recorded as.
#[test]
fn outcomes_map_to_endings() {
    let exited = |code, signal| Outcome::Exited { code, signal };
    let lost = |text: &str| Ending::Lost {
        reason: text.to_string(),
    };
    let table: Vec<(Outcome, Ending)> = vec![
        (exited(Some(0), None), Ending::Exited { code: 0 }),
        (exited(Some(3), None), Ending::Exited { code: 3 }),
        (exited(None, Some(9)), Ending::Signaled { signal: 9 }),
        (exited(None, None), Ending::Exited { code: -1 }),
        (Outcome::TimedOut, Ending::TimedOut),
        // A stall the worker ended: the verdict of a local stall stop.
        (
            Outcome::Stalled {
                silent_for_secs: 90,
            },
            Ending::Stalled {
                silent_for: Duration::from_secs(90),
            },
        ),
        (
            Outcome::WorkerRestarted,
            lost(
                "interrupted: worker restarted: w1 restarted while the session ran and killed what was left of it",
            ),
        ),
        (
            Outcome::SpoolFull {
                limit_bytes: 256 << 20,
            },
            lost(
                "interrupted: output not stored: w1 ended the session when its output spool passed 256 MiB while NATS stored none of it",
            ),
        ),
        (
            Outcome::LeaseLost {
                detail: "fenced".into(),
            },
            lost("interrupted: worker lost: w1 lost the session's lease: fenced"),
        ),
        (
            Outcome::WorkerStopped,
            lost("interrupted: worker lost: w1 was stopped and ended the session (SIGTERM)"),
        ),
        (
            Outcome::NotStarted {
                detail: "cannot start x: No such file".into(),
            },
            Ending::SpawnFailed {
                reason: "not started on w1: cannot start x: No such file".into(),
                kind: SpawnFailure::Other,
            },
        ),
        // A newer worker's kind of end: recorded all the same.
        (
            Outcome::Unknown,
            lost(
                "interrupted: w1 ended the session in a way this controller does not know (a newer worker's end): upgrade the controller to the workers' version",
            ),
        ),
    ];
    for (outcome, want) in table {
        assert_eq!(
            ending_of(&end(outcome.clone(), 5), true, Some(5)),
            want,
            "{outcome:?}"
        );
    }
}

#[test]
fn an_end_not_from_the_holder_is_a_lost_worker() {
    let e = ending_of(
        &end(
            Outcome::Exited {
                code: Some(0),
                signal: None,
            },
            5,
        ),
        false,
        Some(7),
    );
    assert_eq!(
        e.to_string(),
        "interrupted: worker lost: the end from w1 carries lease revision 5, but the lease is at revision 7"
    );
    let e = ending_of(&end(Outcome::TimedOut, 0), false, None);
    assert!(e.to_string().ends_with("but the lease is gone"), "{e}");
}

/// The end a controller stored itself when it fenced a lost worker's
/// session, read back by a restarted controller that adopts the session:
/// accepted (the lease is gone, its revision is the one fenced) and
/// recorded with the reason the first controller gave, not as a worker's.
#[test]
fn the_controllers_own_end_is_recorded_with_its_reason() {
    let reason =
        "interrupted: worker lost: w1 did not renew the lease run/rio for 5m; the lease was fenced";
    let stored = SessionEnd {
        host: CONTROLLER_HOST.into(),
        ..end(
            Outcome::LeaseLost {
                detail: reason.into(),
            },
            7,
        )
    };
    assert!(end_accepted(&stored, None, Some(7)));
    assert_eq!(
        ending_of(&stored, true, None),
        Ending::Lost {
            reason: reason.into()
        }
    );
}

/// (the end's revision, its outcome started?, the lease now, the revision
/// last seen, accepted?)
#[test]
fn which_ends_are_accepted() {
    let ran = Outcome::Exited {
        code: Some(0),
        signal: None,
    };
    let never = Outcome::NotStarted {
        detail: "bad spec".into(),
    };
    type Row<'a> = (u64, &'a Outcome, Option<LeaseRecord>, Option<u64>, bool);
    let table: Vec<Row> = vec![
        // The holder's end, its lease still there.
        (5, &ran, Some(lease("s1", 5)), Some(5), true),
        // Released by the holder after its end: as last seen, or renewed since.
        (5, &ran, None, Some(5), true),
        (6, &ran, None, Some(5), true),
        (5, &ran, None, None, true),
        // An older revision than the controller saw: a stale holder.
        (4, &ran, None, Some(5), false),
        // The lease renewed past the end's revision, or fenced (revision 0).
        (5, &ran, Some(lease("s1", 6)), Some(6), false),
        (0, &ran, None, Some(5), false),
        // Another session's lease now (the next one): the end is not its.
        (5, &ran, Some(lease("s2", 9)), Some(5), true),
        // Never started: no lease to prove anything with.
        (0, &never, None, None, true),
    ];
    for (revision, outcome, now, seen, want) in table {
        assert_eq!(
            end_accepted(&end(outcome.clone(), revision), now.as_ref(), seen),
            want,
            "end revision {revision}, {outcome:?}, lease {now:?}, seen {seen:?}"
        );
    }
}

fn spec(argv: &[&str], env: &[(&str, &str)]) -> SessionSpec {
    SessionSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        env_remove: vec![],
        cwd: "/srv/rio".into(),
        stdin: b"the prompt".to_vec(),
        log_path: "/tmp/x.log".into(),
        max_output: 1,
        iteration: 1,
        timeout: Duration::from_millis(1500),
        kill_grace: Duration::from_secs(10),
        stall_timeout: None,
        stall_action: Default::default(),
        marker: ("AGENT_STATE_RUN".into(), "1:rio:s1".into()),
        agent_stall_timeout: None,
        memory_max: None,
    }
}

#[test]
fn an_order_carries_the_spec() {
    let ids = [
        ("AGENT_STATE_AGENT", "rio"),
        ("AGENT_STATE_SESSION_ID", "20261127-101500"),
    ];
    let order = order_of(&spec(&["/bin/run", "-p", "x"], &ids), "main", None).unwrap();
    assert_eq!(order.session_id, "rio_20261127-101500");
    assert_eq!(order.agent, "rio");
    assert_eq!(order.credential_group, "main");
    let remote = agent_state_cluster::SessionSpec::from_order(&order.spec).unwrap();
    assert_eq!(remote.command, "/bin/run");
    assert_eq!(remote.args, ["-p", "x"]);
    assert_eq!(remote.cwd.as_deref(), Some("/srv/rio"));
    assert_eq!(remote.timeout_secs, Some(2));
    assert_eq!(remote.kill_grace_secs, Some(10));
    assert_eq!(remote.stdin.as_deref(), Some("the prompt"));
    assert_eq!(remote.env["AGENT_STATE_RUN"], "1:rio:s1");
    // No stall timeout, no memory limit: none in the order (an order an
    // older worker still reads).
    assert_eq!(
        (
            remote.stall_timeout_secs,
            remote.stall_action,
            remote.memory_max
        ),
        (None, None, None)
    );
    assert!(!order.spec.to_string().contains("stall"), "{}", order.spec);
    // The agent's stall timeout and action, and its memory limit, go to
    // the worker.
    let mut stalling = spec(&["/bin/run"], &ids);
    stalling.agent_stall_timeout = Some(Duration::from_millis(1500));
    stalling.stall_action = runner::StallAction::Stop;
    stalling.memory_max = Some(1 << 30);
    let remote = agent_state_cluster::SessionSpec::from_order(
        &order_of(&stalling, "main", None).unwrap().spec,
    )
    .unwrap();
    assert_eq!(
        (
            remote.stall_timeout_secs,
            remote.stall_action,
            remote.memory_max
        ),
        (
            Some(2),
            Some(agent_state_cluster::StallAction::Stop),
            Some(1 << 30)
        )
    );

    let mut second = spec(&["/bin/run"], &ids);
    second.iteration = 2;
    assert_eq!(
        order_of(&second, "main", None).unwrap().session_id,
        "rio_20261127-101500-it2"
    );
    // Two agents' sessions begun in the same second are two orders.
    let theseus = [
        ("AGENT_STATE_AGENT", "theseus"),
        ("AGENT_STATE_SESSION_ID", "20261127-101500"),
    ];
    assert_ne!(
        order_of(&spec(&["/bin/run"], &theseus), "main", None)
            .unwrap()
            .session_id,
        order.session_id
    );

    let refused: &[(SessionSpec, &str, &str)] = &[
        (spec(&[], &ids), "main", "the session command is empty"),
        (spec(&["x"], &ids), "a.b", "the credential group \"a.b\""),
        (
            spec(&["x"], &[("AGENT_STATE_AGENT", "r.io"), ids[1]]),
            "main",
            "the agent name \"r.io\"",
        ),
        (
            spec(&["x"], &[ids[0], ids[1], ("AGENT_STATE_WORKSPACE", "/w")]),
            "main",
            "workspace",
        ),
    ];
    for (spec, group, want) in refused {
        let e = order_of(spec, group, None).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}
