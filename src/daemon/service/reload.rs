//! The configuration: applying the agents at start and on SIGHUP (watches,
//! schedules, the core's slots), and the reload's verdict.

use super::*;

use std::collections::HashSet;

impl Daemon {
    /// Make the core, the watches and the schedules match the config,
    /// leaving alone the agents in `unchanged` (configured as before, and
    /// set up already): a reload at 10,000 agents costs a comparison for
    /// each agent it does not change.
    /// Set up every configured agent (directories, watches, schedules).
    /// Returns the agents whose directory could not be made, with why: a
    /// reload says so (`agent-state reload` fails) rather than run on with
    /// an agent shown `missing`.
    pub(super) fn apply_agents(
        &mut self,
        at_start: bool,
        unchanged: &HashSet<AgentName>,
    ) -> Vec<String> {
        self.agent_index = index_agents(&self.config);
        self.published.agents_generation += 1;
        let now = self.clock.now();
        let mut not_made = Vec::new();
        // The instance counters list every agent (seed 000).
        if let Err(e) = crate::state::counters::list_agents(
            &self.root,
            self.config.working_agents().map(|a| a.name.as_str()),
        ) {
            tracing::warn!("cannot list the agents in .daemon/counters.json: {e}");
        }
        // Removed agents: unwatch; their directories stay (never deleted).
        let working: HashSet<&AgentName> = self
            .config
            .agents
            .iter()
            .filter(|a| a.kind == AgentKind::Agent)
            .map(|a| &a.name)
            .collect();
        let removed: Vec<AgentName> = self
            .core
            .names()
            .filter(|n| !working.contains(n))
            .cloned()
            .collect();
        drop(working);
        if at_start {
            // Directories of agents removed while the daemon was down.
            let configured: std::collections::BTreeSet<String> = self
                .config
                .agents
                .iter()
                .map(|a| a.name.to_string())
                .collect();
            let gone: Vec<AgentName> = crate::fsx::list(&self.root.path)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|n| AgentName::parse(n.to_str()?).ok())
                .filter(|n| !configured.contains(n.as_str()))
                .filter(|n| crate::fsx::is_dir(&self.root.agent(n).path))
                .filter(|n| crate::fsx::exists(&self.root.agent(n).report()))
                .collect();
            for name in gone {
                publish::set_lifecycle(&self.root, &name, |_| Some(Lifecycle::Expired));
            }
        }
        for name in removed {
            publish::set_lifecycle(&self.root, &name, |_| Some(Lifecycle::Expired));
            self.watcher.unwatch(&name);
            if !self.running.contains_key(&name) {
                self.core.remove(&name);
            }
            self.schedules.next_scheduled.remove(&name);
            tracing::info!(agent = %name, "agent removed from the config: no longer woken (its directory is kept)");
        }
        // The agents to set up, and what is on disk for each: surveyed on a
        // few threads (each agent's own files; at 10,000 agents this was
        // most of a start), then applied here one by one.
        let todo: Vec<usize> = (0..self.config.agents.len())
            .filter(|&i| {
                let agent = &self.config.agents[i];
                agent.kind == AgentKind::Agent
                    && !(unchanged.contains(&agent.name)
                        && self.core.contains(&agent.name)
                        && self.watcher.is_watching(&agent.name))
            })
            .collect();
        let surveys = {
            let (agents, root) = (&self.config.agents, &self.root);
            let dirs = todo
                .iter()
                .map(|&i| (&agents[i], root.agent(&agents[i].name)));
            bootstrap::create_missing(dirs, Timestamp::now());
            crate::daemon::fanout::map(&todo, |&i| {
                Survey::of(&agents[i], &root.agent(&agents[i].name))
            })
        };
        for (i, survey) in todo.into_iter().zip(surveys) {
            // One agent's config copied at a time (not the whole list: at
            // 10,000 agents a copy of every agent's config was 7 MiB of the
            // peak).
            let agent = &self.config.agents[i].clone();
            let dir = self.root.agent(&agent.name);
            if let Err(e) = survey.bootstrapped {
                let code = e.code();
                tracing::error!(agent = %agent.name, error_code = code.as_str(), "cannot bootstrap: {e}");
                not_made.push(format!("{}: cannot make its directory: {e}", agent.name));
                // A busy lock or a bad path: the agent stays configured and
                // its work is deferred or refused with the reason each time.
                if !matches!(e, Error::LockBusy { .. } | Error::Unsafe { .. }) {
                    continue;
                }
            }
            if let Err(e) = self.watcher.watch(&agent.name, &dir.inbox()) {
                tracing::error!(agent = %agent.name, error_code = e.code().as_str(), "{e}");
            }
            let mut slot = self.core.slot_or_insert(&agent.name, || {
                AgentSlot::new(agent.session.wake_on_inbox, agent.session.inbox_debounce)
            });
            slot.wake_on_inbox = agent.session.wake_on_inbox;
            slot.inbox_debounce = agent.session.inbox_debounce;
            drop(slot);
            publish::rank(&mut self.core, &agent.name, survey.rolling.as_ref());
            // New, or configured again after it expired: hatching or
            // sleeping (a running session keeps `alive`).
            let at_rest = survey.at_rest;
            publish::set_lifecycle_seen(&self.root, &agent.name, survey.lifecycle, |current| {
                match current {
                    None | Some(Lifecycle::Expired) | Some(Lifecycle::Hatching) => {
                        Some(at_rest.unwrap_or_else(|| Lifecycle::at_rest(&dir)))
                    }
                    other => other,
                }
            });
            if let Some(wake) = survey.next_wake {
                self.published
                    .surveyed_wake
                    .insert(agent.name.clone(), wake);
            }
            self.plan_schedule(agent, now, at_start);
        }
        self.published.surveyed_wake.clear();
        // Human mailboxes: bootstrapped, never woken.
        for agent in self
            .config
            .agents
            .iter()
            .filter(|a| a.kind == AgentKind::Human && !unchanged.contains(&a.name))
        {
            if let Err(e) = bootstrap::agent(agent, &self.root.agent(&agent.name), Timestamp::now())
            {
                tracing::error!(agent = %agent.name, "cannot bootstrap the mailbox: {e}");
                not_made.push(format!("{}: cannot make its directory: {e}", agent.name));
            }
        }
        self.schedules.save(&self.root);
        not_made
    }

    pub(super) fn reload(&mut self) {
        systemd::reloading();
        let verdict = match Config::load_with_text(&self.config_path) {
            Ok((config, text)) => {
                if let Some((why, reported)) = needs_restart(&self.config, &config) {
                    self.raise(
                        ErrorRecord::new(
                            Code::ConfigInvalid,
                            format!("config reload refused: {why}"),
                        )
                        .details(self.config_path.display().to_string()),
                        false,
                    );
                    (None, vec![reported])
                } else {
                    self.core.max_concurrent = config.daemon.max_concurrent_sessions.max(1);
                    let old =
                        std::mem::replace(&mut self.alerts, Alerts::new(&config, &self.root.store));
                    self.alerts.adopt(&old);
                    // Agents configured exactly as before (by the index of
                    // the old config, before it goes).
                    let mut unchanged: HashSet<AgentName> = config
                        .agents
                        .iter()
                        .filter(|a| self.agent_config(&a.name) == Some(*a))
                        .map(|a| a.name.clone())
                        .collect();
                    // A textfile added, moved or removed: applied now.
                    if config.metrics.textfile != self.config.metrics.textfile {
                        match (&mut self.metrics_out, &config.metrics.textfile) {
                            (Some(out), _) => out.textfile = config.metrics.textfile.clone(),
                            (None, Some(path)) => {
                                self.metrics_out =
                                    Some(super::metrics::Publishing::new(Some(path.clone())));
                            }
                            (None, None) => {}
                        }
                        tracing::info!(
                            "metrics textfile: {}",
                            config
                                .metrics
                                .textfile
                                .as_ref()
                                .map_or("off".to_string(), |p| p.display().to_string())
                        );
                    }
                    // Its timer: started when metrics come on by a reload,
                    // set again when the interval changes.
                    if config.metrics.enabled()
                        && (self.sources.metrics.is_none()
                            || config.metrics.interval != self.config.metrics.interval)
                    {
                        self.sources.metrics = Some(super::every(config.metrics.interval));
                    }
                    self.config = config;
                    // A reload is the operator's action a disabled agent
                    // waits for; one held because its command cannot be
                    // executed is released once it can (checked below).
                    let disabled: Vec<AgentName> = self
                        .core
                        .busy()
                        .filter(|(a, s)| s.disabled.is_some() && !self.unrunnable.contains_key(*a))
                        .map(|(a, _)| a.clone())
                        .collect();
                    for name in disabled {
                        if let Some(mut slot) = self.core.slot_mut(&name) {
                            slot.disabled = None;
                            slot.backoff_until = None;
                        }
                        unchanged.remove(&name);
                    }
                    let warnings = config_warnings(&self.config, &self.config_path);
                    self.raise_each(warnings);
                    let not_made = self.apply_agents(false, &unchanged);
                    self.recheck_unrunnable();
                    // What waits in the inboxes of the agents it changed: the
                    // others' is known and watched (and the reconcile scan
                    // looks at every inbox anyway).
                    let changed: Vec<AgentName> = self
                        .core
                        .names()
                        .filter(|a| !unchanged.contains(*a))
                        .cloned()
                        .collect();
                    for agent in changed {
                        self.intake.requests.take(&self.root.agent(&agent));
                        self.intake
                            .retry_rejected(&self.root, self.lock_busy.wait(&agent), &agent);
                        // A fresh listing: now for a small inbox; a big one (a flood of junk
                        // beside the mail: its listing costs tens of milliseconds per 100,000
                        // entries) is listed off the loop first, scanned when it is back.
                        if inbox::is_big(&self.root.agent(&agent)) {
                            (self.intake).list_inbox_for_scan(&self.root, &self.tx, &agent);
                        } else {
                            self.scan_inbox(&agent);
                        }
                    }
                    tracing::info!("config reloaded: {} agents", self.config.agents.len());
                    // In force, but an agent could not be set up: the
                    // verdict carries why, and `agent-state reload` fails.
                    (Some(text), not_made)
                }
            }
            Err(e) => {
                let reasons = match &e {
                    crate::config::ConfigError::Invalid { problems, .. } => {
                        problems.iter().map(|p| p.to_string()).collect()
                    }
                    other => vec![other.to_string()],
                };
                self.raise(
                    ErrorRecord::new(
                        Code::ConfigInvalid,
                        "config reload refused, the old config stays in force",
                    )
                    .details(e.to_string()),
                    false,
                );
                (None, reasons)
            }
        };
        // The verdict `agent-state reload` (ExecReload=) waits for, written
        // after daemon.json says what the daemon now runs: whoever reads
        // daemon.json once the verdict is in (`reload && status`) finds the
        // reloaded agents, not the old ones until the turn ends.
        self.published.write_heartbeat(&seen!(self));
        let (accepted, reasons) = verdict;
        if let Err(e) = files::record_reload_verdict(
            &self.root,
            &self.config_path,
            accepted.as_deref(),
            reasons,
            Timestamp::from_datetime(self.clock.now()),
        ) {
            tracing::warn!("cannot record the verdict on the reloaded config: {e}");
        }
        systemd::ready(&seen!(self).status_line());
        give_back_memory();
    }
}

/// Return the heap's free pages to the system. Start-up and a reload parse
/// and build per-agent state once (the config's TOML, a copy of every
/// agent's config, the watches); glibc keeps what that freed, so at 10,000
/// agents the daemon's RSS stayed some MiB above what it uses (measured:
/// see bench/daemon/README.md).
pub(super) fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

/// What is on disk for one agent being applied, read off the loop's thread;
/// only what the apply uses is kept (10,000 of these live at once).
struct Survey {
    /// `bootstrap::agent`: its directory complete (created where missing).
    bootstrapped: Result<Vec<String>>,
    /// report.json's `lifecycle` and `next_wake_at` (`None`: unreadable).
    lifecycle: Option<Option<Lifecycle>>,
    next_wake: Option<Option<Timestamp>>,
    /// metrics.json's 30 days, for the rank.
    rolling: Option<crate::state::metrics::Rolling>,
    /// Its lifecycle between sessions, when report.json's needs deciding.
    at_rest: Option<Lifecycle>,
}

impl Survey {
    fn of(agent: &AgentConfig, dir: &AgentDir) -> Survey {
        let bootstrapped = bootstrap::agent(agent, dir, Timestamp::now());
        let report: Option<Report> = dir.read().ok().flatten();
        let metrics: Option<crate::state::metrics::Metrics> = dir.read().ok().flatten();
        let lifecycle = report.as_ref().map(|r| r.lifecycle);
        let at_rest = match lifecycle.flatten() {
            None | Some(Lifecycle::Expired) | Some(Lifecycle::Hatching) => {
                Some(Lifecycle::at_rest_given(dir, metrics.as_ref()))
            }
            Some(_) => None,
        };
        Survey {
            bootstrapped,
            lifecycle,
            next_wake: report.map(|r| r.next_wake_at),
            rolling: metrics.map(|m| m.rolling_30d),
            at_rest,
        }
    }
}

/// Settings that took their default: one `CONFIG_DEFAULTED` each.
/// The config's warnings (a default taken for a bad value), as records to
/// raise.
pub(super) fn config_warnings(config: &Config, config_path: &Path) -> Vec<ErrorRecord> {
    config
        .warnings
        .iter()
        .map(|w| {
            ErrorRecord::new(Code::ConfigDefaulted, format!("{}: {}", w.field, w.message))
                .details(config_path.display().to_string())
        })
        .collect()
}

/// The first `[web]` key a reload changes, if any (pure).
/// A change a reload cannot apply (what is bound or read at start): why,
/// for the error record, and the line the reload's verdict reports.
fn needs_restart(old: &Config, new: &Config) -> Option<(String, String)> {
    if new.metrics.listen != old.metrics.listen {
        // The listener is bound at start (an address in use fails the
        // start): a reload cannot move it.
        let show =
            |a: Option<std::net::SocketAddr>| a.map_or("off".to_string(), |a| format!("\"{a}\""));
        let why = format!(
            "[metrics] listen: {} -> {}: the listener is bound at start; restart the daemon (systemctl restart agent-state) to change it, or put the old value back to reload the rest",
            show(old.metrics.listen),
            show(new.metrics.listen)
        );
        Some((why.clone(), why))
    } else if let Some(key) = web_change(&old.web, &new.web) {
        // The web view is bound, and its token read, at start.
        let why = format!(
            "[web] {key} changed: the web view is set up at start; restart the daemon (systemctl restart agent-state) to change it, or put the old value back to reload the rest"
        );
        Some((why.clone(), why))
    } else if new.state_root != old.state_root {
        let why = "state_root cannot change while the daemon runs (restart it instead)";
        Some((why.to_string(), format!("state_root: {why}")))
    } else {
        None
    }
}

fn web_change(
    old: &crate::config::web::WebSettings,
    new: &crate::config::web::WebSettings,
) -> Option<&'static str> {
    if old.listen != new.listen {
        Some("listen")
    } else if old.token_file != new.token_file {
        Some("token_file")
    } else if old.show_bodies != new.show_bodies {
        Some("show_bodies")
    } else {
        None
    }
}
