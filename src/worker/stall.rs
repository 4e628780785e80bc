//! Stall detection on the worker: a session that prints nothing (on either
//! pipe) for its agent's `stall_timeout` is stalled, as on the controller's
//! own host (the session machine's stall timer, crates/decide). The order
//! carries the timeout and the action ([`SessionSpec::stall_timeout_secs`],
//! [`SessionSpec::stall_action`]): with `stop` the worker ends the session
//! like at its timeout (SIGTERM to its group, SIGKILL after the grace) and
//! its end says [`Outcome::Stalled`], which the controller records as a
//! local stall stop (`ending_of` in src/daemon/remote.rs: the one mapping);
//! with `warn` it only logs each silence once, the controller's machine
//! raising the warning as it does for a local session.
//!
//! The timer runs here, where the output is read, not on the controller:
//! the controller sees the output later, through the stream, and not at
//! all while the worker's link to NATS is cut (the worker's spool keeps
//! it). The decision is [`step`], pure, with the time passed in; [`watch`]
//! carries it out.
//!
//! [`SessionSpec::stall_timeout_secs`]: agent_state_cluster::SessionSpec::stall_timeout_secs
//! [`SessionSpec::stall_action`]: agent_state_cluster::SessionSpec::stall_action
//! [`Outcome::Stalled`]: agent_state_cluster::Outcome::Stalled

use std::time::Duration;

use agent_state_cluster::{SessionSpec, StallAction};
use tokio::sync::watch;
use tokio::time::Instant;

/// A session's stall rule, from its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub after: Duration,
    /// `stall_action = "stop"`: the session is ended.
    pub stops: bool,
}

impl Stall {
    /// The rule of `spec`, if it has a stall timeout (0 counts as none).
    pub fn of(spec: &SessionSpec) -> Option<Stall> {
        let secs = spec.stall_timeout_secs.filter(|s| *s > 0)?;
        Some(Stall {
            after: Duration::from_secs(secs),
            stops: spec.stall_action == Some(StallAction::Stop),
        })
    }
}

/// What to do about the silence now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Look again at `until` (`None`: only when it prints again).
    Wait { until: Option<Instant> },
    /// Say this silence once; the session runs on.
    Warn { silent_for: Duration },
    /// End the session: stalled.
    Stop { silent_for: Duration },
}

/// The silence since `last_output` (or the start) at `now`; `warned`: this
/// silence was said already.
pub fn step(stall: &Stall, last_output: Instant, warned: bool, now: Instant) -> Step {
    let due = last_output + stall.after;
    if now < due {
        return Step::Wait { until: Some(due) };
    }
    // The record words it as its stall timeout (as the machine does), not
    // as the moment the timer was served.
    let silent_for = stall.after;
    match (stall.stops, warned) {
        (true, _) => Step::Stop { silent_for },
        (false, false) => Step::Warn { silent_for },
        (false, true) => Step::Wait { until: None },
    }
}

/// Resolves once the session is stalled and its rule stops it (never
/// otherwise), with the silence to record. `last_output` is set at every
/// chunk read from its pipes.
pub async fn watch(id: &str, stall: Stall, mut last_output: watch::Receiver<Instant>) -> Duration {
    let mut warned = false;
    let mut open = true;
    loop {
        let last = *last_output.borrow_and_update();
        match step(&stall, last, warned, Instant::now()) {
            Step::Stop { silent_for } => {
                super::log(format!(
                    "session {id}: printed nothing for its stall timeout ({}); ending it (stall_action stop)",
                    humantime::format_duration(silent_for)
                ));
                return silent_for;
            }
            Step::Warn { silent_for } => {
                super::log(format!(
                    "session {id}: printed nothing for its stall timeout ({}); it runs on (stall_action warn)",
                    humantime::format_duration(silent_for)
                ));
                warned = true;
            }
            Step::Wait { until } => {
                let sleep = async {
                    match until {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = sleep => {}
                    changed = last_output.changed(), if open => {
                        if changed.is_err() {
                            // The pipes are closed: no more output, the
                            // silence goes on.
                            open = false;
                        } else {
                            warned = false;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silence_past_the_stall_timeout_stops_or_warns_once() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let stop = Stall {
            after: s(60),
            stops: true,
        };
        let warn = Stall {
            after: s(60),
            stops: false,
        };
        // (rule, last output at, warned, now, step)
        let table: Vec<(Stall, Duration, bool, Duration, Step)> = vec![
            (
                stop,
                s(0),
                false,
                s(59),
                Step::Wait {
                    until: Some(t0 + s(60)),
                },
            ),
            (stop, s(0), false, s(60), Step::Stop { silent_for: s(60) }),
            // Served late: still worded as its stall timeout.
            (stop, s(0), false, s(95), Step::Stop { silent_for: s(60) }),
            // Output since: the timer counts from it.
            (
                stop,
                s(50),
                false,
                s(95),
                Step::Wait {
                    until: Some(t0 + s(110)),
                },
            ),
            (warn, s(0), false, s(61), Step::Warn { silent_for: s(60) }),
            // Said once per silence: then only new output wakes it.
            (warn, s(0), true, s(200), Step::Wait { until: None }),
        ];
        for (i, (rule, last, warned, now, want)) in table.into_iter().enumerate() {
            assert_eq!(step(&rule, t0 + last, warned, t0 + now), want, "row {i}");
        }
    }

    #[test]
    fn the_rule_comes_from_the_order() {
        let spec = |secs: Option<u64>, action: Option<StallAction>| {
            let mut spec =
                SessionSpec::from_order(&serde_json::json!({"command": "/bin/true"})).unwrap();
            spec.stall_timeout_secs = secs;
            spec.stall_action = action;
            spec
        };
        let table = [
            (None, None, None),
            (None, Some(StallAction::Stop), None),
            (Some(0), Some(StallAction::Stop), None),
            (
                Some(90),
                Some(StallAction::Stop),
                Some(Stall {
                    after: Duration::from_secs(90),
                    stops: true,
                }),
            ),
            // No action named: warn, the config's default.
            (
                Some(90),
                None,
                Some(Stall {
                    after: Duration::from_secs(90),
                    stops: false,
                }),
            ),
        ];
        for (secs, action, want) in table {
            assert_eq!(Stall::of(&spec(secs, action)), want, "{secs:?} {action:?}");
        }
    }
}
