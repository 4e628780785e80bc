//! The permission model (README, "Permission model") with real users: a
//! service user that owns the state, members of the inbox group who send
//! mail, and an outsider who can only read the agent directories. Creates
//! users and a group, so it runs only as root with AGENT_STATE_ROOT_TESTS=1.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::support::{BIN, account, run_tool};

pub(crate) fn enabled(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    let on = std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() == Ok("1");
    let tools = ["useradd", "groupadd", "userdel", "groupdel", "runuser"]
        .iter()
        .all(|t| {
            Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
    if root && on && tools {
        return true;
    }
    eprintln!(
        "SKIPPED: {test} creates users and a group; it runs only as root with AGENT_STATE_ROOT_TESTS=1 \
         and useradd, groupadd, runuser on PATH (root: {root}, AGENT_STATE_ROOT_TESTS=1: {on}, tools: {tools})"
    );
    false
}

/// A service user, two members of the inbox group and an outsider; removed
/// however the test ends.
pub(crate) struct Accounts {
    pub(crate) group: String,
    pub(crate) svc: String,
    pub(crate) alice: String,
    pub(crate) bob: String,
    pub(crate) out: String,
}

impl Accounts {
    fn create(tag: &str) -> Accounts {
        let a = Accounts {
            group: account(&format!("asp{tag}grp")),
            svc: account(&format!("asp{tag}svc")),
            alice: account(&format!("asp{tag}alice")),
            bob: account(&format!("asp{tag}bob")),
            out: account(&format!("asp{tag}out")),
        };
        a.remove();
        must("groupadd", &["--system", &a.group]);
        must(
            "useradd",
            &[
                "--system", "-M", "-N", "-g", &a.group, "-s", "/bin/sh", &a.svc,
            ],
        );
        for member in [&a.alice, &a.bob] {
            must(
                "useradd",
                &[
                    "--system", "-M", "-N", "-G", &a.group, "-s", "/bin/sh", member,
                ],
            );
        }
        must(
            "useradd",
            &["--system", "-M", "-N", "-s", "/bin/sh", &a.out],
        );
        a
    }

    fn remove(&self) {
        for user in [&self.svc, &self.alice, &self.bob, &self.out] {
            quiet("userdel", &[user]);
        }
        quiet("groupdel", &[&self.group]);
    }
}

impl Drop for Accounts {
    fn drop(&mut self) {
        self.remove();
    }
}

fn must(program: &str, args: &[&str]) {
    let out = run_tool(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn quiet(program: &str, args: &[&str]) {
    let _ = run_tool(program, args);
}

/// A state root under a directory every test user can enter, bootstrapped
/// by the service user as the unit would.
pub(crate) struct World {
    _dir: tempfile::TempDir,
    pub(crate) base: PathBuf,
    pub(crate) bin: PathBuf,
    pub(crate) config: PathBuf,
    pub(crate) root: PathBuf,
    pub(crate) acc: Accounts,
}

impl World {
    pub(crate) fn new(tag: &str) -> World {
        let acc = Accounts::create(tag);
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().to_path_buf();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The test binary's own copy, in case the build directory is not
        // open to other users.
        let bin = base.join("agent-state");
        std::fs::copy(BIN, &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = base.join("state");
        let config = base.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "state_root = {:?}\ngroup = {:?}\n{}",
                root.display().to_string(),
                acc.group,
                crate::support::STANDARD_AGENTS
            ),
        )
        .unwrap();
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
        // As tmpfiles.d does: the root exists, owned by the service user.
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        must(
            "chown",
            &[
                &format!("{}:{}", acc.svc, acc.group),
                root.to_str().unwrap(),
            ],
        );
        let w = World {
            _dir: dir,
            base,
            bin,
            config,
            root,
            acc,
        };
        let out = w.run(&w.acc.svc, &["bootstrap"]);
        assert!(out.status.success(), "bootstrap: {}", show(&out));
        w
    }

    /// `agent-state ARGS` as `user`.
    pub(crate) fn run(&self, user: &str, args: &[&str]) -> Output {
        Command::new("runuser")
            .args(["-u", user, "--"])
            .arg(&self.bin)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .current_dir(&self.base)
            .env_remove("AGENT_STATE_CONFIG")
            .output()
            .unwrap()
    }

    /// `sh -c SCRIPT` as `user`, in the state root.
    pub(crate) fn sh(&self, user: &str, script: &str) -> Output {
        Command::new("runuser")
            .args(["-u", user, "--", "sh", "-c", script])
            .current_dir(&self.root)
            .output()
            .unwrap()
    }

    fn inbox(&self, agent: &str) -> PathBuf {
        self.root.join(agent).join("inbox")
    }

    fn waiting(&self, agent: &str) -> Vec<String> {
        names(&self.inbox(agent))
            .into_iter()
            .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
            .collect()
    }
}

pub(crate) fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    n.sort();
    n
}

/// Every path below `root` with its type, mode, owner, size and mtime
/// (never following links): what a read-only command must leave as it was.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        out.push(format!(
            "{} {:o} {}:{} {} {}.{}",
            p.display(),
            m.mode(),
            m.uid(),
            m.gid(),
            m.len(),
            m.mtime(),
            m.mtime_nsec()
        ));
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out.sort();
    out
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

const MESSAGE: &str = r#"{"from":"marcus","subject":"by hand","priority":"high","body":"typed"}"#;

#[test]
fn group_members_deliver_every_way_and_the_service_user_claims_it() {
    if !enabled("group_members_deliver_every_way_and_the_service_user_claims_it") {
        return;
    }
    let w = World::new("d");
    let inbox = w.inbox("rio");
    assert_eq!(mode(&inbox), 0o3770);
    assert_eq!(mode(&inbox.join(".tmp")), 0o3770);
    for d in ["processed", "rejected", ".claimed"] {
        assert_eq!(mode(&inbox.join(d)), 0o2750, "{d}");
    }

    // `send`, `cat >`, `cp`, and an editor's write-a-temp-then-rename.
    let sent = w.run(
        &w.acc.alice,
        &[
            "send",
            "--from",
            "marcus",
            "--to",
            "rio",
            "--subject",
            "sent",
            "--body",
            "b",
        ],
    );
    assert!(sent.status.success(), "{}", show(&sent));
    let by_hand = format!(
        "printf '%s\\n' '{MESSAGE}' > rio/inbox/typed.json && \
         printf '%s\\n' '{MESSAGE}' > /tmp/asp-cp-$$.json && cp /tmp/asp-cp-$$.json rio/inbox/copied.json && \
         rm /tmp/asp-cp-$$.json && \
         printf '%s\\n' '{MESSAGE}' > rio/inbox/.edited.json.swp && mv rio/inbox/.edited.json.swp rio/inbox/edited.json"
    );
    let out = w.sh(&w.acc.alice, &by_hand);
    assert!(out.status.success(), "{}", show(&out));
    let waiting = w.waiting("rio");
    assert_eq!(waiting.len(), 4, "{waiting:?}");
    for name in &waiting {
        let m = std::fs::metadata(inbox.join(name)).unwrap();
        assert_eq!(
            m.gid(),
            std::fs::metadata(&inbox).unwrap().gid(),
            "{name} keeps the inbox group (setgid)"
        );
    }

    // The service user's session claims all four, and its end moves them
    // (files the members own) to processed/.
    let begin = w.run(&w.acc.svc, &["session", "begin", "rio"]);
    assert!(begin.status.success(), "{}", show(&begin));
    let sid = String::from_utf8_lossy(&begin.stdout).trim().to_string();
    let claimed = names(&inbox.join(".claimed").join(&sid));
    assert_eq!(claimed.len(), 4, "{claimed:?}");
    assert!(w.waiting("rio").is_empty());
    assert!(names(&inbox.join("rejected")).is_empty());
    let end = w.run(&w.acc.svc, &["session", "end", "rio", "--session", &sid]);
    assert!(end.status.success(), "{}", show(&end));
    assert_eq!(names(&inbox.join("processed")).len(), 4);
    // Each arrival names the file's owner beside the `from` its writer chose
    // ("marcus" was alice's label), in the journal and in `events`.
    let journal = std::fs::read_to_string(w.root.join("rio/journal.jsonl")).unwrap();
    let received: Vec<serde_json::Value> = journal
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "message_received")
        .collect();
    assert_eq!(received.len(), 4, "{journal}");
    for e in &received {
        assert_eq!(e["sender"], w.acc.alice.as_str(), "{e}");
    }
    let events = w.run(&w.acc.bob, &["events", "--agent", "rio"]);
    let events = String::from_utf8_lossy(&events.stdout).to_string();
    assert!(
        events.lines().any(|l| l.contains("message_received")
            && l.contains("marcus")
            && l.contains(&format!("(file of {})", w.acc.alice))),
        "{events}"
    );
    // The group may read the listings the daemon keeps.
    let listing = w.run(&w.acc.bob, &["inbox", "rio"]);
    assert!(listing.status.success(), "{}", show(&listing));
    assert!(
        String::from_utf8_lossy(&listing.stdout).contains("4 processed"),
        "{}",
        show(&listing)
    );
}

#[test]
fn members_cannot_take_each_others_mail_or_redirect_the_daemon() {
    if !enabled("members_cannot_take_each_others_mail_or_redirect_the_daemon") {
        return;
    }
    let w = World::new("s");
    let inbox = w.inbox("rio");
    let sent = w.run(
        &w.acc.alice,
        &[
            "send",
            "--from",
            "marcus",
            "--to",
            "rio",
            "--subject",
            "alice's",
            "--body",
            "b",
        ],
    );
    assert!(sent.status.success(), "{}", show(&sent));
    let alices = w.waiting("rio").pop().expect("alice's message");
    let original = std::fs::read(inbox.join(&alices)).unwrap();
    let processed_ino = std::fs::metadata(inbox.join("processed")).unwrap().ino();

    // Bob, in the same group: each of these is refused by the kernel.
    let attempts = [
        // remove, take or replace Alice's waiting message
        format!("rm -f rio/inbox/{alices}"),
        format!("mv rio/inbox/{alices} rio/inbox/bobs.json"),
        format!("printf x > rio/inbox/.tmp/b && mv -f rio/inbox/.tmp/b rio/inbox/{alices}"),
        format!("printf '{{}}' > rio/inbox/{alices}"),
        // put a link in the place of the daemon's directories
        "mv rio/inbox/processed rio/inbox/old".to_string(),
        "rmdir rio/inbox/rejected".to_string(),
        // (an empty directory of one's own may replace an empty one, but
        // not in a sticky directory, and then never a link in its place)
        "mkdir rio/inbox/.tmp/d && mv -fT rio/inbox/.tmp/d rio/inbox/processed".to_string(),
        "mkdir rio/inbox/.tmp/e && mv -fT rio/inbox/.tmp/e rio/inbox/rejected".to_string(),
        // write into the daemon's directories
        "printf x > rio/inbox/processed/settings.json".to_string(),
        "printf x > rio/inbox/rejected/x.json".to_string(),
        "mkdir rio/inbox/.claimed/fake".to_string(),
    ];
    for attempt in &attempts {
        let out = w.sh(&w.acc.bob, attempt);
        assert!(
            !out.status.success(),
            "bob could: {attempt}\n{}",
            show(&out)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Operation not permitted") || err.contains("Permission denied"),
            "{attempt}: {err}"
        );
    }
    assert_eq!(std::fs::read(inbox.join(&alices)).unwrap(), original);
    let processed = std::fs::symlink_metadata(inbox.join("processed")).unwrap();
    assert!(processed.is_dir() && processed.ino() == processed_ino);
    assert!(
        std::fs::symlink_metadata(inbox.join("rejected"))
            .unwrap()
            .is_dir()
    );
    assert!(
        std::fs::symlink_metadata(inbox.join(".claimed"))
            .unwrap()
            .is_dir()
    );
    assert!(names(&inbox.join("processed")).is_empty());

    // Alice may still take back her own; the daemon's user still claims.
    let out = w.sh(
        &w.acc.alice,
        &format!("mv rio/inbox/{alices} rio/inbox/mine.json"),
    );
    assert!(out.status.success(), "{}", show(&out));
    let begin = w.run(&w.acc.svc, &["session", "begin", "rio"]);
    assert!(begin.status.success(), "{}", show(&begin));
    let sid = String::from_utf8_lossy(&begin.stdout).trim().to_string();
    assert_eq!(names(&inbox.join(".claimed").join(&sid)), ["mine.json"]);
}

#[test]
fn outsiders_and_members_read_the_state_without_writing_a_byte() {
    if !enabled("outsiders_and_members_read_the_state_without_writing_a_byte") {
        return;
    }
    let w = World::new("r");
    let sent = w.run(
        &w.acc.alice,
        &[
            "send",
            "--from",
            "marcus",
            "--to",
            "rio",
            "--subject",
            "waiting",
            "--body",
            "b",
        ],
    );
    assert!(sent.status.success(), "{}", show(&sent));
    // No lock file yet, and a corrupt tasks.json: a reader must neither
    // create the one nor repair the other.
    std::fs::remove_file(w.root.join("rio/.lock")).unwrap();
    std::fs::write(w.root.join("rio/tasks.json"), "{\"broken").unwrap();

    // The outsider cannot send, and is told which group to join.
    let before = tree(&w.root);
    let out = w.run(
        &w.acc.out,
        &[
            "send",
            "--from",
            "marcus",
            "--to",
            "rio",
            "--subject",
            "x",
            "--body",
            "b",
        ],
    );
    assert_eq!(out.status.code(), Some(77), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Permission denied"), "{err}");
    assert!(
        err.contains(&format!("{}/rio/inbox", w.root.display())),
        "{err}"
    );
    assert!(
        err.contains(&format!("usermod -aG {} {}", w.acc.group, w.acc.out)),
        "{err}"
    );
    assert_eq!(tree(&w.root), before);

    // status: exit 0, every agent, `?` where the inbox and the error log
    // are not readable to this user, and why on stderr.
    let out = w.run(&w.acc.out, &["status"]);
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let rio = text
        .lines()
        .find(|l| l.starts_with("rio "))
        .expect("rio's line");
    assert!(rio.contains("idle"), "{text}");
    assert!(rio.contains(" ? "), "{text}");
    assert!(text.lines().any(|l| l.starts_with("marcus ")), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("shown as ?"), "{err}");
    assert!(err.contains(&format!("group {}", w.acc.group)), "{err}");
    let json = w.run(&w.acc.out, &["status", "--json"]);
    assert!(json.status.success(), "{}", show(&json));
    let lines: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(lines[0]["agent"], "rio");
    assert!(lines[0]["inbox_waiting"].is_null(), "{lines}");
    assert!(lines[0]["error_records_30d"].is_null(), "{lines}");
    let events = w.run(&w.acc.out, &["events"]);
    assert!(events.status.success(), "{}", show(&events));
    assert_eq!(
        tree(&w.root),
        before,
        "the outsider's reads changed the state"
    );

    // A member reads everything, the inbox included, and writes nothing.
    for args in [
        &["status"][..],
        &["status", "rio", "--json"],
        &["inbox", "rio"],
        &["errors"],
        &["events"],
        &["prompt", "rio"],
    ] {
        let out = w.run(&w.acc.bob, args);
        assert!(out.status.success(), "{args:?}: {}", show(&out));
        if args == ["status", "rio", "--json"] {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v[0]["inbox_waiting"], 1, "{v}");
        }
        if args == ["inbox", "rio"] {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("1 waiting") && text.contains("waiting"),
                "{text}"
            );
        }
    }
    assert_eq!(
        tree(&w.root),
        before,
        "the member's reads changed the state"
    );

    // An install from before the sticky bit: check names it, and the
    // service user's --repair (or bootstrap, or the daemon's start) mends it.
    must(
        "sh",
        &[
            "-c",
            &format!(
                "find {} -type d -exec chmod 2770 {{}} +",
                w.inbox("rio").display()
            ),
        ],
    );
    let check = w.run(&w.acc.svc, &["check"]);
    assert_eq!(check.status.code(), Some(65), "{}", show(&check));
    assert!(
        String::from_utf8_lossy(&check.stdout).contains("inbox/: mode 2770, should be 3770"),
        "{}",
        show(&check)
    );
    let repair = w.run(&w.acc.svc, &["check", "--repair"]);
    assert!(repair.status.success(), "{}", show(&repair));
    assert_eq!(mode(&w.inbox("rio")), 0o3770);
    assert_eq!(mode(&w.inbox("rio").join("processed")), 0o2750);
}

/// Every path below `root` that root owns.
fn owned_by_root(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.uid() == 0 || m.gid() == 0 {
            found.push(format!("{} {}:{}", p.display(), m.uid(), m.gid()));
        }
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    found
}

/// A cron-era session script run by root (as crontabs often do) beside the
/// daemon, after root bootstrapped a new agent: everything they create in
/// the state root — the agent's directory, its journal and lock, the counters' lock, the session's owner
/// lock, every state file it replaces — belongs to the service user
/// afterwards, so the service user's next session, task and record work.
#[test]
fn a_session_script_run_as_root_leaves_state_the_service_user_can_use() {
    if !enabled("a_session_script_run_as_root_leaves_state_the_service_user_can_use") {
        return;
    }
    let w = World::new("r");
    // As on a first day: the agent's directory and the counters' lock do not
    // exist yet when root's script runs.
    std::fs::remove_dir_all(w.root.join("rio")).unwrap();
    let _ = std::fs::remove_file(w.root.join(".daemon/counters.lock"));
    let _ = std::fs::remove_file(w.root.join(".daemon/counters.json"));

    let boot = w.run("root", &["bootstrap", "rio"]);
    assert!(boot.status.success(), "{}", show(&boot));
    let begin = w.run("root", &["session", "begin", "rio"]);
    assert!(begin.status.success(), "{}", show(&begin));
    let sid = String::from_utf8_lossy(&begin.stdout).trim().to_string();
    let end = w.run(
        "root",
        &[
            "session",
            "end",
            "rio",
            "--session",
            &sid,
            "--summary",
            "by root",
        ],
    );
    assert!(end.status.success(), "{}", show(&end));
    let task = w.run(
        "root",
        &["task", "add", "rio", "--description", "root's task"],
    );
    assert!(task.status.success(), "{}", show(&task));
    assert_eq!(owned_by_root(&w.root), Vec::<String>::new());
    assert_eq!(mode(&w.inbox("rio")), 0o3770, "the inbox keeps its mode");

    // The service user carries on where root left off.
    let begin = w.run(&w.acc.svc, &["session", "begin", "rio"]);
    assert!(begin.status.success(), "{}", show(&begin));
    let sid2 = String::from_utf8_lossy(&begin.stdout).trim().to_string();
    assert_ne!(sid, sid2);
    let end = w.run(&w.acc.svc, &["session", "end", "rio", "--session", &sid2]);
    assert!(end.status.success(), "{}", show(&end));
    let task = w.run(
        &w.acc.svc,
        &["task", "add", "rio", "--description", "the service's task"],
    );
    assert!(task.status.success(), "{}", show(&task));
    let status = w.run(&w.acc.svc, &["status", "--json"]);
    assert!(status.status.success(), "{}", show(&status));
    let journal = std::fs::read_to_string(w.root.join("rio/journal.jsonl")).unwrap();
    assert_eq!(journal.matches("\"session_end\"").count(), 2, "{journal}");
}
