//! The daemon: wakes agents on their schedules and inbox messages and runs
//! their sessions. (Being built; see the submodules.)

pub mod adopt;
pub mod alerts;
pub mod cgroup;
pub mod clock;
pub mod core;
pub mod credential;
// The economy's pure decisions live in crates/decide (`crate::economy`).
pub use crate::economy;
pub mod effects;
pub mod exporter;
pub mod exposition;
pub mod failure;
pub mod fanout;
pub mod files;
pub mod fleet;
pub mod health;
pub mod logging;
pub mod machine;
pub mod memory;
pub mod meter;
pub mod output;
pub mod release;
pub mod remote;
pub mod rotation;
pub mod runnable;
pub mod runner;
pub mod service;
pub mod session;
pub mod stop;
pub mod systemd;
pub mod verify;
pub mod watcher;
pub mod workspaces;

#[cfg(test)]
mod size {
    //! No type in `src/daemon/` has more than [`MOST_METHODS`] methods: a
    //! type that grows past it owns more than one concern (issue 21).

    use std::collections::BTreeMap;
    use std::path::Path;

    const MOST_METHODS: usize = 30;

    /// Methods per type: each `fn` at the first level of an inherent
    /// `impl Type {` block (rustfmt's layout), over every file below `dir`.
    fn methods(dir: &Path, counts: &mut BTreeMap<String, Vec<String>>) {
        for entry in std::fs::read_dir(dir).expect("src/daemon is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                methods(&path, counts);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            let mut inside: Option<String> = None;
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix("impl") {
                    inside = inherent_impl(rest);
                    continue;
                }
                if line.starts_with('}') {
                    inside = None;
                    continue;
                }
                let Some(name) = &inside else { continue };
                let first = line.strip_prefix("    ").unwrap_or("");
                if first.starts_with(' ') {
                    continue;
                }
                let words: Vec<&str> = first.split_whitespace().collect();
                let at = words.iter().position(|w| *w == "fn").filter(|&i| {
                    words[..i]
                        .iter()
                        .all(|w| w.starts_with("pub") || matches!(*w, "async" | "const" | "unsafe"))
                });
                if let Some(i) = at {
                    counts.entry(name.clone()).or_default().push(format!(
                        "{} ({})",
                        words.get(i + 1).unwrap_or(&"?"),
                        path.display()
                    ));
                }
            }
        }
    }

    /// The type of an inherent `impl` line (after `impl`), `None` for a
    /// trait's impl.
    fn inherent_impl(rest: &str) -> Option<String> {
        let mut rest = rest;
        if let Some(generics) = rest.strip_prefix('<') {
            let mut depth = 1;
            let end = generics.char_indices().find_map(|(i, c)| {
                match c {
                    '<' => depth += 1,
                    '>' => depth -= 1,
                    _ => {}
                }
                (depth == 0).then_some(i + 1)
            })?;
            rest = &generics[end..];
        }
        let rest = rest.trim();
        if rest.contains(" for ") || !rest.ends_with('{') {
            return None;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        (!name.is_empty()).then_some(name)
    }

    #[test]
    fn inherent_impls_are_told_from_trait_impls() {
        assert_eq!(inherent_impl(" Daemon {").as_deref(), Some("Daemon"));
        assert_eq!(inherent_impl("<'a> View<'a> {").as_deref(), Some("View"));
        assert_eq!(inherent_impl(" OutputObserver for Observer {"), None);
        assert_eq!(inherent_impl("<T: Clone> From<T> for X {"), None);
    }

    #[test]
    fn no_type_in_the_daemon_has_more_than_30_methods() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/daemon");
        let mut counts = BTreeMap::new();
        methods(&dir, &mut counts);
        assert!(
            counts.get("Daemon").is_some_and(|m| m.len() > 5),
            "the count found the loop's methods: {counts:?}"
        );
        let mut over = Vec::new();
        for (name, fns) in &counts {
            if fns.len() > MOST_METHODS {
                over.push(format!(
                    "{name}: {} methods (at most {MOST_METHODS}): {fns:#?}",
                    fns.len()
                ));
            }
        }
        assert!(
            over.is_empty(),
            "split these types into parts that own their state:\n{}",
            over.join("\n")
        );
    }
}
