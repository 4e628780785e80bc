//! `agent-state migrate-crontab [FILE|-] [--apply] [--user U]`: the
//! cron-era crontab's `research-session.sh AGENT` lines as `[[agent]]`
//! entries (schedule, time zone, command), and the lines to remove. With
//! `--apply`, the entries go into the config (refused if the result is not a
//! valid config) and the lines are commented out in the crontab, each file
//! first kept as `NAME.bak-STAMP`. Without FILE, the user's own crontab
//! (`crontab -l`, installed back with `crontab`).
//!
//! A file given as a symbolic link is written through: its target is
//! edited and the link stays. What is not a regular file (a FIFO would
//! block the read), a file with other hard links (replacing it would leave
//! them with the old text) and more than 16 MiB are refused, naming the
//! file; backups are created new, never through a link.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::cli::warn;
use crate::clock::Timestamp;
use crate::config::Config;
use crate::config::crontab::{self, Entry};
use crate::error::{Error, Result, exit};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The crontab: a file, `-` for standard input; default: `crontab -l`
    pub file: Option<PathBuf>,
    /// Write the entries into the config and comment the lines out in the
    /// crontab (both backed up first)
    #[arg(long)]
    pub apply: bool,
    /// Whose crontab, without FILE (`crontab -u USER`; root only)
    #[arg(long)]
    pub user: Option<String>,
}

/// The machine's time zone, as cron uses it for lines with no `CRON_TZ`.
fn system_zone() -> String {
    if let Ok(tz) = std::env::var("TZ")
        && tz.parse::<crate::zone::Zone>().is_ok()
    {
        return tz;
    }
    if let Ok(text) = std::fs::read_to_string("/etc/timezone") {
        let tz = text.trim();
        if tz.parse::<crate::zone::Zone>().is_ok() {
            return tz.to_string();
        }
    }
    if let Ok(target) = std::fs::read_link("/etc/localtime") {
        let s = target.display().to_string();
        if let Some((_, zone)) = s.split_once("zoneinfo/")
            && zone.parse::<crate::zone::Zone>().is_ok()
        {
            return zone.to_string();
        }
    }
    "UTC".to_string()
}

fn crontab_command(user: Option<&str>) -> Command {
    let mut cmd = Command::new("crontab");
    if let Some(u) = user {
        cmd.args(["-u", u]);
    }
    cmd
}

fn read_input(args: &Args) -> Result<String> {
    match args.file.as_deref() {
        Some(p) if p == Path::new("-") => {
            let mut text = String::new();
            std::io::stdin()
                .take(16 << 20)
                .read_to_string(&mut text)
                .map_err(|e| Error::io("reading", Path::new("standard input"), e))?;
            Ok(text)
        }
        Some(p) => Ok(read_regular(p)?.text),
        None => {
            let out = crontab_command(args.user.as_deref())
                .arg("-l")
                .stdin(Stdio::null())
                .output()
                .map_err(|e| {
                    Error::Unavailable(format!(
                        "cannot run `crontab -l`: {e}; give the crontab as a FILE"
                    ))
                })?;
            if !out.status.success() {
                return Err(Error::Unavailable(format!(
                    "`crontab -l` failed: {}; give the crontab as a FILE",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        }
    }
}

/// The most read from a crontab or a config.
const MAX_TEXT: u64 = 16 << 20;

/// A file read to be edited: the path given, the file it really is (the
/// target of a link), its text and what it was (mode, owner, links).
struct Loaded {
    given: PathBuf,
    real: PathBuf,
    text: String,
    meta: std::fs::Metadata,
}

impl Loaded {
    /// How to name the file in what is printed: `REAL`, or `REAL (the
    /// target of the link GIVEN)`.
    fn shown(&self) -> String {
        if self.real == self.given {
            self.real.display().to_string()
        } else {
            format!(
                "{} (the target of the link {})",
                self.real.display(),
                self.given.display()
            )
        }
    }
}

/// Read `path` (through a link) if it is a regular file of at most
/// [`MAX_TEXT`] bytes; opened without waiting, so a FIFO is refused rather
/// than waited on.
fn read_regular(path: &Path) -> Result<Loaded> {
    let is_link = std::fs::symlink_metadata(path)
        .map_err(|e| Error::io("inspecting", path, e))?
        .file_type()
        .is_symlink();
    let real = if is_link {
        std::fs::canonicalize(path).map_err(|e| Error::io("following the link", path, e))?
    } else {
        path.to_path_buf()
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(&real)
        .map_err(|e| Error::io("opening", &real, e))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io("inspecting", &real, e))?;
    if !meta.is_file() {
        return Err(Error::Data(format!(
            "{} is not a regular file (a FIFO, a device or a directory): give the crontab or config as a regular file",
            real.display()
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_TEXT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("reading", &real, e))?;
    if bytes.len() as u64 > MAX_TEXT {
        return Err(Error::Data(format!(
            "{} is larger than {} MiB: not a crontab or a config",
            real.display(),
            MAX_TEXT >> 20
        )));
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        Error::Data(format!(
            "{} is not UTF-8 text: convert it (e.g. `iconv -t UTF-8`) first",
            real.display()
        ))
    })?;
    Ok(Loaded {
        given: path.to_path_buf(),
        real,
        text,
        meta,
    })
}

/// Refuse to replace a file that has other hard links: they would keep the
/// old text while this name gets the new one.
fn refuse_hard_links(file: &Loaded) -> Result<()> {
    if file.meta.nlink() > 1 {
        return Err(Error::Data(format!(
            "{} has {} hard links: replacing it would leave the others with the old text; make it a single file (or a symbolic link) first. Nothing was changed",
            file.real.display(),
            file.meta.nlink()
        )));
    }
    Ok(())
}

pub fn run(config_path: &Path, args: &Args) -> Result<u8> {
    let text = read_input(args)?;
    let m = crontab::parse(&text, &system_zone());
    for n in &m.notes {
        warn(n);
    }
    for p in &m.problems {
        eprintln!("agent-state: crontab {p}");
    }
    if m.entries.is_empty() {
        if m.problems.is_empty() {
            println!("# no `{}` lines to migrate", crontab::SCRIPT);
            return Ok(exit::OK);
        }
        return Err(Error::Data(format!(
            "{} line(s) could not be migrated (above); nothing was changed",
            m.problems.len()
        )));
    }
    if !args.apply {
        println!(
            "# [[agent]] entries for {}, from the crontab:",
            config_path.display()
        );
        print!("{}", crontab::to_toml(&m.entries));
        println!("\n# crontab lines to remove (the daemon runs them now):");
        for e in &m.entries {
            let line = text.lines().nth(e.line - 1).unwrap_or("");
            println!("#   {}: {line}", e.line);
        }
        println!("# `agent-state migrate-crontab --apply` writes both (with backups).");
        return Ok(if m.problems.is_empty() {
            exit::OK
        } else {
            exit::DATAERR
        });
    }
    if !m.problems.is_empty() {
        return Err(Error::Data(format!(
            "{} line(s) could not be migrated (above); fix them or migrate them by hand first: nothing was changed",
            m.problems.len()
        )));
    }
    apply(config_path, args, &text, &m.entries)
}

fn apply(config_path: &Path, args: &Args, text: &str, entries: &[Entry]) -> Result<u8> {
    if args.file.as_deref() == Some(Path::new("-")) {
        return Err(Error::Usage(
            "--apply needs the crontab as a FILE (or none, for `crontab -l`): a crontab on standard input cannot be rewritten".into(),
        ));
    }
    let config_file = read_regular(config_path)?;
    let config_text = config_file.text.as_str();
    let config = Config::parse(config_text, config_path)?;
    let crontab_file = match args.file.as_deref() {
        Some(file) => {
            let read = read_regular(file)?;
            if read.text != text {
                return Err(Error::Data(format!(
                    "{} changed while it was read: run again. Nothing was changed",
                    read.shown()
                )));
            }
            refuse_hard_links(&read)?;
            Some(read)
        }
        None => None,
    };
    let (new, known): (Vec<Entry>, Vec<Entry>) = entries
        .iter()
        .cloned()
        .partition(|e| !config.agents.iter().any(|a| a.name.as_str() == e.agent));
    if !new.is_empty() {
        // Checked before anything is written.
        refuse_hard_links(&config_file)?;
    }
    for e in &known {
        warn(format!(
            "{} is configured already in {}: its entry is left as it is (check its schedule: crontab line {} says `{}` in {})",
            e.agent,
            config_path.display(),
            e.line,
            e.schedule,
            e.timezone
        ));
    }
    let stamp = Timestamp::now().compact();
    if !new.is_empty() {
        let updated = format!("{}\n{}", config_text.trim_end(), crontab::to_toml(&new));
        // Refused before anything is written if the result is not valid.
        Config::parse(&updated, config_path)?;
        let backup = backup(&config_file, &stamp, None)?;
        replace(&config_file.real, &updated)?;
        println!(
            "{}: {} agent(s) added ({}); the old file is {}",
            config_file.shown(),
            new.len(),
            new.iter()
                .map(|e| e.agent.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            backup.display()
        );
    }
    let edited = crontab::comment_out(text, entries, &Timestamp::now().date());
    match crontab_file {
        Some(file) => {
            // A crontab may carry secrets (tokens in its environment
            // lines): its copy is readable by its owner only.
            let backup = backup(&file, &stamp, Some(0o600))?;
            replace(&file.real, &edited)?;
            println!(
                "{}: {} line(s) commented out; the old file is {}",
                file.shown(),
                entries.len(),
                backup.display()
            );
        }
        None => {
            let dir = config_path.parent().unwrap_or(Path::new("."));
            let backup = dir.join(format!("crontab.bak-{stamp}"));
            create_new(&backup, text, 0o600)?;
            let mut child = crontab_command(args.user.as_deref())
                .arg("-")
                .stdin(Stdio::piped())
                .spawn()
                .map_err(|e| Error::Unavailable(format!("cannot run `crontab -`: {e}")))?;
            if let Some(mut stdin) = child.stdin.take() {
                stdin
                    .write_all(edited.as_bytes())
                    .map_err(|e| Error::io("writing to", Path::new("crontab -"), e))?;
            }
            let status = child
                .wait()
                .map_err(|e| Error::io("waiting for", Path::new("crontab -"), e))?;
            if !status.success() {
                return Err(Error::Unavailable(format!(
                    "`crontab -` refused the edited crontab; the old one is unchanged and kept in {}",
                    backup.display()
                )));
            }
            println!(
                "crontab: {} line(s) commented out; the old crontab is {}",
                entries.len(),
                backup.display()
            );
        }
    }
    println!(
        "next: `agent-state check`, then `systemctl reload agent-state` (or start it); a run missed earlier today within catch_up_window is caught up"
    );
    Ok(exit::OK)
}

/// Keep the text `file` had as `NAME.bak-STAMP` beside it, with its owner,
/// group and mode (`mode`, if given, takes bits away: never adds). Returns
/// the backup's path.
fn backup(file: &Loaded, stamp: &str, mode: Option<u32>) -> Result<PathBuf> {
    let name = file
        .real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let path = file.real.with_file_name(format!("{name}.bak-{stamp}"));
    create_new(
        &path,
        &file.text,
        file.meta.mode() & 0o777 & mode.unwrap_or(0o777),
    )?;
    let _ = nix::unistd::chown(
        &path,
        Some(file.meta.uid().into()),
        Some(file.meta.gid().into()),
    );
    Ok(path)
}

/// Write `text` to a new file at `path` (never through a link, never over
/// an existing file), synced.
fn create_new(path: &Path, text: &str, mode: u32) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| Error::io("creating the backup", path, e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io("writing the backup", path, e))
}

/// Replace `path` with `text` through a temp file in its directory, keeping
/// its mode, owner and group.
fn replace(path: &Path, text: &str) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io("inspecting", path, e))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp =
        tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io("writing in", dir, e))?;
    tmp.write_all(text.as_bytes())
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| Error::io("writing", tmp.path(), e))?;
    std::fs::set_permissions(tmp.path(), meta.permissions())
        .map_err(|e| Error::io("setting the mode of", tmp.path(), e))?;
    let _ = nix::unistd::chown(tmp.path(), Some(meta.uid().into()), Some(meta.gid().into()));
    tmp.persist(path)
        .map_err(|e| Error::io("replacing", path, e.error))?;
    Ok(())
}
