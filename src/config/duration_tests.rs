//! Every duration the config file takes is bounded by
//! [`crate::clock::MAX_DURATION`]: the longest passes `check`, one day more
//! is a problem naming the field and the maximum, and nothing between parses
//! into a time the daemon cannot compute with.

use super::*;

/// One config per duration field, `{}` where the value goes, and the field
/// the problem must name.
const FIELDS: &[(&str, &str)] = &[
    (
        "[daemon]\ncatch_up_window = \"{}\"",
        "daemon.catch_up_window",
    ),
    ("[daemon]\nshutdown_grace = \"{}\"", "daemon.shutdown_grace"),
    ("[defaults]\ntimeout = \"{}\"", "defaults.timeout"),
    ("[defaults]\nkill_grace = \"{}\"", "defaults.kill_grace"),
    (
        "[defaults]\ninbox_debounce = \"{}\"",
        "defaults.inbox_debounce",
    ),
    ("[defaults]\ninbox_settle = \"{}\"", "defaults.inbox_settle"),
    (
        "[defaults]\nwake_request_interval = \"{}\"",
        "defaults.wake_request_interval",
    ),
    ("[defaults]\njitter = \"{}\"", "defaults.jitter"),
    ("[defaults]\nretry_delay = \"{}\"", "defaults.retry_delay"),
    (
        "[defaults]\nspawn_retry_delay = \"{}\"",
        "defaults.spawn_retry_delay",
    ),
    ("[defaults]\nmax_backoff = \"{}\"", "defaults.max_backoff"),
    (
        "[defaults]\nstall_timeout = \"{}\"",
        "defaults.stall_timeout",
    ),
    (
        "[defaults]\nverify_timeout = \"{}\"",
        "defaults.verify_timeout",
    ),
    (
        "[defaults]\nbudget = { max_runtime = \"{}\" }",
        "defaults.budget.max_runtime",
    ),
    (
        "[[agent]]\nname = \"rio\"\njitter = \"{}\"",
        "agent[0] (rio).jitter",
    ),
    (
        "[[agent]]\nname = \"rio\"\nworkspace = { repo = \"/srv/r\", retention = \"{}\" }",
        "retention",
    ),
    ("[health]\ninterval = \"{}\"", "health.interval"),
    (
        "[health]\nprocessed_retention = \"{}\"",
        "health.processed_retention",
    ),
    (
        "[health]\nsession_log_retention = \"{}\"",
        "health.session_log_retention",
    ),
    ("[health]\nsuccess_within = \"{}\"", "health.success_within"),
    ("[hooks]\ntimeout = \"{}\"", "hooks.timeout"),
    (
        "[metrics]\ntextfile = \"/m/a.prom\"\ninterval = \"{}\"",
        "metrics.interval",
    ),
    ("[usage_limits]\nmax_wait = \"{}\"", "usage_limits.max_wait"),
    (
        "[credential.b]\nkind = \"api_key\"\ncheck_every = \"{}\"",
        "check_every",
    ),
    (
        "[logs]\njournal_retention = \"{}\"",
        "logs.journal_retention",
    ),
    (
        "[logs]\ndaemon_log_retention = \"{}\"",
        "logs.daemon_log_retention",
    ),
    (
        "[[agent]]\nname = \"p\"\n[[agent]]\nname = \"a\"\nworkspace = { repo = \"/srv/r\" }\n\
         [[agent]]\nname = \"j\"\n[[agent]]\nname = \"h\"\nkind = \"human\"\n\
         [[flow]]\nname = \"f\"\nplanner = \"p\"\nactor = \"a\"\njudge = \"j\"\non_approve_timeout = \"{}\"",
        "on_approve_timeout",
    ),
];

fn problems(text: &str) -> Vec<String> {
    match Config::parse(text, Path::new("/x/c.toml")) {
        Ok(_) => vec![],
        Err(ConfigError::Invalid { problems, .. }) => {
            problems.iter().map(|p| p.to_string()).collect()
        }
        Err(e) => vec![e.to_string()],
    }
}

#[test]
fn every_duration_field_refuses_more_than_a_hundred_years() {
    for (template, field) in FIELDS {
        let at_most = problems(&template.replace("{}", "36525d"));
        assert!(
            !at_most.iter().any(|p| p.contains("maximum")),
            "{field}: 36525d refused: {at_most:?}"
        );
        for too_long in ["36526d", "9999999999d", "584942417355y"] {
            let p = problems(&template.replace("{}", too_long));
            assert!(
                p.iter().any(|p| p.contains(field)
                    && (p.contains("maximum of 100 years (36525d)")
                        || p.contains("is not a duration"))),
                "{field} = {too_long:?}: {p:?}"
            );
        }
    }
}

#[test]
fn a_jitter_that_passes_check_computes_a_wake_time() {
    // The crash of issue 20: a jitter that passed `check` overflowed the
    // date arithmetic of `wake_at`. Every jitter `check` accepts now gives
    // a time on the calendar, from today and from the calendar's end.
    let fire = crate::clock::Timestamp::parse("2026-11-26T22:00:00Z")
        .unwrap()
        .0;
    for text in [
        "0s",
        "1s",
        "59m",
        "36525d",
        "36526d",
        "9999999999d",
        "1000000000y",
    ] {
        let config = format!("[[agent]]\nname = \"rio\"\njitter = \"{text}\"\n");
        let Ok(c) = Config::parse(&config, Path::new("/x/c.toml")) else {
            continue;
        };
        let jitter = c.agents[0].session.jitter;
        assert!(jitter <= crate::clock::MAX_DURATION, "{text}");
        for from in [fire, crate::clock::latest()] {
            let offset = crate::schedule::jitter_offset("rio", from, jitter);
            let at = crate::clock::later(from, offset);
            assert!(at >= from.min(crate::clock::latest()) && at <= crate::clock::latest());
        }
    }
}
