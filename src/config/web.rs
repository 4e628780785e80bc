//! `[web]`: the daemon's read-only web view of the fleet (off by default).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::Validator;

/// `[web]`: where the fleet page is served, and who may read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebSettings {
    /// The address the web view listens on; none: no web view.
    pub listen: Option<SocketAddr>,
    /// A file holding the bearer token every request must carry.
    pub token_file: Option<PathBuf>,
    /// Whether message bodies are shown (never by default).
    pub show_bodies: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWeb {
    listen: Option<String>,
    token_file: Option<String>,
    show_bodies: Option<bool>,
}

impl Validator {
    /// `[web]`: an address others can reach needs a token.
    pub(super) fn web(&mut self, raw: &RawWeb) -> WebSettings {
        let token_file = raw.token_file.as_deref().and_then(|text| {
            let path = PathBuf::from(text);
            if !path.is_absolute() {
                self.problem(
                    "web.token_file",
                    format!(
                        "{text:?} must be an absolute path, e.g. \"/etc/agent-state/web.token\""
                    ),
                );
                return None;
            }
            Some(path)
        });
        let listen = raw.listen.as_deref().and_then(|text| {
            match text.parse::<SocketAddr>() {
                Ok(addr) if !addr.ip().is_loopback() && raw.token_file.is_none() => {
                    self.problem(
                        "web.listen",
                        format!(
                            "{text:?} is reachable from other machines: set web.token_file too (a file holding a bearer token), or listen on \"127.0.0.1:8321\""
                        ),
                    );
                    None
                }
                Ok(addr) => Some(addr),
                Err(_) => {
                    self.problem(
                        "web.listen",
                        format!(
                            "{text:?} is not an address and port; write e.g. \"127.0.0.1:8321\" (or \"[::1]:8321\")"
                        ),
                    );
                    None
                }
            }
        });
        WebSettings {
            listen,
            token_file,
            show_bodies: raw.show_bodies.unwrap_or(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_and_token_file_are_checked() {
        // (listen, token_file, problem field or none)
        for (listen, token, problem) in [
            (None, None, None),
            (Some("127.0.0.1:8321"), None, None),
            (Some("[::1]:8321"), None, None),
            (Some("0.0.0.0:8321"), None, Some("web.listen")),
            (Some("192.0.2.1:8321"), None, Some("web.listen")),
            (
                Some("0.0.0.0:8321"),
                Some("/etc/agent-state/web.token"),
                None,
            ),
            (Some("localhost"), None, Some("web.listen")),
            (
                Some("127.0.0.1:8321"),
                Some("web.token"),
                Some("web.token_file"),
            ),
        ] {
            let mut v = Validator::default();
            let got = v.web(&RawWeb {
                listen: listen.map(str::to_string),
                token_file: token.map(str::to_string),
                show_bodies: None,
            });
            let fields: Vec<&str> = v.problems.iter().map(|p| p.field.as_str()).collect();
            assert_eq!(
                fields,
                problem.into_iter().collect::<Vec<_>>(),
                "{listen:?} {token:?}"
            );
            if problem.is_none() {
                assert_eq!(got.listen, listen.map(|l| l.parse().unwrap()));
                assert!(!got.show_bodies);
            }
        }
    }
}
