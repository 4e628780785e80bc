//! A credential's hold ends when the credential works again: a session of
//! it that succeeds, or the operator's `agent-state credential release`;
//! and an admin's cap found during a usage-limit hold is escalated.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const RESULT: &str = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"done","total_cost_usd":0.01}"#;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/claude")
        .join(name)
        .display()
        .to_string()
}

/// theseus and leo share the default credential; Claude Code is logged out
/// (Claude Code's own not-logged-in JSON, exit 1) until `logged-in` exists.
/// Without a check, a login hold lasts `[usage_limits] wait`: an hour.
fn logged_out_env() -> Env {
    let env = Env::with_config("");
    let logged_in = env.tmp("logged-in");
    let script = env.script(
        "claude.sh",
        &format!(
            "cat >/dev/null\nif [ -e {l:?} ]; then printf '%s\\n' '{RESULT}'; exit 0; fi\ncat {f:?}\nexit 1",
            l = logged_in.display().to_string(),
            f = fixture("not-logged-in.json"),
        ),
    );
    let mut config = daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"theseus\"\n\n[[agent]]\nname = \"leo\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    );
    config.push_str("\n[usage_limits]\nwait = \"1h\"\n");
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    env
}

/// The default credential's hold in `.daemon/economy.json` (Null: none,
/// or no file yet).
fn held(env: &Env) -> Value {
    std::fs::read_to_string(env.root.join(".daemon/economy.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .map_or(Value::Null, |v| v["holds"]["groups"]["default"].clone())
}

fn codes(env: &Env) -> Vec<String> {
    std::fs::read_to_string(env.root.join(".daemon/errors.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|r| r["code"].as_str().map(str::to_string))
        .collect()
}

/// theseus's session finds the login dead; leo's mail is held behind it.
fn hold_the_fleet(env: &Env, d: &Daemon) {
    env.ok(&["wake", "theseus", "--wait", "10s"]);
    d.wait_until(secs(20), "the login hold is saved", || {
        held(env)["cause"] == "credential"
    });
    assert!(codes(env).contains(&"AGENT_LOGIN_REQUIRED".to_string()));
    env.send("marcus", "leo", &[]);
    d.wait_until(secs(20), "leo's wake is held", || {
        env.events("leo", "wake_skipped")
            .iter()
            .any(|e| e["cause"] == "credential")
    });
    assert!(env.events("leo", "session_start").is_empty());
}

#[test]
fn a_session_that_succeeds_after_the_login_releases_the_whole_credential() {
    let env = logged_out_env();
    let d = env.daemon();
    hold_the_fleet(&env, &d);
    // The operator logs in again and tries one session.
    std::fs::write(env.tmp("logged-in"), "").unwrap();
    env.ok(&["wake", "theseus", "--wait", "10s"]);
    d.wait_until(secs(30), "leo's held mail ran", || {
        env.events("leo", "session_end").len() == 1
    });
    assert!(held(&env).is_null(), "{}", held(&env));
    d.wait_until(secs(10), "leo's report is clear", || {
        state(&env, "leo", "report.json")["error"].is_null()
    });
    assert!(
        d.log_text().contains("the hold is over"),
        "{}",
        d.log_text()
    );
    // Nothing is held again after a restart.
    drop(d);
    let d = env.daemon();
    env.send("marcus", "leo", &[]);
    d.wait_until(secs(30), "leo's next mail ran", || {
        env.events("leo", "session_end").len() == 2
    });
    assert!(!d.log_text().contains("kept across the restart"));
}

#[test]
fn credential_release_lifts_the_hold_on_a_running_daemon() {
    let env = logged_out_env();
    let d = env.daemon();
    hold_the_fleet(&env, &d);
    // An unknown credential is refused, naming the ones there are.
    let err = env.fails(&["credential", "release", "team-b"], 64);
    assert!(
        err.contains("no credential \"team-b\" in the config: its credentials are default"),
        "{err}"
    );
    assert!(!held(&env).is_null(), "nothing released");
    // Logged in (but no session tried): the operator releases it.
    std::fs::write(env.tmp("logged-in"), "").unwrap();
    let out = env.ok(&["credential", "release", "default"]);
    assert!(out.contains("credential default released"), "{out}");
    assert!(out.contains("the credential is not usable"), "{out}");
    assert!(held(&env).is_null(), "{}", held(&env));
    d.wait_until(secs(30), "leo's held mail ran", || {
        env.events("leo", "session_end").len() == 1
    });
    assert_eq!(
        env.events("theseus", "session_start").len(),
        1,
        "no session needed"
    );
    assert!(
        d.log_text()
            .contains("released by `agent-state credential release`"),
        "{}",
        d.log_text()
    );
    let again = env.ok(&["credential", "release", "default"]);
    assert!(again.contains("is not held"), "{again}");
    assert!(
        list(&env.root.join(".daemon"))
            .iter()
            .all(|f| !f.starts_with("credential-release"))
    );
}

#[test]
fn credential_release_while_the_daemon_is_down_is_carried_out_when_it_starts() {
    let env = logged_out_env();
    let d = env.daemon();
    hold_the_fleet(&env, &d);
    drop(d);
    std::fs::write(env.tmp("logged-in"), "").unwrap();
    let out = env.ok(&["credential", "release", "default"]);
    assert!(
        out.contains("no daemon is running") && out.contains("lifted when the daemon starts"),
        "{out}"
    );
    let d = env.daemon();
    // leo's mail waited in its inbox: served now, not held.
    d.wait_until(secs(30), "leo's mail ran", || {
        env.events("leo", "session_end").len() == 1
    });
    assert!(held(&env).is_null(), "{}", held(&env));
    assert!(
        d.log_text()
            .contains("released by `agent-state credential release`"),
        "{}",
        d.log_text()
    );
}

#[test]
fn an_admin_cap_found_by_a_manual_wake_during_a_usage_limit_hold_is_escalated() {
    let env = Env::with_config("");
    let runs = env.tmp("runs");
    // rio's first session hits a rate limit with no reset (held an hour),
    // its second (a manual wake) finds the usage disabled by an admin.
    let script = env.script(
        "claude.sh",
        &format!(
            "cat >/dev/null\necho run >> {r:?}\nn=$(wc -l < {r:?})\nif [ \"$n\" = 1 ]; then cat {a:?} >&2; exit 1; fi\nif [ \"$n\" = 2 ]; then cat {b:?}; exit 1; fi\nprintf '%s\\n' '{RESULT}'",
            r = runs.display().to_string(),
            a = fixture("limits/api-429.stderr.txt"),
            b = fixture("limits/admin-disabled.txt"),
        ),
    );
    let mut config = daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    );
    config.push_str("\n[usage_limits]\nwait = \"1h\"\n");
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    env.ok(&["wake", "rio", "--wait", "10s"]);
    d.wait_until(secs(20), "the usage limit holds rio", || {
        held(&env)["cause"] == "usage_limit"
    });
    // The operator's try finds the cap: the credential is still held (75).
    // (--wait ends when the session does; 10 s ran out on a loaded machine.)
    let err = env.fails(&["wake", "rio", "--wait", "60s"], 75);
    assert!(err.contains("disabled by an admin"), "{err}");
    d.wait_until(secs(20), "the admin's cap is escalated", || {
        codes(&env).contains(&"USAGE_DISABLED".to_string()) && !env.waiting("marcus").is_empty()
    });
    assert_eq!(held(&env)["cause"], "disabled", "{}", held(&env));
    let errors: Vec<Value> = std::fs::read_to_string(env.root.join(".daemon/errors.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let cap = errors
        .iter()
        .find(|r| r["code"] == "USAGE_DISABLED")
        .unwrap();
    assert_eq!(cap["severity"], "critical", "{cap}");
    assert_eq!(
        codes(&env).iter().filter(|c| *c == "USAGE_LIMIT").count(),
        1,
        "{:?}",
        codes(&env)
    );
}

/// Releasing is the operator's: a member of the inbox group (who may read
/// `.daemon/` and wake agents) and a user in no group are refused, and the
/// hold stays. Creates a user and a group: root with AGENT_STATE_ROOT_TESTS=1.
#[test]
fn only_the_service_user_or_root_may_release_a_credential() {
    if !root_tests() {
        return;
    }
    // Names of this test process's own: two runs at once never share them.
    let (member, outsider) = (account("ashmem"), account("ashout"));
    let (member, outsider) = (member.as_str(), outsider.as_str());
    let accounts = Accounts::new(&account("ashgrp"), &[member], &[outsider]);
    let env = logged_out_env();
    let bin = accounts.share(&env);
    let d = env.daemon();
    hold_the_fleet(&env, &d);
    for user in [member, outsider] {
        let out = run_as(&env, &bin, user, &["credential", "release", "default"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(77), "{user}: {err}");
        assert!(
            err.contains("releasing a credential is the operator's"),
            "{user}: {err}"
        );
        assert!(!held(&env).is_null(), "{user} released nothing");
    }
}
