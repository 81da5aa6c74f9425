//! The file API against a hostile sandbox: planted symlinks, `..`, magic
//! links and evil tar entries never reach the host; honest trees round-trip.

mod common;

use std::path::Path;

use common::tarball::{self, raw_tar, read_tree, summary, write_tree, Node, RawEntry};
use common::{host_exists, text, unique, Daemon};
use mayfly_client::ClientError;
use mayfly_types::{ErrorCode, MkdirRequest};

fn host_shadow() -> Vec<u8> {
    std::fs::read("/etc/shadow").unwrap_or_default()
}

fn api_code(r: &Result<impl std::fmt::Debug, ClientError>) -> Option<ErrorCode> {
    r.as_ref().err().and_then(ClientError::code)
}

#[tokio::test]
async fn a_symlink_to_root_resolves_inside_the_sandbox_not_on_the_host() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    d.sh(&sb.id, "ln -s / /workspace/esc").await;

    let name = unique("mayfly-pwned");
    let w = d
        .client
        .write_file(
            &sb.id,
            &format!("/workspace/esc/tmp/{name}"),
            b"pwned".to_vec(),
            None,
        )
        .await;
    assert!(
        !host_exists(format!("/tmp/{name}")),
        "the API wrote /tmp/{name} on the host"
    );
    if w.is_ok() {
        // It may only have landed in the sandbox's own /tmp.
        assert_eq!(d.sh(&sb.id, &format!("cat /tmp/{name}")).await, "pwned");
    }

    let r = d
        .client
        .read_file(&sb.id, "/workspace/esc/etc/shadow")
        .await;
    if let Ok(data) = &r {
        assert_ne!(
            data.to_vec(),
            host_shadow(),
            "the host's /etc/shadow came back"
        );
    }
    assert_eq!(
        api_code(&r),
        Some(ErrorCode::NotFound),
        "the sandbox has no /etc/shadow: {r:?}"
    );
    let passwd = d
        .client
        .read_file(&sb.id, "/workspace/esc/etc/passwd")
        .await
        .expect("read");
    assert_eq!(text(&passwd), d.sh(&sb.id, "cat /etc/passwd").await);
}

#[tokio::test]
async fn proc_magic_links_are_refused_by_the_file_api() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    d.sh(
        &sb.id,
        "ln -s /proc/1/root /workspace/p && ln -s /proc/self/root /workspace/s",
    )
    .await;
    let name = unique("mayfly-pwned");
    for link in [
        "/workspace/p",
        "/workspace/s",
        "/proc/1/root",
        "/proc/self/root",
    ] {
        let r = d
            .client
            .read_file(&sb.id, &format!("{link}/etc/passwd"))
            .await;
        assert!(
            matches!(
                api_code(&r),
                Some(ErrorCode::PermissionDenied | ErrorCode::NotFound)
            ),
            "reading through {link} gave {r:?}"
        );
        let r = d
            .client
            .read_file(&sb.id, &format!("{link}/etc/shadow"))
            .await;
        assert!(r.is_err(), "reading {link}/etc/shadow succeeded");
        let w = d
            .client
            .write_file(&sb.id, &format!("{link}/tmp/{name}"), b"x".to_vec(), None)
            .await;
        assert!(w.is_err(), "writing through {link} succeeded: {w:?}");
        assert!(
            !host_exists(format!("/tmp/{name}")),
            "writing through {link} reached the host"
        );
    }
}

#[tokio::test]
async fn dotdot_paths_are_clamped_at_the_sandbox_root() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let inside = d.sh(&sb.id, "cat /etc/passwd").await;
    assert!(inside.starts_with("root:"), "{inside}");
    let host_users: Vec<String> = std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(':').next().map(|u| format!("\n{u}:")))
        .filter(|u| !inside.contains(u.as_str()))
        .collect();
    for path in [
        "../../../etc/passwd",
        "/workspace/../../../etc/passwd",
        "/../../etc/passwd",
    ] {
        let got = d
            .client
            .read_file(&sb.id, path)
            .await
            .expect("read through ..");
        let got = text(&got);
        assert_eq!(got, inside, "{path} is not the sandbox's /etc/passwd");
        for u in &host_users {
            assert!(!got.contains(u.as_str()), "{path} shows host user {u:?}");
        }
    }
}

/// Every name an evil archive could have created, anywhere.
fn evil_landed(state_dir: &Path, name: &str) -> Vec<String> {
    let mut found: Vec<String> = ["/", "/etc", "/tmp", "/work", "/root"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .filter(|p| host_exists(p))
        .map(|p| p.display().to_string())
        .collect();
    let mut stack = vec![state_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().contains(name) {
                found.push(e.path().display().to_string());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    found
}

#[tokio::test]
async fn evil_tar_entries_are_rejected_and_create_nothing() {
    let mut d = Daemon::start().await;
    let sb = d.create().await;
    let listing = "ls -A /workspace / /etc /tmp";
    let before = d.sh(&sb.id, listing).await;
    let name = unique("evil");
    let file = |p: String| RawEntry::file(&p, b"evil");
    let cases: Vec<(&str, Vec<RawEntry>)> = vec![
        ("a `..` path", vec![file(format!("../{name}"))]),
        (
            "a deep `..` path",
            vec![file(format!("x/../../../../{name}"))],
        ),
        ("an absolute path", vec![file(format!("/etc/{name}"))]),
        (
            "a file through a symlink to /",
            vec![RawEntry::symlink("a", "/"), file(format!("a/etc/{name}"))],
        ),
        (
            "a file through a symlink climbing out",
            vec![
                RawEntry::symlink("up", "../../.."),
                file(format!("up/{name}")),
            ],
        ),
        (
            "a hard link to the host's shadow",
            vec![RawEntry::hardlink(&name, "/etc/shadow")],
        ),
        (
            "a hard link climbing out",
            vec![RawEntry::hardlink(&name, "../../etc/passwd")],
        ),
        ("a character device", vec![RawEntry::device(&name, b'3')]),
        ("a FIFO", vec![RawEntry::device(&name, b'6')]),
    ];
    for (what, entries) in cases {
        let r = d
            .client
            .upload_tar(&sb.id, "/workspace", raw_tar(&entries))
            .await;
        match &r {
            Err(ClientError::Api { status, error }) => {
                assert!((400..500).contains(status), "{what}: {status} {error:?}");
                assert!(!error.message.is_empty());
            }
            other => panic!("{what}: the upload was not refused: {other:?}"),
        }
        let landed = evil_landed(&d.state_dir, &name);
        assert!(landed.is_empty(), "{what} created {landed:?}");
    }
    let after = d.sh(&sb.id, listing).await;
    let added: Vec<&str> = after.lines().filter(|l| !before.contains(l)).collect();
    let removed: Vec<&str> = before.lines().filter(|l| !after.contains(l)).collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "a refused archive changed the sandbox: added {added:?}, removed {removed:?}"
    );
    d.assert_healthy().await;
}

#[tokio::test]
async fn a_tree_round_trips_through_tar_upload_and_download() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let tree = tarball::sample_tree();
    d.client
        .mkdir(
            &sb.id,
            &MkdirRequest {
                path: "/workspace/rt".into(),
                parents: true,
                mode: None,
            },
        )
        .await
        .expect("mkdir");
    let up = d
        .client
        .upload_tar(&sb.id, "/workspace/rt", tarball::tar_of(&tree))
        .await
        .expect("upload");
    let files = tree
        .values()
        .filter(|n| matches!(n, Node::File { .. }))
        .count() as u64;
    let bytes: u64 = tree
        .values()
        .map(|n| match n {
            Node::File { data, .. } => data.len() as u64,
            _ => 0,
        })
        .sum();
    assert_eq!(
        (up.files, up.symlinks, up.bytes),
        (files, 1, bytes),
        "{up:?}"
    );

    // Inside, the tree is what was sent.
    assert_eq!(d.sh(&sb.id, "cat /workspace/rt/hello.txt").await, "hello\n");
    assert_eq!(
        d.sh(&sb.id, "readlink /workspace/rt/link").await,
        "nested/deeper/bin.dat\n"
    );
    assert_eq!(d.sh(&sb.id, "/workspace/rt/run.sh").await, "script ran\n");

    // A directory downloads as one entry named after it, holding the tree
    // (as `docker cp` and `tar -C /workspace -c rt` lay it out).
    let back = d
        .client
        .download_tar(&sb.id, "/workspace/rt")
        .await
        .expect("download");
    let mut got = read_tree(&back);
    assert_eq!(got.remove("rt"), Some(Node::Dir), "{:?}", summary(&got));
    let got: tarball::Tree = got
        .into_iter()
        .map(|(p, n)| match p.strip_prefix("rt/") {
            Some(rel) => (rel.to_owned(), n),
            None => panic!("entry {p} is outside rt/"),
        })
        .collect();
    assert_eq!(
        summary(&got),
        summary(&tree),
        "the downloaded tree differs from the uploaded one"
    );
    assert!(got == tree);
}

#[tokio::test]
async fn cli_cp_round_trips_a_directory() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let work = common::test_dir();
    let src = work.path().join("dir");
    let tree = tarball::sample_tree();
    write_tree(&src, &tree);
    let dst = format!("{}:/workspace/dir", sb.id);
    let out = d.run_cli(&["cp", src.to_str().expect("utf-8"), &dst]);
    common::expect_exit(&out, 0, "mayfly cp to the sandbox");
    assert_eq!(
        d.sh(&sb.id, "cat /workspace/dir/hello.txt").await,
        "hello\n"
    );

    let out_dir = work.path().join("out");
    let out = d.run_cli(&["cp", &dst, out_dir.to_str().expect("utf-8")]);
    common::expect_exit(&out, 0, "mayfly cp from the sandbox");
    let got = tarball::tree_of_dir(&out_dir);
    assert_eq!(
        summary(&got),
        summary(&tree),
        "cp did not round-trip the tree"
    );
    assert!(got == tree);
}

#[tokio::test]
async fn api_written_files_belong_to_the_sandbox_root_and_keep_their_mode() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let script = b"#!/bin/sh\necho script ran\n".to_vec();
    let st = d
        .client
        .write_file(&sb.id, "/workspace/s.sh", script, Some(0o755))
        .await
        .expect("write");
    assert_eq!((st.uid, st.gid, st.mode & 0o7777), (0, 0, 0o755), "{st:?}");
    assert_eq!(
        d.sh(&sb.id, "stat -c '%u %g %a' /workspace/s.sh").await,
        "0 0 755\n"
    );
    assert_eq!(d.sh(&sb.id, "/workspace/s.sh").await, "script ran\n");

    d.client
        .write_file(&sb.id, "/workspace/plain", b"x".to_vec(), None)
        .await
        .expect("write");
    assert_eq!(d.sh(&sb.id, "stat -c '%u' /workspace/plain").await, "0\n");
    // On the host, the file in the upper layer is owned by the sandbox's
    // root (uid_base), never by host root.
    let mut stack = vec![d.sandbox_dir(&sb.id)];
    let mut found = Vec::new();
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let m = std::fs::symlink_metadata(e.path()).expect("metadata");
            if e.file_name() == "s.sh" {
                found.push(std::os::unix::fs::MetadataExt::uid(&m));
            } else if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    assert_eq!(found, [sb.uid_base], "host owners of the written file");
}

/// `/tmp`, `/dev/shm` and `/run/secrets` are filesystems the sandbox mounted
/// itself, owned by its user namespace, where the kernel refuses to create
/// anything owned by host root: the file API makes names there as the
/// sandbox's root, and every call works as it does on the root overlay.
#[tokio::test]
async fn the_sandboxs_own_tmpfs_mounts_take_writes_mkdirs_renames_and_uploads() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    for dir in ["/tmp", "/dev/shm", "/run/secrets"] {
        let file = format!("{dir}/written");
        let st = d
            .client
            .write_file(&sb.id, &file, b"hello".to_vec(), Some(0o640))
            .await
            .unwrap_or_else(|e| panic!("writing {file}: {e}"));
        assert_eq!((st.uid, st.gid, st.mode & 0o7777), (0, 0, 0o640), "{st:?}");
        assert_eq!(
            d.sh(&sb.id, &format!("stat -c '%u %g %a' {file}; cat {file}"))
                .await,
            "0 0 640\nhello"
        );
        // Replacing a file the sandbox made itself.
        d.sh(&sb.id, &format!("echo mine > {dir}/own")).await;
        d.client
            .write_file(&sb.id, &format!("{dir}/own"), b"ours".to_vec(), None)
            .await
            .unwrap_or_else(|e| panic!("replacing {dir}/own: {e}"));
        assert_eq!(d.sh(&sb.id, &format!("cat {dir}/own")).await, "ours");

        let made = d
            .client
            .mkdir(
                &sb.id,
                &MkdirRequest {
                    path: format!("{dir}/a/b"),
                    parents: true,
                    mode: None,
                },
            )
            .await
            .unwrap_or_else(|e| panic!("mkdir {dir}/a/b: {e}"));
        assert_eq!((made.uid, made.gid), (0, 0), "{made:?}");
        d.client
            .rename(
                &sb.id,
                &mayfly_types::RenameRequest {
                    from: format!("{dir}/a/b"),
                    to: format!("{dir}/a/c"),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("rename in {dir}: {e}"));
        let up = d
            .client
            .upload_tar(
                &sb.id,
                &format!("{dir}/a/c/up"),
                tarball::tar_of(&tarball::sample_tree()),
            )
            .await
            .unwrap_or_else(|e| panic!("upload into {dir}: {e}"));
        assert!(up.files > 0, "{up:?}");
        assert_eq!(
            d.sh(&sb.id, &format!("cat {dir}/a/c/up/hello.txt")).await,
            "hello\n"
        );
        // Everything belongs to the sandbox's root, and no temporary name
        // of the API's is left behind.
        assert_eq!(
            d.sh(
                &sb.id,
                &format!("find {dir} ! -user 0 -o ! -group 0 -o -name '.mf-*'")
            )
            .await,
            ""
        );
    }
}

/// A host file copied in lands as `docker cp` puts it: into an existing
/// directory under its own name, at a new name as that name, and never
/// into a directory that does not exist.
#[tokio::test]
async fn cli_cp_of_a_file_lands_where_docker_cp_puts_it() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let work = common::test_dir();
    let src = work.path().join("notes.txt");
    std::fs::write(&src, "n\n").expect("writing the source");
    let src = src.to_str().expect("utf-8");
    for (dst, lands) in [
        ("/tmp", "/tmp/notes.txt"),
        ("/workspace/", "/workspace/notes.txt"),
        ("/workspace/renamed", "/workspace/renamed"),
    ] {
        let out = d.run_cli(&["cp", src, &format!("{}:{dst}", sb.id)]);
        common::expect_exit(&out, 0, &format!("mayfly cp to {dst}"));
        assert_eq!(d.sh(&sb.id, &format!("cat {lands}")).await, "n\n", "{dst}");
    }
    let out = d.run_cli(&["cp", src, &format!("{}:/workspace/nodir/", sb.id)]);
    // 125: an error of mayfly itself, as `docker cp` exits.
    common::expect_exit(&out, 125, "mayfly cp into a missing directory");
    assert!(
        text(&out.stderr).contains("no such directory"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        d.sh(&sb.id, "test -e /workspace/nodir || echo absent")
            .await,
        "absent\n"
    );
}
