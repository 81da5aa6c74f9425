//! Pre-opened network, UTS and IPC namespaces for daemonless runs.
//!
//! Making a network namespace costs about a millisecond (and the IPC one a
//! third of that), which a daemonless `mayfly run` would otherwise pay on
//! its critical path. A *spare* is a set of these three namespaces, freshly
//! made by a process that then exits (a run's reaper, after its cleanup),
//! kept alive by bind mounts of their `nsfs` files onto
//! `<dir>/<name>.{uts,ipc,net}`, the way `ip netns add` keeps one. A later
//! run's stub claims one and joins it instead of making its own.
//!
//! A spare is used once: the claim is the lazy unmount of its `.net` file,
//! which only one claimer can do; the claimer then drops the other two mounts
//! and all three files, so no other process can ever join those namespaces,
//! and they end with the sandbox that joined them. The `.net` mount is made
//! last, so a `.net` file that is an `nsfs` mount names a complete spare.
//! The namespaces belong to the host's user namespace, as a stub's own
//! would: root inside a sandbox cannot reconfigure them.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::{cstr, last_errno};

/// The kinds a spare holds, in the order they are bound; `net` is last.
const KINDS: [(&str, libc::c_int); 3] = [
    ("uts", libc::CLONE_NEWUTS),
    ("ipc", libc::CLONE_NEWIPC),
    ("net", libc::CLONE_NEWNET),
];

/// `NSFS_MAGIC`, the filesystem of `/proc/<pid>/ns/*`.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// A spare-namespace operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum SpareNsError {
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Mount(#[from] crate::mount::MountError),
}

fn io_err(op: &'static str, path: &Path, source: std::io::Error) -> SpareNsError {
    SpareNsError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// The `.net` files in `dir`: one per spare, complete, being made, or left
/// unmounted by a reboot.
fn net_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "net"))
        .collect()
}

/// How many complete spares `dir` holds: `.net` files that are `nsfs`
/// mounts (a file a reboot unmounted is not one).
pub fn count(dir: &Path) -> usize {
    net_files(dir)
        .iter()
        .filter(|f| open_nsfs(f).is_some())
        .count()
}

/// Makes a spare named `name` in `dir` (root-only, created if missing): the
/// calling process moves into new UTS, IPC and network namespaces, brings
/// `lo` up, and binds each namespace onto its file. The caller must be
/// single-threaded and should exit soon after; nothing it does afterwards
/// may run in those namespaces.
pub fn make(dir: &Path, name: &str) -> Result<(), SpareNsError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_err("creating", dir, e))?;
    // Held while the set is made: a maker killed halfway leaves its lock
    // free, and [`sweep`] takes its part-made set down.
    let lock_path = dir.join(format!("{name}.lock"));
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| io_err("creating", &lock_path, e))?;
    lock.try_lock()
        .map_err(|e| io_err("locking", &lock_path, std::io::Error::other(e)))?;
    let made = make_locked(dir, name);
    // Removed while still held, so a sweeper that gets the lock next finds
    // the path gone and leaves the (complete) set alone.
    let _ = std::fs::remove_file(&lock_path);
    drop(lock);
    made
}

fn make_locked(dir: &Path, name: &str) -> Result<(), SpareNsError> {
    let flags = KINDS.iter().fold(0, |f, (_, k)| f | k);
    // SAFETY: plain syscall with integer flags.
    if unsafe { libc::unshare(flags) } < 0 {
        return Err(io_err("unshare for", dir, last_errno()));
    }
    crate::net::loopback_up().map_err(|e| io_err("bringing lo up for", dir, e.source))?;
    let bind_all = || {
        for (kind, _) in KINDS {
            let file = dir.join(format!("{name}.{kind}"));
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .map_err(|e| io_err("creating", &file, e))?;
            let source = format!("/proc/thread-self/ns/{kind}");
            crate::mount::mount(Some(&source), &file, None, libc::MS_BIND, None)?;
        }
        Ok(())
    };
    let made = bind_all();
    // A set left half made would keep its first namespaces mounted, and no
    // claim (which looks at `.net` mounts) would ever take it back.
    if made.is_err() {
        remove(dir, name);
    }
    made
}

/// Opens `file` if it is an `nsfs` mount (never following a link).
fn open_nsfs(file: &Path) -> Option<OwnedFd> {
    let c = cstr(file).ok()?;
    // SAFETY: a valid C string; the result is checked.
    // No symlink is followed: a spare is a mount of an nsfs file, never a
    // link to one (such as the host's own `/proc/1/ns/net`).
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and is owned here alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: statfs is plain old data, filled in by the kernel.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a valid out-pointer.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } < 0 || st.f_type as i64 != NSFS_MAGIC {
        return None;
    }
    Some(fd)
}

/// Opens `file` if it is an `nsfs` mount, unmounts it (lazily: the open
/// descriptor keeps the namespace) and removes it. None if it is not, or if
/// another process unmounted it first.
fn take(file: &Path) -> Option<OwnedFd> {
    let fd = open_nsfs(file)?;
    let c = cstr(file).ok()?;
    // SAFETY: a valid C string; MNT_DETACH unmounts even while `fd` holds it.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } < 0 {
        return None;
    }
    let _ = std::fs::remove_file(file);
    Some(fd)
}

/// Whether `fd` is the namespace of `kind` this process is in now.
fn is_current(fd: &OwnedFd, kind: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(mine) = std::fs::metadata(format!("/proc/thread-self/ns/{kind}")) else {
        return true;
    };
    // SAFETY: stat is plain old data, filled in by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return true;
    }
    st.st_ino == mine.ino() && st.st_dev == mine.dev()
}

/// Claims a spare from `dir`, if there is one, and moves the calling
/// (single-threaded) process into its namespaces. Returns the
/// `CLONE_NEW*` flags of the namespaces joined: all three, or none.
pub fn claim(dir: &Path) -> Result<libc::c_int, SpareNsError> {
    for net in net_files(dir) {
        let Some(net_fd) = take(&net) else { continue };
        // Ours now. The other two were bound before it; if either is
        // missing (someone removed it), the whole spare is dropped.
        let mut fds = Vec::new();
        for (kind, flag) in &KINDS[..2] {
            if let Some(fd) = take(&net.with_extension(kind)) {
                fds.push((fd, *flag));
            }
        }
        if fds.len() != 2 {
            continue;
        }
        fds.push((net_fd, libc::CLONE_NEWNET));
        // A namespace this process is already in (the host's) is no spare:
        // joining it would leave the sandbox on the host's network.
        if fds
            .iter()
            .zip(KINDS)
            .any(|((fd, _), (kind, _))| is_current(fd, kind))
        {
            continue;
        }
        for (fd, flag) in &fds {
            // SAFETY: a valid namespace descriptor of the kind given.
            if unsafe { libc::setns(fd.as_raw_fd(), *flag) } < 0 {
                return Err(io_err("joining", &net, last_errno()));
            }
        }
        return Ok(KINDS.iter().fold(0, |f, (_, k)| f | k));
    }
    Ok(0)
}

/// Unmounts and removes the set `name` in `dir` (a reaper whose run ended
/// before a `mayfly prune` takes back the set it has just made).
pub fn remove(dir: &Path, name: &str) {
    for (kind, _) in KINDS {
        let file = dir.join(format!("{name}.{kind}"));
        drop(take(&file));
        let _ = std::fs::remove_file(&file);
    }
}

/// Takes down what makers and claimers killed halfway left in `dir`: sets
/// whose maker's lock is free (it died before it finished), and
/// `.uts`/`.ipc` mounts with neither a `.net` file nor a lock (their
/// claimer died between its unmounts). Without this, such mounts (and the
/// namespaces they hold) would last until `mayfly prune`. Complete spares,
/// and sets whose maker is still at work, are left alone; a claimer that
/// loses a part to this sweep drops that set and takes another.
pub fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    let has = |p: &Path| files.iter().any(|f| f == p);
    for file in &files {
        let Some(ext) = file.extension().and_then(|x| x.to_str()) else {
            continue;
        };
        match ext {
            "lock" if maker_died(file) => {
                if let Some(name) = file.file_stem().and_then(|n| n.to_str()) {
                    remove(dir, name);
                }
                let _ = std::fs::remove_file(file);
            }
            "uts" | "ipc"
                if !has(&file.with_extension("net")) && !has(&file.with_extension("lock")) =>
            {
                drop(take(file));
                let _ = std::fs::remove_file(file);
            }
            _ => {}
        }
    }
}

/// Whether the maker behind lock file `path` has died: its lock is free
/// and the path is still the file locked (a maker that finished removes
/// the path before it lets the lock go).
fn maker_died(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    else {
        return false;
    };
    if file.try_lock().is_err() {
        return false;
    }
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(held), Ok(now)) => held.ino() == now.ino() && held.dev() == now.dev(),
        _ => false,
    }
}

/// Unmounts and removes everything in `dir`, complete spares and parts of
/// ones whose maker died; for tests and for tearing a host's spares down.
pub fn drain(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for file in entries.flatten().map(|e| e.path()) {
        drop(take(&file));
        let _ = std::fs::remove_file(&file);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn ns_inode(path: &str) -> u64 {
        std::fs::metadata(path).unwrap().ino()
    }

    /// A root-only test's directory. Whatever happens, no mount outlives
    /// the test: it is drained when dropped.
    struct Scratch(tempfile::TempDir);

    impl Scratch {
        fn new() -> Self {
            // SAFETY: a plain getter.
            if unsafe { libc::geteuid() } != 0 {
                panic!("this test makes namespaces and bind mounts: run it as root");
            }
            Self(tempfile::tempdir().unwrap())
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            drain(self.0.path());
        }
    }

    /// Namespaces are per thread: each step runs on a thread of its own,
    /// so the test process's own namespaces never change.
    fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().unwrap()
    }

    #[test]
    fn a_spare_is_joined_once_and_links_to_other_namespaces_are_refused() {
        let scratch = Scratch::new();
        let d = scratch.0.path().to_owned();
        // Links to the host's own namespaces are not spares.
        for kind in ["uts", "ipc", "net"] {
            std::os::unix::fs::symlink(
                format!("/proc/1/ns/{kind}"),
                d.join(format!("evil.{kind}")),
            )
            .unwrap();
        }
        let host_net = ns_inode("/proc/self/ns/net");
        let d2 = d.clone();
        let (joined, net) = on_thread(move || {
            let joined = claim(&d2).unwrap();
            (joined, ns_inode("/proc/thread-self/ns/net"))
        });
        assert_eq!((joined, net), (0, host_net));
        for kind in ["uts", "ipc", "net"] {
            std::fs::remove_file(d.join(format!("evil.{kind}"))).unwrap();
        }
        // Nor are mounts of the namespaces the claimer is already in.
        for kind in ["uts", "ipc", "net"] {
            let file = d.join(format!("host.{kind}"));
            std::fs::write(&file, "").unwrap();
            let src = format!("/proc/thread-self/ns/{kind}");
            crate::mount::mount(Some(&src), &file, None, libc::MS_BIND, None)
                .unwrap_or_else(|e| panic!("binding {kind}: {e}"));
        }
        let d2 = d.clone();
        let (joined, net) =
            on_thread(move || (claim(&d2).unwrap(), ns_inode("/proc/thread-self/ns/net")));
        assert_eq!((joined, net), (0, host_net));
        drain(&d);
        // A spare, made on one thread, joined on another.
        let d2 = d.clone();
        on_thread(move || make(&d2, "spare-test").unwrap());
        assert_eq!(count(&d), 1);
        let spare_net = ns_inode(d.join("spare-test.net").to_str().unwrap());
        assert_ne!(spare_net, host_net);
        let d2 = d.clone();
        let (joined, net) = on_thread(move || {
            let joined = claim(&d2).unwrap();
            (joined, ns_inode("/proc/thread-self/ns/net"))
        });
        assert_eq!(
            joined,
            libc::CLONE_NEWNET | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC
        );
        assert_eq!(net, spare_net);
        // Used once: nothing is left to claim.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        let d2 = d.clone();
        assert_eq!(on_thread(move || claim(&d2).unwrap()), 0);
    }

    /// Binds this thread's namespace of `kind` onto `dir/file`.
    fn bind(d: &Path, file: &str, kind: &str) {
        let file = d.join(file);
        std::fs::write(&file, "").unwrap();
        let src = format!("/proc/thread-self/ns/{kind}");
        crate::mount::mount(Some(&src), &file, None, libc::MS_BIND, None)
            .unwrap_or_else(|e| panic!("binding {kind}: {e}"));
    }

    fn mounts_under(d: &Path) -> Vec<String> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        mounts
            .lines()
            .filter(|l| l.contains(d.to_str().unwrap()))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_sweep_takes_down_what_killed_makers_and_claimers_left_and_nothing_else() {
        let scratch = Scratch::new();
        let d = scratch.0.path().to_owned();
        // A complete spare.
        let d2 = d.clone();
        on_thread(move || make(&d2, "whole").unwrap());
        // A maker killed after its first mount: its lock is free.
        std::fs::write(d.join("dead.lock"), "").unwrap();
        bind(&d, "dead.uts", "uts");
        // A claimer killed between its unmounts: `.uts` and `.ipc` left,
        // with no `.net` and no lock.
        bind(&d, "orphan.uts", "uts");
        bind(&d, "orphan.ipc", "ipc");
        // A maker still at work: it holds its lock.
        let busy = std::fs::File::create(d.join("busy.lock")).unwrap();
        busy.try_lock().unwrap();
        bind(&d, "busy.uts", "uts");

        sweep(&d);
        let mut left: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "busy.lock",
                "busy.uts",
                "whole.ipc",
                "whole.net",
                "whole.uts"
            ]
        );
        assert_eq!(mounts_under(&d).len(), 4, "{:?}", mounts_under(&d));
        assert_eq!(count(&d), 1);
        // The busy maker dies (its lock is let go, its file stays).
        drop(busy);
        sweep(&d);
        assert!(!d.join("busy.uts").exists() && !d.join("busy.lock").exists());
        assert_eq!(mounts_under(&d).len(), 3, "{:?}", mounts_under(&d));
        assert_eq!(count(&d), 1);
    }

    #[test]
    fn a_set_that_cannot_be_made_whole_leaves_no_mount() {
        let scratch = Scratch::new();
        let d = scratch.0.path().to_owned();
        // The `.ipc` file is taken, so the set fails after its `.uts` mount.
        std::fs::write(d.join("half.ipc"), "").unwrap();
        let d2 = d.clone();
        assert!(on_thread(move || make(&d2, "half")).is_err());
        let left = mounts_under(&d);
        assert!(left.is_empty(), "mounts left: {left:?}");
        assert!(!d.join("half.uts").exists());
        assert_eq!(count(&d), 0);
    }
}
