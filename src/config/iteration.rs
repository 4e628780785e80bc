//! The iteration loop's settings (issue 12, seed 000): `verify` commands run
//! in the workspace after a session that ended well, `max_iterations`,
//! `verify_timeout`, `stuck_threshold`. In `[defaults]` or an `[[agent]]`.

use std::time::Duration;

use super::Validator;

/// Without `verify`, a session is one iteration and nothing is verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IterationSettings {
    /// Each an argv, run in order without a shell; the first failure stops.
    pub verify: Vec<Vec<String>>,
    /// The time limit of each verification command.
    pub verify_timeout: Duration,
    /// Iterations (runs of the command) per session at most.
    pub max_iterations: u32,
    /// Iterations in a row that change nothing in the workspace before the
    /// next gets a nudge; one more and the loop stops.
    pub stuck_threshold: u32,
    /// Continue Claude Code's conversation (`{claude_session}` becomes
    /// `--resume ID`) in a verification retry and a timeout retry.
    pub resume: bool,
}

impl Default for IterationSettings {
    fn default() -> Self {
        IterationSettings {
            verify: Vec::new(),
            verify_timeout: Duration::from_secs(600),
            max_iterations: 3,
            stuck_threshold: 2,
            resume: false,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(super) struct RawIteration<'a> {
    pub verify: Option<&'a Vec<Vec<String>>>,
    pub verify_timeout: Option<&'a str>,
    pub max_iterations: Option<i64>,
    pub stuck_threshold: Option<i64>,
    pub resume: Option<bool>,
}

impl Validator {
    pub(super) fn iteration(
        &mut self,
        field: &dyn Fn(&str) -> String,
        raw: RawIteration<'_>,
        base: Option<&IterationSettings>,
    ) -> IterationSettings {
        let base = base.cloned().unwrap_or_default();
        let verify = match raw.verify {
            Some(v) => {
                for (i, cmd) in v.iter().enumerate() {
                    if cmd.is_empty() || cmd[0].trim().is_empty() {
                        self.problem(
                            format!("{}[{i}]", field("verify")),
                            "is empty; write a command as a list, e.g. [\"cargo\", \"test\"]",
                        );
                    }
                }
                v.clone()
            }
            None => base.verify.clone(),
        };
        let verify_timeout = match raw.verify_timeout {
            Some(t) => self.duration(&field("verify_timeout"), Some(t), "10m"),
            None => base.verify_timeout,
        };
        let max_iterations = self.count(
            &field("max_iterations"),
            raw.max_iterations,
            Some(base.max_iterations),
            3,
            1..=100,
        );
        let stuck_threshold = self.count(
            &field("stuck_threshold"),
            raw.stuck_threshold,
            Some(base.stuck_threshold),
            2,
            1..=100,
        );
        IterationSettings {
            verify,
            verify_timeout,
            max_iterations,
            stuck_threshold,
            resume: raw.resume.unwrap_or(base.resume),
        }
    }
}
