//! Values at the edge of what the file and the flags accept: every duration
//! is at most 100 years and every cost and token count is bounded when it is
//! read, so a value `check` accepts never crashes the daemon, and a total
//! never prints as `inf`.

use crate::support::Env;

const TOO_LONG: &str = "9999999999d";

#[test]
fn a_jitter_longer_than_a_hundred_years_is_refused_by_check_and_by_the_daemon() {
    // On main, `check` accepted this and every start of the daemon panicked
    // (exit 101) adding the jitter to the next fire: systemd restarted it
    // for ever. Now both refuse the config, naming the field and the bound.
    let env = Env::with_config(&format!(
        "[[agent]]\nname = \"rio\"\nschedule = \"0 22 * * *\"\njitter = \"{TOO_LONG}\"\n"
    ));
    let err = env.fails(&["check"], 78);
    assert!(
        err.contains("agent[0] (rio).jitter")
            && err.contains("longer than the maximum of 100 years (36525d)"),
        "{err}"
    );
    let err = env.fails(&["daemon"], 78);
    assert!(err.contains("agent[0] (rio).jitter"), "{err}");

    env.set_config(
        "[[agent]]\nname = \"rio\"\nschedule = \"0 22 * * *\"\n[health]\nsuccess_within = \"36526d\"\n",
    );
    let err = env.fails(&["check"], 78);
    assert!(err.contains("health.success_within"), "{err}");
}

#[test]
fn the_longest_jitter_check_accepts_gives_a_wake_time_and_the_daemon_runs() {
    // The bound itself, from a start near the end of the calendar: the
    // next wake is computed (saturated at 9999-12-31T23:59:59Z at worst)
    // and written, and the daemon keeps running.
    let env = Env::with_config(
        "[[agent]]\nname = \"rio\"\nschedule = \"0 22 * * *\"\njitter = \"36525d\"\n",
    );
    env.ok(&["check"]);
    env.ok(&["bootstrap"]);
    let mut d =
        crate::support::Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "9990-01-01T00:00:00Z")]);
    let next = || {
        d.heartbeat()["next_wakes"]["rio"]
            .as_str()
            .map(str::to_string)
    };
    crate::support::poll_until(std::time::Duration::from_secs(30), || next().is_some());
    let at = next().expect("a next wake for rio in daemon.json");
    assert!(
        at.as_str() > "9990-01-01" && at.as_str() <= "9999-12-31T23:59:59Z",
        "{at}"
    );
    assert!(d.is_running(), "{}", d.log_text());
}

#[test]
fn duration_flags_longer_than_a_hundred_years_are_refused_naming_the_flag() {
    // On main, `health --success-within`, `errors --since`, `events --since`
    // and `send --expires-in` with this value panicked in the date
    // arithmetic (exit 101); the others waited or looked back for ever.
    let env = Env::with_config("[[agent]]\nname = \"rio\"\n[[agent]]\nname = \"leo\"\n");
    env.ok(&["bootstrap"]);
    let send = [
        "send",
        "--from",
        "leo",
        "--to",
        "rio",
        "--subject",
        "s",
        "--expires-in",
        TOO_LONG,
    ];
    let cases: [(&[&str], &str, i32); 8] = [
        (
            &["health", "--success-within", TOO_LONG],
            "--success-within",
            64,
        ),
        (&["health", "--max-age", TOO_LONG], "--max-age", 2),
        (&["errors", "--since", TOO_LONG], "--since", 2),
        (&["events", "--since", TOO_LONG], "--since", 64),
        (&send, "--expires-in", 2),
        (&["wake", "rio", "--wait", TOO_LONG], "--wait", 2),
        (&["reload", "--wait", TOO_LONG], "--wait", 2),
        (&["doctor", "--max-age", TOO_LONG], "--max-age", 2),
    ];
    for (args, flag, code) in cases {
        let err = env.fails(args, code);
        assert!(
            err.contains(flag) && err.contains("maximum of 100 years (36525d)"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // The bound itself is accepted: a message that expires in 100 years.
    let ok = env.ok(&[
        "send",
        "--from",
        "leo",
        "--to",
        "rio",
        "--subject",
        "s",
        "--expires-in",
        "36525d",
    ]);
    assert!(ok.starts_with("sent "), "{ok}");
    assert_eq!(env.waiting("rio").len(), 1, "{:?}", env.waiting("rio"));
}

/// `session begin` then `session end` of `agent` with `extra` arguments;
/// returns the end's exit code and stderr.
fn session_with(env: &Env, agent: &str, extra: &[&str]) -> (Option<i32>, String) {
    let id = env.ok(&["session", "begin", agent]).trim().to_string();
    let mut args = vec!["session", "end", agent, "--session", &id];
    args.extend_from_slice(extra);
    let out = env.run(&args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_cost_or_token_count_past_its_bound_is_refused_and_totals_never_print_inf() {
    // On main, two `session end --cost-usd 1e308` were recorded and `usage`
    // printed `$inf` (and `null` in --json).
    let env = Env::with_config("[[agent]]\nname = \"leo\"\n");
    env.ok(&["bootstrap"]);
    for _ in 0..2 {
        let (code, err) = session_with(&env, "leo", &["--cost-usd", "1e308"]);
        assert_eq!(code, Some(0), "{err}");
        assert!(
            err.contains("--cost-usd \"1e308\"") && err.contains("maximum of $1000000"),
            "{err}"
        );
    }
    let (code, err) = session_with(&env, "leo", &["--tokens-used", "18446744073709551615"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("--tokens-used") && err.contains("maximum of 1000000000000 tokens"),
        "{err}"
    );
    // On main the second of these panicked adding up the lifetime metrics.
    for _ in 0..2 {
        let (code, err) =
            session_with(&env, "leo", &["--sources-archived", "18446744073709551615"]);
        assert_eq!(code, Some(0), "{err}");
        assert!(
            err.contains("--sources-archived") && err.contains("maximum of 1000000 sources"),
            "{err}"
        );
    }
    // Everything else of those sessions was recorded.
    assert_eq!(env.events("leo", "session_end").len(), 5);
    let text = env.ok(&["usage"]);
    assert!(text.contains("$0.00") && !text.contains("inf"), "{text}");

    // Journal lines written before the bound (or by hand) count at most the
    // bound each, and the sums stay finite.
    let journal = env.path("leo", "journal.jsonl");
    let ends: Vec<String> = std::fs::read_to_string(&journal)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"session_end\""))
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["cost_usd"] = serde_json::json!(1e308);
            v["tokens_used"] = serde_json::json!(u64::MAX);
            v["sources_archived"] = serde_json::json!(u64::MAX);
            v.to_string()
        })
        .collect();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .unwrap();
    for line in &ends {
        use std::io::Write;
        writeln!(f, "{line}").unwrap();
    }
    drop(f);
    let text = env.ok(&["usage"]);
    assert!(!text.contains("inf") && !text.contains("NaN"), "{text}");
    assert!(text.contains("$5000000.00"), "{text}");
    // The lifetime sums saturate rather than overflow.
    env.ok(&["metrics", "rebuild"]);
    let m = env.json("leo", "metrics.json");
    assert_eq!(m["lifetime"]["sources_archived"], u64::MAX, "{m}");
    let v: serde_json::Value = serde_json::from_str(&env.ok(&["usage", "--json"])).unwrap();
    let leo = &v["days"][0]["agents"]["leo"];
    assert_eq!(leo["cost_usd"], 5_000_000.0, "{v}");
    assert_eq!(leo["tokens"]["total"], 5_000_000_000_000u64, "{v}");
}
