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
