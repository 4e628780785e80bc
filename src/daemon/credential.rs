//! A credential's check (`[credential.NAME] check`, e.g. `claude auth
//! status --json`): run with a time limit and bounded output, and judged
//! ([`judge`], pure): usable when it exits 0 and does not say it is logged
//! out.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncReadExt;

/// Why a credential's check, or a `wake_if` command, said no (its text is
/// what the journal, the log and the hold's reason show).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The configured command is empty.
    #[error("no check command")]
    NoCommand,
    /// The command could not be started.
    #[error("cannot run {program}: {error}")]
    Spawn { program: String, error: String },
    /// Waiting for it failed.
    #[error("waiting for {program}: {error}")]
    Wait { program: String, error: String },
    /// It did not answer within its time limit (it is killed).
    #[error("{program} did not answer within {}", humantime::format_duration(*limit))]
    Timeout { program: String, limit: Duration },
    /// The check's JSON says the credential is logged out.
    #[error("not logged in (authMethod: {method})")]
    LoggedOut { method: String },
    /// The check failed, saying this (its first line of stderr, else of
    /// stdout, at most 200 characters; or that it said nothing).
    #[error("{0}")]
    Failed(String),
    /// A `wake_if` command exited non-zero (`said`: ": " and its first line
    /// of stderr, or nothing).
    #[error("{program} exited non-zero{said}")]
    Declined { program: String, said: String },
}

impl CheckError {
    /// The catalogue code a failed credential check is raised with.
    pub fn code(&self) -> crate::catalogue::Code {
        crate::catalogue::Code::CredentialFailed
    }
}

/// How long a check may take.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// What is read of a check's stdout and stderr, each.
const OUTPUT_LIMIT: u64 = 64 * 1024;

/// Is the credential usable, by what its check printed? `Err` says why not.
///
/// Exit 0 is usable, unless stdout is JSON saying `"loggedIn": false`
/// (Claude Code's `auth status --json` exits 1 then anyway). A failure's
/// reason is the JSON's `authMethod`, else the first line of stderr or
/// stdout.
pub fn judge(exit_ok: bool, stdout: &[u8], stderr: &[u8]) -> Result<(), CheckError> {
    let json: Option<Value> = serde_json::from_slice(stdout.trim_ascii()).ok();
    let logged_in = json
        .as_ref()
        .and_then(|v| v.get("loggedIn"))
        .and_then(Value::as_bool);
    if exit_ok && logged_in != Some(false) {
        return Ok(());
    }
    if logged_in == Some(false) {
        let method = json
            .as_ref()
            .and_then(|v| v.get("authMethod"))
            .and_then(Value::as_str)
            .unwrap_or("none");
        return Err(CheckError::LoggedOut {
            method: method.to_string(),
        });
    }
    let first = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(|l| l.chars().take(200).collect::<String>())
    };
    Err(CheckError::Failed(
        first(stderr)
            .or_else(|| first(stdout))
            .unwrap_or_else(|| "the check failed without a message".into()),
    ))
}

/// Run `command` (in `dir`, no stdin, its own process group, killed at the
/// time limit) and judge it.
pub async fn check(
    command: &[String],
    dir: &std::path::Path,
    limit: Duration,
) -> Result<(), CheckError> {
    let (ok, stdout, stderr) = run(command, dir, limit).await?;
    judge(ok, &stdout, &stderr)
}

/// A `wake_if` command: exit 0 means wake; otherwise why not.
pub async fn condition(
    command: &[String],
    dir: &std::path::Path,
    limit: Duration,
) -> Result<(), CheckError> {
    let (ok, _, stderr) = run(command, dir, limit).await?;
    if ok {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&stderr)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| format!(": {}", l.chars().take(200).collect::<String>()))
        .unwrap_or_default();
    Err(CheckError::Declined {
        program: command[0].clone(),
        said,
    })
}

/// Run `command` as [`check`] does: whether it exited 0, and the first
/// [`OUTPUT_LIMIT`] bytes of its stdout and stderr.
pub async fn run(
    command: &[String],
    dir: &std::path::Path,
    limit: Duration,
) -> Result<(bool, Vec<u8>, Vec<u8>), CheckError> {
    let Some((program, args)) = command.split_first() else {
        return Err(CheckError::NoCommand);
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| CheckError::Spawn {
        program: program.clone(),
        error: e.to_string(),
    })?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let run = async {
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let mut out = (&mut out).take(OUTPUT_LIMIT);
        let mut err = (&mut err).take(OUTPUT_LIMIT);
        let (a, b) = tokio::join!(out.read_to_end(&mut stdout), err.read_to_end(&mut stderr));
        let _ = (a, b);
        let status = child.wait().await;
        (status, stdout, stderr)
    };
    match tokio::time::timeout(limit, run).await {
        Ok((Ok(status), stdout, stderr)) => Ok((status.success(), stdout, stderr)),
        Ok((Err(e), _, _)) => Err(CheckError::Wait {
            program: program.clone(),
            error: e.to_string(),
        }),
        Err(_) => Err(CheckError::Timeout {
            program: program.clone(),
            limit,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_is_judged_by_its_exit_and_what_it_says() {
        assert_eq!(judge(true, b"ok\n", b"").map_err(|e| e.to_string()), Ok(()));
        assert_eq!(
            judge(
                true,
                br#"{"loggedIn": true, "authMethod": "claude.ai"}"#,
                b""
            )
            .map_err(|e| e.to_string()),
            Ok(())
        );
        // Claude Code's answer without credentials (exit 1).
        assert_eq!(
            judge(
                false,
                b"{\n  \"loggedIn\": false,\n  \"authMethod\": \"none\",\n  \"apiProvider\": \"firstParty\"\n}\n",
                b""
            )
            .map_err(|e| e.to_string()),
            Err("not logged in (authMethod: none)".into())
        );
        assert_eq!(
            judge(true, br#"{"loggedIn": false}"#, b"").map_err(|e| e.to_string()),
            Err("not logged in (authMethod: none)".into()),
            "exit 0 but logged out"
        );
        assert_eq!(
            judge(false, b"", b"\n  token expired\nmore\n").map_err(|e| e.to_string()),
            Err("token expired".into())
        );
        assert_eq!(
            judge(false, b"", b"").map_err(|e| e.to_string()),
            Err("the check failed without a message".into())
        );
    }

    #[tokio::test]
    async fn a_check_that_hangs_is_stopped_at_its_limit() {
        let dir = std::env::temp_dir();
        let cmd = vec!["sleep".to_string(), "30".to_string()];
        let t = std::time::Instant::now();
        let r = check(&cmd, &dir, Duration::from_millis(300)).await;
        assert!(r.unwrap_err().to_string().contains("did not answer within"));
        assert!(t.elapsed() < Duration::from_secs(5));
        let r = check(&["/nonexistent/check".to_string()], &dir, CHECK_TIMEOUT).await;
        assert!(
            r.unwrap_err()
                .to_string()
                .starts_with("cannot run /nonexistent/check")
        );
        let r = check(&["true".to_string()], &dir, CHECK_TIMEOUT).await;
        assert_eq!(r, Ok(()));
    }
}
