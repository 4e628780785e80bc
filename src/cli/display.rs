//! How the CLI writes for a person: cleaned text, and on a terminal colour
//! and lines that fit its width.
//!
//! Text from agents, messages and hooks is data: stored as it came, but
//! never written raw to a terminal. An ESC, an OSC or a NUL in a subject, a
//! summary or an error message could retitle the window, clear the screen or
//! hide text from the operator reading `status`. Every human-readable line
//! goes through [`clean`] (the [`say!`] macro, or a [`Line`], which cleans
//! each piece); `--json` output goes through [`super::json`], which escapes
//! the same characters and more. Colour codes are only ever added by
//! [`Line::render`], around text it has cleaned.
//!
//! Whether to colour and how wide the terminal is are decided once per
//! process ([`init`], from `--color`; [`terminal`] reads it): colour only
//! when standard output is a terminal, `NO_COLOR` is unset or empty and
//! `TERM` is not `dumb` ([`wants_colour`]); a width only on a terminal
//! ([`width_of`]). Piped output is never cut, so pipelines can grep every
//! field: only on a terminal is a list line's free text (a summary, a
//! subject, an error message) cut with `…` to fit ([`fit`]), never the
//! columns that identify the row.

use std::borrow::Cow;
use std::io::IsTerminal;
use std::sync::OnceLock;

/// `text` with every control character but newline and tab shown escaped:
/// C0 and DEL as `\xNN`, C1 (U+0080–U+009F) as `\u{NN}`; and the line
/// separators and bidi overrides that reorder what is seen (the characters
/// `--json` escapes too, [`super::json::needs_escape`]) as `\u{NNNN}`. Pure.
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
    (c.is_control() && c != '\n' && c != '\t') || super::json::needs_escape(c)
}

/// `println!` for human-readable output: the line, cleaned, never coloured
/// or cut (for lines that are not part of a listing).
macro_rules! say {
    ($($arg:tt)*) => {
        println!("{}", $crate::cli::display::clean(&format!($($arg)*)))
    };
}
pub(crate) use say;

/// `--color`: when to colour the human-readable output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// On a terminal, unless NO_COLOR is set (not empty) or TERM=dumb
    Auto,
    /// Always, even when piped (NO_COLOR is overridden)
    Always,
    /// Never
    Never,
}

/// Whether to colour (pure): `--color always|never` decides; `auto` only
/// on a terminal, with `NO_COLOR` unset or empty (no-color.org: a command
/// line flag overrides it) and `TERM` not `dumb`.
pub fn wants_colour(
    is_tty: bool,
    no_color: Option<&str>,
    term: Option<&str>,
    choice: ColorChoice,
) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => is_tty && no_color.is_none_or(str::is_empty) && term != Some("dumb"),
    }
}

/// The width to fit lines to (pure): none when not a terminal (piped
/// output is never cut); on a terminal its window size, else `COLUMNS`,
/// else none (nothing is cut on a guess).
pub fn width_of(is_tty: bool, window_columns: Option<u16>, columns: Option<&str>) -> Option<usize> {
    if !is_tty {
        return None;
    }
    window_columns
        .filter(|c| *c > 0)
        .map(usize::from)
        .or_else(|| columns.and_then(|c| c.trim().parse::<usize>().ok()))
        .filter(|c| *c > 0)
}

/// What this process writes to: decided once ([`init`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terminal {
    pub colour: bool,
    /// Lines are fitted to this many characters; `None`: never cut.
    pub width: Option<usize>,
}

static TERMINAL: OnceLock<Terminal> = OnceLock::new();

/// Decide colour and width for this process from `--color`, standard
/// output and the environment. The first call decides; later ones change
/// nothing.
pub fn init(choice: ColorChoice) -> Terminal {
    *TERMINAL.get_or_init(|| detect(choice))
}

/// The decision [`init`] made (`--color auto` if nothing called it).
pub fn terminal() -> Terminal {
    init(ColorChoice::Auto)
}

fn detect(choice: ColorChoice) -> Terminal {
    let is_tty = std::io::stdout().is_terminal();
    let var = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    Terminal {
        colour: wants_colour(
            is_tty,
            var("NO_COLOR").as_deref(),
            var("TERM").as_deref(),
            choice,
        ),
        width: width_of(
            is_tty,
            if is_tty { window_columns() } else { None },
            var("COLUMNS").as_deref(),
        ),
    }
}

/// The terminal's width in columns, `ioctl(TIOCGWINSZ)` on standard
/// output; `None` if it does not say (0, as a fresh pseudo-terminal has).
fn window_columns() -> Option<u16> {
    use nix::libc;
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into the struct passed, which
    // lives for the duration of the call.
    let done = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    (done == 0 && size.ws_col > 0).then_some(size.ws_col)
}

/// `text` cut to `width` characters, its last one `…` when something was
/// cut (pure). Width is counted in characters: a wide (CJK) character or an
/// emoji counts one though it takes two columns.
pub fn fit(text: &str, width: usize) -> Cow<'_, str> {
    if text.chars().count() <= width {
        return Cow::Borrowed(text);
    }
    if width == 0 {
        return Cow::Borrowed("");
    }
    let mut out: String = text.chars().take(width - 1).collect();
    out.push('…');
    Cow::Owned(out)
}

/// How a piece of a [`Line`] looks on a colour terminal: modest and
/// meaningful (outcomes and severities coloured, names bold, times dim).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Plain,
    /// Names: agents, the sender of a message.
    Bold,
    /// Times, cursors, ids: there to be read when needed.
    Dim,
    /// Went well: ok, completed.
    Good,
    /// Needs a look, recovers by itself: warning, held, backoff, timeout.
    Warn,
    /// Failed: error, critical, disabled, corrupt.
    Bad,
}

impl Style {
    /// The style of an outcome, state or severity word as the CLI prints
    /// them (`completed`, `held`, `critical`, `FAIL`, …); plain for any
    /// other word.
    pub fn of(word: &str) -> Style {
        match word.to_ascii_lowercase().as_str() {
            "ok" | "completed" | "success" | "valid" => Style::Good,
            "warn" | "warning" | "held" | "usage_limit" | "backoff" | "retrying" | "timeout"
            | "unsettled" | "paused" | "medium" | "unknown" => Style::Warn,
            "fail" | "failed" | "error" | "critical" | "high" | "disabled" | "corrupt"
            | "missing" | "invalid" | "rejected" => Style::Bad,
            _ => Style::Plain,
        }
    }

    fn sgr(self) -> Option<&'static str> {
        match self {
            Style::Plain => None,
            Style::Bold => Some("\x1b[1m"),
            Style::Dim => Some("\x1b[2m"),
            Style::Good => Some("\x1b[32m"),
            Style::Warn => Some("\x1b[33m"),
            Style::Bad => Some("\x1b[31m"),
        }
    }
}

const RESET: &str = "\x1b[0m";

/// What a line's free text keeps on a terminal however little room the
/// other pieces leave (characters, the `…` included).
pub const MIN_FREE: usize = 20;

/// One line of human-readable output, built from pieces: each is cleaned
/// when added, some styled, and one may be the line's free text, the only
/// piece cut to fit a terminal. Piped (no colour, no width) it renders as
/// the same text `say!` would print.
#[derive(Debug, Default, Clone)]
pub struct Line {
    parts: Vec<Part>,
}

#[derive(Debug, Clone)]
struct Part {
    /// Already cleaned.
    text: String,
    style: Style,
    free: bool,
}

impl Line {
    pub fn new() -> Line {
        Line::default()
    }

    fn push(mut self, style: Style, text: &str, free: bool) -> Line {
        if !text.is_empty() {
            self.parts.push(Part {
                text: clean(text).into_owned(),
                style,
                free,
            });
        }
        self
    }

    /// Plain text.
    pub fn text(self, text: impl AsRef<str>) -> Line {
        self.push(Style::Plain, text.as_ref(), false)
    }

    /// Styled text.
    pub fn styled(self, style: Style, text: impl AsRef<str>) -> Line {
        self.push(style, text.as_ref(), false)
    }

    /// Styled text, left-aligned in a column of `width` characters (as
    /// `{:<width}`; the padding is not styled).
    pub fn cell(self, style: Style, text: impl AsRef<str>, width: usize) -> Line {
        let shown = clean(text.as_ref()).into_owned();
        let pad = width.saturating_sub(shown.chars().count());
        self.push(style, &shown, false).text(" ".repeat(pad))
    }

    /// Styled text, right-aligned in a column of `width` characters.
    pub fn cell_right(self, style: Style, text: impl AsRef<str>, width: usize) -> Line {
        let shown = clean(text.as_ref()).into_owned();
        let pad = width.saturating_sub(shown.chars().count());
        self.text(" ".repeat(pad)).push(style, &shown, false)
    }

    /// The line's free text (a summary, a subject, a message): on a
    /// terminal, cut to what the other pieces leave of its width.
    pub fn free(self, text: impl AsRef<str>) -> Line {
        self.push(Style::Plain, text.as_ref(), true)
    }

    /// The line as text (pure): the pieces, each wrapped in its colour when
    /// `colour`; with a `width`, the free text cut so the line fits it
    /// (its line breaks and tabs as spaces). The other pieces are never cut:
    /// when they leave less than [`MIN_FREE`] characters, the free text
    /// keeps that many and the line is wider than the terminal (it wraps,
    /// rather than lose the subject).
    pub fn render(&self, colour: bool, width: Option<usize>) -> String {
        let fixed: usize = self
            .parts
            .iter()
            .filter(|p| !p.free)
            .map(|p| p.text.chars().count())
            .sum();
        let mut room = width.map(|w| w.saturating_sub(fixed).max(MIN_FREE));
        let mut out = String::new();
        for part in &self.parts {
            let text: Cow<str> = match (&mut room, part.free) {
                (Some(room), true) => {
                    let flat = part.text.replace(['\n', '\t'], " ");
                    let cut = fit(&flat, *room).into_owned();
                    *room = room.saturating_sub(cut.chars().count());
                    Cow::Owned(cut)
                }
                _ => Cow::Borrowed(&part.text),
            };
            match part.style.sgr().filter(|_| colour && !text.is_empty()) {
                Some(code) => {
                    out.push_str(code);
                    out.push_str(&text);
                    out.push_str(RESET);
                }
                None => out.push_str(&text),
            }
        }
        out
    }

    /// The line as this process shows it ([`terminal`]).
    pub fn shown(&self) -> String {
        let t = terminal();
        self.render(t.colour, t.width)
    }

    /// Print the line on standard output.
    pub fn print(&self) {
        println!("{}", self.shown());
    }
}

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
        assert_eq!(
            clean("bidi \u{202e}exe.txt\u{2028}x"),
            "bidi \\u{202e}exe.txt\\u{2028}x"
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color_or_a_dumb_term() {
        use ColorChoice::*;
        // (is_tty, NO_COLOR, TERM, --color) → colour
        let cases = [
            (true, None, Some("xterm-256color"), Auto, true),
            (true, None, None, Auto, true),
            (false, None, Some("xterm"), Auto, false),
            (true, Some("1"), Some("xterm"), Auto, false),
            (true, Some("anything"), Some("xterm"), Auto, false),
            (true, Some(""), Some("xterm"), Auto, true),
            (true, None, Some("dumb"), Auto, false),
            (false, Some("1"), Some("dumb"), Always, true),
            (true, None, Some("xterm"), Never, false),
        ];
        for (tty, no_color, term, choice, expected) in cases {
            assert_eq!(
                wants_colour(tty, no_color, term, choice),
                expected,
                "tty {tty}, NO_COLOR {no_color:?}, TERM {term:?}, --color {choice:?}"
            );
        }
    }

    #[test]
    fn the_width_is_the_window_s_then_columns_and_none_when_piped() {
        assert_eq!(width_of(true, Some(120), Some("60")), Some(120));
        assert_eq!(width_of(true, None, Some("60")), Some(60));
        assert_eq!(width_of(true, Some(0), Some(" 72 ")), Some(72));
        assert_eq!(width_of(true, None, Some("wide")), None);
        assert_eq!(width_of(true, None, Some("0")), None);
        assert_eq!(width_of(true, None, None), None);
        assert_eq!(width_of(false, Some(120), Some("60")), None);
    }

    #[test]
    fn fit_cuts_with_an_ellipsis_counting_characters() {
        assert_eq!(fit("short", 10), "short");
        assert_eq!(fit("exactly10!", 10), "exactly10!");
        assert_eq!(fit("one too long", 11), "one too lo…");
        assert_eq!(fit("ünïcödé wörds", 5), "ünïc…");
        assert_eq!(fit("abc", 1), "…");
        assert_eq!(fit("abc", 0), "");
        assert!(matches!(fit("kept", 4), Cow::Borrowed(_)));
    }

    fn sample() -> Line {
        Line::new()
            .cell(Style::Bold, "rio", 6)
            .styled(Style::Bad, "error")
            .text(" ")
            .free("a long message from the agent\nover two lines")
            .text(" ")
            .styled(Style::Dim, "[id-42]")
    }

    #[test]
    fn a_line_piped_is_the_plain_text_whole() {
        assert_eq!(
            sample().render(false, None),
            "rio   error a long message from the agent\nover two lines [id-42]"
        );
    }

    #[test]
    fn on_a_terminal_only_the_free_text_is_cut_and_colours_wrap_clean_text() {
        let line = sample().render(false, Some(44));
        assert_eq!(line, "rio   error a long message from the… [id-42]");
        assert_eq!(line.chars().count(), 44);
        // Too narrow for the identifying pieces and some free text: they
        // stay whole, and the free text keeps MIN_FREE characters.
        assert_eq!(
            sample().render(false, Some(10)),
            "rio   error a long message from… [id-42]"
        );
        let coloured = sample().render(true, Some(44));
        assert_eq!(
            coloured,
            "\x1b[1mrio\x1b[0m   \x1b[31merror\x1b[0m a long message from the… \x1b[2m[id-42]\x1b[0m"
        );
        // Data's own escapes are shown escaped, inside our colour codes.
        let hostile = Line::new()
            .styled(Style::Bold, "\x1b[2Jname")
            .free("\x1b]0;title\x07")
            .render(true, None);
        assert_eq!(hostile, "\x1b[1m\\x1b[2Jname\x1b[0m\\x1b]0;title\\x07");
    }

    #[test]
    fn words_have_their_meaning_s_style() {
        assert_eq!(Style::of("completed"), Style::Good);
        assert_eq!(Style::of("OK"), Style::Good);
        assert_eq!(Style::of("held"), Style::Warn);
        assert_eq!(Style::of("WARNING"), Style::Warn);
        assert_eq!(Style::of("FAIL"), Style::Bad);
        assert_eq!(Style::of("critical"), Style::Bad);
        assert_eq!(Style::of("idle"), Style::Plain);
    }
}
