//! Agent signals through the daemon: a fake agent prints each kind of
//! `<axiom>…</axiom>` signal (one split across two writes, one invalid) and
//! the effects land in the state files.

use std::time::Duration;

use serde_json::Value;

use crate::support::{Env, state};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn journal(env: &Env, agent: &str) -> Vec<Value> {
    std::fs::read_to_string(env.root.join(agent).join("journal.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn waiting_subjects(env: &Env, agent: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(&env.ok(&["inbox", agent, "--json"])).unwrap();
    v["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            w["message"]["subject"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn setup(body: &str) -> Env {
    let env = Env::with_config("");
    let script = env.script("agent.sh", body);
    env.set_config(&format!(
        r#"
[defaults]
command = [{:?}, "{{agent}}"]
wake_on_inbox = "never"
timeout = "30s"
kill_grace = "1s"

[[agent]]
name = "rio"
[[agent]]
name = "theseus"
[[agent]]
name = "clay"
[[agent]]
name = "marcus"
kind = "human"
"#,
        script.display().to_string()
    ));
    env
}

#[test]
fn every_signal_has_its_effect_and_an_invalid_one_is_logged_not_fatal() {
    let env = setup(
        r#"echo "starting"
echo "<axiom>PROGRESS:40</axiom>"
printf '<axiom>BLOCK'
sleep 0.2
printf 'ED:waiting for the API key</axiom>\n'
echo "<axiom>PENDING:which dataset should I use?</axiom>"
echo "<axiom>DISCOVERY_LOCAL:the archive mirrors lag by a day</axiom>"
echo "<axiom>DISCOVERY_GLOBAL:conditional AMMs show up in three sources</axiom>"
echo "<axiom>progress:50</axiom> and <axiom>PROGRESS:150</axiom>"
echo "<axiom>RESOLVED</axiom>"
echo "<axiom>PROGRESS:90</axiom>"
echo "<axiom>COMPLETE</axiom>"
exit 1"#,
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    // session.json and report.json are two files written one after the
    // other: wait for both.
    d.wait_until(secs(8.0), "the session ended", || {
        state(&env, "rio", "session.json")["status"] == "completed"
            && !state(&env, "rio", "report.json")["last_session"].is_null()
    });
    // COMPLETE: completed although the command exited 1.
    let report = state(&env, "rio", "report.json");
    assert_eq!(report["last_session"]["outcome"], "completed", "{report:#}");
    assert_eq!(report["progress"], 90, "{report:#}");
    assert!(
        report["blocked_by"].is_null(),
        "RESOLVED cleared it: {report:#}"
    );

    let signals: Vec<(String, String)> = journal(&env, "rio")
        .iter()
        .filter(|e| e["event"] == "signal")
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                e["payload"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let kinds: Vec<&str> = signals.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "PROGRESS",
            "BLOCKED",
            "PENDING",
            "DISCOVERY_LOCAL",
            "DISCOVERY_GLOBAL",
            "RESOLVED",
            "PROGRESS",
            "COMPLETE"
        ]
    );
    assert_eq!(
        signals[1].1, "waiting for the API key",
        "split across two writes"
    );

    let mail = waiting_subjects(&env, "marcus");
    assert!(
        mail.iter().any(|s| s.starts_with("[BLOCKED] rio")),
        "{mail:?}"
    );
    assert!(
        mail.iter().any(|s| s.starts_with("[PENDING] rio")),
        "{mail:?}"
    );
    let pending: Value = serde_json::from_str(&env.ok(&["inbox", "marcus", "--json"])).unwrap();
    assert!(
        pending["waiting"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["message"]["type"] == "question"),
        "PENDING asks a question: {pending:#}"
    );

    let memory = std::fs::read_to_string(env.root.join("rio/memory.md")).unwrap();
    assert!(memory.contains("## Discoveries"), "{memory}");
    assert!(
        memory.contains("the archive mirrors lag by a day"),
        "{memory}"
    );
    for other in ["theseus", "clay"] {
        let subjects = waiting_subjects(&env, other);
        assert_eq!(
            subjects,
            ["conditional AMMs show up in three sources"],
            "{other} got the global discovery"
        );
    }
    assert!(waiting_subjects(&env, "rio").is_empty(), "not to itself");
    assert_eq!(
        state(&env, "rio", "metrics.json")["lifetime"]["cross_agent_flags_sent"],
        2
    );

    // Invalid signals: logged with the seed's fields, the session went on.
    let log = std::fs::read_to_string(env.root.join(".daemon/signals.jsonl")).unwrap();
    let records: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let codes: Vec<&str> = records
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        ["SIGNAL_UNKNOWN_TYPE", "SIGNAL_INVALID_PAYLOAD"],
        "{log}"
    );
    for r in &records {
        assert_eq!(r["agent"], "rio");
        assert_eq!(r["level"], "warn");
        assert!(
            r["session"].is_string() && r["raw"].is_string() && r["ts"].is_string(),
            "{r}"
        );
    }
}

#[test]
fn an_unterminated_signal_at_the_end_of_the_output_is_malformed() {
    let env = setup("echo working\nprintf '<axiom>BLOCKED:no end'");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "SIGNAL_MALFORMED is logged", || {
        std::fs::read_to_string(env.root.join(".daemon/signals.jsonl"))
            .is_ok_and(|t| t.contains("SIGNAL_MALFORMED"))
    });
    // The end is recorded after the signal is logged: wait for it too.
    d.wait_until(secs(5.0), "the session ended", || {
        state(&env, "rio", "session.json")["status"] != "running" && d.idle()
    });
    assert_eq!(state(&env, "rio", "session.json")["status"], "completed");
    assert!(state(&env, "rio", "report.json")["blocked_by"].is_null());
}

const SUMMARY: &str = r#"echo "did the work"
cat <<'BLOCK'
## Context Summary

**Goal**: Map conditional AMM designs on Solana
**Current State**: Archived 3 sources on MetaDAO's conditional markets
**Next Agent**: Judge
**Confidence**: 4
**Risk Level**: medium
**Blockers**: waiting for the Drift API key

Agent=Actor | Cycle=2026-11-22-001 | Step=2 | Confidence=4 | Risk=medium | Next=Judge
BLOCK"#;

#[test]
fn the_context_summary_and_signal_block_fill_report_and_session() {
    let env = setup(SUMMARY);
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "the summary is recorded", || {
        state(&env, "rio", "report.json")["risk"] == "medium"
    });
    let r = state(&env, "rio", "report.json");
    let summary = r["summary"].as_str().unwrap();
    assert!(summary.contains("Archived 3 sources"), "{r:#}");
    assert!(summary.contains("Map conditional AMM designs"), "{r:#}");
    assert_eq!(r["blocked_by"], "waiting for the Drift API key");
    assert_eq!(r["confidence"], 4);
    // "Next Agent: Judge" is routing (the handoff notes keep it), not the
    // agent's next priority; the block has no Next Steps.
    assert!(r["next_priority"].is_null(), "{r:#}");
    let s = state(&env, "rio", "session.json");
    assert!(
        s["handoff_notes"]
            .as_str()
            .unwrap()
            .contains("Archived 3 sources"),
        "{s:#}"
    );
    let block = &s["signal_block"];
    assert_eq!(block["agent"], "Actor");
    assert_eq!(block["cycle"], "2026-11-22-001");
    assert_eq!(block["confidence"], 4);
    assert_eq!(block["risk"], "medium");
    assert_eq!(block["next"], "Judge");
}

#[test]
fn what_the_script_set_with_session_end_wins_over_the_summary_block() {
    let body = format!(
        "{SUMMARY}\n{bin:?} --config \"$AGENT_STATE_CONFIG\" session end \"$1\" --summary 'set by the script' --handoff-notes 'script notes' >/dev/null",
        bin = crate::support::BIN
    );
    let env = setup(&body);
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "the summary is recorded", || {
        state(&env, "rio", "report.json")["risk"] == "medium"
    });
    let r = state(&env, "rio", "report.json");
    assert_eq!(r["summary"], "set by the script");
    assert_eq!(
        r["blocked_by"], "waiting for the Drift API key",
        "not set by the script"
    );
    assert_eq!(
        state(&env, "rio", "session.json")["handoff_notes"],
        "script notes"
    );
}

#[test]
fn a_malformed_block_is_logged_like_an_invalid_signal() {
    let env = setup(
        "echo working\necho 'Agent=Actor | Cycle=7 | Confidence=high | Risk=low | Next=Judge'",
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "the problem is logged", || {
        std::fs::read_to_string(env.root.join(".daemon/signals.jsonl"))
            .is_ok_and(|t| t.contains("SIGNAL_BLOCK_INVALID_CONFIDENCE"))
    });
    // The block is judged as the output is read, before the end is
    // recorded: wait for the end too (three loaded CI runs read `running`).
    d.wait_until(secs(10.0), "the session ended", || {
        state(&env, "rio", "session.json")["status"] != "running" && d.idle()
    });
    assert_eq!(state(&env, "rio", "session.json")["status"], "completed");
    assert!(state(&env, "rio", "session.json")["signal_block"].is_null());
}

#[test]
fn a_flood_of_signals_is_capped_and_the_daemon_stays_responsive() {
    // 5000 PROGRESS signals with changing values, 5000 repeats of one value,
    // then COMPLETE after a non-zero exit.
    let env = setup(
        "echo starting\ni=0\nwhile [ $i -lt 5000 ]; do echo \"<axiom>PROGRESS:$((i % 100))</axiom>\"; i=$((i+1)); done\n\
         i=0\nwhile [ $i -lt 5000 ]; do echo '<axiom>PROGRESS:7</axiom>'; i=$((i+1)); done\n\
         echo '<axiom>COMPLETE</axiom>'\nexit 1",
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(60.0), "the session ended", || {
        state(&env, "rio", "session.json")["status"] == "completed"
    });
    let signals = journal(&env, "rio")
        .iter()
        .filter(|e| e["event"] == "signal")
        .count();
    assert!(
        (1..=1000).contains(&signals),
        "at most 1000 signals a session are carried out, {signals} were"
    );
    assert!(d.log_text().contains("the rest are ignored"));
    // COMPLETE still counted although it came after the cap.
    assert_eq!(
        state(&env, "rio", "report.json")["last_session"]["outcome"],
        "completed"
    );
    // And the daemon answers at once: theseus's session starts (its own
    // flood then takes as long as the machine needs).
    env.ok(&["wake", "theseus"]);
    d.wait_until(secs(5.0), "theseus's session started", || {
        state(&env, "theseus", "session.json")["session_id"].is_string()
    });
    d.wait_until(secs(60.0), "theseus's session ended", || {
        state(&env, "theseus", "session.json")["status"] == "completed"
    });
}

#[test]
fn global_discoveries_reach_every_agent_at_most_ten_times_a_session() {
    // 1000 DISCOVERY_GLOBAL signals: without a bound, 1000 flags to every
    // other agent and the daemon's loop busy writing them.
    let env = setup(
        "echo starting\ni=0\nwhile [ $i -lt 1000 ]; do echo \"<axiom>DISCOVERY_GLOBAL:finding $i</axiom>\"; i=$((i+1)); done\n\
         echo '<axiom>COMPLETE</axiom>'",
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(60.0), "the session ended", || {
        state(&env, "rio", "session.json")["status"] == "completed"
    });
    for other in ["theseus", "clay"] {
        let got = waiting_subjects(&env, other);
        assert_eq!(got.len(), 10, "{other} got {} flags: {got:?}", got.len());
    }
    // The rest are kept in rio's own memory, and the journal says why.
    let memory = env.read("rio", "memory.md");
    assert!(memory.contains("finding 999"), "{memory}");
    let not_shared = journal(&env, "rio")
        .iter()
        .filter(|e| e["event"] == "signal")
        .filter(|e| {
            e["effect"]
                .as_str()
                .is_some_and(|x| x.contains("not shared"))
        })
        .count();
    assert_eq!(not_shared, 990);
    env.ok(&["wake", "theseus"]);
    // The bound of a proof, not a speed target: a busy machine may take a
    // while to run theseus after rio's thousand signals.
    d.wait_until(secs(30.0), "theseus ran", || {
        state(&env, "theseus", "session.json")["status"] == "completed"
    });
}
