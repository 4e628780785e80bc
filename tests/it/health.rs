//! The health monitor's probe on real file systems: a small tmpfs filled up
//! and emptied again, and a read-only bind mount. Needs root (mount), so it
//! runs only with AGENT_STATE_ROOT_TESTS=1.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use agent_state::agent_name::AgentName;
use agent_state::clock::Timestamp;
use agent_state::daemon::health::{
    self, DiskLevel, DiskProbe, HealthState, Thresholds, disk_level, probe,
};
use agent_state::state::StateRoot;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// 4 MiB tmpfs: warn below 3 MiB, pause below 2 MiB, stop below 1 MiB.
const THRESHOLDS: Thresholds = Thresholds {
    warn: 3 * MIB,
    pause: 2 * MIB,
    stop: MIB,
};

fn root_tests_enabled() -> bool {
    let enabled = std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() == Ok("1");
    if enabled && nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("SKIPPED: needs root (AGENT_STATE_ROOT_TESTS=1)");
    false
}

/// A mount that is unmounted when dropped, whatever happened in between.
struct Mounted(PathBuf);

impl Mounted {
    /// `mount ARGS… TARGET`; the guard exists once the mount does.
    fn new(args: &[&str], target: &Path) -> Mounted {
        run("mount", args, target);
        Mounted(target.to_path_buf())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Busy (a file still open): detach it now, gone once released.
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn run(program: &str, args: &[&str], last: &Path) {
    let out = Command::new(program)
        .args(args)
        .arg(last)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} {}: {}",
        last.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tmpfs(dir: &Path) -> Mounted {
    Mounted::new(&["-t", "tmpfs", "-o", "size=4m", "tmpfs"], dir)
}

/// Distinct consecutive values.
fn runs(levels: &[DiskLevel]) -> Vec<DiskLevel> {
    let mut out = levels.to_vec();
    out.dedup();
    out
}

/// Write `bytes` bytes; false once the file system is full.
fn write_chunk(path: &Path, bytes: u64) -> bool {
    match std::fs::write(path, vec![b'x'; bytes as usize]) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::StorageFull => false,
        Err(e) => panic!("writing {}: {e}", path.display()),
    }
}

#[test]
fn disk_levels_follow_a_filling_and_emptying_tmpfs() {
    if !root_tests_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _mount = tmpfs(dir.path());
    let p = probe(dir.path()).unwrap();
    assert_eq!(p.total, 4 * MIB, "{p:?}");
    assert_eq!(p.free, 4 * MIB, "{p:?}");
    assert!(!p.read_only);

    // Fill in chunks smaller than the 1 MiB between thresholds, so every
    // level is seen, until the file system is full.
    let mut level = DiskLevel::Ok;
    let mut filling = vec![level];
    let mut files = Vec::new();
    for i in 0.. {
        let path = dir.path().join(format!("fill-{i}"));
        let room = write_chunk(&path, 384 * KIB);
        files.push(path);
        let p = probe(dir.path()).unwrap();
        level = disk_level(level, p.free, &THRESHOLDS);
        // Going down is immediate: exactly what the free space says.
        assert_eq!(level, THRESHOLDS.classify(p.free), "{p:?}");
        filling.push(level);
        if !room {
            assert_eq!(p.free, 0, "{p:?}");
            break;
        }
    }
    use DiskLevel::*;
    assert_eq!(runs(&filling), [Ok, Low, Paused, Stopped], "{filling:?}");

    // Empty it again: Stopped → Paused above disk_stop, sessions resume
    // only above disk_pause.
    let mut emptying = vec![level];
    while let Some(path) = files.pop() {
        std::fs::remove_file(&path).unwrap();
        let p = probe(dir.path()).unwrap();
        let prev = level;
        level = disk_level(level, p.free, &THRESHOLDS);
        emptying.push(level);
        if prev >= Paused && level.allows_new_sessions() {
            assert!(p.free > THRESHOLDS.pause, "resumed at {p:?}");
        }
        if p.free <= THRESHOLDS.pause {
            assert!(level >= Paused, "{level:?} at {p:?}");
        }
    }
    assert_eq!(runs(&emptying), [Stopped, Paused, Low, Ok], "{emptying:?}");
    assert_eq!(probe(dir.path()).unwrap().free, 4 * MIB);
}

#[test]
fn pruning_processed_messages_makes_room_again() {
    if !root_tests_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _mount = tmpfs(dir.path());
    let agent = StateRoot::new(dir.path()).agent(&AgentName::parse("rio").unwrap());
    for d in agent.directories() {
        std::fs::create_dir_all(d).unwrap();
    }
    let week_ago = SystemTime::now() - Duration::from_secs(8 * 86400);
    // Old processed messages fill the disk until the daemon would pause…
    let mut level = DiskLevel::Ok;
    for i in 0.. {
        let path = agent.processed().join(format!("m{i}.json"));
        assert!(write_chunk(&path, 256 * KIB), "full before pausing");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(week_ago)
            .unwrap();
        level = disk_level(level, probe(dir.path()).unwrap().free, &THRESHOLDS);
        if level == DiskLevel::Paused {
            break;
        }
    }
    // …and what must stay (a rejected message, a waiting one) stays.
    std::fs::write(agent.rejected().join("bad.json"), "{").unwrap();
    std::fs::write(agent.inbox().join("waiting.json"), "{}").unwrap();

    let cutoff = SystemTime::now() - Duration::from_secs(7 * 86400);
    let stats = health::prune_processed(&agent, cutoff).unwrap();
    assert!(
        stats.files >= 5 && stats.bytes >= 5 * 256 * KIB,
        "{stats:?}"
    );
    let p = probe(dir.path()).unwrap();
    level = disk_level(level, p.free, &THRESHOLDS);
    assert_eq!(level, DiskLevel::Ok, "{p:?}");
    assert!(agent.rejected().join("bad.json").exists());
    assert!(agent.inbox().join("waiting.json").exists());
}

#[test]
fn a_read_only_bind_mount_probes_read_only() {
    if !root_tests_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("state");
    let target = dir.path().join("state-ro");
    std::fs::create_dir(&source).unwrap();
    std::fs::create_dir(&target).unwrap();
    let source_arg = source.to_str().unwrap();
    let _bind = Mounted::new(&["--bind", source_arg], &target);
    run("mount", &["-o", "remount,ro,bind"], &target);

    let rw = probe(&source).unwrap();
    let ro = probe(&target).unwrap();
    assert!(!rw.read_only, "{rw:?}");
    assert!(ro.read_only, "{ro:?}");
    assert!(std::fs::write(target.join("x"), "x").is_err());

    // A read-only state root stops the daemon, whatever the free space.
    let now = Timestamp::now();
    let state = HealthState::observe(
        None,
        DiskProbe {
            free: u64::MAX / 2,
            ..ro
        },
        &THRESHOLDS,
        now,
    );
    assert_eq!(state.level, DiskLevel::Stopped);
    assert_eq!(state.status_fragment(), "stopped: state root is read-only");
}
