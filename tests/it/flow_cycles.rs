//! Flow cycles (issue 22, seed 004) through the real daemon, with the
//! role-playing agents of `flows`: what `flow status` says of a cycle the
//! risk gate approved, and the human's mailbox after `flow approve`.

use crate::flows::{archive_name, lab};
use serde_json::Value;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// marcus's waiting messages of one type.
fn waiting(lab: &crate::flows::Lab, kind: &str) -> Vec<Value> {
    lab.mail()
        .into_iter()
        .filter(|m| m["type"] == kind)
        .collect()
}

#[test]
fn flow_status_says_a_low_risk_pass_was_approved_automatically() {
    let lab = lab("");
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["* pass-low"]);
    let d = lab.env.daemon();
    let cycle = lab.start("Add three notes");
    d.wait_until(LONG, "the cycle is approved and journaled", || {
        !lab.archived(&archive_name(&cycle, false)).is_empty()
            && lab.current().is_null()
            && lab.journal().iter().any(|e| e["event"] == "approved")
    });
    let status = lab.env.ok(&["flow", "status"]);
    assert!(
        status.contains(&format!("last: {cycle} approved"))
            && status.contains("approved automatically: low risk"),
        "{status}"
    );
    // Nobody was asked, so nothing waits for the human.
    assert!(waiting(&lab, "question").is_empty(), "{:#?}", lab.mail());
}

#[test]
fn flow_approve_clears_the_question_it_answered_from_the_human_mailbox() {
    let lab = lab("");
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["* pass-medium"]);
    let d = lab.env.daemon();
    let cycle = lab.start("Medium risk");
    d.wait_until(LONG, "the human is asked to approve", || {
        lab.current()["status"] == "awaiting_approval" && !waiting(&lab, "question").is_empty()
    });
    let asked = waiting(&lab, "question");
    let id = asked[0]["id"].as_str().unwrap().to_string();
    let out = lab.env.run(&["flow", "approve", &cycle]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains(&format!("question {id} answered")), "{said}");
    assert!(waiting(&lab, "question").is_empty(), "{:#?}", lab.mail());
    let marcus = lab.env.agent("marcus");
    assert!(marcus.join(format!("inbox/processed/{id}.json")).exists());
    assert!(
        lab.env
            .journal("marcus")
            .iter()
            .any(|e| e["event"] == "message_acknowledged" && e["message_id"] == id.as_str()),
        "{:#?}",
        lab.env.journal("marcus")
    );
    let status = lab.env.ok(&["flow", "status"]);
    assert!(
        status.contains(&format!("last: {cycle} approved")),
        "{status}"
    );

    // A blocked cycle's flag is the question a human's approval answers too.
    lab.script("leo", &["* pass-high"]);
    let second = lab.start("High risk");
    d.wait_until(LONG, "the second cycle is blocked and escalated", || {
        lab.current()["status"] == "blocked" && !waiting(&lab, "flag").is_empty()
    });
    lab.env.ok(&["flow", "approve", &second]);
    assert!(waiting(&lab, "flag").is_empty(), "{:#?}", lab.mail());
}
