//! A rejected inbox file is reported under the name it was really kept
//! under (issue 20): a name that is not UTF-8 is kept as
//! `not-utf8-….json`, and the daemon's log, `errors.jsonl` and `session
//! begin` must name that file, not the escaped original that does not
//! exist in `rejected/`.

use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const LATIN1: &[u8] = b"caf\xe9.json";

/// `inbox/rejected/NAME` as said in `text` after `kept as `, if any.
fn kept_name(text: &str) -> Option<String> {
    let at = text.find("kept as inbox/rejected/")? + "kept as inbox/rejected/".len();
    let rest = &text[at..];
    let end = rest
        .find(|c: char| c == ')' || c == '"' || c.is_whitespace())
        .unwrap_or(rest.len());
    Some(rest[..end].to_string())
}

fn drop_latin1(env: &Env) {
    let path = env
        .path("rio", "inbox")
        .join(std::ffi::OsStr::from_bytes(LATIN1));
    std::fs::write(path, r#"{"from":"leo","subject":"hi"}"#).unwrap();
}

#[test]
fn the_daemon_names_the_file_a_non_utf8_name_was_kept_under() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "exit 0\n");
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\"")],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"leo\"\n",
    ));
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    drop_latin1(&env);
    let errors = env.root.join(".daemon/errors.jsonl");
    let mut record = Value::Null;
    d.wait_until(Duration::from_secs(20), "the rejection is recorded", || {
        record = std::fs::read_to_string(&errors)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|r| r["code"] == "INBOX_REJECTED")
            .unwrap_or(Value::Null);
        !record.is_null()
    });
    let rejected = env.files("rio", "inbox/rejected");
    let details = record["details"].as_str().unwrap_or_default();
    let named =
        kept_name(details).unwrap_or_else(|| panic!("errors.jsonl names no kept file: {record}"));
    assert!(
        rejected.contains(&named),
        "errors.jsonl says the file was kept as {named}, but rejected/ holds {rejected:?}: {record}"
    );
    assert!(
        record["message"]
            .as_str()
            .unwrap_or_default()
            .contains(r"caf\xe9.json"),
        "the original name, escaped: {record}"
    );
    d.wait_until(Duration::from_secs(10), "the rejection is logged", || {
        d.log_text().contains("INBOX_REJECTED") || d.log_text().contains(r"caf\xe9.json")
    });
    let log = d.log_text();
    let line = log
        .lines()
        .find(|l| l.contains(r"caf\xe9.json"))
        .unwrap_or_default();
    assert_eq!(
        kept_name(line).as_deref(),
        Some(named.as_str()),
        "the log names the file kept: {line}"
    );
}

#[test]
fn session_begin_names_the_file_a_non_utf8_name_was_kept_under() {
    let env = Env::standard();
    drop_latin1(&env);
    let out = env.run(&["session", "begin", "rio"]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    let rejected = env.files("rio", "inbox/rejected");
    let named = kept_name(&said).unwrap_or_else(|| panic!("names no kept file: {said}"));
    assert!(
        rejected.contains(&named),
        "session begin says kept as {named}, rejected/ holds {rejected:?}: {said}"
    );
}
