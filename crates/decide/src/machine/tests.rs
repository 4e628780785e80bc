//! The tests of `machine`: tables of `events → expected actions`,
//! the clock a value (seconds after `T0`). Actions are compared in a short
//! written form (`"record error SESSION_FAILED"`, `"timer +600s"`).

use super::*;
use crate::ending::SpawnFailure;

const T0: &str = "2026-11-26T12:00:00Z";
const SID: &str = "20261126-120000-rio";

fn at(secs: u64) -> DateTime<Utc> {
    let t0 = DateTime::parse_from_rfc3339(T0)
        .unwrap()
        .with_timezone(&Utc);
    later(t0, Duration::from_secs(secs))
}

fn since_t0(t: DateTime<Utc>) -> i64 {
    (t - at(0)).num_seconds()
}

fn settings() -> Settings {
    Settings {
        timeout: Duration::from_secs(600),
        kill_grace: Duration::from_secs(10),
        ..Settings::default()
    }
}

fn label(o: &Outcome) -> String {
    match o {
        Outcome::Completed => "completed".into(),
        Outcome::Timeout { .. } => "timeout".into(),
        Outcome::Stalled { .. } => "stalled".into(),
        Outcome::Error { code, .. } => format!("error {}", code.as_str()),
        Outcome::UsageHeld { .. } => "usage-held".into(),
        Outcome::LoginRequired { .. } => "login".into(),
        Outcome::Stopped { .. } => "stopped".into(),
        Outcome::Interrupted(_) => "interrupted".into(),
    }
}

fn brief(a: &Action) -> String {
    match a {
        Action::Launch {
            iteration,
            nudge: false,
        } => format!("launch {iteration}"),
        Action::Launch {
            iteration,
            nudge: true,
        } => format!("launch {iteration} nudge"),
        Action::StartVerify { iteration } => format!("verify {iteration}"),
        Action::Signal(Sig::Term) => "TERM".into(),
        Action::Signal(Sig::Kill) => "KILL".into(),
        Action::ArmTimer { at } => format!("timer +{}s", since_t0(*at)),
        Action::Record { outcome, .. } => format!("record {}", label(outcome)),
        Action::ReturnMessages {
            count_attempt: true,
        } => "return counting".into(),
        Action::ReturnMessages {
            count_attempt: false,
        } => "return".into(),
        Action::AcknowledgeMessages => "ack".into(),
        Action::Raise { code } => format!("raise {}", code.as_str()),
        Action::Retry { after } => format!("retry {}s", after.as_secs()),
        Action::Backoff { hold } => format!("backoff {}s", hold.as_secs()),
        Action::Disable => "disable".into(),
        Action::ClearFailures => "clear".into(),
        Action::HoldCredential { until: Some(t) } => format!("hold +{}s", since_t0(*t)),
        Action::HoldCredential { until: None } => "hold".into(),
        Action::ReleaseHold => "release".into(),
        Action::Escalate { code } => format!("escalate {}", code.as_str()),
        Action::KeepOrphan => "keep orphan".into(),
    }
}

type Step = (u64, Event, &'static [&'static str]);

/// Feeds `steps` to a new session and checks each answer; returns the
/// session and every action, for the checks a table cannot say.
fn run(what: &str, settings: Settings, steps: Vec<Step>) -> (Session, Vec<Action>) {
    let mut m = Session::new(settings, Streak::default());
    let mut all = Vec::new();
    for (i, (t, event, want)) in steps.into_iter().enumerate() {
        let shown = format!("{event:?}");
        let got = m.on(event, at(t));
        let got_brief: Vec<String> = got.iter().map(brief).collect();
        assert_eq!(
            got_brief, want,
            "{what}: step {i} ({shown} at +{t}s), state {:?}",
            m.state
        );
        all.extend(got);
    }
    (m, all)
}

fn begin() -> Event {
    Event::Begin {
        session_id: SID.into(),
    }
}

fn exited(code: i32) -> Event {
    Event::ChildExited {
        ending: Ending::Exited { code },
        facts: Facts {
            fingerprint: Some(7),
            ..Facts::default()
        },
    }
}

fn exited_with(ending: Ending, facts: Facts) -> Event {
    Event::ChildExited { ending, facts }
}

fn stderr(words: &str) -> Facts {
    Facts {
        fingerprint: Some(7),
        stderr_last_words: Some(words.into()),
        ..Facts::default()
    }
}

fn verify_failed(changed_workspace: bool) -> Event {
    Event::VerifyFinished(Verified::Failed {
        changed_workspace,
        describe: "`npm test`: exit 1".into(),
        tail: "1 failing".into(),
    })
}

fn records(actions: &[Action]) -> Vec<&Outcome> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Record { outcome, .. } => Some(outcome),
            _ => None,
        })
        .collect()
}

fn outcome_of(m: &Session) -> Option<&Outcome> {
    match &m.state {
        SessionState::Recording { outcome, .. } => Some(outcome),
        SessionState::Ended { outcome, .. } => outcome.as_ref(),
        _ => None,
    }
}

/// The launch every running case starts with.
fn started() -> Vec<Step> {
    vec![
        (0, begin(), &["launch 1"]),
        (0, Event::Launched, &["timer +600s"]),
    ]
}

fn with(mut steps: Vec<Step>, more: Vec<Step>) -> Vec<Step> {
    steps.extend(more);
    steps
}

#[test]
fn the_lifecycle_table() {
    let verify = Settings {
        verify: Some(IterationLimits {
            max_iterations: 3,
            stuck_threshold: 1,
        }),
        ..settings()
    };
    let stall = |stops| Settings {
        stall_timeout: Some(Duration::from_secs(60)),
        stall_stops: stops,
        ..settings()
    };
    let held = |admin_cap: bool| {
        Event::UsageLimitSeen(Held {
            until: (!admin_cap).then(|| at(3600)),
            admin_cap,
            reason: "waiting for the usage limit to reset at 13:00 UTC".into(),
        })
    };
    let login = Facts {
        claude: Some(ClaudeFailure::LoginRequired {
            message: "Not logged in · Please run /login".into(),
        }),
        claude_error: true,
        ..Facts::default()
    };
    let cases: Vec<(&str, Settings, Vec<Step>)> = vec![
        ("start", settings(), started()),
        (
            "success with stderr: exit 0 is completed whatever stderr says",
            settings(),
            with(
                started(),
                vec![
                    (
                        5,
                        exited_with(Ending::Exited { code: 0 }, stderr("warning: deprecated")),
                        &["record completed", "ack"],
                    ),
                    (6, Event::Recorded, &["clear", "release"]),
                ],
            ),
        ),
        (
            "failure: backs off, its messages counted",
            settings(),
            with(
                started(),
                vec![
                    (
                        5,
                        exited_with(Ending::Exited { code: 3 }, stderr("boom")),
                        &["record error SESSION_FAILED", "return counting"],
                    ),
                    (6, Event::Recorded, &["backoff 30s"]),
                ],
            ),
        ),
        (
            "timeout: TERM, grace, retried",
            settings(),
            with(
                started(),
                vec![
                    (300, Event::Deadline, &["timer +600s"]),
                    (600, Event::Deadline, &["TERM", "timer +610s"]),
                    (
                        605,
                        exited_with(Ending::TimedOut, Facts::default()),
                        &["record timeout", "return counting"],
                    ),
                    (606, Event::Recorded, &["retry 30s"]),
                ],
            ),
        ),
        (
            "stall with stall_action = stop: warned, stopped, killed, retried",
            stall(true),
            vec![
                (0, begin(), &["launch 1"]),
                (0, Event::Launched, &["timer +60s"]),
                (30, Event::Output(OutputSignal::Output), &[]),
                (60, Event::Deadline, &["timer +90s"]),
                (
                    90,
                    Event::Deadline,
                    &["raise SESSION_STALLED", "TERM", "timer +100s"],
                ),
                (100, Event::Deadline, &["KILL"]),
                (100, Event::GraceExpired, &[]),
                (
                    101,
                    exited_with(
                        Ending::Stalled {
                            silent_for: Duration::from_secs(60),
                        },
                        Facts::default(),
                    ),
                    &["record stalled", "return counting"],
                ),
                (102, Event::Recorded, &["retry 30s"]),
            ],
        ),
        (
            "stall with stall_action = warn: said once, the run goes on",
            stall(false),
            vec![
                (0, begin(), &["launch 1"]),
                (0, Event::Launched, &["timer +60s"]),
                // Looked at again a stall timeout later.
                (
                    60,
                    Event::Deadline,
                    &["raise SESSION_STALLED", "timer +120s"],
                ),
                (61, Event::Deadline, &["timer +121s"]),
                (70, Event::Output(OutputSignal::Progress), &["timer +130s"]),
                (80, exited(0), &["record completed", "ack"]),
            ],
        ),
        (
            "output while a stalled run is stopped keeps the grace timer",
            stall(true),
            vec![
                (0, begin(), &["launch 1"]),
                (0, Event::Launched, &["timer +60s"]),
                (
                    60,
                    Event::Deadline,
                    &["raise SESSION_STALLED", "TERM", "timer +70s"],
                ),
                (65, Event::Output(OutputSignal::Output), &[]),
                (70, Event::Deadline, &["KILL"]),
            ],
        ),
        (
            "stop: TERM, grace, KILL, stopped, messages back uncounted, no retry",
            settings(),
            with(
                started(),
                vec![
                    (
                        10,
                        Event::StopRequested {
                            by: StopBy::Operator,
                            reason: "wrong task".into(),
                        },
                        &["TERM", "timer +20s"],
                    ),
                    (
                        11,
                        Event::StopRequested {
                            by: StopBy::Operator,
                            reason: "again".into(),
                        },
                        &[],
                    ),
                    (20, Event::GraceExpired, &["KILL"]),
                    (21, Event::GraceExpired, &[]),
                    (
                        21,
                        exited_with(Ending::Stopped, Facts::default()),
                        &["record stopped", "return"],
                    ),
                    (22, Event::Recorded, &[]),
                ],
            ),
        ),
        (
            "usage limit: held, messages back uncounted, no streak",
            settings(),
            with(
                started(),
                vec![
                    (5, held(false), &[]),
                    (6, exited(1), &["record usage-held", "return"]),
                    (7, Event::Recorded, &["hold +3600s"]),
                ],
            ),
        ),
        (
            "admin cap: held with no end, escalated",
            settings(),
            with(
                started(),
                vec![
                    (5, held(true), &[]),
                    (6, exited(1), &["record usage-held", "return"]),
                    (7, Event::Recorded, &["hold", "escalate USAGE_DISABLED"]),
                ],
            ),
        ),
        (
            "a usage limit in the output of a session that succeeded is no limit",
            settings(),
            with(
                started(),
                vec![
                    (5, held(false), &[]),
                    (6, exited(0), &["record completed", "ack"]),
                ],
            ),
        ),
        (
            "login failure: the credential held, backed off, escalated",
            settings(),
            with(
                started(),
                vec![
                    (
                        5,
                        exited_with(Ending::Exited { code: 1 }, login.clone()),
                        &["record login", "return counting"],
                    ),
                    (
                        6,
                        Event::Recorded,
                        &["hold", "backoff 30s", "escalate AGENT_LOGIN_REQUIRED"],
                    ),
                ],
            ),
        ),
        (
            "missing command: messages untouched, disabled until it can run",
            settings(),
            vec![
                (0, begin(), &["launch 1"]),
                (
                    0,
                    exited_with(
                        Ending::SpawnFailed {
                            reason: "no such file: /usr/bin/claude".into(),
                            kind: SpawnFailure::NotFound,
                        },
                        Facts::default(),
                    ),
                    &["record error AGENT_NOT_FOUND", "return"],
                ),
                (0, Event::Recorded, &["disable", "escalate AGENT_NOT_FOUND"]),
            ],
        ),
        (
            "command not executable: the same",
            settings(),
            vec![
                (0, begin(), &["launch 1"]),
                (
                    0,
                    exited_with(
                        Ending::SpawnFailed {
                            reason: "permission denied: ./agent.sh".into(),
                            kind: SpawnFailure::PermissionDenied,
                        },
                        Facts::default(),
                    ),
                    &["record error AGENT_PERMISSION_DENIED", "return"],
                ),
                (
                    0,
                    Event::Recorded,
                    &["disable", "escalate AGENT_PERMISSION_DENIED"],
                ),
            ],
        ),
        (
            "verify passes",
            verify.clone(),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (
                        9,
                        Event::VerifyFinished(Verified::Passed),
                        &["record completed", "ack"],
                    ),
                    (9, Event::Recorded, &["clear", "release"]),
                ],
            ),
        ),
        (
            "verify fails to the last iteration",
            verify.clone(),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (9, verify_failed(true), &["launch 2"]),
                    (10, Event::Launched, &["timer +610s"]),
                    (20, exited(0), &["verify 2"]),
                    (25, verify_failed(true), &["launch 3"]),
                    (26, Event::Launched, &["timer +626s"]),
                    (30, exited(0), &["verify 3"]),
                    (
                        35,
                        verify_failed(true),
                        &["record error VERIFY_FAILED", "return counting"],
                    ),
                    (
                        35,
                        Event::Recorded,
                        &["backoff 30s", "escalate VERIFY_FAILED"],
                    ),
                ],
            ),
        ),
        (
            "verify stuck: nudged once, then given up",
            verify.clone(),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (9, verify_failed(false), &["launch 2 nudge"]),
                    (10, Event::Launched, &["timer +610s"]),
                    (20, exited(0), &["verify 2"]),
                    (
                        25,
                        verify_failed(false),
                        &["record error SESSION_STUCK", "return counting"],
                    ),
                    (
                        25,
                        Event::Recorded,
                        &["backoff 30s", "escalate SESSION_STUCK"],
                    ),
                ],
            ),
        ),
        (
            "stop while verifying: the verification is stopped, the session stopped",
            verify.clone(),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (
                        6,
                        Event::StopRequested {
                            by: StopBy::Operator,
                            reason: "enough".into(),
                        },
                        &["TERM", "timer +16s"],
                    ),
                    // The run's process is gone: only the verification ends.
                    (7, exited(0), &[]),
                    (16, Event::Deadline, &["KILL"]),
                    (17, verify_failed(true), &["record stopped", "return"]),
                    (18, Event::Recorded, &[]),
                ],
            ),
        ),
        (
            "COMPLETE, then a stop: completed, no verification",
            verify.clone(),
            with(
                started(),
                vec![
                    (3, Event::Output(OutputSignal::Complete), &[]),
                    (
                        4,
                        Event::StopRequested {
                            by: StopBy::Operator,
                            reason: "enough".into(),
                        },
                        &["TERM", "timer +14s"],
                    ),
                    (
                        5,
                        exited_with(Ending::Stopped, Facts::default()),
                        &["record completed", "ack"],
                    ),
                ],
            ),
        ),
        (
            "shutdown while verifying: interrupted",
            verify.clone(),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (6, Event::Shutdown, &["TERM", "timer +16s"]),
                    (
                        7,
                        Event::VerifyFinished(Verified::Passed),
                        &["record interrupted", "return"],
                    ),
                ],
            ),
        ),
        (
            "the script ends its session, then the child exits: one record, silence fine",
            settings(),
            with(
                started(),
                vec![
                    (
                        1,
                        Event::ScriptBegan {
                            session_id: SID.into(),
                        },
                        &[],
                    ),
                    (
                        4,
                        Event::ScriptEnded {
                            said: Said::AsHeard,
                        },
                        &[],
                    ),
                    (
                        5,
                        exited_with(
                            Ending::Exited { code: 0 },
                            Facts {
                                empty: true,
                                ..Facts::default()
                            },
                        ),
                        &["record completed", "ack"],
                    ),
                    (6, Event::Recorded, &["clear", "release"]),
                ],
            ),
        ),
        (
            "the child exits, then the script's end arrives: one record",
            settings(),
            with(
                started(),
                vec![
                    (5, exited(0), &["record completed", "ack"]),
                    (
                        5,
                        Event::ScriptEnded {
                            said: Said::AsHeard,
                        },
                        &[],
                    ),
                    (6, Event::Recorded, &["clear", "release"]),
                    (
                        6,
                        Event::ScriptEnded {
                            said: Said::AsHeard,
                        },
                        &[],
                    ),
                ],
            ),
        ),
        (
            "the script's own end does not skip verify",
            verify.clone(),
            with(
                started(),
                vec![
                    (
                        4,
                        Event::ScriptEnded {
                            said: Said::AsHeard,
                        },
                        &[],
                    ),
                    (5, exited(0), &["verify 1"]),
                    (
                        6,
                        Event::ScriptEnded {
                            said: Said::AsHeard,
                        },
                        &[],
                    ),
                    (
                        9,
                        Event::VerifyFinished(Verified::Passed),
                        &["record completed", "ack"],
                    ),
                ],
            ),
        ),
        (
            "a failure the script recorded backs off whatever the exit status",
            settings(),
            with(
                started(),
                vec![
                    (
                        4,
                        Event::ScriptFailed {
                            said: Said::AsHeard,
                            reason: "no work tree".into(),
                        },
                        &[],
                    ),
                    (
                        4,
                        Event::ScriptEnded {
                            said: Said::AsHeard,
                        },
                        &[],
                    ),
                    (
                        5,
                        exited(0),
                        &["record error SESSION_FAILED", "return counting"],
                    ),
                    (6, Event::Recorded, &["backoff 30s"]),
                ],
            ),
        ),
        (
            "shutdown while recording: recorded once, as decided",
            settings(),
            with(
                started(),
                vec![
                    (5, exited(0), &["record completed", "ack"]),
                    (5, Event::Shutdown, &[]),
                    (6, Event::Recorded, &["clear", "release"]),
                    (7, Event::Shutdown, &[]),
                ],
            ),
        ),
        (
            "shutdown while running: interrupted, messages back uncounted",
            settings(),
            with(
                started(),
                vec![
                    (5, Event::Shutdown, &["TERM", "timer +15s"]),
                    (
                        6,
                        exited_with(Ending::Stopped, Facts::default()),
                        &["record interrupted", "return"],
                    ),
                    (7, Event::Recorded, &[]),
                ],
            ),
        ),
        (
            "orphan found at start: an interrupted record",
            settings(),
            vec![
                (
                    0,
                    Event::OrphanFound {
                        session_id: SID.into(),
                    },
                    &["record interrupted", "return"],
                ),
                (1, Event::Recorded, &[]),
            ],
        ),
        (
            "lock busy: no launch, nothing recorded, a retry later",
            settings(),
            vec![
                (0, begin(), &["launch 1"]),
                (0, Event::LockBusy, &["retry 2s"]),
                (1, Event::Launched, &[]),
                (1, exited(0), &[]),
            ],
        ),
        (
            "COMPLETE counts though the timeout ended it",
            settings(),
            with(
                started(),
                vec![
                    (100, Event::Output(OutputSignal::Complete), &[]),
                    (600, Event::Deadline, &["TERM", "timer +610s"]),
                    (
                        601,
                        exited_with(Ending::TimedOut, Facts::default()),
                        &["record completed", "ack"],
                    ),
                ],
            ),
        ),
        (
            "an API error is retried by the matrix",
            settings(),
            with(
                started(),
                vec![
                    (
                        5,
                        exited_with(
                            Ending::Exited { code: 1 },
                            Facts {
                                claude: Some(ClaudeFailure::Api {
                                    message: "529 overloaded".into(),
                                    retryable: true,
                                }),
                                claude_error: true,
                                fingerprint: Some(1),
                                ..Facts::default()
                            },
                        ),
                        &["record error AGENT_API_ERROR", "return counting"],
                    ),
                    (6, Event::Recorded, &["retry 30s"]),
                ],
            ),
        ),
        (
            "a record that cannot be written keeps the session an orphan",
            settings(),
            with(
                started(),
                vec![
                    (
                        5,
                        exited(2),
                        &["record error SESSION_FAILED", "return counting"],
                    ),
                    (6, Event::RecordFailed, &["keep orphan", "backoff 30s"]),
                    (7, Event::Recorded, &[]),
                ],
            ),
        ),
    ];
    for (what, settings, steps) in cases {
        let (_, actions) = run(what, settings, steps);
        assert!(records(&actions).len() <= 1, "{what}: more than one record");
    }
}

#[test]
fn illegal_transitions_change_nothing() {
    let steps = with(
        started(),
        vec![
            (1, Event::Recorded, &[]),
            (1, Event::VerifyFinished(Verified::Passed), &[]),
            (1, Event::Launched, &[]),
            (1, Event::LockBusy, &[]),
            (1, Event::GraceExpired, &[]),
            (
                1,
                Event::OrphanFound {
                    session_id: SID.into(),
                },
                &[],
            ),
            (5, exited(0), &["record completed", "ack"]),
            (6, exited(0), &[]),
            (6, exited(3), &[]),
            (
                6,
                Event::StopRequested {
                    by: StopBy::Operator,
                    reason: "late".into(),
                },
                &[],
            ),
            (7, Event::Recorded, &["clear", "release"]),
            (8, Event::Recorded, &[]),
            (8, exited(0), &[]),
            (8, Event::Deadline, &[]),
        ],
    );
    let (m, _) = run("illegal", settings(), steps);
    assert_eq!(outcome_of(&m), Some(&Outcome::Completed));
    // A session not begun takes no exit, no record.
    let mut q = Session::new(settings(), Streak::default());
    assert!(q.on(exited(0), at(0)).is_empty());
    assert!(q.on(Event::Recorded, at(0)).is_empty());
    assert_eq!(*q.state(), SessionState::Queued);
    // The script of another session joins nothing.
    let mut r = Session::running(settings(), Streak::default(), SID.into(), at(0), 1);
    r.on(
        Event::ScriptBegan {
            session_id: "other".into(),
        },
        at(1),
    );
    let SessionState::Running(run) = r.state() else {
        panic!("{:?}", r.state())
    };
    assert!(!run.script_began);
}

#[test]
fn the_reason_is_rendered_from_the_outcome() {
    let (m, actions) = run(
        "failure",
        settings(),
        with(
            started(),
            vec![(
                5,
                exited_with(Ending::Exited { code: 3 }, stderr("boom")),
                &["record error SESSION_FAILED", "return counting"],
            )],
        ),
    );
    let o = records(&actions)[0];
    assert_eq!(
        o.reason(),
        "the session command exited with status 3; its stderr ends: boom"
    );
    assert_eq!(o.status(), SessionStatus::Error);
    assert!(o.counts_as_error());
    assert_eq!(outcome_of(&m), Some(o));
    // A success never quotes stderr.
    let (_, actions) = run(
        "success",
        settings(),
        with(
            started(),
            vec![(
                5,
                exited_with(Ending::Exited { code: 0 }, stderr("warning")),
                &["record completed", "ack"],
            )],
        ),
    );
    let o = records(&actions)[0];
    assert_eq!(o.reason(), "completed");
    assert_eq!(o.status(), SessionStatus::Completed);
    // The script's own words for its failure.
    let (_, actions) = run(
        "script failed",
        settings(),
        with(
            started(),
            vec![
                (
                    4,
                    Event::ScriptFailed {
                        said: Said::AsHeard,
                        reason: "no work tree".into(),
                    },
                    &[],
                ),
                (
                    5,
                    exited(0),
                    &["record error SESSION_FAILED", "return counting"],
                ),
            ],
        ),
    );
    assert_eq!(records(&actions)[0].reason(), "no work tree");
}

#[test]
fn each_outcome_has_its_status_code_and_error_count() {
    let secs = Duration::from_secs;
    let cases: &[(Outcome, SessionStatus, Option<Code>, bool, &str)] = &[
        (
            Outcome::Completed,
            SessionStatus::Completed,
            None,
            false,
            "completed",
        ),
        (
            Outcome::Timeout { after: secs(600) },
            SessionStatus::Timeout,
            Some(Code::SessionTimeout),
            true,
            "timed out after 10m",
        ),
        (
            Outcome::Stalled {
                silent_for: secs(60),
            },
            SessionStatus::Error,
            Some(Code::SessionStalled),
            true,
            "stalled: no output for 1m",
        ),
        (
            Outcome::Error {
                code: Code::SessionEmptyOutput,
                reason: "the session printed nothing".into(),
            },
            SessionStatus::Error,
            Some(Code::SessionEmptyOutput),
            true,
            "the session printed nothing",
        ),
        (
            Outcome::UsageHeld {
                until: None,
                admin_cap: false,
                reason: "waiting for the reset".into(),
            },
            SessionStatus::Error,
            Some(Code::UsageLimit),
            false,
            "waiting for the reset",
        ),
        (
            Outcome::UsageHeld {
                until: None,
                admin_cap: true,
                reason: "an admin disabled usage".into(),
            },
            SessionStatus::Error,
            Some(Code::UsageDisabled),
            false,
            "an admin disabled usage",
        ),
        (
            Outcome::LoginRequired {
                message: "Claude Code is not logged in: Not logged in".into(),
            },
            SessionStatus::Error,
            Some(Code::AgentLoginRequired),
            true,
            "Claude Code is not logged in: Not logged in",
        ),
        (
            Outcome::Stopped {
                by: StopBy::Operator,
                reason: "stopped by root with `agent-state stop`: wrong task".into(),
            },
            SessionStatus::Error,
            None,
            false,
            "stopped by root with `agent-state stop`: wrong task",
        ),
        (
            Outcome::Interrupted(Interruption::Shutdown),
            SessionStatus::Timeout,
            None,
            true,
            "interrupted: the daemon stopped before the session ended",
        ),
        (
            Outcome::Interrupted(Interruption::Orphan),
            SessionStatus::Timeout,
            Some(Code::SessionInterrupted),
            true,
            "interrupted: its end could not be recorded when it ended (see errors.jsonl)",
        ),
    ];
    for (o, status, code, error, reason) in cases {
        assert_eq!(o.status(), *status, "{o:?}");
        assert_eq!(o.code(), *code, "{o:?}");
        assert_eq!(o.counts_as_error(), *error, "{o:?}");
        assert_eq!(o.reason(), *reason, "{o:?}");
        assert_eq!(o.is_completed(), *o == Outcome::Completed);
    }
}

#[test]
fn the_streak_is_the_matrixs_and_survives_the_session() {
    // Timeouts: retried twice (the matrix's policy), then escalated.
    let mut streak = Streak::default();
    let mut nexts = Vec::new();
    for i in 0..3u64 {
        let mut m = Session::new(settings(), streak);
        m.on(begin(), at(0));
        m.on(Event::Launched, at(0));
        m.on(Event::Deadline, at(600));
        let ended = m.on(
            exited_with(
                Ending::TimedOut,
                Facts {
                    fingerprint: Some(i),
                    ..Facts::default()
                },
            ),
            at(601),
        );
        let Action::Record { verdict, .. } = &ended[0] else {
            panic!("{ended:?}")
        };
        assert_eq!(verdict.attempt, i as u32 + 1);
        nexts.push(
            m.on(Event::Recorded, at(602))
                .iter()
                .map(brief)
                .collect::<Vec<_>>(),
        );
        streak = m.into_streak();
    }
    assert_eq!(
        nexts,
        [
            vec!["retry 30s"],
            vec!["retry 60s"],
            vec!["backoff 120s", "escalate SESSION_TIMEOUT"],
        ]
    );
    assert_eq!(streak.failures, 3);
    // A usage limit is not a failure: the streak is untouched.
    let mut m = Session::new(settings(), streak.clone());
    m.on(begin(), at(0));
    m.on(
        Event::UsageLimitSeen(Held {
            until: None,
            admin_cap: false,
            reason: "held".into(),
        }),
        at(1),
    );
    m.on(exited(1), at(2));
    assert_eq!(*m.streak(), streak);
}

/// The machine as the daemon's loop feeds it live (issue 21): output is
/// told at the machine's timers with the time it was printed, the
/// iterations are the machine's (each run's end, each verification, told
/// as they come), and a stop may come before the launch is reported.
#[test]
fn the_live_table() {
    let live = |stops| Settings {
        stall_timeout: Some(Duration::from_secs(60)),
        stall_stops: stops,
        ..settings()
    };
    let stop = || Event::StopRequested {
        by: StopBy::Operator,
        reason: "wrong task".into(),
    };
    let verify = Settings {
        verify: Some(IterationLimits {
            max_iterations: 3,
            stuck_threshold: 1,
        }),
        holds_end: true,
        ..settings()
    };
    let cases: Vec<(&str, Settings, Vec<Step>)> = vec![
        (
            "output told at the timers with its own time: a stall at its exact time, warned once a silence",
            live(false),
            vec![
                (0, begin(), &["launch 1"]),
                (0, Event::Launched, &["timer +60s"]),
                (50, Event::Output(OutputSignal::Output), &[]),
                (60, Event::Deadline, &["timer +110s"]),
                (
                    110,
                    Event::Deadline,
                    &["raise SESSION_STALLED", "timer +170s"],
                ),
                (150, Event::Output(OutputSignal::Output), &["timer +210s"]),
                (170, Event::Deadline, &["timer +210s"]),
                (
                    210,
                    Event::Deadline,
                    &["raise SESSION_STALLED", "timer +270s"],
                ),
            ],
        ),
        (
            "output told late never moves the silence before the run's start",
            live(true),
            vec![
                (0, begin(), &["launch 1"]),
                (100, Event::Launched, &["timer +160s"]),
                // The previous run's output, told now.
                (90, Event::Output(OutputSignal::Output), &[]),
                (
                    160,
                    Event::Deadline,
                    &["raise SESSION_STALLED", "TERM", "timer +170s"],
                ),
                (170, Event::Deadline, &["KILL"]),
                (
                    171,
                    exited_with(
                        Ending::Stalled {
                            silent_for: Duration::from_secs(60),
                        },
                        Facts::default(),
                    ),
                    &["record stalled", "return counting"],
                ),
            ],
        ),
        (
            "iterations: verify has no timer, the next run its own timeout",
            verify.clone(),
            with(
                started(),
                vec![
                    (100, exited(0), &["verify 1"]),
                    // The first run's timer, late: nothing to end.
                    (600, Event::Deadline, &[]),
                    (640, verify_failed(true), &["launch 2"]),
                    (650, Event::Launched, &["timer +1250s"]),
                    (1249, Event::Deadline, &["timer +1250s"]),
                    (1250, Event::Deadline, &["TERM", "timer +1260s"]),
                ],
            ),
        ),
        (
            "a run ended for its time (COMPLETE said) is verified and iterates",
            verify.clone(),
            with(
                started(),
                vec![
                    (600, Event::Deadline, &["TERM", "timer +610s"]),
                    (601, Event::Output(OutputSignal::Complete), &[]),
                    (
                        601,
                        exited_with(Ending::TimedOut, stderr("bye")),
                        &["verify 1"],
                    ),
                    (605, verify_failed(true), &["launch 2"]),
                    (606, Event::Launched, &["timer +1206s"]),
                ],
            ),
        ),
        (
            "a stop during verification: TERM (the verification's), grace, KILL",
            verify.clone(),
            with(
                started(),
                vec![
                    (100, exited(0), &["verify 1"]),
                    (110, stop(), &["TERM", "timer +120s"]),
                    (120, Event::Deadline, &["KILL"]),
                    // No run follows a stop.
                    (121, Event::Launched, &[]),
                    (
                        122,
                        Event::VerifyFinished(Verified::Passed),
                        &["record stopped", "return"],
                    ),
                ],
            ),
        ),
        (
            "a stop while a timeout's SIGTERM is out: no iteration may follow",
            verify.clone(),
            with(
                started(),
                vec![
                    (600, Event::Deadline, &["TERM", "timer +610s"]),
                    (605, Event::Shutdown, &["TERM"]),
                    // COMPLETE said: the timeout's run alone would be
                    // verified; after a shutdown it is completed as it is.
                    (606, Event::Output(OutputSignal::Complete), &[]),
                    (610, Event::Deadline, &["KILL"]),
                    // The runner says why it signalled: the timeout's order.
                    (
                        611,
                        exited_with(Ending::TimedOut, Facts::default()),
                        &["record completed", "ack"],
                    ),
                ],
            ),
        ),
        (
            "a stop before the launch is reported: TERM, grace, KILL, then stopped",
            settings(),
            vec![
                (0, begin(), &["launch 1"]),
                (5, stop(), &["TERM", "timer +15s"]),
                (15, Event::Deadline, &["KILL"]),
                (
                    16,
                    exited_with(Ending::Stopped, Facts::default()),
                    &["record stopped", "return"],
                ),
            ],
        ),
        (
            "a shutdown before the launch is reported: interrupted, no retry",
            settings(),
            vec![
                (0, begin(), &["launch 1"]),
                (5, Event::Shutdown, &["TERM", "timer +15s"]),
                (
                    6,
                    exited_with(Ending::Stopped, Facts::default()),
                    &["record interrupted", "return"],
                ),
                (7, Event::Recorded, &[]),
            ],
        ),
    ];
    for (what, settings, steps) in cases {
        run(what, settings, steps);
    }
}

/// The end of a live session decided by its machine (issue 21): the races
/// between an exit and the daemon's SIGTERM, a script that recorded its own
/// end before the daemon's, and the iterations' end.
#[test]
fn the_end_table() {
    let verify = Settings {
        verify: Some(IterationLimits {
            max_iterations: 3,
            stuck_threshold: 1,
        }),
        holds_end: true,
        ..settings()
    };
    let stop = || Event::StopRequested {
        by: StopBy::Operator,
        reason: "wrong task".into(),
    };
    let failed = || Event::ScriptFailed {
        said: Said::AsHeard,
        reason: "no work tree".into(),
    };
    let cases: Vec<(&str, Settings, Vec<Step>)> = vec![
        (
            "an exit racing a stop's SIGTERM (the runner sent none): judged by its exit, not verified",
            verify.clone(),
            with(
                started(),
                vec![
                    (100, stop(), &["TERM", "timer +110s"]),
                    (101, exited(0), &["record completed", "ack"]),
                ],
            ),
        ),
        (
            "an exit racing a shutdown's SIGTERM, failing: its failure",
            settings(),
            with(
                started(),
                vec![
                    (100, Event::Shutdown, &["TERM", "timer +110s"]),
                    (
                        101,
                        exited(1),
                        &["record error SESSION_FAILED", "return counting"],
                    ),
                ],
            ),
        ),
        (
            "an exit racing the timeout's SIGTERM: its own exit, verified",
            verify.clone(),
            with(
                started(),
                vec![
                    (600, Event::Deadline, &["TERM", "timer +610s"]),
                    (601, exited(0), &["verify 1"]),
                ],
            ),
        ),
        (
            "the runner signalled for the stop: stopped, whatever the exit code",
            settings(),
            with(
                started(),
                vec![
                    (100, stop(), &["TERM", "timer +110s"]),
                    (
                        101,
                        exited_with(Ending::Stopped, Facts::default()),
                        &["record stopped", "return"],
                    ),
                ],
            ),
        ),
        (
            "its script ended the session, then it lingered past its timeout: the script's record",
            settings(),
            with(
                started(),
                vec![
                    (
                        100,
                        Event::ScriptEnded {
                            said: Said::AsHeard,
                        },
                        &[],
                    ),
                    (600, Event::Deadline, &["TERM", "timer +610s"]),
                    (
                        602,
                        exited_with(Ending::TimedOut, Facts::default()),
                        &["record completed", "ack"],
                    ),
                ],
            ),
        ),
        (
            "its script's end said before the timeout but heard after it began (the file ended before the daemon's note): the script's record",
            settings(),
            with(
                started(),
                vec![
                    (600, Event::Deadline, &["TERM", "timer +610s"]),
                    (
                        600,
                        Event::ScriptEnded {
                            said: Said::BeforeStop,
                        },
                        &[],
                    ),
                    (
                        602,
                        exited_with(Ending::TimedOut, Facts::default()),
                        &["record completed", "ack"],
                    ),
                ],
            ),
        ),
        (
            "the same heard with no evidence: the trap's answer, a timeout",
            settings(),
            with(
                started(),
                vec![
                    (600, Event::Deadline, &["TERM", "timer +610s"]),
                    (
                        600,
                        Event::ScriptEnded {
                            said: Said::AsHeard,
                        },
                        &[],
                    ),
                    (
                        602,
                        exited_with(Ending::TimedOut, Facts::default()),
                        &["record timeout", "return counting"],
                    ),
                ],
            ),
        ),
        (
            "a script's failure said before a shutdown, heard after: the script's failure",
            settings(),
            with(
                started(),
                vec![
                    (200, Event::Shutdown, &["TERM", "timer +210s"]),
                    (
                        200,
                        Event::ScriptFailed {
                            reason: "no work tree".into(),
                            said: Said::BeforeStop,
                        },
                        &[],
                    ),
                    (
                        201,
                        exited_with(Ending::Stopped, Facts::default()),
                        &["record error SESSION_FAILED", "return counting"],
                    ),
                ],
            ),
        ),
        (
            "its script ended the session, then an operator's stop: the script's record",
            settings(),
            with(
                started(),
                vec![
                    (
                        100,
                        Event::ScriptEnded {
                            said: Said::AsHeard,
                        },
                        &[],
                    ),
                    (200, stop(), &["TERM", "timer +210s"]),
                    (
                        201,
                        exited_with(Ending::Stopped, Facts::default()),
                        &["record completed", "ack"],
                    ),
                ],
            ),
        ),
        (
            "its script recorded its failure, then a shutdown: the script's failure",
            settings(),
            with(
                started(),
                vec![
                    (100, failed(), &[]),
                    (200, Event::Shutdown, &["TERM", "timer +210s"]),
                    (
                        201,
                        exited_with(Ending::Stopped, Facts::default()),
                        &["record error SESSION_FAILED", "return counting"],
                    ),
                ],
            ),
        ),
        (
            "the trap's `session fail` after the timeout's SIGTERM: a timeout",
            settings(),
            with(
                started(),
                vec![
                    (600, Event::Deadline, &["TERM", "timer +610s"]),
                    (601, failed(), &[]),
                    (
                        602,
                        exited_with(Ending::TimedOut, Facts::default()),
                        &["record timeout", "return counting"],
                    ),
                ],
            ),
        ),
        (
            "the daemon holds the end (verify): a script's end is its word; a stop is a stop",
            verify.clone(),
            with(
                started(),
                vec![
                    (
                        100,
                        Event::ScriptEnded {
                            said: Said::AsHeard,
                        },
                        &[],
                    ),
                    (200, stop(), &["TERM", "timer +210s"]),
                    (
                        201,
                        exited_with(Ending::Stopped, Facts::default()),
                        &["record stopped", "return"],
                    ),
                ],
            ),
        ),
        (
            "a script's end, then verified: one record, completed",
            verify.clone(),
            with(
                started(),
                vec![
                    (
                        100,
                        Event::ScriptEnded {
                            said: Said::AsHeard,
                        },
                        &[],
                    ),
                    (101, exited(0), &["verify 1"]),
                    (
                        150,
                        Event::VerifyFinished(Verified::Passed),
                        &["record completed", "ack"],
                    ),
                    (151, Event::Recorded, &["clear", "release"]),
                ],
            ),
        ),
    ];
    for (what, settings, steps) in cases {
        run(what, settings, steps);
    }
    // A verified session ends the failure streak, as a success the matrix
    // judged does.
    let streak = Streak {
        failures: 2,
        ..Streak::default()
    };
    let mut m = Session::new(verify, streak);
    m.on(begin(), at(0));
    m.on(Event::Launched, at(0));
    assert_eq!(brief(&m.on(exited(0), at(10))[0]), "verify 1");
    m.on(Event::VerifyFinished(Verified::Passed), at(20));
    assert_eq!(*m.streak(), Streak::default());
}

/// When a session should have ended by (the health monitor's backstop):
/// each run's own timeout and grace, nothing while a verification runs.
#[test]
fn due_to_end_follows_each_run_not_the_session() {
    let verify = Settings {
        verify: Some(IterationLimits {
            max_iterations: 3,
            stuck_threshold: 1,
        }),
        ..settings()
    };
    let mut m = Session::new(verify, Streak::default());
    let due = |m: &Session| m.due_to_end().map(since_t0);
    assert_eq!(due(&m), None, "queued");
    m.on(begin(), at(0));
    assert_eq!(due(&m), None, "preparing: the hatch expiry's");
    m.on(Event::Launched, at(0));
    assert_eq!(due(&m), Some(610), "the timeout and the kill grace");
    m.on(exited(0), at(500));
    assert_eq!(due(&m), None, "verifying: verify_timeout's");
    m.on(verify_failed(true), at(899));
    assert_eq!(due(&m), None, "preparing iteration 2");
    m.on(Event::Launched, at(900));
    assert_eq!(due(&m), Some(1510), "iteration 2's own timeout");
    m.on(Event::Deadline, at(1500));
    assert_eq!(due(&m), Some(1510), "the grace of its SIGTERM");
    m.on(exited(0), at(1505));
    assert_eq!(due(&m), None, "recording");
}

/// The iterations as the machine orders them (issue 21): each run's end
/// and each verification told to it, it answers verify, the next iteration
/// (with the nudge or not) or the one record.
#[test]
fn the_verify_table() {
    let limits = |max_iterations, stuck_threshold| Settings {
        verify: Some(IterationLimits {
            max_iterations,
            stuck_threshold,
        }),
        holds_end: true,
        ..settings()
    };
    let timed_out = || {
        Event::VerifyFinished(Verified::Failed {
            changed_workspace: true,
            describe: "`make check`: timed out after 5s".into(),
            tail: String::new(),
        })
    };
    let cases: Vec<(&str, Settings, Vec<Step>)> = vec![
        (
            "a failed verification, then one that passes: two runs, one record",
            limits(3, 1),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (9, verify_failed(true), &["launch 2"]),
                    (10, Event::Launched, &["timer +610s"]),
                    (20, exited(0), &["verify 2"]),
                    (
                        25,
                        Event::VerifyFinished(Verified::Passed),
                        &["record completed", "ack"],
                    ),
                    (25, Event::Recorded, &["clear", "release"]),
                ],
            ),
        ),
        (
            "a verification that timed out is a failure: the next iteration; no session timer meanwhile",
            limits(3, 1),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (700, Event::Deadline, &[]),
                    (701, timed_out(), &["launch 2"]),
                ],
            ),
        ),
        (
            "out of iterations: VERIFY_FAILED after the last",
            limits(1, 1),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (
                        9,
                        verify_failed(true),
                        &["record error VERIFY_FAILED", "return counting"],
                    ),
                ],
            ),
        ),
        (
            "stuck with no nudge allowed (threshold 0): SESSION_STUCK at the first unchanged",
            limits(5, 0),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (
                        9,
                        verify_failed(false),
                        &["record error SESSION_STUCK", "return counting"],
                    ),
                ],
            ),
        ),
        (
            "a change resets the count: unchanged, changed, unchanged is nudged again",
            limits(5, 1),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (9, verify_failed(false), &["launch 2 nudge"]),
                    (10, Event::Launched, &["timer +610s"]),
                    (20, exited(0), &["verify 2"]),
                    (21, verify_failed(true), &["launch 3"]),
                    (22, Event::Launched, &["timer +622s"]),
                    (30, exited(0), &["verify 3"]),
                    (31, verify_failed(false), &["launch 4 nudge"]),
                ],
            ),
        ),
        (
            "a run that failed is not verified: its failure, no iteration",
            limits(3, 1),
            with(
                started(),
                vec![(
                    5,
                    exited_with(Ending::Exited { code: 1 }, stderr("boom")),
                    &["record error SESSION_FAILED", "return counting"],
                )],
            ),
        ),
        (
            "a shutdown while the next iteration is prepared: interrupted, no run",
            limits(3, 1),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (9, verify_failed(true), &["launch 2"]),
                    (10, Event::Shutdown, &["TERM", "timer +20s"]),
                    (
                        11,
                        exited_with(Ending::Stopped, Facts::default()),
                        &["record interrupted", "return"],
                    ),
                ],
            ),
        ),
        (
            "a stop during a later iteration's verification: stopped",
            limits(3, 1),
            with(
                started(),
                vec![
                    (5, exited(0), &["verify 1"]),
                    (9, verify_failed(true), &["launch 2"]),
                    (10, Event::Launched, &["timer +610s"]),
                    (20, exited(0), &["verify 2"]),
                    (
                        21,
                        Event::StopRequested {
                            by: StopBy::Operator,
                            reason: "enough".into(),
                        },
                        &["TERM", "timer +31s"],
                    ),
                    (
                        22,
                        Event::VerifyFinished(Verified::Passed),
                        &["record stopped", "return"],
                    ),
                ],
            ),
        ),
    ];
    for (what, settings, steps) in cases {
        run(what, settings, steps);
    }
}
