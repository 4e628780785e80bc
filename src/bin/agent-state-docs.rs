//! `agent-state-docs OUT_DIR`: the man pages and shell completions the
//! Debian package ships, generated from the CLI definition itself (so they
//! cannot drift from `--help`):
//!
//! - `OUT_DIR/man/agent-state.1` and one page per subcommand
//!   (`agent-state-session-begin.1`, …), by clap_mangen;
//! - `OUT_DIR/man/agent-state.toml.5`, the configuration, from the README's
//!   table of settings (the one place they are described);
//! - `OUT_DIR/completions/agent-state.bash`, `_agent-state` (zsh) and
//!   `agent-state.fish`, by clap_complete.
//!
//! A build tool, not installed: `packaging/build-deb.sh` runs it.

use std::path::{Path, PathBuf};

use clap::CommandFactory;
use clap_complete::Shell;

const README: &str = include_str!("../../README.md");

fn main() {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: agent-state-docs OUT_DIR");
        std::process::exit(64);
    };
    if let Err(e) = generate(&out) {
        eprintln!("agent-state-docs: {e}");
        std::process::exit(74);
    }
}

fn generate(out: &Path) -> std::io::Result<()> {
    let man = out.join("man");
    let completions = out.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let cmd = agent_state::cli::Cli::command().version(agent_state::cli::VERSION);
    clap_mangen::generate_to(cmd.clone(), &man)?;
    std::fs::write(man.join("agent-state.toml.5"), config_page())?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = cmd.clone();
        clap_complete::generate_to(shell, &mut cmd, "agent-state", &completions)?;
    }
    Ok(())
}

/// roff text from the README's Markdown: links as their text (a web
/// link's address after it), emphasis marks and backquotes dropped,
/// backslashes doubled, a line never starting with `.` or `'`.
fn roff(text: &str) -> String {
    let t = plain(text)
        .replace('\\', "\\\\")
        .replace('`', "")
        .replace("**", "");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// Markdown links `[text](target)` as `text`; a web address is kept after
/// it in parentheses (a page reader can follow it; an anchor is the
/// README's, which the man page does not have).
fn plain(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let link = after.find("](").and_then(|close| {
            let target = &after[close + 2..];
            target
                .find(')')
                .map(|end| (&after[..close], &target[..end], &target[end + 1..]))
        });
        match link {
            Some((label, target, tail)) if !label.contains('[') => {
                out.push_str(&rest[..open]);
                out.push_str(label);
                if target.starts_with("http") {
                    out.push_str(&format!(" ({target})"));
                }
                rest = tail;
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `agent-state.toml(5)`, from the README's "Configuration" section: its
/// prose, then each row of its table as a tagged paragraph.
fn config_page() -> String {
    let section = README
        .split("\n## Configuration\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .unwrap_or("");
    let mut page = format!(
        ".TH AGENT-STATE.TOML 5 \"\" \"agent-state {}\" \"File formats\"\n\
         .SH NAME\nagent-state.toml \\- the configuration of agent-state\n\
         .SH SYNOPSIS\n/etc/agent-state/config.toml\n\
         .SH DESCRIPTION\n\
         The configuration is TOML; every table and field is checked, and a bad file is reported in full, one line per problem with its path. Check a file with\n.B agent-state check\n\
         and apply it to a running daemon with\n.BR \"agent-state reload\" \" (or \" \"systemctl reload agent-state\" ).\n\
         .SH SETTINGS\n",
        agent_state::cli::VERSION
    );
    for line in section.lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split(" | ").collect();
        if !line.starts_with('|')
            || cells.len() != 3
            || cells[0].contains("---")
            || cells[0].trim() == "field"
        {
            continue;
        }
        page.push_str(&format!(
            ".TP\n.B {}\nDefault: {}.\n{}\n",
            roff(cells[0].trim()),
            roff(cells[1].trim()),
            roff(&cells[2].trim().replace("\\|", "|"))
        ));
    }
    page.push_str(".SH SEE ALSO\n.BR agent-state (1),\n/usr/share/doc/agent-state/README.md.gz\n");
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_becomes_plain_roff() {
        for (md, want) in [
            (
                "see [The subscription](#the-subscription)",
                "see The subscription",
            ),
            (
                "[nats](https://nats.io) and [x](#y).",
                "nats (https://nats.io) and x.",
            ),
            (
                "a `[[agent]]` entry, **not** `[defaults]`",
                "a [[agent]] entry, not [defaults]",
            ),
            ("[not a link] [a](b", "[not a link] [a](b"),
            (".starts with a dot", "\\&.starts with a dot"),
        ] {
            assert_eq!(roff(md), want, "{md}");
        }
    }

    #[test]
    fn the_config_page_has_no_markdown_links() {
        let page = config_page();
        assert!(page.contains(".B state_root"), "{page}");
        assert!(
            !page.contains("](#"),
            "a Markdown link in agent-state.toml(5)"
        );
        assert!(
            !page.contains("**"),
            "Markdown emphasis in agent-state.toml(5)"
        );
    }
}
