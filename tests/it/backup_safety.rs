//! `backup` and `restore` against hostile input (issue 20): a link planted
//! at `DEST.partial` or at a staging name, a root that is a link or a file,
//! an archive with setgid, world-writable or another user's entries, and a
//! decompression bomb. Nothing is written through a link, nothing restored
//! keeps a mode the store would not write, nothing is left half done.

use std::io::Read as _;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::backup::whoami;
use crate::support::*;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Names in `dir` that look like a restore's staging directory.
fn staging_left(dir: &Path) -> Vec<String> {
    list(dir)
        .into_iter()
        .filter(|n| n.contains("restoring"))
        .collect()
}

/// An archive of `entries` (path, directory?, mode, uid, contents), as a
/// hostile or careless hand would make it.
fn archive(path: &Path, entries: &[(&str, bool, u32, u64, &[u8])]) {
    let file = std::fs::File::create(path).unwrap();
    let enc = zstd::stream::write::Encoder::new(file, 3).unwrap();
    let mut tar = tar::Builder::new(enc);
    for &(name, dir, mode, uid, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(if dir {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(uid);
        tar.append_data(&mut h, name, data).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap();
}

fn restore(env: &Env, archive: &Path, into: &Path) -> std::process::Output {
    env.run(&[
        "restore",
        archive.to_str().unwrap(),
        "--into",
        into.to_str().unwrap(),
        "--owner",
        &whoami(),
    ])
}

fn said(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_backup_never_writes_through_a_link_at_dest_partial_and_is_private() {
    let env = Env::standard();
    env.send("marcus", "rio", &["--body", "for the group only"]);
    let victim = env.tmp("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    let dest = env.tmp("state.tar.zst");
    let partial = env.tmp("state.tar.zst.partial");
    std::os::unix::fs::symlink(&victim, &partial).unwrap();

    let err = env.fails(&["backup", dest.to_str().unwrap()], 64);
    assert!(
        err.contains("state.tar.zst.partial") && err.contains("never written through"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(std::fs::symlink_metadata(&dest).is_err(), "DEST not made");

    // A leftover of this user's (a backup that did not finish) is replaced;
    // the archive holds every inbox, so it is its writer's only.
    std::fs::remove_file(&partial).unwrap();
    std::fs::write(&partial, "half a backup").unwrap();
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o644)).unwrap();
    env.ok(&["backup", dest.to_str().unwrap()]);
    assert_eq!(mode(&dest), 0o600);
    assert!(std::fs::metadata(&dest).unwrap().is_file());
    assert!(!partial.exists());
}

#[test]
fn a_restore_gives_the_stores_modes_never_the_archives() {
    let env = Env::standard();
    let evil = env.tmp("modes.tar.zst");
    archive(
        &evil,
        &[
            (".", true, 0o777, 0, b""),
            ("rio", true, 0o6777, 0, b""),
            ("rio/report.json", false, 0o6755, 12345, b"{}"),
            ("rio/notes.md", false, 0o666, 0, b"x"),
            ("rio/private.md", false, 0o600, 0, b"x"),
            ("rio/inbox", true, 0o777, 0, b""),
            ("rio/inbox/m.json", false, 0o4777, 12345, b"{}"),
            ("rio/inbox/processed", true, 0o3777, 0, b""),
            // No directory entry before it: made with the store's mode.
            (".daemon/x/daemon.json", false, 0o644, 0, b"{}"),
        ],
    );
    let into = env.tmp("restored");
    let out = restore(&env, &evil, &into);
    // (check has things to say about this hand-made root; not the point.)
    assert!(
        matches!(out.status.code(), Some(0) | Some(65)),
        "{}",
        said(&out)
    );
    for (rel, want) in [
        ("", 0o755),
        ("rio", 0o755),
        ("rio/report.json", 0o644),
        ("rio/notes.md", 0o644),
        ("rio/private.md", 0o640),
        ("rio/inbox", 0o3770),
        ("rio/inbox/m.json", 0o640),
        ("rio/inbox/processed", 0o2750),
        (".daemon/x", 0o755),
        (".daemon/x/daemon.json", 0o644),
    ] {
        let p = into.join(rel);
        assert_eq!(mode(&p), want, "{rel}: {:o}", mode(&p));
        let uid = std::fs::symlink_metadata(&p).unwrap().uid();
        assert_eq!(uid, nix::unistd::geteuid().as_raw(), "{rel}: owner");
    }
}

#[test]
fn a_decompression_bomb_stops_at_the_configured_limit() {
    let env = Env::with_config(&format!(
        "{STANDARD_AGENTS}\n[health]\nrestore_limit = \"8MiB\"\n"
    ));
    let bomb = env.tmp("bomb.tar.zst");
    {
        // 300 MiB of zeros declared and present: a few hundred KB packed.
        let file = std::fs::File::create(&bomb).unwrap();
        let enc = zstd::stream::write::Encoder::new(file, 3).unwrap();
        let mut tar = tar::Builder::new(enc);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_uid(0);
        h.set_gid(0);
        h.set_size(0);
        tar.append_data(&mut h, "rio", std::io::empty()).unwrap();
        let size = 300u64 << 20;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_size(size);
        tar.append_data(&mut h, "rio/journal.jsonl", std::io::repeat(0).take(size))
            .unwrap();
        tar.into_inner().unwrap().finish().unwrap();
    }
    assert!(std::fs::metadata(&bomb).unwrap().len() < 1 << 20);
    let into = env.tmp("restored");
    let out = restore(&env, &bomb, &into);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(65), "{}", said(&out));
    assert!(
        err.contains("rio/journal.jsonl") && err.contains("restore_limit"),
        "{err}"
    );
    assert!(!into.exists(), "nothing restored");
    assert_eq!(staging_left(env.dir.path()), Vec::<String>::new());
}

#[test]
fn a_link_at_the_old_staging_name_is_not_followed() {
    let env = Env::standard();
    let archive = env.tmp("state.tar.zst");
    env.ok(&["backup", archive.to_str().unwrap()]);
    // The attacker's directory, and a link to it at every name the old
    // restore would have staged in over the next two minutes.
    let attacker = env.tmp("attacker");
    std::fs::create_dir(&attacker).unwrap();
    let base = env.tmp("base");
    std::fs::create_dir(&base).unwrap();
    let into = base.join("restored");
    let now = chrono::Utc::now();
    for s in -5..120 {
        let stamp = (now + chrono::Duration::seconds(s)).format("%Y%m%dT%H%M%SZ");
        let _ = std::os::unix::fs::symlink(
            &attacker,
            base.join(format!(".restored.restoring-{stamp}")),
        );
    }
    let out = restore(&env, &archive, &into);
    assert!(out.status.success(), "{}", said(&out));
    let meta = std::fs::symlink_metadata(&into).unwrap();
    assert!(meta.is_dir(), "the root is a real directory, not a link");
    assert!(into.join("rio/report.json").is_file());
    assert!(list(&attacker).is_empty(), "nothing went through the link");
}

#[test]
fn a_root_that_is_a_link_or_a_file_is_refused_before_anything_is_unpacked() {
    let env = Env::standard();
    let archive = env.tmp("state.tar.zst");
    env.ok(&["backup", archive.to_str().unwrap()]);
    let base = env.tmp("base");
    std::fs::create_dir(&base).unwrap();
    let elsewhere = env.tmp("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let link = base.join("linked");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let out = restore(&env, &archive, &link);
    assert_eq!(out.status.code(), Some(64), "{}", said(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is a symbolic link"), "{err}");
    assert!(list(&elsewhere).is_empty());
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());

    let file = base.join("file");
    std::fs::write(&file, "mine\n").unwrap();
    let out = restore(&env, &archive, &file);
    assert_eq!(out.status.code(), Some(64), "{}", said(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a directory"),
        "{}",
        said(&out)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine\n");
    assert_eq!(staging_left(&base), Vec::<String>::new());

    // A link above the root is the operator's (`/opt` -> `/srv/opt`), and a
    // trailing slash changes nothing.
    let above = env.tmp("above");
    std::os::unix::fs::symlink(&base, &above).unwrap();
    let into = format!("{}/restored/", above.display());
    let out = restore(&env, &archive, Path::new(&into));
    assert!(out.status.success(), "{}", said(&out));
    assert!(base.join("restored/rio/report.json").is_file());
    let out = restore(&env, &archive, &base.join("linked/"));
    assert_eq!(out.status.code(), Some(64), "{}", said(&out));
    assert!(list(&elsewhere).is_empty());
}

// ---- with real users (root, AGENT_STATE_ROOT_TESTS=1) ------------------------

fn root_tests(test: &str) -> bool {
    let on = nix::unistd::geteuid().is_root()
        && std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() == Ok("1");
    if !on {
        eprintln!("SKIPPED: {test} creates a user and a group (root, AGENT_STATE_ROOT_TESTS=1)");
    }
    on
}

fn must(program: &str, args: &[&str]) {
    let out = run_tool(program, args);
    assert!(out.status.success(), "{program} {args:?}: {}", said(&out));
}

/// A service user and its inbox group; removed however the test ends.
struct Service {
    user: String,
    group: String,
}

impl Service {
    fn create(tag: &str) -> Service {
        let s = Service {
            user: account(&format!("asb{tag}svc")),
            group: account(&format!("asb{tag}grp")),
        };
        s.remove();
        must("groupadd", &["--system", &s.group]);
        // Its own primary group, the inbox group besides: the restored
        // state is the inbox group's all the same.
        must(
            "useradd",
            &[
                "--system", "-M", "-U", "-G", &s.group, "-s", "/bin/sh", &s.user,
            ],
        );
        s
    }

    fn remove(&self) {
        let _ = run_tool("userdel", &[&self.user]);
        let _ = run_tool("groupdel", &[&self.group]);
        let _ = Command::new("groupdel").arg(&self.user).output();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Every path below `root` (itself included) with its owner and group.
fn owners(root: &Path) -> Vec<(PathBuf, u32, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        out.push((p.clone(), m.uid(), m.gid()));
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out
}

#[test]
fn restored_as_root_or_as_the_service_user_the_state_is_the_service_users() {
    if !root_tests("restored_as_root_or_as_the_service_user_the_state_is_the_service_users") {
        return;
    }
    let svc = Service::create("r");
    let u = nix::unistd::User::from_name(&svc.user).unwrap().unwrap();
    let g = nix::unistd::Group::from_name(&svc.group).unwrap().unwrap();
    let env = Env::with_config(&format!("group = {:?}\n{STANDARD_AGENTS}", svc.group));
    env.ok(&["bootstrap"]);
    let archive = env.tmp("state.tar.zst");
    env.ok(&["backup", archive.to_str().unwrap()]);
    // Another user's file and a setgid one in the archive, as root made them.
    let hostile = env.tmp("hostile.tar.zst");
    self::archive(
        &hostile,
        &[
            ("rio", true, 0o755, 0, b""),
            ("rio/report.json", false, 0o6755, 0, b"{}"),
            ("rio/memory.md", false, 0o644, 65534, b"x"),
        ],
    );
    // A parent only root may write in, as /opt/teleo-eval is.
    let base = env.tmp("opt");
    std::fs::create_dir(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&archive, std::fs::Permissions::from_mode(0o644)).unwrap();

    // As root, where no root is: all of it the service user's and group's.
    let into = base.join("as-root");
    let out = env.run(&[
        "restore",
        hostile.to_str().unwrap(),
        "--into",
        into.to_str().unwrap(),
        "--owner",
        &svc.user,
    ]);
    assert!(
        matches!(out.status.code(), Some(0) | Some(65)),
        "{}",
        said(&out)
    );
    for (p, uid, gid) in owners(&into) {
        assert_eq!(
            (uid, gid),
            (u.uid.as_raw(), g.gid.as_raw()),
            "{}",
            p.display()
        );
    }
    assert_eq!(mode(&into), 0o755);
    assert_eq!(mode(&into.join("rio/report.json")), 0o644, "no setgid");

    // As root into the empty root tmpfiles.d made: its owner is the
    // service user (no --owner needed).
    let made = base.join("made");
    std::fs::create_dir(&made).unwrap();
    must(
        "chown",
        &[
            &format!("{}:{}", svc.user, svc.group),
            made.to_str().unwrap(),
        ],
    );
    env.ok(&[
        "restore",
        archive.to_str().unwrap(),
        "--into",
        made.to_str().unwrap(),
    ]);
    for (p, uid, gid) in owners(&made) {
        assert_eq!(
            (uid, gid),
            (u.uid.as_raw(), g.gid.as_raw()),
            "{}",
            p.display()
        );
    }
    assert_eq!(mode(&made.join("rio/inbox")), 0o3770);

    // As the service user, as the README says (`sudo -u agent-state`), into
    // its empty root in a parent it may not write.
    let mine = base.join("mine");
    std::fs::create_dir(&mine).unwrap();
    must(
        "chown",
        &[
            &format!("{}:{}", svc.user, svc.group),
            mine.to_str().unwrap(),
        ],
    );
    let bin = env.tmp("agent-state");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&env.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let as_svc = |into: &Path| {
        Command::new("runuser")
            .args(["-u", &svc.user, "--"])
            .arg(&bin)
            .arg("--config")
            .arg(&env.config)
            .args(["restore", archive.to_str().unwrap(), "--into"])
            .arg(into)
            .current_dir("/")
            .env_remove("AGENT_STATE_CONFIG")
            .output()
            .unwrap()
    };
    let out = as_svc(&mine);
    assert!(out.status.success(), "{}", said(&out));
    assert!(mine.join("rio/report.json").is_file());
    assert_eq!(staging_left(&mine), Vec::<String>::new());
    for (p, uid, gid) in owners(&mine) {
        assert_eq!(
            (uid, gid),
            (u.uid.as_raw(), g.gid.as_raw()),
            "{}",
            p.display()
        );
    }
    assert_eq!(mode(&mine.join("rio/inbox")), 0o3770);
    // Where there is no root and the parent is root's: what to do, said.
    let out = as_svc(&base.join("none"));
    assert_eq!(out.status.code(), Some(77), "{}", said(&out));
    assert!(
        said(&out).contains("empty for this user first"),
        "{}",
        said(&out)
    );
    assert!(!base.join("none").exists());
}

#[test]
fn check_flags_a_mode_the_store_never_writes_and_repair_sets_the_stores() {
    let env = Env::standard();
    env.send("marcus", "rio", &["--body", "for the group"]);
    let message = env.agent("rio").join("inbox").join(&env.waiting("rio")[0]);
    let chmod =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    // What a restore from before left (setgid kept, 0777, 0666).
    chmod(&env.path("rio", "report.json"), 0o6755);
    chmod(&env.path("rio", "memory.md"), 0o666);
    chmod(&env.agent("rio"), 0o777);
    chmod(&message, 0o777);
    // Not the store's: what a session leaves beside its state is its own.
    std::fs::write(env.path("rio", "tool.sh"), "#!/bin/sh\n").unwrap();
    chmod(&env.path("rio", "tool.sh"), 0o755);

    let out = env.run(&["check"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(65), "{said}");
    for line in [
        "rio: report.json: a mode the store never writes: 6755, should be 644",
        "rio: memory.md: a mode the store never writes: 666, should be 644",
        "rio: .: a mode the store never writes: 777, should be 755",
        "a mode the store never writes: 777, should be 640",
    ] {
        assert!(said.contains(line), "{line}\n{said}");
    }
    assert!(!said.contains("tool.sh"), "{said}");

    env.run(&["check", "--repair"]);
    assert_eq!(mode(&env.path("rio", "report.json")), 0o644);
    assert_eq!(mode(&env.path("rio", "memory.md")), 0o644);
    assert_eq!(mode(&env.agent("rio")), 0o755);
    assert_eq!(mode(&message), 0o640);
    let said = env.ok(&["check"]);
    assert!(said.contains("no problems found"), "{said}");
}

#[test]
fn a_long_name_goes_through_backup_and_restore() {
    // Past the tar header's 100 bytes: a GNU long-name member, which
    // restore reads itself (bounded).
    let env = Env::standard();
    let name = format!("{}.json", "m".repeat(200));
    let processed = env.agent("rio").join("inbox/processed");
    std::fs::write(processed.join(&name), "{}").unwrap();
    let archive = env.tmp("state.tar.zst");
    env.ok(&["backup", archive.to_str().unwrap()]);
    let into = env.tmp("restored");
    let out = restore(&env, &archive, &into);
    assert!(out.status.success(), "{}", said(&out));
    let back = into.join("rio/inbox/processed").join(&name);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "{}");
    assert_eq!(mode(&back), 0o640);
}
