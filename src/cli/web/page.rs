//! The web view's HTML, script and event chunks (pure: text in, text out).
//! Every text that comes from the state (agents' reports, messages, files)
//! goes through [`escape`].

use serde_json::Value;

use crate::clock::{Timestamp, ago, in_time};
use crate::events::Batch;

/// The headers on every answer: no script but our own file, nothing framed,
/// nothing sniffed, no referrer (a `?token=` never leaves in one).
pub const SECURITY_HEADERS: &[(&str, &str)] = &[
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cache-control", "no-store"),
];

/// The page's one script: on an event for an agent, fetch that agent's row
/// and put it in place. No inline handlers; it is served as `/app.js`.
pub const SCRIPT: &str = r#""use strict";
(function () {
  var token = new URLSearchParams(location.search).get("token");
  var q = token ? "?token=" + encodeURIComponent(token) : "";
  var body = document.body;
  var cursor = body.getAttribute("data-cursor") || "";
  var url = "/events" + q + (cursor ? (q ? "&" : "?") + "after=" + encodeURIComponent(cursor) : "");
  var source = new EventSource(url);
  var pending = {};
  function refresh(agent) {
    if (pending[agent]) { return; }
    pending[agent] = true;
    fetch("/row/" + encodeURIComponent(agent) + q, { cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        pending[agent] = false;
        if (html === null) { return; }
        var t = document.createElement("template");
        t.innerHTML = html;
        var row = t.content.firstElementChild;
        var old = document.getElementById("agent-" + agent);
        if (row && old) { old.replaceWith(row); }
        document.getElementById("live").textContent = "live";
      })
      .catch(function () { pending[agent] = false; });
  }
  source.onmessage = function (e) {
    try {
      var ev = JSON.parse(e.data);
      if (ev.agent) { refresh(ev.agent); }
    } catch (_) { }
  };
  source.onerror = function () {
    document.getElementById("live").textContent = "reconnecting";
  };
})();
"#;

/// `text` safe anywhere in HTML text or a quoted attribute: the five
/// special characters escaped, C0/C1 controls (but tab and newline) and
/// bidi overrides shown as U+FFFD.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' => out.push(c),
            c if c.is_control() => out.push('\u{FFFD}'),
            '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn time_of(v: &Value, key: &str) -> Option<Timestamp> {
    str_of(v, key).and_then(|t| Timestamp::parse(t).ok())
}

/// The fleet page: one row per agent of `lines` (`status --json`).
pub fn fleet(lines: &Value, now: Timestamp, cursor: &str) -> String {
    let mut out = String::new();
    out.push_str(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>agent-state: fleet</title>\
         <style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}\
         td,th{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}\
         .error,.failing{color:#b00}.held{color:#a60}.running{color:#060}</style>\
         </head>\n",
    );
    out.push_str(&format!("<body data-cursor=\"{}\">\n", escape(cursor)));
    out.push_str(&format!(
        "<h1>Fleet</h1>\n<p>{} agents; read at {} <span id=\"live\">(reload for news)</span></p>\n",
        lines.as_array().map_or(0, Vec::len),
        escape(&now.to_string())
    ));
    out.push_str(
        "<table>\n<thead><tr><th>Agent</th><th>Lifecycle</th><th>Status</th>\
         <th>Current session</th><th>Next wake</th><th>Last outcome</th>\
         <th>Errors/30d</th><th>Last error</th><th>Held</th></tr></thead>\n<tbody>\n",
    );
    for line in lines.as_array().into_iter().flatten() {
        out.push_str(&row(line, now));
    }
    out.push_str("</tbody></table>\n<script src=\"/app.js\"></script>\n</body></html>\n");
    out
}

/// One agent's row (also served alone, for the script to swap in).
pub fn row(line: &Value, now: Timestamp) -> String {
    let agent = str_of(line, "agent").unwrap_or("?");
    let status = str_of(line, "status").unwrap_or("");
    let lifecycle = str_of(line, "lifecycle").unwrap_or("");
    let current = match str_of(line, "current_session") {
        None => String::new(),
        Some(id) => {
            let progress = line
                .get("progress")
                .and_then(Value::as_u64)
                .map(|p| format!(", progress {p}"))
                .unwrap_or_default();
            let started = line
                .get("last_session")
                .filter(|l| str_of(l, "id") == Some(id))
                .and_then(|l| time_of(l, "started_at"))
                .map(|t| format!(", started {}", ago(&t, &now)))
                .unwrap_or_default();
            format!("{id}{started}{progress}")
        }
    };
    let next = time_of(line, "next_wake_at")
        .map(|t| format!("{t} ({})", in_time(&t, &now)))
        .unwrap_or_default();
    let last = line
        .get("last_session")
        .filter(|l| !l.is_null())
        .map(|l| {
            let outcome = str_of(l, "outcome").unwrap_or("");
            let reason = str_of(l, "reason")
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            let when = time_of(l, "ended_at")
                .map(|t| format!(" ({})", ago(&t, &now)))
                .unwrap_or_default();
            format!("{outcome}{reason}{when}")
        })
        .unwrap_or_default();
    let errors = line.get("errors_30d").and_then(Value::as_u64).unwrap_or(0);
    let last_error = line
        .get("last_error")
        .filter(|e| !e.is_null())
        .map(|e| {
            format!(
                "{}: {}",
                str_of(e, "code").unwrap_or(""),
                str_of(e, "message").unwrap_or("")
            )
        })
        .unwrap_or_default();
    let held = line
        .get("held")
        .filter(|h| !h.is_null())
        .map(|h| {
            let until = time_of(h, "until")
                .map(|t| format!(" until {t}"))
                .unwrap_or_default();
            format!(
                "{} ({}){until}: {}",
                str_of(h, "credential").unwrap_or(""),
                str_of(h, "cause").unwrap_or(""),
                str_of(h, "reason").unwrap_or("")
            )
        })
        .unwrap_or_default();
    let class = match status {
        "running" => "running",
        "held" => "held",
        s if s.contains("error") || s == "failing" || s == "corrupt" || s == "unreadable" => {
            "error"
        }
        _ => "",
    };
    format!(
        "<tr id=\"agent-{a}\" data-status=\"{s}\"><td>{a}</td><td>{l}</td><td class=\"{class}\">{s}</td>\
         <td>{c}</td><td>{n}</td><td>{o}</td><td>{e}</td><td>{x}</td><td>{h}</td></tr>\n",
        a = escape(agent),
        l = escape(lifecycle),
        s = escape(status),
        c = escape(&current),
        n = escape(&next),
        o = escape(&last),
        e = errors,
        x = escape(&last_error),
        h = escape(&held),
    )
}

/// The agent an event is about: its journal, or a daemon record's agent.
fn agent_of(source_label: &str, event: &Value, from_agent: bool) -> Option<String> {
    if from_agent {
        return Some(source_label.to_string());
    }
    event
        .get("context")
        .and_then(|c| c.get("agent"))
        .or_else(|| event.get("agent"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// A batch as Server-Sent Events: `id` the cursor that resumes right after
/// the event; `data` its source, kind, time and agent (and the whole line
/// only with `[web] show_bodies`, as it may hold message text).
pub fn sse_chunk(batch: &Batch, show_bodies: bool) -> String {
    let mut out = String::new();
    for (event, cursor) in batch.cursors() {
        let from_agent = matches!(event.source, crate::events::SourceId::Agent(_));
        let label = event.source.label().to_string();
        let mut data = serde_json::json!({
            "source": label,
            "kind": event.kind,
            "ts": event.ts_text,
            "agent": agent_of(&label, &event.event, from_agent),
        });
        if show_bodies {
            data["event"] = event.event.clone();
        }
        // serde_json writes no raw newline, so one `data:` line holds it.
        out.push_str(&format!("id: {}\ndata: {}\n\n", cursor.encode(), data));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_controls() {
        for (input, want) in [
            (
                "<script>alert(1)</script>",
                "&lt;script&gt;alert(1)&lt;/script&gt;",
            ),
            (
                "\"><img src=x onerror=alert(1)>",
                "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;",
            ),
            ("a&b 'c'", "a&amp;b &#39;c&#39;"),
            ("bell\u{7}c1\u{9b}x", "bell\u{FFFD}c1\u{FFFD}x"),
            ("rtl\u{202E}gnp.exe", "rtl\u{FFFD}gnp.exe"),
            ("plain\ttext\n", "plain\ttext\n"),
        ] {
            assert_eq!(escape(input), want, "{input:?}");
        }
    }
}
