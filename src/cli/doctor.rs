//! `agent-state doctor [--user U]`: everything a first session needs,
//! checked as the operator would, each failure with its fix: the service
//! user and the inbox group, the state root's owner and modes, every
//! agent's command (there, executable by the service user, not hidden by the
//! unit's sandbox), Claude Code's login for the service user, git identity
//! and the remote of each workspace repository, the paths the service must
//! write being writable under the unit, the time zone database when a zone
//! is named, free disk, with `[cluster]` the NATS servers (reachable,
//! JetStream, per-key TTL, the dispatch stream and the lease bucket), and a
//! running daemon with a fresh heartbeat. Read-only; exit 1 if anything fails.
//!
//! The unit's user, environment and sandbox are the ones systemd runs
//! (`systemctl show`, drop-ins included), or the shipped unit's when
//! systemd is not there to ask ([`unit`]).

mod cluster;
mod script;
mod unit;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::unistd::{Group, User};

use crate::cli::Context;
use crate::cli::display::{Line, Style, say};
use crate::config::{AgentConfig, AgentKind};
use crate::error::Result;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The service user [default: the unit's User=, else agent-state]
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// A heartbeat older than this means the daemon is stuck
    #[arg(long, value_name = "DUR", value_parser = crate::clock::parse_duration, default_value = "15m")]
    pub max_age: Duration,
}

#[derive(Default)]
struct Report {
    failed: usize,
    warned: usize,
}

impl Report {
    /// `WORD  what: detail` (the word coloured), and the fix below it.
    fn say(word: &str, what: &str, detail: &str, fix: Option<&str>) {
        Line::new()
            .cell(Style::of(word), word, 6)
            .text(format!("{what}: {detail}"))
            .print();
        if let Some(fix) = fix {
            say!("      fix: {fix}");
        }
    }
    fn ok(&mut self, what: &str, detail: impl AsRef<str>) {
        Report::say("ok", what, detail.as_ref(), None);
    }
    /// Not a finding: what the checks are based on.
    fn note(&mut self, what: &str, detail: impl AsRef<str>) {
        Report::say("note", what, detail.as_ref(), None);
    }
    fn fail(&mut self, what: &str, problem: impl AsRef<str>, fix: impl AsRef<str>) {
        self.failed += 1;
        Report::say("FAIL", what, problem.as_ref(), Some(fix.as_ref()));
    }
    fn warn(&mut self, what: &str, problem: impl AsRef<str>, fix: impl AsRef<str>) {
        self.warned += 1;
        Report::say("warn", what, problem.as_ref(), Some(fix.as_ref()));
    }
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let mut r = Report::default();
    let config = &ctx.config;
    r.ok(
        "config",
        format!(
            "{} ({} agents, {} flows)",
            config.source.display(),
            config.agents.len(),
            config.flows.len()
        ),
    );

    // The unit: what the checks below take its user, environment and
    // sandbox from.
    let unit = match unit::load() {
        unit::Found::Unit(u) => {
            match &u.source {
                unit::Source::Systemd => r.ok(
                    "unit",
                    format!(
                        "{} as systemd runs it (systemctl show, drop-ins included): {}",
                        unit::NAME,
                        u.summary()
                    ),
                ),
                unit::Source::Shipped(why) => r.note(
                    "unit",
                    format!(
                        "{why}: the shipped unit's settings are assumed (drop-ins not read): {}",
                        u.summary()
                    ),
                ),
            }
            Some(*u)
        }
        unit::Found::NotInstalled(why) => {
            r.note("unit", format!("{why}: the sandbox is not checked"));
            None
        }
    };

    // The service user and the inbox group.
    let user_name = args
        .user
        .clone()
        .or_else(|| unit.as_ref().map(|u| u.user.clone()))
        .unwrap_or_else(|| "agent-state".to_string());
    let user = User::from_name(&user_name).ok().flatten();
    match &user {
        Some(u) => r.ok("service user", format!("{} (uid {}, home {})", u.name, u.uid, u.dir.display())),
        None => r.fail(
            "service user",
            format!("there is no user {user_name:?}"),
            "create it: systemd-sysusers agent-state.conf (the package does), or bootstrap/bootstrap.sh; --user names another",
        ),
    }
    // Where the service's tools look for their credentials: the unit's
    // HOME= (when the user checked is the unit's), else the user's home.
    let home: Option<PathBuf> = unit
        .as_ref()
        .filter(|u| u.user == user_name)
        .and_then(|u| u.env("HOME"))
        .map(PathBuf::from)
        .or_else(|| user.as_ref().map(|u| u.dir.clone()));
    let group = config
        .group
        .as_deref()
        .and_then(|g| Group::from_name(g).ok().flatten());
    match (&config.group, &group) {
        (None, _) => r.warn(
            "inbox group",
            "the config names no `group`: only the service user can deliver mail",
            "set group = \"teleo\" and add the senders to it",
        ),
        (Some(g), None) => r.fail(
            "inbox group",
            format!("there is no group {g:?}"),
            format!("groupadd --system {g} (systemd-sysusers agent-state.conf creates teleo)"),
        ),
        (Some(g), Some(grp)) => {
            // The unit's Group= is the service's group whatever
            // /etc/group says.
            let in_group = unit
                .as_ref()
                .is_some_and(|u| u.group.as_deref() == Some(g.as_str()))
                || user
                    .as_ref()
                    .is_some_and(|u| u.gid == grp.gid || grp.mem.contains(&u.name));
            if user.is_some() && !in_group {
                r.fail(
                    "inbox group",
                    format!(
                        "{} is not in group {g}: it cannot read what senders deliver",
                        user_name
                    ),
                    format!("usermod -aG {g} {user_name}"),
                );
            } else {
                r.ok("inbox group", format!("{g} (gid {})", grp.gid))
            }
        }
    }

    check_approvers(&mut r, config, group.as_ref());

    // The state root: there, the service user's, the modes of the model.
    let root = &ctx.root.path;
    match std::fs::symlink_metadata(root) {
        Err(_) => r.fail(
            "state root",
            format!("{} does not exist", root.display()),
            "systemd-tmpfiles --create agent-state.conf, or agent-state bootstrap (as the service user)",
        ),
        Ok(m) => {
            let owner_ok = user.as_ref().is_none_or(|u| u.uid.as_raw() == m.uid());
            if !owner_ok {
                r.fail(
                    "state root",
                    format!("{} is owned by uid {}, not {user_name}", root.display(), m.uid()),
                    format!("chown -R {user_name}: {}", root.display()),
                );
            } else {
                r.ok("state root", format!("{} (mode {:o})", root.display(), m.permissions().mode() & 0o7777));
            }
            for agent in &config.agents {
                let inbox = ctx.root.agent(&agent.name).inbox();
                match std::fs::symlink_metadata(&inbox) {
                    Err(_) => r.warn(
                        &format!("{} inbox", agent.name),
                        format!("{} does not exist yet", inbox.display()),
                        "the daemon creates it at its start (or agent-state bootstrap)",
                    ),
                    Ok(m) if m.permissions().mode() & 0o7777 != 0o3770 => r.fail(
                        &format!("{} inbox", agent.name),
                        format!("{} has mode {:o}, not 3770 (group-writable, setgid, sticky)", inbox.display(), m.permissions().mode() & 0o7777),
                        "agent-state check --repair (as the service user or root)",
                    ),
                    Ok(m) if group.as_ref().is_some_and(|g| g.gid.as_raw() != m.gid()) => r.fail(
                        &format!("{} inbox", agent.name),
                        format!("{} belongs to gid {}, not the inbox group", inbox.display(), m.gid()),
                        format!("chgrp -R {} {}", config.group.as_deref().unwrap_or("teleo"), inbox.display()),
                    ),
                    Ok(_) => {}
                }
            }
        }
    }

    // Every agent's command.
    for agent in config.agents.iter().filter(|a| a.kind == AgentKind::Agent) {
        let dir = config.source.parent().unwrap_or(Path::new("/"));
        check_command(&mut r, agent, dir, user.as_ref(), unit.as_ref());
    }

    // What the shipped session script needs: its `claude`, its work tree.
    script::check(
        &mut r,
        &config.agents,
        config.source.parent().unwrap_or(Path::new("/")),
        user.as_ref(),
        unit.as_ref(),
    );

    // Claude Code's login, when a command runs it.
    let runs_claude = config.agents.iter().any(|a| {
        a.kind == AgentKind::Agent
            && a.session
                .command
                .iter()
                .any(|w| w.contains("claude") || w.contains("research-session"))
    });
    if runs_claude {
        let home = home.clone().unwrap_or_default();
        let credentials = home.join(".claude/.credentials.json");
        if let Some(key) = api_key(unit.as_ref()) {
            r.ok("Claude Code login", format!("ANTHROPIC_API_KEY in {key}"));
        } else if credentials.is_file() {
            r.ok("Claude Code login", credentials.display().to_string());
        } else {
            r.fail(
                "Claude Code login",
                format!("{user_name} has no Claude Code credentials ({} is missing) and no API key is set", credentials.display()),
                format!("sudo -u {user_name} HOME={} claude   (log in once), or ANTHROPIC_API_KEY=… in /etc/agent-state/environment", home.display()),
            );
        }
    }

    // Workspace repositories: a repository, a git identity, the remote.
    let mut repos: Vec<&Path> = Vec::new();
    for a in &config.agents {
        if let Some(w) = &a.session.workspace
            && !repos.contains(&w.repo.as_path())
        {
            repos.push(&w.repo);
        }
    }
    for repo in &repos {
        check_repo(&mut r, repo, &user_name, home.as_deref());
    }

    // What the service writes: the state root, the repositories (their
    // .git), the worktree roots set apart from the state root.
    if let Some(unit) = &unit {
        let mut written: Vec<(String, &Path)> = vec![("the state root".into(), root.as_path())];
        written.extend(repos.iter().map(|p| ("the repository".to_string(), *p)));
        for a in &config.agents {
            if let Some(w) = &a.session.workspace
                && let Some(dir) = &w.root
                && !written.iter().any(|(_, p)| *p == dir.as_path())
            {
                written.push((format!("{}'s worktree root", a.name), dir));
            }
        }
        // The node_exporter textfile's directory (written by rename).
        let textfile_dir = config.metrics.textfile.as_deref().and_then(Path::parent);
        if let Some(dir) = textfile_dir {
            written.push(("the metrics textfile's directory".into(), dir));
        }
        for (what, path) in written {
            check_writable(&mut r, unit, &what, path);
        }
    }

    check_zones(&mut r, config, unit.as_ref());

    // Free disk.
    match crate::daemon::health::probe(root) {
        Ok(p) if p.read_only => r.fail("disk", format!("{} is on a read-only file system", root.display()), "remount it read-write"),
        Ok(p) if p.free < config.health.disk_pause => r.fail(
            "disk",
            format!("{} free; waking pauses below {}", human(p.free), human(config.health.disk_pause)),
            "free some space (old sessions/ logs, processed/ messages: agent-state check --repair prunes by retention)",
        ),
        Ok(p) if p.free < config.health.disk_warn => r.warn("disk", format!("{} free, below disk_warn ({})", human(p.free), human(config.health.disk_warn)), "free some space"),
        Ok(p) => r.ok("disk", format!("{} free of {}", human(p.free), human(p.total))),
        Err(_) => {}
    }

    // `[cluster]`: the NATS servers, JetStream, the stream and the bucket.
    if let Some(settings) = &config.cluster {
        cluster::check(&mut r, settings, &config.source);
    }

    // The daemon.
    let running = crate::daemon::files::daemon_running(&ctx.root);
    let heartbeat = crate::daemon::files::read_heartbeat(&ctx.root)
        .ok()
        .flatten();
    match (running, heartbeat) {
        (false, _) => r.fail(
            "daemon",
            format!("no daemon runs on {}", root.display()),
            "systemctl start agent-state (journalctl -u agent-state says why it stopped)",
        ),
        (true, Some(h)) => {
            let age = ctx.now.seconds_since(&h.updated_at).max(0) as u64;
            if age > args.max_age.as_secs() {
                r.fail(
                    "daemon",
                    format!(
                        "its heartbeat is {age}s old (pid {}): the loop may be stuck",
                        h.pid
                    ),
                    "systemctl restart agent-state; journalctl -u agent-state",
                );
            } else {
                r.ok(
                    "daemon",
                    format!("pid {}, version {}, heartbeat {age}s ago", h.pid, h.version),
                );
            }
        }
        (true, None) => r.warn(
            "daemon",
            "it runs but has written no heartbeat yet (starting?)",
            "wait, then run doctor again",
        ),
    }

    say!("\n{} failed, {} warning(s)", r.failed, r.warned);
    Ok(if r.failed > 0 { 1 } else { 0 })
}

/// The time zones the config names (UTC aside), found in the database the
/// service reads (the unit's `TZDIR=`, else /usr/share/zoneinfo) and not
/// hidden by its sandbox. Only a config that names a zone needs one.
fn check_zones(r: &mut Report, config: &crate::config::Config, unit: Option<&unit::Unit>) {
    let zones: Vec<&str> = config
        .agents
        .iter()
        .map(|a| a.timezone.name())
        .chain([config.budget.timezone.name()])
        .collect();
    // The service's database: the unit's TZDIR=, else the default; with no
    // unit to ask, this process's (its own TZDIR, else the default).
    let dir = match unit {
        Some(u) => u
            .env("TZDIR")
            .filter(|d| Path::new(d).is_absolute())
            .map_or_else(|| PathBuf::from(crate::zone::DEFAULT_DIR), PathBuf::from),
        None => crate::zone::database_dir(),
    };
    let hidden = unit.and_then(|u| match u.access(&dir) {
        (unit::Access::Hidden, setting) => Some(setting),
        _ => None,
    });
    match zones_finding(&zones, &dir, hidden.as_deref()) {
        Ok(detail) => r.ok("time zones", detail),
        Err((problem, fix)) => r.fail("time zones", problem, fix),
    }
}

/// The "time zones" line: what is fine, or the problem and its fix.
fn zones_finding(
    zones: &[&str],
    dir: &Path,
    hidden_by: Option<&str>,
) -> std::result::Result<String, (String, &'static str)> {
    let mut zones: Vec<&str> = zones.iter().copied().filter(|z| *z != "UTC").collect();
    zones.sort_unstable();
    zones.dedup();
    if zones.is_empty() {
        return Ok("none but UTC: the time zone database is not read".into());
    }
    let named = zones.join(", ");
    if let Some(setting) = hidden_by {
        return Err((
            format!(
                "the config names {named}, but {} is hidden from the service ({setting})",
                dir.display()
            ),
            "take it out of that setting in the unit's drop-in (systemctl edit agent-state)",
        ));
    }
    if !crate::zone::database_present(dir) {
        return Err((
            format!(
                "the config names {named}, but there is no time zone database at {}",
                dir.display()
            ),
            "apt-get install tzdata",
        ));
    }
    let missing: Vec<&str> = zones
        .iter()
        .copied()
        .filter(|z| crate::zone::load_from(dir, z).is_err())
        .collect();
    if !missing.is_empty() {
        return Err((
            format!(
                "{} not in the time zone database at {}",
                missing.join(", "),
                dir.display()
            ),
            "upgrade tzdata, or use the zone's current name (on Debian 13 a legacy name such as US/Eastern needs tzdata-legacy)",
        ));
    }
    Ok(format!("{named} (from {})", dir.display()))
}

fn human(bytes: u64) -> String {
    crate::cli::health::bytes(bytes)
}

/// Fail unless the unit lets the service write `path`.
fn check_writable(r: &mut Report, unit: &unit::Unit, what: &str, path: &Path) {
    let (access, setting) = unit.access(path);
    if access != unit::Access::Writable {
        let how = match access {
            unit::Access::Hidden => "hidden from the service",
            _ => "read-only for the service",
        };
        r.fail(
            "unit sandbox",
            format!("{what} {} is {how} ({setting})", path.display()),
            format!(
                "let the service write it with a drop-in: systemctl edit {} → [Service] ReadWritePaths={} (packaging/README.md)",
                unit::NAME,
                path.display()
            ),
        );
    }
}

/// Where the service gets ANTHROPIC_API_KEY, if it does: the unit's
/// Environment= or one of its environment files (without a unit,
/// /etc/agent-state/environment, the shipped unit's).
fn api_key(unit: Option<&unit::Unit>) -> Option<String> {
    if unit.is_some_and(|u| u.env("ANTHROPIC_API_KEY").is_some_and(|k| !k.is_empty())) {
        return Some(format!("the unit's Environment= ({})", unit::NAME));
    }
    let files = match unit {
        Some(u) => u.environment_files.clone(),
        None => vec![PathBuf::from("/etc/agent-state/environment")],
    };
    files
        .into_iter()
        .find(|f| {
            std::fs::read_to_string(f).is_ok_and(|t| {
                t.lines()
                    .any(|l| l.trim_start().starts_with("ANTHROPIC_API_KEY="))
            })
        })
        .map(|f| f.display().to_string())
}

/// The program of a command: absolute, relative to the config, or on the PATH
/// the unit gives (`/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`).
fn resolve(program: &str, config_dir: &Path) -> Option<PathBuf> {
    if program.contains('/') {
        // Relative to the config file's directory, as the daemon runs it.
        return Some(config_dir.join(program));
    }
    [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
    .iter()
    .map(|d| Path::new(d).join(program))
    .find(|p| p.is_file())
}

/// Whether `user` may execute `path` by its mode bits (as the kernel would
/// judge the file itself; root's own any-x rule included).
fn executable_by(path: &Path, user: Option<&User>) -> bool {
    let Ok(m) = std::fs::metadata(path) else {
        return false;
    };
    let mode = m.permissions().mode();
    let Some(u) = user else {
        return mode & 0o111 != 0;
    };
    if u.uid.is_root() {
        return mode & 0o111 != 0;
    }
    if m.uid() == u.uid.as_raw() {
        return mode & 0o100 != 0;
    }
    let groups = nix::unistd::getgrouplist(
        &std::ffi::CString::new(u.name.clone()).unwrap_or_default(),
        u.gid,
    )
    .unwrap_or_default();
    if groups.iter().any(|g| g.as_raw() == m.gid()) {
        return mode & 0o010 != 0;
    }
    mode & 0o001 != 0
}

fn check_command(
    r: &mut Report,
    agent: &AgentConfig,
    config_dir: &Path,
    user: Option<&User>,
    unit: Option<&unit::Unit>,
) {
    let what = format!("{} command", agent.name);
    // `/usr/bin/env NAME=VALUE… PROGRAM`: the program is what must be there.
    let Some(program) = script::program(agent) else {
        return;
    };
    let Some(path) = resolve(program, config_dir) else {
        r.fail(
            &what,
            format!("`{program}` is not on the unit's PATH"),
            "give its absolute path in `command`",
        );
        return;
    };
    if !path.is_file() {
        r.fail(
            &what,
            format!("{} does not exist", path.display()),
            "install it, or fix `command` in the config",
        );
        return;
    }
    if let Some(unit) = unit
        && let (unit::Access::Hidden, setting) = unit.access(&path)
    {
        r.fail(
            &what,
            format!(
                "{} is under a directory the unit hides ({setting})",
                path.display()
            ),
            "move it, e.g. to /opt/teleo-eval/ or /usr/local/bin/",
        );
        return;
    }
    if !executable_by(&path, user) {
        r.fail(
            &what,
            format!(
                "{} is not executable by {}",
                path.display(),
                user.map(|u| u.name.as_str()).unwrap_or("the service user")
            ),
            format!("chmod 755 {}", path.display()),
        );
        return;
    }
    r.ok(&what, normalised(&path).display().to_string());
}

/// Each flow's approvers: users of this machine, in the inbox group (their
/// answer is a reply left in an inbox).
fn check_approvers(r: &mut Report, config: &crate::config::Config, group: Option<&Group>) {
    for flow in &config.flows {
        let what = format!("flow {} approvers", flow.name);
        if flow.approvers.is_empty() {
            r.note(
                &what,
                "none: only root and the service user answer its cycles (flow approve|reject|stop); a reply is never carried out",
            );
            continue;
        }
        for name in &flow.approvers {
            match User::from_name(name).ok().flatten() {
                None => r.fail(
                    &what,
                    format!("there is no user {name:?}"),
                    format!(
                        "create it (useradd {name}) or correct `approvers` in the flow's [[flow]]"
                    ),
                ),
                Some(u) => match group {
                    Some(g) if u.gid != g.gid && !g.mem.contains(&u.name) => r.fail(
                        &what,
                        format!(
                            "{name} is not in group {}: it cannot leave its answer in an inbox",
                            g.name
                        ),
                        format!("usermod -aG {} {name}", g.name),
                    ),
                    _ => r.ok(&what, format!("{name} (uid {})", u.uid)),
                },
            }
        }
    }
}

/// `a/b/../c` as `a/c` (lexically: for showing a path, not resolving links).
fn normalised(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// `git ARGS` in `repo` with the service's HOME (its git identity), if known,
/// through the hardened runner ([`crate::git`]): doctor may run as root, and
/// nothing the repository's config names (hooks, `core.sshCommand`, credential
/// helpers, `remote.origin.uploadpack`, ...) is run.
fn git(repo: &Path, home: Option<&Path>, args: &[&str]) -> Option<(bool, String)> {
    git_run(repo, home, args).ok()
}

fn git_run(
    repo: &Path,
    home: Option<&Path>,
    args: &[&str],
) -> Result<(bool, String), crate::git::RunError> {
    let env: Vec<(&str, &Path)> = home.map(|h| ("HOME", h)).into_iter().collect();
    let out = crate::git::run(repo, args, &env)?;
    Ok((
        out.ok,
        out.stdout_text().trim().to_string() + out.stderr_text().trim(),
    ))
}

fn check_repo(r: &mut Report, repo: &Path, user: &str, home: Option<&Path>) {
    let what = format!("repository {}", repo.display());
    match git_run(repo, home, &["rev-parse", "--git-dir"]) {
        Err(crate::git::RunError::Spawn(_)) => {
            r.fail(&what, "git is not installed", "apt install git");
            return;
        }
        Err(e) => {
            r.fail(&what, e.to_string(), "install git 2.31 or later");
            return;
        }
        Ok((false, why)) => {
            r.fail(
                &what,
                format!("not a git repository: {why}"),
                format!(
                    "sudo -u {user} git init {} (or clone the repository there, or fix `workspace.repo`)",
                    repo.display()
                ),
            );
            return;
        }
        Ok((true, _)) => {}
    }
    let name = git(repo, home, &["config", "user.name"])
        .filter(|(ok, _)| *ok)
        .map(|(_, v)| v);
    let email = git(repo, home, &["config", "user.email"])
        .filter(|(ok, _)| *ok)
        .map(|(_, v)| v);
    let shown_home = home
        .map(|h| h.display().to_string())
        .unwrap_or_else(|| "~".into());
    // Who ran the checks: doctor as itself, with the service user's HOME
    // (so its ~/.gitconfig, its identity).
    let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| nix::unistd::geteuid().to_string());
    let as_whom = format!("checked as {me} with HOME={shown_home}");
    match (name, email) {
        (Some(n), Some(e)) => r.ok(&what, format!("git identity {n} <{e}> ({as_whom})")),
        _ => r.fail(
            &what,
            "the service user has no git identity: its sessions cannot commit",
            format!("sudo -u {user} HOME={shown_home} git config --global user.name \"…\" && sudo -u {user} HOME={shown_home} git config --global user.email …"),
        ),
    }
    match git(repo, home, &["remote", "get-url", "origin"]) {
        Some((true, url)) => match git(
            repo,
            home,
            &["ls-remote", "--upload-pack=git-upload-pack", "--heads", "origin"],
        ) {
            Some((true, _)) => r.ok(&what, format!("remote origin {url} reachable")),
            _ => r.fail(
                &what,
                format!("remote origin {url} cannot be read ({as_whom})"),
                "check the service user's ssh key (~/.ssh) and the network; doctor runs git without credential helpers, so an https remote that needs one is checked by hand: sudo -u agent-state git -C REPO ls-remote origin",
            ),
        },
        _ => r.warn(
            &what,
            "no remote `origin`: sessions commit but cannot push",
            "git remote add origin URL",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_zone_line_needs_a_database_only_when_a_zone_is_named() {
        let system = Path::new(crate::zone::DEFAULT_DIR);
        let none = Path::new("/nonexistent/zoneinfo");
        let ok = |zones: &[&str], dir: &Path, hidden: Option<&str>| {
            zones_finding(zones, dir, hidden).map_err(|(p, _)| p)
        };
        // (zones, database, hidden by) -> the line
        assert_eq!(
            ok(&["UTC", "UTC"], none, Some("InaccessiblePaths=/usr/share")),
            Ok("none but UTC: the time zone database is not read".into())
        );
        assert_eq!(
            ok(&["UTC", "Europe/Berlin", "Europe/Berlin"], system, None),
            Ok("Europe/Berlin (from /usr/share/zoneinfo)".into())
        );
        assert_eq!(
            ok(&["Europe/Berlin", "UTC"], none, None),
            Err("the config names Europe/Berlin, but there is no time zone database at /nonexistent/zoneinfo".into())
        );
        assert_eq!(
            ok(&["Europe/Berlin"], system, Some("InaccessiblePaths=/usr/share")),
            Err("the config names Europe/Berlin, but /usr/share/zoneinfo is hidden from the service (InaccessiblePaths=/usr/share)".into())
        );
        let empty = tempfile::tempdir().unwrap();
        std::fs::copy(system.join("UTC"), empty.path().join("UTC")).unwrap();
        assert_eq!(
            ok(&["Europe/Berlin", "Asia/Tokyo"], empty.path(), None),
            Err(format!(
                "Asia/Tokyo, Europe/Berlin not in the time zone database at {}",
                empty.path().display()
            ))
        );
        let (_, fix) = zones_finding(&["Europe/Berlin"], none, None).unwrap_err();
        assert_eq!(fix, "apt-get install tzdata");
    }
}
