//! The tests of `events`: cursors and their encoding, the merge order,
//! tolerant reading, the agent filter, and a cursor across rotations.

use super::*;

fn agent(name: &str) -> SourceId {
    SourceId::Agent(AgentName::parse(name).unwrap())
}

#[test]
fn cursors_round_trip_and_are_shell_safe() {
    let mut c = Cursor::start();
    assert_eq!(Cursor::parse(&c.encode()).unwrap(), c);
    c.set(&agent("rio"), 1234);
    c.set(&agent("theseus"), 7);
    c.set(&SourceId::Daemon(DaemonLog::Errors), 99);
    c.set(&agent("leo"), 0);
    let token = c.encode();
    assert!(token.starts_with("v1."));
    assert!(
        token[3..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{token}"
    );
    let back = Cursor::parse(&token).unwrap();
    assert_eq!(back, c);
    assert_eq!(back.offset(&agent("rio")), 1234);
    assert_eq!(back.offset(&agent("leo")), 0);
    assert_eq!(back.offset(&SourceId::Daemon(DaemonLog::Signals)), 0);
    assert_eq!(c.payload(), "rio:1234,theseus:7,.errors:99");
}

#[test]
fn bad_cursors_say_what_is_wrong() {
    let mut c = Cursor::start();
    c.set(&agent("rio"), 1234);
    c.set(&agent("theseus"), 77);
    let good = c.encode();
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "empty"),
        ("12345".into(), "start with `v1.`"),
        (format!("{}$x", &good), "contains `$`"),
        (good[..good.len() - 1].to_string(), "truncated"),
        (good[..good.len() - 4].to_string(), "truncated"),
        ("v1.AA".into(), "too short"),
    ];
    for (token, expected) in cases {
        let err = Cursor::parse(&token).expect_err(&token).to_string();
        assert!(err.contains(expected), "{token:?}: {err}");
    }
    // A flipped character.
    let mut flipped = good.clone().into_bytes();
    let i = flipped.len() / 2;
    flipped[i] = if flipped[i] == b'A' { b'B' } else { b'A' };
    let err = Cursor::parse(&String::from_utf8(flipped).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("damaged"), "{err}");
    // Well-formed tokens with a bad payload.
    for (payload, expected) in [
        ("rio", "without an offset"),
        ("rio:x", "not a number"),
        ("rio:-1", "not a number"),
        ("Rio:1", "invalid source"),
        (".secrets:1", "not a daemon log"),
        ("rio:1,rio:2", "twice"),
        ("rio:99999999999999999999999", "too large"),
    ] {
        let mut bytes = payload.as_bytes().to_vec();
        bytes.extend_from_slice(&fnv1a(payload.as_bytes()).to_be_bytes());
        let token = format!("v1.{}", base64url_encode(&bytes));
        let err = Cursor::parse(&token).expect_err(payload).to_string();
        assert!(err.contains(expected), "{payload}: {err}");
    }
}

#[test]
fn base64url_matches_the_rfc_vectors() {
    for (plain, coded) in [
        ("", ""),
        ("f", "Zg"),
        ("fo", "Zm8"),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg"),
        ("fooba", "Zm9vYmE"),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64url_encode(plain.as_bytes()), coded);
        assert_eq!(base64url_decode(coded).unwrap(), plain.as_bytes());
    }
    assert_eq!(base64url_encode(&[0xfb, 0xff]), "-_8");
    assert!(base64url_decode("Zh").is_err(), "non-zero unused bits");
}

fn ev(source: &SourceId, ts: &str, offset: u64) -> StreamEvent {
    StreamEvent {
        source: source.clone(),
        kind: "record".into(),
        ts: DateTime::parse_from_rfc3339(ts)
            .unwrap()
            .with_timezone(&Utc),
        ts_text: ts.into(),
        event: Value::Null,
        offset,
        end: offset + 10,
    }
}

#[test]
fn merge_orders_by_time_but_never_reorders_a_source() {
    let rio = agent("rio");
    let leo = agent("leo");
    let errors = SourceId::Daemon(DaemonLog::Errors);
    let merged = merge(vec![
        vec![
            ev(&leo, "2026-01-01T00:00:02Z", 0),
            ev(&leo, "2026-01-01T00:00:04Z", 10),
        ],
        vec![
            ev(&rio, "2026-01-01T00:00:01Z", 0),
            // Out of order within rio: stays after rio's earlier line.
            ev(&rio, "2026-01-01T00:00:03Z", 10),
            ev(&rio, "2026-01-01T00:00:02.5Z", 20),
        ],
        vec![ev(&errors, "2026-01-01T00:00:02Z", 0)],
    ]);
    let got: Vec<(String, u64)> = merged
        .iter()
        .map(|e| (e.source.key().to_string(), e.offset))
        .collect();
    let want = [
        ("rio", 0),
        ("leo", 0), // same second as .errors: agents before the daemon
        (".errors", 0),
        ("rio", 10),
        ("rio", 20),
        ("leo", 10),
    ];
    let want: Vec<(String, u64)> = want.iter().map(|(k, o)| (k.to_string(), *o)).collect();
    assert_eq!(got, want);
    // Each cursor covers exactly what came before it.
    let batch = Batch {
        events: merged,
        ..Batch::default()
    };
    let cursors: Vec<Cursor> = batch.cursors().map(|(_, c)| c).collect();
    assert_eq!(cursors[3].offset(&rio), 20);
    assert_eq!(cursors[3].offset(&leo), 10);
    assert_eq!(cursors[3].offset(&errors), 10);
}

#[test]
fn reading_skips_what_does_not_parse_and_leaves_partial_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.jsonl");
    let rio = agent("rio");
    let lines = [
        "not json\n",
        "{\"ts\":\"2026-01-01T00:00:00Z\",\"event\":\"a\"}\n",
        "{\"ts\":\"yesterday\",\"event\":\"b\"}\n",
        "\n",
        "{\"ts\":\"2026-01-01T00:00:01Z\",\"event\":\"c\"}\n",
        "{\"ts\":\"2026-01-01T00:00:02Z\",\"eve",
    ];
    std::fs::write(&path, lines.concat()).unwrap();
    let all = |_: &Value| true;
    let read = read_source(&path, &rio, 0, &all).unwrap();
    let kinds: Vec<&str> = read.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["a", "c"]);
    assert_eq!(read.base, lines[0].len() as u64);
    assert_eq!(read.events[0].end, lines[..4].concat().len() as u64);
    let whole = lines[..5].concat().len() as u64;
    assert_eq!(read.end, whole);
    assert!(read.restarted.is_none());
    // The partial line is read once it is whole.
    std::fs::write(&path, format!("{}nt\":\"d\"}}\n", lines.concat())).unwrap();
    let read = read_source(&path, &rio, whole, &all).unwrap();
    assert_eq!(read.events.len(), 1);
    assert_eq!(read.events[0].kind, "d");
    // Truncated: from the start again.
    std::fs::write(&path, lines[1]).unwrap();
    let read = read_source(&path, &rio, whole, &all).unwrap();
    assert!(read.restarted.unwrap().contains("shorter"));
    assert_eq!(read.events.len(), 1);
    // Rewritten so that the offset falls inside a line.
    std::fs::write(&path, lines[1..].concat().replace("\"c\"", "\"cc\"")).unwrap();
    let read = read_source(&path, &rio, lines[1].len() as u64 + 5, &all).unwrap();
    assert!(read.restarted.unwrap().contains("line ending"));
    // Missing: nothing, offset kept.
    let read = read_source(&dir.path().join("missing"), &rio, 42, &all).unwrap();
    assert_eq!((read.base, read.end), (42, 42));
}

#[test]
fn summaries_are_one_line() {
    let rio = agent("rio");
    let v: Value = serde_json::from_str(
        r#"{"ts":"x","event":"task_added","task_id":"task-001","type":"research","description":"a\nb","priority":"high"}"#,
    )
    .unwrap();
    assert_eq!(summary(&rio, "task_added", &v), "task-001 high a b");
    let v: Value = serde_json::from_str(
        r#"{"ts":"x","event":"orient_complete","files_read":["a","b"],"n":3,"o":{}}"#,
    )
    .unwrap();
    assert_eq!(summary(&rio, "orient_complete", &v), "files_read=a,b n=3");
    let v: Value = serde_json::from_str(
        r#"{"ts":"x","code":"SESSION_FAILED","message":"boom","context":{"agent":"rio","attempt":2}}"#,
    )
    .unwrap();
    assert_eq!(
        summary(&SourceId::Daemon(DaemonLog::Errors), "error", &v),
        "SESSION_FAILED boom [rio attempt 2]"
    );
    let v: Value = serde_json::from_str(
        r#"{"ts":"x","level":"warn","code":"SIGNAL_UNKNOWN_TYPE","agent":"rio-003","raw":"<axiom>FOO</axiom>","session":"s1"}"#,
    )
    .unwrap();
    assert_eq!(
        summary(&SourceId::Daemon(DaemonLog::Signals), "signal", &v),
        "SIGNAL_UNKNOWN_TYPE <axiom>FOO</axiom> [rio-003 s1]"
    );
    let long = Value::String("x".repeat(500));
    let v = serde_json::json!({"ts": "x", "event": "session_end", "session_id": "s", "outcome": "completed", "summary": long});
    assert_eq!(
        summary(&rio, "session_end", &v).chars().count(),
        SUMMARY_MAX
    );
}

#[test]
fn daemon_records_follow_the_agent_filter() {
    let rio = AgentName::parse("rio").unwrap();
    let about = |a: &str| serde_json::json!({"context": {"agent": a}});
    assert!(concerns(&about("rio"), &rio));
    assert!(!concerns(&about("leo"), &rio));
    assert!(concerns(&serde_json::json!({"context": {}}), &rio));
    assert!(concerns(&serde_json::json!({"code": "DISK_LOW"}), &rio));
    // signals.jsonl names the agent, or its instance.
    assert!(concerns(&serde_json::json!({"agent": "rio"}), &rio));
    assert!(concerns(&serde_json::json!({"agent": "rio-047"}), &rio));
    assert!(!concerns(&serde_json::json!({"agent": "rio-x"}), &rio));
    assert!(!concerns(&serde_json::json!({"agent": "rio-"}), &rio));
    assert!(!concerns(&serde_json::json!({"agent": "leo-001"}), &rio));
}

#[test]
fn what_wakes_a_follower() {
    use notify::EventKind;
    use notify::event::{
        AccessKind, AccessMode, CreateKind, DataChange, Event, MetadataKind, ModifyKind,
    };
    let root = Path::new("/s");
    let on = |kind: EventKind, path: &str| {
        classify(root, Ok(Event::new(kind).add_path(PathBuf::from(path))))
    };
    let data = EventKind::Modify(ModifyKind::Data(DataChange::Any));
    assert_eq!(
        on(data, "/s/rio/journal.jsonl"),
        [Change::Source(agent("rio"))]
    );
    assert_eq!(
        on(data, "/s/.daemon/errors.jsonl"),
        [Change::Source(SourceId::Daemon(DaemonLog::Errors))]
    );
    assert_eq!(
        on(EventKind::Create(CreateKind::Folder), "/s/clay"),
        [Change::NewDir(PathBuf::from("/s/clay"))]
    );
    assert_eq!(
        on(EventKind::Create(CreateKind::Folder), "/s/.daemon"),
        [Change::NewDir(PathBuf::from("/s/.daemon"))]
    );
    // Our own opens, reads, other files, hidden dirs: nothing.
    assert!(
        on(
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            "/s/rio/journal.jsonl"
        )
        .is_empty()
    );
    assert!(
        on(
            EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)),
            "/s/rio/journal.jsonl"
        )
        .is_empty()
    );
    assert!(on(data, "/s/rio/report.json").is_empty());
    assert!(on(data, "/s/.daemon/daemon.json").is_empty());
    assert!(on(EventKind::Create(CreateKind::Folder), "/s/.shared").is_empty());
    assert!(on(data, "/s/rio/inbox/journal.jsonl").is_empty());
    assert_eq!(
        classify(root, Err(notify::Error::generic("boom"))),
        [Change::Rescan]
    );
}

#[test]
fn a_cursor_survives_rotations_and_a_pruned_past_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let root = StateRoot::new(dir.path());
    let rio = AgentName::parse("rio").unwrap();
    std::fs::create_dir_all(dir.path().join("rio")).unwrap();
    let journal = dir.path().join("rio/journal.jsonl");
    let line = |n: u32| format!("{{\"ts\":\"2026-03-01T10:00:{n:02}Z\",\"event\":\"e{n}\"}}\n");
    let ts = crate::clock::Timestamp::parse("2026-03-01T11:00:00Z").unwrap();
    let read_from = |cursor: Cursor| {
        let mut r = Reader::new(root.clone(), cursor, Some(rio.clone()));
        let batch = r.read(None).unwrap();
        let kinds: Vec<String> = batch
            .events
            .iter()
            .filter(|e| e.source == SourceId::Agent(rio.clone()))
            .map(|e| e.kind.clone())
            .collect();
        (
            kinds,
            batch.cursors().map(|(_, c)| c).collect::<Vec<_>>(),
            batch.notes,
        )
    };
    // Three segments and a live file: e0..e2 | marker e3..e5 | ...
    let mut all = vec![];
    for n in 0..9 {
        crate::state::journal::append_lines(
            &crate::state::Store::default(),
            &journal,
            line(n).as_bytes(),
        )
        .unwrap();
        all.push(format!("e{n}"));
        if n % 3 == 2 {
            crate::state::rotation::rotate_if_over(
                &crate::state::Store::default(),
                &journal,
                1,
                ts,
            )
            .unwrap();
            all.push("log_rotated".into());
        }
    }
    let (kinds, cursors, notes) = read_from(Cursor::start());
    assert_eq!(kinds, all);
    assert!(notes.is_empty(), "{notes:?}");
    // After each event, exactly the rest, wherever it now lies.
    for (k, cursor) in cursors.iter().enumerate() {
        let (rest, _, notes) = read_from(cursor.clone());
        assert_eq!(rest, all[k + 1..], "after event {k}");
        assert!(notes.is_empty(), "{notes:?}");
    }
    // Another rotation after a reader's position: nothing lost, nothing
    // repeated.
    let last = cursors.last().unwrap().clone();
    crate::state::journal::append_lines(
        &crate::state::Store::default(),
        &journal,
        line(9).as_bytes(),
    )
    .unwrap();
    crate::state::rotation::rotate_if_over(&crate::state::Store::default(), &journal, 1, ts)
        .unwrap();
    assert_eq!(read_from(last).0, ["e9", "log_rotated"]);
    // The first segment pruned: a reader placed in it is told, and
    // goes on from the oldest part kept.
    let first = crate::state::rotation::segments(&journal, u64::MAX).unwrap()[0].clone();
    std::fs::remove_file(&first.path).unwrap();
    let (rest, _, notes) = read_from(cursors[0].clone());
    assert_eq!(
        rest,
        all[3..]
            .iter()
            .cloned()
            .chain(["e9".into(), "log_rotated".into()])
            .collect::<Vec<_>>()
    );
    assert!(
        notes.iter().any(|n| n.contains("removed by retention")),
        "{notes:?}"
    );
}
