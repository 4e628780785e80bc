//! The tests of `flow::route`: what an answer means (`decide`, never a
//! guess) and what the cycle does next (`plan`) through a whole loop.

use super::*;
use crate::agent_name::AgentName;
use crate::protocol::summary::{parse_context_summary, parse_signal_block};

fn flow() -> FlowSettings {
    let n = |s: &str| AgentName::parse(s).unwrap();
    FlowSettings {
        name: n("docs"),
        planner: n("theseus"),
        actor: n("rio"),
        judge: n("leo"),
        human: n("marcus"),
        max_insufficient: 3,
        max_lines: 150,
        max_files: 2,
        low: Gate::Auto,
        medium: Gate::Approve,
        high: Gate::Block,
        on_approve: Vec::new(),
        on_approve_timeout: std::time::Duration::from_secs(60),
        approvers: Vec::new(),
        on_insufficient: crate::config::OnInsufficient::Rollback,
        limits: crate::config::RoleLimits::default(),
        actor_workspace: None,
        publish: None,
    }
}

fn cycle(role: Role, step: u32) -> Cycle {
    let now = Timestamp::parse("2026-11-24T10:00:00Z").unwrap();
    Cycle {
        id: "2026-11-24-001".into(),
        goal: "Add a FAQ".into(),
        started_at: now,
        started_by: "marcus".into(),
        status: CycleStatus::Running,
        step,
        awaiting: Some(Awaiting {
            role,
            agent: super::super::agent_of(&flow(), role).to_string(),
            message_id: "m".into(),
            since: now,
        }),
        insufficient: 0,
        risk: None,
        reason: None,
        actor_work: None,
        branch: None,
        updated_at: now,
        question_key: String::new(),
    }
}

fn decide_on(role: Role, step: u32, output: &str, scope: Option<Scope>) -> Decision {
    let f = flow();
    let c = cycle(role, step);
    let agent = super::super::agent_of(&f, role).to_string();
    decide(&Answered {
        flow: &f,
        cycle: &c,
        agent: &agent,
        session_id: "20261124-100000",
        block: parse_signal_block(output),
        summary: parse_context_summary(output).and_then(|r| r.ok()),
        scope: scope.map(Ok),
        work: RoleWork::default(),
    })
}

fn stop_reason(d: Decision) -> String {
    match d {
        Decision::Stop { reason } => reason,
        other => panic!("expected a stop, got {other:?}"),
    }
}

const ID: &str = "2026-11-24-001";

#[test]
fn the_loop_goes_planner_actor_judge_and_the_judge_decides() {
    let line = |agent: &str, step: &str, risk: &str, next: &str| {
        format!(
            "Agent={agent} | Cycle={ID} | Step={step} | Confidence=4 | Risk={risk} | Next={next}"
        )
    };
    assert_eq!(
        decide_on(
            Role::Planner,
            1,
            &line("Planner", "1", "low", "Actor"),
            None
        ),
        Decision::Handoff { to: Role::Actor }
    );
    assert_eq!(
        decide_on(
            Role::Actor,
            2,
            &line("Actor", "2", "low", "Judge"),
            Some(Scope {
                lines: 150,
                files: 2
            })
        ),
        Decision::Handoff { to: Role::Judge }
    );
    assert_eq!(
        decide_on(
            Role::Judge,
            3,
            &line("Judge", "PASS", "medium", "Human"),
            None
        ),
        Decision::Pass {
            risk: RiskLevel::Medium
        }
    );
    let judged = decide_on(
        Role::Judge,
        3,
        &format!(
            "## Context Summary\n**Goal**: g\n**Current State**: tests fail\n**Next Agent**: Planner\n**Confidence**: 3\n**Risk Level**: low\n**Blockers**: no test for the empty case\n\n{}",
            line("Judge", "INSUFFICIENT", "low", "Planner")
        ),
        None,
    );
    assert_eq!(
        judged,
        Decision::Insufficient {
            diagnostics: "no test for the empty case — tests fail (goal: g)".into(),
            by_daemon: false
        }
    );
    // An agent may sign with its own name and hand over by name.
    assert_eq!(
        decide_on(
            Role::Planner,
            1,
            &format!("Agent=theseus | Cycle={ID} | Step=1 | Next=rio"),
            None
        ),
        Decision::Handoff { to: Role::Actor }
    );
    // Planner and Actor may ask the human.
    assert!(matches!(
        decide_on(
            Role::Planner,
            1,
            &line("Planner", "1", "low", "Human"),
            None
        ),
        Decision::AskHuman { .. }
    ));
}

#[test]
fn the_daemon_measures_the_actor_before_the_judge() {
    let line = format!("Agent=Actor | Cycle={ID} | Step=2 | Risk=low | Next=Judge");
    for scope in [
        Scope {
            lines: 151,
            files: 1,
        },
        Scope { lines: 3, files: 3 },
    ] {
        match decide_on(Role::Actor, 2, &line, Some(scope)) {
            Decision::Insufficient {
                diagnostics,
                by_daemon: true,
            } => {
                assert!(
                    diagnostics.contains(&format!(
                        "{} changed line(s) in {} file(s)",
                        scope.lines, scope.files
                    )),
                    "{diagnostics}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn never_a_guess() {
    let r = stop_reason(decide_on(Role::Judge, 3, "All good, ship it.", None));
    assert!(r.contains("without a SIGNAL BLOCK"), "{r}");
    let r = stop_reason(decide_on(
        Role::Judge,
        3,
        &format!("Agent=Judge | Cycle={ID} | Confidence=9 | Next=Human"),
        None,
    ));
    assert!(
        r.contains("malformed SIGNAL BLOCK") && r.contains("Confidence"),
        "{r}"
    );
    let r = stop_reason(decide_on(
        Role::Judge,
        3,
        &format!("Agent=Actor | Cycle={ID} | Risk=low | Next=Human"),
        None,
    ));
    assert!(
        r.contains("`Agent=Actor`") && r.contains("answers as the Judge"),
        "{r}"
    );
    let r = stop_reason(decide_on(
        Role::Judge,
        3,
        "Agent=Judge | Cycle=2026-11-23-004 | Risk=low | Next=Human",
        None,
    ));
    assert!(r.contains("cycle `2026-11-23-004`"), "{r}");
    let r = stop_reason(decide_on(
        Role::Planner,
        1,
        &format!("Agent=Planner | Cycle={ID} | Step=1 | Next=vida"),
        None,
    ));
    assert!(
        r.contains("`Next=vida`") && r.contains("not a role or an agent of flow docs"),
        "{r}"
    );
    let r = stop_reason(decide_on(
        Role::Planner,
        1,
        &format!("Agent=Planner | Cycle={ID} | Step=1 | Next=Judge"),
        None,
    ));
    assert!(r.contains("the Planner hands over to the Actor"), "{r}");
    let r = stop_reason(decide_on(
        Role::Judge,
        3,
        &format!("Agent=Judge | Cycle={ID} | Step=PASS | Next=Human"),
        None,
    ));
    assert!(r.contains("without a risk level"), "{r}");
    let r = stop_reason(decide_on(
        Role::Judge,
        3,
        &format!("Agent=Judge | Cycle={ID} | Step=PASS | Risk=low | Next=Planner"),
        None,
    ));
    assert!(r.contains("hands back to the Planner"), "{r}");
    let r = stop_reason(decide_on(
        Role::Judge,
        3,
        &format!("Agent=Judge | Cycle={ID} | Step=INSUFFICIENT | Risk=low | Next=Human"),
        None,
    ));
    assert!(r.contains("as for a PASS"), "{r}");
}

#[test]
fn plans_follow_the_gates_and_the_streak() {
    let f = flow();
    let now = Timestamp::parse("2026-11-24T11:00:00Z").unwrap();
    let cx = Context {
        flow: &f,
        cycle_file: "/x/current_cycle.md",
        summary: Some("done".into()),
        earlier_blockers: vec!["first".into(), "second".into()],
        now,
    };
    let judge = cycle(Role::Judge, 3);
    assert!(matches!(
        plan(
            &judge,
            &Decision::Pass {
                risk: RiskLevel::Low
            },
            &cx
        )
        .next,
        Next::Approve
    ));
    let p = plan(
        &judge,
        &Decision::Pass {
            risk: RiskLevel::Medium,
        },
        &cx,
    );
    match &p.next {
        Next::Open(c) => assert_eq!(c.status, CycleStatus::AwaitingApproval),
        other => panic!("{other:?}"),
    }
    assert_eq!(p.messages.len(), 1);
    assert_eq!(p.messages[0].to, "marcus");
    assert_eq!(p.messages[0].kind, "question");
    let p = plan(
        &judge,
        &Decision::Pass {
            risk: RiskLevel::High,
        },
        &cx,
    );
    assert!(matches!(&p.next, Next::Open(c) if c.status == CycleStatus::Blocked));
    assert!(p.messages[0].high && p.messages[0].kind == "flag");
    // INSUFFICIENT: back to the Planner until max_insufficient (3 here).
    let mut c = judge.clone();
    for n in 1..=3 {
        let p = plan(
            &c,
            &Decision::Insufficient {
                diagnostics: "why".into(),
                by_daemon: false,
            },
            &cx,
        );
        let Next::Open(next) = p.next else { panic!() };
        assert_eq!(next.insufficient, n);
        if n < 3 {
            assert_eq!(next.status, CycleStatus::Running);
            assert_eq!(next.awaiting.as_ref().unwrap().role, Role::Planner);
            assert_eq!(p.messages[0].to, "theseus");
            assert_eq!(
                p.messages[0].id,
                format!("flow-docs-{ID}-{}-task", next.step)
            );
            c = *next;
            c.awaiting.as_mut().unwrap().role = Role::Judge;
        } else {
            assert_eq!(next.status, CycleStatus::Paused);
            assert!(next.awaiting.is_none());
            assert_eq!(p.messages[0].to, "marcus");
            assert!(
                p.messages[0].body.contains("1. first\n2. second\n3. why\n"),
                "{}",
                p.messages[0].body
            );
        }
    }
    // A PASS ends the streak.
    let mut streak = judge.clone();
    streak.insufficient = 2;
    let p = plan(
        &streak,
        &Decision::Pass {
            risk: RiskLevel::Medium,
        },
        &cx,
    );
    assert!(matches!(&p.next, Next::Open(c) if c.insufficient == 0));
}

#[test]
fn the_roles_limits_make_a_step_insufficient_with_the_figures() {
    let answer =
        |role: Role, step: u32, line: &str, work: RoleWork, limits: crate::config::RoleLimits| {
            let mut f = flow();
            f.limits = limits;
            let c = cycle(role, step);
            let agent = super::super::agent_of(&f, role).to_string();
            decide(&Answered {
                flow: &f,
                cycle: &c,
                agent: &agent,
                session_id: "s",
                block: parse_signal_block(line),
                summary: None,
                scope: (role == Role::Actor).then_some(Ok(Scope { lines: 3, files: 1 })),
                work,
            })
        };
    let planner = format!("Agent=Planner | Cycle={ID} | Step=1 | Next=Actor");
    let actor = format!("Agent=Actor | Cycle={ID} | Step=2 | Next=Judge");
    let judge_pass = format!("Agent=Judge | Cycle={ID} | Step=PASS | Risk=low | Next=Human");
    let judge_no = format!("Agent=Judge | Cycle={ID} | Step=INSUFFICIENT | Next=Planner");
    let defaults = crate::config::RoleLimits::default;
    let docs = || crate::config::RoleLimits {
        actor_paths: vec!["docs/**".into(), "*.md".into()],
        ..defaults()
    };
    let judge_may = || crate::config::RoleLimits {
        judge_writes_code: true,
        ..defaults()
    };
    let plan = |n| RoleWork {
        plan_lines: n,
        ..RoleWork::default()
    };
    let paths = |p: &[&str]| RoleWork {
        paths: p.iter().map(|s| s.to_string()).collect(),
        ..RoleWork::default()
    };
    let judge = |lines, files| RoleWork {
        judge: Some(Scope { lines, files }),
        ..RoleWork::default()
    };
    // (role, step, block, work, limits, the diagnostics' words; "" = no limit hit)
    let table: Vec<(Role, u32, &str, RoleWork, crate::config::RoleLimits, &str)> = vec![
        (Role::Planner, 1, &planner, plan(50), defaults(), ""),
        (
            Role::Planner,
            1,
            &planner,
            plan(51),
            defaults(),
            "the Planner's plan is 51 line(s); the limit is 50",
        ),
        (
            Role::Actor,
            2,
            &actor,
            paths(&["src/main.rs"]),
            defaults(),
            "",
        ),
        (
            Role::Actor,
            2,
            &actor,
            paths(&["docs/faq.md", "NOTES.md"]),
            docs(),
            "",
        ),
        (
            Role::Actor,
            2,
            &actor,
            paths(&["docs/faq.md", "src/a.rs"]),
            docs(),
            "changed 1 path(s) outside limits.actor_paths (docs/**, *.md): src/a.rs",
        ),
        (Role::Judge, 3, &judge_pass, judge(0, 0), defaults(), ""),
        (
            Role::Judge,
            3,
            &judge_pass,
            RoleWork::default(),
            defaults(),
            "",
        ),
        (
            Role::Judge,
            3,
            &judge_pass,
            judge(4, 1),
            defaults(),
            "the Judge changed 4 line(s) in 1 file(s) of its workspace",
        ),
        (
            Role::Judge,
            3,
            &judge_no,
            judge(4, 1),
            defaults(),
            "the Judge changed 4 line(s)",
        ),
        (Role::Judge, 3, &judge_pass, judge(4, 1), judge_may(), ""),
    ];
    for (role, step, line, work, limits, want) in table {
        let d = answer(role, step, line, work.clone(), limits);
        match (&d, want) {
            (
                Decision::Insufficient {
                    diagnostics,
                    by_daemon: true,
                },
                w,
            ) if !w.is_empty() => {
                assert!(diagnostics.contains(w), "{role:?} {work:?}: {diagnostics}")
            }
            (
                Decision::Insufficient {
                    by_daemon: true, ..
                },
                "",
            ) => panic!("{role:?} {work:?}: {d:?}"),
            (_, "") => {}
            (other, w) => panic!("{role:?} {work:?}: wanted {w:?}, got {other:?}"),
        }
    }
}

#[test]
fn a_plan_is_counted_without_its_summary_and_signal_block() {
    let table = [
        ("", 0),
        ("1. edit docs/faq.md\n2. add a test\n", 2),
        (
            "step one\n\n\nstep two\n\n## Context Summary\n**Goal**: g\n**Blockers**: None\n",
            2,
        ),
        ("a\nAgent=Planner | Cycle=c | Step=1 | Next=Actor\n", 1),
    ];
    for (text, want) in table {
        assert_eq!(plan_lines(text), want, "{text:?}");
    }
}

#[test]
fn the_cycles_branch_goes_back_to_the_last_pass_or_stays_as_configured() {
    use crate::config::OnInsufficient::{Keep, Rollback};
    let no = Decision::Insufficient {
        diagnostics: "d".into(),
        by_daemon: false,
    };
    let pass = Decision::Pass {
        risk: RiskLevel::Medium,
    };
    let on = Decision::Handoff { to: Role::Judge };
    let stop = Decision::Stop { reason: "r".into() };
    let s = |t: &str| Some(t.to_string());
    // (role, decision, on_insufficient, in the worktree) -> (target, last PASS);
    // the head is "H", the last PASS "P".
    let table = [
        (Role::Actor, &on, Rollback, true, (None, "P")),
        (Role::Actor, &no, Rollback, true, (s("P"), "P")),
        (Role::Actor, &no, Keep, true, (s("H"), "P")),
        (Role::Judge, &no, Rollback, false, (s("P"), "P")),
        (Role::Judge, &no, Keep, false, (s("H"), "P")),
        (Role::Judge, &no, Keep, true, (s("H"), "P")),
        (Role::Judge, &pass, Rollback, false, (s("H"), "H")),
        (Role::Judge, &pass, Keep, true, (s("H"), "H")),
        (Role::Judge, &stop, Rollback, true, (s("H"), "P")),
        (Role::Judge, &stop, Rollback, false, (None, "P")),
        (Role::Planner, &no, Rollback, false, (None, "P")),
        (Role::Planner, &no, Keep, false, (None, "P")),
    ];
    for (role, decision, on_insufficient, in_worktree, (target, last)) in table {
        assert_eq!(
            branch_target(role, decision, on_insufficient, in_worktree, "H", "P"),
            (target.clone(), last.to_string()),
            "{role:?} {decision:?} {on_insufficient:?} {in_worktree}"
        );
    }
}
