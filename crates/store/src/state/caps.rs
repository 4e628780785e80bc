//! Size caps on the texts that hooks, sessions and messages hand to the
//! state files, and the bounds on a session's cost and tokens: a summary, the next priority, handoff notes, a failure
//! reason, a task's description, context and outcome. A text over its cap
//! is cut (on a character boundary) and marked, never refused: a hook still
//! records the session whatever a script passes it, and a huge text cannot
//! bloat report.json, session.json, tasks.json, the journal or the prompt.
//!
//! Pure: the caps and the cut. Callers apply them where the text enters
//! (`hooks::finish_request`, `hooks::Facts::apply`, `tasks::add`,
//! `tasks::update`).

/// A text with a cap. README's "Size caps" table lists the same values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// report.json `last_session.summary`, one line.
    Summary,
    /// report.json `next_priority`, `blocked_by`.
    NextPriority,
    /// session.json `handoff_notes`, which end the next prompt.
    HandoffNotes,
    /// Why a session failed (session.json `reason`, the journal).
    Reason,
    /// A task's description (`--description`, a task message's subject).
    TaskDescription,
    /// A task's context (`--context`, a task message's body).
    TaskContext,
    /// A task's outcome (`task set --outcome`).
    TaskOutcome,
    /// A branch name given to `session end`.
    Branch,
}

impl Field {
    /// The most bytes kept.
    pub const fn limit(self) -> usize {
        match self {
            Field::Summary | Field::NextPriority | Field::TaskDescription | Field::TaskOutcome => {
                4 * 1024
            }
            Field::Branch => 1024,
            Field::Reason => 16 * 1024,
            Field::HandoffNotes | Field::TaskContext => 64 * 1024,
        }
    }
}

/// `text` cut to `field`'s cap, with a marker saying how much was cut:
/// `… [cut: 1200 bytes over the limit of 4096]`. Text within the cap is
/// returned unchanged.
pub fn cap(field: Field, text: String) -> String {
    let limit = field.limit();
    if text.len() <= limit {
        return text;
    }
    let over = text.len() - limit;
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = text;
    out.truncate(end);
    out.push_str(&format!("… [cut: {over} bytes over the limit of {limit}]"));
    out
}

/// [`cap`] for an optional text.
pub fn cap_opt(field: Field, text: Option<String>) -> Option<String> {
    text.map(|t| cap(field, t))
}

/// The most one session may cost: what `session end --cost-usd` and
/// Claude Code's result may say. Past it the value is refused at input; a
/// journal line from before the bound counts as this much (`usage`), so a
/// budget still trips and no total prints as `inf`.
pub const MAX_SESSION_COST_USD: f64 = 1_000_000.0;

/// The most tokens one session may use (a trillion), bounded like its cost.
pub const MAX_SESSION_TOKENS: u64 = 1_000_000_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_within_the_cap_is_untouched() {
        let text = "x".repeat(Field::Summary.limit());
        assert_eq!(cap(Field::Summary, text.clone()), text);
        assert_eq!(cap_opt(Field::Reason, None), None);
    }

    #[test]
    fn text_over_the_cap_is_cut_and_says_by_how_much() {
        let out = cap(Field::Branch, "b".repeat(1024 + 500));
        assert_eq!(
            out,
            format!(
                "{}… [cut: 500 bytes over the limit of 1024]",
                "b".repeat(1024)
            )
        );
    }

    #[test]
    fn the_cut_falls_on_a_character_boundary() {
        // 'é' is two bytes: byte 1024 is in the middle of the 513th.
        let out = cap(Field::Branch, format!("a{}", "é".repeat(600)));
        assert!(out.starts_with(&format!("a{}…", "é".repeat(511))), "{out}");
        assert!(
            out.ends_with("[cut: 177 bytes over the limit of 1024]"),
            "{out}"
        );
    }
}
