//! An agent without identity.md gets its birth prompt at every wake until
//! it writes one (issue 22, seed 003), and one that has not after
//! HATCH_LIMIT (3) completed sessions is reported by `health`, not left
//! silently alive.

use std::time::Duration;

use crate::support::*;

#[test]
fn the_birth_prompt_comes_back_until_an_identity_is_written() {
    let env = Env::with_config("");
    let seen = env.tmp("prompts");
    std::fs::create_dir(&seen).unwrap();
    let script = env.script(
        "agent.sh",
        &format!(
            "cat > {seen:?}/$(date +%s%N).txt\necho '<axiom>COMPLETE</axiom>'",
            seen = seen.display().to_string()
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[
            ("wake_on_inbox", "\"never\""),
            ("birth_prompt", "\"Write {identity_file} first.\""),
        ],
        "[[agent]]\nname = \"rio\"\n",
    ));
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    let health = || {
        let out = env.run(&["health", "--success-within", "off"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let identity = env.root.join("rio/identity.md");
    for n in 1..=3 {
        assert!(
            !health().contains("still hatching"),
            "before {n}: {}",
            health()
        );
        env.ok(&["wake", "rio"]);
        d.wait_until(
            Duration::from_secs(20),
            &format!("session {n} ended"),
            || {
                env.events("rio", "session_end").len() == n
                    && env.json("rio", "report.json")["lifecycle"] == "hatching"
            },
        );
    }
    let mut prompts: Vec<_> = std::fs::read_dir(&seen)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    prompts.sort();
    assert_eq!(prompts.len(), 3);
    for p in &prompts {
        let text = std::fs::read_to_string(p).unwrap();
        assert!(
            text.contains("# Hatching: Rio has no identity yet")
                && text.contains(&format!("Write {} first.", identity.display())),
            "every wake gets the birth prompt:\n{text}"
        );
    }
    let said = health();
    assert!(
        said.starts_with("WARNING")
            && said.contains("rio: still hatching after 3 completed sessions"),
        "{said}"
    );

    // It writes who it is: sleeping, the identity in the prompt, no warning.
    std::fs::write(&identity, "# Rio\nI map markets.\n").unwrap();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(20), "session 4 ended", || {
        env.events("rio", "session_end").len() == 4
            && env.json("rio", "report.json")["lifecycle"] == "sleeping"
    });
    assert!(!health().contains("still hatching"), "{}", health());
    let prompt = env.ok(&["prompt", "rio"]);
    assert!(
        prompt.contains("# Identity: Rio") && !prompt.contains("# Hatching"),
        "{prompt}"
    );
}
