//! The decisions as tables; the probe on real files in a temp dir.

use super::*;
use std::os::unix::fs::PermissionsExt;

fn stamp(ino: u64) -> Stamp {
    Stamp {
        dev: 1,
        ino,
        mode: 0o100755,
        size: 10,
        mtime_ns: 0,
        ctime_ns: 0,
    }
}

fn runnable(ino: u64) -> Probe {
    Probe::Runnable {
        path: "/opt/agent.sh".into(),
        stamp: stamp(ino),
    }
}

fn missing(program: &str) -> Probe {
    Probe::Missing {
        program: program.into(),
        searched: format!("{program} does not exist"),
    }
}

fn denied(path: &str) -> Probe {
    Probe::NotExecutable {
        path: path.into(),
        why: "not executable".into(),
    }
}

#[test]
fn before_the_claim_a_command_that_cannot_run_is_refused_and_recorded_once_per_hold() {
    use Asker::*;
    use BeforeClaim::*;
    let table: Vec<(Probe, Option<Probe>, Asker, BeforeClaim)> = vec![
        (runnable(1), None, Automatic, Start),
        (runnable(1), Some(missing("/a")), Automatic, Start),
        (Probe::Unknown, None, Automatic, Start),
        (Probe::Unknown, Some(missing("/a")), Operator, Start),
        // The first refusal is recorded.
        (missing("/a"), None, Automatic, Refuse { record: true }),
        (denied("/a"), None, Automatic, Refuse { record: true }),
        // The same failure again (a reload, a schedule): held in silence.
        (
            missing("/a"),
            Some(missing("/a")),
            Automatic,
            Refuse { record: false },
        ),
        (
            denied("/a"),
            Some(denied("/a")),
            Automatic,
            Refuse { record: false },
        ),
        // Another failure (another path, now there but not executable).
        (
            missing("/b"),
            Some(missing("/a")),
            Automatic,
            Refuse { record: true },
        ),
        (
            denied("/a"),
            Some(missing("/a")),
            Automatic,
            Refuse { record: true },
        ),
        // An operator's `wake` is always answered.
        (
            missing("/a"),
            Some(missing("/a")),
            Operator,
            Refuse { record: true },
        ),
    ];
    for (now, held, asker, want) in table {
        assert_eq!(
            before_claim(&now, held.as_ref(), asker),
            want,
            "{now:?} held {held:?} by {asker:?}"
        );
    }
}

#[test]
fn a_recheck_releases_once_the_command_can_run() {
    use Recheck::*;
    let table: Vec<(Probe, Probe, Recheck)> = vec![
        (missing("/a"), missing("/a"), Keep),
        (missing("/a"), runnable(1), Release),
        (denied("/a"), runnable(1), Release),
        (missing("/a"), Probe::Unknown, Release),
        (missing("/a"), denied("/a"), Record),
        (missing("/a"), missing("/b"), Record),
        // Held although the probe found it runnable (its spawn failed after
        // the claim): released only once the file changed.
        (runnable(1), runnable(1), Keep),
        (runnable(1), runnable(2), Release),
        (runnable(1), missing("/a"), Record),
    ];
    for (held, now, want) in table {
        assert_eq!(recheck(&held, &now), want, "held {held:?}, now {now:?}");
    }
}

#[test]
fn a_spawn_that_could_not_execute_the_command_is_no_delivery_attempt() {
    let spawn = |kind| Ending::SpawnFailed {
        reason: "x".into(),
        kind,
    };
    let table = [
        (spawn(SpawnFailure::NotFound), false),
        (spawn(SpawnFailure::PermissionDenied), false),
        (spawn(SpawnFailure::Other), true),
        (spawn(SpawnFailure::Workspace(Code::WorkspaceFailed)), true),
        (Ending::Exited { code: 1 }, true),
        (Ending::TimedOut, true),
    ];
    for (ending, counts) in table {
        assert_eq!(counts_as_attempt(&ending), counts, "{ending:?}");
    }
}

#[test]
fn failures_carry_the_catalogue_code_and_the_runners_wording() {
    let (code, text) = missing("/opt/claude").failure().unwrap();
    assert_eq!(code, Code::AgentNotFound);
    assert!(text.starts_with("command not found: /opt/claude"), "{text}");
    let (code, text) = denied("/opt/a.sh").failure().unwrap();
    assert_eq!(code, Code::AgentPermissionDenied);
    assert!(text.starts_with("permission denied: /opt/a.sh"), "{text}");
    assert!(matches!(
        denied("/x").ending(),
        Some(Ending::SpawnFailed {
            kind: SpawnFailure::PermissionDenied,
            ..
        })
    ));
    assert_eq!(runnable(1).failure(), None);
    assert_eq!(runnable(1).ending(), None);
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn the_probe_resolves_like_exec() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let bin = dir.join("bin");
    let other = dir.join("other");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    write(&bin.join("ok.sh"), "#!/bin/sh\necho hi\n", 0o755);
    write(&bin.join("plain"), "echo hi\n", 0o755);
    write(&bin.join("noexec.sh"), "#!/bin/sh\n", 0o644);
    write(&bin.join("badshebang"), "#!/no/such/interp -x\n", 0o755);
    write(&other.join("noexec.sh"), "#!/bin/sh\n", 0o755);
    let path_var = std::env::join_paths([&bin, &other]).unwrap();
    let p = |program: &str, cwd: Option<&Path>| probe(program, cwd, Some(path_var.as_os_str()));
    let abs = |name: &str| bin.join(name).display().to_string();

    assert!(matches!(p(&abs("ok.sh"), None), Probe::Runnable { .. }));
    assert!(matches!(p(&abs("plain"), None), Probe::Runnable { .. }));
    assert!(matches!(p(&abs("nothere"), None), Probe::Missing { .. }));
    assert!(matches!(
        p(&abs("noexec.sh"), None),
        Probe::NotExecutable { .. }
    ));
    assert!(matches!(
        p(&abs("badshebang"), None),
        Probe::MissingInterpreter { .. }
    ));
    // A directory is not a command.
    assert!(matches!(
        p(&bin.display().to_string(), None),
        Probe::NotExecutable { .. }
    ));
    // Relative to the working directory; unknown without one.
    assert!(matches!(p("bin/ok.sh", Some(dir)), Probe::Runnable { .. }));
    assert!(matches!(p("bin/gone.sh", Some(dir)), Probe::Missing { .. }));
    assert_eq!(p("bin/ok.sh", None), Probe::Unknown);
    // PATH: found; not found; a non-executable file found first loses to
    // an executable one later, as with execvp.
    assert!(matches!(p("ok.sh", None), Probe::Runnable { .. }));
    assert!(matches!(p("nothere", None), Probe::Missing { .. }));
    match p("noexec.sh", None) {
        Probe::Runnable { path, .. } => assert_eq!(path, other.join("noexec.sh")),
        other => panic!("{other:?}"),
    }
    std::fs::remove_file(other.join("noexec.sh")).unwrap();
    assert!(matches!(p("noexec.sh", None), Probe::NotExecutable { .. }));
    // A worktree made after the claim: the spawn decides.
    assert_eq!(p("{workspace}/run.sh", None), Probe::Unknown);
}

#[test]
fn the_stamp_changes_with_a_chmod_or_a_new_file() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a.sh");
    write(&file, "#!/bin/sh\n", 0o755);
    let program = file.display().to_string();
    let first = probe(&program, None, None);
    assert_eq!(probe(&program, None, None), first, "nothing changed");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o700)).unwrap();
    let second = probe(&program, None, None);
    assert!(matches!(second, Probe::Runnable { .. }));
    assert_ne!(second, first, "a chmod is a change");
}
