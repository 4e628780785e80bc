//! The human mailbox as a workflow (issue 14): `inbox show` prints a whole
//! message, `inbox ack` moves handled ones to processed/ (journaled),
//! `inbox redeliver` brings a rejected one back once it is valid, and
//! `status` counts the escalations a human has not acknowledged.

use crate::support::*;
use std::time::{Duration, SystemTime};

fn age(path: &std::path::Path, secs: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(secs))
        .unwrap();
}

#[test]
fn a_human_reads_acknowledges_and_the_count_of_escalations_follows() {
    let env = Env::standard();
    env.ok(&["bootstrap"]);
    // What the daemon sends when it escalates: a high-priority flag that
    // refers to the session; and an ordinary note.
    let escalation = env.send(
        "rio",
        "marcus",
        &[
            "--type",
            "flag",
            "--priority",
            "high",
            "--source-ref",
            "agent-state/session/20261124-220000",
            "--body",
            "rio failed three times in a row:\nthe session command exited with status 1",
        ],
    );
    let note = env.send("theseus", "marcus", &["--body", "fyi"]);
    let status = env.ok(&["status"]);
    assert!(
        status.contains("marcus: 1 escalation(s) not acknowledged"),
        "{status}"
    );
    let json: serde_json::Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let marcus = json
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["agent"] == "marcus")
        .unwrap();
    assert_eq!(marcus["escalations_waiting"], 1);

    let shown = env.ok(&["inbox", "show", "marcus", &escalation]);
    for expected in [
        &format!("Message:    {escalation}"),
        "Where:      waiting",
        "From:       rio",
        "Type:       flag (high priority)",
        "Reference:  agent-state/session/20261124-220000",
        "rio failed three times in a row:\nthe session command exited with status 1",
    ] {
        assert!(shown.contains(expected), "{expected:?} in:\n{shown}");
    }
    let raw = env.ok(&[
        "inbox",
        "show",
        "marcus",
        &format!("{escalation}.json"),
        "--json",
    ]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&raw).unwrap()["id"],
        escalation.as_str()
    );

    env.ok(&["inbox", "ack", "marcus", &escalation]);
    assert_eq!(env.waiting("marcus"), vec![format!("{note}.json")]);
    assert!(
        env.agent("marcus")
            .join(format!("inbox/processed/{escalation}.json"))
            .exists()
    );
    let acked = env.events("marcus", "message_acknowledged");
    assert_eq!(acked.len(), 1);
    assert_eq!(acked[0]["message_id"], escalation.as_str());
    assert!(
        !env.ok(&["status"])
            .contains("escalation(s) not acknowledged")
    );
    // Shown where it went; acknowledged twice is refused.
    assert!(
        env.ok(&["inbox", "show", "marcus", &escalation])
            .contains("Where:      processed")
    );
    let again = env.fails(&["inbox", "ack", "marcus", &escalation], 65);
    assert!(again.contains("is processed, not waiting"), "{again}");
    let unknown = env.fails(&["inbox", "show", "marcus", "no-such-message"], 66);
    assert!(
        unknown.contains("no message \"no-such-message\""),
        "{unknown}"
    );
}

#[test]
fn a_rejected_message_is_redelivered_once_it_is_valid() {
    let env = Env::standard();
    env.ok(&["bootstrap"]);
    let inbox = env.agent("rio").join("inbox");
    let file = inbox.join("typo.json");
    std::fs::write(&file, "{\"from\": \"marcus\", \"subject\": \"half\"").unwrap();
    age(&file, 3600);
    // A session's claim judges the settled file and rejects it.
    let id = env.ok(&["session", "begin", "rio"]).trim().to_string();
    env.ok(&["session", "end", "rio", "--session", &id]);
    let rejected = env.agent("rio").join("inbox/rejected");
    assert!(rejected.join("typo.json").exists());
    assert!(rejected.join("typo.json.reason.json").exists());
    // Still broken: refused, nothing moves.
    let said = env.fails(&["inbox", "redeliver", "rio", "typo"], 65);
    assert!(said.contains("still not a valid message"), "{said}");
    assert!(rejected.join("typo.json").exists());
    // Mended where it lies: back in the inbox, its reason gone, journaled.
    std::fs::write(
        rejected.join("typo.json"),
        "{\"from\": \"marcus\", \"subject\": \"whole now\"}\n",
    )
    .unwrap();
    let said = env.ok(&["inbox", "redeliver", "rio", "typo.json"]);
    assert!(said.contains("is back in the inbox as typo.json"), "{said}");
    assert!(inbox.join("typo.json").exists());
    assert!(!rejected.join("typo.json.reason.json").exists());
    let retried = env.events("rio", "message_retried");
    assert!(
        retried
            .iter()
            .any(|e| e["reason"].as_str().unwrap_or("").contains("by hand")),
        "{retried:#?}"
    );
    let listing = env.ok(&["inbox", "rio"]);
    assert!(listing.contains("whole now"), "{listing}");
}
