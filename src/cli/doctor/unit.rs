//! The service unit as `doctor` judges it: the service user and group, its
//! environment, and its sandbox (what the service may write, what it cannot
//! see). Read from systemd when it runs here (`systemctl show`: the
//! effective settings, the operator's drop-ins included); only when it does
//! not, from the unit file this package ships, and doctor says which.
//!
//! The parsing and the judgement of a path are pure ([`Unit::parse`],
//! [`Unit::access`]); [`load`] runs systemctl.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The unit file installed by the package (`systemd/agent-state.service`).
const SHIPPED: &str = include_str!("../../../systemd/agent-state.service");

pub const NAME: &str = "agent-state.service";

/// What is asked of `systemctl show`.
const PROPERTIES: &[&str] = &[
    "LoadState",
    "User",
    "Group",
    "Environment",
    "EnvironmentFiles",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "StateDirectory",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
];

/// Where installed unit files are, if systemd cannot be asked.
const UNIT_FILES: &[&str] = &[
    "/etc/systemd/system/agent-state.service",
    "/usr/lib/systemd/system/agent-state.service",
    "/lib/systemd/system/agent-state.service",
];

/// Where the settings came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `systemctl show`: what systemd runs, drop-ins included.
    Systemd,
    /// The shipped unit file's settings; the reason systemd was not asked.
    Shipped(String),
}

/// What [`load`] found.
#[derive(Debug)]
pub enum Found {
    Unit(Box<Unit>),
    /// No unit is installed: why doctor thinks so.
    NotInstalled(String),
}

/// What the service may do at a path, by the unit's sandbox (file modes
/// aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Writable,
    ReadOnly,
    /// Not there at all for the service (ProtectHome=yes, InaccessiblePaths=).
    Hidden,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub source: Source,
    /// `User=`; root when the unit sets none.
    pub user: String,
    /// `Group=`, if set.
    pub group: Option<String>,
    /// `Environment=`, in order.
    pub environment: Vec<(String, String)>,
    /// `EnvironmentFile=` (optional or not).
    pub environment_files: Vec<PathBuf>,
    /// `no`, `yes`, `full` or `strict`.
    pub protect_system: String,
    /// `no`, `yes`, `read-only` or `tmpfs`.
    pub protect_home: String,
    pub private_tmp: bool,
    /// `StateDirectory=`, as the paths under /var/lib.
    pub state_directories: Vec<PathBuf>,
    pub read_write: Vec<PathBuf>,
    pub read_only: Vec<PathBuf>,
    pub inaccessible: Vec<PathBuf>,
}

/// One sandbox setting's effect on a directory and what is below it.
struct Rule {
    path: PathBuf,
    access: Access,
    /// As the operator would write it: `ProtectSystem=strict`.
    setting: String,
    /// At the same depth, the higher wins: a ProtectSystem=/ProtectHome=
    /// default (0) gives way to ReadWritePaths= and the like (1), which give
    /// way to ReadOnlyPaths= (2).
    rank: u8,
}

/// Ask systemd; without it, the shipped unit's settings if a unit file is
/// installed.
pub fn load() -> Found {
    let why = match systemctl_show() {
        Ok(text) => {
            let properties = properties(&text);
            let state = last(&properties, "LoadState").unwrap_or("");
            if state != "loaded" {
                return Found::NotInstalled(format!("systemd has no {NAME} (LoadState={state})"));
            }
            return Found::Unit(Box::new(Unit::from_properties(
                &properties,
                Source::Systemd,
            )));
        }
        Err(why) => why.to_string(),
    };
    if UNIT_FILES.iter().any(|p| Path::new(p).is_file()) {
        Found::Unit(Box::new(Unit::parse(SHIPPED, Source::Shipped(why))))
    } else {
        Found::NotInstalled(format!("{why}, and no {NAME} file is installed"))
    }
}

/// Why `systemctl show` could not say (doctor then reads the unit file).
#[derive(Debug, thiserror::Error)]
enum NoSystemctl {
    #[error("systemctl is not on PATH")]
    NotOnPath,
    #[error("cannot run systemctl: {0}")]
    Spawn(std::io::Error),
    /// Its first line of stderr.
    #[error("systemctl show failed ({0})")]
    Failed(String),
}

/// `systemctl show agent-state.service -p …`, or why it could not say.
fn systemctl_show() -> Result<String, NoSystemctl> {
    let mut cmd = Command::new("systemctl");
    cmd.arg("show").arg(NAME);
    for p in PROPERTIES {
        cmd.arg("-p").arg(p);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => NoSystemctl::NotOnPath,
            _ => NoSystemctl::Spawn(e),
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(NoSystemctl::Failed(
            err.lines()
                .next()
                .unwrap_or("no reason given")
                .trim()
                .to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `Key=Value` lines, each key's values in order (pure). Comments, section
/// headers and blank lines are skipped, so a unit file reads the same way;
/// an empty assignment clears what came before, as systemd does.
fn properties(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with(['#', ';', '[']) {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let values = out.entry(key.trim().to_string()).or_default();
        let value = value.trim();
        if value.is_empty() {
            values.clear();
        } else {
            values.push(value.to_string());
        }
    }
    out
}

fn last<'a>(properties: &'a BTreeMap<String, Vec<String>>, key: &str) -> Option<&'a str> {
    properties
        .get(key)
        .and_then(|v| v.last())
        .map(String::as_str)
}

/// Words of a list value; double quotes group (`"A=b c"`), a backslash
/// escapes the next character.
fn words(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut started) = (false, false);
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                started = true;
            }
            '\\' => {
                word.extend(chars.next());
                started = true;
            }
            c if c.is_whitespace() && !quoted => {
                if started {
                    out.push(std::mem::take(&mut word));
                }
                started = false;
            }
            c => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        out.push(word);
    }
    out
}

/// A path list's paths: `-` (optional: ignored if missing) and `+` (under
/// RootDirectory=) prefixes dropped; anything not absolute left out.
fn paths(values: Option<&Vec<String>>) -> Vec<PathBuf> {
    values
        .into_iter()
        .flatten()
        .flat_map(|v| words(v))
        .map(|w| PathBuf::from(w.trim_start_matches(['-', '+'])))
        .filter(|p| p.is_absolute())
        .collect()
}

/// A boolean-or-word setting as its word: `true`/`1` is `yes`, `false`/`0`
/// is `no`.
fn word_of(value: Option<&str>) -> String {
    match value.unwrap_or("no") {
        "true" | "1" | "on" => "yes".into(),
        "false" | "0" | "off" | "" => "no".into(),
        other => other.into(),
    }
}

impl Unit {
    /// The settings in `systemctl show` output or a unit file (pure).
    pub fn parse(text: &str, source: Source) -> Unit {
        Unit::from_properties(&properties(text), source)
    }

    fn from_properties(p: &BTreeMap<String, Vec<String>>, source: Source) -> Unit {
        let environment = p
            .get("Environment")
            .into_iter()
            .flatten()
            .flat_map(|v| words(v))
            .filter_map(|w| {
                w.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        // `EnvironmentFile=-/etc/x` in a unit file;
        // `EnvironmentFiles=/etc/x (ignore_errors=yes)` from systemctl.
        let environment_files = ["EnvironmentFile", "EnvironmentFiles"]
            .iter()
            .flat_map(|k| p.get(*k).into_iter().flatten())
            .map(|v| {
                let v = v.split(" (ignore_errors=").next().unwrap_or(v);
                PathBuf::from(v.trim().trim_start_matches('-'))
            })
            .filter(|f| f.is_absolute())
            .collect();
        let state_directories = p
            .get("StateDirectory")
            .into_iter()
            .flatten()
            .flat_map(|v| words(v))
            // `name:alias` (systemd 250) makes both; the name is the directory.
            .map(|w| Path::new("/var/lib").join(w.split(':').next().unwrap_or(&w)))
            .collect();
        Unit {
            source,
            user: last(p, "User")
                .filter(|u| !u.is_empty())
                .unwrap_or("root")
                .to_string(),
            group: last(p, "Group").map(str::to_string),
            environment,
            environment_files,
            protect_system: word_of(last(p, "ProtectSystem")),
            protect_home: word_of(last(p, "ProtectHome")),
            private_tmp: word_of(last(p, "PrivateTmp")) != "no",
            state_directories,
            read_write: paths(p.get("ReadWritePaths")),
            read_only: paths(p.get("ReadOnlyPaths")),
            inaccessible: paths(p.get("InaccessiblePaths")),
        }
    }

    /// The value the unit gives an environment variable (the last wins).
    pub fn env(&self, name: &str) -> Option<&str> {
        self.environment
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every directory the sandbox lets the service write (with
    /// ProtectSystem=strict, everything else is read-only).
    pub fn writable(&self) -> Vec<&Path> {
        let mut out: Vec<&Path> = self.read_write.iter().map(PathBuf::as_path).collect();
        out.extend(self.state_directories.iter().map(PathBuf::as_path));
        if self.private_tmp {
            out.extend([Path::new("/tmp"), Path::new("/var/tmp")]);
        }
        out
    }

    /// One line: who the service runs as and what its sandbox allows.
    pub fn summary(&self) -> String {
        let writable: Vec<String> = self
            .writable()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        format!(
            "User={} Group={} ProtectSystem={} ProtectHome={}; writable: {}",
            self.user,
            self.group.as_deref().unwrap_or("-"),
            self.protect_system,
            self.protect_home,
            if writable.is_empty() {
                "-".to_string()
            } else {
                writable.join(", ")
            }
        )
    }

    fn rules(&self) -> Vec<Rule> {
        let mut rules = Vec::new();
        let mut add = |path: &str, access: Access, setting: String, rank: u8| {
            rules.push(Rule {
                path: PathBuf::from(path),
                access,
                setting,
                rank,
            })
        };
        let system = format!("ProtectSystem={}", self.protect_system);
        let read_only: &[&str] = match self.protect_system.as_str() {
            "strict" => &["/"],
            "full" => &["/usr", "/boot", "/efi", "/etc"],
            "yes" => &["/usr", "/boot", "/efi"],
            _ => &[],
        };
        for p in read_only {
            add(p, Access::ReadOnly, system.clone(), 0);
        }
        let home = format!("ProtectHome={}", self.protect_home);
        let home_access = match self.protect_home.as_str() {
            // tmpfs: an empty, writable directory in their place: what was
            // there is hidden all the same.
            "yes" | "tmpfs" => Some(Access::Hidden),
            "read-only" => Some(Access::ReadOnly),
            _ => None,
        };
        if let Some(access) = home_access {
            for p in ["/home", "/root", "/run/user"] {
                add(p, access, home.clone(), 0);
            }
        }
        if self.private_tmp {
            for p in ["/tmp", "/var/tmp"] {
                add(p, Access::Writable, "PrivateTmp=yes".into(), 1);
            }
        }
        for p in &self.state_directories {
            let name = p.strip_prefix("/var/lib").unwrap_or(p);
            rules.push(Rule {
                path: p.clone(),
                access: Access::Writable,
                setting: format!("StateDirectory={}", name.display()),
                rank: 1,
            });
        }
        let explicit = [
            (&self.read_write, Access::Writable, "ReadWritePaths", 1),
            (&self.read_only, Access::ReadOnly, "ReadOnlyPaths", 2),
            (&self.inaccessible, Access::Hidden, "InaccessiblePaths", 2),
        ];
        for (list, access, key, rank) in explicit {
            for p in list {
                rules.push(Rule {
                    path: p.clone(),
                    access,
                    setting: format!("{key}={}", p.display()),
                    rank,
                });
            }
        }
        rules
    }

    /// What the service may do at `path` and the setting that decides it
    /// (pure). A hidden directory hides everything below it, whatever a
    /// deeper setting says (systemd drops those); otherwise the deepest
    /// setting above the path wins, so ReadWritePaths=/srv/x opens /srv/x
    /// under ProtectSystem=strict. No setting: writable.
    pub fn access(&self, path: &Path) -> (Access, String) {
        let rules = self.rules();
        let above = || rules.iter().filter(|r| path.starts_with(&r.path));
        let depth = |r: &&Rule| r.path.components().count();
        if let Some(r) = above()
            .filter(|r| r.access == Access::Hidden)
            .min_by_key(depth)
        {
            return (Access::Hidden, r.setting.clone());
        }
        above()
            .max_by_key(|r| (depth(r), r.rank))
            .map(|r| (r.access, r.setting.clone()))
            .unwrap_or((Access::Writable, "no sandbox setting".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `systemctl show agent-state.service -p …` prints for the
    /// shipped unit with an operator's drop-in (`systemctl edit`):
    /// `[Service] User=svc ReadWritePaths=-/srv/extra` and an API key.
    const SHOW: &str = "\
LoadState=loaded
User=svc
Group=teleo
Environment=HOME=/var/lib/agent-state \"NOTE=two words\" ANTHROPIC_API_KEY=sk-x
EnvironmentFiles=/etc/agent-state/environment (ignore_errors=yes)
EnvironmentFiles=/etc/agent-state/more (ignore_errors=no)
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
StateDirectory=agent-state
ReadWritePaths=/opt/teleo-eval -/srv/extra
ReadOnlyPaths=/opt/teleo-eval/frozen
InaccessiblePaths=
";

    fn show() -> Unit {
        Unit::parse(SHOW, Source::Systemd)
    }

    #[test]
    fn systemctl_show_output_is_read_with_the_drop_in_s_settings() {
        let u = show();
        assert_eq!(u.user, "svc");
        assert_eq!(u.group.as_deref(), Some("teleo"));
        assert_eq!(u.env("HOME"), Some("/var/lib/agent-state"));
        assert_eq!(u.env("NOTE"), Some("two words"));
        assert_eq!(u.env("ANTHROPIC_API_KEY"), Some("sk-x"));
        assert_eq!(
            u.environment_files,
            [
                PathBuf::from("/etc/agent-state/environment"),
                PathBuf::from("/etc/agent-state/more")
            ]
        );
        assert_eq!(
            (u.protect_system.as_str(), u.protect_home.as_str()),
            ("strict", "yes")
        );
        assert!(u.private_tmp);
        assert_eq!(u.state_directories, [PathBuf::from("/var/lib/agent-state")]);
        assert_eq!(
            u.read_write,
            [
                PathBuf::from("/opt/teleo-eval"),
                PathBuf::from("/srv/extra")
            ],
            "the optional path's `-` is dropped"
        );
        assert!(u.inaccessible.is_empty());
        assert_eq!(
            u.summary(),
            "User=svc Group=teleo ProtectSystem=strict ProtectHome=yes; \
             writable: /opt/teleo-eval, /srv/extra, /var/lib/agent-state, /tmp, /var/tmp"
        );
    }

    #[test]
    fn the_shipped_unit_file_reads_as_its_defaults() {
        let u = Unit::parse(SHIPPED, Source::Shipped("systemd is not running".into()));
        assert_eq!(u.user, "agent-state");
        assert_eq!(u.group.as_deref(), Some("teleo"));
        assert_eq!(u.env("HOME"), Some("/var/lib/agent-state"));
        assert_eq!(
            u.environment_files,
            [PathBuf::from("/etc/agent-state/environment")]
        );
        assert_eq!(
            u.writable(),
            [
                Path::new("/opt/teleo-eval"),
                Path::new("/var/lib/agent-state"),
                Path::new("/tmp"),
                Path::new("/var/tmp")
            ]
        );
        assert_eq!(u.protect_home, "yes");
    }

    #[test]
    fn no_user_is_root_and_an_empty_assignment_clears_a_list() {
        let u = Unit::parse(
            "LoadState=loaded\nUser=\nReadWritePaths=/a\nReadWritePaths=\nReadWritePaths=/b\nProtectHome=false\n",
            Source::Systemd,
        );
        assert_eq!(u.user, "root");
        assert_eq!(u.group, None);
        assert_eq!(u.read_write, [PathBuf::from("/b")]);
        assert_eq!(u.protect_home, "no");
        assert!(!u.private_tmp);
    }

    #[test]
    fn a_path_is_judged_by_the_deepest_setting_and_hidden_hides_all_below() {
        let u = show();
        let check = |path: &str, access: Access, setting: &str| {
            assert_eq!(
                u.access(Path::new(path)),
                (access, setting.to_string()),
                "{path}"
            );
        };
        check(
            "/opt/teleo-eval/agent-state",
            Access::Writable,
            "ReadWritePaths=/opt/teleo-eval",
        );
        check(
            "/srv/extra/repo",
            Access::Writable,
            "ReadWritePaths=/srv/extra",
        );
        check("/srv/other", Access::ReadOnly, "ProtectSystem=strict");
        check(
            "/opt/teleo-eval/frozen/x",
            Access::ReadOnly,
            "ReadOnlyPaths=/opt/teleo-eval/frozen",
        );
        check(
            "/var/lib/agent-state/.claude",
            Access::Writable,
            "StateDirectory=agent-state",
        );
        check("/tmp/x", Access::Writable, "PrivateTmp=yes");
        check("/home/rio/agent.sh", Access::Hidden, "ProtectHome=yes");
        // ReadWritePaths= under a hidden directory cannot open it.
        let mut opened = u.clone();
        opened.read_write.push(PathBuf::from("/home/rio"));
        assert_eq!(
            opened.access(Path::new("/home/rio/repo")),
            (Access::Hidden, "ProtectHome=yes".into())
        );
        // ProtectHome=read-only: readable, and a deeper ReadWritePaths= opens it.
        opened.protect_home = "read-only".into();
        assert_eq!(
            opened.access(Path::new("/home/rio/repo")).0,
            Access::Writable
        );
        assert_eq!(opened.access(Path::new("/home/leo")).0, Access::ReadOnly);
        // ProtectSystem=full leaves /srv writable; no sandbox at all, all of it.
        let mut full = show();
        full.protect_system = "full".into();
        assert_eq!(full.access(Path::new("/srv/other")).0, Access::Writable);
        assert_eq!(
            full.access(Path::new("/etc/agent-state")).0,
            Access::ReadOnly
        );
        let none = Unit::parse("LoadState=loaded\n", Source::Systemd);
        assert_eq!(
            none.access(Path::new("/srv/other")),
            (Access::Writable, "no sandbox setting".into())
        );
    }

    #[test]
    fn words_split_on_blanks_and_keep_quoted_ones_whole() {
        assert_eq!(words("a  \"b c\" d\\ e"), ["a", "b c", "d e"]);
        assert!(words("  ").is_empty());
    }
}
