use mayfly_types::{ExecAudit, SandboxState};
use serde_json::json;

use super::{clocked_store, id, record};
use crate::{Store, StoreError};

#[test]
fn exec_audit_round_trips_argv_with_odd_bytes_and_unicode() {
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&record(id(1), 1), 8).unwrap();
    let argv: Vec<String> = [
        "",
        "nul\0inside",
        "\u{1b}[31mred\u{1b}[0m",
        "tab\tnew\nline\r",
        "quote\"back\\slash'",
        "日本語",
        "🦀 crab",
        "\u{202e}rtl override",
        "\u{fffd}\u{feff}\u{7f}",
        "%s %n $(rm -rf /) `id`",
        "'; DROP TABLE execs; --",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain(["x".repeat(100_000), (1..0x80u8).map(char::from).collect()])
    .collect();
    let first = ExecAudit {
        sandbox_id: id(1).to_string(),
        at: 1_700_000_000_123,
        argv,
        exit_code: None,
        signal: Some(9),
        timed_out: true,
        error: None,
        duration_us: u64::from(u32::MAX) * 4,
        stdout_bytes: 1 << 40,
        stderr_bytes: 0,
        caller: "unix:uid=1000".to_owned(),
        kind: None,
        output: None,
    };
    let second = ExecAudit {
        argv: vec!["/no/such/binary".to_owned()],
        exit_code: None,
        signal: None,
        timed_out: false,
        error: Some("no such file: `/no/such/binary`".to_owned()),
        caller: "tcp:token".to_owned(),
        ..first.clone()
    };
    store.record_exec(&first).unwrap();
    store.record_exec(&second).unwrap();
    assert_eq!(store.execs(&id(1)).unwrap(), [first, second]);
    assert!(store.execs(&id(2)).unwrap().is_empty());
}

#[test]
fn execs_naming_an_invalid_sandbox_id_are_refused() {
    let store = Store::open_in_memory().unwrap();
    let audit = ExecAudit {
        sandbox_id: "../../etc".to_owned(),
        at: 1,
        argv: vec![],
        exit_code: Some(0),
        signal: None,
        timed_out: false,
        error: None,
        duration_us: 0,
        stdout_bytes: 0,
        stderr_bytes: 0,
        caller: "cli:pid=1".to_owned(),
        kind: None,
        output: None,
    };
    let err = store.record_exec(&audit).unwrap_err();
    assert!(matches!(err, StoreError::InvalidId { .. }), "{err:?}");
}

#[test]
fn execs_may_be_recorded_after_the_sandbox_ended() {
    // An exec racing a destroy finishes after it; its audit must not be lost.
    let store = Store::open_in_memory().unwrap();
    store.insert_sandbox(&record(id(1), 1), 8).unwrap();
    store
        .transition(&id(1), SandboxState::Failed, None)
        .unwrap();
    let audit = ExecAudit {
        sandbox_id: id(1).to_string(),
        at: 2,
        argv: vec!["sleep".to_owned(), "1".to_owned()],
        exit_code: None,
        signal: Some(9),
        timed_out: false,
        error: None,
        duration_us: 5,
        stdout_bytes: 0,
        stderr_bytes: 0,
        caller: "cli:pid=1".to_owned(),
        kind: None,
        output: None,
    };
    store.record_exec(&audit).unwrap();
    assert_eq!(store.execs(&id(1)).unwrap(), [audit]);
}

#[test]
fn events_paginate_by_seq_without_gaps_or_repeats() {
    let (store, clock) = clocked_store();
    let mut seqs = Vec::new();
    for n in 0..10u64 {
        clock.set(1000 + n);
        let sandbox = (n % 2 == 0).then(|| id(n));
        seqs.push(
            store
                .add_event(sandbox.as_ref(), "tick", &json!({ "n": n }))
                .unwrap(),
        );
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    let mut seen = Vec::new();
    let mut since = 0;
    loop {
        let page = store.events(since, 3).unwrap();
        assert!(page.len() <= 3);
        let Some(last) = page.last() else { break };
        since = last.seq;
        seen.extend(page);
    }
    assert_eq!(seen.iter().map(|e| e.seq).collect::<Vec<_>>(), seqs);
    for (n, e) in seen.iter().enumerate() {
        assert_eq!(e.at, 1000 + n as u64);
        assert_eq!(e.detail, json!({ "n": n }));
        assert_eq!(e.kind, "tick");
        let expected = (n % 2 == 0).then(|| id(n as u64).to_string());
        assert_eq!(e.sandbox_id, expected);
    }
    assert_eq!(store.events(seqs[4], 2).unwrap().len(), 2);
    assert_eq!(store.events(seqs[4], 2).unwrap()[0].seq, seqs[5]);
    assert!(store.events(seqs[9], 10).unwrap().is_empty());
    assert!(store.events(0, 0).unwrap().is_empty());
    assert_eq!(store.events(-5, 100).unwrap().len(), 10);
}
