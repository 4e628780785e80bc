//! The economy, as an operator sees it: `agent-state usage` adds up what
//! the sessions themselves recorded (the daemon's sessions from Claude
//! Code's result, a script's from `session end --tokens-used/--cost-usd`),
//! per agent and per day, with today's budgets.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const RESULT: &str = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"done","total_cost_usd":0.0421,"usage":{"input_tokens":12,"cache_creation_input_tokens":3000,"cache_read_input_tokens":14000,"output_tokens":250}}"#;

#[test]
fn usage_adds_up_what_each_session_recorded_and_shows_the_budget_left() {
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        &format!("#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' '{RESULT}'\n"),
    );
    let agents = "[[agent]]\nname = \"rio\"\nbudget = { max_sessions = 5, max_tokens = 100000 }\n\n[[agent]]\nname = \"leo\"\n";
    let mut config = daemon_config(&script, &[], &[], agents);
    config.push_str("\n[budget]\ntimezone = \"Europe/Lisbon\"\nmax_sessions = 10\n");
    env.set_config(&config);
    env.ok(&["bootstrap"]);

    // A daemon session of rio: its usage comes from Claude Code's result.
    let d = env.daemon();
    env.ok(&["wake", "rio", "--wait", "5s"]);
    // The usage is journaled first (the record `usage` adds up), then
    // copied into session.json under the same lock: a reader between the
    // two sees the journal line and the old session.json. Wait for both.
    d.wait_until(
        Duration::from_secs(10),
        "rio's usage is journaled and in session.json",
        || {
            env.events("rio", "session_usage").len() == 1
                && !env.json("rio", "session.json")["tokens_used"].is_null()
        },
    );
    let session = env.json("rio", "session.json");
    drop(d);

    // A script's session of leo, with figures of its own.
    let id = env.ok(&["session", "begin", "leo"]).trim().to_string();
    env.ok(&[
        "session",
        "end",
        "leo",
        "--session",
        &id,
        "--tokens-used",
        "1000",
        "--cost-usd",
        "0.25",
    ]);

    let out = env.ok(&["usage", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["timezone"], "Europe/Lisbon", "{out}");
    let today = &v["days"][0];
    assert_eq!(today["date"], v["today"], "{out}");
    let rio = &today["agents"]["rio"];
    assert_eq!(rio["sessions"], 1, "{out}");
    assert_eq!(rio["tokens"]["total"], session["tokens_used"], "{out}");
    assert_eq!(rio["tokens"]["total"], 17262, "{out}");
    assert_eq!(rio["tokens"]["cache_read"], 14000, "{out}");
    assert_eq!(rio["cost_usd"], session["cost_usd"], "{out}");
    let leo = &today["agents"]["leo"];
    assert_eq!(leo["tokens"]["total"], 1000, "{out}");
    assert_eq!(leo["cost_usd"], 0.25, "{out}");
    assert_eq!(today["total"]["sessions"], 2, "{out}");

    let budgets = v["budgets"].as_array().unwrap();
    let rio_budget = budgets
        .iter()
        .find(|b| b["scope"] == "rio")
        .expect("rio's budget");
    assert_eq!(rio_budget["left"]["sessions"], 4, "{out}");
    assert_eq!(rio_budget["left"]["tokens"], 100000 - 17262, "{out}");
    assert!(
        rio_budget["left"]["cost_usd"].is_null(),
        "no cost limit: {out}"
    );
    let fleet = budgets
        .iter()
        .find(|b| b["scope"] == "fleet")
        .expect("the fleet's");
    assert_eq!(fleet["left"]["sessions"], 8, "{out}");
    assert!(
        budgets.iter().all(|b| b["scope"] != "leo"),
        "leo has no budget: {out}"
    );

    let text = env.ok(&["usage", "--days", "2"]);
    assert!(text.contains("days in Europe/Lisbon"), "{text}");
    assert!(text.contains("rio") && text.contains("$0.04"), "{text}");
    assert!(
        text.contains("budget rio: left today: 4 session(s), 82.7k tokens"),
        "{text}"
    );
    let status = env.ok(&["status"]);
    assert!(
        status.contains("rio: today 1 session(s)")
            && status.contains("17.3k tokens, $0.04; budget left: 4 session(s), 82.7k tokens"),
        "{status}"
    );
    let status: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let rio = status
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["agent"] == "rio")
        .unwrap();
    assert_eq!(rio["today"]["tokens"]["total"], 17262, "{rio}");
    assert_eq!(rio["budget_left"]["sessions"], 4, "{rio}");
    let err = env.fails(&["usage", "--days", "0"], 2);
    assert!(err.contains("--days"), "{err}");
}

// ---- usage limits: wait, don't fail ------------------------------------------------------------

const MARCUS: &str = "\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n";

/// A fake agent: rio prints `fixture` (to stdout, or stderr for
/// `*.stderr.txt`) and exits 1 the first time, then works; every other
/// agent works at once.
fn limit_env(fixture: &str, usage_limits: &str) -> Env {
    let env = Env::with_config("");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/claude/limits")
        .join(fixture);
    let marker = env.tmp("rio-limited");
    let to = if fixture.to_string_lossy().ends_with(".stderr.txt") {
        ">&2"
    } else {
        ""
    };
    let script = env.script(
        "agent.sh",
        &format!(
            "#!/bin/sh\ncat >/dev/null\nif [ \"$1\" = rio ] && [ ! -e {m:?} ]; then touch {m:?}; cat {f:?} {to}; exit 1; fi\nprintf '%s\\n' '{RESULT}'\n",
            m = marker.display().to_string(),
            f = fixture.display().to_string(),
        ),
    );
    let mut config = daemon_config(
        &script,
        &[],
        &[],
        &format!("[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"leo\"\n{MARCUS}"),
    );
    config.push_str(&format!("\n[usage_limits]\n{usage_limits}\n"));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    env
}

fn error_codes(env: &Env) -> Vec<String> {
    std::fs::read_to_string(env.root.join(".daemon/errors.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|r| r["code"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn a_usage_limit_holds_every_agent_of_the_credential_until_its_reset_without_a_failure() {
    // "You've hit your limit · resets 1pm (Europe/Lisbon)", ten seconds
    // before 1pm; no jitter, so the hold ends at 13:00:00.
    let env = limit_env("hit-your-limit.txt", "jitter = \"0s\"");
    let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-11-24T12:59:50Z")]);
    env.ok(&["wake", "rio", "--wait", "5s"]);
    d.wait_until(Duration::from_secs(10), "the limit is journaled", || {
        env.events("rio", "usage_limit").len() == 1
    });
    let hit = &env.events("rio", "usage_limit")[0];
    assert_eq!(hit["kind"], "usage_limit", "{hit}");
    assert_eq!(hit["credential"], "default", "{hit}");
    assert_eq!(hit["resets_at"], "2026-11-24T13:00:00Z", "{hit}");
    d.wait_until(
        Duration::from_secs(5),
        "rio's report says it is held",
        || env.json("rio", "report.json")["error"]["state"] == "held",
    );
    let report = env.json("rio", "report.json");
    assert_eq!(report["error"]["code"], "USAGE_LIMIT", "{report}");
    assert_eq!(report["error"]["failures"], 0, "not a failure: {report}");
    let status = env.ok(&["status"]);
    assert!(
        status.contains("rio: USAGE_LIMIT (held")
            && status.contains("waiting for the usage limit to reset at 13:00 UTC"),
        "{status}"
    );

    d.wait_until(
        Duration::from_secs(5),
        "health warns about the hold",
        || {
            env.run(&["health", "--success-within", "off"])
                .status
                .code()
                == Some(1)
        },
    );
    let health = env.run(&["health", "--success-within", "off"]);
    let line = String::from_utf8_lossy(&health.stdout);
    assert!(
        line.contains(
            "WARNING: credential default: waiting for the usage limit to reset at 13:00 UTC"
        ),
        "{line}"
    );
    // leo shares the credential: its wake waits, no session starts.
    env.send("marcus", "leo", &[]);
    d.wait_until(Duration::from_secs(5), "leo's wake is held", || {
        env.events("leo", "wake_skipped")
            .iter()
            .any(|e| e["cause"] == "usage_limit")
    });
    assert!(env.events("leo", "session_start").is_empty());

    // At the reset both run (rio's session again, leo's deferred wake).
    d.wait_until(
        Duration::from_secs(30),
        "both sessions completed after the reset",
        || {
            env.events("rio", "session_end").len() == 1
                && env.events("leo", "session_end").len() == 1
        },
    );
    let leo_start = env.events("leo", "session_start")[0]["ts"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        leo_start.as_str() >= "2026-11-24T13:00:00Z",
        "leo started at {leo_start}"
    );
    // One notice, at low severity; nothing escalated; no backoff.
    let codes = error_codes(&env);
    assert_eq!(
        codes.iter().filter(|c| *c == "USAGE_LIMIT").count(),
        1,
        "{codes:?}"
    );
    assert!(
        !codes
            .iter()
            .any(|c| c == "SESSION_FAILED" || c == "AGENT_API_ERROR"),
        "{codes:?}"
    );
    assert!(env.waiting("marcus").is_empty(), "no message to the human");
    d.wait_until(Duration::from_secs(5), "rio's report is clear", || {
        env.json("rio", "report.json")["error"].is_null()
    });
}

#[test]
fn an_unknown_reset_waits_then_one_probe_session_runs_before_the_others() {
    let env = limit_env("api-429.stderr.txt", "wait = \"10s\"");
    let d = env.daemon();
    env.ok(&["wake", "rio", "--wait", "5s"]);
    d.wait_until(Duration::from_secs(10), "the limit is journaled", || {
        env.events("rio", "usage_limit").len() == 1
    });
    let hit = &env.events("rio", "usage_limit")[0];
    assert_eq!(hit["kind"], "api_rate_limit", "{hit}");
    assert!(hit["resets_at"].is_null(), "{hit}");
    env.send("marcus", "leo", &[]);
    // After the wait rio's retry is the probe; leo waits for its result.
    d.wait_until(Duration::from_secs(30), "both completed", || {
        env.events("rio", "session_end").len() == 1 && env.events("leo", "session_end").len() == 1
    });
    let rio_end = env.events("rio", "session_end")[0]["ts"]
        .as_str()
        .unwrap()
        .to_string();
    let leo_start = env.events("leo", "session_start")[0]["ts"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        leo_start >= rio_end,
        "leo started ({leo_start}) after the probe ended ({rio_end})"
    );
    assert!(d.log_text().contains("is the probe"), "{}", d.log_text());
}

#[test]
fn an_admin_cap_is_escalated_and_never_waited_out() {
    let env = limit_env("admin-disabled.txt", "");
    let d = env.daemon();
    env.ok(&["wake", "rio", "--wait", "5s"]);
    d.wait_until(Duration::from_secs(10), "the cap is journaled", || {
        env.events("rio", "usage_limit").len() == 1
    });
    assert_eq!(
        env.events("rio", "usage_limit")[0]["kind"],
        "admin_disabled"
    );
    d.wait_until(Duration::from_secs(10), "the human is told", || {
        !env.waiting("marcus").is_empty()
    });
    // The mailbox is written before errors.jsonl (an escalation, then
    // its record): wait for the record, the later of the two.
    d.wait_until(
        Duration::from_secs(10),
        "USAGE_DISABLED is recorded",
        || error_codes(&env).contains(&"USAGE_DISABLED".to_string()),
    );
    env.send("marcus", "leo", &[]);
    d.wait_until(Duration::from_secs(5), "leo is held", || {
        env.events("leo", "wake_skipped")
            .iter()
            .any(|e| e["cause"] == "usage_limit")
    });
    // Held with no end, as the daemon publishes it: a hold that would be
    // waited out has an `until` (a usage limit's reset time).
    d.wait_until(Duration::from_secs(5), "daemon.json shows the hold", || {
        d.heartbeat()["held"]
            .as_object()
            .is_some_and(|m| !m.is_empty())
    });
    let hb = d.heartbeat();
    let held: Vec<&Value> = hb["held"].as_object().unwrap().values().collect();
    assert!(
        held.iter()
            .all(|h| h["cause"] == "disabled" && h.get("until").is_none()),
        "held, not waited out: {hb}"
    );
    assert!(
        env.events("leo", "session_start").is_empty(),
        "held, not waited out"
    );
    assert_eq!(
        env.json("leo", "report.json")["error"]["code"],
        "USAGE_DISABLED"
    );
}

// ---- budgets and wake_if -----------------------------------------------------------------------

#[test]
fn budgets_refuse_wakes_until_the_day_ends_in_their_zone_and_wake_if_work_skips_idle_schedules() {
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        &format!("#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' '{RESULT}'\n"),
    );
    // Days in New York (UTC-5): the 24th ends at 2026-11-25T05:00:00Z.
    let agents = format!(
        "[[agent]]\nname = \"rio\"\nschedule = \"59 4 * * *\"\nbudget = {{ max_tokens = 100 }}\n\n[[agent]]\nname = \"leo\"\nschedule = \"59 4 * * *\"\nwake_if = \"work\"\n{MARCUS}"
    );
    let mut config = daemon_config(&script, &[], &[("wake_on_inbox", "\"never\"")], &agents);
    config.push_str("\n[budget]\ntimezone = \"America/New_York\"\n");
    env.set_config(&config);
    env.ok(&["bootstrap"]);

    // 04:58:56Z: one session (17,262 tokens), then the 04:59 schedule.
    let mut d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-11-25T04:58:56Z")]);
    env.ok(&["wake", "rio", "--wait", "5s"]);
    d.wait_until(
        Duration::from_secs(15),
        "the scheduled wakes are skipped",
        || {
            env.events("rio", "wake_skipped")
                .iter()
                .any(|e| e["cause"] == "budget")
                && env
                    .events("leo", "wake_skipped")
                    .iter()
                    .any(|e| e["cause"] == "no_work")
        },
    );
    let skipped = env.events("rio", "wake_skipped");
    let skipped = skipped.iter().find(|e| e["cause"] == "budget").unwrap();
    assert_eq!(skipped["reason"], "schedule", "{skipped}");
    assert!(
        skipped["detail"]
            .as_str()
            .unwrap()
            .contains("max_tokens reached: 17262 of 100"),
        "{skipped}"
    );
    assert_eq!(env.events("rio", "session_start").len(), 1);
    assert!(
        env.events("leo", "session_start").is_empty(),
        "no work, no session"
    );
    d.wait_until(Duration::from_secs(5), "the human is told once", || {
        env.waiting("marcus").len() == 1
    });
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(d.wait_exit(Duration::from_secs(10)).code(), Some(0));

    // 04:59:52Z, still the 24th in New York: a manual wake waits for the
    // next day, and the human is not told again.
    let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-11-25T04:59:52Z")]);
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(5), "the manual wake waits", || {
        env.events("rio", "wake_skipped")
            .iter()
            .any(|e| e["cause"] == "budget" && e["reason"] == "manual")
    });
    d.wait_until(Duration::from_secs(30), "it runs when the day ends", || {
        env.events("rio", "session_end").len() == 2
    });
    let second = env.events("rio", "session_start")[1]["ts"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        second.as_str() >= "2026-11-25T05:00:00Z",
        "started at {second}"
    );
    assert_eq!(env.waiting("marcus").len(), 1, "told once a day");
}

// ---- outcomes judged by more than the exit code --------------------------------------------------

#[test]
fn exit_0_is_not_taken_at_its_word() {
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        r#"#!/bin/sh
cat >/dev/null
case "$1" in
  rio) echo '{"type":"result","subtype":"error_max_turns","is_error":false,"num_turns":10,"result":""}' ;;
  leo) echo '{"type":"result","subtype":"success","is_error":false,"num_turns":3,"result":"done","permission_denials":[{"tool_name":"Bash","tool_use_id":"t1"}]}' ;;
  vida) echo "done, but no signal" ;;
  clay) echo "done"; echo "<axiom>COMPLETE</axiom>" ;;
esac
exit 0
"#,
    );
    let agents = "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"leo\"\n\n[[agent]]\nname = \"vida\"\nrequire_complete = true\n\n[[agent]]\nname = \"clay\"\nrequire_complete = true\n";
    env.set_config(&daemon_config(
        &script,
        &[("max_concurrent_sessions", "4")],
        &[],
        agents,
    ));
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    for a in ["rio", "leo", "vida", "clay"] {
        env.ok(&["wake", a, "--wait", "5s"]);
    }
    d.wait_until(Duration::from_secs(15), "four sessions ended", || {
        ["rio", "leo", "vida", "clay"]
            .iter()
            .all(|a| env.events(a, "session_end").len() + env.events(a, "error").len() == 1)
    });
    let records: Vec<Value> = std::fs::read_to_string(env.root.join(".daemon/errors.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let of = |agent: &str| -> Vec<(String, String)> {
        records
            .iter()
            .filter(|r| r["context"]["agent"] == agent)
            .map(|r| {
                (
                    r["code"].as_str().unwrap().to_string(),
                    r["message"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    // The turn limit: a failure although the command exited 0.
    assert_eq!(
        env.events("rio", "error").len(),
        1,
        "{:?}",
        env.journal("rio")
    );
    assert!(
        of("rio")
            .iter()
            .any(|(c, m)| c == "SESSION_FAILED" && m.contains("turn limit")),
        "{:?}",
        of("rio")
    );
    // Refused tools: completed, with a doubt naming them.
    assert_eq!(env.events("leo", "session_end").len(), 1);
    assert!(
        of("leo")
            .iter()
            .any(|(c, m)| c == "SESSION_SUSPECT" && m.contains("Bash")),
        "{:?}",
        of("leo")
    );
    // require_complete: no COMPLETE is a failure, COMPLETE is a success.
    assert_eq!(env.events("vida", "error").len(), 1);
    assert!(
        of("vida").iter().any(|(c, _)| c == "SESSION_INCOMPLETE"),
        "{:?}",
        of("vida")
    );
    assert_eq!(env.events("clay", "session_end").len(), 1);
    assert!(of("clay").is_empty(), "{:?}", of("clay"));
}

// ---- the credential check -----------------------------------------------------------------------

#[test]
fn a_failed_credential_check_holds_its_agents_until_it_passes() {
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        &format!("#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' '{RESULT}'\n"),
    );
    let ok = env.tmp("logged-in");
    // Claude Code's own answer when logged out, until the file exists.
    let check = env.script(
        "check.sh",
        &format!(
            "#!/bin/sh\nif [ -e {ok:?} ]; then echo '{{\"loggedIn\": true, \"authMethod\": \"claude.ai\"}}'; exit 0; fi\necho '{{\"loggedIn\": false, \"authMethod\": \"none\"}}'; exit 1\n",
            ok = ok.display().to_string()
        ),
    );
    let mut config = daemon_config(
        &script,
        &[],
        &[],
        &format!("[[agent]]\nname = \"rio\"\n{MARCUS}"),
    );
    config.push_str(&format!(
        "\n[credential.default]\ncheck = [{:?}]\ncheck_every = \"10s\"\n",
        check.display().to_string()
    ));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    d.wait_until(
        Duration::from_secs(15),
        "the failed check is escalated",
        || {
            error_codes(&env).contains(&"CREDENTIAL_FAILED".to_string())
                && !env.waiting("marcus").is_empty()
        },
    );
    let told = env.waiting("marcus");
    assert_eq!(told.len(), 1, "one message: {told:?}");
    env.send("marcus", "rio", &[]);
    d.wait_until(Duration::from_secs(5), "rio's wake is held", || {
        env.events("rio", "wake_skipped")
            .iter()
            .any(|e| e["cause"] == "credential")
    });
    let status = env.ok(&["status"]);
    assert!(
        status.contains("not logged in (authMethod: none)"),
        "{status}"
    );
    assert!(env.events("rio", "session_start").is_empty());
    // Logged in: the next check (10 s) releases the group.
    std::fs::write(&ok, "").unwrap();
    d.wait_until(
        Duration::from_secs(30),
        "rio ran after the check passed",
        || env.events("rio", "session_end").len() == 1,
    );
    assert!(
        d.log_text().contains("its check passes again"),
        "{}",
        d.log_text()
    );
    assert_eq!(
        error_codes(&env)
            .iter()
            .filter(|c| *c == "CREDENTIAL_FAILED")
            .count(),
        1,
        "said once"
    );
}

#[test]
fn the_real_claude_cli_without_credentials_fails_the_check() {
    let Ok(claude) = std::env::var("AGENT_STATE_CLAUDE_BIN") else {
        eprintln!(
            "SKIPPED: set AGENT_STATE_CLAUDE_BIN to the Claude Code CLI (npm install @anthropic-ai/claude-code)"
        );
        return;
    };
    let env = Env::with_config("");
    let script = agent_ok(&env);
    let mut config = daemon_config(
        &script,
        &[],
        &[],
        &format!("[[agent]]\nname = \"rio\"\n{MARCUS}"),
    );
    config.push_str(&format!(
        "\n[credential.default]\ncheck = [{claude:?}, \"auth\", \"status\", \"--json\"]\n"
    ));
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let home = env.tmp("home");
    std::fs::create_dir_all(&home).unwrap();
    let d = Daemon::start(&env, &[("HOME", home.to_str().unwrap())]);
    d.wait_until(Duration::from_secs(60), "the check failed", || {
        error_codes(&env).contains(&"CREDENTIAL_FAILED".to_string())
    });
    let errors = std::fs::read_to_string(env.root.join(".daemon/errors.jsonl")).unwrap();
    assert!(
        errors.contains("not logged in (authMethod: none)"),
        "{errors}"
    );
}

fn agent_ok(env: &Env) -> std::path::PathBuf {
    env.script(
        "agent.sh",
        &format!("#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' '{RESULT}'\n"),
    )
}

#[test]
fn a_session_over_its_token_budget_is_stopped_as_it_streams_or_let_finish() {
    let env = Env::with_config("");
    // stream-json: one API call of 1,500 tokens (printed as two content
    // blocks of the same message), then a long think.
    let script = env.script(
        "agent.sh",
        r#"#!/bin/sh
cat >/dev/null
m='{"type":"assistant","message":{"id":"msg_1","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":500,"cache_read_input_tokens":500,"output_tokens":500}}}'
echo "$m"; echo "$m"
if [ "$1" = rio ]; then sleep 30; else sleep 2; fi
echo '{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"done"}'
"#,
    );
    let agents = "[[agent]]\nname = \"rio\"\nsession_budget = { max_tokens = 1200 }\n\n[[agent]]\nname = \"leo\"\nsession_budget = { max_tokens = 1200 }\nbudget_action = \"finish\"\n\n[[agent]]\nname = \"vida\"\nsession_budget = { max_tokens = 1600 }\n";
    env.set_config(&daemon_config(
        &script,
        &[("max_concurrent_sessions", "3")],
        &[],
        agents,
    ));
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    for a in ["rio", "leo", "vida"] {
        env.ok(&["wake", a, "--wait", "5s"]);
    }
    d.wait_until(
        Duration::from_secs(3),
        "rio is stopped before its command ends",
        || env.events("rio", "error").len() == 1,
    );
    let reason = env.events("rio", "error")[0]["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        reason.contains("max_tokens reached: 1500 of 1200"),
        "{reason}"
    );
    d.wait_until(Duration::from_secs(10), "leo and vida finish", || {
        env.events("leo", "session_end").len() == 1 && env.events("vida", "session_end").len() == 1
    });
    assert!(
        d.log_text()
            .contains("it may finish (budget_action = \"finish\")"),
        "{}",
        d.log_text()
    );
}

#[test]
fn a_wake_if_command_decides_whether_a_scheduled_wake_runs() {
    let env = Env::with_config("");
    let script = agent_ok(&env);
    let cond = env.script(
        "has-work.sh",
        "#!/bin/sh\n[ \"$1\" = leo ] && exit 0\necho \"nothing for $1\" >&2\nexit 1\n",
    );
    let agents = format!(
        "[[agent]]\nname = \"leo\"\nschedule = \"0 13 * * *\"\nwake_if = [{c:?}, \"{{agent}}\"]\n\n[[agent]]\nname = \"vida\"\nschedule = \"0 13 * * *\"\nwake_if = [{c:?}, \"{{agent}}\"]\n",
        c = cond.display().to_string()
    );
    env.set_config(&daemon_config(&script, &[], &[], &agents));
    env.ok(&["bootstrap"]);
    let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-11-24T12:59:58Z")]);
    d.wait_until(
        Duration::from_secs(15),
        "leo ran and vida was skipped",
        || {
            env.events("leo", "session_end").len() == 1
                && env
                    .events("vida", "wake_skipped")
                    .iter()
                    .any(|e| e["cause"] == "no_work")
        },
    );
    let skipped = env.events("vida", "wake_skipped");
    let detail = skipped[0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("exited non-zero: nothing for vida"),
        "{detail}"
    );
    assert!(env.events("vida", "session_start").is_empty());
}

#[test]
fn every_limit_form_claude_code_prints_holds_the_credential_with_its_reset() {
    // (fixture, kind, resets_at) as tests/fixtures/claude/limits/README.md
    // reads them at 2026-11-24T12:00:00Z.
    let cases = [
        (
            "hit-your-limit.txt",
            "usage_limit",
            Some("2026-11-24T13:00:00Z"),
        ),
        (
            "hit-your-limit.json",
            "usage_limit",
            Some("2026-11-24T13:00:00Z"),
        ),
        (
            "session-limit.stream.jsonl",
            "usage_limit",
            Some("2026-11-24T18:30:00Z"),
        ),
        (
            "weekly-limit-dated.txt",
            "usage_limit",
            Some("2026-11-27T14:00:00Z"),
        ),
        (
            "extra-usage.txt",
            "extra_usage_exhausted",
            Some("2026-11-25T01:00:00Z"),
        ),
        (
            "usage-limit-epoch.json",
            "usage_limit",
            Some("2026-11-24T15:00:00Z"),
        ),
        ("api-rate-limit.txt", "api_rate_limit", None),
        ("api-429.stderr.txt", "api_rate_limit", None),
        ("api-429.json", "api_rate_limit", None),
        ("admin-disabled.txt", "admin_disabled", None),
        ("admin-disabled.stream.jsonl", "admin_disabled", None),
    ];
    for (fixture, kind, resets_at) in cases {
        let env = limit_env(fixture, "");
        let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-11-24T12:00:00Z")]);
        env.ok(&["wake", "rio", "--wait", "5s"]);
        d.wait_until(
            Duration::from_secs(10),
            &format!("{fixture}: the limit is journaled"),
            || env.events("rio", "usage_limit").len() == 1,
        );
        let hit = &env.events("rio", "usage_limit")[0];
        assert_eq!(hit["kind"], kind, "{fixture}: {hit}");
        match resets_at {
            Some(t) => assert_eq!(hit["resets_at"], t, "{fixture}: {hit}"),
            None => assert!(hit["resets_at"].is_null(), "{fixture}: {hit}"),
        }
        if kind == "admin_disabled" {
            assert!(
                hit["hold_until"].is_null(),
                "{fixture}: never waited out: {hit}"
            );
        } else {
            assert!(hit["hold_until"].as_str().is_some(), "{fixture}: {hit}");
        }
        // Not the agent's failure.
        let codes = error_codes(&env);
        assert!(
            !codes
                .iter()
                .any(|c| c == "SESSION_FAILED" || c == "AGENT_API_ERROR"),
            "{fixture}: {codes:?}"
        );
    }
    // Warnings and an agent merely talking about limits hold nothing.
    for fixture in ["warning.stream.jsonl", "self-mention.stream.jsonl"] {
        let env = limit_env(fixture, "");
        let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-11-24T12:00:00Z")]);
        env.ok(&["wake", "rio", "--wait", "5s"]);
        d.wait_until(Duration::from_secs(10), "the session ended", || {
            env.events("rio", "error").len() + env.events("rio", "session_end").len() == 1
        });
        assert!(env.events("rio", "usage_limit").is_empty(), "{fixture}");
    }
}

#[test]
fn each_daily_budget_refuses_the_next_scheduled_wake() {
    // One session of RESULT: 1 session, 17,262 tokens, $0.0421, and its
    // runtime (at least 0 s: a max_runtime of 0s is reached at once).
    for (budget, limit) in [
        ("max_sessions = 1", "max_sessions"),
        ("max_tokens = 17000", "max_tokens"),
        ("max_cost_usd = 0.04", "max_cost_usd"),
        ("max_runtime = \"0s\"", "max_runtime"),
    ] {
        let env = Env::with_config("");
        let script = agent_ok(&env);
        let agents = format!(
            "[[agent]]\nname = \"rio\"\nschedule = \"0 13 * * *\"\nbudget = {{ {budget} }}\n"
        );
        env.set_config(&daemon_config(&script, &[], &[], &agents));
        env.ok(&["bootstrap"]);
        let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-11-24T12:59:56Z")]);
        if limit != "max_runtime" {
            env.ok(&["wake", "rio", "--wait", "3s"]);
            d.wait_until(Duration::from_secs(5), "the first session ended", || {
                env.events("rio", "session_end").len() == 1
            });
        }
        d.wait_until(
            Duration::from_secs(15),
            &format!("{limit}: the scheduled wake is skipped"),
            || {
                env.events("rio", "wake_skipped")
                    .iter()
                    .any(|e| e["cause"] == "budget")
            },
        );
        let skipped = env.events("rio", "wake_skipped");
        let detail = skipped[0]["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!("{limit} reached")),
            "{limit}: {detail}"
        );
    }
}
