//! A config edit never breaks running work: while config.toml has a typo,
//! the hooks of running sessions and the read-only commands work on the last
//! configuration the daemon accepted (and say so on stderr), while
//! `bootstrap`, `check` and `daemon` refuse; `agent-state reload` (the
//! unit's ExecReload=) validates, signals the daemon and reports its verdict.

use serde_json::Value;

use crate::support::Env;

const FALLBACK: &str = "using the last configuration the daemon accepted";

fn config_text(env: &Env) -> String {
    std::fs::read_to_string(&env.config).unwrap()
}

/// Replace the config file's text as an editor would (in place).
fn edit(env: &Env, text: &str) {
    std::fs::write(&env.config, text).unwrap();
}

#[test]
fn a_config_typo_while_a_script_session_runs_keeps_its_hooks_working() {
    let env = Env::standard();
    let good = config_text(&env);
    {
        // The daemon accepts the config once (and keeps a copy of it).
        let _d = env.daemon();
    }
    assert!(env.root.join(".daemon/config.accepted.toml").is_file());
    // A session script begins its session...
    let id = env
        .ok(&["session", "begin", "rio", "--timeout", "90m"])
        .trim()
        .to_string();
    for typo in [
        // ...and someone edits the config: a field that does not exist,
        format!("{good}\n[daemon]\nmax_concurent_sessions = 3\n"),
        // or a file that is not even TOML.
        format!("{good}\n[[agent]\nname = \"clay\"\n"),
    ] {
        edit(&env, &typo);
        let out = env.run(&["status", "--json"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "status: {stderr}");
        assert!(stderr.contains(FALLBACK), "{stderr}");
        assert!(
            stderr.contains(&env.config.display().to_string()) && stderr.contains("is invalid"),
            "names the file: {stderr}"
        );
        // What needs the file itself still refuses, with the problems.
        let check = env.fails(&["check"], 78);
        assert!(!check.contains(FALLBACK), "{check}");
        env.fails(&["bootstrap"], 78);
    }
    // The script's `session end` records the session.
    let out = env.run(&[
        "session",
        "end",
        "rio",
        "--session",
        &id,
        "--summary",
        "done despite the typo",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains(FALLBACK), "{stderr}");
    let session = env.json("rio", "session.json");
    assert_eq!(session["status"], "completed", "{session:#}");
    assert_eq!(env.events("rio", "session_end").len(), 1);
    assert_eq!(
        env.json("rio", "report.json")["summary"],
        "done despite the typo"
    );
    // Fixed: no warning any more.
    edit(&env, &good);
    let out = env.run(&["status"]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains(FALLBACK));
}

#[test]
fn a_typo_without_a_daemon_ever_started_is_still_an_error() {
    let env = Env::standard();
    let good = config_text(&env);
    edit(&env, &format!("{good}\nbogus = 1\n"));
    let stderr = env.fails(&["status"], 78);
    assert!(stderr.contains("bogus"), "{stderr}");
}

fn reload_verdict(env: &Env) -> Value {
    crate::support::read_json(&env.root.join(".daemon/reload.json"))
}

#[test]
fn reload_reports_the_daemons_verdict() {
    let env = Env::standard();
    let good = config_text(&env);
    let d = env.daemon();
    let first = reload_verdict(&env)["generation"].as_u64().unwrap();

    // Accepted: a new agent.
    edit(
        &env,
        &format!("{good}\n[[agent]]\nname = \"clay\"\ndomain = \"entertainment\"\n"),
    );
    let out = env.ok(&["reload"]);
    assert!(out.contains("reloaded"), "{out}");
    assert!(d.heartbeat()["agents"].to_string().contains("clay"));
    let v = reload_verdict(&env);
    assert_eq!(v["accepted"], true);
    assert!(v["generation"].as_u64().unwrap() > first);
    let copy = std::fs::read_to_string(env.root.join(".daemon/config.accepted.toml")).unwrap();
    assert!(copy.contains("clay"), "the accepted copy is the new text");

    // A typo: every problem printed, exit 78, the daemon not signalled.
    let accepted = config_text(&env);
    edit(
        &env,
        &accepted
            .replace("schedule = \"0 22 * * *\"", "schedule = \"at ten\"")
            .replace("domain = \"entertainment\"", "domian = \"entertainment\""),
    );
    let generation = reload_verdict(&env)["generation"].clone();
    let stderr = env.fails(&["reload"], 78);
    assert!(
        stderr.contains("schedule") && stderr.contains("at ten"),
        "{stderr}"
    );
    assert!(stderr.contains("domian"), "{stderr}");
    assert_eq!(
        reload_verdict(&env)["generation"],
        generation,
        "not signalled"
    );

    // Valid, but refused by the daemon: the reason, exit 78.
    let elsewhere = env.tmp("elsewhere");
    edit(
        &env,
        &accepted.replace(
            &format!("state_root = {:?}", env.root.display().to_string()),
            &format!("state_root = {:?}", elsewhere.display().to_string()),
        ),
    );
    // systemd passes the daemon's pid (ExecReload=... reload --pid $MAINPID).
    let stderr = env.fails(&["reload", "--pid", &d.pid.to_string()], 78);
    assert!(stderr.contains("refused"), "{stderr}");
    assert!(stderr.contains("state_root cannot change"), "{stderr}");
    // The daemon's own verdict on it (SIGHUP sent directly), which
    // `agent-state reload` reports when the daemon runs on the file's root.
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let refused = crate::support::poll_until(std::time::Duration::from_secs(5), || {
        reload_verdict(&env)["accepted"] == false
    });
    assert!(refused, "{:#}", reload_verdict(&env));
    let v = reload_verdict(&env);
    assert!(
        v["reasons"]
            .to_string()
            .contains("state_root cannot change"),
        "{v:#}"
    );
    // The old config stays in force, and the CLI never used the refused one.
    assert!(d.heartbeat()["agents"].to_string().contains("clay"));
}
