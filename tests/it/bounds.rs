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
