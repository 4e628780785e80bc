//! A real systemd to test under: a container booted by `sdbox` (a tool kept
//! in `../shared/tools/`) with systemd as PID 1, journald and dbus. Shared by
//! the tests of the unit (`systemd`) and of an operator's whole first day
//! (`trial`). Gated by `AGENT_STATE_SYSTEMD_TESTS=1` because it needs root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{BIN, poll_until};

pub const UNIT: &str = "systemd/agent-state.service";
/// Where the unit starts the program from (where a package installs it).
pub const UNIT_BIN: &str = "/usr/bin/agent-state";
pub const CONFIG: &str = "/etc/agent-state/config.toml";
pub const STATE: &str = "/opt/teleo-eval/agent-state";

pub fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// The sdbox tool if these tests are to run; otherwise says why not.
pub fn sdbox_tool() -> Option<PathBuf> {
    if std::env::var("AGENT_STATE_SYSTEMD_TESTS").as_deref() != Ok("1") {
        eprintln!("SKIPPED: set AGENT_STATE_SYSTEMD_TESTS=1 (needs root and sdbox)");
        return None;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED: AGENT_STATE_SYSTEMD_TESTS=1, but this test needs root (sdbox boots a container)"
        );
        return None;
    }
    let tool = std::env::var_os("AGENT_STATE_SDBOX")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_file("../shared/tools/sdbox"));
    if !tool.is_file() {
        eprintln!(
            "SKIPPED: AGENT_STATE_SYSTEMD_TESTS=1, but there is no sdbox at {} (set AGENT_STATE_SDBOX=PATH)",
            tool.display()
        );
        return None;
    }
    Some(tool)
}

/// Numbers boxes, so each has a name of its own.
static NEXT_BOX: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A container with systemd as PID 1. Dropping it halts it and deletes its
/// root (`sdbox down`), after printing the unit's journal if the test failed.
pub struct SdBox {
    tool: PathBuf,
    name: String,
    pub root: PathBuf,
    /// The box's own cgroups (see [`BoxCgroups`]).
    cgroups: BoxCgroups,
}

impl SdBox {
    /// Boot a box; up to three tries (see [`SdBox::try_up`]).
    pub fn up(tool: PathBuf) -> SdBox {
        const TRIES: u32 = 3;
        for attempt in 1..=TRIES {
            // The guard exists before `up`, so a box that half started is
            // removed too.
            let mut sdbox = SdBox {
                tool: tool.clone(),
                // Unique per box: tests run in parallel, and a box of the
                // same name would be halted by the other test's `down`.
                name: format!(
                    "agent-state-it-{}-{}-{attempt}",
                    std::process::id(),
                    NEXT_BOX.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                ),
                root: PathBuf::new(),
                cgroups: BoxCgroups::default(),
            };
            sdbox.cgroups = BoxCgroups::make(&sdbox.name);
            let t0 = Instant::now();
            match sdbox.try_up() {
                Ok(()) => {
                    eprintln!("sdbox {} up in {:?}", sdbox.name, t0.elapsed());
                    return sdbox;
                }
                Err(why) if attempt < TRIES => {
                    eprintln!("sdbox up {} failed, trying again: {why}", sdbox.name);
                }
                Err(why) => panic!("sdbox up failed {TRIES} times; the last: {why}"),
            }
        }
        unreachable!()
    }

    /// `sdbox up`, watched: sdbox records as the container's init the first
    /// child of systemd-nspawn, which under load is sometimes nspawn's own
    /// short-lived helper; it then waits a minute for an answer that cannot
    /// come. When the recorded pid is gone, this gives up at once.
    fn try_up(&mut self) -> Result<(), String> {
        let mut up = self.tool_command(&["up", &self.name]);
        self.cgroups.enter_on_spawn(&mut up);
        let mut child = up
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run sdbox: {e}"))?;
        let home = std::env::var_os("SDBOX_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp/sdbox"));
        let init_pid = home.join("boxes").join(&self.name).join("init.pid");
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) => {}
                Err(e) => return Err(format!("waiting for sdbox up: {e}")),
            }
            let recorded = std::fs::read_to_string(&init_pid).unwrap_or_default();
            let recorded = recorded.trim();
            if started.elapsed() > Duration::from_secs(5)
                && !recorded.is_empty()
                && !Path::new("/proc").join(recorded).exists()
            {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the init pid sdbox recorded ({recorded}) is gone: not the container's systemd"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("sdbox up: {e}"))?;
        if !out.status.success() {
            return Err(describe(&out));
        }
        let out = self
            .tool_command(&["root", &self.name])
            .output()
            .map_err(|e| format!("sdbox root: {e}"))?;
        self.root = PathBuf::from(text(&out.stdout).trim());
        if !self.root.join("lib/systemd/systemd").exists() {
            return Err(format!(
                "sdbox root {} is not a root file system",
                self.root.display()
            ));
        }
        let init = std::fs::read_to_string(&init_pid).unwrap_or_default();
        let cgroup =
            std::fs::read_to_string(format!("/proc/{}/cgroup", init.trim())).unwrap_or_default();
        let own = format!("/agent-state-it-{}/", self.name);
        assert!(
            self.cgroups.dirs.is_empty() || cgroup.lines().any(|l| l.contains(&own)),
            "the box's systemd is not in the box's own cgroup {own}: {cgroup}"
        );
        Ok(())
    }

    /// `bash sdbox ARGS` (through bash: a copied tool may have lost its x bit).
    fn tool_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg(&self.tool).args(args).stdin(Stdio::null());
        cmd
    }

    /// Run a command inside the box.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut all = vec!["exec", self.name.as_str()];
        all.extend_from_slice(args);
        self.tool_command(&all).output().expect("run sdbox exec")
    }

    /// Run a command inside the box; it must succeed. Returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.exec(args);
        assert!(
            out.status.success(),
            "in the box: {args:?}\n{}",
            describe(&out)
        );
        text(&out.stdout)
    }

    /// `agent-state --config CONFIG ARGS` run as the agent-state user.
    pub fn agent_state(&self, args: &[&str]) -> Output {
        let mut all = vec![
            "runuser",
            "-u",
            "agent-state",
            "--",
            UNIT_BIN,
            "--config",
            CONFIG,
        ];
        all.extend_from_slice(args);
        self.exec(&all)
    }

    /// What a package installs: the binary built for these tests, the unit,
    /// and the sysusers.d and tmpfiles.d files (not yet applied).
    pub fn install_package_files(&self) {
        self.install(Path::new(BIN), UNIT_BIN, 0o755);
        self.install(
            &repo_file(UNIT),
            "/usr/lib/systemd/system/agent-state.service",
            0o644,
        );
        for kind in ["sysusers.d", "tmpfiles.d"] {
            self.install(
                &repo_file(&format!("packaging/{kind}/agent-state.conf")),
                &format!("/usr/lib/{kind}/agent-state.conf"),
                0o644,
            );
        }
    }

    /// The host path of a path inside the box.
    pub fn path(&self, inside: &str) -> PathBuf {
        self.root.join(inside.trim_start_matches('/'))
    }

    pub fn install(&self, src: &Path, inside: &str, mode: u32) {
        let dest = self.path(inside);
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir in the box");
        std::fs::copy(src, &dest)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", src.display(), dest.display()));
        set_mode(&dest, mode);
    }

    pub fn write(&self, inside: &str, content: &str, mode: u32) {
        let dest = self.path(inside);
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir in the box");
        std::fs::write(&dest, content).expect("write in the box");
        set_mode(&dest, mode);
    }

    pub fn read(&self, inside: &str) -> String {
        std::fs::read_to_string(self.path(inside)).unwrap_or_default()
    }

    pub fn json(&self, inside: &str) -> Value {
        serde_json::from_str(&self.read(inside)).unwrap_or(Value::Null)
    }

    /// `systemctl show -p …` of the unit, as a map.
    pub fn show(&self, props: &[&str]) -> BTreeMap<String, String> {
        let list = props.join(",");
        self.ok(&["systemctl", "show", "agent-state.service", "-p", &list])
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// One property of another unit.
    pub fn prop_of(&self, unit: &str, name: &str) -> String {
        self.ok(&["systemctl", "show", unit, "-p", name, "--value"])
            .trim()
            .to_string()
    }

    pub fn prop(&self, name: &str) -> String {
        self.show(&[name]).remove(name).unwrap_or_default()
    }

    /// The unit's journal (with extra `journalctl` arguments).
    pub fn journal(&self, extra: &[&str]) -> String {
        let mut args = vec!["journalctl", "--no-pager", "-u", "agent-state.service"];
        args.extend_from_slice(extra);
        text(&self.exec(&args).stdout)
    }

    /// Wait until `cond` holds; fail naming `what`, with the unit's journal.
    pub fn wait_until(&self, timeout: Duration, what: &str, cond: impl FnMut() -> bool) {
        if !poll_until(timeout, cond) {
            panic!(
                "timed out after {timeout:?} waiting until {what}\n---- journal ----\n{}",
                self.journal(&["-n", "60"])
            );
        }
    }
}

impl Drop for SdBox {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.root.as_os_str().is_empty() {
            eprintln!(
                "---- journalctl -u agent-state (in the box) ----\n{}---- systemctl status ----\n{}---- the whole journal's last lines (systemd, the kernel: who killed what) ----\n{}",
                self.journal(&["-n", "200"]),
                text(
                    &self
                        .exec(&["systemctl", "status", "--no-pager", "agent-state.service"])
                        .stdout
                ),
                text(
                    &self
                        .exec(&[
                            "journalctl",
                            "--no-pager",
                            "-o",
                            "short-precise",
                            "-n",
                            "150"
                        ])
                        .stdout
                )
            );
        }
        match self.tool_command(&["down", &self.name]).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!("sdbox down {} failed:\n{}", self.name, describe(&out)),
            Err(e) => eprintln!("cannot run sdbox down {}: {e}", self.name),
        }
        self.cgroups.remove();
    }
}

pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A cgroup of the box's own in each hierarchy that tracks processes (the
/// unified one, and systemd's named v1 one on a hybrid host), entered by
/// `sdbox up` before it starts systemd-nspawn. nspawn's `--keep-unit` puts
/// the container under its caller's cgroup: without these, boxes booted at
/// the same time share one tree, so one box's `agent-state.service` is the
/// other's, and one box's daemon starting kills the other's sessions as
/// leftovers (a session of the unit test was SIGKILLed so in CI).
#[derive(Default)]
struct BoxCgroups {
    dirs: Vec<PathBuf>,
}

impl BoxCgroups {
    /// Make `agent-state-it-NAME` in each writable process-tracking
    /// hierarchy found (none where there is none: the boxes then share as
    /// before).
    fn make(name: &str) -> BoxCgroups {
        let candidates = [
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup/systemd",
            "/sys/fs/cgroup",
        ];
        let mut dirs = Vec::new();
        for base in candidates {
            let base = Path::new(base);
            // A cgroup hierarchy of its own (not a tmpfs of mount points),
            // and not one already taken (pure v2: /sys/fs/cgroup is it).
            if !base.join("cgroup.procs").is_file() {
                continue;
            }
            let dir = base.join(format!("agent-state-it-{name}"));
            match std::fs::create_dir(&dir) {
                Ok(()) => dirs.push(dir),
                Err(e) => eprintln!(
                    "cannot make the box's cgroup {} ({e}); boxes started together may share one",
                    dir.display()
                ),
            }
        }
        BoxCgroups { dirs }
    }

    /// `cmd` moves itself into these cgroups before it runs.
    fn enter_on_spawn(&self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let procs: Vec<std::ffi::CString> = self
            .dirs
            .iter()
            .filter_map(|d| {
                std::ffi::CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes())
                    .ok()
            })
            .collect();
        // SAFETY: between fork and exec only open/write/close of paths made
        // before the fork (async-signal-safe; no allocation).
        unsafe {
            cmd.pre_exec(move || {
                for path in &procs {
                    let fd = nix::libc::open(path.as_ptr(), nix::libc::O_WRONLY);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let written = nix::libc::write(fd, b"0".as_ptr().cast(), 1);
                    nix::libc::close(fd);
                    if written != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }

    /// Remove them, innermost first, once the box is down (an empty cgroup
    /// is removed by rmdir; one still holding a process stays, harmlessly).
    fn remove(&self) {
        fn rmdir_tree(dir: &Path) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        rmdir_tree(&e.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        for dir in &self.dirs {
            rmdir_tree(dir);
        }
    }
}
