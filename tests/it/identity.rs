//! Identity and lifecycle: instance ids (seed 000's spawn counters) and
//! report.json `lifecycle` (seed 003's states, adapted to a daemon).

use std::time::Duration;

use serde_json::Value;

use crate::support::{Env, poll_until, state};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn instances(env: &Env, agent: &str) -> Vec<String> {
    std::fs::read_to_string(env.root.join(agent).join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "session_start")
        .filter_map(|e| e["instance"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn concurrent_spawns_of_many_agents_never_repeat_an_instance_id() {
    let agents = ["a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8"];
    let body: String = agents
        .iter()
        .map(|a| format!("[[agent]]\nname = \"{a}\"\n"))
        .collect();
    let env = Env::with_config(&body);
    env.ok(&["bootstrap"]);
    // Seed 000's first state: every agent listed, at 0.
    let first: Value = serde_json::from_str(
        &std::fs::read_to_string(env.root.join(".daemon/counters.json")).unwrap(),
    )
    .unwrap();
    for agent in agents {
        assert_eq!(first[agent], 0, "{first}");
    }
    const PER_AGENT: usize = 12;
    std::thread::scope(|s| {
        for agent in agents {
            let env = &env;
            s.spawn(move || {
                for _ in 0..PER_AGENT {
                    let id = env.ok(&["session", "begin", agent]);
                    env.ok(&["session", "end", agent, "--session", id.trim()]);
                }
            });
        }
    });
    let counters: Value = serde_json::from_str(
        &std::fs::read_to_string(env.root.join(".daemon/counters.json")).unwrap(),
    )
    .unwrap();
    for agent in agents {
        let ids = instances(&env, agent);
        let want: Vec<String> = (1..=PER_AGENT).map(|n| format!("{agent}-{n:03}")).collect();
        assert_eq!(
            ids, want,
            "{agent}: one id per spawn, in order, none repeated"
        );
        assert_eq!(
            counters[agent], PER_AGENT as u64,
            "seed 000's flat map: {counters}"
        );
    }
}

#[test]
fn a_script_joining_the_daemons_session_is_an_invocation_not_a_spawn() {
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        // The session script calls the hook itself, as research-session.sh
        // does: with AGENT_STATE_SESSION_ID it joins.
        &format!(
            "{:?} --config \"$AGENT_STATE_CONFIG\" session begin \"$1\" --branch b >/dev/null\necho working",
            crate::support::BIN
        ),
    );
    env.set_config(&format!(
        "[defaults]\ncommand = [{:?}, \"{{agent}}\"]\nwake_on_inbox = \"never\"\n[[agent]]\nname = \"rio\"\n",
        script.display().to_string()
    ));
    let d = env.daemon();
    for n in 1..=2 {
        env.ok(&["wake", "rio"]);
        d.wait_until(secs(5.0), "the session completed", || {
            state(&env, "rio", "report.json")["instance"] == format!("rio-{n:03}").as_str()
                && state(&env, "rio", "session.json")["status"] == "completed"
        });
    }
    assert_eq!(instances(&env, "rio"), ["rio-001", "rio-002"]);
    assert_eq!(
        state(&env, "rio", "session.json")["branch"],
        "b",
        "the join added its fields"
    );
}

#[test]
fn the_lifecycle_goes_hatching_alive_sleeping_and_expired_and_back() {
    let env = Env::with_config("");
    let gate = env.tmp("gate");
    // The session writes identity.md when the test leaves `who` for it.
    let who = env.tmp("who");
    let script = env.script(
        "agent.sh",
        &format!(
            "echo working\nwhile [ ! -e {gate:?} ]; do sleep 0.05; done\nrm -f {gate:?}\n[ -e {who:?} ] && cp {who:?} {identity:?}\ntrue",
            gate = gate.display().to_string(),
            who = who.display().to_string(),
            identity = env.root.join("rio/identity.md").display().to_string(),
        ),
    );
    let agents = |with_leo: bool| {
        format!(
            "[defaults]\ncommand = [{:?}, \"{{agent}}\"]\nwake_on_inbox = \"never\"\n[[agent]]\nname = \"rio\"\n{}",
            script.display().to_string(),
            if with_leo {
                "[[agent]]\nname = \"leo\"\n"
            } else {
                ""
            }
        )
    };
    env.set_config(&agents(true));
    env.ok(&["bootstrap"]);
    // leo already knows who it is.
    std::fs::write(env.root.join("leo/identity.md"), "# Leo\n").unwrap();
    let d = env.daemon();
    let lifecycle = |a: &str| state(&env, a, "report.json")["lifecycle"].clone();
    assert_eq!(lifecycle("rio"), "hatching", "no identity, no session yet");
    assert_eq!(lifecycle("leo"), "sleeping");

    // A session that writes no identity leaves it hatching (the birth
    // prompt comes back at the next wake).
    let sessions = |n: usize| env.events("rio", "session_end").len() == n;
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "rio is alive", || lifecycle("rio") == "alive");
    std::fs::write(&gate, "").unwrap();
    d.wait_until(secs(10.0), "rio's first session ended", || sessions(1));
    d.wait_until(secs(5.0), "rio is hatching still", || {
        lifecycle("rio") == "hatching"
    });
    // One that writes identity.md: sleeping from then on.
    std::fs::write(&who, "# Rio\n").unwrap();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "rio is alive again", || {
        lifecycle("rio") == "alive"
    });
    std::fs::write(&gate, "").unwrap();
    d.wait_until(secs(10.0), "rio sleeps once it knows who it is", || {
        sessions(2) && lifecycle("rio") == "sleeping"
    });

    // Removed from the config: expired, its directory kept.
    env.set_config(&agents(false));
    d.signal(nix::sys::signal::Signal::SIGHUP);
    d.wait_until(secs(5.0), "leo expired", || lifecycle("leo") == "expired");
    assert!(env.root.join("leo/identity.md").is_file());
    // Configured again: it comes back.
    env.set_config(&agents(true));
    d.signal(nix::sys::signal::Signal::SIGHUP);
    d.wait_until(secs(5.0), "leo is back", || lifecycle("leo") == "sleeping");
    assert!(poll_until(secs(1.0), || lifecycle("rio") == "sleeping"));
}
