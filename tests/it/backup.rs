//! `backup` and `restore` (issue 14): a snapshot taken while the daemon
//! runs, restored into an empty root, `check` clean and every state file as
//! it was; links and FIFOs in the root left out; a non-empty root and a
//! hostile archive refused with nothing restored.

use crate::support::*;
use std::path::Path;
use std::time::Duration;

fn files(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let t = e.file_type().unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if t.is_dir() {
                stack.push(p);
            } else if t.is_file()
                && !rel.ends_with(".lock")
                && !rel.starts_with(".daemon/")
                && !rel.contains("/sessions/")
            {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// This user's name (`--owner`: as root, restored state is given to the
/// service user, which these tests do not create).
pub fn whoami() -> String {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .unwrap()
        .unwrap()
        .name
}

#[test]
fn a_backup_under_a_running_daemon_restores_into_an_empty_root_as_it_was() {
    let env = Env::standard();
    let script = env.script("agent.sh", "echo working; echo '<axiom>COMPLETE</axiom>'");
    env.set_config(&daemon_config(
        &script,
        &[],
        &[],
        crate::support::STANDARD_AGENTS,
    ));
    let d = env.daemon();
    env.send("marcus", "rio", &["--body", "read this"]);
    env.ok(&["task", "add", "theseus", "--description", "a task"]);
    // The message wakes rio (a `wake --wait` beside it may find that
    // session already running and say so with exit 75).
    d.wait_until(Duration::from_secs(20), "rio's session ended", || {
        state(&env, "rio", "session.json")["status"] == "completed"
    });
    // Somebody's input that must not be followed or archived.
    std::os::unix::fs::symlink("/etc", env.agent("rio").join("etc-link")).unwrap();
    nix::unistd::mkfifo(
        &env.agent("theseus").join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();

    let archive = env.tmp("state.tar.zst");
    let out = env.run(&["backup", archive.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("rio/etc-link: a symbolic link"), "{said}");
    assert!(said.contains("theseus/pipe: a FIFO"), "{said}");
    assert!(archive.exists() && !env.tmp("state.tar.zst.partial").exists());
    drop(d);
    std::fs::remove_file(env.agent("rio").join("etc-link")).unwrap();
    std::fs::remove_file(env.agent("theseus").join("pipe")).unwrap();

    let restored = env.tmp("restored");
    let me = whoami();
    let out = env.run(&[
        "restore",
        archive.to_str().unwrap(),
        "--into",
        restored.to_str().unwrap(),
        "--owner",
        &me,
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("check: no problems found"), "{said}");
    // Taken under the running daemon: the session it ran, whole.
    let journal = std::fs::read_to_string(restored.join("rio/journal.jsonl")).unwrap();
    assert!(journal.contains("\"session_end\""), "{journal}");
    assert!(
        std::fs::read_to_string(restored.join("theseus/tasks.json"))
            .unwrap()
            .contains("a task")
    );
    // Taken again with the daemon stopped (nothing changes the files any
    // more): restored, every state file as it was, byte for byte.
    let still = env.tmp("still.tar.zst");
    env.ok(&["backup", still.to_str().unwrap()]);
    let again = env.tmp("restored-again");
    env.ok(&[
        "restore",
        still.to_str().unwrap(),
        "--into",
        again.to_str().unwrap(),
        "--owner",
        &me,
    ]);
    assert_eq!(
        files(&again),
        files(&env.root),
        "every state file as it was"
    );
    // The inbox keeps its mode (setgid + sticky).
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        mode(&restored.join("rio/inbox")),
        mode(&env.root.join("rio/inbox"))
    );

    // Not into a root that has something in it.
    let said = env.fails(
        &[
            "restore",
            archive.to_str().unwrap(),
            "--into",
            env.root.to_str().unwrap(),
        ],
        64,
    );
    assert!(said.contains("is not empty"), "{said}");
}

#[test]
fn a_hostile_archive_is_refused_and_nothing_is_restored() {
    let env = Env::standard();
    let archive = env.tmp("evil.tar.zst");
    {
        let file = std::fs::File::create(&archive).unwrap();
        let enc = zstd::stream::write::Encoder::new(file, 3).unwrap();
        let mut tar = tar::Builder::new(enc);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(5);
        h.set_mode(0o644);
        // Written by hand: the tar crate refuses to write `..` itself.
        let name = b"rio/../../evil.txt";
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        tar.append(&h, &b"evil\n"[..]).unwrap();
        tar.into_inner().unwrap().finish().unwrap();
    }
    let into = env.tmp("restored");
    let said = env.fails(
        &[
            "restore",
            archive.to_str().unwrap(),
            "--into",
            into.to_str().unwrap(),
            "--owner",
            &whoami(),
        ],
        65,
    );
    assert!(said.contains("not a plain relative path"), "{said}");
    assert!(!into.exists(), "nothing restored");
    assert!(!env.tmp("evil.txt").exists() && !env.dir.path().join("evil.txt").exists());
}
