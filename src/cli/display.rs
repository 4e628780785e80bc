//! Text from agents, messages and hooks is data: stored as it came, but
//! never written raw to a terminal. An ESC, an OSC or a NUL in a subject, a
//! summary or an error message could retitle the window, clear the screen or
//! hide text from the operator reading `status`. Every human-readable line
//! goes through [`clean`]; `--json` output is JSON-escaped by serde already.

use std::borrow::Cow;

/// `text` with every control character but newline and tab shown escaped:
/// C0 and DEL as `\xNN`, C1 (U+0080–U+009F) as `\u{NN}`. Pure.
pub fn clean(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !is_unsafe(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    Cow::Owned(out)
}

fn is_unsafe(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t') || c == '\u{7f}'
}

/// `println!` for human-readable output: the line, cleaned.
macro_rules! say {
    ($($arg:tt)*) => {
        println!("{}", $crate::cli::display::clean(&format!($($arg)*)))
    };
}
pub(crate) use say;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_text_is_kept() {
        assert_eq!(clean("plain — ü\tand\nlines"), "plain — ü\tand\nlines");
        assert_eq!(
            clean("\x1b]0;pwned\x07\x1b[2J\0end\r\u{9b}31m\u{7f}"),
            "\\x1b]0;pwned\\x07\\x1b[2J\\x00end\\x0d\\u{9b}31m\\x7f"
        );
        assert!(matches!(clean("nothing to do"), Cow::Borrowed(_)));
    }
}
