//! `status` during a credential's hold (issue 23): every agent of the held
//! credential shows `held` — not only the one whose session met the limit,
//! and before any wake of theirs was refused — with a line for the
//! credential saying why and until when; an agent of another credential is
//! not touched.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const RESULT: &str = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"done","total_cost_usd":0.01}"#;

#[test]
fn status_shows_a_credentials_hold_on_every_agent_it_holds() {
    let env = Env::with_config("");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/claude/limits/hit-your-limit.json");
    // rio meets the limit; theseus shares its (default) credential; leo
    // logs in with another.
    let script = env.script(
        "agent.sh",
        &format!(
            "#!/bin/sh\ncat >/dev/null\nif [ \"$1\" = rio ]; then cat {f:?}; exit 1; fi\nprintf '%s\\n' '{RESULT}'\n",
            f = fixture.display().to_string(),
        ),
    );
    let config = daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"theseus\"\n\n[[agent]]\nname = \"leo\"\ncredential = \"leo\"\n\n[credential.leo]\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    );
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-11-24T12:00:00Z")]);
    env.ok(&["wake", "rio", "--wait", "5s"]);
    d.wait_until(Duration::from_secs(20), "the hold is saved", || {
        std::fs::read_to_string(env.root.join(".daemon/economy.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|v| v["holds"]["groups"]["default"]["cause"] == "usage_limit")
    });
    d.wait_until(Duration::from_secs(10), "rio's session is recorded", || {
        env.json("rio", "report.json")["current_session"].is_null()
    });

    let v: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let by_name = |name: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|l| l["agent"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} in {v:#}"))
    };
    for agent in ["rio", "theseus"] {
        let l = by_name(agent);
        assert_eq!(l["status"], "held", "{agent}: {l:#}");
        assert_eq!(l["held"]["credential"], "default", "{l:#}");
        assert_eq!(l["held"]["cause"], "usage_limit", "{l:#}");
        assert!(l["held"]["until"].as_str().is_some(), "{l:#}");
    }
    assert!(
        env.events("theseus", "wake_skipped").is_empty(),
        "theseus shows held before any wake of its was refused"
    );
    let leo = by_name("leo");
    assert_ne!(leo["status"], "held", "another credential: {leo:#}");
    assert!(leo["held"].is_null(), "{leo:#}");
    assert!(by_name("marcus")["held"].is_null());

    let table = env.ok(&["status"]);
    let header = table
        .lines()
        .find(|l| l.starts_with("credential default: held (usage limit) until "))
        .unwrap_or_else(|| panic!("a line for the held credential:\n{table}"));
    assert!(header.ends_with("waiting: rio, theseus"), "{header}");
    assert!(!table.contains("credential leo"), "{table}");
    for agent in ["rio ", "theseus "] {
        let row = table.lines().find(|l| l.starts_with(agent)).unwrap();
        assert!(row.contains(" held "), "{table}");
    }
    let row = table.lines().find(|l| l.starts_with("leo ")).unwrap();
    assert!(!row.contains(" held "), "{table}");
}
