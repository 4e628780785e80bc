//! `agent-state events`: every agent's journal and the daemon's logs as one
//! ordered stream, each event with the cursor that resumes right after it
//! (`--after`), and `--follow` to wait for more (inotify, never polling).
//! See [`crate::events`] for the cursor and the order.

use std::collections::BTreeSet;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use notify::{RecursiveMode, Watcher};
use serde::Serialize;

use crate::agent_name::AgentName;
use crate::cli::display::{Line, Style};
use crate::cli::{Context, warn};
use crate::error::{Error, Result, exit};
use crate::events::{Batch, Change, Cursor, Reader, SourceId, StreamEvent, classify};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only this agent's journal, and the daemon's records about it or about no agent in particular
    #[arg(long, value_name = "A")]
    pub agent: Option<String>,
    /// Resume right after the event this cursor was printed with (no duplicates, no gaps)
    #[arg(long, value_name = "CURSOR")]
    pub after: Option<String>,
    /// After what exists, print events as they are appended, until SIGINT/SIGTERM or stdout closes
    #[arg(long)]
    pub follow: bool,
    /// One JSON object a line: {"cursor", "source", "kind", "ts", "event": the line as written}
    #[arg(long)]
    pub json: bool,
    /// Stop after N events (the last one's cursor resumes the stream)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Of the events there are now, only the last N (then, with --follow, every new one)
    #[arg(long, value_name = "N")]
    pub tail: Option<u64>,
    /// Only events at or after this time: an RFC 3339 time, or a duration ago (`2h`, `30m`)
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
}

/// `--since`: an RFC 3339 time, or a duration before `now`.
fn since(text: &str, now: crate::clock::Timestamp) -> Result<chrono::DateTime<chrono::Utc>> {
    if let Ok(t) = crate::clock::Timestamp::parse(text) {
        return Ok(t.0);
    }
    match humantime::parse_duration(text) {
        Ok(d) => match crate::clock::bounded(text, d) {
            Ok(d) => Ok(now.minus(d).0),
            Err(e) => Err(Error::Usage(format!("--since: {e}"))),
        },
        Err(_) => Err(Error::Usage(format!(
            "--since {text:?}: give a time like 2026-11-24T08:00:00Z or a duration like 2h"
        ))),
    }
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let after = match &args.after {
        Some(token) => Cursor::parse(token).map_err(|p| Error::Usage(format!("--after: {p}")))?,
        None => Cursor::start(),
    };
    let agent: Option<AgentName> = match &args.agent {
        Some(a) => Some(ctx.config.agent_named(a)?.name.clone()),
        None => None,
    };
    // A reader that goes away (`| head`, a closed pipe) ends the stream
    // with exit 0: see EPIPE as an error rather than die of SIGPIPE.
    // SAFETY: SIG_IGN installs no handler; no other thread exists yet.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    let since = match &args.since {
        Some(t) => Some(since(t, ctx.now)?),
        None => None,
    };
    let mut printer = Printer {
        out: BufWriter::new(io::stdout().lock()),
        json: args.json,
        limit: args.limit,
        printed: 0,
        last: None,
        since,
        tail: args.tail,
    };
    let mut reader = Reader::new(ctx.root.clone(), after, agent);
    let result = if args.follow {
        follow(ctx, &mut reader, &mut printer)
    } else {
        reader
            .read(None)
            .and_then(|batch| printer.batch(&batch, None))
            .map(|_| ())
    };
    match result {
        Ok(()) => {}
        Err(e) if is_broken_pipe(&e) => return Ok(exit::OK),
        Err(e) => return Err(e),
    }
    if printer.limit.is_some_and(|l| printer.printed >= l)
        && let Some(cursor) = &printer.last
    {
        eprintln!(
            "agent-state: stopped after {} events (--limit); resume with --after {cursor}",
            printer.printed
        );
    }
    Ok(exit::OK)
}

fn is_broken_pipe(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.kind() == io::ErrorKind::BrokenPipe)
}

/// What wakes the follow loop.
enum Wake {
    Changes(Vec<Change>),
    /// SIGINT, SIGTERM, or stdout closed.
    Stop,
}

fn follow(ctx: &Context, reader: &mut Reader, printer: &mut Printer<impl Write>) -> Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<Wake>();

    // SIGINT and SIGTERM are taken by one thread (sigwait) and end the
    // stream cleanly; blocked here first, so every thread started after
    // (notify's included) inherits the mask.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals
        .thread_block()
        .map_err(|e| Error::Data(format!("cannot block SIGINT/SIGTERM: {e}")))?;
    {
        let (tx, stop) = (tx.clone(), stop.clone());
        std::thread::spawn(move || {
            if signals.wait().is_ok() {
                stop.store(true, Ordering::SeqCst);
                let _ = tx.send(Wake::Stop);
            }
        });
    }
    // A reader that closes the pipe ends the stream at once, not at the
    // next event: poll(2) reports POLLERR on a pipe without readers.
    {
        let (tx, stop) = (tx.clone(), stop.clone());
        std::thread::spawn(move || {
            if wait_stdout_closed() {
                stop.store(true, Ordering::SeqCst);
                let _ = tx.send(Wake::Stop);
            }
        });
    }

    let root = ctx.root.path.clone();
    let mut watcher = {
        let (tx, root) = (tx.clone(), root.clone());
        notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            let changes = classify(&root, res);
            if !changes.is_empty() {
                let _ = tx.send(Wake::Changes(changes));
            }
        })
        .map_err(|e| Error::Data(format!("cannot start the file watcher: {e}")))?
    };
    if !crate::fsx::is_dir(&root) {
        return Err(Error::NotFound(format!(
            "the state root {} does not exist; run `agent-state bootstrap` first",
            root.display()
        )));
    }
    let mut watched: BTreeSet<PathBuf> = BTreeSet::new();
    watch(&mut watcher, &mut watched, &root)
        .map_err(|e| Error::Data(format!("cannot watch {}: {e}", root.display())))?;
    // Watches first, then the read: nothing appended in between is missed.
    watch_sources(ctx, reader, &mut watcher, &mut watched)?;
    let batch = reader.read(None)?;
    if printer.batch(&batch, Some(&stop))? {
        return Ok(());
    }

    while let Ok(first) = rx.recv() {
        let mut wakes = vec![first];
        wakes.extend(rx.try_iter());
        let mut dirty: BTreeSet<SourceId> = BTreeSet::new();
        let mut rescan = false;
        for wake in wakes {
            let Wake::Changes(changes) = wake else {
                return Ok(());
            };
            for change in changes {
                match change {
                    Change::Source(s) => {
                        dirty.insert(s);
                    }
                    Change::NewDir(path) => {
                        let sources: Vec<SourceId> = sources_in(&path)
                            .into_iter()
                            .filter(|s| reader.wants(s))
                            .collect();
                        // Watched again even if it was before: a directory
                        // removed and made anew lost its watch. It may be
                        // gone again, or be a file: then nothing.
                        if !sources.is_empty()
                            && crate::fsx::is_dir(&path)
                            && watcher.watch(&path, RecursiveMode::NonRecursive).is_ok()
                        {
                            watched.insert(path);
                            dirty.extend(sources);
                        }
                    }
                    Change::Rescan => rescan = true,
                }
            }
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let batch = if rescan {
            watch_sources(ctx, reader, &mut watcher, &mut watched)?;
            reader.read(None)?
        } else if dirty.is_empty() {
            continue;
        } else {
            reader.read(Some(&dirty))?
        };
        if printer.batch(&batch, Some(&stop))? {
            return Ok(());
        }
    }
    Ok(())
}

/// Watch `.daemon/` and every agent directory the reader reads.
fn watch_sources(
    ctx: &Context,
    reader: &Reader,
    watcher: &mut impl Watcher,
    watched: &mut BTreeSet<PathBuf>,
) -> Result<()> {
    let daemon = ctx.root.daemon_dir();
    if crate::fsx::is_dir(&daemon) {
        let _ = watch(watcher, watched, &daemon);
    }
    for source in reader.sources()? {
        if let SourceId::Agent(a) = &source {
            let dir = ctx.root.agent(a).path;
            if crate::fsx::is_dir(&dir) {
                let _ = watch(watcher, watched, &dir);
            }
        }
    }
    Ok(())
}

fn watch(
    watcher: &mut impl Watcher,
    watched: &mut BTreeSet<PathBuf>,
    dir: &Path,
) -> notify::Result<()> {
    if watched.contains(dir) {
        return Ok(());
    }
    watcher.watch(dir, RecursiveMode::NonRecursive)?;
    watched.insert(dir.to_path_buf());
    Ok(())
}

/// The sources a directory under the root holds.
fn sources_in(dir: &Path) -> Vec<SourceId> {
    let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
        return Vec::new();
    };
    if name == ".daemon" {
        return crate::events::DaemonLog::ALL.map(SourceId::Daemon).to_vec();
    }
    AgentName::parse(name)
        .map(|a| vec![SourceId::Agent(a)])
        .unwrap_or_default()
}

/// Block until standard output is a pipe (or socket, or terminal) that
/// nobody reads any more; false if that cannot be watched.
fn wait_stdout_closed() -> bool {
    use nix::libc;
    let mut fd = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        // No events asked for: only POLLERR, POLLHUP and POLLNVAL, which
        // are always reported. A regular file or /dev/null never has them.
        events: 0,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut fd, 1, -1) };
        if n > 0 {
            return fd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0;
        }
        if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
}

struct Printer<W: Write> {
    out: W,
    json: bool,
    limit: Option<u64>,
    printed: u64,
    /// The cursor of the last event printed.
    last: Option<String>,
    /// Events before this are not printed.
    since: Option<chrono::DateTime<chrono::Utc>>,
    /// Of the first batch (what exists now), only the last N; then taken.
    tail: Option<u64>,
}

#[derive(Serialize)]
struct JsonLine<'a> {
    cursor: &'a str,
    source: &'a str,
    kind: &'a str,
    ts: &'a str,
    event: &'a serde_json::Value,
}

impl<W: Write> Printer<W> {
    /// Print a batch's notes (stderr) and events; true once the limit is
    /// reached or `stop` is set.
    fn batch(&mut self, batch: &Batch, stop: Option<&AtomicBool>) -> Result<bool> {
        for note in &batch.notes {
            warn(note);
        }
        let stopped = || stop.is_some_and(|s| s.load(Ordering::SeqCst));
        let mut done = false;
        let since = self.since;
        let shown = |e: &StreamEvent| since.is_none_or(|t| e.ts >= t);
        let mut skip = match self.tail.take() {
            Some(n) => (batch.events.iter().filter(|e| shown(e)).count() as u64).saturating_sub(n),
            None => 0,
        };
        for (event, cursor) in batch.cursors() {
            if !shown(event) {
                continue;
            }
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if self.limit.is_some_and(|l| self.printed >= l) || stopped() {
                done = true;
                break;
            }
            let cursor = cursor.encode();
            self.event(event, &cursor).map_err(stdout_error)?;
            self.printed += 1;
            self.last = Some(cursor);
        }
        self.out.flush().map_err(stdout_error)?;
        Ok(done || stopped() || self.limit.is_some_and(|l| self.printed >= l))
    }

    fn event(&mut self, e: &StreamEvent, cursor: &str) -> io::Result<()> {
        if self.json {
            let line = JsonLine {
                cursor,
                source: e.source.label(),
                kind: &e.kind,
                ts: &e.ts_text,
                event: &e.event,
            };
            crate::cli::json::write_line(&mut self.out, &line)?;
            self.out.write_all(b"\n")
        } else {
            let summary = e.summary();
            let gap = if summary.is_empty() { "" } else { "  " };
            let source = match e.source {
                SourceId::Agent(_) => Style::Bold,
                SourceId::Daemon(_) => Style::Plain,
            };
            let line = Line::new()
                .styled(Style::Dim, &e.ts_text)
                .text("  ")
                .cell(source, e.source.label(), 8)
                .text("  ")
                .cell(kind_style(&e.kind, &e.event), &e.kind, 15)
                .text("  ")
                .free(summary)
                .text(gap)
                .styled(Style::Dim, format!("[{cursor}]"));
            writeln!(self.out, "{}", line.shown())
        }
    }
}

/// How an event's kind looks: failures red, what recovers or needs a look
/// yellow, a session that completed green.
fn kind_style(kind: &str, event: &serde_json::Value) -> Style {
    match kind {
        "error" | "message_rejected" => Style::Bad,
        "timeout" | "wake_skipped" | "schedule_missed" | "message_expired" | "usage_limit"
        | "prompt_cut" | "state_repaired" => Style::Warn,
        "session_end" => Style::of(event["outcome"].as_str().unwrap_or("")),
        _ => Style::Plain,
    }
}

fn stdout_error(e: io::Error) -> Error {
    Error::io("writing to", "standard output", e)
}
