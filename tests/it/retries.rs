//! Retries measured in time, not counts (seed 002's error matrix): a
//! network failure ("connection refused") is retried until
//! `network_retry_for` has passed since the first failure, then escalated.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{Env, daemon_config};

/// A stand-in for `claude -p --output-format json` whose API connection is
/// refused: the JSON result Claude Code prints then, exit 1.
fn refused_claude(env: &Env) -> PathBuf {
    env.script(
        "fake-claude.sh",
        "cat > /dev/null\nprintf '%s\\n' '{\"type\":\"result\",\"session_id\":\"'$$-$(date +%s%N)'\",\"subtype\":\"success\",\"is_error\":true,\"result\":\"API Error: Connection error. (connect ECONNREFUSED 127.0.0.1:443)\",\"total_cost_usd\":0}'\nexit 1",
    )
}

fn api_errors(env: &Env) -> Vec<Value> {
    let out = env.ok(&["errors", "--json"]);
    serde_json::from_str::<Vec<Value>>(&out)
        .expect("errors --json")
        .into_iter()
        .filter(|r| r["code"] == "AGENT_API_ERROR")
        .collect()
}

#[test]
fn connection_refused_is_retried_for_network_retry_for_then_escalated() {
    let env = Env::with_config("");
    let script = refused_claude(&env);
    env.set_config(&daemon_config(
        &script,
        &[],
        &[
            ("retry_delay", "\"300ms\""),
            ("max_backoff", "\"400ms\""),
            ("api_retries", "1"),
            ("network_retry_for", "\"3s\""),
        ],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    let d = env.daemon();
    let t0 = Instant::now();
    env.ok(&["wake", "rio"]);
    d.wait_until(
        Duration::from_secs(30),
        "the network failure escalated",
        || api_errors(&env).iter().any(|r| r["escalated"] == true),
    );
    let elapsed = t0.elapsed();
    let recs = api_errors(&env);
    // Not after api_retries (1) + 1 attempts: after 3 s of them (retries
    // 0.3-0.4 s apart). The daemon's clock counts whole seconds, so the
    // window may close up to 1 s early.
    assert!(elapsed >= Duration::from_secs(2), "{elapsed:?} {recs:?}");
    assert!(recs.len() >= 4, "{} attempts: {recs:?}", recs.len());
    let escalated: Vec<_> = recs.iter().filter(|r| r["escalated"] == true).collect();
    assert_eq!(escalated.len(), 1, "{recs:?}");
    let last = recs.last().unwrap();
    assert_eq!(
        last["escalated"], true,
        "the last attempt escalates: {recs:?}"
    );
    let message = last["message"].as_str().unwrap_or_default();
    assert!(message.contains("ECONNREFUSED"), "{message}");
    assert!(message.contains("still failing after"), "{message}");
}
