//! Seed 004's signal block line (`Agent=… | Confidence=… | …`): split into
//! its fields and checked.

use super::*;

/// One signal block line, as it goes into `session.json` `signal_block`.
/// Absent or empty keys are left out of the JSON and listed in `missing`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SignalBlock {
    /// `Agent=`: the seed's `[Planner|Actor|Judge]`, or an agent's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// 1 to 5.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confidence: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk: Option<RiskLevel>,
    /// `Next=`: the seed's `[Planner|Actor|Judge|Human]`, or an agent's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Other `Key=value` parts, in order (a JSON object).
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "pairs::serialize",
        deserialize_with = "pairs::deserialize"
    )]
    pub extra: Vec<(String, String)>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<SignalField>,
    /// The line as written, trimmed.
    pub raw: String,
}

impl SignalBlock {
    /// The seed's role named by `Agent=`, if it names one.
    pub fn agent_role(&self) -> Option<Role> {
        self.agent.as_deref().and_then(Role::from_value)
    }

    /// The seed's role named by `Next=`, if it names one.
    pub fn next_role(&self) -> Option<Role> {
        self.next.as_deref().and_then(Role::from_value)
    }
}

/// Finds the last signal block line in `output` and reads it.
///
/// A line counts when it is `|`-separated parts of which at least two are
/// `Key=value` with one of the seed's six keys (any case; `Risk Level` and
/// `Next Agent` read as `Risk` and `Next`). Around it may be a list marker,
/// backticks, table pipes or a label (`SIGNAL BLOCK: Agent=…`); spaces
/// around `=` and `|` do not matter.
pub fn parse_signal_block(output: &str) -> Option<Result<SignalBlock, BlockProblem>> {
    split_lines(output)
        .into_iter()
        .rev()
        .find_map(|line| split_signal_line(line).map(|parts| build_signal(line, parts)))
}

/// One `|`-separated part of a signal block line: `Ok((key, value))`, or
/// the part's text when it is not `Key=value`.
type Part = Result<(String, String), NotKeyValue>;

/// A part of a signal block line that is not `Key=value` (its text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{}` is not Key=value (expected Agent=… | Cycle=… | Step=… | \
     Confidence=… | Risk=… | Next=…)",
    truncate_chars(.0, 80)
)]
pub(super) struct NotKeyValue(String);

pub(super) fn signal_slot(key: &str) -> Option<SignalField> {
    match normalize_key(key).as_str() {
        "agent" => Some(SignalField::Agent),
        "cycle" => Some(SignalField::Cycle),
        "step" => Some(SignalField::Step),
        "confidence" => Some(SignalField::Confidence),
        "risk" | "risk level" => Some(SignalField::Risk),
        "next" | "next agent" => Some(SignalField::Next),
        _ => None,
    }
}

pub(super) fn is_signal_key_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, ' ' | '\t' | '_' | '-')
}

/// The key of the first part: the words just before `=`, after any label
/// (`SIGNAL BLOCK: Agent`, `` `Agent ``).
pub(super) fn first_key(text: &str) -> &str {
    let text = text.trim_end().trim_end_matches(['*', '`']).trim_end();
    let start = text
        .char_indices()
        .rev()
        .take_while(|(_, c)| is_signal_key_char(*c))
        .last()
        .map_or(text.len(), |(i, _)| i);
    let run = text[start..].trim();
    match run.rsplit(char::is_whitespace).next() {
        Some(word) if signal_slot(run).is_none() && signal_slot(word).is_some() => word,
        _ => run,
    }
}

/// The parts of a signal block line, or `None` if the line is not one.
pub(super) fn split_signal_line(line: &str) -> Option<Vec<Part>> {
    if !line.contains('|') || !line.contains('=') {
        return None;
    }
    let mut body = line.trim();
    while let Some(rest) = body.strip_prefix('>') {
        body = rest.trim_start();
    }
    let body = strip_list_marker(body).map_or(body, str::trim);
    let body = body.trim_matches(|c: char| c == '|' || c.is_whitespace());
    let mut known = 0;
    let parts: Vec<Part> = (body.split('|').enumerate())
        .map(|(n, part)| {
            let part = part.trim();
            let (key, value) =
                (part.split_once('=')).ok_or_else(|| NotKeyValue(part.to_string()))?;
            let key = match n {
                0 => first_key(key),
                _ => key.trim().trim_matches(['*', '`']).trim(),
            };
            let key_ok = (1..=KEY_MAX_CHARS).contains(&key.chars().count())
                && key.starts_with(char::is_alphabetic)
                && key.chars().all(is_signal_key_char);
            if !key_ok {
                return Err(NotKeyValue(part.to_string()));
            }
            known += usize::from(signal_slot(key).is_some());
            let value = value.trim().trim_matches(['`', '*', '"']).trim();
            Ok((key.to_string(), unwrap_value(value).to_string()))
        })
        .collect();
    (parts.len() >= 2 && known >= 2).then_some(parts)
}

pub(super) fn build_signal(line: &str, parts: Vec<Part>) -> Result<SignalBlock, BlockProblem> {
    let raw = line.trim();
    let problem = |code, field, message| BlockProblem::new(code, field, message, raw);
    let mut values: [Option<String>; 6] = Default::default();
    let (mut confidence, mut risk) = (None, None);
    let mut extra = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for part in parts {
        let (key, value) =
            part.map_err(|e| problem(ProblemCode::SignalBlockMalformed, None, e.to_string()))?;
        let slot = signal_slot(&key);
        let identity = slot.map_or_else(|| normalize_key(&key), |s| s.label().to_string());
        if seen.contains(&identity) {
            let message = format!("{identity} is given more than once (as `{key}`)");
            let code = ProblemCode::SignalBlockDuplicateField;
            return Err(problem(code, Some(&identity), message));
        }
        seen.push(identity);
        if value.is_empty() {
            continue;
        }
        let short = || truncate_chars(&value, 80);
        match slot {
            Some(SignalField::Confidence) => {
                confidence = Some(parse_confidence(&value).ok_or_else(|| {
                    let message =
                        format!("Confidence={} is not a whole number from 1 to 5", short());
                    problem(
                        ProblemCode::SignalBlockInvalidConfidence,
                        Some("Confidence"),
                        message,
                    )
                })?);
            }
            Some(SignalField::Risk) => {
                risk = Some(parse_risk(&value).ok_or_else(|| {
                    let message = format!("Risk={} is not one of low, medium, high", short());
                    problem(ProblemCode::SignalBlockInvalidRisk, Some("Risk"), message)
                })?);
            }
            _ => {}
        }
        match slot {
            Some(field) => values[field as usize] = Some(value),
            None => extra.push((key, value)),
        }
    }
    let missing = missing(SignalField::ALL, values.iter().map(Option::is_some));
    let [agent, cycle, step, _, _, next] = values;
    Ok(SignalBlock {
        agent,
        cycle,
        step,
        confidence,
        risk,
        next,
        extra,
        missing,
        raw: raw.to_string(),
    })
}
