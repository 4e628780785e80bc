//! The agent, flows and mailbox pages (pure: the JSON of [`super::data`]
//! in, HTML out). Every text from the state goes through [`escape`].

use serde_json::Value;

use super::page::{escape, layout};
use crate::clock::{Timestamp, ago};

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn when(v: &Value, key: &str, now: Timestamp) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .and_then(|t| Timestamp::parse(t).ok())
        .map(|t| format!("{t} ({})", ago(&t, &now)))
        .unwrap_or_default()
}

/// `{"error": …}` in place of a part that could not be read.
fn failed(v: &Value) -> Option<String> {
    v.get("error")
        .and_then(Value::as_str)
        .map(|e| format!("<p class=\"error\">cannot read: {}</p>\n", escape(e)))
}

fn duration(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// memory.md as minimal markdown: `#` headings, `-`/`*` list items and
/// paragraphs; every line escaped, nothing else interpreted.
pub fn markdown(text: &str) -> String {
    let mut out = String::new();
    let mut in_list = false;
    let mut para: Vec<&str> = Vec::new();
    let flush = |out: &mut String, para: &mut Vec<&str>| {
        if !para.is_empty() {
            out.push_str(&format!("<p>{}</p>\n", escape(&para.join("\n"))));
            para.clear();
        }
    };
    for line in text.lines() {
        let t = line.trim_end();
        let item = t
            .strip_prefix("- ")
            .or_else(|| t.strip_prefix("* "))
            .or_else(|| t.strip_prefix("  - "));
        if item.is_none() && in_list {
            out.push_str("</ul>\n");
            in_list = false;
        }
        if let Some(rest) = t.strip_prefix('#') {
            flush(&mut out, &mut para);
            let level = 1 + rest.chars().take_while(|c| *c == '#').count();
            let title = rest.trim_start_matches('#').trim();
            let h = (level + 2).min(6);
            out.push_str(&format!("<h{h}>{}</h{h}>\n", escape(title)));
        } else if let Some(rest) = item {
            flush(&mut out, &mut para);
            if !in_list {
                out.push_str("<ul>\n");
                in_list = true;
            }
            out.push_str(&format!("<li>{}</li>\n", escape(rest)));
        } else if t.is_empty() {
            flush(&mut out, &mut para);
        } else {
            para.push(t);
        }
    }
    flush(&mut out, &mut para);
    if in_list {
        out.push_str("</ul>\n");
    }
    out
}

/// The part of an agent's page the script refreshes on its events (also
/// served alone as `/agent/NAME/part`).
pub fn agent_part(a: &Value, now: Timestamp) -> String {
    let mut out = String::from("<div id=\"part\">\n");
    let st = &a["status"];
    out.push_str(&format!(
        "<p>Status <b class=\"st\">{}</b>; lifecycle {}; next wake {}</p>\n",
        escape(s(st, "status")),
        escape(s(st, "lifecycle")),
        escape(&when(st, "next_wake_at", now)),
    ));
    if let Some(r) = a.get("running").filter(|r| !r.is_null()) {
        out.push_str("<h2>Running session</h2>\n");
        if let Some(e) = failed(r) {
            out.push_str(&e);
        } else {
            out.push_str(&format!(
                "<p>{} started {}{}</p>\n",
                escape(s(r, "session_id")),
                escape(&when(r, "started_at", now)),
                st.get("progress")
                    .and_then(Value::as_u64)
                    .map(|p| format!(", progress {p}%"))
                    .unwrap_or_default()
            ));
            if let Some(w) = r.get("workspace").filter(|w| !w.is_null()) {
                out.push_str(&format!(
                    "<p>Workspace {} (branch {}) of {}</p>\n",
                    escape(s(w, "path")),
                    escape(s(w, "branch")),
                    escape(s(w, "repo"))
                ));
            }
            let its = r["iterations"].as_array().cloned().unwrap_or_default();
            if !its.is_empty() {
                out.push_str("<ul class=\"its\">\n");
                for i in &its {
                    out.push_str(&format!(
                        "<li>iteration {} of {}: {}{}</li>\n",
                        i["n"],
                        i["of"],
                        escape(i["verify"].as_str().unwrap_or("running")),
                        i["failure"]
                            .as_str()
                            .map(|f| format!(" ({})", escape(f)))
                            .unwrap_or_default()
                    ));
                }
                out.push_str("</ul>\n");
            }
            let log = &r["log"];
            out.push_str(&format!("<h3>{}</h3>\n", escape(s(log, "file"))));
            let tail = &log["tail"];
            match failed(tail) {
                Some(e) => out.push_str(&e),
                None => out.push_str(&format!(
                    "<pre id=\"log\" data-log-file=\"{}\" data-log-from=\"{}\">{}</pre>\n",
                    escape(s(log, "file").trim_start_matches("sessions/")),
                    tail["offset"].as_u64().unwrap_or(0),
                    escape(s(tail, "text"))
                )),
            }
        }
    }
    out.push_str("<h2>Recent sessions</h2>\n");
    match failed(&a["sessions"]) {
        Some(e) => out.push_str(&e),
        None => {
            out.push_str(
                "<table><thead><tr><th>Session</th><th>Started</th><th>Outcome</th>\
                 <th>Duration</th><th>Tokens</th><th>Cost</th><th>Reason</th></tr></thead><tbody>\n",
            );
            for x in a["sessions"].as_array().into_iter().flatten() {
                let outcome = x["outcome"].as_str().unwrap_or("running");
                out.push_str(&format!(
                    "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                    escape(s(x, "session_id")),
                    escape(&when(x, "started_at", now)),
                    if matches!(outcome, "error" | "timeout") { "error" } else { "" },
                    escape(outcome),
                    duration(x["runtime_seconds"].as_u64().unwrap_or(0)),
                    x["tokens"]["total"].as_u64().unwrap_or(0),
                    x["cost_usd"]
                        .as_f64()
                        .map(|c| format!("${c:.2}"))
                        .unwrap_or_default(),
                    escape(
                        &[s(x, "code"), s(x, "reason")]
                            .iter()
                            .filter(|t| !t.is_empty())
                            .copied()
                            .collect::<Vec<_>>()
                            .join(": ")
                    ),
                ));
            }
            out.push_str("</tbody></table>\n");
        }
    }
    out.push_str("</div>\n");
    out
}

fn inbox_html(inbox: &Value, now: Timestamp, show_bodies: bool) -> String {
    if let Some(e) = failed(inbox) {
        return e;
    }
    let mut out = String::new();
    let waiting = inbox["waiting"].as_array().cloned().unwrap_or_default();
    let rejected = inbox["rejected"].as_array().cloned().unwrap_or_default();
    out.push_str(&format!(
        "<p>{} waiting, {} claimed, {} rejected, {} processed</p>\n",
        waiting.len(),
        inbox["claimed"].as_array().map_or(0, Vec::len),
        rejected.len(),
        inbox["processed"].as_u64().unwrap_or(0)
    ));
    if !waiting.is_empty() {
        out.push_str("<h3>Waiting</h3>\n<ul class=\"inbox\">\n");
        for w in &waiting {
            out.push_str(&message_li(w, now, show_bodies));
        }
        out.push_str("</ul>\n");
    }
    if !rejected.is_empty() {
        out.push_str("<h3>Rejected</h3>\n<ul class=\"inbox\">\n");
        for r in &rejected {
            out.push_str(&format!(
                "<li>{}: {}</li>\n",
                escape(s(r, "file")),
                escape(r["reason"].as_str().unwrap_or("no reason recorded"))
            ));
        }
        out.push_str("</ul>\n");
    }
    out
}

fn message_li(w: &Value, now: Timestamp, show_bodies: bool) -> String {
    let m = &w["message"];
    if m.is_null() {
        return format!(
            "<li>{} ({}): {}</li>\n",
            escape(s(w, "file")),
            escape(s(w, "state")),
            escape(s(w, "problem"))
        );
    }
    let body = if show_bodies {
        format!("<pre>{}</pre>", escape(s(m, "body")))
    } else {
        String::new()
    };
    format!(
        "<li><span class=\"subject\">{}</span> — {} from {}, {} priority, {} <small>({})</small>{body}</li>\n",
        escape(s(m, "subject")),
        escape(s(m, "type")),
        escape(s(m, "from")),
        escape(s(m, "priority")),
        escape(&when(m, "created_at", now)),
        escape(s(m, "id")),
    )
}

/// An agent's page (`/agent/NAME`).
pub fn agent(a: &Value, now: Timestamp, cursor: &str, show_bodies: bool) -> String {
    let name = s(a, "agent");
    let mut out = format!(
        "<h1>{}</h1>\n<p><a href=\"/\">fleet</a> · read at {} <span id=\"live\">(reload for news)</span></p>\n",
        escape(name),
        escape(&now.to_string())
    );
    out.push_str(&agent_part(a, now));
    if a["kind"] == "agent" {
        out.push_str("<h2>Tasks</h2>\n");
        match failed(&a["tasks"]) {
            Some(e) => out.push_str(&e),
            None => {
                out.push_str("<table><tbody>\n");
                for t in a["tasks"].as_array().into_iter().flatten() {
                    out.push_str(&format!(
                        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td></tr>\n",
                        escape(s(t, "id")),
                        escape(s(t, "status")),
                        escape(s(t, "priority")),
                        escape(s(t, "type")),
                        escape(s(t, "description")),
                        t["outcome"]
                            .as_str()
                            .map(|o| format!(" → {}", escape(o)))
                            .unwrap_or_default()
                    ));
                }
                out.push_str("</tbody></table>\n");
            }
        }
    }
    out.push_str("<h2>Inbox</h2>\n");
    out.push_str(&inbox_html(&a["inbox"], now, show_bodies));
    if a["kind"] == "agent" {
        out.push_str("<h2>memory.md</h2>\n<div id=\"memory\">\n");
        match (&a["memory"], failed(&a["memory"])) {
            (_, Some(e)) => out.push_str(&e),
            (Value::Null, _) => out.push_str("<p>(none)</p>\n"),
            (m, None) => {
                out.push_str(&markdown(s(m, "text")));
                if m["truncated"] == true {
                    out.push_str("<p>(cut: the rest is not shown)</p>\n");
                }
            }
        }
        out.push_str("</div>\n");
    }
    let attrs = format!(
        "data-cursor=\"{}\" data-agent=\"{}\"",
        escape(cursor),
        escape(name)
    );
    layout(&format!("agent-state: {name}"), &attrs, &out)
}

/// The flows page (`/flows`): each flow's open cycle, its step and who is
/// at work, and what waits for the human.
pub fn flows(rows: &Value, now: Timestamp, cursor: &str) -> String {
    let mut out = format!(
        "<h1>Flows</h1>\n<p><a href=\"/\">fleet</a> · read at {} <span id=\"live\">(reload for news)</span></p>\n",
        escape(&now.to_string())
    );
    let rows = rows.as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        out.push_str("<p>No flows configured.</p>\n");
    }
    out.push_str(
        "<table><thead><tr><th>Flow</th><th>Cycle</th><th>Status</th><th>Step</th>\
         <th>At work</th><th>Insufficient</th><th>Goal</th><th>Waits for the human</th></tr></thead><tbody>\n",
    );
    for r in &rows {
        let flow = s(r, "flow");
        let current = r["state"].get("current").filter(|c| !c.is_null()).cloned();
        match current {
            Some(c) => {
                let at_work = match c.get("awaiting").filter(|w| !w.is_null()) {
                    Some(w) => format!("{} ({})", s(w, "role"), s(w, "agent")),
                    None => format!("human ({})", s(r, "human")),
                };
                let waits = if c.get("awaiting").is_none_or(Value::is_null) {
                    let q = [s(&c, "status"), s(&c, "reason")]
                        .iter()
                        .filter(|t| !t.is_empty())
                        .copied()
                        .collect::<Vec<_>>()
                        .join(": ");
                    let asked: String = r["questions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|q| {
                            format!(
                                "<br><a href=\"/mailbox\" class=\"subject\">{}</a>",
                                escape(s(q, "subject"))
                            )
                        })
                        .collect();
                    format!("<td class=\"held\">{}{asked}</td>", escape(&q))
                } else {
                    "<td></td>".into()
                };
                out.push_str(&format!(
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td>{waits}</tr>\n",
                    escape(flow),
                    escape(s(&c, "id")),
                    escape(s(&c, "status")),
                    c["step"],
                    escape(&at_work),
                    c["insufficient"],
                    r["max_insufficient"],
                    escape(s(&c, "goal")),
                ));
            }
            None => {
                let last = r["state"]["closed"]
                    .as_array()
                    .and_then(|c| c.last())
                    .map(|l| format!("last: {} {}", s(l, "id"), s(l, "outcome")))
                    .unwrap_or_else(|| "no cycle yet".into());
                out.push_str(&format!(
                    "<tr><td>{}</td><td>-</td><td>idle</td><td></td><td></td><td></td><td>{}</td><td></td></tr>\n",
                    escape(flow),
                    escape(&last)
                ));
            }
        }
    }
    out.push_str("</tbody></table>\n");
    let attrs = format!("data-cursor=\"{}\" data-reload=\"1\"", escape(cursor));
    layout("agent-state: flows", &attrs, &out)
}

/// The human mailbox page (`/mailbox`): escalations not acknowledged,
/// newest first.
pub fn mailbox(boxes: &Value, now: Timestamp, cursor: &str, show_bodies: bool) -> String {
    let mut out = format!(
        "<h1>Human mailbox</h1>\n<p><a href=\"/\">fleet</a> · read at {} <span id=\"live\">(reload for news)</span></p>\n",
        escape(&now.to_string())
    );
    let boxes = boxes.as_array().cloned().unwrap_or_default();
    if boxes.is_empty() {
        out.push_str("<p>No human mailbox configured.</p>\n");
    }
    for b in &boxes {
        out.push_str(&format!("<h2>{}</h2>\n", escape(s(b, "agent"))));
        if let Some(e) = failed(b) {
            out.push_str(&e);
            continue;
        }
        let waiting = b["waiting"].as_array().cloned().unwrap_or_default();
        if waiting.is_empty() {
            out.push_str("<p>Nothing waits.</p>\n");
            continue;
        }
        out.push_str("<ul class=\"inbox\">\n");
        for w in &waiting {
            out.push_str(&message_li(w, now, show_bodies));
        }
        out.push_str("</ul>\n");
    }
    let attrs = format!("data-cursor=\"{}\" data-reload=\"1\"", escape(cursor));
    layout("agent-state: mailbox", &attrs, &out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HOSTILE: &str = "<script>alert(1)</script>\"><img src=x onerror=alert(2)>\u{9b}";

    #[test]
    fn markdown_is_escaped_and_minimal() {
        for (input, want) in [
            ("# Memory\n", "<h3>Memory</h3>\n"),
            ("## A <b>\n", "<h4>A &lt;b&gt;</h4>\n"),
            (
                "- one\n- <script>\n\ntext\nmore",
                "<ul>\n<li>one</li>\n<li>&lt;script&gt;</li>\n</ul>\n<p>text\nmore</p>\n",
            ),
            (
                "[x](javascript:alert(1))",
                "<p>[x](javascript:alert(1))</p>\n",
            ),
            ("\u{9b}31m", "<p>\u{FFFD}31m</p>\n"),
        ] {
            assert_eq!(markdown(input), want, "{input:?}");
        }
    }

    #[test]
    fn every_page_escapes_what_the_state_says() {
        let now = Timestamp::parse("2026-11-20T10:00:00Z").unwrap();
        let msg = json!({"file": HOSTILE, "state": "valid", "message": {
            "id": HOSTILE, "subject": HOSTILE, "from": HOSTILE, "type": "flag",
            "priority": "high", "created_at": "2026-11-20T09:00:00Z", "body": HOSTILE}});
        let a = json!({
            "agent": "rio", "kind": "agent",
            "status": {"status": HOSTILE, "lifecycle": HOSTILE},
            "inbox": {"waiting": [msg.clone()], "claimed": [], "rejected": [{"file": HOSTILE, "reason": HOSTILE}], "processed": 0},
            "tasks": [{"id": HOSTILE, "status": "pending", "description": HOSTILE, "outcome": HOSTILE}],
            "sessions": [{"session_id": HOSTILE, "outcome": "error", "reason": HOSTILE, "code": HOSTILE, "tokens": {"total": 1}}],
            "memory": {"text": format!("# {HOSTILE}\n- {HOSTILE}\n{HOSTILE}\n"), "truncated": false},
            "running": {"session_id": HOSTILE, "iterations": [{"n": 1, "of": 2, "verify": HOSTILE, "failure": HOSTILE}],
                "workspace": {"path": HOSTILE, "branch": HOSTILE, "repo": HOSTILE},
                "log": {"file": HOSTILE, "tail": {"text": HOSTILE}}},
        });
        let f = json!([{"flow": HOSTILE, "human": HOSTILE, "max_insufficient": 3,
            "state": {"current": {"id": HOSTILE, "status": HOSTILE, "step": 1, "goal": HOSTILE, "reason": HOSTILE, "insufficient": 0}}}]);
        let boxes = json!([{"agent": HOSTILE, "waiting": [msg]}]);
        for page in [
            agent_page(&a, now, true),
            flows_page(&f, now),
            mailbox(&boxes, now, HOSTILE, true),
        ] {
            assert!(!page.contains("<img"), "{page}");
            assert!(!page.contains("<script>"), "{page}");
            assert!(!page.contains('\u{9b}'), "{page}");
            assert_eq!(page.matches("<script").count(), 1, "{page}");
            assert!(
                page.contains("&lt;img src=x onerror=alert(2)&gt;"),
                "{page}"
            );
        }
        // No bodies unless shown.
        assert!(!agent_page(&a, now, false).contains("<pre>&lt;script"));

        fn agent_page(a: &Value, now: Timestamp, bodies: bool) -> String {
            agent(a, now, "v1.x", bodies)
        }
        fn flows_page(f: &Value, now: Timestamp) -> String {
            flows(f, now, "v1.x")
        }
    }
}
