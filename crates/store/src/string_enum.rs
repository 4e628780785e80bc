//! `string_enum!`: a closed set of words in a file (`"high"`, `"pending"`,
//! `"research"`) as a Rust enum — `as_str`, `Display`, `ALL`, and a
//! `FromStr` whose error names the field and the words allowed.
//!
//! Here, in the base layer, so that the state files (tasks, session, journal)
//! and the inbox share it without one of them lending it to the others.

use std::fmt;

/// A word that is not one of an enum's words: what it was, for which field,
/// and what would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownWord {
    pub what: &'static str,
    pub got: String,
    pub allowed: &'static [&'static str],
}

impl fmt::Display for UnknownWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a {}; use one of: {}",
            self.got,
            self.what,
            self.allowed.join(", ")
        )
    }
}

impl std::error::Error for UnknownWord {}

#[macro_export]
#[doc(hidden)]
macro_rules! __string_enum {
    ($name:ident, $what:literal, $($variant:ident = $text:literal),+ $(,)?) => {
        impl $name {
            pub const ALL: &'static [&'static str] = &[$($text),+];
            pub fn as_str(&self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }
        impl std::str::FromStr for $name {
            type Err = $crate::string_enum::UnknownWord;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    other => Err($crate::string_enum::UnknownWord {
                        what: $what,
                        got: other.to_string(),
                        allowed: Self::ALL,
                    }),
                }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
// Exported (the inbox, in the agent-state crate, uses it too) under its
// name in this module: `use crate::string_enum::string_enum;`.
pub use __string_enum as string_enum;

#[cfg(test)]
mod tests {
    use super::string_enum;

    #[derive(Debug, PartialEq)]
    enum Colour {
        Red,
        Blue,
    }
    string_enum!(Colour, "colour", Red = "red", Blue = "blue");

    #[test]
    fn words_round_trip_and_an_unknown_word_names_the_choices() {
        assert_eq!("red".parse::<Colour>(), Ok(Colour::Red));
        assert_eq!(Colour::Blue.to_string(), "blue");
        let e = "green".parse::<Colour>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"green\" is not a colour; use one of: red, blue"
        );
    }
}
