//! The cycle file (seed 004's `current_cycle.md`), pure text: its opening
//! (the goal and a SIGNAL BLOCK handing to the Planner), each role's
//! contribution in order (its summary, confidence, risk, its answer, and
//! for the Actor the unified diff), the daemon's verdicts and the human's
//! answers. Each section starts with a marker comment so that a step
//! applied again after a crash is not appended twice.

use super::Cycle;
use crate::clock::Timestamp;
use crate::protocol::summary::{ContextSummary, Role};

/// The most of the Actor's diff kept in the cycle file.
pub const DIFF_CHARS: usize = 200_000;

/// The marker of a section (`<!-- agent-state: step 3 -->`).
pub fn marker(key: &str) -> String {
    format!("<!-- agent-state: {key} -->")
}

/// Whether the cycle file already has the section `key`.
pub fn has(text: &str, key: &str) -> bool {
    text.contains(&marker(key))
}

/// The file as a cycle starts.
pub fn opening(flow: &str, cycle: &Cycle) -> String {
    format!(
        "# Cycle {id} (flow {flow})\n\n{marker}\n**Goal**: {goal}\n**Started**: {at} by {by}\n\nAgent=Human | Cycle={id} | Step=0 | Next=Planner\n",
        id = cycle.id,
        marker = marker("goal"),
        goal = cycle.goal,
        at = cycle.started_at,
        by = cycle.started_by,
    )
}

/// What a role's answer adds.
pub struct Contribution<'a> {
    pub step: u32,
    pub role: Role,
    pub agent: &'a str,
    pub session_id: &'a str,
    pub at: Timestamp,
    pub summary: Option<&'a ContextSummary>,
    pub signal_line: Option<&'a str>,
    pub answer: &'a str,
    /// The Actor's diff: (lines, files, base commit, the unified diff):
    /// its step against the previous step's head.
    pub diff: Option<(u64, u64, &'a str, &'a str)>,
    /// The cycle's change so far against its base (lines, files).
    pub total: Option<(u64, u64)>,
    /// Where the cycle's branch stands after the step.
    pub branch: Option<&'a str>,
    /// What the daemon decided.
    pub verdict: &'a str,
}

/// The section of one answer.
pub fn contribution(c: &Contribution) -> String {
    let mut out = format!(
        "\n## Step {step} — {role} ({agent}, session {sid}, {at})\n\n{marker}\n",
        step = c.step,
        role = c.role.as_str(),
        agent = c.agent,
        sid = c.session_id,
        at = c.at,
        marker = marker(&format!("step {} {}", c.step, c.session_id)),
    );
    if let Some(s) = c.summary {
        if let Some(t) = s.summary_text() {
            out.push_str(&format!("**Summary**: {t}\n"));
        }
        if let Some(conf) = s.report_confidence() {
            out.push_str(&format!("**Confidence**: {conf}\n"));
        }
        if let Some(r) = s.report_risk() {
            out.push_str(&format!("**Risk**: {}\n", r.as_str()));
        }
        if let Some(b) = s.blocked_by() {
            out.push_str(&format!("**Blockers**: {b}\n"));
        }
    }
    out.push_str("\n### Answer\n\n");
    out.push_str(&fenced(&cut(c.answer, super::ANSWER_CHARS), "text"));
    if let Some((lines, files, base, diff)) = c.diff {
        let whole = match c.total {
            Some((l, f)) => format!("; the cycle so far: {l} line(s) in {f} file(s)"),
            None => String::new(),
        };
        out.push_str(&format!(
            "\n### Diff ({lines} changed line(s) in {files} file(s) against {base}{whole})\n\n"
        ));
        out.push_str(&fenced(&cut(diff, DIFF_CHARS), "diff"));
    }
    if let Some(b) = c.branch {
        out.push_str(&format!("\n**Branch**: {b}\n"));
    }
    if let Some(line) = c.signal_line {
        out.push_str(&format!("\n{line}\n"));
    }
    out.push_str(&format!("\n**Daemon**: {}\n", c.verdict));
    out
}

/// The diagnostics of each INSUFFICIENT verdict in a cycle file, in order.
pub fn insufficient_verdicts(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("**Daemon**: INSUFFICIENT: "))
        .map(str::to_string)
        .collect()
}

/// A note from the human or the daemon (approval, rejection, stop).
pub fn note(key: &str, title: &str, at: Timestamp, text: &str) -> String {
    format!(
        "\n## {title} ({at})\n\n{marker}\n{text}\n",
        marker = marker(key)
    )
}

/// `text` inside a code fence longer than any fence in it.
fn fenced(text: &str, lang: &str) -> String {
    let mut fence = "```".to_string();
    while text.contains(&fence) {
        fence.push('`');
    }
    format!("{fence}{lang}\n{}\n{fence}\n", text.trim_end())
}

fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}\n[… cut at {max} characters by agent-state]", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_outgrow_the_text_and_long_texts_are_cut() {
        assert_eq!(fenced("a ``` b", "text"), "````text\na ``` b\n````\n");
        let long = "x".repeat(10);
        assert!(cut(&long, 4).starts_with("xxxx\n[… cut at 4"));
        assert_eq!(cut("short", 10), "short");
        assert!(has(
            &note("approved", "Approved", Timestamp::now(), "ok"),
            "approved"
        ));
    }
}
