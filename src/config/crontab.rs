//! Reading a cron-era crontab (the origin server's: one `research-session.sh
//! AGENT` line per agent) into `[[agent]]` entries for the config (issue 14,
//! `agent-state migrate-crontab`). Pure: text in, entries, problems and the
//! edited crontab out; the CLI reads and writes the files.
//!
//! A line is migrated when its command runs a script named
//! `research-session.sh` (any directory, `./` after a `cd DIR &&`, behind
//! `timeout`, `flock` or `nice`), and the next word is the agent. `CRON_TZ=`
//! and `TZ=` lines set the zone of the lines after them (cron's own rule);
//! without one, the zone is the machine's (cron runs in local time). Every
//! other line — comments, environment, other jobs — is left as it is.
//!
//! A migrated line is commented out whole, so it must run nothing but the
//! session: a line that also runs another command (`… rio; other-job`,
//! `backup.sh && … rio`, `… rio || alert.sh`) is refused, naming that
//! command, never commented out with it. Only `cd DIR &&` before the script
//! and redirections or a pipe for its output after it (the daemon keeps the
//! output itself) go with the line.
//!
//! A `timeout DURATION` in front of the script (GNU coreutils' syntax:
//! `6000`, `2h`, `1.5h`, options before it) becomes the agent's `timeout`,
//! so the migrated agent keeps its limit rather than falling back to the
//! default; one that cannot be carried (`0`: no limit; over the longest
//! duration the config takes) is named in the notes.

fn valid_agent_name(name: &str) -> bool {
    crate::agent_name::AgentName::parse(name).is_ok()
}

/// The script a migrated line runs.
pub const SCRIPT: &str = "research-session.sh";

/// One agent found in the crontab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub agent: String,
    pub schedule: String,
    pub timezone: String,
    /// The script's absolute path (the `command`'s program).
    pub script: String,
    /// Arguments after the agent on the line, kept in `command`.
    pub args: Vec<String>,
    /// The line's `timeout DURATION` in front of the script, as the
    /// config's `timeout` (e.g. "2h", "1h 40m").
    pub timeout: Option<String>,
    /// 1-based line number in the crontab.
    pub line: usize,
}

/// What a crontab comes to.
#[derive(Debug, Default)]
pub struct Migration {
    pub entries: Vec<Entry>,
    /// Lines that look like a session line but cannot be migrated, with why.
    pub problems: Vec<String>,
    /// Notes: what is dropped (redirections) and why.
    pub notes: Vec<String>,
}

/// Read `text`; `system_tz` is the zone of lines with no `CRON_TZ`/`TZ`.
pub fn parse(text: &str, system_tz: &str) -> Migration {
    let mut m = Migration::default();
    let mut tz = system_tz.to_string();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((name, value)) = env_assignment(line) {
            if name == "CRON_TZ" || name == "TZ" {
                tz = value;
            }
            continue;
        }
        let (schedule, command) = match split_job(line) {
            Some(x) => x,
            None => continue,
        };
        let words = shell_words(command);
        let Some(at) = words.iter().position(|w| basename(w) == SCRIPT) else {
            continue;
        };
        let mut script = words[at].clone();
        if !script.starts_with('/') {
            // `cd /opt/teleo-eval && ./research-session.sh rio`
            let dir = words
                .windows(2)
                .take_while(|w| w[0] != words[at])
                .filter(|w| w[0] == "cd" && w[1].starts_with('/'))
                .map(|w| w[1].clone())
                .last();
            match dir {
                Some(d) => {
                    script = format!(
                        "{}/{}",
                        d.trim_end_matches('/'),
                        script.trim_start_matches("./")
                    )
                }
                None => {
                    m.problems.push(format!(
                        "line {n}: the script `{script}` is a relative path with no `cd DIR &&` before it; write its full path in the crontab first"
                    ));
                    continue;
                }
            }
        }
        if let Some(other) = other_command(&words, at) {
            m.problems.push(format!(
                "line {n}: it also runs `{other}`, which commenting the line out would stop too; put the session on a line of its own first"
            ));
            continue;
        }
        let Some(agent) = words.get(at + 1).filter(|a| valid_agent_name(a)) else {
            m.problems.push(format!(
                "line {n}: cannot tell the agent: `{}` must be followed by the agent's name",
                words[at]
            ));
            continue;
        };
        if let Err(e) = crate::schedule::Schedule::parse(&schedule) {
            m.problems
                .push(format!("line {n}: schedule `{schedule}`: {e}"));
            continue;
        }
        if let Err(e) = tz.parse::<crate::zone::Zone>() {
            let why = e.describe(&tz, || {
                format!("time zone {tz:?} (from CRON_TZ/TZ) is not an IANA zone such as \"Europe/Lisbon\"")
            });
            m.problems.push(format!("line {n}: {why}"));
            continue;
        }
        if let Some(first) = m.entries.iter().find(|e| &e.agent == agent) {
            m.problems.push(format!(
                "line {n}: {agent} is also started on line {}: agent-state takes one schedule per agent; combine them (e.g. \"0 10,22 * * *\") by hand",
                first.line
            ));
            continue;
        }
        let timeout = match session_timeout(&words[..at]) {
            Timeout::None => None,
            Timeout::Carried(t) => Some(t),
            Timeout::Dropped(why) => {
                m.notes.push(format!(
                    "line {n}: {why}; {agent} gets the default `timeout` (set one in its [[agent]] entry)"
                ));
                None
            }
        };
        let mut args = Vec::new();
        for w in &words[at + 2..] {
            if is_redirection(w) || is_separator(w) || matches!(w.as_str(), "|" | "|&") {
                m.notes.push(format!(
                    "line {n}: `{}` and what follows are left out: the daemon keeps each session's output in sessions/ID.log and journald",
                    w
                ));
                break;
            }
            args.push(w.clone());
        }
        m.entries.push(Entry {
            agent: agent.clone(),
            schedule,
            timezone: tz.clone(),
            script,
            args,
            timeout,
            line: n,
        });
    }
    m
}

/// The `[[agent]]` entries as TOML.
pub fn to_toml(entries: &[Entry]) -> String {
    let mut out = String::new();
    for e in entries {
        let mut command = vec![toml_str(&e.script), toml_str("{agent}")];
        command.extend(e.args.iter().map(|a| toml_str(a)));
        out.push_str(&format!(
            "\n# migrated from crontab line {}\n[[agent]]\nname = {}\nschedule = {}\ntimezone = {}\ncommand = [{}]\n",
            e.line,
            toml_str(&e.agent),
            toml_str(&e.schedule),
            toml_str(&e.timezone),
            command.join(", ")
        ));
        if let Some(t) = &e.timeout {
            out.push_str(&format!("timeout = {}\n", toml_str(t)));
        }
    }
    out
}

/// What a line's `timeout` in front of the script comes to.
#[derive(Debug, PartialEq, Eq)]
enum Timeout {
    /// No `timeout` runs the script.
    None,
    /// The config's `timeout` value.
    Carried(String),
    /// There is one, but it cannot be carried: why.
    Dropped(String),
}

/// The `timeout [OPTIONS] DURATION` among the words of the script's own
/// command (`before`: the words before the script). Pure.
fn session_timeout(before: &[String]) -> Timeout {
    // The script's own command: after the last separator before it.
    let own = before
        .rsplit(|w| is_separator(w) || w == "|" || w == "|&")
        .next()
        .unwrap_or_default();
    let Some(at) = own.iter().position(|w| basename(w) == "timeout") else {
        return Timeout::None;
    };
    let mut rest = own[at + 1..].iter();
    let duration = loop {
        match rest.next() {
            None => return Timeout::Dropped("`timeout` without a duration".into()),
            // Options with a value of their own word.
            Some(o) if o == "-k" || o == "-s" || o == "--kill-after" || o == "--signal" => {
                rest.next();
            }
            Some(o) if o.starts_with('-') => {}
            Some(d) => break d,
        }
    };
    match gnu_duration_secs(duration) {
        Some(secs) if secs <= 0.0 => Timeout::Dropped(format!(
            "`timeout {duration}` runs the session without a limit, which agent-state does not do"
        )),
        Some(secs) if secs > crate::clock::MAX_DURATION.as_secs_f64() => Timeout::Dropped(format!(
            "`timeout {duration}` is longer than any duration agent-state takes"
        )),
        Some(secs) => {
            let secs = (secs.ceil() as u64).max(1);
            Timeout::Carried(
                humantime::format_duration(std::time::Duration::from_secs(secs)).to_string(),
            )
        }
        None => Timeout::Dropped(format!(
            "`timeout {duration}`: not a duration GNU timeout takes (a number with s, m, h or d)"
        )),
    }
}

/// GNU timeout's DURATION (`6000`, `90m`, `1.5h`, `2d`) in seconds.
fn gnu_duration_secs(word: &str) -> Option<f64> {
    let (number, unit) = match word.char_indices().last()? {
        (i, c @ ('s' | 'm' | 'h' | 'd')) => (&word[..i], c),
        _ => (word, 's'),
    };
    if number.is_empty() || !number.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    let n: f64 = number.parse().ok()?;
    let scale = match unit {
        's' => 1.0,
        'm' => 60.0,
        'h' => 3600.0,
        _ => 86_400.0,
    };
    Some(n * scale)
}

/// The crontab with the migrated lines commented out (each says why).
pub fn comment_out(text: &str, entries: &[Entry], date: &str) -> String {
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        match entries.iter().find(|e| e.line == i + 1) {
            Some(e) => out.push_str(&format!(
                "# agent-state migrate-crontab {date}: the daemon runs {} now ([[agent]] in its config): {line}\n",
                e.agent
            )),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

fn is_redirection(w: &str) -> bool {
    w.starts_with('>')
        || w.starts_with("2>")
        || w.starts_with("1>")
        || w.starts_with('<')
        || w.starts_with("&>")
}

/// `NAME=value` or `NAME = value` (cron's environment lines), quotes removed.
fn env_assignment(line: &str) -> Option<(String, String)> {
    let (name, value) = line.split_once('=')?;
    let name = name.trim();
    if name.is_empty()
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        || name.chars().next().is_some_and(|c| c.is_ascii_digit())
    {
        return None;
    }
    let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
    Some((name.to_string(), value.to_string()))
}

/// A job line: its schedule (five fields or a `@` macro) and its command.
fn split_job(line: &str) -> Option<(String, &str)> {
    let fields = if line.starts_with('@') { 1 } else { 5 };
    let mut rest = line;
    let mut schedule = Vec::new();
    for _ in 0..fields {
        rest = rest.trim_start();
        let end = rest.find(char::is_whitespace)?;
        schedule.push(&rest[..end]);
        rest = &rest[end..];
    }
    Some((schedule.join(" "), rest.trim()))
}

/// Words that end one command so that another may follow.
fn is_separator(w: &str) -> bool {
    matches!(w, ";" | "&&" | "||" | "&")
}

/// The first command on the line other than the session at `words[at]`, a
/// `cd DIR` before it, and what takes its output (a pipe) after it: what
/// commenting the line out would stop besides the session. Pure.
fn other_command(words: &[String], at: usize) -> Option<String> {
    let before = &words[..at];
    let mut segments = before.split(|w| is_separator(w) || w == "|" || w == "|&");
    // The last piece is the session's own command (`timeout 6000`, …).
    let _own = segments.next_back();
    if let Some(other) = segments.find(|s| !(s.len() == 2 && s[0] == "cd")) {
        return Some(other.join(" "));
    }
    let end = words[at..].iter().position(|w| is_separator(w))?;
    let after: Vec<&str> = words[at + end + 1..]
        .iter()
        .map(String::as_str)
        .take_while(|w| !is_separator(w))
        .collect();
    (!after.is_empty()).then(|| after.join(" "))
}

/// Words of a command line, as a shell would split the simple cases:
/// quotes kept together; `;`, `&&`, `||`, `&`, `|` and `|&` as words of
/// their own, but `2>&1`, `&>file` and `>|file` kept whole; a `#` starting
/// a word ends the line (a shell comment).
fn shell_words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut chars = command.chars().peekable();
    let flush = |cur: &mut String, words: &mut Vec<String>| {
        if !cur.is_empty() {
            words.push(std::mem::take(cur));
        }
    };
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => quote = Some(c),
            (None, c) if c.is_whitespace() => flush(&mut cur, &mut words),
            (None, '#') if cur.is_empty() => break,
            (None, ';') => {
                flush(&mut cur, &mut words);
                words.push(";".into());
            }
            // `2>&1`, `>&2`, `<&0`, `>|file`: part of a redirection.
            (None, '&' | '|') if cur.ends_with('>') || cur.ends_with('<') => cur.push(c),
            // `&>file`, `&>>file`: a redirection starts.
            (None, '&') if chars.peek() == Some(&'>') => {
                flush(&mut cur, &mut words);
                cur.push('&');
            }
            (None, '&' | '|') => {
                flush(&mut cur, &mut words);
                let mut op = c.to_string();
                if let Some(&next) = chars.peek()
                    && (next == c || (c == '|' && next == '&'))
                {
                    op.push(next);
                    chars.next();
                }
                words.push(op);
            }
            (None, c) => cur.push(c),
        }
    }
    flush(&mut cur, &mut words);
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: &str = "\
# m h dom mon dow command
MAILTO=\"\"
SHELL=/bin/bash
0 22 * * * /opt/teleo-eval/research-session.sh rio >> /opt/teleo-eval/logs/rio.log 2>&1
30 23 * * * /opt/teleo-eval/research-session.sh clay >> /opt/teleo-eval/logs/clay.log 2>&1
0 1 * * * /opt/teleo-eval/research-session.sh theseus >> /opt/teleo-eval/logs/theseus.log 2>&1
CRON_TZ=Europe/Lisbon
30 2 * * * cd /opt/teleo-eval && timeout 6000 ./research-session.sh vida >> logs/vida.log 2>&1
0 4 * * 1-5 /opt/teleo-eval/research-session.sh astra --fast
@daily /opt/teleo-eval/research-session.sh leo
*/10 * * * * /usr/local/bin/backup-db.sh
";

    #[test]
    fn the_origin_crontab_becomes_six_agents_and_other_jobs_stay() {
        let m = parse(ORIGIN, "UTC");
        assert_eq!(m.problems, Vec::<String>::new());
        let got: Vec<(&str, &str, &str, &str, usize)> = m
            .entries
            .iter()
            .map(|e| {
                (
                    e.agent.as_str(),
                    e.schedule.as_str(),
                    e.timezone.as_str(),
                    e.script.as_str(),
                    e.line,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "rio",
                    "0 22 * * *",
                    "UTC",
                    "/opt/teleo-eval/research-session.sh",
                    4
                ),
                (
                    "clay",
                    "30 23 * * *",
                    "UTC",
                    "/opt/teleo-eval/research-session.sh",
                    5
                ),
                (
                    "theseus",
                    "0 1 * * *",
                    "UTC",
                    "/opt/teleo-eval/research-session.sh",
                    6
                ),
                (
                    "vida",
                    "30 2 * * *",
                    "Europe/Lisbon",
                    "/opt/teleo-eval/research-session.sh",
                    8
                ),
                (
                    "astra",
                    "0 4 * * 1-5",
                    "Europe/Lisbon",
                    "/opt/teleo-eval/research-session.sh",
                    9
                ),
                (
                    "leo",
                    "@daily",
                    "Europe/Lisbon",
                    "/opt/teleo-eval/research-session.sh",
                    10
                ),
            ]
        );
        assert_eq!(m.entries[4].args, ["--fast"]);
        assert!(
            m.notes.iter().any(|n| n.starts_with("line 4: `>>`")),
            "{:?}",
            m.notes
        );
        let edited = comment_out(ORIGIN, &m.entries, "2026-11-24");
        assert!(edited.contains("*/10 * * * * /usr/local/bin/backup-db.sh\n"));
        assert!(edited.contains("MAILTO=\"\"\n"));
        assert_eq!(
            edited
                .matches("# agent-state migrate-crontab 2026-11-24:")
                .count(),
            6
        );
        let toml = to_toml(&m.entries);
        assert!(toml.contains("name = \"vida\"\nschedule = \"30 2 * * *\"\ntimezone = \"Europe/Lisbon\"\ncommand = [\"/opt/teleo-eval/research-session.sh\", \"{agent}\"]"), "{toml}");
        assert!(
            toml.contains(
                "command = [\"/opt/teleo-eval/research-session.sh\", \"{agent}\", \"--fast\"]"
            ),
            "{toml}"
        );
    }

    /// (the line's command, the agent's `timeout`, or the note's words)
    const TIMEOUTS: &[(&str, Result<Option<&str>, &str>)] = &[
        ("/x/research-session.sh vida", Ok(None)),
        (
            "cd /x && timeout 2h ./research-session.sh vida",
            Ok(Some("2h")),
        ),
        (
            "timeout 6000 /x/research-session.sh vida",
            Ok(Some("1h 40m")),
        ),
        (
            "timeout 1.5h /x/research-session.sh vida",
            Ok(Some("1h 30m")),
        ),
        (
            "timeout -k 30s --foreground 90m /x/research-session.sh vida",
            Ok(Some("1h 30m")),
        ),
        (
            "/usr/bin/timeout --signal=INT 45m /x/research-session.sh vida",
            Ok(Some("45m")),
        ),
        (
            "nice -n 10 timeout 1d /x/research-session.sh vida",
            Ok(Some("1day")),
        ),
        (
            "timeout 0 /x/research-session.sh vida",
            Err("without a limit"),
        ),
        (
            "timeout 30d /x/research-session.sh vida",
            Ok(Some("30days")),
        ),
        (
            "timeout 99999999d /x/research-session.sh vida",
            Err("longer than any duration"),
        ),
        (
            "timeout forever /x/research-session.sh vida",
            Err("not a duration"),
        ),
        // Words after the agent are the script's arguments, not the line's.
        ("/x/research-session.sh vida timeout 9", Ok(None)),
    ];

    #[test]
    fn a_timeout_in_front_of_the_script_becomes_the_agents_timeout() {
        for (command, want) in TIMEOUTS {
            let m = parse(&format!("0 1 * * * {command}\n"), "UTC");
            let got = m.entries.first().map(|e| e.timeout.clone());
            match want {
                Ok(t) => {
                    assert_eq!(
                        got,
                        Some(t.map(str::to_string)),
                        "{command}: {:?}",
                        m.problems
                    );
                    if let Some(t) = t {
                        let toml = to_toml(&m.entries);
                        assert!(
                            toml.contains(&format!("timeout = \"{t}\"\n")),
                            "{command}: {toml}"
                        );
                        crate::config::Config::parse(
                            &format!("state_root = \"/tmp/x\"\n{toml}"),
                            std::path::Path::new("migrated.toml"),
                        )
                        .unwrap_or_else(|e| panic!("{command}: {toml}: {e}"));
                    }
                }
                Err(words) => {
                    assert_eq!(got, Some(None), "{command}: {:?}", m.problems);
                    assert!(
                        m.notes
                            .iter()
                            .any(|n| n.contains(words) && n.contains("default `timeout`")),
                        "{command}: {:?}",
                        m.notes
                    );
                }
            }
        }
    }

    #[test]
    fn lines_that_cannot_be_migrated_are_named() {
        let m = parse(
            "0 1 * * * research-session.sh rio\n0 2 * * * /x/research-session.sh $AGENT\n61 1 * * * /x/research-session.sh clay\n0 3 * * * /x/research-session.sh leo\n0 4 * * * /x/research-session.sh leo\nCRON_TZ=Mars/Base\n0 5 * * * /x/research-session.sh vida\n",
            "UTC",
        );
        let p = m.problems.join("\n");
        assert!(
            p.contains("line 1: the script `research-session.sh` is a relative path"),
            "{p}"
        );
        assert!(p.contains("line 2: cannot tell the agent"), "{p}");
        assert!(p.contains("line 3: schedule `61 1 * * *`"), "{p}");
        assert!(p.contains("line 5: leo is also started on line 4"), "{p}");
        assert!(p.contains("line 7: time zone \"Mars/Base\""), "{p}");
        assert_eq!(m.entries.len(), 1);
    }

    /// (command, the other command named, or None: the line can go)
    const LINES: &[(&str, Option<&str>)] = &[
        ("/x/research-session.sh rio", None),
        ("/x/research-session.sh rio >> /x/rio.log 2>&1", None),
        ("/x/research-session.sh rio &>/x/rio.log &", None),
        ("/x/research-session.sh rio >|/x/rio.log", None),
        ("/x/research-session.sh rio 2>&1 | logger -t rio", None),
        ("cd /x && timeout 6000 ./research-session.sh rio", None),
        ("cd /x; ./research-session.sh rio;", None),
        ("/x/research-session.sh rio # nightly; not a command", None),
        (
            "/x/research-session.sh rio; /usr/local/bin/other-job",
            Some("/usr/local/bin/other-job"),
        ),
        (
            "/x/research-session.sh rio;other-job --now",
            Some("other-job --now"),
        ),
        (
            "/x/research-session.sh rio && notify.sh done",
            Some("notify.sh done"),
        ),
        ("/x/research-session.sh rio&&notify.sh", Some("notify.sh")),
        ("/x/research-session.sh rio || alert.sh", Some("alert.sh")),
        (
            "/x/research-session.sh rio > /x/log 2>&1 & backup.sh",
            Some("backup.sh"),
        ),
        (
            "/x/research-session.sh rio | tee /x/log; cleanup.sh",
            Some("cleanup.sh"),
        ),
        ("backup.sh && /x/research-session.sh rio", Some("backup.sh")),
        ("cd /x && make && ./research-session.sh rio", Some("make")),
        ("producer | /x/research-session.sh rio", Some("producer")),
        ("/x/research-session.sh rio '; not-a-command'", None),
    ];

    #[test]
    fn a_line_that_runs_another_command_is_refused_naming_it() {
        for (command, other) in LINES {
            let m = parse(&format!("0 22 * * * {command}\n"), "UTC");
            match other {
                None => assert_eq!(
                    (m.entries.len(), &m.problems),
                    (1, &Vec::<String>::new()),
                    "{command}"
                ),
                Some(other) => {
                    assert!(m.entries.is_empty(), "{command}");
                    let p = m.problems.join("\n");
                    assert!(
                        p.contains(&format!("line 1: it also runs `{other}`")),
                        "{command}: {p}"
                    );
                }
            }
        }
        // The session's own arguments stop at its output's redirection.
        let m = parse(
            "0 22 * * * /x/research-session.sh rio --fast 2>&1 | logger\n",
            "UTC",
        );
        assert_eq!(m.entries[0].args, ["--fast"]);
    }
}
