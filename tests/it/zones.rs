//! Time zones come from the system's database (tzdata), read only when the
//! config names one (issue 21, "Performance": the compiled-in tables were
//! most of every process start). `TZDIR` points a process at another
//! database, as for glibc: here an empty directory stands for a machine
//! without tzdata.

use crate::support::*;

const ZONED: &str = r#"
[budget]
timezone = "America/New_York"

[[agent]]
name = "rio"
schedule = "30 2 * * *"
timezone = "Europe/Berlin"
"#;

const UNZONED: &str = r#"
[[agent]]
name = "rio"
schedule = "30 2 * * *"
"#;

fn doctor_zone_line(env: &Env, tzdir: Option<&std::path::Path>) -> String {
    let mut cmd = env.command(&["doctor"]);
    if let Some(dir) = tzdir {
        cmd.env("TZDIR", dir);
    }
    let out = cmd.output().expect("run doctor");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    stdout
        .lines()
        .find(|l| l.contains("time zones:"))
        .unwrap_or_else(|| panic!("doctor printed no time zone line:\n{stdout}"))
        .to_string()
}

#[test]
fn a_named_zone_without_the_database_is_a_config_error_naming_the_field_and_tzdata() {
    let env = Env::with_config(ZONED);
    let empty = env.tmp("no-zoneinfo");
    std::fs::create_dir(&empty).unwrap();
    let out = env
        .command(&["check"])
        .env("TZDIR", &empty)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    for field in ["agent[0] (rio).timezone", "budget.timezone"] {
        let line = stderr
            .lines()
            .find(|l| l.contains(field))
            .unwrap_or_else(|| panic!("no problem for {field}:\n{stderr}"));
        assert!(line.contains("tzdata"), "{line}");
        assert!(line.contains(&empty.display().to_string()), "{line}");
    }
    // An unknown name is still an unknown name, with the database there.
    env.set_config(&ZONED.replace("Europe/Berlin", "Mars/Olympus"));
    let stderr = env.fails(&["check"], 78);
    assert!(
        stderr.contains("agent[0] (rio).timezone: \"Mars/Olympus\" is not an IANA time zone name"),
        "{stderr}"
    );
}

#[test]
fn without_a_named_zone_no_database_is_needed() {
    let env = Env::with_config(UNZONED);
    let empty = env.tmp("no-zoneinfo");
    std::fs::create_dir(&empty).unwrap();
    let run = |args: &[&str]| {
        let out = env.command(args).env("TZDIR", &empty).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["bootstrap"]);
    let sid = run(&["session", "begin", "rio"]);
    run(&[
        "session",
        "end",
        "rio",
        "--session",
        sid.trim(),
        "--summary",
        "done",
    ]);
    assert_eq!(env.json("rio", "session.json")["status"], "completed");
    assert_eq!(
        doctor_zone_line(&env, Some(&empty)),
        "ok    time zones: none but UTC: the time zone database is not read"
    );
}

#[test]
fn hooks_and_doctor_with_zones_read_them_from_the_system_database() {
    let env = Env::with_config(ZONED);
    env.ok(&["bootstrap"]);
    let sid = env.ok(&["session", "begin", "rio"]);
    env.ok(&["session", "end", "rio", "--session", sid.trim()]);
    assert_eq!(env.json("rio", "session.json")["status"], "completed");
    let usage = env.ok(&["usage"]);
    assert!(usage.contains("days in America/New_York"), "{usage}");
    assert_eq!(
        doctor_zone_line(&env, None),
        "ok    time zones: America/New_York, Europe/Berlin (from /usr/share/zoneinfo)"
    );
}

/// The compiled-in tables named every zone; the binary now names none it
/// does not use itself. (Their relocations were most of a process start:
/// bench/hooks/README.md.)
#[test]
fn the_binary_carries_no_time_zone_tables() {
    let bytes = std::fs::read(BIN).unwrap();
    for name in [
        "Antarctica/DumontDUrville",
        "America/Argentina/ComodRivadavia",
    ] {
        assert!(
            !bytes.windows(name.len()).any(|w| w == name.as_bytes()),
            "{BIN} contains {name:?}: time zone tables are compiled in again"
        );
    }
}
