//! The layers of `src/` and `crates/*/src/` (ARCHITECTURE.md, "Layers"),
//! kept by a scan of the source: every `crate::`, `super::` and `self::`
//! path in every file, in code (comments and string literals are skipped),
//! `use` trees included.
//!
//! The crates of the workspace keep what Cargo can express: a crate names
//! only the crates below it in its `Cargo.toml`, so the store cannot use the
//! daemon. This test keeps the rest: the layers inside one crate and the
//! circles. `agent-state` re-exports every module of `agent-state-store`
//! and `agent-state-decide` under its own name (`crate::state`,
//! `crate::schedule`), and `agent-state-decide` imports the store's base
//! modules it uses the same way (`crate::zone`), so one module namespace
//! spans the crates and a path means the same module in any of them.
//!
//! Rules:
//!
//! 1. every top-level module of a crate's `src/` is in exactly one layer of
//!    [`LAYERS`], and that layer is one of its crate's ([`CRATES`]), and it
//!    has files in that crate only: a module the binary re-exports from a
//!    lower crate (`crate::state`, `crate::hooks`) keeps its old path by a
//!    `pub use` in `src/lib.rs`, never by a file in `src/`;
//! 2. a module uses only modules of its own layer or of the layers below
//!    (so nothing below the daemon reaches into `crate::daemon` or
//!    `crate::cli`, and the daemon never into the CLI);
//! 3. there is no circle between modules: the nodes are the top-level
//!    modules of each crate and, each on its own, every module of
//!    `src/daemon/` (the part that grows) and of `crates/store/src/state/`
//!    ([`SPLIT`]; Cargo sees no circle inside a crate);
//! 4. the pure decisions (crates/decide) do no IO: their `Cargo.toml` names
//!    only [`DECIDE_DEPENDENCIES`], and outside their tests they name
//!    neither the store's file access and state files nor std's, tokio's
//!    or nix's IO (the layer rule alone would let them use the store);
//! 5. the modules of the binary that moved into the pure decisions
//!    ([`REEXPORTS_ONLY`]: the session machine, the error matrix) keep only
//!    their old paths: their file holds `pub use` items and nothing else,
//!    and no file below it, so no decision grows back into the daemon.
//!
//! The scanner is tested on its own below, and on the real tree it must find
//! the dependencies we know of, so it cannot silently stop seeing them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// The layers, lowest first: the one place their order is written down.
const LAYERS: &[(&str, &[&str])] = &[
    // Values, errors and file access that everything uses.
    (
        "base",
        &[
            "clock",
            "catalogue",
            "error",
            "agent_name",
            "fsx",
            "access",
            "session_id",
            "session_status",
            "string_enum",
            "zone",
        ],
    ),
    // Every file shape and the one way each is written.
    ("store", &["state"]),
    // What a session script and the daemon share, on top of the state files:
    // inbox delivery and claims, a session's owner lock, the hooks
    // (`session begin|end|fail`, recovery). Below the config: the hooks take
    // the settings they read as a value (`hooks::AgentSettings`).
    ("delivery", &["inbox", "owner", "hooks"]),
    // Pure decisions: values in, values out, the time passed in (no IO).
    // Below config, which keeps a parsed `schedule::Schedule` (and the
    // error matrix's `failure::RetrySettings`).
    (
        "decide",
        &[
            "schedule", "protocol", "economy", "ending", "failure", "machine",
        ],
    ),
    // What the operator wrote.
    ("config", &["config"]),
    // What scripts use without a daemon, above the hooks: the prompt, the
    // event stream, check, usage, workspaces, flows, backups.
    (
        "domain",
        &[
            "prompt",
            "events",
            "check",
            "usage",
            "git",
            "workspace",
            "flow",
            "backup",
        ],
    ),
    // The daemon, and the worker that runs sessions for a cluster's
    // controller (issue 24).
    ("daemon", &["daemon", "worker"]),
    ("cli", &["cli"]),
];

/// The crates of the workspace, lowest first: name, source directory (from
/// the repository's root) and the layers whose modules live there.
const CRATES: &[(&str, &str, &[&str])] = &[
    (
        "agent-state-store",
        "crates/store/src",
        &["base", "store", "delivery"],
    ),
    ("agent-state-decide", "crates/decide/src", &["decide"]),
    ("agent-state", "src", &["config", "domain", "daemon", "cli"]),
];

/// The modules whose own modules are nodes of the circle rule, each on its
/// own: the daemon, the part that grows, and the store's `state/`, whose
/// files share words (`string_enum!` was once lent by `state::tasks` to
/// `session` and `journal`).
const SPLIT: &[&str] = &["daemon", "state"];

const RULE_LAYERS: &str = "a module uses only modules of its own layer and of the layers below \
     (LAYERS in tests/layers.rs; ARCHITECTURE.md, \"Layers\")";
const RULE_CIRCLES: &str = "no circle between modules (the top-level modules of each crate's src/ \
     and each module of src/daemon/ and crates/store/src/state/; ARCHITECTURE.md, \"Layers\")";

// ---- the source tree -----------------------------------------------------------

/// One `.rs` file: its path (for messages) and its module path
/// (`src/daemon/session.rs` is `["daemon", "session"]`, `src/state/mod.rs`
/// is `["state"]`).
struct SourceFile {
    path: String,
    module: Vec<String>,
    text: String,
}

impl SourceFile {
    /// The source directory of [`CRATES`] the file is in.
    fn crate_dir(&self) -> &'static str {
        CRATES
            .iter()
            .map(|(_, dir, _)| *dir)
            .find(|dir| {
                self.path
                    .strip_prefix(dir)
                    .is_some_and(|rest| rest.starts_with('/'))
            })
            .unwrap_or("?")
    }
}

fn source_tree() -> Vec<SourceFile> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for (_, dir, _) in CRATES {
        let src = root.join(dir);
        let mut files = Vec::new();
        walk(&src, &mut files);
        files.sort();
        out.extend(files.into_iter().filter_map(|path| {
            let rel = path.strip_prefix(&src).ok()?.to_str()?.to_string();
            // The binaries are crates of their own: they use `agent_state::`.
            if rel == "main.rs" || rel.starts_with("bin/") {
                return None;
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            Some(SourceFile {
                path: format!("{dir}/{rel}"),
                module: module_path(&rel),
                text,
            })
        }));
    }
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

// ---- the scanner ---------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

/// Rust's tokens as far as paths need them, with their line numbers:
/// comments, string, byte and raw string literals, char literals and
/// lifetimes produce nothing.
fn lex(text: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(&c, i + 1, &mut line);
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                // Past the quote, the backslash and the escaped character.
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            match (word.as_str(), at(i)) {
                ("r" | "br" | "cr", '"' | '#') => {
                    let mut hashes = 0;
                    while at(i) == '#' {
                        hashes += 1;
                        i += 1;
                    }
                    if at(i) != '"' {
                        // `r#ident`: a raw identifier.
                        continue;
                    }
                    i += 1;
                    while i < c.len() {
                        if c[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                            i += 1 + hashes;
                            break;
                        }
                        line += usize::from(c[i] == '\n');
                        i += 1;
                    }
                }
                ("b" | "c", '"') => i = skip_string(&c, i + 1, &mut line),
                ("b", '\'') => {
                    i += 1;
                    while i < c.len() && c[i] != '\'' {
                        i += if c[i] == '\\' { 2 } else { 1 };
                    }
                    i += 1;
                }
                _ => out.push((Tok::Ident(word), line)),
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Past the closing quote of a string whose opening quote is before `i`.
fn skip_string(c: &[char], mut i: usize, line: &mut usize) -> usize {
    while i < c.len() && c[i] != '"' {
        if c[i] == '\\' {
            i += 1;
        }
        if c.get(i) == Some(&'\n') {
            *line += 1;
        }
        i += 1;
    }
    i + 1
}

/// One path a file uses: where, as written, and resolved from the crate root.
#[derive(Debug, Clone)]
struct Reference {
    line: usize,
    written: String,
    resolved: Vec<String>,
}

/// Every `crate::`, `super::` and `self::` path in `text`, a file of module
/// `module`, with `use` trees (`use crate::{a, b::{c, d}}`) expanded and
/// `super` resolved through inline modules (`mod tests { use super::*; }`).
fn references(module: &[String], text: &str) -> Vec<Reference> {
    references_in(module, lex(text))
}

/// [`references`] over tokens already read.
fn references_in(module: &[String], toks: Vec<(Tok, usize)>) -> Vec<Reference> {
    let tok = |i: usize| toks.get(i).map(|(t, _)| t);
    let mut out = Vec::new();
    // The inline modules around the current token (None: another brace).
    let mut braces: Vec<Option<String>> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('{') => {
                let inline = match (
                    i.checked_sub(2).and_then(tok),
                    i.checked_sub(1).and_then(tok),
                ) {
                    (Some(Tok::Ident(m)), Some(Tok::Ident(name))) if m == "mod" => {
                        Some(name.clone())
                    }
                    _ => None,
                };
                braces.push(inline);
                i += 1;
            }
            Tok::Punct('}') => {
                braces.pop();
                i += 1;
            }
            Tok::Ident(w)
                if matches!(w.as_str(), "crate" | "super" | "self")
                    && tok(i + 1) == Some(&Tok::PathSep)
                    && !matches!(
                        i.checked_sub(1).and_then(tok),
                        Some(Tok::PathSep | Tok::Punct('$'))
                    ) =>
            {
                let line = toks[i].1;
                let mut paths = Vec::new();
                i = path_tree(&toks, i, Vec::new(), &mut paths);
                let mut here: Vec<String> = module.to_vec();
                here.extend(braces.iter().flatten().cloned());
                for mut segs in paths {
                    let resolved = resolve(&here, &segs);
                    // `use crate::a::{self, B}` uses `crate::a`.
                    if segs.len() > 1 && segs.last().is_some_and(|s| s == "self") {
                        segs.pop();
                    }
                    out.push(Reference {
                        line,
                        written: segs.join("::"),
                        resolved,
                    });
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// Reads a path or a `use` tree from `i`; pushes every full path to `out`.
/// Returns the index after it.
fn path_tree(
    toks: &[(Tok, usize)],
    mut i: usize,
    mut segs: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match toks.get(i).map(|(t, _)| t) {
            Some(Tok::Ident(s)) => {
                segs.push(s.clone());
                i += 1;
                if toks.get(i).map(|(t, _)| t) == Some(&Tok::PathSep) {
                    i += 1;
                    continue;
                }
                out.push(segs);
                return i;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i).map(|(t, _)| t) {
                        None => return i,
                        Some(Tok::Punct('}')) => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        Some(_) => {
                            let before = i;
                            i = path_tree(toks, i, segs.clone(), out);
                            if i == before {
                                i += 1;
                            }
                        }
                    }
                }
            }
            Some(Tok::Punct('*')) => {
                out.push(segs);
                return i + 1;
            }
            _ => {
                if !segs.is_empty() {
                    out.push(segs);
                }
                return i;
            }
        }
    }
}

/// `segs` (starting with `crate`, `super` or `self`) from the crate root,
/// as seen from module `here`.
fn resolve(here: &[String], segs: &[String]) -> Vec<String> {
    let mut rest = segs.iter().peekable();
    let mut base: Vec<String> = if segs.first().map(String::as_str) == Some("crate") {
        rest.next();
        Vec::new()
    } else {
        here.to_vec()
    };
    while let Some(s) = rest.peek() {
        match s.as_str() {
            "super" => {
                base.pop();
            }
            "self" => {}
            _ => break,
        }
        rest.next();
    }
    base.extend(rest.filter(|s| *s != "self").cloned());
    base
}

// ---- the graph -----------------------------------------------------------------

/// An edge of the module graph: `from` uses `to` at `file:line` by `written`.
#[derive(Debug, Clone)]
struct Edge {
    from: String,
    to: String,
    file: String,
    line: usize,
    written: String,
}

impl Edge {
    fn at(&self) -> String {
        format!("{}:{}: `{}`", self.file, self.line, self.written)
    }
}

struct Graph {
    /// Top-level modules of every crate's src/ (files and directories).
    top: BTreeSet<String>,
    /// The crate source directories each top-level module has files in.
    home: BTreeMap<String, BTreeSet<&'static str>>,
    /// Modules of src/daemon/.
    daemon: BTreeSet<String>,
    edges: Vec<Edge>,
}

/// The node of a module path: its top-level module, or `daemon::x` for
/// `daemon::x::...`. None for the crate root and for what is not a module.
fn node(g_top: &BTreeSet<String>, g_inner: &BTreeSet<String>, path: &[String]) -> Option<String> {
    let top = path.first()?;
    if !g_top.contains(top) {
        return None;
    }
    match path.get(1) {
        Some(sub) if g_inner.contains(&format!("{top}::{sub}")) => Some(format!("{top}::{sub}")),
        _ => Some(top.clone()),
    }
}

fn top_of(node: &str) -> &str {
    node.split("::").next().unwrap_or(node)
}

fn graph(files: &[SourceFile]) -> Graph {
    let mut top = BTreeSet::new();
    let mut home: BTreeMap<String, BTreeSet<&'static str>> = BTreeMap::new();
    let mut daemon = BTreeSet::new();
    for f in files {
        if let Some(t) = f.module.first() {
            top.insert(t.clone());
            home.entry(t.clone()).or_default().insert(f.crate_dir());
        }
        if f.module.len() >= 2 && SPLIT.contains(&f.module[0].as_str()) {
            daemon.insert(format!("{}::{}", f.module[0], f.module[1]));
        }
    }
    let mut edges = Vec::new();
    for f in files {
        let Some(from) = node(&top, &daemon, &f.module) else {
            continue;
        };
        for r in references(&f.module, &f.text) {
            let Some(to) = node(&top, &daemon, &r.resolved) else {
                continue;
            };
            if to != from {
                edges.push(Edge {
                    from: from.clone(),
                    to,
                    file: f.path.clone(),
                    line: r.line,
                    written: r.written,
                });
            }
        }
    }
    Graph {
        top,
        home,
        daemon,
        edges,
    }
}

fn layer_of(module: &str) -> Option<(usize, &'static str)> {
    LAYERS
        .iter()
        .enumerate()
        .find(|(_, (_, modules))| modules.contains(&module))
        .map(|(i, (name, _))| (i, *name))
}

// ---- the rules -----------------------------------------------------------------

fn unplaced_modules(g: &Graph) -> Vec<String> {
    let mut problems = Vec::new();
    for m in &g.top {
        let dirs = &g.home[m];
        let at = dirs.iter().next().copied().unwrap_or("?");
        let n = LAYERS
            .iter()
            .filter(|(_, ms)| ms.contains(&m.as_str()))
            .count();
        if n != 1 {
            problems.push(format!(
                "{at}/{m}: module `{m}` is in {n} layers of LAYERS (tests/layers.rs); put it in exactly one"
            ));
            continue;
        }
        let Some((_, layer)) = layer_of(m) else {
            continue;
        };
        let Some((krate, dir, _)) = CRATES.iter().find(|(_, _, ls)| ls.contains(&layer)) else {
            problems.push(format!(
                "LAYERS (tests/layers.rs), layer \"{layer}\": no crate of CRATES holds it; add it to one"
            ));
            continue;
        };
        if dirs.len() != 1 || at != *dir {
            let found: Vec<&str> = dirs.iter().copied().collect();
            problems.push(format!(
                "{at}/{m}: module `{m}` (layer \"{layer}\") belongs in crate {krate} ({dir}/) but has \
                 files in {}; move it, or move its layer in CRATES (tests/layers.rs)",
                found.join(", ")
            ));
        }
    }
    for (layer, modules) in LAYERS {
        for m in *modules {
            if !g.top.contains(*m) {
                problems.push(format!(
                    "LAYERS (tests/layers.rs), layer \"{layer}\": there is no module `{m}` in any crate's src/; remove it"
                ));
            }
        }
    }
    problems
}

fn upward_uses(g: &Graph) -> Vec<String> {
    let mut problems = Vec::new();
    for e in &g.edges {
        let (from, to) = (top_of(&e.from), top_of(&e.to));
        let (Some((lf, nf)), Some((lt, nt))) = (layer_of(from), layer_of(to)) else {
            continue;
        };
        if lt > lf {
            problems.push(format!(
                "{}: `{from}` (layer \"{nf}\") may not use `{to}` (layer \"{nt}\", above it); rule: {RULE_LAYERS}",
                e.at()
            ));
        }
    }
    problems
}

/// A shortest circle from each module that no circle reported yet passes
/// through (so every tangle is named, with at least one of its circles).
fn circles(g: &Graph) -> Vec<String> {
    let mut next: BTreeMap<&str, BTreeMap<&str, &Edge>> = BTreeMap::new();
    for e in &g.edges {
        next.entry(&e.from).or_default().entry(&e.to).or_insert(e);
    }
    let mut reported: BTreeSet<String> = BTreeSet::new();
    let mut problems = Vec::new();
    for start in next.keys().copied() {
        if reported.contains(start) {
            continue;
        }
        // Breadth-first from `start` back to itself: a shortest circle.
        let mut came_from: BTreeMap<&str, &Edge> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        let mut closing = None;
        while let Some(n) = queue.pop_front() {
            for (to, e) in next.get(n).into_iter().flatten() {
                if *to == start {
                    closing = Some(*e);
                    break;
                }
                if !came_from.contains_key(to) {
                    came_from.insert(to, e);
                    queue.push_back(to);
                }
            }
            if closing.is_some() {
                break;
            }
        }
        let Some(last) = closing else { continue };
        let mut path = vec![last];
        let mut at = last.from.as_str();
        while at != start {
            let e = came_from[at];
            path.push(e);
            at = e.from.as_str();
        }
        path.reverse();
        reported.extend(path.iter().map(|e| e.from.clone()));
        let mut text = format!("a circle between modules: {start}");
        for e in &path {
            text.push_str(&format!(" -> {} ({})", e.to, e.at()));
        }
        problems.push(format!("{text}; rule: {RULE_CIRCLES}"));
    }
    problems
}

fn assert_none(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}:\n{}",
        problems
            .iter()
            .map(|p| format!("  - {p}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// ---- the tests -----------------------------------------------------------------

#[test]
fn every_module_of_src_is_in_one_layer() {
    assert_none(
        "modules and LAYERS disagree",
        &unplaced_modules(&graph(&source_tree())),
    );
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    assert_none(
        "modules reach up into a higher layer",
        &upward_uses(&graph(&source_tree())),
    );
}

#[test]
fn no_circle_between_modules() {
    assert_none(
        "modules use each other in a circle",
        &circles(&graph(&source_tree())),
    );
}

/// A crate holds whole layers, and a lower crate lower layers: Cargo keeps
/// the order between crates only if it is the order of LAYERS.
#[test]
fn the_crates_hold_the_layers_in_their_order() {
    let held: Vec<&str> = CRATES
        .iter()
        .flat_map(|(_, _, layers)| layers.iter().copied())
        .collect();
    let layers: Vec<&str> = LAYERS.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        held, layers,
        "CRATES (tests/layers.rs) must hold every layer of LAYERS once, the lowest crate the lowest layers"
    );
}

/// If the scanner stopped seeing paths, the rules above would pass on
/// anything: on the real tree it must see dependencies we know exist.
#[test]
fn the_scan_sees_the_dependencies_we_know_of() {
    let g = graph(&source_tree());
    assert!(g.top.len() >= 15, "too few modules found: {:?}", g.top);
    assert!(
        ["service", "session", "files", "health"]
            .iter()
            .all(|m| g.daemon.contains(&format!("daemon::{m}"))),
        "the daemon's modules were not found: {:?}",
        g.daemon
    );
    for (from, to) in [
        ("daemon::session", "hooks"),         // use crate::hooks::{self, ...}
        ("daemon::session", "daemon::files"), // use super::files
        ("hooks", "state"),                   // use crate::state::...
        ("hooks", "owner"),                   // use crate::owner::{self, Liveness} (inside store)
        ("config", "hooks"), // impl From<&AgentConfig> for crate::hooks::AgentSettings
        ("config", "schedule"), // use crate::schedule::Schedule (crate decide)
        ("schedule", "zone"), // use crate::zone::Zone (decide -> store)
        ("flow", "protocol"), // use crate::protocol::summary::... (crate decide)
        ("economy", "protocol"), // use crate::protocol::limits::... (inside decide)
        ("config", "economy"), // pub use crate::economy::UsageLimitSettings
        ("config", "machine"), // impl From<&AgentConfig> for crate::machine::Settings
        ("machine", "failure"), // use crate::failure::{self, ...} (inside decide)
        ("failure", "ending"), // use crate::ending::{Ending, ...} (inside decide)
        ("machine", "session_status"), // use crate::session_status::SessionStatus (decide -> store)
        ("daemon::machine", "machine"), // pub use crate::machine::*
        ("cli", "daemon::files"), // use crate::daemon::{files, session}
        ("check", "fsx"),    // crate::fsx::is_dir(..) in code
        ("error", "catalogue"), // crate::catalogue::Code in a return type
        ("state::journal", "state::words"), // use super::words::{TaskPriority, ...}
        ("state::tasks", "state::report"), // super::report::Report in code
    ] {
        assert!(
            g.edges.iter().any(|e| e.from == from && e.to == to),
            "the scan did not see that `{from}` uses `{to}`"
        );
    }
}

#[test]
fn the_scanner_reads_paths_as_rustc_does() {
    let text = r####"
use crate::{clock::Timestamp, state::{self, journal::Event}};
use super::files;
// use crate::cli::Cli;   a comment
/* use crate::cli::Nested; /* nested */ still a comment */
/// Docs may link [`crate::cli`].
const S: &str = "crate::cli::in_a_string \" crate::cli::escaped";
const R: &str = r#"crate::cli::raw " crate::cli::still_raw"#;
const B: &[u8] = b"crate::cli::bytes";
const C: char = '"';
const Q: char = '\'';
fn f<'a>(x: &'a str) -> crate::error::Result<&'a str> { Ok(x) }
macro_rules! m { () => { $crate::cli::from_a_macro() }; }
pub(crate) fn g() { crate::fsx::exists(std::path::Path::new("/")); }
mod tests {
    use super::*;
    use super::super::health;
}
"####;
    let module = vec!["daemon".to_string(), "session".to_string()];
    let refs = references(&module, text);
    let found: Vec<(usize, String, String)> = refs
        .iter()
        .map(|r| (r.line, r.written.clone(), r.resolved.join("::")))
        .collect();
    let want = [
        (2, "crate::clock::Timestamp", "clock::Timestamp"),
        (2, "crate::state", "state"),
        (2, "crate::state::journal::Event", "state::journal::Event"),
        (3, "super::files", "daemon::files"),
        (12, "crate::error::Result", "error::Result"),
        (14, "crate::fsx::exists", "fsx::exists"),
        (16, "super", "daemon::session"),
        (17, "super::super::health", "daemon::health"),
    ];
    let want: Vec<(usize, String, String)> = want
        .iter()
        .map(|(l, w, r)| (*l, w.to_string(), r.to_string()))
        .collect();
    assert_eq!(found, want);
}

#[test]
fn a_broken_rule_names_the_file_the_path_and_the_rule() {
    let file = |path: &str, text: &str| SourceFile {
        path: path.into(),
        module: module_path(path.trim_start_matches("src/")),
        text: text.into(),
    };
    let files = [
        file(
            "src/hooks.rs",
            "fn f() { crate::daemon::session::highest_instance(dir); }",
        ),
        file(
            "src/daemon/session.rs",
            "use crate::hooks::{self, BeginRequest};",
        ),
        file("src/state/mod.rs", "use crate::cli::Cli;"),
        file("src/cli/mod.rs", ""),
    ];
    let g = graph(&files);
    let up = upward_uses(&g);
    assert_eq!(up.len(), 2, "{up:#?}");
    assert!(
        up[0].starts_with(
            "src/hooks.rs:1: `crate::daemon::session::highest_instance`: `hooks` (layer \"delivery\") \
             may not use `daemon` (layer \"daemon\", above it); rule: a module uses only"
        ),
        "{}",
        up[0]
    );
    assert!(
        up[1].starts_with(
            "src/state/mod.rs:1: `crate::cli::Cli`: `state` (layer \"store\") may not use `cli`"
        ),
        "{}",
        up[1]
    );
    let circles = circles(&g);
    assert_eq!(
        circles,
        [format!(
            "a circle between modules: daemon::session -> hooks (src/daemon/session.rs:1: \
             `crate::hooks`) -> daemon::session (src/hooks.rs:1: \
             `crate::daemon::session::highest_instance`); rule: {RULE_CIRCLES}"
        )]
    );
}

// ---- time passed in ------------------------------------------------------------

/// Where the wall clock may be read (`Timestamp::now()`, `SystemTime::now()`,
/// `Utc::now()`, `Local::now()`): the loop and the CLI read it once and pass
/// the time down (issue 21, "Time passed in, everywhere"). `Instant::now()`
/// measures and is not the wall clock. A path ending in `/` is a directory.
const CLOCK_READERS: &[&str] = &[
    "crates/store/src/clock.rs",
    "src/daemon/clock.rs",
    "src/daemon/service.rs",
    "src/daemon/service/",
    "src/cli/",
    "src/main.rs",
    // The worker's own loop (issue 24): the times of its heartbeats and of
    // its sessions' starts and ends, on the worker's clock (a session's
    // run is `worker/run.rs`).
    "src/worker.rs",
    "src/worker/run.rs",
    "src/worker/prune.rs",
];

/// The lines of non-test code in `text` that read the wall clock: items
/// under `#[cfg(test)]` (a test module, a test helper) are skipped.
fn clock_reads(text: &str) -> Vec<usize> {
    let toks = outside_tests(lex(text));
    let ident = |i: usize, w: &str| matches!(toks.get(i), Some((Tok::Ident(x), _)) if x == w);
    let punct = |i: usize, p: char| matches!(toks.get(i), Some((Tok::Punct(x), _)) if *x == p);
    let mut out = Vec::new();
    for i in 0..toks.len() {
        let clock = ["Timestamp", "SystemTime", "Utc", "Local"]
            .iter()
            .any(|w| ident(i, w));
        if clock
            && matches!(toks.get(i + 1), Some((Tok::PathSep, _)))
            && ident(i + 2, "now")
            && punct(i + 3, '(')
        {
            out.push(toks[i].1);
        }
    }
    out
}

/// The tokens of `toks` outside items under `#[cfg(test)]` (a test module,
/// a test helper).
fn outside_tests(toks: Vec<(Tok, usize)>) -> Vec<(Tok, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if let Some(end) = past_cfg_test(&toks, i) {
            i = end;
            continue;
        }
        out.push(toks[i].clone());
        i += 1;
    }
    out
}

fn allowed(list: &[&str], path: &str) -> bool {
    list.iter().any(|p| {
        if p.ends_with('/') {
            path.starts_with(p)
        } else {
            path == *p
        }
    })
}

#[test]
fn no_wall_clock_below_the_loop() {
    let problems: Vec<String> = source_tree()
        .iter()
        .filter(|f| !f.path.ends_with("/tests.rs") && !f.path.contains("/tests/"))
        .filter(|f| !allowed(CLOCK_READERS, &f.path))
        .flat_map(|f| {
            clock_reads(&f.text).into_iter().map(move |line| {
                format!(
                    "{}:{line}: reads the wall clock; take the time from the caller \
                     (the daemon's Clock, the CLI's ctx.now)",
                    f.path
                )
            })
        })
        .collect();
    assert_none("wall-clock reads below the loop", &problems);
}

#[test]
fn the_clock_scan_skips_tests_and_sees_reads() {
    let text = r#"
fn a() { let t = Timestamp::now(); }
// Timestamp::now() in a comment
const S: &str = "SystemTime::now()";
fn b() { let i = std::time::Instant::now(); }
#[cfg(test)]
mod tests {
    fn c() { let t = chrono::Utc::now(); }
}
#[cfg(test)]
fn helper() { let t = SystemTime::now(); }
fn d() { let t = std::time::SystemTime::now(); }
"#;
    assert_eq!(clock_reads(text), vec![2, 12]);
}

// ---- the pure decisions do no IO ----------------------------------------------

/// The crates `agent-state-decide` may name in its `[dependencies]`: the
/// store for its base values, and crates of values. A new one is added here
/// with its reason; never a crate of IO (tokio, nix, inotify, notify, axum,
/// hyper, tempfile, ...) nor a crate above it.
const DECIDE_DEPENDENCIES: &[&str] = &[
    "agent-state-store", // zone::Zone, clock::Timestamp, agent_name::AgentName
    "chrono",            // the arithmetic of times
    "humantime",         // durations in the reasons the machine renders ("after 10m")
    "serde",             // the values are written to and read from state files
    "serde_json",        // protocol::limits reads Claude Code's stream-json
    "thiserror",         // the errors' Display
];

/// What the decide layer may not name outside its tests, though the layers
/// below it have it: the store's file access, state files, inbox delivery,
/// owner locks and hooks, and std's IO.
const DECIDE_NO_IO: &[&str] = &["fsx", "access", "state", "inbox", "owner", "hooks"];
const STD_IO: &[&str] = &["fs", "process", "net", "os", "io"];

/// The lines of non-test code in `text` (a file of module `module` of the
/// decide layer) that reach for IO: `crate::fsx`, `crate::state`,
/// `crate::access`, `crate::inbox`, `crate::owner`, `crate::hooks` (however
/// written, or through `agent_state_store::`),
/// `std::fs`, `std::process`, `std::net`, `std::os`, `std::io`, `tokio::`,
/// `nix::`.
fn io_uses(module: &[String], text: &str) -> Vec<(usize, String)> {
    let toks = outside_tests(lex(text));
    let ident = |i: usize| match toks.get(i) {
        Some((Tok::Ident(x), _)) => Some(x.as_str()),
        _ => None,
    };
    let sep = |i: usize| matches!(toks.get(i), Some((Tok::PathSep, _)));
    let mut out = Vec::new();
    for i in 0..toks.len() {
        let after_sep = i > 0 && sep(i - 1);
        match ident(i) {
            Some("std") if !after_sep && sep(i + 1) => {
                if let Some(m) = ident(i + 2).filter(|m| STD_IO.contains(m)) {
                    out.push((toks[i].1, format!("std::{m}")));
                }
            }
            Some(c @ ("tokio" | "nix")) if !after_sep && sep(i + 1) => {
                out.push((toks[i].1, format!("{c}::")));
            }
            // The store's IO named through the crate (`use agent_state_store::fsx;`,
            // `use agent_state_store::{clock, state};`).
            Some("agent_state_store") if !after_sep && sep(i + 1) => {
                let mut named = Vec::new();
                match toks.get(i + 2) {
                    Some((Tok::Ident(m), _)) => named.push(m.as_str()),
                    Some((Tok::Punct('{'), _)) => {
                        for (t, _) in toks[i + 3..].iter() {
                            match t {
                                Tok::Punct('}') => break,
                                Tok::Ident(m) => named.push(m.as_str()),
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
                for m in named.into_iter().filter(|m| DECIDE_NO_IO.contains(m)) {
                    out.push((toks[i].1, format!("agent_state_store::{m}")));
                }
            }
            _ => {}
        }
    }
    for r in references_in(module, toks) {
        if r.resolved
            .first()
            .is_some_and(|m| DECIDE_NO_IO.contains(&m.as_str()))
        {
            out.push((r.line, r.written));
        }
    }
    out.sort();
    out
}

/// The dependency names under `[dependencies]` of a Cargo.toml.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        } else if inside
            && !line.starts_with('#')
            && let Some((name, _)) = line.split_once('=')
        {
            out.push(name.trim().to_string());
        }
    }
    out
}

#[test]
fn the_pure_decisions_do_no_io() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/decide/Cargo.toml");
    let manifest = std::fs::read_to_string(&manifest).expect("read crates/decide/Cargo.toml");
    let mut problems: Vec<String> = dependencies(&manifest)
        .into_iter()
        .filter(|d| !DECIDE_DEPENDENCIES.contains(&d.as_str()))
        .map(|d| {
            format!(
                "crates/decide/Cargo.toml: depends on `{d}`, not in DECIDE_DEPENDENCIES \
                 (tests/layers.rs); the pure decisions take values and do no IO: \
                 add it there with its reason if it is a crate of values"
            )
        })
        .collect();
    let files = source_tree();
    let decide: Vec<&SourceFile> = files
        .iter()
        .filter(|f| f.crate_dir() == "crates/decide/src")
        .filter(|f| !f.path.ends_with("/tests.rs") && !f.path.contains("/tests/"))
        .collect();
    assert!(
        decide.iter().any(|f| f.module == ["schedule"]),
        "crates/decide/src/schedule.rs was not found"
    );
    for f in decide {
        for (line, what) in io_uses(&f.module, &f.text) {
            problems.push(format!(
                "{}:{line}: `{what}`: the pure decisions (crates/decide) do no IO; \
                 take the value from the caller and return what it must do",
                f.path
            ));
        }
    }
    assert_none("IO in the pure decisions", &problems);
}

#[test]
fn the_io_scan_sees_io_and_skips_tests() {
    let text = r#"
use crate::zone::Zone;
use crate::{clock, fsx::read_limited};
fn a() { std::fs::read("x"); }
fn b() { let _ = crate::state::StateRoot::new("/"); }
fn c() { let x: my::std::fs::Thing; }
// std::fs in a comment
#[cfg(test)]
mod tests {
    fn d() { std::fs::read("fixture"); }
}
fn e() { tokio::spawn(f()); }
use agent_state_store::{clock, state};
fn g() { crate::inbox::claim(dir); }
use agent_state_store::hooks::begin;
"#;
    let module = vec!["economy".to_string()];
    assert_eq!(
        io_uses(&module, text),
        vec![
            (3, "crate::fsx::read_limited".to_string()),
            (4, "std::fs".to_string()),
            (5, "crate::state::StateRoot::new".to_string()),
            (12, "tokio::".to_string()),
            (13, "agent_state_store::state".to_string()),
            (14, "crate::inbox::claim".to_string()),
            (15, "agent_state_store::hooks".to_string()),
        ]
    );
    let manifest = "[package]\nname = \"x\"\n[dependencies]\n# why\nchrono = \"0.4\"\nnix = { version = \"0.31\" }\n[dev-dependencies]\ntempfile = \"3\"\n";
    assert_eq!(dependencies(manifest), ["chrono", "nix"]);
}

// ---- what moved into the pure decisions stays there --------------------------------

/// The binary's modules whose decisions moved into crates/decide: each
/// keeps its old path for the daemon's code and nothing else (rule 5).
/// `(file, where its code lives now)`.
const REEXPORTS_ONLY: &[(&str, &str)] = &[
    ("src/daemon/machine.rs", "crates/decide/src/machine.rs"),
    ("src/daemon/failure.rs", "crates/decide/src/failure.rs"),
];

/// The lines of the items of `text` that are not a `pub use` (a function,
/// a type, an impl, a `mod`, a private `use`): one per item.
fn not_reexports(text: &str) -> Vec<usize> {
    let toks = lex(text);
    let ident = |i: usize, w: &str| matches!(toks.get(i), Some((Tok::Ident(x), _)) if x == w);
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let reexport = ident(i, "pub") && ident(i + 1, "use");
        if !reexport {
            out.push(toks[i].1);
        }
        // To the end of the item: its `;` outside braces, or its block.
        let mut depth = 0usize;
        while i < toks.len() {
            match toks[i].0 {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 && !reexport {
                        break;
                    }
                }
                Tok::Punct(';') if depth == 0 => break,
                _ => {}
            }
            i += 1;
        }
        i += 1;
    }
    out
}

#[test]
fn moved_decisions_leave_only_their_old_paths() {
    let files = source_tree();
    let mut problems = Vec::new();
    for (path, home) in REEXPORTS_ONLY {
        let Some(f) = files.iter().find(|f| f.path == *path) else {
            problems.push(format!(
                "{path}: not found; remove it from REEXPORTS_ONLY (tests/layers.rs) if the old \
                 path is gone"
            ));
            continue;
        };
        for line in not_reexports(&f.text) {
            problems.push(format!(
                "{path}:{line}: only `pub use` items here: this module's code lives in {home} \
                 (the pure decisions, no IO); put the decision there, or, if it does IO, in \
                 the daemon module that carries out the machine's actions"
            ));
        }
        let dir = format!("{}/", path.trim_end_matches(".rs"));
        for below in files.iter().filter(|f| f.path.starts_with(&dir)) {
            problems.push(format!(
                "{}: a module below {path}, which only re-exports {home}: move it beside \
                 {home} (its tests: {}/tests.rs)",
                below.path,
                home.trim_end_matches(".rs")
            ));
        }
    }
    assert_none("decisions grown back into the daemon", &problems);
}

#[test]
fn the_reexport_scan_sees_every_other_item() {
    let text = r#"
//! A module doc.
pub use crate::machine::*;
pub use crate::failure::{self, Verdict};
use crate::clock::later;
/// A doc.
pub fn f() { if true { g(); } }
#[cfg(test)]
mod tests;
impl From<&A> for B { fn from(a: &A) -> B { B } }
pub use crate::x::{a, b::{c, d}};
"#;
    assert_eq!(not_reexports(text), vec![5, 7, 8, 10]);
}

// ---- no process-wide state in the store -------------------------------------------

/// Where no `static` may hold interior mutability (a `Mutex`, `RwLock`,
/// `OnceLock`, `LazyLock`, `Cell`, an atomic, a `thread_local!`): the
/// storage layer's settings and lists are values the caller passes (issue
/// 21, "Layers the compiler keeps": the disk-full reclaimer, the lock wait
/// and the repairs list live in `state::Store` and `StateRoot`), so two
/// daemons or two tests in one process never see each other's. A path
/// ending in `/` is a directory.
const NO_GLOBALS_IN: &[&str] = &["crates/store/src/"];

/// The statics allowed there anyway: file, name, and why it is not a
/// setting of one caller. Every entry must still exist.
const GLOBALS_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "crates/store/src/fsx.rs",
        "OPENAT2",
        "a cache of what the kernel offers (whether openat2 works): the same answer for every caller",
    ),
    (
        "crates/store/src/fsx.rs",
        "ROOT",
        "a cache of the process's effective uid: the same answer for every caller",
    ),
    (
        "crates/store/src/zone.rs",
        "LOADED",
        "a cache of the time-zone tables read (immutable once loaded, leaked, a handful per process)",
    ),
    (
        "crates/store/src/state/rotation.rs",
        "LOCK",
        "a lock, not a setting: it orders appends to the daemon's own logs with their rotation; \
         shared by every root, it can only make one wait, never write the wrong file",
    ),
];

/// The types that make a `static` mutable from behind a shared reference.
fn interior_mutable(word: &str) -> bool {
    matches!(
        word,
        "Mutex"
            | "RwLock"
            | "OnceLock"
            | "OnceCell"
            | "LazyLock"
            | "LazyCell"
            | "Lazy"
            | "Cell"
            | "RefCell"
            | "UnsafeCell"
            | "thread_local"
    ) || word.starts_with("Atomic")
}

/// The `static` items of non-test code in `text` whose type is interior
/// mutable, and every `thread_local!`: (line, name).
fn mutable_statics(text: &str) -> Vec<(usize, String)> {
    let toks = lex(text);
    let ident = |i: usize| match toks.get(i) {
        Some((Tok::Ident(x), _)) => Some(x.as_str()),
        _ => None,
    };
    let punct = |i: usize, p: char| matches!(toks.get(i), Some((Tok::Punct(x), _)) if *x == p);
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if let Some(end) = past_cfg_test(&toks, i) {
            i = end;
            continue;
        }
        if ident(i) == Some("thread_local") && punct(i + 1, '!') {
            out.push((toks[i].1, "thread_local!".to_string()));
        }
        // `static NAME:` or `static mut NAME:` (`&'static T` lexes as the
        // word `static` followed by a type, never by a name and a colon).
        let name_at = if ident(i + 1) == Some("mut") {
            i + 2
        } else {
            i + 1
        };
        if ident(i) == Some("static")
            && let Some(name) = ident(name_at)
            && punct(name_at + 1, ':')
        {
            let mut j = name_at + 2;
            let mut mutable = false;
            while j < toks.len() && !punct(j, '=') && !punct(j, ';') {
                mutable |= ident(j).is_some_and(interior_mutable);
                j += 1;
            }
            if mutable || ident(i + 1) == Some("mut") {
                out.push((toks[i].1, name.to_string()));
            }
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// If a `#[cfg(test)]` attribute starts at `i`: the index past the item it
/// marks (its first `;` outside braces, or its block).
fn past_cfg_test(toks: &[(Tok, usize)], i: usize) -> Option<usize> {
    let ident = |i: usize, w: &str| matches!(toks.get(i), Some((Tok::Ident(x), _)) if x == w);
    let punct = |i: usize, p: char| matches!(toks.get(i), Some((Tok::Punct(x), _)) if *x == p);
    let cfg_test = punct(i, '#')
        && punct(i + 1, '[')
        && ident(i + 2, "cfg")
        && punct(i + 3, '(')
        && ident(i + 4, "test")
        && punct(i + 5, ')')
        && punct(i + 6, ']');
    if !cfg_test {
        return None;
    }
    let mut i = i + 7;
    let mut depth = 0usize;
    while i < toks.len() {
        if punct(i, '{') {
            depth += 1;
        } else if punct(i, '}') {
            depth = depth.saturating_sub(1);
            if depth == 0 {
                break;
            }
        } else if punct(i, ';') && depth == 0 {
            break;
        }
        i += 1;
    }
    Some(i + 1)
}

#[test]
fn no_process_wide_state_in_the_store() {
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for f in source_tree()
        .iter()
        .filter(|f| allowed(NO_GLOBALS_IN, &f.path))
        .filter(|f| !f.path.ends_with("/tests.rs") && !f.path.contains("/tests/"))
    {
        for (line, name) in mutable_statics(&f.text) {
            if GLOBALS_ALLOWED
                .iter()
                .any(|(path, n, _)| *path == f.path && *n == name)
            {
                seen.insert((f.path.clone(), name));
                continue;
            }
            problems.push(format!(
                "{}:{line}: `static {name}` holds state for the whole process; make it a value \
                 the caller passes (a field of state::Store or StateRoot, or a parameter), or, \
                 if it is a cache the same for every caller, add it to GLOBALS_ALLOWED in \
                 tests/layers.rs with the reason",
                f.path
            ));
        }
    }
    for (path, name, _) in GLOBALS_ALLOWED {
        if !seen.contains(&(path.to_string(), name.to_string())) {
            problems.push(format!(
                "GLOBALS_ALLOWED names `static {name}` in {path}, which has no such static: \
                 remove the entry"
            ));
        }
    }
    assert_none("process-wide state in the store", &problems);
}

#[test]
fn the_static_scan_sees_mutable_statics_only() {
    let text = r#"
static PLAIN: &[&str] = &["a"];
pub static LIST: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());
fn f() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap()
}
fn g(x: &'static str) -> &'static str { x }
static COUNT: AtomicU64 = AtomicU64::new(0);
static mut RAW: u8 = 0;
// static COMMENTED: Mutex<()> = Mutex::new(());
thread_local! { static T: u8 = 0; }
#[cfg(test)]
mod tests {
    static IN_TEST: OnceLock<u8> = OnceLock::new();
}
static ONCE: OnceLock<Box<dyn Fn() + Send + Sync>> = OnceLock::new();
"#;
    let names: Vec<(usize, String)> = mutable_statics(text);
    assert_eq!(
        names,
        [
            (3, "LIST"),
            (5, "LOCK"),
            (9, "COUNT"),
            (10, "RAW"),
            (12, "thread_local!"),
            (17, "ONCE"),
        ]
        .map(|(l, n)| (l, n.to_string()))
    );
}

// ---- typed errors -----------------------------------------------------------------

/// The lines of non-test code in `text` with a `Result<_, String>`: an
/// error only a person can read, which no caller can decide on (issue 21,
/// "Typed boundaries"). `Result<T, String>` with any `T`, however nested.
fn string_errors(text: &str) -> Vec<usize> {
    let toks = outside_tests(lex(text));
    let ident = |i: usize, w: &str| matches!(toks.get(i), Some((Tok::Ident(x), _)) if x == w);
    let punct = |i: usize, p: char| matches!(toks.get(i), Some((Tok::Punct(x), _)) if *x == p);
    let mut out = Vec::new();
    for i in 0..toks.len() {
        if !(ident(i, "Result") && punct(i + 1, '<')) {
            continue;
        }
        // The last argument at depth 1, up to the matching `>`.
        let (mut depth, mut j, mut last_comma) = (1usize, i + 2, None);
        while j < toks.len() && depth > 0 {
            if punct(j, '<') {
                depth += 1;
            } else if punct(j, '>') {
                depth -= 1;
            } else if punct(j, ',') && depth == 1 {
                last_comma = Some(j);
            }
            j += 1;
        }
        if let Some(c) = last_comma
            && ident(c + 1, "String")
            && c + 3 == j
        {
            out.push(toks[i].1);
        }
    }
    out
}

#[test]
fn no_string_errors_in_library_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<(String, String)> = source_tree()
        .into_iter()
        .map(|f| (f.path, f.text))
        .collect();
    // The cluster crate is no layer of ours (it uses none of our crates),
    // but it is library code all the same.
    let mut stack = vec![root.join("crates/cluster/src")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read crates/cluster/src") {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                files.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    assert!(
        files
            .iter()
            .any(|(p, _)| p == "crates/cluster/src/session.rs")
    );
    let problems: Vec<String> = files
        .iter()
        .filter(|(p, _)| !p.ends_with("/tests.rs") && !p.contains("/tests/"))
        .flat_map(|(p, text)| {
            string_errors(text).into_iter().map(move |line| {
                format!(
                    "{p}:{line}: `Result<_, String>`: give the error a type (a thiserror enum \
                     naming what failed) so callers can decide on it; render it once"
                )
            })
        })
        .collect();
    assert_none("string errors in library code", &problems);
}

#[test]
fn the_string_error_scan_sees_them_only() {
    let text = r#"
fn a() -> Result<(), String> { Ok(()) }
fn b() -> Result<Vec<String>, Error> { todo!() }
fn c() -> std::result::Result<HashMap<String, u8>, String> { todo!() }
fn d() -> Result<String> { todo!() }
// fn e() -> Result<(), String>
#[cfg(test)]
mod tests {
    fn f() -> Result<(), String> { Ok(()) }
}
fn g() -> Result<(), Box<String>> { todo!() }
"#;
    assert_eq!(string_errors(text), vec![2, 4]);
}
