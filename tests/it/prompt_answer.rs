//! The prompt tells the agent how to answer and whom to ask (issue 22,
//! seed 003 "answering the human"): the command with its own name and the
//! config's human mailbox by name, as `agent-state prompt` shows it.

use crate::support::*;

#[test]
fn the_prompt_names_the_command_and_the_human_mailbox() {
    let env = Env::with_config(
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"ana\"\nkind = \"human\"\n",
    );
    env.ok(&["bootstrap"]);
    env.send(
        "ana",
        "rio",
        &["--type", "question", "--body", "what moved?"],
    );
    let prompt = env.ok(&["prompt", "rio"]);
    let answer = prompt
        .find("# How to answer")
        .unwrap_or_else(|| panic!("{prompt}"));
    let section = &prompt[answer..];
    assert!(
        section.contains("agent-state send --from rio --to SENDER")
            && section.contains("read the mailbox `ana`")
            && section.contains("`--to ana`"),
        "{section}"
    );
    assert!(
        prompt.find("# Inbox: 1 message").unwrap() < answer,
        "after the messages it answers"
    );
}

/// The next session reads the end of what the last one said (its log), as
/// the daemon hands it the prompt.
#[test]
fn the_next_session_reads_the_last_ones_last_words() {
    let env = Env::with_config("");
    let seen = env.tmp("prompts");
    std::fs::create_dir(&seen).unwrap();
    let script = env.script(
        "agent.sh",
        &format!(
            "cat > {seen:?}/$(date +%s%N).txt\necho \"I read the launchpad data and stopped at table 3.\"\necho '<axiom>COMPLETE</axiom>'",
            seen = seen.display().to_string()
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\"")],
        "[[agent]]\nname = \"rio\"\n",
    ));
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    for n in 1..=2 {
        env.ok(&["wake", "rio"]);
        d.wait_until(
            std::time::Duration::from_secs(20),
            &format!("session {n} ended"),
            || {
                env.events("rio", "session_end").len() == n
                    && env.json("rio", "session.json")["status"] == "completed"
            },
        );
    }
    let starts = env.events("rio", "session_start");
    let first = starts[0]["session_id"].as_str().unwrap();
    let mut prompts: Vec<_> = std::fs::read_dir(&seen)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    prompts.sort();
    assert_eq!(prompts.len(), 2);
    let first_prompt = std::fs::read_to_string(&prompts[0]).unwrap();
    assert!(!first_prompt.contains("last words"), "{first_prompt}");
    let second = std::fs::read_to_string(&prompts[1]).unwrap();
    assert!(
        second.contains(&format!(
            "# The last session's last words ({first}), from its log"
        )) && second.contains("> I read the launchpad data and stopped at table 3."),
        "{second}"
    );
}
