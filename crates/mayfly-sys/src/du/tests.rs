//! The walk against trees a hostile sandbox could leave in its upper layer.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use super::*;

fn walk(root: &Path) -> DiskUsage {
    disk_usage(root, &WalkLimits::default()).expect("the walk starts")
}

/// Writes `len` bytes of data (not a hole) to `path`.
fn write_data(path: &Path, len: usize) {
    fs::write(path, vec![0x5au8; len]).unwrap();
}

#[test]
fn file_blocks_are_counted_with_every_entry() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(tmp.path().join("d")).unwrap();
    write_data(&tmp.path().join("d/one"), 1 << 20);
    write_data(&tmp.path().join("two"), 64 << 10);
    let u = walk(tmp.path());
    assert_eq!(u.entries, 4, "root, d, d/one, two");
    assert!(u.bytes >= (1 << 20) + (64 << 10), "{u:?}");
    assert!(u.bytes < (2 << 20), "{u:?}");
    assert!(!u.truncated);
}

#[test]
fn a_symlink_to_the_host_root_is_counted_as_a_link_and_never_followed() {
    let tmp = tempfile::tempdir().unwrap();
    symlink("/", tmp.path().join("host")).unwrap();
    symlink("..", tmp.path().join("up")).unwrap();
    symlink("loop", tmp.path().join("loop")).unwrap();
    let u = walk(tmp.path());
    assert_eq!(u.entries, 4, "the root and three links: {u:?}");
    assert!(
        u.bytes < (64 << 10),
        "nothing behind the links is counted: {u:?}"
    );
    assert!(!u.truncated);
}

#[test]
fn a_root_that_is_a_symlink_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(tmp.path().join("real")).unwrap();
    symlink(tmp.path().join("real"), tmp.path().join("link")).unwrap();
    let err = disk_usage(&tmp.path().join("link"), &WalkLimits::default()).unwrap_err();
    // O_DIRECTORY | O_NOFOLLOW on a symlink: ENOTDIR (or ELOOP).
    assert!(
        matches!(
            err,
            DuError::OpenRoot {
                source: Errno::ENOTDIR | Errno::ELOOP,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn hard_links_are_counted_once() {
    let tmp = tempfile::tempdir().unwrap();
    write_data(&tmp.path().join("a"), 256 << 10);
    for n in 0..5 {
        fs::hard_link(tmp.path().join("a"), tmp.path().join(format!("l{n}"))).unwrap();
    }
    let u = walk(tmp.path());
    assert_eq!(u.entries, 7);
    assert!(u.bytes >= 256 << 10 && u.bytes < 512 << 10, "{u:?}");
}

#[test]
fn fifos_are_stat_ed_not_opened() {
    let tmp = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(&tmp.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
    // Opening a FIFO for reading blocks until a writer comes; the walk
    // must finish regardless.
    let u = walk(tmp.path());
    assert_eq!(u.entries, 2);
    assert!(!u.truncated);
}

#[test]
fn a_tree_deeper_than_the_bound_is_cut_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let mut p = tmp.path().to_path_buf();
    for _ in 0..20 {
        p.push("d");
    }
    fs::create_dir_all(&p).unwrap();
    write_data(&p.join("deep"), 4096);
    let limits = WalkLimits {
        max_depth: 5,
        ..WalkLimits::default()
    };
    let u = disk_usage(tmp.path(), &limits).unwrap();
    assert!(u.truncated);
    // The root, the five levels walked, and the sixth, counted but not
    // entered.
    assert_eq!(u.entries, 1 + 5 + 1, "{u:?}");
    let u = walk(tmp.path());
    assert!(!u.truncated);
    assert_eq!(u.entries, 1 + 20 + 1);
}

#[test]
fn more_entries_than_the_bound_are_cut_and_say_so() {
    let tmp = tempfile::tempdir().unwrap();
    for n in 0..50 {
        fs::write(tmp.path().join(format!("f{n}")), b"").unwrap();
    }
    let limits = WalkLimits {
        max_entries: 10,
        ..WalkLimits::default()
    };
    let u = disk_usage(tmp.path(), &limits).unwrap();
    assert!(u.truncated);
    assert_eq!(u.entries, 10);
}

#[test]
fn a_walk_past_its_time_is_cut_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    for n in 0..600 {
        fs::write(tmp.path().join(format!("f{n}")), b"").unwrap();
    }
    let limits = WalkLimits {
        max_time: Duration::ZERO,
        ..WalkLimits::default()
    };
    let u = disk_usage(tmp.path(), &limits).unwrap();
    assert!(u.truncated);
    assert!(u.entries < 601, "{u:?}");
}

#[test]
fn names_waiting_on_every_level_count_against_the_entry_bound() {
    // Four levels, each directory two subdirectories and 600 files: a walk
    // that sized each listing only by what it had counted would hold about
    // a listing per level at once.
    let tmp = tempfile::tempdir().unwrap();
    let mut level = vec![tmp.path().to_path_buf()];
    for _ in 0..4 {
        let mut next = Vec::new();
        for dir in &level {
            for f in 0..600 {
                std::fs::write(dir.join(format!("f{f}")), b"").unwrap();
            }
            for d in 0..2 {
                let sub = dir.join(format!("d{d}"));
                std::fs::create_dir(&sub).unwrap();
                next.push(sub);
            }
        }
        level = next;
    }
    let limits = WalkLimits {
        max_entries: 1000,
        max_depth: 128,
        max_time: Duration::from_secs(10),
    };
    let w = walk_tree(tmp.path(), &limits).unwrap();
    assert!(w.usage.truncated);
    // At most the budget, plus the one extra name per listing that says a
    // listing was cut.
    assert!(
        w.peak_pending <= limits.max_entries + 5,
        "{} names waited at once",
        w.peak_pending
    );
}
