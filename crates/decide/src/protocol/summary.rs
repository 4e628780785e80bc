//! The two blocks seed 004 asks every agent response to end with, read back
//! from a session's output: the Context Summary Block (Goal, Current State,
//! Next Agent, Confidence, Risk Level, Blockers) and the one-line signal
//! block (`Agent=… | Cycle=… | Step=… | Confidence=… | Risk=… | Next=…`).
//!
//! Both parsers are pure functions over the text the caller kept: the final
//! answer of Claude Code's JSON result when there is one (in JSON mode the
//! blocks sit inside an escaped string), else the tail of stdout (at most
//! `agent-state`'s `daemon::output::STDOUT_TAIL`, so the first line may
//! be cut). They never fail and never panic. No block gives `None`; a block
//! with some of its fields gives `Ok` with the absent ones listed in
//! `missing`; a block that cannot be trusted (a value outside the seed's
//! domain, a field given twice, a heading with no fields under it) gives a
//! [`BlockProblem`] whose code goes to `.daemon/signals.jsonl` beside the
//! invalid `<axiom>` signals of seed 000, and like them never stops anything.
//!
//! The *last* block wins: the seed puts it at the end of every response, and
//! agents often quote the template or draft a block earlier on.
//!
//! How: each line is classified once (`Line`: blank, heading, wrapping,
//! or text with maybe a `Key: value`), then a small state machine walks the
//! classified lines. Agents' Markdown is loose (fields inside code fences,
//! `Key: value` lines without the blank lines Markdown needs between list
//! items and paragraphs), so this is a line scanner, not a Markdown parser.
//!
//! What this module must never do: read or write a file, or invent a value
//! the agent did not write. [`ContextSummary`]'s mapping helpers say how a
//! block becomes `report.json` (`summary`, `blocked_by`, `next_priority`,
//! `confidence`, `risk`) and `session.json` (`handoff_notes`); the caller
//! writes them.

use std::fmt;

use serde::{Deserialize, Serialize};

mod signal;
mod values;
pub use signal::*;
use values::*;

/// How many characters of a block a [`BlockProblem`] keeps in `raw`, so that a
/// runaway block does not become a huge line in `signals.jsonl`.
pub const PROBLEM_RAW_LIMIT: usize = 2000;
/// The longest `report.json` `summary` made from a block, in characters.
pub const SUMMARY_TEXT_LIMIT: usize = 500;
/// The longest `report.json` `blocked_by` or `next_priority`, in characters.
pub const FIELD_TEXT_LIMIT: usize = 500;
/// The longest `session.json` `handoff_notes` made from a block, in characters.
pub const HANDOFF_NOTES_LIMIT: usize = 2000;

/// A run of `Key: value` lines without a Context Summary heading counts as a
/// block only with this many of the six fields: two could be any prose.
const HEADLESS_MIN_FIELDS: u32 = 3;
const KEY_MAX_CHARS: usize = 40;
const KEY_MAX_WORDS: usize = 6;

/// A closed set of names: the enum, `ALL` in order, and `$method` giving each
/// one's name as written.
macro_rules! names {
    ($(#[$meta:meta])* $name:ident, $method:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        $(#[$meta])*
        pub enum $name { $($(#[$vmeta])* $variant,)+ }

        impl $name {
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            pub fn $method(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }
        }
    };
}

names! {
    /// Why a block was not accepted. Named in the style of seed 000's signal
    /// errors (`SIGNAL_MALFORMED`, `SIGNAL_INVALID_PAYLOAD`, ...), with which
    /// they share `signals.jsonl`.
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    ProblemCode, as_str {
        /// A Context Summary heading with none of the six fields under it.
        SummaryMalformed = "SUMMARY_MALFORMED",
        /// One of the six fields (or Next Steps) given twice in one block.
        SummaryDuplicateField = "SUMMARY_DUPLICATE_FIELD",
        /// Confidence is not a whole number from 1 to 5.
        SummaryInvalidConfidence = "SUMMARY_INVALID_CONFIDENCE",
        /// Risk Level is not one of low, medium, high.
        SummaryInvalidRisk = "SUMMARY_INVALID_RISK",
        /// A signal block line with a part that is not `Key=value`.
        SignalBlockMalformed = "SIGNAL_BLOCK_MALFORMED",
        /// A key given twice in one signal block line.
        SignalBlockDuplicateField = "SIGNAL_BLOCK_DUPLICATE_FIELD",
        /// `Confidence=` is not a whole number from 1 to 5.
        SignalBlockInvalidConfidence = "SIGNAL_BLOCK_INVALID_CONFIDENCE",
        /// `Risk=` is not one of low, medium, high.
        SignalBlockInvalidRisk = "SIGNAL_BLOCK_INVALID_RISK",
    }
}

names! {
    /// The parties of seed 004's loop: `[Planner | Actor | Judge | Human]`.
    Role, as_str { Planner = "Planner", Actor = "Actor", Judge = "Judge", Human = "Human", }
}

names! {
    /// `[low | medium | high]`; written lowercase, as the seed writes it.
    #[serde(rename_all = "lowercase")]
    RiskLevel, as_str { Low = "low", Medium = "medium", High = "high", }
}

names! {
    /// The six fields of the seed's Context Summary Block, in its order, as
    /// the seed writes them.
    #[serde(rename_all = "snake_case")]
    SummaryField, label {
        Goal = "Goal",
        CurrentState = "Current State",
        NextAgent = "Next Agent",
        Confidence = "Confidence",
        RiskLevel = "Risk Level",
        Blockers = "Blockers",
    }
}

names! {
    /// The six keys of the seed's signal block, in its order, as the seed
    /// writes them.
    #[serde(rename_all = "lowercase")]
    SignalField, label {
        Agent = "Agent", Cycle = "Cycle", Step = "Step",
        Confidence = "Confidence", Risk = "Risk", Next = "Next",
    }
}

impl ProblemCode {
    pub fn parse(text: &str) -> Option<ProblemCode> {
        ProblemCode::ALL.into_iter().find(|c| c.as_str() == text)
    }

    /// The log level in `signals.jsonl`: always `warn`, as for seed 000's
    /// invalid signals; a bad block never stops a session.
    pub fn level(self) -> &'static str {
        "warn"
    }
}

impl fmt::Display for ProblemCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Role {
    /// The role a value names by its first word, in any case (`Judge`,
    /// `judge (for review)`); `None` for anything else, such as an agent's
    /// own name (`leo`).
    pub fn from_value(value: &str) -> Option<Role> {
        let word = first_word(value)?.to_lowercase();
        Role::ALL
            .into_iter()
            .find(|r| r.as_str().to_lowercase() == word)
    }
}

impl RiskLevel {
    fn from_word(word: &str) -> Option<RiskLevel> {
        let word = word.to_lowercase();
        RiskLevel::ALL.into_iter().find(|r| r.as_str() == word)
    }
}

/// A block that was found but not accepted: what to log, like seed 000's
/// `SignalError { Code, Raw, Message }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockProblem {
    pub code: ProblemCode,
    /// What is wrong, for a human: names the field and the value.
    pub message: String,
    /// The field at fault, as the seed names it (`Confidence`, `Risk Level`,
    /// `Risk`); `None` when the block as a whole is at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The block as the agent wrote it (line endings made `\n`), cut to
    /// [`PROBLEM_RAW_LIMIT`] characters.
    pub raw: String,
}

impl BlockProblem {
    fn new(code: ProblemCode, field: Option<&str>, message: String, raw: &str) -> BlockProblem {
        BlockProblem {
            code,
            message,
            field: field.map(str::to_string),
            raw: truncate_chars(raw, PROBLEM_RAW_LIMIT),
        }
    }
}

impl fmt::Display for BlockProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for BlockProblem {}

/// Confidence on the seed's scale (`1-5 scale: 1=uncertain, 5=verified`),
/// with the text it was read from (`4/5 — tests pass`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Confidence {
    /// 1 to 5.
    pub level: u8,
    pub raw: String,
}

/// The risk level with the text it was read from (`low (docs only)`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Risk {
    pub level: RiskLevel,
    pub raw: String,
}

/// Who the agent hands over to: the text as written, and the seed's role
/// when it names one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NextAgent {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
}

/// `[None | List critical issues]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Blockers {
    /// The issues, one per list item (an inline value is one item); empty when
    /// the agent wrote `None`, `-`, `N/A`, `No blockers`, ...
    pub items: Vec<String>,
    /// The value as written (list items one per line).
    pub raw: String,
}

impl Blockers {
    /// The agent said there is nothing blocking it.
    pub fn is_none(&self) -> bool {
        self.items.is_empty()
    }
}

// ---------------------------------------------------------------------------
// The Context Summary Block
// ---------------------------------------------------------------------------

/// One Context Summary Block as the agent wrote it. Every field is optional:
/// an absent or empty one is `None` and listed in `missing`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ContextSummary {
    pub goal: Option<String>,
    pub current_state: Option<String>,
    pub next_agent: Option<NextAgent>,
    pub confidence: Option<Confidence>,
    pub risk_level: Option<Risk>,
    pub blockers: Option<Blockers>,
    /// Not one of the seed's six, but what agents write for "what next"
    /// (`Next Steps:`, `Next:`, `Next Priority:`); preferred for
    /// `next_priority`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_steps: Option<String>,
    /// Other `Key: value` lines inside the block (the seed's `Image:` and
    /// `Summary:` of an image, a cycle id, ...), in order; a key given twice
    /// has its values joined.
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "pairs::serialize"
    )]
    pub extra: Vec<(String, String)>,
    /// The seed's fields this block lacks, in the seed's order.
    pub missing: Vec<SummaryField>,
    /// The block as written, from its heading (or first field) to its last
    /// line, line endings made `\n`.
    pub raw: String,
}

/// Finds the last Context Summary Block in `output` and reads it.
///
/// A block starts at a heading naming it (`## Context Summary`, any level,
/// words after it allowed; a line that is only `**Context Summary**` or
/// `Context Summary:`) or, without a heading, at a run of `Key: value` lines
/// holding at least three of the six fields. Fields are `Key: value` lines,
/// bold (`**Goal**:`, `**Goal:**`) or plain, bulleted or not; a field with
/// an empty value takes the list under it (`**Blockers**:` then `- a`).
/// Prose before the first field is skipped; after it, the block ends at a
/// blank line followed by prose, another heading, a code fence, a rule or
/// a signal block line.
pub fn parse_context_summary(output: &str) -> Option<Result<ContextSummary, BlockProblem>> {
    let lines: Vec<Line> = split_lines(output).into_iter().map(Line::new).collect();
    let mut last = None;
    let mut i = 0;
    while i < lines.len() {
        let headed = lines[i].kind == Kind::Heading { summary: true };
        let starts_field = lines[i].kind != Kind::Blank
            && !matches!(lines[i].kind, Kind::Heading { .. })
            && matches!(lines[i].pair, Some((Slot::Field(_), ..)));
        if !headed && !starts_field {
            i += 1;
            continue;
        }
        let scan = match headed {
            true => scan_block(&lines, Some(i), i + 1),
            false => scan_block(&lines, None, i),
        };
        i = scan.end.max(i + 1);
        if headed || scan.distinct_fields() >= HEADLESS_MIN_FIELDS {
            last = Some(scan);
        }
    }
    last.map(|scan| build_summary(&lines, &scan))
}

impl ContextSummary {
    /// For `report.json` `summary`: what was just done, then what for —
    /// `"{Current State} (goal: {Goal})"`, or whichever of the two is there,
    /// on one line, at most [`SUMMARY_TEXT_LIMIT`] characters.
    pub fn summary_text(&self) -> Option<String> {
        let text = with_aside(&self.current_state, &self.goal, "goal")?;
        Some(truncate_chars(&text, SUMMARY_TEXT_LIMIT))
    }

    /// For `report.json` `blocked_by`: the blockers joined with `; `, or
    /// `None` when there are none (`None`, `-`, `N/A`, ...) or the field is
    /// absent.
    pub fn blocked_by(&self) -> Option<String> {
        let blockers = self.blockers.as_ref().filter(|b| !b.is_none())?;
        let items: Vec<String> = blockers.items.iter().map(|i| one_line(i)).collect();
        Some(truncate_chars(&items.join("; "), FIELD_TEXT_LIMIT))
    }

    /// For `report.json` `next_priority`: the next steps, when the block
    /// has them. "Next Agent" is routing (who works next: the flows read
    /// it), not the agent's own priority, so it is not put here.
    pub fn next_priority(&self) -> Option<String> {
        let text = self.next_steps.as_ref()?;
        Some(truncate_chars(text, FIELD_TEXT_LIMIT))
    }

    /// For `session.json` `handoff_notes`: the whole block without its
    /// markdown, one `Field: value` line per field present (values on one
    /// line), at most [`HANDOFF_NOTES_LIMIT`] characters.
    pub fn handoff_notes(&self) -> Option<String> {
        let blockers = self.blockers.as_ref().map(|b| match b.is_none() {
            true => "none".to_string(),
            false => b.items.join("; "),
        });
        let fields = [
            ("Goal", self.goal.clone()),
            ("Current State", self.current_state.clone()),
            (
                "Next Agent",
                self.next_agent.as_ref().map(|n| n.name.clone()),
            ),
            (
                "Confidence",
                self.confidence.as_ref().map(|c| format!("{}/5", c.level)),
            ),
            (
                "Risk Level",
                self.report_risk().map(|r| r.as_str().to_string()),
            ),
            ("Blockers", blockers),
            ("Next Steps", self.next_steps.clone()),
        ];
        let extra = self
            .extra
            .iter()
            .map(|(k, v)| (k.as_str(), Some(v.clone())));
        let lines: Vec<String> = fields
            .into_iter()
            .chain(extra)
            .filter_map(|(label, value)| Some((label, one_line(&value?))))
            .filter(|(_, value)| !value.is_empty())
            .map(|(label, value)| format!("{label}: {value}"))
            .collect();
        (!lines.is_empty()).then(|| truncate_chars(&lines.join("\n"), HANDOFF_NOTES_LIMIT))
    }

    /// For `report.json` `confidence`: 1 to 5.
    pub fn report_confidence(&self) -> Option<u8> {
        self.confidence.as_ref().map(|c| c.level)
    }

    /// For `report.json` `risk`: serializes as `"low"`, `"medium"`, `"high"`.
    pub fn report_risk(&self) -> Option<RiskLevel> {
        self.risk_level.as_ref().map(|r| r.level)
    }

    /// All six of the seed's fields are there.
    pub fn is_complete(&self) -> bool {
        self.missing.is_empty()
    }
}

/// `"{main} ({name}: {aside})"` on one line, or whichever of the two is
/// there (`"{Name}: {aside}"` alone).
fn with_aside(main: &Option<String>, aside: &Option<String>, name: &str) -> Option<String> {
    let (main, aside) = (
        main.as_deref().map(one_line),
        aside.as_deref().map(one_line),
    );
    match (main, aside) {
        (Some(main), Some(aside)) => Some(format!("{main} ({name}: {aside})")),
        (Some(main), None) => Some(main),
        (None, Some(aside)) => Some(format!(
            "{}{}: {aside}",
            name[..1].to_uppercase(),
            &name[1..]
        )),
        (None, None) => None,
    }
}

/// What a `Key: value` of a block holds: one of the six fields, the next
/// steps, or anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Field(SummaryField),
    NextSteps,
    Extra,
}

impl Slot {
    fn of(key: &str) -> Slot {
        use SummaryField::*;
        match normalize_key(key).as_str() {
            "goal" => Slot::Field(Goal),
            "current state" => Slot::Field(CurrentState),
            "next agent" => Slot::Field(NextAgent),
            "confidence" | "confidence level" => Slot::Field(Confidence),
            "risk level" | "risk" => Slot::Field(RiskLevel),
            "blockers" | "blocker" | "blocked by" => Slot::Field(Blockers),
            // A bare `Next:` in prose form is what to do, not who does it (the
            // signal block's `Next=` is the agent; there the form says so).
            "next steps" | "next step" | "next" | "next priority" | "next action"
            | "next actions" => Slot::NextSteps,
            _ => Slot::Extra,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Blank,
    /// A `#` heading, or a line that is only the words Context Summary.
    Heading {
        summary: bool,
    },
    /// A code fence, a rule or a signal block line: the wrapping of a block
    /// before its first field, its end after.
    Wrapping,
    Text,
}

/// One line of output, classified once.
struct Line<'a> {
    /// As written, without its line ending.
    text: &'a str,
    kind: Kind,
    /// Without indentation, blockquote markers and list marker.
    body: &'a str,
    /// A list item or an indented line: a continuation of the field above.
    item: bool,
    /// The line as `Key: value`, if it is one.
    pair: Option<(Slot, String, &'a str)>,
}

impl<'a> Line<'a> {
    fn new(text: &'a str) -> Line<'a> {
        let trimmed = text.trim();
        let kind = if trimmed.is_empty() {
            Kind::Blank
        } else if let Some(summary) = heading(trimmed) {
            Kind::Heading { summary }
        } else if is_fence(trimmed) || is_rule(trimmed) {
            Kind::Wrapping
        } else {
            Kind::Text
        };
        let mut body = trimmed;
        while let Some(rest) = body.strip_prefix('>') {
            body = rest.trim_start();
        }
        let listed = strip_list_marker(body).map(|rest| body = rest.trim());
        let pair = key_value(body).map(|(key, value)| (Slot::of(&key), key, value));
        Line {
            text,
            kind,
            body,
            item: listed.is_some() || text.starts_with([' ', '\t']),
            pair,
        }
    }
}

/// One `Key: value` of a block, with the lines under it.
struct Entry<'a> {
    slot: Slot,
    key: String,
    lines: Vec<&'a str>,
}

impl Entry<'_> {
    /// The value so far is empty: the lines under it are its value.
    fn open(&self) -> bool {
        self.lines[0].is_empty()
    }

    /// The value's lines, each without its markdown wrapping, empty ones
    /// dropped.
    fn parts(&self) -> Vec<&str> {
        let parts = self.lines.iter().map(|l| unwrap_value(l));
        parts.filter(|p| !p.is_empty()).collect()
    }

    fn value(&self) -> String {
        self.parts().join("\n")
    }
}

/// A candidate block: its first line (the heading, or the first field), its
/// last, what it holds, and the line where the scan stopped.
struct Scan<'a> {
    start: usize,
    last: usize,
    end: usize,
    entries: Vec<Entry<'a>>,
}

impl Scan<'_> {
    fn distinct_fields(&self) -> u32 {
        let fields = self.entries.iter().filter_map(|e| match e.slot {
            Slot::Field(field) => Some(1u8 << field as u8),
            _ => None,
        });
        fields.fold(0, |seen, field| seen | field).count_ones()
    }
}

/// Reads one block from line `from` on, stopping at the first line that is
/// not part of it.
fn scan_block<'a>(lines: &[Line<'a>], heading_at: Option<usize>, from: usize) -> Scan<'a> {
    let start = heading_at.unwrap_or(from);
    let mut entries: Vec<Entry<'a>> = Vec::new();
    let mut last = start;
    let mut blank_since = false;
    let mut i = from;
    while i < lines.len() {
        let line = &lines[i];
        let started = !entries.is_empty();
        // A signal block line is wrapping too; looked for only here, as few
        // lines are inside a block.
        let kind = match line.kind {
            Kind::Text if split_signal_line(line.text).is_some() => Kind::Wrapping,
            kind => kind,
        };
        match kind {
            Kind::Blank => blank_since = true,
            Kind::Heading { .. } => break,
            Kind::Wrapping if started => break,
            Kind::Wrapping => {}
            Kind::Text => {
                let (open, bare) = entries.last().map_or((false, false), |e| {
                    (e.open(), e.open() && e.lines.len() == 1)
                });
                let entry = |(slot, key, value): &(Slot, String, &'a str)| Entry {
                    slot: *slot,
                    key: key.clone(),
                    lines: vec![*value],
                };
                match &line.pair {
                    Some(pair) if pair.0 != Slot::Extra => entries.push(entry(pair)),
                    // A field whose value is empty so far takes the lines under it.
                    _ if open && (line.item || (bare && !blank_since)) => {
                        entries.last_mut().unwrap().lines.push(line.body);
                    }
                    // Another key inside the block. A bare `Then:` after a
                    // blank line is a lead-in to what follows, not part of it.
                    Some(pair)
                        if (started || heading_at.is_some())
                            && (!pair.2.is_empty() || (started && !blank_since)) =>
                    {
                        entries.push(entry(pair));
                    }
                    _ if started && line.item && !blank_since => {
                        entries.last_mut().unwrap().lines.push(line.body);
                    }
                    _ if started => break,
                    // Prose between the heading and the first field.
                    _ => {}
                }
                if !entries.is_empty() {
                    last = i;
                    blank_since = false;
                }
            }
        }
        i += 1;
    }
    Scan {
        start,
        last,
        end: i,
        entries,
    }
}

fn build_summary(lines: &[Line], scan: &Scan) -> Result<ContextSummary, BlockProblem> {
    let raw: Vec<&str> = lines[scan.start..=scan.last]
        .iter()
        .map(|l| l.text)
        .collect();
    let raw = raw.join("\n");
    let problem = |code, field, message| BlockProblem::new(code, field, message, &raw);
    let none_of =
        "none of the fields Goal, Current State, Next Agent, Confidence, Risk Level, Blockers";
    if scan.distinct_fields() == 0 {
        let title = truncate_chars(lines[scan.start].text.trim(), 80);
        let message = format!("`{title}` is followed by {none_of}");
        return Err(problem(ProblemCode::SummaryMalformed, None, message));
    }
    // The six fields in the seed's order, then the next steps.
    let mut values: [Option<String>; 7] = Default::default();
    let mut seen = [false; 7];
    let (mut confidence, mut risk) = (None, None);
    let mut extra: Vec<(String, String)> = Vec::new();
    for entry in &scan.entries {
        let value = entry.value();
        let (index, label) = match entry.slot {
            Slot::Field(field) => (field as usize, field.label()),
            Slot::NextSteps => (6, "Next Steps"),
            Slot::Extra => {
                let key = normalize_key(&entry.key);
                match extra.iter_mut().find(|(k, _)| normalize_key(k) == key) {
                    None => extra.push((entry.key.clone(), value)),
                    Some((_, old)) if !value.is_empty() => {
                        old.extend((!old.is_empty()).then_some('\n'));
                        old.push_str(&value);
                    }
                    Some(_) => {}
                }
                continue;
            }
        };
        if std::mem::replace(&mut seen[index], true) {
            let message = format!("{label} is given more than once (as `{}`)", entry.key);
            return Err(problem(
                ProblemCode::SummaryDuplicateField,
                Some(label),
                message,
            ));
        }
        if value.is_empty() {
            continue;
        }
        let short = || truncate_chars(&value, 80);
        match entry.slot {
            Slot::Field(SummaryField::Confidence) => {
                confidence = Some(parse_confidence(&value).ok_or_else(|| {
                    let message = format!(
                        "Confidence `{}` is not a whole number from 1 (uncertain) to 5 (verified)",
                        short()
                    );
                    problem(ProblemCode::SummaryInvalidConfidence, Some(label), message)
                })?);
            }
            Slot::Field(SummaryField::RiskLevel) => {
                risk = Some(parse_risk(&value).ok_or_else(|| {
                    let message =
                        format!("Risk Level `{}` is not one of low, medium, high", short());
                    problem(ProblemCode::SummaryInvalidRisk, Some(label), message)
                })?);
            }
            _ => {}
        }
        values[index] = Some(value);
    }
    let missing = missing(SummaryField::ALL, values.iter().map(Option::is_some));
    if missing.len() == SummaryField::ALL.len() {
        let message = format!("{none_of} has a value");
        return Err(problem(ProblemCode::SummaryMalformed, None, message));
    }
    let [
        goal,
        current_state,
        next_agent,
        confidence_raw,
        risk_raw,
        blockers,
        next_steps,
    ] = values;
    Ok(ContextSummary {
        goal,
        current_state,
        next_agent: next_agent.map(|name| NextAgent {
            role: Role::from_value(&name),
            name,
        }),
        confidence: (confidence.zip(confidence_raw)).map(|(level, raw)| Confidence { level, raw }),
        risk_level: risk.zip(risk_raw).map(|(level, raw)| Risk { level, raw }),
        blockers: blockers.map(|raw| {
            let items = match raw.split('\n').all(is_no_blocker) {
                true => Vec::new(),
                false => raw.split('\n').map(str::to_string).collect(),
            };
            Blockers { items, raw }
        }),
        next_steps,
        extra,
        missing,
        raw,
    })
}

/// The fields not `present`, in order.
fn missing<F>(all: impl IntoIterator<Item = F>, present: impl Iterator<Item = bool>) -> Vec<F> {
    all.into_iter()
        .zip(present)
        .filter(|(_, p)| !p)
        .map(|(f, _)| f)
        .collect()
}

#[cfg(test)]
mod tests;
