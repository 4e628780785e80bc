//! The tokens a session has used so far, read from its stream-json output
//! as it streams (Claude Code's `assistant` records carry each API call's
//! `usage`), against its `session_budget.max_tokens` (pure, bounded).
//!
//! One API call's message is printed as several `assistant` records (one
//! per content block) with the same `message.id` and the same usage: each id
//! counts once. Lines longer than [`MAX_LINE`] are skipped (a huge tool
//! result is not usage). Text output (`--output-format text` or `json`)
//! has no usage until the end: the meter then never trips.

use std::collections::VecDeque;

use serde_json::Value;

/// The longest line looked at.
const MAX_LINE: usize = 256 * 1024;
/// Message ids remembered to count each once (recent ones suffice: the
/// records of one message come together).
const IDS_KEPT: usize = 64;

#[derive(Debug, Default)]
pub struct Meter {
    limit: Option<u64>,
    line: Vec<u8>,
    skipping: bool,
    ids: VecDeque<String>,
    pub tokens: u64,
    tripped: bool,
}

impl Meter {
    pub fn new(limit: Option<u64>) -> Meter {
        Meter {
            limit,
            ..Meter::default()
        }
    }

    /// Feed a chunk of stdout. Returns the total the first time it reaches
    /// the limit.
    pub fn push(&mut self, chunk: &[u8]) -> Option<u64> {
        if self.limit.is_none() || self.tripped {
            return None;
        }
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            let (part, after) = rest.split_at(nl);
            if !self.skipping {
                self.line.extend_from_slice(part);
                let line = std::mem::take(&mut self.line);
                self.read_line(&line);
            }
            self.line.clear();
            self.skipping = false;
            rest = &after[1..];
        }
        if !self.skipping {
            if self.line.len() + rest.len() > MAX_LINE {
                self.line.clear();
                self.skipping = true;
            } else {
                self.line.extend_from_slice(rest);
            }
        }
        match self.limit {
            Some(limit) if self.tokens >= limit => {
                self.tripped = true;
                Some(self.tokens)
            }
            _ => None,
        }
    }

    fn read_line(&mut self, line: &[u8]) {
        let line = line.trim_ascii();
        // Cheap filter before any parse.
        if !line.starts_with(b"{") || !contains(line, b"\"usage\"") {
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            return;
        };
        if v.get("type").and_then(Value::as_str) != Some("assistant") {
            return;
        }
        let Some(message) = v.get("message") else {
            return;
        };
        if let Some(id) = message.get("id").and_then(Value::as_str) {
            if self.ids.iter().any(|seen| seen == id) {
                return;
            }
            if self.ids.len() == IDS_KEPT {
                self.ids.pop_front();
            }
            self.ids.push_back(id.to_string());
        }
        let Some(usage) = message.get("usage") else {
            return;
        };
        let count = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
        self.tokens = self
            .tokens
            .saturating_add(count("input_tokens"))
            .saturating_add(count("output_tokens"))
            .saturating_add(count("cache_creation_input_tokens"))
            .saturating_add(count("cache_read_input_tokens"));
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assistant(id: &str, input: u64, output: u64) -> String {
        format!(
            "{{\"type\":\"assistant\",\"message\":{{\"id\":\"{id}\",\"role\":\"assistant\",\"content\":[{{\"type\":\"text\",\"text\":\"hi\"}}],\"usage\":{{\"input_tokens\":{input},\"cache_read_input_tokens\":1000,\"output_tokens\":{output}}}}}}}\n"
        )
    }

    #[test]
    fn each_message_counts_once_and_the_limit_trips_once() {
        let mut m = Meter::new(Some(5000));
        assert_eq!(m.push(assistant("msg_1", 10, 90).as_bytes()), None);
        // The same message's next content block: not counted again.
        assert_eq!(m.push(assistant("msg_1", 10, 90).as_bytes()), None);
        assert_eq!(m.tokens, 1100);
        let two = assistant("msg_2", 2000, 1000);
        // Split anywhere.
        let (a, b) = two.as_bytes().split_at(37);
        assert_eq!(m.push(a), None);
        assert_eq!(m.push(b), Some(5100));
        assert_eq!(m.push(assistant("msg_3", 1, 1).as_bytes()), None, "once");
    }

    #[test]
    fn other_records_text_and_huge_lines_are_not_usage() {
        let mut m = Meter::new(Some(10));
        m.push(b"{\"type\":\"user\",\"message\":{\"usage\":{\"input_tokens\":99}}}\n");
        m.push(b"plain text with \"usage\" in it\n");
        let huge = format!(
            "{{\"type\":\"assistant\",\"x\":\"{}\"",
            "a".repeat(MAX_LINE)
        );
        m.push(huge.as_bytes());
        m.push(b",\"message\":{\"usage\":{\"input_tokens\":99}}}\n");
        assert_eq!(m.tokens, 0);
        assert_eq!(
            Meter::new(None).push(assistant("m", 99, 99).as_bytes()),
            None
        );
    }
}
