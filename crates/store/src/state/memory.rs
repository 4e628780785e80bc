//! `memory.md`: the agent's cross-session memory, in Markdown.
//!
//! The agent edits this file too, so the tool's only operation is to append
//! lines under a named `## ` section (creating the section at the end if it is
//! missing). Every other byte of the file stays as it was.

use std::path::Path;

use crate::agent_name::AgentName;
use crate::error::{Error, Result};

/// The five sections of the seed's memory.md, in order.
pub const SECTIONS: [&str; 5] = [
    "Cross-Session Patterns",
    "Dead Ends (don't re-investigate)",
    "Open Questions",
    "Corrections",
    "Cross-Agent Flags Received",
];

pub const FLAGS_SECTION: &str = "Cross-Agent Flags Received";

/// The memory.md a new agent starts with.
pub fn template(agent: &AgentName) -> String {
    let mut text = format!("# {} — Operational Memory\n", agent.title());
    for section in SECTIONS {
        text.push_str(&format!("\n## {section}\n"));
    }
    text
}

/// `text` with `entries` (one line each) appended to the end of the content of
/// section `## {section}`. Pure; see the module docs for what "append" means.
pub fn append_under(text: &str, section: &str, entries: &[String]) -> String {
    let heading = format!("## {section}");
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut block = String::new();
    for entry in entries {
        block.push_str(entry.trim_end_matches('\n'));
        block.push('\n');
    }
    let Some(start) = lines.iter().position(|l| l.trim_end() == heading) else {
        let mut out = text.to_string();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&heading);
        out.push('\n');
        out.push_str(&block);
        return out;
    };
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("# ") || l.starts_with("## "))
        .map(|i| start + 1 + i)
        .unwrap_or(lines.len());
    // Insert after the section's last non-blank line, so the blank line(s)
    // separating it from the next heading stay where they were.
    let insert_at = (start + 1..end)
        .rev()
        .find(|&i| !lines[i].trim().is_empty())
        .map(|i| i + 1)
        .unwrap_or(start + 1);
    let mut out = String::with_capacity(text.len() + block.len() + 1);
    for line in &lines[..insert_at] {
        out.push_str(line);
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&block);
    for line in &lines[insert_at..] {
        out.push_str(line);
    }
    out
}

/// Whether section `## {section}` of `text` already has an entry whose
/// words after its `- DATE (INSTANCE): ` head are `words` (trimmed; the
/// same discovery found again on another day or by another session).
/// Pure.
pub fn has_entry(text: &str, section: &str, words: &str) -> bool {
    let heading = format!("## {section}");
    let words = words.trim();
    text.lines()
        .skip_while(|l| l.trim_end() != heading)
        .skip(1)
        .take_while(|l| !l.starts_with("# ") && !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("- "))
        .any(|entry| {
            let body = match entry.split_once("): ") {
                Some((head, body)) if head.contains(" (") => body,
                _ => entry,
            };
            body.trim() == words
        })
}

/// The largest memory.md read back for an append.
pub const MAX_MEMORY: u64 = 16 << 20;

/// Append `entry` under `section` of the memory file at `path` unless the
/// section has an entry with the same `words` already ([`has_entry`]);
/// whether it was added. Call with the agent lock held.
pub fn append_new_entry(
    store: &super::Store,
    path: &Path,
    section: &str,
    entry: &str,
    words: &str,
) -> Result<bool> {
    let text = read(path)?;
    if has_entry(&text, section, words) {
        return Ok(false);
    }
    let updated = append_under(&text, section, &[entry.to_string()]);
    super::atomic::write_file(store, path, updated.as_bytes(), super::STATE_FILE_MODE)?;
    Ok(true)
}

/// Append `entries` under `section` of the memory file at `path`.
/// Call with the agent lock held.
pub fn append_entries(
    store: &super::Store,
    path: &Path,
    section: &str,
    entries: &[String],
) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let text = read(path)?;
    let updated = append_under(&text, section, entries);
    super::atomic::write_file(store, path, updated.as_bytes(), super::STATE_FILE_MODE)
}

/// The memory file's text (none yet: empty), refused over [`MAX_MEMORY`].
fn read(path: &Path) -> Result<String> {
    Ok(match crate::fsx::read_limited(path, MAX_MEMORY)? {
        None => String::new(),
        Some((bytes, false)) => String::from_utf8_lossy(&bytes).into_owned(),
        Some((_, true)) => {
            return Err(Error::Data(format!(
                "{} is over {} MiB: trim it (it is the agent's own notes) before more is added",
                path.display(),
                MAX_MEMORY >> 20
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(before: &str, section: &str, after: &str) {
        assert_eq!(append_under(before, section, &["- new".to_string()]), after);
    }

    #[test]
    fn an_entry_is_found_by_its_words_in_its_section_only() {
        let text = "## Discoveries\n- 2026-11-25 (rio-003): markets lead\n- plain words\n\n## Other\n- 2026-11-25 (rio-004): elsewhere\n";
        for (section, words, found) in [
            ("Discoveries", "markets lead", true),
            ("Discoveries", "  markets lead ", true),
            ("Discoveries", "plain words", true),
            ("Discoveries", "markets", false),
            ("Discoveries", "elsewhere", false),
            ("Other", "elsewhere", true),
            ("Missing", "markets lead", false),
        ] {
            assert_eq!(has_entry(text, section, words), found, "{section}: {words}");
        }
    }

    #[test]
    fn appends_at_the_end_of_a_section() {
        check(
            "# R\n\n## A\n- one\n\n## B\n- two\n",
            "A",
            "# R\n\n## A\n- one\n- new\n\n## B\n- two\n",
        );
        check("# R\n\n## A\n\n## B\n", "A", "# R\n\n## A\n- new\n\n## B\n");
        check("# R\n\n## B\n- two\n", "B", "# R\n\n## B\n- two\n- new\n");
    }

    #[test]
    fn subsections_belong_to_their_section() {
        check(
            "## A\n### sub\n- x\n\n## B\n",
            "A",
            "## A\n### sub\n- x\n- new\n\n## B\n",
        );
    }

    #[test]
    fn missing_sections_are_created_at_the_end() {
        check("# R\n", "Discoveries", "# R\n\n## Discoveries\n- new\n");
        check("# R", "Discoveries", "# R\n\n## Discoveries\n- new\n");
        check("", "Discoveries", "## Discoveries\n- new\n");
    }

    #[test]
    fn a_last_line_without_newline_is_completed_not_changed() {
        check("## A\n- one", "A", "## A\n- one\n- new\n");
    }

    #[test]
    fn template_has_the_five_sections() {
        let t = template(&AgentName::parse("rio").unwrap());
        assert!(t.starts_with("# Rio — Operational Memory\n"));
        for s in SECTIONS {
            assert!(t.contains(&format!("\n## {s}\n")));
        }
    }
}
