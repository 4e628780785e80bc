//! The tests of `daemon::core`: the slot indexes after every change, the
//! order slots are served in, debounce, follow-ups, backoff and disabled
//! agents, schedules.

use super::*;

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}
fn name(n: &str) -> AgentName {
    AgentName::parse(n).unwrap()
}
fn core(names: &[&str], max: usize) -> Core {
    let mut c = Core::new(max);
    for n in names {
        c.slot_or_insert(&name(n), || {
            AgentSlot::new(WakeOnInbox::High, Duration::from_secs(30))
        });
    }
    c
}
fn started(c: &mut Core) -> Vec<String> {
    let out = c
        .take_startable(t("2026-01-01T00:00:00Z"))
        .into_iter()
        .map(|(n, _)| n.to_string())
        .collect();
    c.check_indexes();
    out
}

#[test]
fn the_indexes_follow_every_change_and_the_walks_use_them() {
    let mut c = core(&["a", "b", "c", "d"], 2);
    let t0 = t("2026-01-01T00:00:00Z");
    c.check_indexes();
    assert_eq!(c.busy().count(), 0, "idle agents are not busy");
    assert_eq!(c.next_deadline(t0), None);
    // Schedules, in time order whatever the name order.
    c.slot_mut(&name("d")).unwrap().next_fire = Some(t("2026-01-01T01:00:00Z"));
    c.slot_mut(&name("b")).unwrap().next_fire = Some(t("2026-01-01T02:00:00Z"));
    c.check_indexes();
    let fires: Vec<String> = c.fires().map(|(_, n)| n.to_string()).collect();
    assert_eq!(fires, ["d", "b"]);
    assert_eq!(c.next_deadline(t0), Some(t("2026-01-01T01:00:00Z")));
    let generation = c.fires_generation();
    // Due at 01:30: d fires and moves to 03:00; b is not due.
    let (due, _) = c.fire_due_schedules(t("2026-01-01T01:30:00Z"), |_, _| {
        Some(t("2026-01-01T03:00:00Z"))
    });
    c.check_indexes();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].0.as_str(), "d");
    assert!(c.fires_generation() > generation);
    let fires: Vec<String> = c.fires().map(|(_, n)| n.to_string()).collect();
    assert_eq!(fires, ["b", "d"]);
    assert_eq!(c.waiting_count(), 1);
    // A debounce, a start, an end.
    c.inbox_scanned(&name("a"), InboxSummary { high: 1, normal: 0 }, t0);
    c.check_indexes();
    assert!(c.busy().any(|(n, _)| n.as_str() == "a"));
    c.fire_due_inbox(t("2026-01-01T00:01:00Z"));
    c.check_indexes();
    assert_eq!(started(&mut c), ["a", "d"]);
    assert_eq!(c.running_count(), 2);
    c.session_started(&name("a"), "s1");
    c.session_ended(&name("a"), InboxSummary::default(), t0);
    c.session_ended(&name("d"), InboxSummary::default(), t0);
    c.check_indexes();
    assert_eq!(c.busy().count(), 0, "nothing going on after both ended");
    // A backoff and a removal.
    c.slot_mut(&name("c")).unwrap().backoff_until = Some(t("2026-01-01T05:00:00Z"));
    c.check_indexes();
    assert_eq!(c.busy().count(), 1);
    c.remove(&name("c"));
    c.remove(&name("b"));
    c.check_indexes();
    assert_eq!(c.busy().count(), 0);
    assert_eq!(c.fires().count(), 1);
}

#[test]
fn slots_are_served_high_priority_first_then_oldest() {
    let mut c = core(&["a", "b", "c", "d"], 2);
    c.request(
        &name("a"),
        WakeReason::Schedule,
        Priority::Normal,
        t("2026-01-01T00:00:00Z"),
    );
    c.request(
        &name("b"),
        WakeReason::Schedule,
        Priority::Normal,
        t("2026-01-01T00:00:01Z"),
    );
    c.request(
        &name("c"),
        WakeReason::Inbox,
        Priority::High,
        t("2026-01-01T00:00:02Z"),
    );
    c.request(
        &name("d"),
        WakeReason::Schedule,
        Priority::Normal,
        t("2025-12-31T00:00:00Z"),
    );
    assert_eq!(started(&mut c), ["c", "d"]);
    assert_eq!(started(&mut c), Vec::<String>::new(), "no free slot");
    c.session_ended(
        &name("d"),
        InboxSummary::default(),
        t("2026-01-01T00:01:00Z"),
    );
    assert_eq!(started(&mut c), ["a"]);
}

#[test]
fn unhealthy_agents_go_after_healthy_ones_of_the_same_priority() {
    let mut c = core(&["a", "b", "c"], 1);
    c.slot_mut(&name("a")).unwrap().unhealthy = true;
    for (n, p, at) in [
        ("a", Priority::Normal, "2026-01-01T00:00:00Z"),
        ("b", Priority::Normal, "2026-01-01T00:00:05Z"),
        ("c", Priority::High, "2026-01-01T00:00:09Z"),
    ] {
        c.request(&name(n), WakeReason::Schedule, p, t(at));
    }
    let now = t("2026-01-01T00:01:00Z");
    let mut order = Vec::new();
    for _ in 0..3 {
        let got = c.take_startable(now);
        let n = got[0].0.clone();
        order.push(n.to_string());
        c.session_ended(&n, InboxSummary::default(), now);
    }
    assert_eq!(
        order,
        ["c", "b", "a"],
        "priority first, then health, then age"
    );
}

#[test]
fn a_disabled_agent_waits_for_a_manual_wake() {
    let mut c = core(&["rio"], 1);
    let now = t("2026-01-01T00:00:00Z");
    c.slot_mut(&name("rio")).unwrap().disabled = Some("not executable".into());
    c.request(&name("rio"), WakeReason::Schedule, Priority::Normal, now);
    assert!(started(&mut c).is_empty());
    assert_eq!(c.next_deadline(now), None, "nothing to wait for");
    c.request(&name("rio"), WakeReason::Manual, Priority::High, now);
    assert_eq!(started(&mut c), ["rio"]);
}

#[test]
fn a_retry_waits_out_its_delay() {
    let mut c = core(&["rio"], 1);
    let now = t("2026-01-01T00:00:00Z");
    let until = t("2026-01-01T00:00:30Z");
    c.slot_mut(&name("rio")).unwrap().backoff_until = Some(until);
    c.request(&name("rio"), WakeReason::Retry, Priority::Normal, now);
    assert!(c.take_startable(now).is_empty());
    assert_eq!(c.next_deadline(now), Some(until));
    let got = c.take_startable(until);
    assert_eq!(got[0].1.reason, WakeReason::Retry);
}

#[test]
fn a_manual_wake_merged_into_a_held_back_one_is_still_served() {
    let mut c = core(&["rio"], 1);
    let t0 = t("2026-01-01T00:00:00Z");
    c.slot_mut(&name("rio")).unwrap().backoff_until = Some(t0 + chrono::Duration::hours(1));
    c.request(&name("rio"), WakeReason::Inbox, Priority::High, t0);
    assert!(c.take_startable(t0).is_empty(), "held back");
    c.request(&name("rio"), WakeReason::Manual, Priority::High, t0);
    let got = c.take_startable(t0);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1.reason, WakeReason::Manual);
}

#[test]
fn an_ended_backoff_is_no_deadline_while_nothing_can_start() {
    let mut c = core(&["rio"], 1);
    let t0 = t("2026-01-01T00:00:00Z");
    c.slot_mut(&name("rio")).unwrap().backoff_until = Some(t0);
    c.request(&name("rio"), WakeReason::Retry, Priority::Normal, t0);
    c.waking_stopped = true;
    let later = t("2026-01-01T00:00:05Z");
    assert!(c.take_startable(later).is_empty());
    assert_eq!(
        c.next_deadline(later),
        None,
        "a past deadline would spin the loop"
    );
}

#[test]
fn a_wake_while_running_is_skipped_and_becomes_one_follow_up_if_messages_wait() {
    let mut c = core(&["rio"], 2);
    let now = t("2026-01-01T00:00:00Z");
    c.request(&name("rio"), WakeReason::Schedule, Priority::Normal, now);
    assert_eq!(started(&mut c), ["rio"]);
    c.session_started(&name("rio"), "S1");
    for _ in 0..3 {
        let s = c
            .request(&name("rio"), WakeReason::Manual, Priority::High, now)
            .unwrap();
        assert_eq!(s.running, "S1");
    }
    assert!(
        started(&mut c).is_empty(),
        "never two sessions of one agent"
    );
    c.session_ended(&name("rio"), InboxSummary { high: 0, normal: 2 }, now);
    let next = c.take_startable(now);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].1.reason, WakeReason::FollowUp);
    c.session_ended(&name("rio"), InboxSummary::default(), now);
    assert!(started(&mut c).is_empty(), "one follow-up, not three");
}

#[test]
fn no_follow_up_without_messages() {
    let mut c = core(&["rio"], 1);
    let now = t("2026-01-01T00:00:00Z");
    c.request(&name("rio"), WakeReason::Manual, Priority::High, now);
    started(&mut c);
    c.request(&name("rio"), WakeReason::Schedule, Priority::Normal, now);
    c.session_ended(&name("rio"), InboxSummary::default(), now);
    assert!(started(&mut c).is_empty());
}

#[test]
fn a_burst_of_messages_is_one_wake_after_the_debounce() {
    let mut c = core(&["rio"], 1);
    let t0 = t("2026-01-01T00:00:00Z");
    for i in 0..50 {
        c.inbox_scanned(
            &name("rio"),
            InboxSummary {
                high: i + 1,
                normal: 0,
            },
            t0 + chrono::Duration::seconds(i as i64 / 10),
        );
    }
    assert!(
        c.fire_due_inbox(t0 + chrono::Duration::seconds(29))
            .is_empty()
    );
    assert!(started(&mut c).is_empty(), "still debouncing");
    assert_eq!(
        c.next_deadline(t0),
        Some(t0 + chrono::Duration::seconds(30))
    );
    c.fire_due_inbox(t0 + chrono::Duration::seconds(30));
    assert_eq!(started(&mut c), ["rio"]);
    assert_eq!(c.next_deadline(t0), None);
}

#[test]
fn a_session_that_starts_takes_over_a_pending_debounce() {
    let mut c = core(&["rio"], 1);
    let t0 = t("2026-01-01T00:00:00Z");
    c.inbox_scanned(&name("rio"), InboxSummary { high: 1, normal: 0 }, t0);
    c.request(&name("rio"), WakeReason::Manual, Priority::High, t0);
    assert_eq!(started(&mut c), ["rio"]);
    c.session_ended(
        &name("rio"),
        InboxSummary::default(),
        t0 + chrono::Duration::seconds(1),
    );
    c.fire_due_inbox(t0 + chrono::Duration::seconds(31));
    assert!(started(&mut c).is_empty(), "no second, empty session");
}

#[test]
fn backoff_holds_automatic_wakes_but_not_manual_ones() {
    let mut c = core(&["rio", "leo"], 2);
    let t0 = t("2026-01-01T00:00:00Z");
    let until = t0 + chrono::Duration::seconds(60);
    c.slot_mut(&name("rio")).unwrap().backoff_until = Some(until);
    c.slot_mut(&name("leo")).unwrap().backoff_until = Some(until);
    c.request(&name("rio"), WakeReason::Inbox, Priority::High, t0);
    c.request(&name("leo"), WakeReason::Manual, Priority::High, t0);
    let now: Vec<String> = c
        .take_startable(t0)
        .into_iter()
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(now, ["leo"], "a manual wake is served during backoff");
    assert_eq!(
        c.next_deadline(t0),
        Some(until),
        "the loop wakes when the backoff ends"
    );
    let later: Vec<String> = c
        .take_startable(until)
        .into_iter()
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(later, ["rio"]);
}

#[test]
fn the_inbox_policy_decides() {
    let high = InboxSummary { high: 1, normal: 0 };
    let normal = InboxSummary { high: 0, normal: 3 };
    assert_eq!(high.wants_wake(WakeOnInbox::High), Some(Priority::High));
    assert_eq!(normal.wants_wake(WakeOnInbox::High), None);
    assert_eq!(normal.wants_wake(WakeOnInbox::Any), Some(Priority::Normal));
    assert_eq!(high.wants_wake(WakeOnInbox::Never), None);
}

#[test]
fn due_schedules_fire_once_and_advance() {
    let mut c = core(&["rio", "leo"], 2);
    c.slot_mut(&name("rio")).unwrap().next_fire = Some(t("2026-01-01T22:00:00Z"));
    c.slot_mut(&name("leo")).unwrap().next_fire = Some(t("2026-01-02T05:30:00Z"));
    let (due, _) = c.fire_due_schedules(t("2026-01-01T22:00:00Z"), |_, fired| {
        Some(fired + chrono::Duration::days(1))
    });
    assert_eq!(due.len(), 1);
    assert_eq!(
        c.slot(&name("rio")).unwrap().next_fire,
        Some(t("2026-01-02T22:00:00Z"))
    );
    assert_eq!(
        c.next_deadline(t("2026-01-01T22:00:00Z")),
        Some(t("2026-01-02T05:30:00Z"))
    );
    assert_eq!(started(&mut c), ["rio"]);
}

#[test]
fn nothing_starts_while_waking_is_stopped() {
    let mut c = core(&["rio"], 1);
    c.request(
        &name("rio"),
        WakeReason::Manual,
        Priority::High,
        t("2026-01-01T00:00:00Z"),
    );
    c.waking_stopped = true;
    assert!(started(&mut c).is_empty());
    c.waking_stopped = false;
    assert_eq!(started(&mut c), ["rio"]);
}

/// After an operator's stop, the messages the session returned wake
/// nothing by themselves; a new message, a schedule or a manual wake does,
/// and any session that starts ends the mute. Table: the steps after the
/// stopped session ended with 2 messages waiting, and whether a session
/// can start once the debounce is over.
#[test]
fn messages_returned_by_a_stopped_session_wait_for_the_next_wake() {
    enum Step {
        Scan(usize),
        Wake(WakeReason),
    }
    use Step::*;
    let table: &[(&str, &[Step], bool)] = &[
        (
            "the returned messages, scanned again",
            &[Scan(2), Scan(2)],
            false,
        ),
        ("one of them taken away by hand", &[Scan(1)], false),
        ("a new message after the stop", &[Scan(3)], true),
        (
            "a new message after one was taken away",
            &[Scan(1), Scan(2)],
            true,
        ),
        ("the schedule", &[Scan(2), Wake(WakeReason::Schedule)], true),
        ("agent-state wake", &[Wake(WakeReason::Manual)], true),
    ];
    for (what, steps, starts) in table {
        let mut c = Core::new(2);
        let rio = name("rio");
        c.slot_or_insert(&rio, || {
            AgentSlot::new(WakeOnInbox::Any, Duration::from_secs(1))
        });
        let t0 = t("2026-01-01T00:00:00Z");
        c.request(&rio, WakeReason::Inbox, Priority::Normal, t0);
        assert_eq!(started(&mut c), ["rio"]);
        c.session_started(&rio, "S1");
        c.stop_requested(&rio);
        // A wake skipped while it was being stopped is no follow-up.
        assert!(
            c.request(&rio, WakeReason::Inbox, Priority::Normal, t0)
                .is_some()
        );
        c.inbox_scanned(&rio, InboxSummary { high: 0, normal: 2 }, t0);
        c.session_ended(&rio, InboxSummary { high: 0, normal: 2 }, t0);
        c.check_indexes();
        for step in *steps {
            match step {
                Scan(n) => c.inbox_scanned(
                    &rio,
                    InboxSummary {
                        high: 0,
                        normal: *n,
                    },
                    t0,
                ),
                Wake(reason) => {
                    c.request(&rio, *reason, Priority::Normal, t0);
                }
            }
        }
        let later = t("2026-01-01T00:00:05Z");
        c.fire_due_inbox(later);
        let next: Vec<String> = c
            .take_startable(later)
            .into_iter()
            .map(|(n, _)| n.to_string())
            .collect();
        c.check_indexes();
        assert_eq!(!next.is_empty(), *starts, "{what}");
        if *starts {
            // The session that starts ends the mute: the next end is as usual.
            c.session_started(&rio, "S2");
            c.session_ended(&rio, InboxSummary::default(), later);
            c.inbox_scanned(&rio, InboxSummary { high: 0, normal: 1 }, later);
            assert!(
                c.slot(&rio).unwrap().inbox_due.is_some(),
                "{what}: muted still"
            );
        }
    }
}
