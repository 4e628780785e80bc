//! The tests of `config`: the issue's example, each section read with its
//! defaults and checked, every problem reported with its path, sizes.

use super::*;

use std::time::Duration;

const FULL: &str = r#"
state_root = "/opt/teleo-eval/agent-state"
group = "teleo"

[daemon]
max_concurrent_sessions = 2
catch_up_window = "2h"
shutdown_grace = "60s"

[defaults]
command = ["/opt/teleo-eval/research-session.sh", "{agent}"]
timeout = "90m"
kill_grace = "30s"
model = "sonnet"
session_type = "research"
wake_on_inbox = "high"
inbox_debounce = "30s"
max_output = "10MiB"

[[agent]]
name = "rio"
domain = "internet-finance"
schedule = "0 22 * * *"
timezone = "UTC"

[[agent]]
name = "marcus"
kind = "human"

[health]
disk_warn = "1GiB"
disk_pause = "500MiB"
disk_stop = "100MiB"

[hooks]
on_error = "/etc/agent-state/on-error.sh"
"#;

fn problems(text: &str) -> Vec<String> {
    match Config::parse(text, Path::new("/etc/agent-state/config.toml")) {
        Ok(_) => vec![],
        Err(ConfigError::Invalid { problems, .. }) => {
            problems.iter().map(|p| p.to_string()).collect()
        }
        Err(e) => vec![e.to_string()],
    }
}

#[test]
fn the_issue_example_is_valid() {
    let c = Config::parse(FULL, Path::new("/etc/agent-state/config.toml")).unwrap();
    assert_eq!(c.state_root, Path::new("/opt/teleo-eval/agent-state"));
    assert_eq!(c.agents.len(), 2);
    let rio = &c.agents[0];
    assert_eq!(rio.session.timeout, Duration::from_secs(5400));
    assert_eq!(rio.session.max_output, 10 << 20);
    assert_eq!(c.agents[1].kind, AgentKind::Human);
    assert_eq!(c.health.disk_pause, 500 << 20);
}

#[test]
fn metrics_are_off_by_default_and_checked_when_configured() {
    let c = Config::parse("", Path::new("/x/c.toml")).unwrap();
    assert!(!c.metrics.enabled());
    assert_eq!(c.metrics.interval, Duration::from_secs(15));
    let c = Config::parse(
        "[metrics]\nlisten = \"127.0.0.1:9464\"\ntextfile = \"/var/lib/prometheus/node-exporter/agent-state.prom\"\ninterval = \"5s\"\n",
        Path::new("/x/c.toml"),
    )
    .unwrap();
    assert_eq!(c.metrics.listen, Some("127.0.0.1:9464".parse().unwrap()));
    assert!(c.warnings.iter().all(|w| !w.field.starts_with("metrics")));
    assert_eq!(c.metrics.interval, Duration::from_secs(5));
    let c = Config::parse(
        "[metrics]\nlisten = \"0.0.0.0:9464\"\ntextfile = \"/tmp/x.txt\"\n",
        Path::new("/x/c.toml"),
    )
    .unwrap();
    let warned: Vec<_> = c.warnings.iter().map(|w| w.to_string()).collect();
    assert!(
        warned
            .iter()
            .any(|w| w.contains("metrics.listen") && w.contains("no authentication")),
        "{warned:?}"
    );
    assert!(
        warned
            .iter()
            .any(|w| w.contains("metrics.textfile") && w.contains(".prom")),
        "{warned:?}"
    );
    let p =
        problems("[metrics]\nlisten = \"localhost\"\ntextfile = \"rel.prom\"\ninterval = \"0s\"\n");
    assert!(
        p.iter()
            .any(|p| p.contains("metrics.listen") && p.contains("127.0.0.1:9464")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|p| p.contains("metrics.textfile") && p.contains("absolute")),
        "{p:?}"
    );
    assert!(p.iter().any(|p| p.contains("metrics.interval")), "{p:?}");
    let p = problems("[metrics]\nport = 9464\n");
    assert!(
        p.iter()
            .any(|p| p.contains("[metrics]") && p.contains("port")),
        "{p:?}"
    );
}

#[test]
fn budgets_merge_field_by_field_and_name_the_field_that_is_wrong() {
    let text = r#"
[budget]
timezone = "Europe/Lisbon"
max_sessions = 40
max_cost_usd = 50.0

[defaults]
budget = { max_sessions = 10, max_runtime = "6h" }
session_budget = { max_tokens = 2000000 }

[[agent]]
name = "rio"
budget = { max_sessions = 4 }
budget_action = "finish"

[[agent]]
name = "leo"
"#;
    let c = Config::parse(text, Path::new("/x/c.toml")).unwrap();
    assert_eq!(
        c.budget.timezone,
        crate::zone::Zone::get("Europe/Lisbon").unwrap()
    );
    assert_eq!(c.budget.limits.max_sessions, Some(40));
    assert_eq!(c.budget.limits.max_cost_usd, Some(50.0));
    let rio = &c.agents[0].session;
    assert_eq!(rio.budget.max_sessions, Some(4));
    assert_eq!(rio.budget.max_runtime, Some(Duration::from_secs(6 * 3600)));
    assert_eq!(rio.session_budget.max_tokens, Some(2_000_000));
    assert_eq!(rio.budget_action, BudgetAction::Finish);
    let leo = &c.agents[1].session;
    assert_eq!(leo.budget.max_sessions, Some(10));
    assert_eq!(leo.budget_action, BudgetAction::Stop);
    assert!(
        Config::parse("", Path::new("/x/c.toml"))
            .unwrap()
            .agents
            .is_empty()
    );

    let p = problems(
        "[budget]\ntimezone = \"Mars/Olympus\"\nmax_tokens = -1\n[[agent]]\nname = \"rio\"\nbudget = { max_cost_usd = -3.0 }\nbudget_action = \"explode\"\n",
    );
    assert!(p.iter().any(|p| p.contains("budget.timezone")), "{p:?}");
    assert!(
        p.iter()
            .any(|p| p.contains("budget.max_tokens") && p.contains("negative")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|p| p.contains("agent[0] (rio).budget.max_cost_usd")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|p| p.contains("agent[0] (rio).budget_action") && p.contains("\"finish\"")),
        "{p:?}"
    );
    let p = problems("[defaults]\nbudget = { max_session = 3 }\n");
    assert!(p.iter().any(|p| p.contains("max_session")), "{p:?}");
}

#[test]
fn flows_are_read_with_their_defaults_and_checked_against_the_agents() {
    let text = r#"
[[agent]]
name = "theseus"
[[agent]]
name = "rio"
workspace = { repo = "/srv/repo" }
[[agent]]
name = "leo"
[[agent]]
name = "marcus"
kind = "human"
[[flow]]
name = "docs"
planner = "theseus"
actor = "rio"
judge = "leo"
[[flow]]
name = "strict"
planner = "theseus"
actor = "rio"
judge = "leo"
human = "marcus"
max_insufficient = 2
scope = { max_lines = 40, max_files = 1 }
risk = { low = "approve", high = "block" }
on_approve = ["gh", "pr", "create", "--head", "{branch}"]
"#;
    let c = Config::parse(text, Path::new("/x/c.toml")).unwrap();
    let docs = &c.flows[0];
    assert_eq!(docs.human.as_str(), "marcus", "the first human by default");
    assert_eq!(
        (docs.max_insufficient, docs.max_lines, docs.max_files),
        (5, 150, 2)
    );
    assert_eq!(
        (docs.low, docs.medium, docs.high),
        (Gate::Auto, Gate::Approve, Gate::Block)
    );
    assert!(docs.on_approve.is_empty());
    let strict = &c.flows[1];
    assert_eq!(
        (strict.max_insufficient, strict.max_lines, strict.max_files),
        (2, 40, 1)
    );
    assert_eq!(strict.low, Gate::Approve);
    assert_eq!(strict.on_approve[0], "gh");

    let p = problems(
        r#"
[[agent]]
name = "rio"
[[agent]]
name = "marcus"
kind = "human"
[[flow]]
name = "Bad Name"
planner = "nobody"
actor = "rio"
judge = "marcus"
risk = { medium = "maybe" }
max_insufficient = 0
[[flow]]
name = "twice"
planner = "rio"
actor = "rio"
judge = "rio"
[[flow]]
name = "twice"
planner = "rio"
actor = "rio"
judge = "rio"
colour = "red"
"#,
    );
    let has = |a: &str, b: &str| p.iter().any(|p| p.contains(a) && p.contains(b));
    assert!(has("flow[0] (Bad Name).name", ""), "{p:?}");
    assert!(
        has(
            "flow[0] (Bad Name).planner",
            "\"nobody\" is not a configured agent"
        ),
        "{p:?}"
    );
    assert!(has("flow[0] (Bad Name).judge", "human mailbox"), "{p:?}");
    assert!(has("flow[0] (Bad Name).actor", "no workspace"), "{p:?}");
    assert!(has("flow[0] (Bad Name).risk.medium", "\"maybe\""), "{p:?}");
    assert!(
        has("flow[0] (Bad Name).max_insufficient", "between 1 and"),
        "{p:?}"
    );
    assert!(has("flow[2] (twice)", "colour"), "{p:?}");
    let p = problems(
        "[[agent]]\nname = \"rio\"\nworkspace = { repo = \"/r\" }\n[[flow]]\nname = \"a\"\nplanner = \"rio\"\nactor = \"rio\"\njudge = \"rio\"\n[[flow]]\nname = \"a\"\nplanner = \"rio\"\nactor = \"rio\"\njudge = \"rio\"\nhuman = \"rio\"\n",
    );
    assert!(
        p.iter()
            .any(|p| p.contains("flow[0] (a).human") && p.contains("no human mailbox")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|p| p.contains("flow[1] (a).human") && p.contains("not a human mailbox")),
        "{p:?}"
    );
}

#[test]
fn log_rotation_settings_are_read_and_checked() {
    let c = Config::parse(FULL, Path::new("/c.toml")).unwrap();
    assert_eq!(c.logs, LogSettings::default());
    assert_eq!(c.logs.rotate_size, 16 << 20);
    assert_eq!(c.logs.journal_retention, None, "journals kept for good");
    let text = "[logs]\nrotate_size = \"1MiB\"\njournal_retention = \"365d\"\ndaemon_log_retention = \"forever\"\n";
    let c = Config::parse(text, Path::new("/c.toml")).unwrap();
    assert_eq!(c.logs.rotate_size, 1 << 20);
    assert_eq!(
        c.logs.journal_retention,
        Some(Duration::from_secs(365 * 86_400))
    );
    assert_eq!(c.logs.daemon_log_retention, None);
    let p = problems(
        "[logs]\nrotate_size = \"10\"\njournal_retention = \"5m\"\ndaemon_log_retention = \"never\"\nkeep = 3\n",
    );
    let has = |field: &str, text: &str| p.iter().any(|p| p.contains(field) && p.contains(text));
    assert!(has("[logs]", "keep"), "{p:?}");
    let p = problems(
        "[logs]\nrotate_size = \"10\"\njournal_retention = \"5m\"\ndaemon_log_retention = \"never\"\n",
    );
    let has = |field: &str, text: &str| p.iter().any(|p| p.contains(field) && p.contains(text));
    assert!(has("logs.rotate_size", "between 1KiB and 256MiB"), "{p:?}");
    assert!(has("logs.journal_retention", "at least 1h"), "{p:?}");
    assert!(has("logs.daemon_log_retention", "not a duration"), "{p:?}");
}

#[test]
fn credentials_wake_conditions_and_usage_limits_are_read_and_checked() {
    let text = r#"
[credential.default]
check = ["claude", "auth", "status", "--json"]
[credential.team-b]
kind = "api_key"
check_every = "5m"
[usage_limits]
wait = "10m"
[defaults]
wake_if = "work"
[[agent]]
name = "rio"
[[agent]]
name = "leo"
credential = "team-b"
wake_if = ["/usr/local/bin/has-work", "{agent}"]
require_complete = true
"#;
    let c = Config::parse(text, Path::new("/x/c.toml")).unwrap();
    let rio = &c.agents[0].session;
    assert_eq!(rio.credential, "default");
    assert_eq!(rio.wake_if, WakeIf::Work);
    assert!(!rio.require_complete);
    let leo = &c.agents[1].session;
    assert_eq!(leo.credential, "team-b");
    assert_eq!(
        leo.wake_if,
        WakeIf::Command(vec!["/usr/local/bin/has-work".into(), "{agent}".into()])
    );
    assert!(leo.require_complete);
    assert!(c.credentials["team-b"].api_key);
    assert_eq!(
        c.credentials["team-b"].check_every,
        Duration::from_secs(300)
    );
    assert_eq!(
        c.credentials["default"].check.as_ref().unwrap()[0],
        "claude"
    );
    assert_eq!(c.usage_limits.wait, Duration::from_secs(600));
    assert_eq!(c.usage_limits.max_wait, Duration::from_secs(4 * 3600));

    let p = problems(
        "[credential.x]\nkind = \"card\"\n[usage_limits]\nwait = \"5s\"\n[[agent]]\nname = \"rio\"\ncredential = \"nope\"\nwake_if = \"sometimes\"\n",
    );
    assert!(p.iter().any(|p| p.contains("credential.x.kind")), "{p:?}");
    assert!(p.iter().any(|p| p.contains("usage_limits.wait")), "{p:?}");
    assert!(
        p.iter()
            .any(|p| p.contains("(rio).credential") && p.contains("[credential.nope]")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|p| p.contains("(rio).wake_if") && p.contains("\"work\"")),
        "{p:?}"
    );
}

#[test]
fn agents_override_defaults() {
    let text = r#"
[defaults]
timeout = "10m"
[[agent]]
name = "rio"
timeout = "5m"
[[agent]]
name = "leo"
"#;
    let c = Config::parse(text, Path::new("/x/c.toml")).unwrap();
    assert_eq!(c.agents[0].session.timeout, Duration::from_secs(300));
    assert_eq!(c.agents[1].session.timeout, Duration::from_secs(600));
}

#[test]
fn relative_state_root_is_relative_to_the_file() {
    let c = Config::parse(
        "state_root = \"../var/state\"",
        Path::new("/repo/config/dev.toml"),
    )
    .unwrap();
    assert_eq!(c.state_root, Path::new("/repo/config/../var/state"));
}

#[test]
fn every_problem_is_reported_with_its_path() {
    let text = r#"
stat_root = "/x"
[daemon]
max_concurrent_sessions = 0
[defaults]
timeout = "ninety minutes"
wake_on_inbox = "sometimes"
command = ["/bin/x", "{agnt}"]
[[agent]]
name = "Rio"
[[agent]]
name = "leo"
schedule = "0 25 * * *"
timezone = "Mars/Olympus"
[[agent]]
name = "leo"
[[agent]]
name = "marcus"
kind = "human"
schedule = "@daily"
[[agent]]
name = "vida"
timout = "5m"
[health]
disk_warn = "1 lightyear"
"#;
    let got = problems(text);
    let want = [
        "stat_root: unknown field",
        "daemon.max_concurrent_sessions: 0 is not between",
        "defaults.timeout: \"ninety minutes\" is not a duration",
        "defaults.wake_on_inbox: \"sometimes\"",
        "defaults.command: unknown placeholder {agnt}",
        "agent[0].name: \"Rio\": uppercase",
        "agent[1] (leo).schedule: hour field",
        "agent[1] (leo).timezone: \"Mars/Olympus\"",
        "agent[2].name: `leo` is configured twice",
        "agent[3] (marcus).schedule: a human mailbox is never woken",
        "agent[4] (vida): unknown field `timout`",
        "health.disk_warn: \"1 lightyear\" has an unknown unit",
    ];
    for w in want {
        assert!(
            got.iter().any(|g| g.contains(w)),
            "missing {w:?} in {got:#?}"
        );
    }
    assert_eq!(got.len(), want.len(), "{got:#?}");
}

#[test]
fn syntax_errors_name_the_file() {
    let err = Config::parse("state_root = ", Path::new("/etc/x.toml")).unwrap_err();
    assert!(
        err.to_string().contains("/etc/x.toml is not valid TOML"),
        "{err}"
    );
}

#[test]
fn sizes() {
    assert_eq!(parse_size("10MiB").unwrap(), 10 << 20);
    assert_eq!(parse_size("1 GiB").unwrap(), 1 << 30);
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert_eq!(parse_size("1MB").unwrap(), 1_000_000);
    assert!(parse_size("lots").is_err());
    assert_eq!(
        parse_size("10XB").unwrap_err().to_string(),
        "\"10XB\" has an unknown unit \"XB\"; write e.g. \"10MiB\", \"1GiB\", \"500MiB\""
    );
    assert_eq!(
        parse_size("..MiB").unwrap_err().to_string(),
        "\"..MiB\" is not a size; write e.g. \"10MiB\", \"1GiB\""
    );
}

#[test]
fn a_flows_role_limits_and_on_insufficient_have_the_seeds_defaults_and_clear_errors() {
    let agents = r#"
[[agent]]
name = "theseus"
[[agent]]
name = "rio"
workspace = { repo = "/srv/repo" }
[[agent]]
name = "leo"
[[agent]]
name = "marcus"
kind = "human"
[[flow]]
name = "docs"
planner = "theseus"
actor = "rio"
judge = "leo"
"#;
    let c = Config::parse(agents, Path::new("/x/c.toml")).unwrap();
    let docs = &c.flows[0];
    assert_eq!(
        docs.on_insufficient,
        crate::config::OnInsufficient::Rollback
    );
    assert_eq!(docs.limits, crate::config::RoleLimits::default());
    assert_eq!(docs.limits.plan_lines, 50);
    assert!(!docs.limits.judge_writes_code && docs.limits.actor_paths.is_empty());
    assert_eq!(
        docs.actor_workspace.as_ref().map(|w| w.repo.clone()),
        Some(std::path::PathBuf::from("/srv/repo"))
    );
    let set = format!(
        "{agents}on_insufficient = \"keep\"\nlimits = {{ plan_lines = 20, judge_writes_code = true, actor_paths = [\"docs/**\"] }}\n"
    );
    let c = Config::parse(&set, Path::new("/x/c.toml")).unwrap();
    let docs = &c.flows[0];
    assert_eq!(docs.on_insufficient, crate::config::OnInsufficient::Keep);
    assert_eq!(
        (
            docs.limits.plan_lines,
            docs.limits.judge_writes_code,
            docs.limits.actor_paths.clone()
        ),
        (20, true, vec!["docs/**".to_string()])
    );
    let bad = format!(
        "{agents}on_insufficient = \"revert\"\nlimits = {{ plan_lines = 0, actor_paths = [\"/etc/*\", \"docs/../x\"], judge = 1 }}\n"
    );
    let p = problems(&bad);
    assert!(
        p.iter().any(|p| p.contains("unknown field `judge`")),
        "{p:#?}"
    );
    let bad = format!(
        "{agents}on_insufficient = \"revert\"\nlimits = {{ plan_lines = 0, actor_paths = [\"/etc/*\", \"docs/../x\"] }}\n"
    );
    let p = problems(&bad).join("\n");
    for want in [
        "flow[0] (docs).on_insufficient: \"revert\" is not a choice; write \"rollback\"",
        "flow[0] (docs).limits.plan_lines: 0 is not between 1 and 1000000",
        "flow[0] (docs).limits.actor_paths[0]: \"/etc/*\" is absolute",
        "flow[0] (docs).limits.actor_paths[1]: \"docs/../x\" has a `..` component",
    ] {
        assert!(p.contains(want), "{want:?} not in\n{p}");
    }
    let p = problems(&agents.replace(
        "workspace = { repo = \"/srv/repo\" }",
        "workspace = { repo = \"/srv/repo\", branch = \"agent-state/flow/{agent}\" }",
    ))
    .join("\n");
    assert!(p.contains("which names flows' cycle branches"), "{p}");
}

/// `memory_max` (per agent, inherited from `[defaults]`) and
/// `daemon.oom_lower_for`: what they read as, and what they refuse.
#[test]
fn memory_max_and_oom_lower_for() {
    let parse = |daemon: &str, defaults: &str, agent: &str| {
        Config::parse(
            &format!(
                "[daemon]\n{daemon}\n[defaults]\ncommand = [\"/bin/true\"]\n{defaults}\n[[agent]]\nname = \"rio\"\n{agent}\n[[agent]]\nname = \"leo\"\n"
            ),
            Path::new("/etc/agent-state/config.toml"),
        )
    };
    let c = parse("", "", "").unwrap();
    assert_eq!(c.agents[0].session.memory_max, None);
    assert_eq!(c.daemon.oom_lower_for, Duration::from_secs(3600));
    let c = parse(
        "oom_lower_for = \"0s\"",
        "memory_max = \"2G\"",
        "memory_max = \"512M\"",
    )
    .unwrap();
    assert_eq!(c.agents[0].session.memory_max, Some(512 << 20));
    assert_eq!(c.agents[1].session.memory_max, Some(2 << 30), "inherited");
    assert_eq!(c.daemon.oom_lower_for, Duration::ZERO);
    let c = parse("", "memory_max = \"2G\"", "memory_max = \"none\"").unwrap();
    assert_eq!(c.agents[0].session.memory_max, None);
    for (daemon, defaults, want) in [
        (
            "",
            "memory_max = \"lots\"",
            "defaults.memory_max: \"lots\" has an unknown unit",
        ),
        (
            "",
            "memory_max = \"1M\"",
            "defaults.memory_max: \"1M\" is below 16MiB",
        ),
        (
            "oom_lower_for = \"30d\"",
            "",
            "daemon.oom_lower_for: is longer than 7d",
        ),
        (
            "oom_lower_for = \"soon\"",
            "",
            "daemon.oom_lower_for: \"soon\" is not a duration",
        ),
    ] {
        let e = parse(daemon, defaults, "").unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
}

/// `[[flow]] publish`: both keys, each checked with the fix named.
#[test]
fn a_flow_s_publish_settings() {
    let parse = |publish: &str| {
        Config::parse(
            &format!(
                "[defaults]\ncommand = [\"/bin/true\"]\n[[agent]]\nname = \"p\"\n[[agent]]\nname = \"a\"\nworkspace = {{ repo = \"/srv/r\" }}\n[[agent]]\nname = \"j\"\n[[agent]]\nname = \"h\"\nkind = \"human\"\n[[flow]]\nname = \"f\"\nplanner = \"p\"\nactor = \"a\"\njudge = \"j\"\n{publish}\n"
            ),
            Path::new("/etc/agent-state/config.toml"),
        )
    };
    let c = parse("").unwrap();
    assert_eq!(c.flows[0].publish, None);
    let c = parse("publish = { into = \"main\", remote = \"origin\" }").unwrap();
    assert_eq!(
        c.flows[0].publish,
        Some(PublishSettings {
            into: "main".into(),
            remote: "origin".into()
        })
    );
    for (publish, want) in [
        (
            "publish = { remote = \"origin\" }",
            "flow[0] (f).publish.into: \"\" is not a branch name",
        ),
        (
            "publish = { into = \"a..b\", remote = \"origin\" }",
            "publish.into: \"a..b\" is not a branch name",
        ),
        (
            "publish = { into = \"main\" }",
            "publish.remote: \"\" is not a remote",
        ),
        (
            "publish = { into = \"main\", remote = \"--upload-pack=x\" }",
            "publish.remote: \"--upload-pack=x\" is not a remote",
        ),
        (
            "publish = { into = \"main\", remot = \"x\" }",
            "unknown field",
        ),
    ] {
        let e = parse(publish).unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
}

/// `runs_on` (per agent, inherited from `[defaults]`): where an agent's
/// sessions run in cluster mode; a wrong value names the field, and
/// "controller" without workers to keep apart from is said to do nothing.
#[test]
fn runs_on_places_an_agent_on_the_controller_or_the_workers() {
    let cluster = "[cluster]\nurls = [\"nats://127.0.0.1:4222\"]\nlocal_sessions = false\n";
    let parse = |defaults: &str, agent: &str, tail: &str| {
        Config::parse(
            &format!(
                "[defaults]\ncommand = [\"/bin/true\"]\n{defaults}\n[[agent]]\nname = \"rio\"\n{agent}\n[[agent]]\nname = \"leo\"\n{tail}"
            ),
            Path::new("/etc/agent-state/config.toml"),
        )
    };
    let c = parse("", "", cluster).unwrap();
    assert_eq!(c.agents[0].session.runs_on, RunsOn::Workers, "the default");
    let c = parse("", "runs_on = \"controller\"", cluster).unwrap();
    assert_eq!(c.agents[0].session.runs_on, RunsOn::Controller);
    assert_eq!(c.agents[1].session.runs_on, RunsOn::Workers);
    assert!(
        c.warnings.iter().all(|w| !w.field.contains("runs_on")),
        "{:?}",
        c.warnings
    );
    let c = parse("runs_on = \"controller\"", "runs_on = \"workers\"", cluster).unwrap();
    assert_eq!(c.agents[0].session.runs_on, RunsOn::Workers);
    assert_eq!(c.agents[1].session.runs_on, RunsOn::Controller, "inherited");
    // Without workers (no [cluster], or local_sessions = true): said.
    for tail in ["", "[cluster]\nurls = [\"nats://127.0.0.1:4222\"]\n"] {
        let c = parse("", "runs_on = \"controller\"", tail).unwrap();
        let warned: Vec<String> = c.warnings.iter().map(|w| w.to_string()).collect();
        assert!(
            warned
                .iter()
                .any(|w| w.contains("agent (rio).runs_on") && w.contains("has no effect")),
            "{warned:?}"
        );
    }
    // In cluster mode, what a worker would refuse is said by `check`.
    let warned = |c: &Config| -> Vec<String> { c.warnings.iter().map(|w| w.to_string()).collect() };
    let c = parse("", "verify = [[\"true\"]]", cluster).unwrap();
    assert!(
        warned(&c)
            .iter()
            .any(|w| w.contains("agent (rio).verify") && w.contains("runs_on = \"controller\"")),
        "{:?}",
        warned(&c)
    );
    let c = parse(
        "",
        "verify = [[\"true\"]]\nruns_on = \"controller\"",
        cluster,
    )
    .unwrap();
    assert!(
        warned(&c).iter().all(|w| !w.contains("(rio).verify")),
        "{:?}",
        warned(&c)
    );
    let flow = "[[agent]]\nname = \"marcus\"\nkind = \"human\"\n[[flow]]\nname = \"notes\"\nplanner = \"leo\"\nactor = \"rio\"\njudge = \"leo\"\nhuman = \"marcus\"\n";
    let c = parse(
        "",
        "workspace = { repo = \"/srv/notes\" }",
        &format!("{flow}{cluster}"),
    )
    .unwrap();
    assert!(
        warned(&c)
            .iter()
            .any(|w| w.contains("agent (rio).runs_on") && w.contains("Actor of flow notes")),
        "{:?}",
        warned(&c)
    );
    let Err(ConfigError::Invalid { problems, .. }) = parse("", "runs_on = \"laptop\"", cluster)
    else {
        panic!("a bad runs_on passed");
    };
    let p: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    assert!(
        p.iter().any(|p| p.contains("runs_on")
            && p.contains("\"laptop\" is not a place")
            && p.contains("\"controller\"")),
        "{p:?}"
    );
}
