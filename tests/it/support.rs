//! Test environments: a temp dir with a config file and a state root, and
//! helpers to run the real binary against them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use tempfile::TempDir;

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-state");

/// Three research agents and a human mailbox.
pub const STANDARD_AGENTS: &str = r#"
[[agent]]
name = "rio"
domain = "internet-finance"
schedule = "0 22 * * *"

[[agent]]
name = "theseus"
domain = "ai-alignment"
schedule = "0 1 * * *"

[[agent]]
name = "leo"
domain = "grand-strategy"

[[agent]]
name = "marcus"
kind = "human"
"#;

pub struct Env {
    pub dir: TempDir,
    pub config: PathBuf,
    pub root: PathBuf,
}

impl Env {
    /// An environment whose config is `body` (agents, sections) under a
    /// `state_root` in the temp dir. Not bootstrapped.
    pub fn with_config(body: &str) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("state");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!("state_root = {:?}\n{body}", root.display().to_string()),
        )
        .expect("write config");
        Env { dir, config, root }
    }

    /// The standard agents, bootstrapped.
    pub fn standard() -> Env {
        let env = Env::with_config(STANDARD_AGENTS);
        env.ok(&["bootstrap"]);
        env
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--config").arg(&self.config).args(args);
        cmd.env_remove("AGENT_STATE_SESSION_ID");
        cmd.env_remove("AGENT_STATE_CONFIG");
        cmd.stdin(Stdio::null());
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run agent-state")
    }

    /// Run, assert exit 0, return stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "agent-state {args:?} failed with {:?}\nstdout: {}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Run, assert the exit code, return stderr.
    pub fn fails(&self, args: &[&str], code: i32) -> String {
        let out = self.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(
            out.status.code(),
            Some(code),
            "agent-state {args:?}: expected exit {code}\nstdout: {}\nstderr: {stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        stderr
    }

    pub fn agent(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn path(&self, agent: &str, rel: &str) -> PathBuf {
        self.agent(agent).join(rel)
    }

    /// Parse a JSON state file of an agent.
    pub fn json(&self, agent: &str, file: &str) -> Value {
        read_json(&self.path(agent, file))
    }

    pub fn write(&self, agent: &str, rel: &str, text: &str) {
        std::fs::write(self.path(agent, rel), text).expect("write");
    }

    pub fn read(&self, agent: &str, rel: &str) -> String {
        std::fs::read_to_string(self.path(agent, rel)).expect("read")
    }

    /// Journal events of an agent, parsed.
    pub fn journal(&self, agent: &str) -> Vec<Value> {
        self.read(agent, "journal.jsonl")
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("journal line {l:?}: {e}")))
            .collect()
    }

    pub fn events(&self, agent: &str, event: &str) -> Vec<Value> {
        self.journal(agent)
            .into_iter()
            .filter(|e| e["event"] == event)
            .collect()
    }

    /// Names of the files in a directory of an agent (sorted).
    pub fn files(&self, agent: &str, rel: &str) -> Vec<String> {
        list(&self.path(agent, rel))
    }

    /// Messages waiting in an inbox (`*.json`, not dotfiles).
    pub fn waiting(&self, agent: &str) -> Vec<String> {
        self.files(agent, "inbox")
            .into_iter()
            .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
            .collect()
    }

    /// `send` a message, return its id.
    pub fn send(&self, from: &str, to: &str, extra: &[&str]) -> String {
        let mut args = vec!["send", "--from", from, "--to", to, "--subject", "a subject"];
        args.extend_from_slice(extra);
        let out = self.ok(&args);
        out.split_whitespace().nth(1).expect("sent ID").to_string()
    }
}

pub fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}\n{text}", path.display()))
}

pub fn list(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(it) => it
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => vec![],
    };
    names.sort();
    names
}

/// The keys of a JSON object, in file order.
pub fn keys(v: &Value) -> Vec<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The JSON type of a value, as a word: what "value types" means in the tests.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
