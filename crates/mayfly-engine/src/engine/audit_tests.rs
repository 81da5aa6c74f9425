//! What the audit trail keeps of a command.

use super::*;

#[test]
fn a_short_argv_is_recorded_whole() {
    let argv = vec!["sh".to_owned(), "-c".to_owned(), "echo hi".to_owned()];
    assert_eq!(audit_argv(&argv, AUDIT_TEXT_BYTES), argv);
}

#[test]
fn a_long_argv_is_cut_at_the_budget_and_says_how_much_went() {
    // 128 KiB in one element of two-byte characters, after a short one.
    let big = "é".repeat(64 * 1024);
    let argv = vec!["echo".to_owned(), big.clone()];
    let kept = audit_argv(&argv, AUDIT_TEXT_BYTES);
    assert_eq!(kept.len(), 3, "{:?}", &kept[2]);
    assert_eq!(kept[0], "echo");
    assert!(big.starts_with(&kept[1]));
    let stored: usize = kept[..2].iter().map(String::len).sum();
    assert!((AUDIT_TEXT_BYTES - 1..=AUDIT_TEXT_BYTES).contains(&stored));
    let total = 4 + big.len();
    assert_eq!(
        kept[2],
        format!(
            "[mayfly: {} more bytes of argv not recorded]",
            total - stored
        )
    );
    // Many small elements: those that fit, then the note.
    let many: Vec<String> = (0..10_000).map(|i| format!("{i:04}")).collect();
    let kept = audit_argv(&many, AUDIT_TEXT_BYTES);
    assert_eq!(kept.len(), AUDIT_TEXT_BYTES / 4 + 1);
    assert!(kept
        .last()
        .unwrap()
        .contains("more bytes of argv not recorded"));
}

#[test]
fn a_long_error_is_cut_and_marked() {
    assert_eq!(audit_text("short".into(), AUDIT_TEXT_BYTES), "short");
    let long = audit_text("x".repeat(100_000), AUDIT_TEXT_BYTES);
    assert!(long.len() < AUDIT_TEXT_BYTES + 64, "{}", long.len());
    assert!(long.ends_with("[mayfly: cut from 100000 bytes]"));
}

#[test]
fn a_lean_row_keeps_a_short_prefix() {
    let argv = vec!["sh".to_owned(), "-c".to_owned(), "x".repeat(1000)];
    let kept = audit_argv(&argv, AUDIT_LEAN_TEXT_BYTES);
    let stored: usize = kept[..kept.len() - 1].iter().map(String::len).sum();
    assert_eq!(stored, AUDIT_LEAN_TEXT_BYTES);
    assert_eq!(
        kept.last().unwrap(),
        &format!(
            "[mayfly: {} more bytes of argv not recorded]",
            1004 - AUDIT_LEAN_TEXT_BYTES
        )
    );
    let e = audit_text("e".repeat(1000), AUDIT_LEAN_TEXT_BYTES);
    assert!(e.starts_with(&"e".repeat(AUDIT_LEAN_TEXT_BYTES)));
    assert!(e.ends_with("[mayfly: cut from 1000 bytes]"));
}
