//! The human mailbox as the people in the inbox group use it (issue 23):
//! a member sends as the mailbox without a warning at every send, finds a
//! message by the beginning of its id, and an acknowledgement they may not
//! make is refused before anything is touched, naming the command that can
//! make it. Real users and a group: root with AGENT_STATE_ROOT_TESTS=1.

use std::process::Output;

use crate::permissions::{World, enabled, show};

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The ids of the messages waiting in `agent`'s inbox.
fn waiting(w: &World, agent: &str) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(w.root.join(agent).join("inbox"))
        .unwrap()
        .filter_map(|e| {
            let n = e.ok()?.file_name().to_string_lossy().into_owned();
            (n.ends_with(".json") && !n.starts_with('.'))
                .then(|| n.trim_end_matches(".json").to_string())
        })
        .collect();
    ids.sort();
    ids
}

#[test]
fn a_member_of_the_inbox_group_answers_finds_and_is_told_who_acknowledges() {
    if !enabled("mailbox_people") {
        return;
    }
    let w = World::new("mbp");
    let (svc, alice) = (w.acc.svc.clone(), w.acc.alice.clone());

    // rio asks the human (as a session would, the service user).
    let asked = w.run(
        &svc,
        &[
            "send",
            "--from",
            "rio",
            "--to",
            "marcus",
            "--subject",
            "which market?",
        ],
    );
    assert!(asked.status.success(), "{}", show(&asked));
    let id = waiting(&w, "marcus")
        .pop()
        .expect("the question waits for marcus");

    // Alice answers as marcus: delivered, and no warning about marcus's
    // journal she cannot write.
    let answer = w.run(
        &alice,
        &[
            "send",
            "--from",
            "marcus",
            "--to",
            "rio",
            "--subject",
            "the second",
            "--body",
            "go",
        ],
    );
    let (out, err) = text(&answer);
    assert!(answer.status.success(), "{}", show(&answer));
    assert!(out.starts_with("sent "), "{out}");
    assert!(
        err.trim().is_empty(),
        "a person's send says nothing more: {err}"
    );
    assert_eq!(waiting(&w, "rio").len(), 1, "the answer is in rio's inbox");

    // She finds the question by the beginning of its id, as listed.
    let shown = w.run(&alice, &["inbox", "show", "marcus", &id[..8]]);
    let (out, _) = text(&shown);
    assert!(shown.status.success(), "{}", show(&shown));
    assert!(out.contains(&id) && out.contains("which market?"), "{out}");

    // Acknowledging is the service user's: refused before anything moves,
    // naming the command that can.
    let ack = w.run(&alice, &["inbox", "ack", "marcus", &id[..8]]);
    let (_, err) = text(&ack);
    assert_eq!(ack.status.code(), Some(77), "{}", show(&ack));
    assert!(
        err.contains(&format!(
            "sudo -u {svc} agent-state inbox ack marcus {}",
            &id[..8]
        )),
        "the refusal names the command that can: {err}"
    );
    assert!(!err.contains("I/O error"), "{err}");
    assert_eq!(
        waiting(&w, "marcus"),
        std::slice::from_ref(&id),
        "nothing moved"
    );

    // An ambiguous beginning is refused naming the candidates; one that
    // is too short is no id at all.
    for n in 1..=2 {
        let made = w.sh(
            &svc,
            &format!(
                r#"printf '{{"from":"rio","subject":"twin {n}"}}' > marcus/inbox/abcd000{n}-0000-4000-8000-00000000000{n}.json"#
            ),
        );
        assert!(made.status.success(), "{}", show(&made));
    }
    let amb = w.run(&alice, &["inbox", "show", "marcus", "abcd"]);
    let (_, err) = text(&amb);
    assert_eq!(amb.status.code(), Some(64), "{}", show(&amb));
    assert!(
        err.contains("beginning of 2 messages")
            && err.contains("abcd0001-")
            && err.contains("abcd0002-"),
        "{err}"
    );
    let one = w.run(&alice, &["inbox", "show", "marcus", "abcd0002"]);
    assert!(
        one.status.success() && text(&one).0.contains("twin 2"),
        "{}",
        show(&one)
    );
    let short = w.run(&alice, &["inbox", "show", "marcus", "abc"]);
    assert_eq!(
        short.status.code(),
        Some(66),
        "three characters are no id: {}",
        show(&short)
    );

    // The service user acknowledges by the same beginning.
    let ack = w.run(&svc, &["inbox", "ack", "marcus", &id[..8]]);
    assert!(ack.status.success(), "{}", show(&ack));
    assert!(!waiting(&w, "marcus").contains(&id));
    assert!(
        w.root
            .join("marcus/inbox/processed")
            .join(format!("{id}.json"))
            .exists()
    );
}
