//! How the CLI writes JSON (`--json`): one printer for every command, so
//! what a script reads is valid JSON that parses back to the stored text,
//! and what a person sees when it reaches a terminal (`… --json | less`,
//! a log viewer) cannot be steered by it.
//!
//! serde_json escapes only what JSON requires (`"`, `\` and C0 controls).
//! Text from agents, messages and hooks may also carry DEL, the C1 controls
//! (U+009B is a one-character CSI, as dangerous as ESC `[` on many
//! terminals), the line and paragraph separators U+2028/U+2029 (line breaks
//! for JavaScript and some viewers) and the bidirectional overrides that
//! reorder what a reader sees (U+202A–U+202E, U+2066–U+2069, and the marks
//! U+061C, U+200E, U+200F). [`Escaping`] writes each of those as a `\uXXXX`
//! escape: the same string to any JSON parser, inert on a screen. It must
//! never change what the JSON means, only how it is spelled.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};

use crate::error::{Error, Result};

/// Whether `c` is written as a `\uXXXX` escape beyond what JSON requires.
pub fn needs_escape(c: char) -> bool {
    matches!(c,
        '\u{7f}'..='\u{9f}'
        | '\u{61c}'
        | '\u{200e}' | '\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}')
}

/// Write `text` with every [`needs_escape`] character as `\uXXXX`. Inside
/// a JSON string that is the same string; these characters cannot occur
/// outside one in valid JSON.
fn write_escaped<W: ?Sized + Write>(writer: &mut W, text: &str) -> io::Result<()> {
    let mut start = 0;
    for (at, c) in text.char_indices() {
        if needs_escape(c) {
            writer.write_all(&text.as_bytes()[start..at])?;
            write!(writer, "\\u{:04x}", c as u32)?;
            start = at + c.len_utf8();
        }
    }
    writer.write_all(&text.as_bytes()[start..])
}

/// `text` (JSON) with every [`needs_escape`] character escaped: for JSON
/// that is printed as it was stored (`inbox show --json`). Pure.
pub fn escape_text(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len());
    write_escaped(&mut out, text).expect("writing to a Vec");
    String::from_utf8(out).expect("escapes are ASCII")
}

/// A serde_json formatter (compact or pretty) that also escapes the
/// characters of [`needs_escape`], in strings, keys and raw values.
pub struct Escaping<F>(pub F);

macro_rules! delegate {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {
        $(
            fn $name<W: ?Sized + Write>(&mut self, writer: &mut W $(, $arg: $ty)*) -> io::Result<()> {
                self.0.$name(writer $(, $arg)*)
            }
        )*
    };
}

impl<F: Formatter> Formatter for Escaping<F> {
    // The layout (what PrettyFormatter changes) is the inner formatter's.
    delegate! {
        begin_array();
        end_array();
        begin_array_value(first: bool);
        end_array_value();
        begin_object();
        end_object();
        begin_object_key(first: bool);
        end_object_key();
        begin_object_value();
        end_object_value();
    }

    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        write_escaped(writer, fragment)
    }

    fn write_raw_fragment<W: ?Sized + Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        write_escaped(writer, fragment)
    }
}

/// `value` as indented JSON, escaped ([`Escaping`]).
pub fn to_string_pretty<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    let mut out = Vec::with_capacity(256);
    let mut ser =
        serde_json::Serializer::with_formatter(&mut out, Escaping(PrettyFormatter::new()));
    value
        .serialize(&mut ser)
        .map_err(|e| Error::Data(e.to_string()))?;
    Ok(String::from_utf8(out).expect("serde_json writes UTF-8"))
}

/// Write `value` as one line of JSON (no newline), escaped ([`Escaping`]).
pub fn write_line<W: Write, T: Serialize + ?Sized>(writer: W, value: &T) -> io::Result<()> {
    let mut ser = serde_json::Serializer::with_formatter(writer, Escaping(CompactFormatter));
    value.serialize(&mut ser).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (stored text, how it is spelled inside the JSON string)
    const CASES: &[(&str, &str)] = &[
        ("plain é ✓", "plain é ✓"),
        ("csi \u{9b}2J", "csi \\u009b2J"),
        ("del \u{7f}", "del \\u007f"),
        ("c1 \u{80}\u{9f} and \u{a0}", "c1 \\u0080\\u009f and \u{a0}"),
        ("esc \u{1b}[31m", "esc \\u001b[31m"),
        ("sep \u{2028}\u{2029}", "sep \\u2028\\u2029"),
        (
            "bidi \u{202e}txt.exe\u{202c} \u{2066}\u{2069}",
            "bidi \\u202etxt.exe\\u202c \\u2066\\u2069",
        ),
        (
            "marks \u{200e}\u{200f}\u{61c}",
            "marks \\u200e\\u200f\\u061c",
        ),
        ("zwj \u{200d} kept", "zwj \u{200d} kept"),
    ];

    #[test]
    fn unsafe_characters_are_escaped_and_parse_back_the_same() {
        for (text, spelled) in CASES {
            let mut line = Vec::new();
            write_line(&mut line, &serde_json::json!({ *text: text })).unwrap();
            let line = String::from_utf8(line).unwrap();
            assert_eq!(line, format!("{{\"{spelled}\":\"{spelled}\"}}"), "{text:?}");
            let back: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(back[*text], *text, "{text:?}");
            let pretty = to_string_pretty(&vec![*text]).unwrap();
            assert_eq!(pretty, format!("[\n  \"{spelled}\"\n]"), "{text:?}");
            assert!(!pretty.chars().any(needs_escape), "{pretty:?}");
        }
    }

    #[test]
    fn stored_json_is_escaped_without_changing_its_meaning() {
        let stored = "{\n  \"subject\": \"a\u{9b}b\u{2028}\",\n  \"n\": 1\n}";
        let shown = escape_text(stored);
        assert_eq!(
            shown,
            "{\n  \"subject\": \"a\\u009bb\\u2028\",\n  \"n\": 1\n}"
        );
        let a: serde_json::Value = serde_json::from_str(stored).unwrap();
        let b: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn raw_values_are_escaped_too() {
        let raw = serde_json::value::RawValue::from_string("\"x\u{9b}\"".into()).unwrap();
        assert_eq!(to_string_pretty(&raw).unwrap(), "\"x\\u009b\"");
    }
}
