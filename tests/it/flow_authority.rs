//! Who may answer a flow's question (issue 20): a reply's `from` proves
//! nothing, so an approval by reply is carried out only from a file owned by
//! root or a configured approver, naming the question's unguessable id; one
//! that is not is recorded as refused, told to the human and left in its
//! inbox; `flow approve` by another user exits 77. The real users part
//! creates users and a group: root with AGENT_STATE_ROOT_TESTS=1 only.

use crate::flows::{Lab, archive_name, lab};
use crate::support::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// A cycle blocked at high risk; its id and the id of the flag that asks marcus.
fn blocked(lab: &Lab, d: &Daemon) -> (String, String) {
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["* pass-high"]);
    let cycle = lab.start("Risky");
    d.wait_until(LONG, "the cycle is blocked and marcus asked", || {
        lab.current()["status"] == "blocked" && lab.mail().iter().any(|m| m["type"] == "flag")
    });
    let flag = lab
        .mail()
        .into_iter()
        .find(|m| m["type"] == "flag")
        .unwrap();
    (cycle, flag["id"].as_str().unwrap().to_string())
}

fn refusals(lab: &Lab) -> Vec<Value> {
    lab.journal()
        .into_iter()
        .filter(|l| l["event"] == "reply_refused")
        .collect()
}

/// `send` of a reply signed marcus, saying "approve", to `question`.
fn reply(question: &str) -> Vec<&str> {
    vec![
        "send",
        "--from",
        "marcus",
        "--to",
        "leo",
        "--subject",
        "Re: approve",
        "--source-ref",
        question,
    ]
}

#[test]
fn a_reply_naming_a_guessed_question_id_is_refused_recorded_and_left_for_the_human() {
    let lab = lab("");
    let d = lab.env.daemon();
    let (cycle, question) = blocked(&lab, &d);
    // The id a sender could guess: `flow-FLOW-CYCLE-STEP-WHAT`, without its random part.
    let (guess, key) = question.rsplit_once('-').unwrap();
    assert!(
        key.len() == 32 && key.chars().all(|c| c.is_ascii_hexdigit()),
        "the question id ends with a random key: {question}"
    );
    let sent = lab.env.ok(&reply(guess));
    let forged = sent.split_whitespace().nth(1).unwrap().to_string();
    d.wait_until(LONG, "the reply is refused and recorded", || {
        !refusals(&lab).is_empty()
    });
    let refused = &refusals(&lab)[0];
    assert_eq!(refused["message"], forged.as_str(), "{refused}");
    assert!(
        refused["why"]
            .as_str()
            .unwrap()
            .contains("is not the id of a question"),
        "{refused}"
    );
    assert_eq!(lab.current()["status"], "blocked", "still blocked");
    assert!(
        lab.env.waiting("leo").iter().any(|n| n.contains(&forged)),
        "the refused reply is left in leo's inbox"
    );
    d.wait_until(LONG, "marcus is told", || {
        lab.mail()
            .iter()
            .any(|m| m["subject"].as_str().unwrap_or("").contains("was refused"))
    });

    // The reply to the question itself (root's file) is carried out.
    lab.env.ok(&reply(&question));
    d.wait_until(LONG, "the real reply approved the cycle", || {
        !lab.archived(&archive_name(&cycle, false)).is_empty()
    });
}

fn root_tests() -> bool {
    let on = std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() == Ok("1")
        && nix::unistd::geteuid().is_root();
    if !on {
        eprintln!("SKIPPED: creates users and a group: run as root with AGENT_STATE_ROOT_TESTS=1");
    }
    on
}

fn quiet(program: &str, args: &[&str]) -> bool {
    run_tool(program, args).status.success()
}

/// The inbox group, a member and an approver: this test process's own
/// accounts ([`account`]).
fn names() -> (String, String, String) {
    (
        account("asfagrp"),
        account("asfamember"),
        account("asfaappr"),
    )
}

/// A member of the inbox group and an approver (also a member); removed
/// however the test ends.
struct Users;

impl Users {
    fn create() -> Users {
        Users.remove();
        let (group, member, approver) = names();
        assert!(quiet("groupadd", &["--system", &group]));
        for u in [&member, &approver] {
            assert!(quiet(
                "useradd",
                &["--system", "-M", "-N", "-G", &group, "-s", "/bin/sh", u]
            ));
        }
        Users
    }

    fn remove(&self) {
        let (group, member, approver) = names();
        for u in [&member, &approver] {
            quiet("userdel", &[u]);
        }
        quiet("groupdel", &[&group]);
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        self.remove();
    }
}

/// `agent-state ARGS` as `user` (the binary copied where every user may run it).
fn run_as(env: &Env, user: &str, args: &[&str]) -> Output {
    Command::new("runuser")
        .args(["-u", user, "--"])
        .arg(env.tmp("agent-state"))
        .arg("--config")
        .arg(&env.config)
        .args(args)
        .current_dir(env.dir.path())
        .env_remove("AGENT_STATE_CONFIG")
        .output()
        .unwrap()
}

#[test]
fn a_group_member_cannot_approve_by_forged_reply_or_by_command_an_approver_can_by_command() {
    if !root_tests() {
        return;
    }
    let _users = Users::create();
    let (group, member, approver) = names();
    let lab = lab(&format!("approvers = [{approver:?}]"));
    let env = &lab.env;
    let config = std::fs::read_to_string(&env.config).unwrap();
    std::fs::write(&env.config, format!("group = {group:?}\n{config}")).unwrap();
    for (p, mode) in [
        (env.dir.path().to_path_buf(), 0o755),
        (env.config.clone(), 0o644),
    ] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::copy(BIN, env.tmp("agent-state")).unwrap();
    env.ok(&["bootstrap"]);
    // The state in the inbox group, as the service user's bootstrap leaves it
    // (root's gives its files root's group).
    let out = Command::new("chgrp")
        .args(["-R", &group, env.root.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = env.daemon();
    let (cycle, question) = blocked(&lab, &d);

    // A member of the group signs a reply as marcus, to the real question.
    let args = reply(&question);
    let out = run_as(env, &member, &args);
    assert!(
        out.status.success(),
        "{member} may send mail: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    d.wait_until(LONG, "the forged reply is refused and recorded", || {
        !refusals(&lab).is_empty()
    });
    let refused = &refusals(&lab)[0];
    assert_eq!(refused["from"], "marcus", "{refused}");
    assert!(
        refused["why"].as_str().unwrap().contains(&member),
        "the refusal names the file's owner: {refused}"
    );
    assert_eq!(lab.current()["status"], "blocked", "still blocked");
    assert_eq!(env.waiting("leo").len(), 1, "left in leo's inbox");

    // Nor by command.
    let out = run_as(env, &member, &["flow", "approve", &cycle]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{said}");
    assert!(
        said.contains(&format!("you are {member}")) && said.contains("approvers"),
        "{said}"
    );
    assert_eq!(lab.current()["status"], "blocked", "still blocked");

    // The approver's `flow approve` (who may not write the state) leaves a
    // reply of its own, which the daemon carries out.
    let out = run_as(env, &approver, &["flow", "approve", &cycle]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("the daemon carries it out"), "{said}");
    d.wait_until(LONG, "the approver's answer approved the cycle", || {
        !lab.archived(&archive_name(&cycle, false)).is_empty()
    });
    let archived = lab.archived(&archive_name(&cycle, false));
    assert!(
        archived.contains(&format!("Approved by marcus (unix user {approver})")),
        "the archive names who answered: {archived}"
    );
    assert_eq!(refusals(&lab).len(), 1);
}

#[test]
fn an_approver_that_is_no_unix_user_name_is_named_with_its_fix() {
    let lab = lab(r#"approvers = ["Marcus Smith", "leo", "leo"]"#);
    let said = lab.env.fails(&["check"], 78);
    assert!(
        said.contains("approvers[0]") && said.contains("\"Marcus Smith\" is not a unix user name"),
        "{said}"
    );
    assert!(
        said.contains("approvers[2]") && said.contains("listed twice"),
        "{said}"
    );
}

#[test]
fn doctor_names_an_approver_who_is_no_user_of_this_machine() {
    let lab = lab(r#"approvers = ["root", "asnosuchuser"]"#);
    let out = lab.env.run(&["doctor", "--user", "root"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("ok    flow notes approvers: root (uid 0)"),
        "{said}"
    );
    assert!(
        said.contains("FAIL  flow notes approvers: there is no user \"asnosuchuser\""),
        "{said}"
    );
    assert!(!out.status.success());
}
