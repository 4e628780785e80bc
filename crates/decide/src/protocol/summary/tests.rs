//! The tests of `protocol::summary`: both parsers on the seed's examples,
//! agents' loose Markdown, and every problem code.

use super::*;

/// The block of seed 004 exactly as the seed shows it: a template.
const SEED_TEMPLATE: &str = "## Context Summary

**Goal**: [1-line statement of cycle objective]
**Current State**: [What was just completed]
**Next Agent**: [Planner | Actor | Judge | Human]
**Confidence**: [1-5 scale: 1=uncertain, 5=verified]
**Risk Level**: [low | medium | high]
**Blockers**: [None | List critical issues]
";

/// The seed's signal block schema line, verbatim.
const SEED_SIGNAL_SCHEMA: &str = "Agent=[Planner|Actor|Judge] | Cycle=[id] | Step=[stage] | Confidence=[1-5] | Risk=[low|medium|high] | Next=[Planner|Actor|Judge|Human]";

/// The seed's signal block example, verbatim.
const SEED_SIGNAL_EXAMPLE: &str =
    "Agent=Actor | Cycle=2025-11-08-001 | Step=2 | Confidence=4 | Risk=low | Next=Judge";

/// The seed's layout, filled in.
const FILLED: &str = "I wrote the parser and its tests.

## Context Summary

**Goal**: Parse the context summary block
**Current State**: Parser and tests written
**Next Agent**: Judge
**Confidence**: 4
**Risk Level**: low
**Blockers**: None
";

/// What the well-formed cases below read as.
const GSJ4LN: &str = "G / S / Judge [Judge] / 4 / low / -";

/// A block on one line, as the caller maps it:
/// `goal / state / next agent [role] / confidence / risk / blocked_by`,
/// `-` for nothing, then the missing fields.
fn render(s: &ContextSummary) -> String {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let next = s.next_agent.as_ref().map(|n| match n.role {
        Some(role) => format!("{} [{}]", n.name, role.as_str()),
        None => n.name.clone(),
    });
    let mut out = [
        s.goal.clone(),
        s.current_state.clone(),
        next,
        s.report_confidence().map(|c| c.to_string()),
        s.report_risk().map(|r| r.as_str().to_string()),
        s.blocked_by(),
    ]
    .map(or_dash)
    .join(" / ");
    if !s.missing.is_empty() {
        let missing: Vec<&str> = s.missing.iter().map(|f| f.label()).collect();
        out.push_str(&format!(" missing {}", missing.join(", ")));
    }
    out
}

/// A signal block on one line: `agent / cycle / step / confidence /
/// risk / next`, then extra keys and missing ones.
fn render_signal(b: &SignalBlock) -> String {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let mut out = [
        b.agent.clone(),
        b.cycle.clone(),
        b.step.clone(),
        b.confidence.map(|c| c.to_string()),
        b.risk.map(|r| r.as_str().to_string()),
        b.next.clone(),
    ]
    .map(or_dash)
    .join(" / ");
    for (key, value) in &b.extra {
        out.push_str(&format!(" +{key}={value}"));
    }
    if !b.missing.is_empty() {
        let missing: Vec<&str> = b.missing.iter().map(|f| f.label()).collect();
        out.push_str(&format!(" missing {}", missing.join(", ")));
    }
    out
}

fn summary_ok(name: &str, text: &str) -> ContextSummary {
    match parse_context_summary(text) {
        Some(Ok(summary)) => summary,
        other => panic!("{name}: expected a block, got {other:?}"),
    }
}

fn summary_err(name: &str, text: &str) -> BlockProblem {
    match parse_context_summary(text) {
        Some(Err(problem)) => problem,
        other => panic!("{name}: expected a problem, got {other:?}"),
    }
}

fn signal_ok(name: &str, text: &str) -> SignalBlock {
    match parse_signal_block(text) {
        Some(Ok(block)) => block,
        other => panic!("{name}: expected a signal block, got {other:?}"),
    }
}

fn signal_err(name: &str, text: &str) -> BlockProblem {
    match parse_signal_block(text) {
        Some(Err(problem)) => problem,
        other => panic!("{name}: expected a problem, got {other:?}"),
    }
}

#[test]
fn well_formed_summaries_in_every_markdown_shape() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "the seed's layout, filled in",
            FILLED,
            "Parse the context summary block / Parser and tests written / Judge [Judge] / 4 / low / -",
        ),
        (
            "colon inside the bold",
            "## Context Summary\n**Goal:** G\n**Current State:** S\n**Next Agent:** Planner\n**Confidence:** 5\n**Risk Level:** high\n**Blockers:** Need prod credentials\n",
            "G / S / Planner [Planner] / 5 / high / Need prod credentials",
        ),
        (
            "bulleted bold keys under an h3, blank lines between",
            "### Context Summary\n\n- **Goal**: G\n\n- **Current State**: S\n- **Next Agent**: Actor\n- **Confidence**: 3\n- **Risk Level**: medium\n- **Blockers**: -\n",
            "G / S / Actor [Actor] / 3 / medium / -",
        ),
        (
            "plain keys under a plain title line",
            "Context Summary:\nGoal: G\nCurrent State: S\nNext Agent: Human\nConfidence: 2\nRisk Level: LOW\nBlockers: N/A\n",
            "G / S / Human [Human] / 2 / low / -",
        ),
        (
            "bold title line, star bullets, snake_case keys",
            "**Context Summary**\n* goal: G\n* current_state: S\n* next_agent: judge\n* confidence: 4\n* risk: low\n* blockers: none\n",
            "G / S / judge [Judge] / 4 / low / -",
        ),
        (
            "numbered fields under an emoji heading with words after it",
            "## 📋 Context Summary (cycle 3)\n1. **Goal**: G\n2. **Current State**: S\n3. **Next Agent**: Judge\n4. **Confidence**: 4\n5. **Risk Level**: low\n6. **Blockers**: None\n",
            GSJ4LN,
        ),
        (
            "inside a markdown fence, as the seed prints it",
            "Done.\n\n```markdown\n## Context Summary\n\n**Goal**: G\n**Current State**: S\n**Next Agent**: Judge\n**Confidence**: 4\n**Risk Level**: low\n**Blockers**: None\n```\n",
            GSJ4LN,
        ),
        (
            "fence opened under the heading",
            "## Context Summary\n```\nGoal: G\nCurrent State: S\nNext Agent: Judge\nConfidence: 4\nRisk Level: low\nBlockers: None\n```\nThanks!\n",
            GSJ4LN,
        ),
        (
            "in a blockquote",
            "> ## Context Summary\n> **Goal**: G\n> **Current State**: S\n> **Next Agent**: Judge\n> **Confidence**: 4\n> **Risk Level**: low\n> **Blockers**: None\n",
            GSJ4LN,
        ),
        (
            "values with explanations and markdown",
            "## Context Summary\n**Goal**: `G`\n**Current State**: S\n**Next Agent**: Human (approval needed)\n**Confidence**: 4/5 — tests pass\n**Risk Level**: **Medium** (API change)\n**Blockers**: None identified\n",
            "G / S / Human (approval needed) [Human] / 4 / medium / -",
        ),
        (
            "the template's brackets kept around real values",
            "## Context Summary\n**Goal**: [G]\n**Current State**: [S]\n**Next Agent**: [Judge]\n**Confidence**: [5]\n**Risk Level**: [high]\n**Blockers**: [None]\n",
            "G / S / Judge [Judge] / 5 / high / -",
        ),
        (
            "blockers as a list under the key",
            "## Context Summary\n**Goal**: G\n**Current State**: S\n**Next Agent**: Human\n**Confidence**: 2\n**Risk Level**: high\n**Blockers**:\n- CI is red on main\n- Need an API key: prod\n",
            "G / S / Human [Human] / 2 / high / CI is red on main; Need an API key: prod",
        ),
        (
            "blockers list after a blank line, then the signal block",
            "## Context Summary\n**Goal**: G\n**Current State**: S\n**Next Agent**: Judge\n**Confidence**: 3\n**Risk Level**: low\n**Blockers**:\n\n  - flaky test\n\nAgent=Actor | Cycle=1 | Step=2 | Confidence=3 | Risk=low | Next=Judge\n",
            "G / S / Judge [Judge] / 3 / low / flaky test",
        ),
        (
            "value on the line under an empty key",
            "## Context Summary\n**Goal**:\nG\n**Current State**: S\n**Next Agent**: Judge\n**Confidence**: 4\n**Risk Level**: low\n**Blockers**: None\n",
            GSJ4LN,
        ),
        (
            "sub-bullets continue the current state",
            "## Context Summary\n**Goal**: G\n**Current State**: parser done\n  - tests written\n  - docs updated\n**Next Agent**: Judge\n**Confidence**: 4\n**Risk Level**: low\n**Blockers**: None\n",
            "G / parser done\ntests written\ndocs updated / Judge [Judge] / 4 / low / -",
        ),
        (
            "trailing prose after a blank line is not part of the block",
            "## Context Summary\n**Goal**: G\n**Current State**: S\n**Next Agent**: Judge\n**Confidence**: 4\n**Risk Level**: low\n**Blockers**: None\n\nLet me know if you need anything else.\n",
            GSJ4LN,
        ),
        (
            "no heading: a run of the six fields at the end",
            "All done.\n\nGoal: G\nCurrent State: S\nNext Agent: Judge\nConfidence: 4\nRisk Level: low\nBlockers: None\n",
            GSJ4LN,
        ),
        (
            "an agent of this project as the next agent",
            "## Context Summary\n**Goal**: G\n**Current State**: S\n**Next Agent**: leo\n**Confidence**: 4\n**Risk Level**: low\n**Blockers**: None\n",
            "G / S / leo / 4 / low / -",
        ),
        (
            "CRLF line endings",
            "Done.\r\n\r\n## Context Summary\r\n\r\n**Goal**: G\r\n**Current State**: S\r\n**Next Agent**: Judge\r\n**Confidence**: 4\r\n**Risk Level**: low\r\n**Blockers**:\r\n- one\r\n- two\r\n",
            "G / S / Judge [Judge] / 4 / low / one; two",
        ),
        (
            "unicode everywhere",
            "## ✅ Context Summary\n**Goal**: Résumé des données — 日本語 ✓\n**Current State**: Überprüft 🎉\n**Next Agent**: Judge\n**Confidence**: ⭐ 5\n**Risk Level**: 🟢 Low\n**Blockers**: Ключ API отсутствует\n",
            "Résumé des données — 日本語 ✓ / Überprüft 🎉 / Judge [Judge] / 5 / low / Ключ API отсутствует",
        ),
    ];
    for (name, text, expected) in cases {
        let summary = summary_ok(name, text);
        assert_eq!(render(&summary), *expected, "{name}");
        assert!(summary.is_complete(), "{name}");
        assert!(!summary.raw.contains('\r'), "{name}: raw keeps a CR");
    }
}

#[test]
fn partial_summaries_list_what_is_missing() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "goal and state only",
            "## Context Summary\n**Goal**: G\n**Current State**: S\n",
            "G / S / - / - / - / - missing Next Agent, Confidence, Risk Level, Blockers",
        ),
        (
            "empty values count as missing",
            "## Context Summary\n**Goal**: G\n**Current State**:\n**Next Agent**: Judge\n**Confidence**:\n**Risk Level**: low\n**Blockers**: None\n",
            "G / - / Judge [Judge] / - / low / - missing Current State, Confidence",
        ),
        (
            "only blockers under the heading",
            "## Context Summary\n\nBlockers: waiting on review\n",
            "- / - / - / - / - / waiting on review missing Goal, Current State, Next Agent, Confidence, Risk Level",
        ),
        (
            "prose between heading and fields is skipped",
            "## Context Summary\n\nHere is where things stand.\n\n**Goal**: G\n**Risk Level**: medium\n",
            "G / - / - / - / medium / - missing Current State, Next Agent, Confidence, Blockers",
        ),
        (
            "headless run of three fields",
            "Goal: G\nConfidence: 3\nRisk: high\n",
            "G / - / - / 3 / high / - missing Current State, Next Agent, Blockers",
        ),
    ];
    for (name, text, expected) in cases {
        let summary = summary_ok(name, text);
        assert_eq!(render(&summary), *expected, "{name}");
        assert!(!summary.is_complete(), "{name}");
    }
}

#[test]
fn malformed_summaries_are_problems() {
    use ProblemCode::{
        SummaryDuplicateField as Duplicate, SummaryInvalidConfidence as Confidence,
        SummaryInvalidRisk as Risk, SummaryMalformed as Malformed,
    };
    let block = |confidence: &str, risk: &str| {
        format!(
            "## Context Summary\n**Goal**: G\n**Current State**: S\n**Next Agent**: Judge\n**Confidence**: {confidence}\n**Risk Level**: {risk}\n**Blockers**: None\n"
        )
    };
    let cases: Vec<(&str, String, ProblemCode, Option<&str>)> = vec![
        (
            "the seed's template verbatim",
            SEED_TEMPLATE.into(),
            Confidence,
            Some("Confidence"),
        ),
        (
            "confidence 0",
            block("0", "low"),
            Confidence,
            Some("Confidence"),
        ),
        (
            "confidence 6",
            block("6", "low"),
            Confidence,
            Some("Confidence"),
        ),
        (
            "confidence as a word",
            block("high", "low"),
            Confidence,
            Some("Confidence"),
        ),
        (
            "confidence as a decimal",
            block("4.5", "low"),
            Confidence,
            Some("Confidence"),
        ),
        (
            "confidence as a range",
            block("3-4", "low"),
            Confidence,
            Some("Confidence"),
        ),
        (
            "confidence in percent",
            block("80%", "low"),
            Confidence,
            Some("Confidence"),
        ),
        (
            "confidence out of 10",
            block("4/10", "low"),
            Confidence,
            Some("Confidence"),
        ),
        (
            "risk not in the domain",
            block("4", "severe"),
            Risk,
            Some("Risk Level"),
        ),
        (
            "risk as the template",
            block("4", "low | medium | high"),
            Risk,
            Some("Risk Level"),
        ),
        (
            "risk between two",
            block("4", "low/medium"),
            Risk,
            Some("Risk Level"),
        ),
        (
            "risk as a longer word",
            block("4", "lowish"),
            Risk,
            Some("Risk Level"),
        ),
        (
            "a field twice",
            "## Context Summary\n**Goal**: G\n**Goal**: H\n**Current State**: S\n".into(),
            Duplicate,
            Some("Goal"),
        ),
        (
            "a field twice in two spellings",
            "## Context Summary\n**Goal**: G\n**Risk**: low\n**Risk Level**: high\n".into(),
            Duplicate,
            Some("Risk Level"),
        ),
        (
            "a field twice across a blank line",
            "## Context Summary\n**Goal**: G\n\n**Goal**: H\n".into(),
            Duplicate,
            Some("Goal"),
        ),
        (
            "a heading at the very end",
            "Done.\n\n## Context Summary\n".into(),
            Malformed,
            None,
        ),
        (
            "a heading over prose",
            "## Context Summary\n\nAll fine, over to the judge.\n\n## Next\n- ship\n".into(),
            Malformed,
            None,
        ),
        (
            "fields without values",
            "## Context Summary\n**Goal**:\n**Current State**:\n**Blockers**:\n".into(),
            Malformed,
            None,
        ),
        (
            "a heading over other keys only",
            "## Context Summary\n- Files: 2\n- Tests: 14 passed\n".into(),
            Malformed,
            None,
        ),
    ];
    for (name, text, code, field) in cases {
        let problem = summary_err(name, &text);
        assert_eq!(problem.code, code, "{name}: {problem}");
        assert_eq!(problem.field.as_deref(), field, "{name}");
        assert!(
            problem.raw.starts_with("## Context Summary"),
            "{name}: raw {:?}",
            problem.raw
        );
        assert!(!problem.message.is_empty(), "{name}");
    }
}

#[test]
fn no_summary_block() {
    for text in [
        "",
        "\n\n",
        "Nothing to report.",
        "Goal: ship it\n",
        "Goal: ship it\nRisk: low\n",
        "# Context\nSummary of the day: fine\n",
        "The context summary comes later.",
        "**Context Summary**: all good",
    ] {
        assert_eq!(parse_context_summary(text), None, "{text:?}");
    }
}

/// Long output with a quote of the template, an earlier block and noise:
/// only the last block counts.
#[test]
fn the_last_summary_wins_over_decoys() {
    let mut output = String::new();
    output.push_str("The prompt says:\n\n```markdown\n");
    output.push_str(SEED_TEMPLATE);
    output.push_str("```\n\n");
    output.push_str(&FILLED.replace("Parse the context summary block", "old goal"));
    for n in 0..3000 {
        output.push_str(&format!(
            "log {n}: compiled crate {n} | status=ok | risk=none\n"
        ));
    }
    output.push_str("Goal: not a block\nRisk: low\n\n");
    output.push_str(&FILLED.replace("Parse the context summary block", "new goal"));
    assert!(output.len() > 100_000);
    let summary = summary_ok("decoys", &output);
    assert_eq!(summary.goal.as_deref(), Some("new goal"));
    assert!(summary.is_complete());

    // The last block is malformed: that is what is reported, not the
    // good block before it.
    let bad = format!(
        "{FILLED}\nmore work\n\n{}",
        FILLED.replace("**Confidence**: 4", "**Confidence**: high")
    );
    assert_eq!(
        summary_err("last is bad", &bad).code,
        ProblemCode::SummaryInvalidConfidence
    );

    // A headless run after a headed block is later, so it wins...
    let headless =
        format!("{FILLED}\nThen:\n\nGoal: later\nCurrent State: done\nRisk Level: high\n");
    assert_eq!(
        summary_ok("headless last", &headless).goal.as_deref(),
        Some("later")
    );
    // ... but two fields are prose, not a block.
    let prose = format!("{FILLED}\nThen:\n\nGoal: later\nRisk Level: high\n");
    assert_eq!(
        summary_ok("prose last", &prose).goal.as_deref(),
        Some("Parse the context summary block")
    );
}

#[test]
fn a_bare_next_is_the_next_step() {
    let summary = summary_ok(
        "bare next",
        "## Context Summary\n**Goal**: G\n**Next Agent**: Judge\n**Next**: wire it into the daemon\n",
    );
    assert_eq!(
        summary.next_agent.as_ref().map(|n| n.role),
        Some(Some(Role::Judge))
    );
    assert_eq!(
        summary.next_priority().as_deref(),
        Some("wire it into the daemon")
    );
    let twice = "## Context Summary\n**Goal**: G\n**Next Steps**: a\n**Next**: b\n";
    assert_eq!(
        summary_err("twice", twice).code,
        ProblemCode::SummaryDuplicateField
    );
}

/// The seed asks for an image's path and summary in the block.
#[test]
fn extra_keys_and_next_steps_are_kept() {
    let text = "## Context Summary
**Goal**: Login page
**Current State**: Wireframe reviewed
Image: docs/context/assets/2025-11-08_14-23-00_login-wireframe.png
Summary: Login form mockup with OAuth buttons and remember-me checkbox
**Next Agent**: Actor
**Confidence**: 3
**Risk Level**: low
**Blockers**: None
**Next Steps**: Build the form
";
    let summary = summary_ok("extras", text);
    let extra: Vec<String> = summary
        .extra
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    assert_eq!(
        extra,
        [
            "Image=docs/context/assets/2025-11-08_14-23-00_login-wireframe.png",
            "Summary=Login form mockup with OAuth buttons and remember-me checkbox",
        ]
    );
    assert_eq!(summary.next_steps.as_deref(), Some("Build the form"));
    assert!(summary.is_complete());
    assert_eq!(summary.next_priority().as_deref(), Some("Build the form"));
    let json = serde_json::to_value(&summary).unwrap();
    assert_eq!(
        json["extra"]["Image"],
        "docs/context/assets/2025-11-08_14-23-00_login-wireframe.png"
    );
    assert_eq!(json["risk_level"]["level"], "low");
}

#[test]
fn mapping_to_report_and_session() {
    let summary = summary_ok("filled", FILLED);
    assert_eq!(
        summary.summary_text().as_deref(),
        Some("Parser and tests written (goal: Parse the context summary block)")
    );
    assert_eq!(summary.blocked_by(), None);
    // "Next Agent: Judge" is routing, not the agent's next priority.
    assert_eq!(summary.next_priority(), None);
    assert_eq!(summary.report_confidence(), Some(4));
    assert_eq!(summary.report_risk(), Some(RiskLevel::Low));
    assert_eq!(
        serde_json::to_value(summary.report_risk()).unwrap(),
        serde_json::json!("low")
    );
    assert_eq!(
        summary.handoff_notes().as_deref(),
        Some(
            "Goal: Parse the context summary block\nCurrent State: Parser and tests written\nNext Agent: Judge\nConfidence: 4/5\nRisk Level: low\nBlockers: none"
        )
    );

    let partial = summary_ok("goal only", "## Context Summary\n**Goal**: G\n");
    assert_eq!(partial.summary_text().as_deref(), Some("Goal: G"));
    assert_eq!(partial.next_priority(), None);
    assert_eq!(partial.blocked_by(), None);
    assert_eq!(partial.report_confidence(), None);
    assert_eq!(partial.report_risk(), None);
    assert_eq!(partial.handoff_notes().as_deref(), Some("Goal: G"));

    let multi = summary_ok(
        "multi-line state",
        "## Context Summary\n**Goal**: G\n**Current State**: parser done.\n  - tests written\n**Blockers**:\n- a\n- b\n",
    );
    assert_eq!(
        multi.summary_text().as_deref(),
        Some("parser done. tests written (goal: G)")
    );
    assert_eq!(multi.blocked_by().as_deref(), Some("a; b"));

    let long = "x".repeat(5000);
    let huge = summary_ok(
        "long",
        &format!(
            "## Context Summary\n**Goal**: {long}\n**Current State**: {long}\n**Blockers**: {long}\n"
        ),
    );
    let text = huge.summary_text().unwrap();
    assert_eq!(text.chars().count(), SUMMARY_TEXT_LIMIT);
    assert!(text.ends_with('…'));
    assert_eq!(huge.blocked_by().unwrap().chars().count(), FIELD_TEXT_LIMIT);
    assert_eq!(
        huge.handoff_notes().unwrap().chars().count(),
        HANDOFF_NOTES_LIMIT
    );
}

#[test]
fn confidence_values() {
    for (value, level) in [
        ("4", Some(4)),
        ("1", Some(1)),
        ("5", Some(5)),
        ("4/5", Some(4)),
        ("4 / 5", Some(4)),
        ("5/5 — verified", Some(5)),
        ("**3**", Some(3)),
        ("[2]", Some(2)),
        ("1 (uncertain)", Some(1)),
        ("4. Tests pass", Some(4)),
        ("4 of 5", Some(4)),
        ("⭐ 4", Some(4)),
        ("3 - reviewed", Some(3)),
        ("0", None),
        ("6", None),
        ("10", None),
        ("high", None),
        ("4.5", None),
        ("1-5 scale: 1=uncertain, 5=verified", None),
        ("4/10", None),
        ("4x", None),
        ("80%", None),
        ("4%", None),
        ("", None),
        ("99999999999999999999", None),
    ] {
        assert_eq!(parse_confidence(value), level, "{value:?}");
    }
}

#[test]
fn risk_values() {
    use RiskLevel::{High, Low, Medium};
    for (value, level) in [
        ("low", Some(Low)),
        ("LOW", Some(Low)),
        ("Medium (API change)", Some(Medium)),
        ("high — touches auth", Some(High)),
        ("`low`", Some(Low)),
        ("🟢 Low", Some(Low)),
        ("low risk", Some(Low)),
        ("High.", Some(High)),
        ("severe", None),
        ("lowish", None),
        ("low | medium | high", None),
        ("low/medium", None),
        ("low-medium", None),
        ("low or medium", None),
        ("3", None),
        ("", None),
    ] {
        assert_eq!(parse_risk(value), level, "{value:?}");
    }
}

#[test]
fn blocker_values() {
    for none in [
        "None",
        "none",
        "-",
        "—",
        "N/A",
        "None.",
        "[None]",
        "**None**",
        "None identified",
        "None (all green)",
        "No blockers",
        "no known blockers",
        "nothing",
    ] {
        assert!(is_no_blocker(none), "{none:?} should mean no blocker");
    }
    for blocker in [
        "None of the API keys work",
        "CI red",
        "Need API key",
        "Nonexistent table",
    ] {
        assert!(!is_no_blocker(blocker), "{blocker:?} is a blocker");
    }
}

#[test]
fn well_formed_signal_blocks() {
    const ALL: &str = "Actor / 2025-11-08-001 / 2 / 4 / low / Judge";
    let cases: &[(&str, &str, &str)] = &[
        ("the seed's example verbatim", SEED_SIGNAL_EXAMPLE, ALL),
        (
            "spaces around = and |",
            "Agent = Actor|Cycle = 2025-11-08-001 |  Step=2|Confidence= 4 | Risk =low | Next=Judge  ",
            ALL,
        ),
        (
            "in backticks",
            "`Agent=Actor | Cycle=2025-11-08-001 | Step=2 | Confidence=4 | Risk=low | Next=Judge`",
            ALL,
        ),
        (
            "after a bold label",
            "**SIGNAL BLOCK**: Agent=Actor | Cycle=2025-11-08-001 | Step=2 | Confidence=4 | Risk=low | Next=Judge",
            ALL,
        ),
        (
            "after a label without a colon",
            "SIGNAL BLOCK Agent=Actor | Cycle=2025-11-08-001 | Step=2 | Confidence=4 | Risk=low | Next=Judge",
            ALL,
        ),
        (
            "as a table row",
            "| Agent=Actor | Cycle=2025-11-08-001 | Step=2 | Confidence=4 | Risk=low | Next=Judge |",
            ALL,
        ),
        (
            "as a list item",
            "- Agent=Actor | Cycle=2025-11-08-001 | Step=2 | Confidence=4 | Risk=low | Next=Judge",
            ALL,
        ),
        (
            "lowercase keys, an agent's name, the long key names",
            "agent=rio | cycle=7 | step=research | confidence=5/5 | risk level=HIGH | next agent=Human",
            "rio / 7 / research / 5 / high / Human",
        ),
        (
            "an extra key",
            "Agent=Judge | Cycle=3 | Step=verify | Confidence=3 | Risk=medium | Next=Planner | Task=task-042",
            "Judge / 3 / verify / 3 / medium / Planner +Task=task-042",
        ),
        (
            "unicode values",
            "Agent=Actor | Cycle=2025-11-08-001 ✓ | Step=répétition 2 | Confidence=4 | Risk=low | Next=Judge 🧑‍⚖️",
            "Actor / 2025-11-08-001 ✓ / répétition 2 / 4 / low / Judge 🧑‍⚖️",
        ),
    ];
    for (name, text, expected) in cases {
        let block = signal_ok(name, text);
        assert_eq!(render_signal(&block), *expected, "{name}");
        assert_eq!(block.raw, text.trim(), "{name}");
    }
    let seed = signal_ok("roles", SEED_SIGNAL_EXAMPLE);
    assert_eq!(seed.agent_role(), Some(Role::Actor));
    assert_eq!(seed.next_role(), Some(Role::Judge));
    let rio = signal_ok("agent name", "Agent=rio | Next=Human");
    assert_eq!(rio.agent_role(), None);
    assert_eq!(rio.next_role(), Some(Role::Human));
}

#[test]
fn partial_signal_blocks() {
    for (name, text, expected) in [
        (
            "two keys",
            "Agent=Actor | Next=Judge",
            "Actor / - / - / - / - / Judge missing Cycle, Step, Confidence, Risk",
        ),
        (
            "empty values",
            "Agent=Actor | Cycle= | Step=2 | Confidence= | Risk=low | Next=Judge",
            "Actor / - / 2 / - / low / Judge missing Cycle, Confidence",
        ),
    ] {
        assert_eq!(render_signal(&signal_ok(name, text)), expected, "{name}");
    }
}

#[test]
fn malformed_signal_blocks() {
    use ProblemCode::{
        SignalBlockDuplicateField as Duplicate, SignalBlockInvalidConfidence as Confidence,
        SignalBlockInvalidRisk as Risk, SignalBlockMalformed as Malformed,
    };
    for (name, text, code, field) in [
        (
            "the seed's schema verbatim",
            SEED_SIGNAL_SCHEMA,
            Malformed,
            None,
        ),
        (
            "a part without =",
            "Agent=Actor | Cycle=1 | Step 2 | Next=Judge",
            Malformed,
            None,
        ),
        (
            "an empty part",
            "Agent=Actor || Next=Judge",
            Malformed,
            None,
        ),
        (
            "a key of punctuation",
            "Agent=Actor | ?!=x | Next=Judge",
            Malformed,
            None,
        ),
        (
            "a key twice",
            "Agent=Actor | Agent=Judge | Next=Human",
            Duplicate,
            Some("Agent"),
        ),
        (
            "two spellings",
            "Agent=Actor | Risk=low | Risk Level=high",
            Duplicate,
            Some("Risk"),
        ),
        (
            "an extra key twice",
            "Agent=A | Next=B | Task=1 | task=2",
            Duplicate,
            Some("task"),
        ),
        (
            "confidence a word",
            "Agent=Actor | Confidence=high",
            Confidence,
            Some("Confidence"),
        ),
        (
            "confidence too high",
            "Agent=Actor | Confidence=7",
            Confidence,
            Some("Confidence"),
        ),
        (
            "risk not in the domain",
            "Agent=Actor | Risk=severe",
            Risk,
            Some("Risk"),
        ),
    ] {
        let problem = signal_err(name, text);
        assert_eq!(problem.code, code, "{name}: {problem}");
        assert_eq!(problem.field.as_deref(), field, "{name}");
        assert_eq!(problem.raw, text, "{name}");
    }
}

#[test]
fn no_signal_block() {
    for text in [
        "",
        "a | b | c",
        "x=1 | y=2",
        "Agent=Actor",
        "| Goal | Current State |\n|---|---|\n| G | S |",
        "Risk: low | Confidence: 4",
        "if (a == b || c) { next = 1; }",
    ] {
        assert_eq!(parse_signal_block(text), None, "{text:?}");
    }
}

#[test]
fn the_last_signal_block_wins() {
    let mut output = String::new();
    output.push_str("The schema is:\n");
    output.push_str(SEED_SIGNAL_SCHEMA);
    output.push_str(
        "\r\nEarlier: Agent=Planner | Cycle=1 | Step=1 | Confidence=2 | Risk=high | Next=Actor\r\n",
    );
    for n in 0..5000 {
        output.push_str(&format!("line {n} | value={n}\r\n"));
    }
    output.push_str(&FILLED.replace('\n', "\r\n"));
    output.push_str(SEED_SIGNAL_EXAMPLE);
    output.push_str("\r\n\r\nBye.\r\n");
    let block = signal_ok("last", &output);
    assert_eq!(block.raw, SEED_SIGNAL_EXAMPLE);
    assert_eq!(
        render_signal(&block),
        "Actor / 2025-11-08-001 / 2 / 4 / low / Judge"
    );
    // The summary just above is read too, and ends where the line starts.
    let summary = summary_ok("summary beside", &output);
    assert_eq!(summary.report_confidence(), Some(4));
    assert!(summary.raw.ends_with("**Blockers**: None"));

    // A malformed last line is reported even after a good one.
    let bad = format!("{SEED_SIGNAL_EXAMPLE}\nAgent=Actor | Confidence=9 | Next=Judge\n");
    assert_eq!(
        signal_err("last bad", &bad).code,
        ProblemCode::SignalBlockInvalidConfidence
    );
}

#[test]
fn signal_block_json_for_session_json() {
    let block = signal_ok("seed", SEED_SIGNAL_EXAMPLE);
    assert_eq!(
        serde_json::to_value(&block).unwrap(),
        serde_json::json!({
            "agent": "Actor",
            "cycle": "2025-11-08-001",
            "step": "2",
            "confidence": 4,
            "risk": "low",
            "next": "Judge",
            "raw": SEED_SIGNAL_EXAMPLE,
        })
    );
    let partial = signal_ok(
        "partial",
        "Agent=rio | Next=Human | Task=t-1 | Branch=rio/x",
    );
    let json = serde_json::to_string(&partial).unwrap();
    assert_eq!(
        json,
        r#"{"agent":"rio","next":"Human","extra":{"Task":"t-1","Branch":"rio/x"},"missing":["cycle","step","confidence","risk"],"raw":"Agent=rio | Next=Human | Task=t-1 | Branch=rio/x"}"#
    );
    let back: SignalBlock = serde_json::from_str(&json).unwrap();
    assert_eq!(back, partial);
    // Lazy defaults: a sparse or hand-written value still loads.
    let sparse: SignalBlock = serde_json::from_str(r#"{"agent":"Actor","extra":{"n":3}}"#).unwrap();
    assert_eq!(sparse.agent.as_deref(), Some("Actor"));
    assert_eq!(sparse.extra, vec![("n".to_string(), "3".to_string())]);
}

#[test]
fn problems_read_like_seed_000_signal_errors() {
    let problem = summary_err("template", SEED_TEMPLATE);
    let value = serde_json::to_value(&problem).unwrap();
    assert_eq!(value["code"], "SUMMARY_INVALID_CONFIDENCE");
    assert_eq!(value["field"], "Confidence");
    assert_eq!(value["raw"], SEED_TEMPLATE.trim_end());
    assert!(
        problem
            .to_string()
            .starts_with("SUMMARY_INVALID_CONFIDENCE: Confidence `1-5 scale"),
        "{problem}"
    );

    let long = format!(
        "## Context Summary\n**Goal**: {}\n**Confidence**: high\n",
        "é".repeat(5000)
    );
    let problem = summary_err("long", &long);
    assert_eq!(problem.raw.chars().count(), PROBLEM_RAW_LIMIT);

    for code in ProblemCode::ALL {
        assert_eq!(
            serde_json::to_value(code).unwrap(),
            serde_json::json!(code.as_str())
        );
        assert_eq!(ProblemCode::parse(code.as_str()), Some(code));
        assert_eq!(code.level(), "warn");
    }
    assert_eq!(ProblemCode::parse("SIGNAL_MALFORMED"), None);
}

/// xorshift64: a fixed seed, so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Random text made of the pieces the parsers look for, broken markdown
/// and any character at all: neither parser panics, and what they return
/// holds together.
#[test]
fn random_input_never_panics() {
    const PIECES: &[&str] = &[
        "## Context Summary",
        "**Context Summary**",
        "Context Summary:",
        "# Other",
        "**Goal**:",
        "**Goal:**",
        "Goal: ",
        "- **Current State**: ",
        "Next Agent:",
        "**Confidence**: ",
        "Risk Level: ",
        "**Blockers**:",
        "Next Steps:",
        "- ",
        "* ",
        "  ",
        "1. ",
        "> ",
        "```",
        "---",
        "|",
        "||",
        "=",
        "Agent=",
        "Cycle=",
        "Step=",
        "Confidence=",
        "Risk=",
        "Next=",
        "Risk Level=",
        "low",
        "medium",
        "high",
        "severe",
        "None",
        "-",
        "4",
        "4/5",
        "0",
        "9",
        "1-5",
        "[",
        "]",
        "`",
        ":",
        "**",
        "__",
        "\n",
        "\n",
        "\n",
        "\r\n",
        "\r",
        "\t",
        " ",
        "é",
        "日本",
        "🟢",
        "🧑‍⚖️",
        "\u{0}",
        "\u{feff}",
        "\u{200b}",
        "٤",
        "Judge",
        "Human",
        "rio",
        "x",
        "https://a.b",
        "10:30",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..3000 {
        let mut text = String::new();
        for _ in 0..rng.below(120) {
            if rng.below(8) == 0 {
                let c = char::from_u32((rng.next() % 0x11_0000) as u32).unwrap_or('\u{fffd}');
                text.push(c);
            } else {
                text.push_str(PIECES[rng.below(PIECES.len())]);
            }
        }
        check_invariants(round, &text);
    }
}

fn check_invariants(round: usize, text: &str) {
    let normalized = split_lines(text).join("\n");
    match parse_context_summary(text) {
        Some(Ok(summary)) => {
            assert!(
                normalized.contains(&summary.raw),
                "round {round}: raw is not from the input: {text:?}"
            );
            assert!(
                summary.missing.len() < SummaryField::ALL.len(),
                "round {round}: a block without a field: {text:?}"
            );
            let present = [
                summary.goal.is_some(),
                summary.current_state.is_some(),
                summary.next_agent.is_some(),
                summary.confidence.is_some(),
                summary.risk_level.is_some(),
                summary.blockers.is_some(),
            ];
            for (field, present) in SummaryField::ALL.into_iter().zip(present) {
                assert_eq!(
                    summary.missing.contains(&field),
                    !present,
                    "round {round}: {field:?}: {text:?}"
                );
            }
            assert!(
                summary
                    .confidence
                    .as_ref()
                    .is_none_or(|c| (1..=5).contains(&c.level))
            );
            let within =
                |t: Option<String>, limit: usize| t.is_none_or(|t| t.chars().count() <= limit);
            assert!(within(summary.summary_text(), SUMMARY_TEXT_LIMIT));
            assert!(within(summary.blocked_by(), FIELD_TEXT_LIMIT));
            assert!(within(summary.next_priority(), FIELD_TEXT_LIMIT));
            assert!(within(summary.handoff_notes(), HANDOFF_NOTES_LIMIT));
            serde_json::to_string(&summary).unwrap();
        }
        Some(Err(problem)) => {
            assert!(
                problem.raw.chars().count() <= PROBLEM_RAW_LIMIT,
                "round {round}"
            );
            assert!(
                problem.code.as_str().starts_with("SUMMARY_"),
                "round {round}"
            );
        }
        None => {}
    }
    match parse_signal_block(text) {
        Some(Ok(block)) => {
            assert!(
                normalized.lines().any(|l| l.trim() == block.raw),
                "round {round}: {text:?}"
            );
            assert!(
                block.raw.contains('|') && block.raw.contains('='),
                "round {round}"
            );
            assert!(
                block.confidence.is_none_or(|c| (1..=5).contains(&c)),
                "round {round}"
            );
            let json = serde_json::to_string(&block).unwrap();
            let back: SignalBlock = serde_json::from_str(&json).unwrap();
            assert_eq!(back.raw, block.raw, "round {round}");
        }
        Some(Err(problem)) => {
            assert!(
                problem.code.as_str().starts_with("SIGNAL_BLOCK_"),
                "round {round}"
            );
        }
        None => {}
    }
}

/// The largest tail the caller passes, made of near misses the parsers
/// have to look at closely.
#[test]
fn a_full_tail_of_near_misses() {
    let mut text = String::new();
    let mut rng = Rng(42);
    while text.len() < 256 * 1024 {
        text.push_str(match rng.below(5) {
            0 => "## Context Summary\n",
            1 => "Goal: g\n",
            2 => "Agent=a | x\n",
            3 => "- item | k=v\n",
            _ => "prose with words: and | pipes = signs\n",
        });
    }
    check_invariants(0, &text);
}
