//! The web view's HTML, script and event chunks (pure: text in, text out).
//! Every text that comes from the state (agents' reports, messages, files)
//! goes through [`escape`].

use serde_json::Value;

use crate::clock::{Timestamp, ago, in_time};
use crate::events::{Batch, Cursor, StreamEvent};

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

/// The pages' one script, served as `/app.js` (no inline script, no
/// inline handlers). On the fleet page, an event for an agent fetches that
/// agent's row and puts it in place; on an agent's page, its events fetch
/// the page's live part and `log` events append to the session's log; the
/// flows and mailbox pages fetch themselves again on any event.
pub const SCRIPT: &str = r##""use strict";
(function () {
  var token = new URLSearchParams(location.search).get("token");
  var q = token ? "?token=" + encodeURIComponent(token) : "";
  function withQ(path, more) {
    var parts = [];
    if (token) { parts.push("token=" + encodeURIComponent(token)); }
    for (var k in more) { if (more[k]) { parts.push(k + "=" + encodeURIComponent(more[k])); } }
    return path + (parts.length ? "?" + parts.join("&") : "");
  }
  var body = document.body;
  var cursor = body.getAttribute("data-cursor") || "";
  var agentPage = body.getAttribute("data-agent");
  var reloadPage = body.getAttribute("data-reload");
  // The log as the page showed it: the stream goes on from there.
  var shown = agentPage ? document.getElementById("log") : null;
  var source = new EventSource(withQ("/events", {
    after: cursor,
    log: agentPage,
    log_file: shown && shown.getAttribute("data-log-file"),
    log_from: shown && shown.getAttribute("data-log-from")
  }));
  var pending = {};
  function live(text) {
    var el = document.getElementById("live");
    if (el) { el.textContent = text; }
  }
  // One fetch per part at a time; an event that comes during it fetches
  // the part once more after it (its news may be newer than the answer).
  function swap(key, url, find) {
    if (pending[key]) { pending[key] = "again"; return; }
    pending[key] = true;
    function done() {
      var again = pending[key] === "again";
      pending[key] = false;
      if (again) { swap(key, url, find); }
    }
    fetch(url, { cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html !== null) {
          var t = document.createElement("template");
          t.innerHTML = html;
          var fresh = find(t.content);
          var old = find(document);
          if (fresh && old) { keepLog(old, fresh); old.replaceWith(fresh); }
          live("live");
        }
        done();
      })
      .catch(done);
  }
  // A part fetched again shows the log's tail as it was when the server
  // rendered it, maybe older than what the stream has shown since: the log
  // shown is kept while it is the same file; a new file's tail is taken.
  function keepLog(old, fresh) {
    var was = old.querySelector ? old.querySelector("#log") : null;
    var now = fresh.querySelector ? fresh.querySelector("#log") : null;
    if (!now) { return; }
    var file = now.getAttribute("data-log-file");
    if (was && file && was.getAttribute("data-log-file") === file) {
      now.replaceWith(was);
    } else if (file) {
      shownTo[file] = Math.max(shownTo[file] || 0, Number(now.getAttribute("data-log-from")) || 0);
    }
  }
  // An event's journal line is written before the files a page shows
  // (report.json, session.json): the part is fetched at once, and again a
  // second after the last event about it, when those are written too.
  var settle = {};
  function update(key, url, find) {
    swap(key, url, find);
    clearTimeout(settle[key]);
    settle[key] = setTimeout(function () { swap(key, url, find); }, 1000);
  }
  function byId(id) { return function (root) { return root.getElementById ? root.getElementById(id) : root.querySelector("#" + id); }; }
  source.onopen = function () { live("live"); };
  source.onmessage = function (e) {
    var ev;
    try { ev = JSON.parse(e.data); } catch (_) { return; }
    if (agentPage) {
      if (ev.agent === agentPage) {
        update("part", withQ("/agent/" + encodeURIComponent(agentPage) + "/part", {}), byId("part"));
      }
    } else if (reloadPage) {
      update("main", withQ(location.pathname, {}), byId("main"));
    } else if (ev.agent) {
      update(ev.agent, withQ("/row/" + encodeURIComponent(ev.agent), {}), byId("agent-" + ev.agent));
    }
  };
  // How far the page showed each log (bytes): a reconnect opens the stream
  // with the URL it was opened with, so the log comes again from the
  // page's first offset; what was shown already is dropped.
  var shownTo = {};
  if (shown && shown.getAttribute("data-log-file")) {
    shownTo[shown.getAttribute("data-log-file")] = Number(shown.getAttribute("data-log-from")) || 0;
  }
  source.addEventListener("log", function (e) {
    var ev;
    try { ev = JSON.parse(e.data); } catch (_) { return; }
    var log = document.getElementById("log");
    if (!log || typeof ev.text !== "string") { return; }
    var add = ev.text;
    if (typeof ev.file === "string" && typeof ev.end === "number") {
      var upTo = shownTo[ev.file] || 0;
      if (ev.end <= upTo) { return; }
      var bytes = new TextEncoder().encode(ev.text);
      var start = ev.end - bytes.length;
      if (start < upTo) { add = new TextDecoder().decode(bytes.subarray(upTo - start)); }
      shownTo[ev.file] = ev.end;
    }
    var text = log.textContent + add;
    log.textContent = text.length > 65536 ? text.slice(text.length - 65536) : text;
  });
  source.onerror = function () { live("reconnecting"); };
})();
"##;

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

/// How many bytes at the end of `bytes` are the start of a UTF-8
/// character not complete yet (0 to 3): a log read that ended in the middle
/// of a character keeps them for the next read rather than show U+FFFD
/// (pure). Bytes that can never be completed count as complete (they show
/// as U+FFFD where they are).
pub fn incomplete_utf8(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let b = bytes[bytes.len() - back];
        if b & 0xC0 == 0x80 {
            // A continuation byte: its lead is further back.
            continue;
        }
        let need = match b {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn time_of(v: &Value, key: &str) -> Option<Timestamp> {
    str_of(v, key).and_then(|t| Timestamp::parse(t).ok())
}

const STYLE: &str = "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}\
td,th{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}\
.error,.failing{color:#b00}.held{color:#a60}.running{color:#060}\
pre{background:#f6f6f6;padding:.5em;max-height:30em;overflow:auto;white-space:pre-wrap}\
.bar{display:inline-block;width:6em;height:.7em;background:#eee;vertical-align:middle}\
.bar span{display:block;height:100%;background:#4a8}.bar .over{background:#b00}\
nav a{margin-right:1em}";

/// A whole page: the head (our style, nothing external), `attrs` on the
/// body (for the script), `content` in `<main id="main">`, our one script.
pub fn layout(title: &str, attrs: &str, content: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{}</title><style>{STYLE}</style></head>\n<body {attrs}>\n\
         <nav><a href=\"/\">Fleet</a><a href=\"/flows\">Flows</a><a href=\"/mailbox\">Mailbox</a></nav>\n\
         <main id=\"main\">\n{content}</main>\n<script src=\"/app.js\"></script>\n</body></html>\n",
        escape(title)
    )
}

/// The fleet page: one row per agent of `lines` (`status --json`), with
/// `usage` (`usage --json`) for each agent's sessions per day.
pub fn fleet(lines: &Value, usage: &Value, now: Timestamp, cursor: &str) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "<h1>Fleet</h1>\n<p>{} agents; read at {} <span id=\"live\">(reload for news)</span></p>\n",
        lines.as_array().map_or(0, Vec::len),
        escape(&now.to_string())
    ));
    out.push_str(
        "<table>\n<thead><tr><th>Agent</th><th>Lifecycle</th><th>Status</th>\
         <th>Current session</th><th>Next wake</th><th>Last outcome</th>\
         <th>Errors/30d</th><th>Last error</th><th>Budget today</th><th>Held until</th>\
         <th>Sessions/day</th></tr></thead>\n<tbody>\n",
    );
    for line in lines.as_array().into_iter().flatten() {
        out.push_str(&row(line, usage, now));
    }
    out.push_str("</tbody></table>\n");
    layout(
        "agent-state: fleet",
        &format!("data-cursor=\"{}\"", escape(cursor)),
        &out,
    )
}

/// The last [`SPARK_DAYS`] days' session counts of `agent` in `usage`
/// (`usage --json`: days newest first), oldest first (pure).
pub fn sessions_per_day(usage: &Value, agent: &str) -> Vec<u64> {
    let Some(today) = usage
        .get("today")
        .and_then(Value::as_str)
        .and_then(|d| chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d").ok())
    else {
        return Vec::new();
    };
    let mut counts = vec![0u64; SPARK_DAYS];
    for day in usage
        .get("days")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(date) = day
            .get("date")
            .and_then(Value::as_str)
            .and_then(|d| chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d").ok())
        else {
            continue;
        };
        let back = (today - date).num_days();
        if (0..SPARK_DAYS as i64).contains(&back) {
            counts[SPARK_DAYS - 1 - back as usize] =
                day["agents"][agent]["sessions"].as_u64().unwrap_or(0);
        }
    }
    counts
}

/// How many days a sparkline shows, today the last.
pub const SPARK_DAYS: usize = 14;

/// A small inline SVG of `counts` as bars (pure; numbers only, nothing
/// from the state as text but the title's counts).
pub fn sparkline(counts: &[u64]) -> String {
    if counts.is_empty() {
        return String::new();
    }
    let (w, h) = (4 * counts.len(), 16);
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    let mut out = format!(
        "<svg class=\"spark\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">\
         <title>sessions per day, last {} days: {}</title>",
        counts.len(),
        counts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
    for (i, c) in counts.iter().enumerate() {
        let bar = if *c == 0 {
            1
        } else {
            1 + (c * 15 / max) as usize
        };
        out.push_str(&format!(
            "<rect x=\"{}\" y=\"{}\" width=\"3\" height=\"{bar}\" fill=\"{}\"/>",
            4 * i,
            h - bar,
            if *c == 0 { "#ccc" } else { "#48a" }
        ));
    }
    out.push_str("</svg>");
    out
}

/// Today's use against the daily budget, one bar per limit the agent has
/// (from `today`, `budget_left` and `budget_exceeded` of its status line).
pub fn budget_bars(line: &Value) -> String {
    let Some(left) = line.get("budget_left").filter(|l| !l.is_null()) else {
        return String::new();
    };
    let today = &line["today"];
    let exceeded = line.get("budget_exceeded").and_then(Value::as_str);
    let mut out = String::new();
    let limits: [(&str, &str, Option<f64>); 4] = [
        ("sessions", "sessions", today["sessions"].as_f64()),
        (
            "runtime_seconds",
            "runtime",
            today["runtime_seconds"].as_f64(),
        ),
        ("cost_usd", "cost", today["cost_usd"].as_f64()),
        ("tokens", "tokens", today["tokens"]["total"].as_f64()),
    ];
    for (key, label, used) in limits {
        let Some(l) = left.get(key).and_then(Value::as_f64) else {
            continue;
        };
        let used = used.unwrap_or(0.0);
        let max = used + l;
        let share = if max > 0.0 {
            (used / max).min(1.0)
        } else {
            1.0
        };
        let over = l <= 0.0 || exceeded.is_some_and(|e| e.contains(label));
        let shown = |v: f64| match key {
            "cost_usd" => format!("${v:.2}"),
            "runtime_seconds" => format!("{}m", (v / 60.0).round()),
            _ => format!("{v:.0}"),
        };
        out.push_str(&format!(
            "<div>{label} <span class=\"bar\" title=\"{} of {}\"><span class=\"{}\" style=\"width:{:.0}%\"></span></span> {}/{}</div>",
            shown(used),
            shown(max),
            if over { "over" } else { "" },
            share * 100.0,
            shown(used),
            shown(max),
        ));
    }
    out
}

/// One agent's row (also served alone, for the script to swap in), with
/// its sessions per day from `usage` (`usage --json`).
pub fn row(line: &Value, usage: &Value, now: Timestamp) -> String {
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
                .map(|t| format!("{t} ({}) ", in_time(&t, &now)))
                .unwrap_or_else(|| "until released: ".into());
            format!(
                "{until}{} ({}): {}",
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
        "<tr id=\"agent-{a}\" data-status=\"{s}\"><td><a href=\"/agent/{a}\">{a}</a></td><td>{l}</td><td class=\"{class}\">{s}</td>\
         <td>{c}</td><td>{n}</td><td>{o}</td><td>{e}</td><td>{x}</td><td>{b}</td><td class=\"held\">{h}</td>\
         <td>{p}</td></tr>\n",
        a = escape(agent),
        b = budget_bars(line),
        p = sparkline(&sessions_per_day(usage, agent)),
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

/// A batch as Server-Sent Events (see [`sse_event`]).
pub fn sse_chunk(batch: &Batch, show_bodies: bool) -> String {
    batch
        .cursors()
        .map(|(event, cursor)| sse_event(event, &cursor, show_bodies))
        .collect()
}

/// One event as Server-Sent Events: `id` the cursor that resumes right
/// after it; `data` its source, kind, time and agent (and the whole line
/// only with `[web] show_bodies`, as it may hold message text).
pub fn sse_event(event: &StreamEvent, cursor: &Cursor, show_bodies: bool) -> String {
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
    format!("id: {}\ndata: {}\n\n", cursor.encode(), data)
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

    #[test]
    fn an_incomplete_character_at_the_end_is_kept_back() {
        // "é" is C3 A9, "€" E2 82 AC, "😀" F0 9F 98 80.
        for (bytes, keep) in [
            (&b""[..], 0),
            (b"abc", 0),
            (b"ab\xC3", 1),
            (b"ab\xC3\xA9", 0),
            (b"\xE2", 1),
            (b"x\xE2\x82", 2),
            (b"x\xE2\x82\xAC", 0),
            (b"\xF0\x9F\x98", 3),
            (b"\xF0\x9F\x98\x80", 0),
            // Never completed: shown where they are.
            (b"a\xFF", 0),
            (b"a\x80\x80\x80", 0),
            (b"a\xC0", 0),
        ] {
            assert_eq!(incomplete_utf8(bytes), keep, "{bytes:?}");
        }
    }

    #[test]
    fn sessions_per_day_oldest_first_today_last() {
        let usage = serde_json::json!({
            "today": "2026-11-20",
            "days": [
                {"date": "2026-11-20", "agents": {"rio": {"sessions": 3}}},
                {"date": "2026-11-18", "agents": {"rio": {"sessions": 1}, "ada": {"sessions": 9}}},
                {"date": "2026-10-01", "agents": {"rio": {"sessions": 7}}},
            ]
        });
        let counts = sessions_per_day(&usage, "rio");
        assert_eq!(counts.len(), SPARK_DAYS);
        assert_eq!(counts[SPARK_DAYS - 1], 3);
        assert_eq!(counts[SPARK_DAYS - 3], 1);
        assert_eq!(counts.iter().sum::<u64>(), 4);
        assert!(sessions_per_day(&Value::Null, "rio").is_empty());
    }

    #[test]
    fn a_sparkline_is_one_bar_a_day_scaled_to_the_most() {
        let svg = sparkline(&[0, 1, 2, 4]);
        assert!(svg.starts_with("<svg class=\"spark\""), "{svg}");
        assert_eq!(svg.matches("<rect").count(), 4);
        // The tallest bar fills the height; an empty day is a 1px stub.
        assert!(svg.contains("y=\"0\" width=\"3\" height=\"16\""), "{svg}");
        assert!(
            svg.contains("x=\"0\" y=\"15\" width=\"3\" height=\"1\" fill=\"#ccc\""),
            "{svg}"
        );
        assert_eq!(sparkline(&[]), "");
    }

    #[test]
    fn budget_bars_show_each_limit_and_what_is_over() {
        let line = serde_json::json!({
            "today": {"sessions": 2, "runtime_seconds": 0, "cost_usd": 1.5, "tokens": {"total": 0}},
            "budget_left": {"sessions": 2, "runtime_seconds": null, "cost_usd": 0.0, "tokens": null},
            "budget_exceeded": "max_cost_usd reached: $1.50 of $1.50"
        });
        let bars = budget_bars(&line);
        assert!(bars.contains("sessions <span class=\"bar\" title=\"2 of 4\"><span class=\"\" style=\"width:50%\">"), "{bars}");
        assert!(bars.contains("cost <span class=\"bar\" title=\"$1.50 of $1.50\"><span class=\"over\" style=\"width:100%\">"), "{bars}");
        assert!(
            !bars.contains("runtime") && !bars.contains("tokens"),
            "{bars}"
        );
        assert_eq!(budget_bars(&serde_json::json!({"budget_left": null})), "");
    }

    #[test]
    fn a_held_row_says_until_when_and_why() {
        let now = Timestamp::parse("2026-11-20T10:00:00Z").unwrap();
        let line = serde_json::json!({
            "agent": "rio", "status": "held",
            "held": {"credential": "claude-main", "cause": "usage_limit",
                     "until": "2026-11-20T12:00:00Z", "reason": "<b>limit</b>"}
        });
        let shown = row(&line, &Value::Null, now);
        assert!(
            shown.contains("<td class=\"held\">2026-11-20T12:00:00Z (in 2h) claude-main (usage_limit): &lt;b&gt;limit&lt;/b&gt;</td>"),
            "{shown}"
        );
        let line = serde_json::json!({
            "agent": "rio", "status": "held",
            "held": {"credential": "c", "cause": "disabled", "reason": "cap"}
        });
        assert!(row_of(&line, now).contains(">until released: c (disabled): cap</td>"));

        fn row_of(line: &Value, now: Timestamp) -> String {
            row(line, &Value::Null, now)
        }
    }
}
