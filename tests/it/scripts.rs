//! The shell scripts around the binary, run for real:
//! `ops/research-session.example.sh` with a fake `claude` (and `gh`) first on
//! PATH and a real git repository, `bootstrap/bootstrap.sh` (dry run always;
//! a real run only as root with AGENT_STATE_ROOT_TESTS=1) and `ops/demo.sh`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{self, BIN, Env};

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Are these programs on PATH? If not, say why the test is skipped.
fn have(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {t}"))
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if !missing.is_empty() {
        eprintln!("SKIPPED: this test needs {missing:?} on PATH");
    }
    missing.is_empty()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

fn write_executable(path: &Path, body: &str) {
    std::fs::write(path, body).expect("write script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Claude Code's `--output-format json` result, as the fake prints it.
const RESULT_JSON: &str = r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":81234,"duration_api_ms":79000,"num_turns":23,"result":"Archived 2 sources on conditional AMM failures.\nNext: extract claims from the MetaDAO thread.","session_id":"3f1c9a52-0d4e-4f57-9a0e-2b8f6f0e7a11","total_cost_usd":0.4213,"usage":{"input_tokens":1200,"cache_creation_input_tokens":10,"cache_read_input_tokens":3000,"output_tokens":800},"modelUsage":{"claude-sonnet":{"inputTokens":1200,"outputTokens":800}}}"#;

/// A stand-in for `claude -p PROMPT --model M --output-format json`, run in the
/// work tree. FAKE_CLAUDE picks what it does: ok (archive two sources, print a
/// result), fail (an API error, exit 1), sleep (hang past any short timeout).
fn fake_claude() -> String {
    format!(
        r#"#!/bin/sh
printf '%s' "$2" > "$FAKE_DIR/prompt.txt"
printf '%s\n' "$@" > "$FAKE_DIR/claude-args.txt"
case "${{FAKE_CLAUDE:-ok}}" in
fail)
    echo '{{"type":"result","subtype":"success","is_error":true,"result":"Invalid API key · Please run /login"}}'
    exit 1 ;;
sleep)
    echo $$ > "$FAKE_DIR/claude.pid"
    sleep 30
    exit 0 ;;
file)
    cat "$FAKE_DIR/result.json"
    exit 0 ;;
esac
mkdir -p inbox/archive
echo '# Conditional AMMs fail quietly' > inbox/archive/2026-conditional-amm-1.md
echo '# MetaDAO v2 liquidity' > inbox/archive/2026-metadao-v2.md
echo 'a working note' >> notes.md
cat <<'JSON'
{RESULT_JSON}
JSON
"#
    )
}

/// A stand-in for the GitHub CLI: no PR exists yet; `pr create` prints its URL.
const FAKE_GH: &str = r#"#!/bin/sh
printf '%s\n' "$@" >> "$FAKE_DIR/gh-args.txt"
case "$1 $2" in
"pr view") exit 1 ;;
"pr create") echo "https://github.com/teleo/teleo-codex/pull/12" ;;
*) exit 2 ;;
esac
"#;

/// A bootstrapped state root, a git work tree with one commit on `main`, and
/// fake `claude` and `gh` programs, all in one temp dir.
struct Lab {
    env: Env,
    repo: PathBuf,
    fake: PathBuf,
}

impl Lab {
    fn new() -> Option<Lab> {
        if !have(&["bash", "git", "flock", "timeout"]) {
            return None;
        }
        let env = Env::standard();
        let base = env.dir.path().to_path_buf();
        let repo = base.join("repo");
        let fake = base.join("fake");
        for d in [&repo, &fake, &base.join("logs"), &base.join("tmp")] {
            std::fs::create_dir_all(d).unwrap();
        }
        write_executable(&fake.join("claude"), &fake_claude());
        write_executable(&fake.join("gh"), FAKE_GH);
        let lab = Lab { env, repo, fake };
        lab.git(&["init", "-q"]);
        lab.git(&["symbolic-ref", "HEAD", "refs/heads/main"]);
        std::fs::write(lab.repo.join("README.md"), "# teleo-codex\n").unwrap();
        lab.git(&["add", "README.md"]);
        lab.git(&["commit", "-q", "-m", "initial commit"]);
        Some(lab)
    }

    /// git with a fixed identity and no user or system config.
    fn git_in(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .envs(GIT_ENV)
            .stdin(Stdio::null())
            .output()
            .expect("run git");
        assert!(out.status.success(), "git {args:?}: {}", describe(&out));
        text(&out.stdout).trim().to_string()
    }

    fn git(&self, args: &[&str]) -> String {
        Lab::git_in(&self.repo, args)
    }

    fn base(&self) -> &Path {
        self.env.dir.path()
    }

    /// The session script for `agent`, with everything pointed into the lab.
    fn script(&self, agent: &str) -> Command {
        let path = format!(
            "{}:{}",
            self.fake.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new(repo_file("ops/research-session.example.sh"));
        cmd.arg(agent)
            .env("PATH", path)
            .env("AGENT_STATE_BIN", BIN)
            .env("AGENT_STATE_CONFIG", &self.env.config)
            .env("REPO_DIR", &self.repo)
            .env("LOCK_DIR", self.base())
            .env("LOG_DIR", self.base().join("logs"))
            .env("TMPDIR", self.base().join("tmp"))
            .env("FAKE_DIR", &self.fake)
            .env("KILL_GRACE", "2s")
            .envs(GIT_ENV)
            .env_remove("AGENT_STATE_SESSION_ID")
            .env_remove("AGENT_STATE_PROMPT_FILE")
            .env_remove("SKIP_PUSH")
            .env_remove("SKIP_PR")
            .stdin(Stdio::null());
        cmd
    }

    fn fake_file(&self, name: &str) -> String {
        std::fs::read_to_string(self.fake.join(name)).unwrap_or_default()
    }

    fn run(&self, cmd: &mut Command) -> Output {
        cmd.output().expect("run the session script")
    }
}

const GIT_ENV: [(&str, &str); 6] = [
    ("GIT_AUTHOR_NAME", "Rio Agent"),
    ("GIT_AUTHOR_EMAIL", "rio@teleo.example"),
    ("GIT_COMMITTER_NAME", "Rio Agent"),
    ("GIT_COMMITTER_EMAIL", "rio@teleo.example"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_CONFIG_NOSYSTEM", "1"),
];

fn is_research_branch(branch: &str, agent: &str) -> bool {
    let Some(date) = branch.strip_prefix(&format!("{agent}/research-")) else {
        return false;
    };
    date.len() == 10
        && date.char_indices().all(|(i, c)| {
            if i == 4 || i == 7 {
                c == '-'
            } else {
                c.is_ascii_digit()
            }
        })
}

/// Assert the session ended as a failure, once, with its messages back.
fn assert_failed(lab: &Lab, outcome: &str, message: &str) -> Value {
    let env = &lab.env;
    let session = env.json("rio", "session.json");
    assert_eq!(session["status"], outcome, "session.json: {session:#}");
    let reason = session["reason"].as_str().unwrap_or_default().to_string();
    assert!(
        !reason.is_empty(),
        "a failed session has a reason: {session:#}"
    );
    assert!(session["ended_at"].is_string(), "{session:#}");
    let event = if outcome == "timeout" {
        "timeout"
    } else {
        "error"
    };
    let events = env.events("rio", event);
    assert_eq!(
        events.len(),
        1,
        "exactly one {event} event: {:#?}",
        env.journal("rio")
    );
    assert_eq!(events[0]["session_id"], session["session_id"]);
    assert_eq!(events[0]["reason"], reason.as_str());
    assert!(
        env.events("rio", "session_end").is_empty(),
        "a failed session has no session_end"
    );
    let other = if outcome == "timeout" {
        "error"
    } else {
        "timeout"
    };
    assert!(
        env.events("rio", other).is_empty(),
        "only one failure is recorded"
    );
    // The claimed message is back in the inbox for the next session.
    assert_eq!(env.waiting("rio"), vec![format!("{message}.json")]);
    assert!(
        events[0]["messages_returned"]
            .as_array()
            .is_some_and(|a| a.iter().any(|m| m == message)),
        "{:#}",
        events[0]
    );
    let report = env.json("rio", "report.json");
    assert_eq!(report["last_session"]["outcome"], outcome, "{report:#}");
    assert!(report["current_session"].is_null(), "{report:#}");
    session
}

// ---- research-session.example.sh ------------------------------------------------

#[test]
fn session_script_runs_a_session_end_to_end() {
    let Some(lab) = Lab::new() else { return };
    let env = &lab.env;
    let message = env.send(
        "marcus",
        "rio",
        &[
            "--type",
            "flag",
            "--priority",
            "high",
            "--body",
            "Check MetaDAO for AI agents.",
        ],
    );

    let child = lab
        .script("rio")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script_pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", describe(&out));

    let session = env.json("rio", "session.json");
    assert_eq!(session["status"], "completed", "{session:#}");
    let branch = session["branch"].as_str().expect("branch").to_string();
    assert!(is_research_branch(&branch, "rio"), "branch {branch:?}");
    assert_eq!(session["type"], "research");
    assert_eq!(session["model"], "sonnet");
    assert_eq!(session["timeout_seconds"], 5400);
    assert_eq!(
        session["sources_archived"], 2,
        "two new files in inbox/archive/"
    );
    assert_eq!(session["tokens_used"], 1200 + 10 + 3000 + 800);
    assert_eq!(session["cost_usd"], 0.4213);
    assert!(
        session["handoff_notes"]
            .as_str()
            .is_some_and(|h| h.contains("Archived 2 sources")),
        "{session:#}"
    );
    assert!(session["ended_at"].is_string());

    let report = env.json("rio", "report.json");
    assert_eq!(report["status"], "idle", "{report:#}");
    assert!(report["current_session"].is_null());
    assert_eq!(report["last_session"]["outcome"], "completed");
    assert_eq!(report["last_session"]["branch"], branch.as_str());
    assert_eq!(report["last_session"]["id"], session["session_id"]);
    assert!(
        report["summary"]
            .as_str()
            .is_some_and(|s| s.contains("2 source(s)")),
        "{report:#}"
    );

    let starts = env.events("rio", "session_start");
    let ends = env.events("rio", "session_end");
    assert_eq!(starts.len(), 1, "{:#?}", env.journal("rio"));
    assert_eq!(ends.len(), 1, "{:#?}", env.journal("rio"));
    assert_eq!(starts[0]["session_id"], session["session_id"]);
    assert_eq!(ends[0]["session_id"], session["session_id"]);
    assert_eq!(ends[0]["outcome"], "completed");
    assert!(env.events("rio", "error").is_empty() && env.events("rio", "timeout").is_empty());
    // The session's owner is the script itself, not a short-lived subshell:
    // otherwise the running session would look abandoned to other hooks.
    assert_eq!(starts[0]["owner_pid"], script_pid, "owner of the session");

    // The message reached the prompt, then was processed.
    let prompt = lab.fake_file("prompt.txt");
    assert!(
        prompt.contains("Check MetaDAO for AI agents."),
        "prompt:\n{prompt}"
    );
    assert!(env.waiting("rio").is_empty());
    assert_eq!(
        env.files("rio", "inbox/processed"),
        vec![format!("{message}.json")]
    );
    let args = lab.fake_file("claude-args.txt");
    assert!(
        args.contains("--output-format\njson"),
        "claude args:\n{args}"
    );

    // The work is committed on the branch; no remote, so no push and no PR.
    assert_eq!(lab.git(&["rev-parse", "--abbrev-ref", "HEAD"]), branch);
    let files = lab.git(&["show", "--name-only", "--format=", "HEAD"]);
    assert!(
        files.contains("inbox/archive/2026-metadao-v2.md"),
        "{files}"
    );
    assert!(files.contains("notes.md"), "{files}");
    let subject = lab.git(&["log", "-1", "--format=%s"]);
    assert!(
        subject.contains(session["session_id"].as_str().unwrap()),
        "{subject}"
    );
    assert!(
        lab.fake_file("gh-args.txt").is_empty(),
        "no PR without a remote"
    );
    assert!(session["pr_number"].is_null(), "{session:#}");
}

#[test]
fn session_script_reads_the_result_without_jq() {
    let Some(lab) = Lab::new() else { return };
    // The plain-shell fallback for Claude's JSON result, as on a server without jq.
    let out = lab.run(lab.script("rio").env("JQ", "/nonexistent/jq"));
    assert!(out.status.success(), "{}", describe(&out));
    let session = lab.env.json("rio", "session.json");
    assert_eq!(session["status"], "completed", "{session:#}");
    assert_eq!(session["sources_archived"], 2);
    assert_eq!(session["tokens_used"], 1200 + 10 + 3000 + 800);
    assert_eq!(session["cost_usd"], 0.4213);
    let handoff = session["handoff_notes"].as_str().unwrap_or_default();
    assert!(
        handoff.starts_with("Archived 2 sources on conditional AMM failures."),
        "{handoff:?}"
    );
}

#[test]
fn session_script_pushes_and_opens_a_pr() {
    let Some(lab) = Lab::new() else { return };
    let origin = lab.base().join("origin.git");
    let out = Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&origin)
        .envs(GIT_ENV)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    lab.git(&["remote", "add", "origin", origin.to_str().unwrap()]);
    lab.git(&["push", "-q", "origin", "main"]);

    let out = lab.run(&mut lab.script("rio"));
    assert!(out.status.success(), "{}", describe(&out));

    let session = lab.env.json("rio", "session.json");
    assert_eq!(session["status"], "completed", "{session:#}");
    assert_eq!(
        session["pr_number"], 12,
        "the number of the URL gh printed: {session:#}"
    );
    let branch = session["branch"].as_str().unwrap();
    assert_eq!(
        lab.env.json("rio", "report.json")["last_session"]["pr_number"],
        12
    );
    // Pushed to origin, and the PR is from the branch into main.
    let pushed = Lab::git_in(&origin, &["rev-parse", &format!("refs/heads/{branch}")]);
    assert_eq!(pushed, lab.git(&["rev-parse", "HEAD"]));
    let gh = lab.fake_file("gh-args.txt");
    assert!(
        gh.contains(&format!("pr\ncreate\n--base\nmain\n--head\n{branch}\n")),
        "gh args:\n{gh}"
    );
}

#[test]
fn session_script_records_an_agent_error_and_returns_the_messages() {
    let Some(lab) = Lab::new() else { return };
    let message = lab.env.send("marcus", "rio", &["--priority", "high"]);

    let out = lab.run(lab.script("rio").env("FAKE_CLAUDE", "fail"));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));

    let session = assert_failed(&lab, "error", &message);
    let reason = session["reason"].as_str().unwrap();
    assert!(reason.contains("exited with status 1"), "reason: {reason}");
    assert!(
        reason.contains("Invalid API key"),
        "the result text explains it: {reason}"
    );
    assert_eq!(lab.env.json("rio", "report.json")["status"], "error");
    assert_eq!(lab.env.events("rio", "session_start").len(), 1);
}

#[test]
fn session_script_records_a_timeout() {
    let Some(lab) = Lab::new() else { return };
    let message = lab.env.send("marcus", "rio", &[]);

    let started = Instant::now();
    let out = lab.run(
        lab.script("rio")
            .env("FAKE_CLAUDE", "sleep")
            .env("TIMEOUT", "2"),
    );
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(124), "{}", describe(&out));
    assert!(
        took < Duration::from_secs(20),
        "the fake claude was stopped at the timeout ({took:?})"
    );

    let session = assert_failed(&lab, "timeout", &message);
    assert_eq!(session["timeout_seconds"], 2);
    let reason = session["reason"].as_str().unwrap();
    assert!(reason.contains("timeout"), "reason: {reason}");
    // A timeout is not the agent's fault: it is idle again.
    assert_eq!(lab.env.json("rio", "report.json")["status"], "idle");
}

#[test]
fn session_script_records_a_failing_step_as_an_error() {
    let Some(lab) = Lab::new() else { return };
    let message = lab.env.send("marcus", "rio", &[]);
    // A pre-commit hook that refuses: `git commit` fails under `set -e`.
    write_executable(
        &lab.repo.join(".git/hooks/pre-commit"),
        "#!/bin/sh\necho 'pre-commit: refused' >&2\nexit 1\n",
    );

    let out = lab.run(&mut lab.script("rio"));
    assert!(!out.status.success(), "{}", describe(&out));

    let session = assert_failed(&lab, "error", &message);
    let reason = session["reason"].as_str().unwrap();
    assert!(reason.contains("committing"), "the step: {reason}");
    assert!(reason.contains("git commit"), "the command: {reason}");
}

#[test]
fn session_script_records_sigterm_as_an_error() {
    let Some(lab) = Lab::new() else { return };
    let message = lab.env.send("marcus", "rio", &[]);

    let mut child: Child = lab
        .script("rio")
        .env("FAKE_CLAUDE", "sleep")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the agent runs, then stop the script as systemd or a person would.
    assert!(
        support::poll_until(Duration::from_secs(20), || !lab
            .fake_file("claude.pid")
            .trim()
            .is_empty()),
        "the fake claude never started"
    );
    let claude_pid = lab.fake_file("claude.pid").trim().to_string();
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let started = Instant::now();
    let status = child.wait().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the script stops promptly"
    );
    assert_eq!(status.code(), Some(143), "exit status after SIGTERM");

    let session = assert_failed(&lab, "error", &message);
    let reason = session["reason"].as_str().unwrap();
    assert!(reason.contains("SIGTERM"), "reason: {reason}");
    // The agent did not outlive the script.
    assert!(
        support::poll_until(Duration::from_secs(10), || !Path::new(&format!(
            "/proc/{claude_pid}"
        ))
        .exists()),
        "claude ({claude_pid}) still runs after the script stopped"
    );
}

/// A process holding `lock_file` (flock), once it holds it: until it is
/// killed, or until `release` exists.
fn hold_lock(lock_file: &Path, release: Option<&Path>) -> Child {
    let mut holder = Command::new("sh");
    holder.arg("-c");
    match release {
        Some(release) => holder
            .arg(r#"exec 9>>"$1" && flock 9 && while [ ! -e "$2" ]; do sleep 0.05; done"#)
            .arg("sh")
            .arg(lock_file)
            .arg(release),
        None => holder
            .arg(r#"exec 9>>"$1" && flock 9 && exec sleep 30"#)
            .arg("sh")
            .arg(lock_file),
    };
    let holder = holder.stdin(Stdio::null()).spawn().unwrap();
    let held = support::poll_until(Duration::from_secs(10), || {
        !Command::new("flock")
            .args(["-n"])
            .arg(lock_file)
            .arg("true")
            .status()
            .unwrap()
            .success()
    });
    assert!(held, "the holder never took the lock");
    holder
}

#[test]
fn session_script_takes_a_lock() {
    let Some(lab) = Lab::new() else { return };
    // One process that holds the lock until it is killed.
    let mut holder = hold_lock(&lab.base().join("research-session-rio.lock"), None);

    let out = lab.run(&mut lab.script("rio"));
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(text(&out.stderr).contains("holds"), "{}", describe(&out));
    assert!(
        lab.env.events("rio", "session_start").is_empty(),
        "no session begun"
    );
    assert!(lab.env.events("rio", "error").is_empty(), "and none failed");
}

/// What the daemon does before it starts the script: begins the session
/// (the script joins it through `AGENT_STATE_SESSION_ID`); its id.
fn begun_by_the_daemon(env: &Env) -> String {
    env.ok(&["session", "begin", "rio", "--timeout", "90m"])
        .trim()
        .to_string()
}

/// A cron line left in place fires at the moment the daemon starts the same
/// agent: the cron run takes the lock first, its `session begin` is refused
/// (the daemon's session was begun), and it exits. The daemon's script
/// waits for the lock instead of being refused too, and runs the session.
#[test]
fn session_script_started_by_the_daemon_waits_for_a_cron_runs_lock() {
    let Some(lab) = Lab::new() else { return };
    let env = &lab.env;
    let id = begun_by_the_daemon(env);
    let release = lab.base().join("release");
    // The cron run: holds the lock until the test releases it.
    let mut holder = hold_lock(
        &lab.base().join("research-session-rio.lock"),
        Some(&release),
    );

    let stderr = lab.base().join("script.err");
    let mut script = lab
        .script("rio")
        .env("AGENT_STATE_SESSION_ID", &id)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let waiting = support::poll_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&stderr)
            .unwrap_or_default()
            .contains("waiting up to 30s")
            || script.try_wait().ok().flatten().is_some()
    });
    std::fs::write(&release, "").unwrap();
    let _ = holder.wait();
    let status = script.wait().unwrap();
    let said = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(waiting, "the script neither waited nor ended: {said}");
    assert!(status.success(), "{status}: {said}");
    let session = env.json("rio", "session.json");
    assert_eq!(session["session_id"], id.as_str());
    assert_eq!(session["status"], "completed", "{session:#}\n{said}");
    assert_eq!(env.events("rio", "session_start").len(), 1);
    assert!(env.events("rio", "error").is_empty(), "{said}");
}

#[test]
fn session_script_joins_the_session_a_daemon_began() {
    let Some(lab) = Lab::new() else { return };
    let env = &lab.env;
    let id = begun_by_the_daemon(env);

    let out = lab.run(lab.script("rio").env("AGENT_STATE_SESSION_ID", &id));
    assert!(out.status.success(), "{}", describe(&out));

    let session = env.json("rio", "session.json");
    assert_eq!(session["session_id"], id.as_str());
    assert_eq!(session["status"], "completed", "{session:#}");
    assert!(is_research_branch(
        session["branch"].as_str().unwrap_or_default(),
        "rio"
    ));
    assert_eq!(
        env.events("rio", "session_start").len(),
        1,
        "joined, not a second session"
    );
    assert_eq!(env.events("rio", "session_end").len(), 1);
}

#[test]
fn session_script_leaves_another_running_session_alone() {
    let Some(lab) = Lab::new() else { return };
    let env = &lab.env;
    // A session of rio that someone else (this test process, as the daemon
    // under its unit would) is running, on a branch of its own, with work not
    // yet committed.
    let id = env.ok(&["session", "begin", "rio"]).trim().to_string();
    lab.git(&["checkout", "-q", "-b", "rio/the-other-session"]);
    std::fs::write(lab.repo.join("draft.md"), "half written\n").unwrap();

    // A cron run of the script whose lock file is not the other session's
    // (the unit's /tmp is private): `session begin` must stop it before it
    // touches the work tree.
    let own_locks = lab.base().join("cron-locks");
    let out = lab.run(lab.script("rio").env("LOCK_DIR", &own_locks));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert_eq!(
        lab.git(&["branch", "--show-current"]).trim(),
        "rio/the-other-session",
        "the script switched the other session's work tree: {}",
        describe(&out)
    );
    assert_eq!(
        lab.git(&["branch", "--list", "rio/research-*"]).trim(),
        "",
        "no branch of its own before the session is its own"
    );
    assert_eq!(
        std::fs::read_to_string(lab.repo.join("draft.md")).unwrap(),
        "half written\n"
    );

    let session = env.json("rio", "session.json");
    assert_eq!(session["session_id"], id.as_str());
    assert_eq!(
        session["status"], "running",
        "not failed by the script: {session:#}"
    );
    assert_eq!(env.events("rio", "session_start").len(), 1);
    assert!(
        env.events("rio", "error").is_empty(),
        "{:#?}",
        env.journal("rio")
    );
    assert!(lab.fake_file("prompt.txt").is_empty(), "claude was not run");
}

// ---- bootstrap/bootstrap.sh -------------------------------------------------------

fn bootstrap_script(dir: &Path) -> Command {
    let mut cmd = Command::new(repo_file("bootstrap/bootstrap.sh"));
    cmd.env("CONFIG", dir.join("etc/agent-state/config.toml"))
        .env("STATE_ROOT", dir.join("state"))
        .env("AGENT_HOME", dir.join("home"))
        .env("BIN", BIN)
        .env_remove("SOURCE_CONFIG")
        .env_remove("GROUP")
        .env_remove("AGENT_USER")
        .env_remove("DRY_RUN")
        .env_remove("AGENT_STATE_CONFIG")
        .stdin(Stdio::null());
    cmd
}

#[test]
fn bootstrap_dry_run_prints_the_plan_and_changes_nothing() {
    if !have(&["bash"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = bootstrap_script(dir.path())
        .arg("--dry-run")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let plan = text(&out.stdout);
    let root = dir.path().join("state").display().to_string();
    for expected in [
        "dry run",
        "groupadd --system teleo",
        "useradd --system --gid teleo",
        "--shell",
        "agent-state",
        &root,
        "config.toml",
        "bootstrap",
        "chown -hR agent-state:teleo",
        "3770",
        "2750",
        "0644",
        "rio clay theseus vida astra leo marcus",
    ] {
        assert!(
            plan.contains(expected),
            "the plan mentions {expected:?}:\n{plan}"
        );
    }
    assert!(
        support::list(dir.path()).is_empty(),
        "a dry run changes nothing: {:?}",
        support::list(dir.path())
    );
}

#[test]
fn bootstrap_refuses_to_run_without_root() {
    if !have(&["bash"]) {
        return;
    }
    if nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED: bootstrap_refuses_to_run_without_root runs only as a non-root user (this is root)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = bootstrap_script(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(77), "{}", describe(&out));
    assert!(text(&out.stderr).contains("root"), "{}", describe(&out));
    assert!(support::list(dir.path()).is_empty());
}

/// Removes the test user and group however the test ends.
struct SystemAccounts {
    user: String,
    group: String,
}

impl SystemAccounts {
    fn remove(&self) {
        for (program, name) in [("userdel", &self.user), ("groupdel", &self.group)] {
            let _ = crate::support::run_tool(program, &[name]);
        }
    }
}

impl Drop for SystemAccounts {
    fn drop(&mut self) {
        self.remove();
    }
}

fn id_of(database: &str, name: &str) -> u32 {
    let out = Command::new("getent")
        .args([database, name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "getent {database} {name}: {}",
        describe(&out)
    );
    text(&out.stdout)
        .split(':')
        .nth(2)
        .and_then(|n| n.trim().parse().ok())
        .expect("an id")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .mode()
        & 0o7777
}

#[test]
fn bootstrap_as_root_creates_the_accounts_and_sets_modes() {
    let root_user = nix::unistd::geteuid().is_root();
    let enabled = std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() == Ok("1");
    if !(root_user && enabled) {
        eprintln!(
            "SKIPPED: bootstrap_as_root_creates_the_accounts_and_sets_modes creates a system user and group; \
             it runs only as root with AGENT_STATE_ROOT_TESTS=1 (root: {root_user}, AGENT_STATE_ROOT_TESTS=1: {enabled})"
        );
        return;
    }
    if !have(&["bash", "useradd", "groupadd", "getent"]) {
        return;
    }
    let accounts = SystemAccounts {
        user: crate::support::account("agent-state-it"),
        group: crate::support::account("teleo-it"),
    };
    accounts.remove(); // leftovers of an interrupted run

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("etc/agent-state/config.toml");
    let root = dir.path().join("state");
    let run = || {
        let out = bootstrap_script(dir.path())
            .args(["--user", &accounts.user, "--group", &accounts.group])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", describe(&out));
        text(&out.stdout)
    };

    let first = run();
    assert!(first.contains("groupadd"), "{first}");
    assert!(first.contains("useradd"), "{first}");
    let uid = id_of("passwd", &accounts.user);
    let gid = id_of("group", &accounts.group);
    let passwd = text(
        &Command::new("getent")
            .args(["passwd", &accounts.user])
            .output()
            .unwrap()
            .stdout,
    );
    let home = root.parent().unwrap().join("home");
    assert!(
        passwd.contains(&format!(":{}:", home.display())),
        "the home holds the CLIs' credentials, apart from the state root: {passwd}"
    );
    let home_meta = std::fs::metadata(&home).unwrap();
    assert_eq!(home_meta.permissions().mode() & 0o7777, 0o700);
    assert_eq!(home_meta.uid(), uid);
    assert!(
        passwd.trim_end().ends_with("nologin") || passwd.trim_end().ends_with("false"),
        "{passwd}"
    );

    // The config is installed, naming the state root.
    let installed = std::fs::read_to_string(&config).unwrap();
    assert!(
        installed.contains(&format!("state_root = \"{}\"", root.display())),
        "{installed}"
    );

    // Ownership and modes.
    for agent in ["rio", "clay", "theseus", "vida", "astra", "leo", "marcus"] {
        let a = root.join(agent);
        let meta = std::fs::metadata(&a).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{}", a.display());
        assert_eq!(mode(&a), 0o755, "{}", a.display());
        for d in [
            "inbox",
            "inbox/.tmp",
            "inbox/.claimed",
            "inbox/processed",
            "inbox/rejected",
        ] {
            let wanted = if d == "inbox" || d == "inbox/.tmp" {
                0o3770
            } else {
                0o2750
            };
            assert_eq!(mode(&a.join(d)), wanted, "{agent}/{d}");
            assert_eq!(
                std::fs::metadata(a.join(d)).unwrap().gid(),
                gid,
                "{agent}/{d}"
            );
        }
        assert_eq!(
            mode(&a.join("journal.jsonl")),
            0o644,
            "{agent}/journal.jsonl"
        );
        if agent != "marcus" {
            for f in ["report.json", "tasks.json", "metrics.json", "memory.md"] {
                assert_eq!(mode(&a.join(f)), 0o644, "{agent}/{f}");
                assert_eq!(
                    std::fs::metadata(a.join(f)).unwrap().uid(),
                    uid,
                    "{agent}/{f}"
                );
            }
        }
    }
    assert_eq!(mode(&root), 0o755);
    assert_eq!(mode(&root.join(".daemon")), 0o750);

    // Rerun: nothing breaks, the config is never overwritten.
    std::fs::write(&config, format!("{installed}\n# edited by the operator\n")).unwrap();
    let second = run();
    assert!(second.contains("exists"), "{second}");
    assert!(!second.contains("+ useradd"), "{second}");
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains("# edited by the operator")
    );
    assert_eq!(mode(&root.join("rio/inbox")), 0o3770);
    let check = Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .arg("check")
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "check after bootstrap: {}",
        describe(&check)
    );
}

// ---- ops/demo.sh ------------------------------------------------------------------

#[test]
fn demo_runs_to_the_status_table() {
    if !have(&["bash", "realpath"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("dev-state");
    let demo = || {
        Command::new(repo_file("ops/demo.sh"))
            .env("BIN", BIN)
            .env("STATE_ROOT", &root)
            .env_remove("CONFIG")
            .env_remove("AGENT_STATE_CONFIG")
            .env_remove("AGENT_STATE_SESSION_ID")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = demo();
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&root.display().to_string()),
        "uses the given root:\n{stdout}"
    );

    // The status table, with one line per agent of config/dev.toml.
    let lines: Vec<&str> = stdout.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("AGENT") && l.contains("STATUS") && l.contains("LAST SESSION"))
        .unwrap_or_else(|| panic!("no status table:\n{stdout}"));
    let row = |agent: &str| -> &str {
        lines[header + 1..]
            .iter()
            .find(|l| l.split_whitespace().next() == Some(agent))
            .unwrap_or_else(|| panic!("no status line for {agent}:\n{stdout}"))
    };
    assert!(row("rio").contains("completed"), "{}", row("rio"));
    assert!(row("theseus").contains("timeout"), "{}", row("theseus"));
    assert!(row("marcus").contains("mailbox"), "{}", row("marcus"));
    // marcus's mailbox has rio's answer.
    assert!(stdout.contains("from rio"), "{stdout}");

    // The state it leaves is what it says.
    let session = support::read_json(&root.join("rio/session.json"));
    assert_eq!(session["status"], "completed");
    assert_eq!(session["pr_number"], 247);
    let theseus = support::read_json(&root.join("theseus/session.json"));
    assert_eq!(theseus["status"], "timeout");

    // Rerun: the root is removed and re-created.
    let again = demo();
    assert!(again.status.success(), "{}", describe(&again));
    let journal = std::fs::read_to_string(root.join("rio/journal.jsonl")).unwrap();
    assert_eq!(
        journal.matches("\"session_start\"").count(),
        1,
        "a fresh root:\n{journal}"
    );
}

// ---- the example script as the daemon's command (the production setup) ----------

impl Lab {
    /// The daemon with `ops/research-session.example.sh {agent}` as rio's
    /// command (timeout `timeout`), the lab's environment passed down to
    /// the script through the daemon's own, `extra` added.
    fn daemon(&self, timeout: &str, extra: &[(&str, &str)]) -> support::Daemon {
        let script = repo_file("ops/research-session.example.sh");
        self.env.set_config(&format!(
            r#"
[defaults]
command = [{script:?}, "{{agent}}"]
timeout = "{timeout}"
kill_grace = "2s"
retry_delay = "1h"

[[agent]]
name = "rio"

[[agent]]
name = "marcus"
kind = "human"
"#,
            script = script.display().to_string()
        ));
        let path = format!(
            "{}:{}",
            self.fake.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let base = self.base().display().to_string();
        let mut vars: Vec<(String, String)> = vec![
            ("PATH".into(), path),
            ("AGENT_STATE_BIN".into(), BIN.into()),
            ("REPO_DIR".into(), self.repo.display().to_string()),
            ("LOCK_DIR".into(), base.clone()),
            ("TMPDIR".into(), format!("{base}/tmp")),
            ("FAKE_DIR".into(), self.fake.display().to_string()),
            ("KILL_GRACE".into(), "2s".into()),
        ];
        vars.extend(GIT_ENV.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let borrowed: Vec<(&str, &str)> =
            vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        support::Daemon::start(&self.env, &borrowed)
    }

    /// Wake rio and wait until its session (not `previous`) has ended; its
    /// session.json.
    fn wake_and_wait(&self, daemon: &support::Daemon, previous: &Value) -> Value {
        self.env.ok(&["wake", "rio"]);
        let mut session = Value::Null;
        let path = self.env.path("rio", "session.json");
        daemon.wait_until(Duration::from_secs(60), "rio's session ended", || {
            session = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(Value::Null);
            session["ended_at"].is_string()
                && session["status"] != "running"
                && session["session_id"] != previous["session_id"]
        });
        // The daemon's own records come after the script's: wait for them.
        daemon.wait_until(Duration::from_secs(10), "the daemon saw the end", || {
            self.env
                .json("rio", "report.json")
                .get("lifecycle")
                .is_some_and(|l| l != "running")
                && !std::fs::read_to_string(self.env.root.join(".daemon/daemon.json"))
                    .unwrap_or_default()
                    .contains("\"session_id\"")
        });
        self.env.json("rio", "session.json")
    }

    fn errors(&self) -> Vec<Value> {
        serde_json::from_str(&self.env.ok(&["errors", "--json"])).expect("errors --json")
    }
}

/// The real Claude Code CLI without credentials, run by the example script
/// under the daemon: the daemon reads Claude's JSON from the script's stdout,
/// so it is AGENT_LOGIN_REQUIRED (not a plain SESSION_FAILED), never retried,
/// and session.json says "not logged in" in the error matrix's words.
#[test]
fn under_the_daemon_the_script_passes_a_login_failure_through() {
    let Ok(claude) = std::env::var("AGENT_STATE_CLAUDE_BIN") else {
        eprintln!(
            "SKIPPED: set AGENT_STATE_CLAUDE_BIN to the Claude Code CLI (npm install @anthropic-ai/claude-code)"
        );
        return;
    };
    let Some(lab) = Lab::new() else { return };
    let home = lab.base().join("home");
    std::fs::create_dir(&home).unwrap();
    // HOME without credentials; no API key in the environment.
    write_executable(
        &lab.fake.join("claude-logged-out"),
        &format!(
            "#!/bin/sh\nunset ANTHROPIC_API_KEY CLAUDE_CODE_OAUTH_TOKEN\nexport HOME={home:?}\nexec {claude:?} \"$@\"\n",
            home = home.display().to_string()
        ),
    );
    let message = lab.env.send("marcus", "rio", &[]);
    let d = lab.daemon("120s", &[("CLAUDE", "claude-logged-out")]);
    let session = lab.wake_and_wait(&d, &Value::Null);

    assert_eq!(session["status"], "error", "{session:#}");
    let reason = session["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("Claude Code is not logged in"),
        "the error matrix's words first: {reason}"
    );
    assert!(reason.contains("the session script reported"), "{reason}");
    let codes: Vec<Value> = lab.errors().iter().map(|r| r["code"].clone()).collect();
    assert!(
        codes.iter().any(|c| c == "AGENT_LOGIN_REQUIRED"),
        "{codes:?}"
    );
    assert!(!codes.iter().any(|c| c == "SESSION_FAILED"), "{codes:?}");
    let report = lab.env.json("rio", "report.json");
    assert_eq!(report["last_session"]["reason"], reason, "{report:#}");
    assert_eq!(
        report["error"]["code"], "AGENT_LOGIN_REQUIRED",
        "{report:#}"
    );
    // Claude's output is kept with the session, not in a private /tmp.
    let id = session["session_id"].as_str().unwrap();
    let log = lab.env.read("rio", &format!("sessions/{id}.log"));
    assert!(log.contains("Not logged in"), "{log}");
    assert!(
        lab.env
            .path("rio", &format!("sessions/{id}.claude.json"))
            .is_file()
    );
    assert_eq!(lab.env.waiting("rio"), vec![format!("{message}.json")]);
}

/// Claude's result with signals and a Context Summary, then a failing
/// `git commit`: the daemon reads the signals and the summary from the
/// script's stdout, and the cost is in session.json although the script
/// failed after Claude ran.
#[test]
fn under_the_daemon_the_script_passes_signals_summary_and_cost_through() {
    let Some(lab) = Lab::new() else { return };
    let text = "Archived 3 sources on conditional markets.\n<axiom>PROGRESS:100</axiom>\n\n\
## Context Summary\n\n**Goal**: Map conditional AMM designs on Solana\n\
**Current State**: Archived 3 sources on MetaDAO's conditional markets\n\
**Next Agent**: Judge\n**Confidence**: 4\n**Risk Level**: medium\n**Blockers**: none\n";
    let result = serde_json::json!({
        "type": "result", "subtype": "success", "is_error": false,
        "result": text, "total_cost_usd": 0.75,
        "usage": {"input_tokens": 100, "output_tokens": 20,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    });
    std::fs::write(lab.fake.join("result.json"), result.to_string()).unwrap();
    // First a clean run: summary and signals.
    let d = lab.daemon("120s", &[("FAKE_CLAUDE", "file"), ("SKIP_PUSH", "1")]);
    std::fs::write(lab.repo.join("notes.md"), "a note\n").unwrap();
    let session = lab.wake_and_wait(&d, &Value::Null);
    assert_eq!(session["status"], "completed", "{session:#}");
    assert_eq!(session["cost_usd"], 0.75, "{session:#}");
    let report = lab.env.json("rio", "report.json");
    let summary = report["summary"].as_str().unwrap_or_default();
    assert!(!summary.contains("<axiom>"), "no raw signal: {summary}");
    assert!(
        summary.contains("Map conditional AMM designs"),
        "{report:#}"
    );
    assert_eq!(report["confidence"], 4, "{report:#}");
    assert_eq!(
        report["progress"], 100,
        "the PROGRESS signal was read: {report:#}"
    );
    assert!(
        session["handoff_notes"]
            .as_str()
            .is_some_and(|h| !h.contains("<axiom>")),
        "{session:#}"
    );
    drop(d);

    // Then the script fails after Claude ran: the cost is kept all the same.
    write_executable(
        &lab.repo.join(".git/hooks/pre-commit"),
        "#!/bin/sh\necho 'pre-commit: refused' >&2\nexit 1\n",
    );
    std::fs::write(lab.repo.join("notes.md"), "another note\n").unwrap();
    let d = lab.daemon("120s", &[("FAKE_CLAUDE", "file")]);
    let session = lab.wake_and_wait(&d, &session);
    assert_eq!(session["status"], "error", "{session:#}");
    assert_eq!(session["cost_usd"], 0.75, "{session:#}");
    assert_eq!(session["tokens_used"], 120, "{session:#}");
    assert!(
        session["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("git commit"),
        "{session:#}"
    );
    assert!(session.get("usage").is_some(), "{session:#}");
    drop(d);

    // A session begun by hand afterwards starts with nothing of that one's
    // usage or signals.
    let id = lab.env.ok(&["session", "begin", "rio"]).trim().to_string();
    let begun = lab.env.json("rio", "session.json");
    assert_eq!(begun["session_id"], id.as_str(), "{begun:#}");
    assert!(begun.get("usage").is_none(), "{begun:#}");
    assert!(begun.get("signal_block").is_none(), "{begun:#}");
    assert!(begun["cost_usd"].is_null(), "{begun:#}");
}

/// The daemon's timeout ends the script, whose trap records the failure
/// first: the outcome is the daemon's (`timeout`), the reason has both.
#[test]
fn under_the_daemon_its_timeout_wins_over_the_scripts_trap() {
    let Some(lab) = Lab::new() else { return };
    let message = lab.env.send("marcus", "rio", &[]);
    let d = lab.daemon("3s", &[("FAKE_CLAUDE", "sleep")]);
    let session = lab.wake_and_wait(&d, &Value::Null);

    assert_eq!(session["status"], "timeout", "{session:#}");
    let reason = session["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("timed out after 3s"), "{reason}");
    assert!(
        reason.contains("the session script reported") && reason.contains("SIGTERM"),
        "the script's words too: {reason}"
    );
    let id = session["session_id"].as_str().unwrap();
    let timeouts = lab.env.events("rio", "timeout");
    assert_eq!(timeouts.len(), 1, "{:#?}", lab.env.journal("rio"));
    assert_eq!(timeouts[0]["session_id"], id);
    assert!(lab.env.events("rio", "error").is_empty(), "no error event");
    assert!(
        session.get("ending_by_daemon").is_none(),
        "the note is gone: {session:#}"
    );
    assert_eq!(
        lab.env.json("rio", "report.json")["last_session"]["outcome"],
        "timeout"
    );
    assert_eq!(lab.env.waiting("rio"), vec![format!("{message}.json")]);
}

#[test]
fn demo_refuses_to_run_while_a_daemon_runs_on_its_root() {
    if !have(&["bash", "realpath"]) {
        return;
    }
    let env = Env::standard();
    let _daemon = env.daemon();
    let out = Command::new(repo_file("ops/demo.sh"))
        .env("BIN", BIN)
        .env("STATE_ROOT", &env.root)
        .env_remove("CONFIG")
        .env_remove("AGENT_STATE_CONFIG")
        .env_remove("AGENT_STATE_SESSION_ID")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        text(&out.stderr).contains("daemon is running on"),
        "{}",
        describe(&out)
    );
    // Nothing removed.
    assert!(env.root.join("rio/journal.jsonl").exists());
    assert!(env.root.join(".daemon/daemon.json").exists());
}
