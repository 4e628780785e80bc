//! `agent-state worker` checks what it can run before it pulls (issue 24):
//! a credential group whose login check (`[credential.NAME] check`) fails
//! is shown not working in `workers` and none of its orders is pulled
//! until the check passes. Through the real binary against a real
//! three-server NATS JetStream cluster; gated like `cluster_worker`
//! (`AGENT_STATE_NATS_TESTS=1`, the server from AGENT_STATE_NATS_SERVER or
//! PATH), else SKIPPED.

use crate::support::*;
use std::path::Path;
use std::time::Duration;

use agent_state_cluster::{Outcome, Output, SessionEnd, SessionOrder};
use serde_json::Value;

use crate::cluster_worker::{Bare, Worker, queued, wait_end, wait_listed};

/// The state of `group` in a `workers --json` entry.
fn credential<'a>(w: &'a Value, group: &str) -> &'a Value {
    w["credentials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["group"] == group)
        .unwrap_or_else(|| panic!("no group {group} in {w}"))
}

fn order(id: &str, agent: &str, group: &str, script: &Path, cwd: &Path) -> SessionOrder {
    SessionOrder {
        session_id: id.into(),
        agent: agent.into(),
        credential_group: group.into(),
        spec: serde_json::json!({
            "command": script.to_str().unwrap(),
            "cwd": cwd.to_str().unwrap(),
            "timeout_secs": 120,
        }),
    }
}

fn ended(rt: &tokio::runtime::Runtime, output: &Output, id: &str) -> Option<SessionEnd> {
    rt.block_on(output.ended(id)).unwrap()
}

#[test]
fn a_group_whose_check_fails_is_not_pulled_until_the_check_passes() {
    let Some(bare) = Bare::start("cluster_worker_checks") else {
        return;
    };
    let Bare {
        servers,
        rt,
        cluster,
        dispatch,
        output,
        ..
    } = &bare;

    // Team's login check passes once the file `logged-in` exists.
    let env = Env::with_config("");
    let check = env.script(
        "check.sh",
        r#"[ -e "$(dirname "$0")/logged-in" ] && exit 0
echo "team is not logged in" >&2
exit 1"#,
    );
    env.set_config(&format!(
        "[cluster]\nurls = {:?}\nreplicas = 3\n\n[credential.team]\ncheck = [{:?}]\ncheck_every = \"10s\"\n",
        servers.urls(),
        check.to_str().unwrap()
    ));
    let work = env.tmp("work");
    std::fs::create_dir(&work).unwrap();
    let session = env.script("session.sh", r#"echo "$AGENT_STATE_SESSION_ID ran""#);

    let worker = Worker::start_with(&env, "w1", &["--credential-group", "team,default"]);
    worker.wait_log("credential group team: its check failed: team is not logged in; pulling none of its orders");
    // Before its first check answers the group counts as not working too;
    // wait for the record that says the check failed.
    let w = wait_listed(&env, &worker, "team's check failed", |w| {
        w["state"] == "alive"
            && credential(w, "team")["detail"] == "its check failed: team is not logged in"
    });
    assert_eq!(credential(&w, "team")["working"], false, "{w}");
    assert_eq!(credential(&w, "default")["working"], true, "{w}");
    let table = env.ok(&["workers"]);
    assert!(table.contains("team(not working)"), "{table}");

    // An order of each group: default's runs, team's stays in the queue.
    rt.block_on(dispatch.publish(&order("s-team", "rio", "team", &session, &work)))
        .unwrap();
    rt.block_on(dispatch.publish(&order("s-free", "ada", "default", &session, &work)))
        .unwrap();
    let end = wait_end(rt, output, "s-free", &worker);
    assert_eq!(
        end.outcome,
        Outcome::Exited {
            code: Some(0),
            signal: None
        }
    );
    // The default group's order was pulled and acked after team's was
    // published, in the same stream: team's is the one left, unpulled.
    let ok = poll_until(Duration::from_secs(30), || {
        queued(rt, cluster, dispatch) == 1
    });
    assert!(ok, "the default order was not acked\n{}", worker.log());
    assert!(ended(rt, output, "s-team").is_none());
    assert!(!worker.log().contains("s-team"), "{}", worker.log());
    // Still unpulled after several more pull rounds (each waits 2 s). The
    // record says the default order's slot is free once its heartbeat
    // after the end is in (a busy machine delays it).
    wait_listed(&env, &worker, "team still not working, no slot used", |w| {
        credential(w, "team")["working"] == false && w["slots_used"] == 0
    });
    assert_eq!(queued(rt, cluster, dispatch), 1);
    assert_eq!(
        worker
            .log()
            .matches("credential group team: its check failed")
            .count(),
        1,
        "said once:\n{}",
        worker.log()
    );

    // Logged in: the next check (within check_every, 10 s) passes and the
    // order runs.
    std::fs::write(env.tmp("logged-in"), "").unwrap();
    worker.wait_log("credential group team: its check passed; pulling its orders");
    let end = wait_end(rt, output, "s-team", &worker);
    assert_eq!(
        end.outcome,
        Outcome::Exited {
            code: Some(0),
            signal: None
        }
    );
    wait_listed(&env, &worker, "team working", |w| {
        credential(w, "team")["working"] == true && credential(w, "team").get("detail").is_none()
    });
}

#[test]
fn a_worker_short_of_disk_pulls_nothing_and_says_why() {
    let Some(bare) = Bare::start("cluster_worker_checks") else {
        return;
    };
    let Bare {
        rt,
        cluster,
        dispatch,
        ..
    } = &bare;
    let env = bare.env();
    let work = env.tmp("work");
    std::fs::create_dir(&work).unwrap();
    let session = env.script("session.sh", r#"echo "$AGENT_STATE_SESSION_ID ran""#);

    // No disk has a million TiB free.
    let worker = Worker::start_with(
        &env,
        "w1",
        &[
            "--work-dir",
            work.to_str().unwrap(),
            "--min-free-disk",
            "1099511627776MiB",
        ],
    );
    let why = format!(
        "MiB free on {}, below --min-free-disk 1099511627776 MiB",
        work.display()
    );
    worker.wait_log(&why);
    let w = wait_listed(&env, &worker, "why it is not pulling", |w| {
        w["not_pulling"].as_str().is_some_and(|t| t.contains(&why))
    });
    assert_eq!(w["state"], "alive", "{w}");
    let table = env.ok(&["workers"]);
    assert!(table.contains("(pulling no order: "), "{table}");

    // An id no other line of the log can hold (a temp name can: `hooks-1…`).
    rt.block_on(dispatch.publish(&order("no-room-order", "rio", "default", &session, &work)))
        .unwrap();
    // Several pull rounds later (each heartbeat is 300 ms, the room is
    // looked at every 5 s): still queued, never started, said once.
    let beats = w["heartbeat_at"].clone();
    wait_listed(&env, &worker, "a later heartbeat", |w| {
        w["heartbeat_at"] != beats
    });
    let ok = poll_until(Duration::from_secs(7), || {
        worker.log().matches(&why).count() > 1
    });
    assert!(!ok, "said once:\n{}", worker.log());
    assert_eq!(queued(rt, cluster, dispatch), 1, "{}", worker.log());
    assert!(!worker.log().contains("no-room-order"), "{}", worker.log());
}

#[test]
fn hostile_orders_end_not_started_naming_the_field() {
    let Some(bare) = Bare::start("cluster_worker_checks") else {
        return;
    };
    let Bare {
        rt,
        cluster,
        dispatch,
        output,
        ..
    } = &bare;
    let env = bare.env();
    let work = env.tmp("work");
    std::fs::create_dir(&work).unwrap();
    let link = env.tmp("link");
    std::os::unix::fs::symlink(&work, &link).unwrap();
    // The session would leave this file behind if it ever ran.
    let session = env.script(
        "session.sh",
        r#"touch "$(dirname "$0")/ran-$AGENT_STATE_SESSION_ID""#,
    );
    let worker = Worker::start(&env, "w1");

    let mut nul = order("s-nul", "ada", "default", &session, &work);
    nul.spec["args"] = serde_json::json!(["fine", "a\0b"]);
    let mut big = order("s-big", "bo", "default", &session, &work);
    big.spec["env"] = serde_json::json!({ "BIG": "v".repeat(200 * 1024) });
    let cases = [
        (
            order("s-link", "rio", "default", &session, &link),
            format!(
                "the order's spec: `cwd` {}: is a symbolic link; give the directory itself",
                link.display()
            ),
        ),
        (
            order("s-file", "cy", "default", &session, &session),
            format!(
                "the order's spec: `cwd` {}: is not a directory",
                session.display()
            ),
        ),
        (
            nul,
            "the order's spec: `args[1]` contains a NUL byte, which no program can be given".into(),
        ),
        (
            big,
            "the order's spec: `env.BIG` is 204800 bytes, more than 131071".into(),
        ),
    ];
    for (order, _) in &cases {
        rt.block_on(dispatch.publish(order)).unwrap();
    }
    for (order, detail) in &cases {
        let end = wait_end(rt, output, &order.session_id, &worker);
        assert_eq!(
            end.outcome,
            Outcome::NotStarted {
                detail: detail.clone()
            },
            "{}",
            worker.log()
        );
        assert!(!env.tmp(&format!("ran-{}", order.session_id)).exists());
    }
    let ok = poll_until(Duration::from_secs(30), || {
        queued(rt, cluster, dispatch) == 0
    });
    assert!(ok, "the refused orders are acked\n{}", worker.log());
}
