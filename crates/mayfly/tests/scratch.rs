//! `serve --scratch DIR`: sandboxes' writable layers, mount points and trash
//! on another filesystem (here a tmpfs), cleaned up like the default ones,
//! and a scratch directory someone else could control is refused; booting
//! copies nothing up into a writable layer.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;

/// A fresh directory on the host's tmpfs, removed when dropped.
struct ShmDir(std::path::PathBuf);

impl ShmDir {
    fn new() -> ShmDir {
        let dir = Path::new("/dev/shm").join(unique("mayfly-scratch-test"));
        assert!(
            Path::new("/dev/shm").is_dir(),
            "these tests need /dev/shm (a tmpfs) on the host"
        );
        ShmDir(dir)
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fs_type(p: &Path) -> String {
    let out = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(p)
        .output()
        .expect("stat -f");
    text(&out.stdout).trim().to_owned()
}

#[tokio::test]
async fn sandboxes_live_in_the_scratch_directory_and_leave_nothing() {
    let shm = ShmDir::new();
    let scratch = shm.0.to_str().expect("a utf-8 path").to_owned();
    let mut d = Daemon::start_with(&["--scratch", &scratch, "--pool", "host=2"]).await;
    let sb = d.create().await;
    d.sh(&sb.id, "echo written > /written-here").await;
    let upper = shm.0.join("sandboxes").join(sb.id.as_str());
    assert!(upper.is_dir(), "{} is missing", upper.display());
    assert_eq!(fs_type(&upper), "tmpfs");
    assert!(
        !d.sandbox_dir(&sb.id).exists(),
        "the sandbox also has a directory in the state directory"
    );
    // Its writes land in the scratch directory, not in the state directory.
    let found = Command::new("grep")
        .args(["-rlx", "written"])
        .arg(&upper)
        .output()
        .expect("grep");
    assert!(
        !text(&found.stdout).trim().is_empty(),
        "the sandbox's write is not under {}",
        upper.display()
    );
    d.client.destroy(&sb.id).await.expect("destroy");
    host::assert_no_leaks(&shm.0, &[sb.id.as_str()]);
    host::assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
    // kill -9 and a restart: the pool's unclaimed sandboxes and a claimed
    // one are reconciled away in the scratch directory too.
    let other = d.create().await;
    let ids: Vec<String> = std::fs::read_dir(shm.0.join("sandboxes"))
        .expect("listing the scratch directory")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(ids.contains(&other.id.to_string()), "{ids:?}");
    d.kill9();
    d.restart().await;
    host::assert_no_leaks(&shm.0, &ids);
    host::assert_no_leaks(&d.state_dir, &ids);
    d.assert_healthy().await;
}

/// Starts a daemon that is expected to refuse its scratch directory, and
/// returns what it printed.
fn refused(scratch: &Path) -> String {
    let dir = test_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_mayfly"))
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["serve", "--pool", "host=0", "--scratch"])
        .arg(scratch)
        .output()
        .expect("running mayfly serve");
    assert!(
        !out.status.success(),
        "the daemon accepted the scratch directory {}",
        scratch.display()
    );
    text(&out.stderr)
}

#[test]
fn a_scratch_directory_someone_else_could_control_is_refused() {
    require_root();
    let shm = ShmDir::new();
    std::fs::create_dir(&shm.0).expect("mkdir");
    // A symlink (for example one another user left in /dev/shm).
    let link = shm.0.join("link");
    std::os::unix::fs::symlink("/etc", &link).expect("symlink");
    let err = refused(&link);
    assert!(err.contains("symlink"), "{err}");
    // Writable by others.
    let open = shm.0.join("open");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let err = refused(&open);
    assert!(err.contains("writable by it alone"), "{err}");
    // Owned by someone else.
    let theirs = shm.0.join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
    let err = refused(&theirs);
    assert!(err.contains("owned by uid 0"), "{err}");
    // Not absolute.
    let err = refused(Path::new("relative/scratch"));
    assert!(err.contains("absolute"), "{err}");
}

/// Every directory a sandbox makes on the writable layers' filesystem is an
/// inode created and freed per sandbox (on these hosts' journal-less ext4,
/// the slowest part of a boot): booting a `host` sandbox copies nothing up.
#[tokio::test]
async fn a_booted_sandbox_has_copied_nothing_up() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let dir = d.sandbox_dir(&sb.id);
    let mut uppers = Vec::new();
    for e in std::fs::read_dir(&dir).expect("the sandbox's directory") {
        let e = e.expect("an entry");
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("upper") {
            let inside: Vec<_> = std::fs::read_dir(e.path())
                .expect("an upper directory")
                .map(|e| e.expect("an entry").file_name())
                .collect();
            assert!(
                inside.is_empty(),
                "booting copied {inside:?} up into {}",
                e.path().display()
            );
            uppers.push(name);
        }
    }
    uppers.sort();
    assert_eq!(uppers, ["upper0", "upper1"], "in {}", dir.display());
    // The secrets tmpfs is mounted on the skeleton's own directory.
    assert_eq!(
        d.sh(&sb.id, "findmnt -no FSTYPE /run/secrets").await,
        "tmpfs\n"
    );
}
