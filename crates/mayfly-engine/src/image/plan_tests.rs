//! Hostile and ordinary layer entries, planned.

use super::*;

fn h(path: &str, kind: EntryType) -> Header<'_> {
    Header {
        path: path.as_bytes(),
        kind,
        link: None,
        size: 0,
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime: Some(7),
    }
}

fn link<'a>(path: &'a str, kind: EntryType, target: &'a str) -> Header<'a> {
    Header {
        link: Some(target.as_bytes()),
        ..h(path, kind)
    }
}

fn refused(p: &mut Planner, header: &Header<'_>) -> &'static str {
    match p.plan(header) {
        Err(PlanError::BadEntry { reason, .. }) => reason,
        other => panic!("{:?} should be refused, got {other:?}", header.path),
    }
}

const ROOT: Owner = Owner { uid: 0, gid: 0 };

#[test]
fn parent_traversal_and_absolute_paths_are_refused() {
    let mut p = Planner::default();
    assert!(refused(&mut p, &h("../x", EntryType::Regular)).contains(".."));
    assert!(refused(&mut p, &h("a/../../x", EntryType::Regular)).contains(".."));
    assert!(refused(&mut p, &h("/etc/passwd", EntryType::Regular)).contains("absolute"));
}

#[test]
fn nothing_is_written_through_an_earlier_symlink() {
    let mut p = Planner::default();
    let steps = p.plan(&link("a", EntryType::Symlink, "/etc")).unwrap();
    // Absolute symlink targets are legal: they resolve inside the sandbox.
    assert_eq!(
        steps,
        vec![Step::Symlink {
            path: "a".into(),
            target: "/etc".into(),
            owner: ROOT,
            mtime: Some(7)
        }]
    );
    assert!(refused(&mut p, &h("a/passwd", EntryType::Regular)).contains("not a directory"));
    assert!(refused(&mut p, &h("a", EntryType::Directory)).contains("into a directory"));
}

#[test]
fn hard_links_only_reach_earlier_files_of_the_layer() {
    let mut p = Planner::default();
    assert!(refused(&mut p, &link("l", EntryType::Link, "missing")).contains("earlier file"));
    assert!(refused(&mut p, &link("l", EntryType::Link, "../etc/shadow")).contains(".."));
    assert!(refused(&mut p, &link("l", EntryType::Link, "/etc/shadow")).contains("absolute"));
    p.plan(&h("d", EntryType::Directory)).unwrap();
    assert!(refused(&mut p, &link("l", EntryType::Link, "d")).contains("earlier file"));
    p.plan(&h("f", EntryType::Regular)).unwrap();
    assert_eq!(
        p.plan(&link("l", EntryType::Link, "./f")).unwrap(),
        vec![Step::HardLink {
            path: "l".into(),
            target: "f".into()
        }]
    );
}

#[test]
fn devices_and_fifos_are_skipped_not_created() {
    let mut p = Planner::default();
    for kind in [EntryType::Char, EntryType::Block, EntryType::Fifo] {
        assert_eq!(p.plan(&h("dev/x", kind)).unwrap(), vec![]);
    }
    assert_eq!(p.skipped, 3);
    assert!(refused(&mut p, &h("s", EntryType::GNUSparse)).contains("sparse"));
}

#[test]
fn owners_above_the_sandbox_range_become_nobody_and_setuid_stays() {
    let mut p = Planner::default();
    let huge = Header {
        uid: 1 << 40,
        gid: 70000,
        mode: 0o4755,
        ..h("bin/su", EntryType::Regular)
    };
    let steps = p.plan(&huge).unwrap();
    assert_eq!(
        steps.last(),
        Some(&Step::File {
            path: "bin/su".into(),
            owner: Owner {
                uid: NOBODY,
                gid: NOBODY
            },
            mode: 0o4755,
            mtime: Some(7)
        })
    );
    let kept = Header {
        uid: 65535,
        gid: 1000,
        ..h("f", EntryType::Regular)
    };
    assert!(matches!(
        p.plan(&kept).unwrap()[..],
        [Step::File {
            owner: Owner {
                uid: 65535,
                gid: 1000
            },
            ..
        }]
    ));
}

#[test]
fn whiteouts_become_overlay_whiteouts_and_opaque_marks() {
    let mut p = Planner::default();
    assert_eq!(
        p.plan(&h("etc/.wh.motd", EntryType::Regular)).unwrap(),
        vec![
            Step::Dir {
                path: "etc".into(),
                owner: ROOT,
                mode: 0o755,
                mtime: None
            },
            Step::Whiteout {
                path: "etc/motd".into()
            }
        ]
    );
    assert_eq!(
        p.plan(&h("etc/.wh..wh..opq", EntryType::Regular)).unwrap(),
        vec![Step::Opaque { dir: "etc".into() }]
    );
    // AUFS bookkeeping is left out, and a root-level opaque mark is moot.
    assert_eq!(
        p.plan(&h(".wh..wh.plnk/1.2", EntryType::Regular)).unwrap(),
        vec![]
    );
    assert_eq!(
        p.plan(&h(".wh..wh..opq", EntryType::Regular)).unwrap(),
        vec![]
    );
}

#[test]
fn a_whiteout_never_hides_its_own_layer_and_may_be_replaced_later() {
    let mut p = Planner::default();
    p.plan(&h("keep", EntryType::Regular)).unwrap();
    assert_eq!(p.plan(&h(".wh.keep", EntryType::Regular)).unwrap(), vec![]);
    p.plan(&h(".wh.d", EntryType::Regular)).unwrap();
    assert!(matches!(
        p.plan(&h("d/x", EntryType::Regular)).unwrap()[..],
        [Step::Dir { .. }, Step::File { .. }]
    ));
}

#[test]
fn malformed_whiteouts_are_refused() {
    let mut p = Planner::default();
    assert!(refused(&mut p, &h(".wh...", EntryType::Regular)).contains("no valid name"));
    assert!(refused(&mut p, &h("a/.wh.", EntryType::Regular)).contains("no valid name"));
    assert!(refused(&mut p, &h("a/.wh.../x", EntryType::Regular)).contains("directory"));
    // `.wh.` followed by a slash: the whiteout name would hold a slash.
    assert!(refused(&mut p, &h(".wh.etc/passwd", EntryType::Regular)).contains("directory"));
    assert!(refused(&mut p, &h("../.wh.x", EntryType::Regular)).contains(".."));
}

#[test]
fn entry_and_size_caps_hold() {
    let limits = Limits {
        max_entries: 3,
        max_bytes: 10,
        max_depth: 4,
    };
    let mut p = Planner::new(limits);
    assert_eq!(
        p.plan(&h("a/b/c/d", EntryType::Regular)),
        Err(PlanError::TooManyEntries { limit: 3 })
    );
    let mut p = Planner::new(limits);
    let big = Header {
        size: 11,
        ..h("f", EntryType::Regular)
    };
    assert_eq!(p.plan(&big), Err(PlanError::TooLarge { limit: 10 }));
    let mut p = Planner::new(limits);
    assert!(refused(&mut p, &h("a/b/c/d/e", EntryType::Regular)).contains("deeply"));
}
