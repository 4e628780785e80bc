//! The worker's credential groups: each group's login check
//! (`[credential.NAME] check`), run at start and when due, and which
//! groups' orders it pulls meanwhile.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{Shared, log, until};

/// A credential group's login check, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupCheck {
    pub command: Vec<String>,
    pub every: Duration,
}

/// A failing credential is checked again at least this often.
const CHECK_WHILE_FAILING: Duration = Duration::from_secs(300);

/// The last result of a group's check, and when to run it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// `None`: it passed; else why it failed.
    pub failed: Option<String>,
    pub next_at: Instant,
}

impl Checked {
    /// The state after a check ended at `now`: a passing one is run again
    /// after `every`, a failing one after `every` but at most
    /// [`CHECK_WHILE_FAILING`].
    pub fn after(every: Duration, failed: Option<String>, now: Instant) -> Checked {
        let again = if failed.is_some() {
            every.min(CHECK_WHILE_FAILING)
        } else {
            every
        };
        Checked {
            failed,
            next_at: now + again,
        }
    }
}

/// Whether `group` works, and if not why: a group without a check works;
/// one with a check works once its last check passed.
pub fn group_state(
    group: &str,
    checks: &BTreeMap<String, GroupCheck>,
    results: &BTreeMap<String, Checked>,
) -> (bool, Option<String>) {
    if !checks.contains_key(group) {
        return (true, None);
    }
    match results.get(group) {
        None => (false, Some("its check has not answered yet".into())),
        Some(Checked { failed: None, .. }) => (true, None),
        Some(Checked {
            failed: Some(why), ..
        }) => (false, Some(format!("its check failed: {why}"))),
    }
}

/// The groups whose orders may be pulled (in `groups`' order).
pub fn pullable(
    groups: &[String],
    checks: &BTreeMap<String, GroupCheck>,
    results: &BTreeMap<String, Checked>,
) -> Vec<String> {
    groups
        .iter()
        .filter(|g| group_state(g, checks, results).0)
        .cloned()
        .collect()
}

/// The groups whose check is due at `now`: never run, or its time come.
pub fn checks_due(
    groups: &[String],
    checks: &BTreeMap<String, GroupCheck>,
    results: &BTreeMap<String, Checked>,
    now: Instant,
) -> Vec<String> {
    groups
        .iter()
        .filter(|g| checks.contains_key(*g))
        .filter(|g| results.get(*g).is_none_or(|c| c.next_at <= now))
        .cloned()
        .collect()
}

/// Runs each group's login check at start and when due, keeping its
/// result in `shared.checks`; says each change once.
pub(super) async fn check_credentials(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let checks = &shared.options.checks;
    let groups = &shared.options.groups;
    if !groups.iter().any(|g| checks.contains_key(g)) {
        return;
    }
    let lock = || shared.checks.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let due = checks_due(groups, checks, &lock(), Instant::now());
        for group in due {
            let check = &checks[&group];
            let result = tokio::select! {
                r = crate::daemon::credential::check(
                    &check.command,
                    std::path::Path::new("/"),
                    crate::daemon::credential::CHECK_TIMEOUT,
                ) => r,
                _ = until(&mut stop, true) => return,
            };
            let failed = result.err().map(|e| e.to_string());
            let now = Instant::now();
            let before = lock().insert(
                group.clone(),
                Checked::after(check.every, failed.clone(), now),
            );
            let was = before.map(|b| b.failed);
            if was.as_ref() != Some(&failed) {
                match &failed {
                    None => log(format!(
                        "credential group {group}: its check passed; pulling its orders"
                    )),
                    Some(why) => log(format!(
                        "credential group {group}: its check failed: {why}; pulling none of its orders until it passes (checked again every {})",
                        humantime::format_duration(check.every.min(CHECK_WHILE_FAILING))
                    )),
                }
            }
        }
        let next = lock().values().map(|c| c.next_at).min();
        let wait = next.map_or(Duration::from_secs(1), |at| {
            at.saturating_duration_since(Instant::now())
        });
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = until(&mut stop, true) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn which_groups_are_pulled_and_which_checks_are_due() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let every = s(60);
        let checks: BTreeMap<String, GroupCheck> = ["a", "b"]
            .iter()
            .map(|g| {
                (
                    g.to_string(),
                    GroupCheck {
                        command: vec!["check".into()],
                        every,
                    },
                )
            })
            .collect();
        let all = groups(&["a", "b", "free"]);
        let ok = |at: Duration| Checked::after(every, None, t0 + at);
        let bad = |at: Duration| Checked::after(every, Some("logged out".into()), t0 + at);
        // (results, now, pulled, due)
        type Row = (
            Vec<(&'static str, Checked)>,
            Duration,
            Vec<&'static str>,
            Vec<&'static str>,
        );
        let table: Vec<Row> = vec![
            // At start: no check has answered; the unchecked group is pulled.
            (vec![], s(0), vec!["free"], vec!["a", "b"]),
            // a passed, b not yet answered.
            (vec![("a", ok(s(0)))], s(1), vec!["a", "free"], vec!["b"]),
            // Both passed; nothing due before `every`.
            (
                vec![("a", ok(s(0))), ("b", ok(s(0)))],
                s(59),
                vec!["a", "b", "free"],
                vec![],
            ),
            // At `every` both are due again; they still count as working.
            (
                vec![("a", ok(s(0))), ("b", ok(s(0)))],
                s(60),
                vec!["a", "b", "free"],
                vec!["a", "b"],
            ),
            // b failed: not pulled until a check passes.
            (
                vec![("a", ok(s(0))), ("b", bad(s(10)))],
                s(20),
                vec!["a", "free"],
                vec![],
            ),
            (
                vec![("a", ok(s(30))), ("b", bad(s(10)))],
                s(70),
                vec!["a", "free"],
                vec!["b"],
            ),
        ];
        for (i, (results, now, pulled, due)) in table.into_iter().enumerate() {
            let results: BTreeMap<String, Checked> = results
                .into_iter()
                .map(|(g, c)| (g.to_string(), c))
                .collect();
            assert_eq!(
                pullable(&all, &checks, &results),
                groups(&pulled),
                "row {i}"
            );
            assert_eq!(
                checks_due(&all, &checks, &results, t0 + now),
                groups(&due),
                "row {i}"
            );
        }
    }

    #[test]
    fn a_failing_check_is_run_again_within_five_minutes_and_says_why() {
        let t0 = Instant::now();
        let hour = Duration::from_secs(3600);
        assert_eq!(Checked::after(hour, None, t0).next_at, t0 + hour);
        assert_eq!(
            Checked::after(hour, Some("x".into()), t0).next_at,
            t0 + CHECK_WHILE_FAILING
        );
        let ten = Duration::from_secs(10);
        assert_eq!(Checked::after(ten, Some("x".into()), t0).next_at, t0 + ten);
        let checks = BTreeMap::from([(
            "a".to_string(),
            GroupCheck {
                command: vec!["c".into()],
                every: hour,
            },
        )]);
        let results = BTreeMap::from([(
            "a".to_string(),
            Checked::after(hour, Some("logged out".into()), t0),
        )]);
        assert_eq!(
            group_state("a", &checks, &results),
            (false, Some("its check failed: logged out".into()))
        );
        assert_eq!(
            group_state("a", &checks, &BTreeMap::new()),
            (false, Some("its check has not answered yet".into()))
        );
        assert_eq!(group_state("b", &checks, &results), (true, None));
    }
}
