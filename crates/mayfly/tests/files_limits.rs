//! The file API against a sandbox trying to hurt the daemon: file answers
//! built in memory are bounded daemon-wide (a sparse 1 GiB file costs the
//! sandbox nothing, its read would cost the daemon 1 GiB), and a sandbox
//! whose init has died gets 4xx answers, never a 500 or a view of the
//! host's root through a reused pid.

mod common;

use std::time::{Duration, Instant};

use common::keys::code;
use common::{assert_no_leaks, Daemon};
use mayfly_types::{ErrorCode, SandboxState};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const MIB: usize = 1 << 20;

#[tokio::test]
async fn file_answers_past_the_daemons_buffer_budget_get_503_until_memory_comes_back() {
    let budget = 8 * MIB;
    let d = Daemon::start_with(&["--file-buffer-bytes", &budget.to_string()]).await;
    let sb = d.create().await;
    // Sparse: six MiB that cost the sandbox no disk.
    d.sh(
        &sb.id,
        "truncate -s 6M /tmp/big && truncate -s 1M /tmp/small",
    )
    .await;
    let whole = d.client.read_file(&sb.id, "/tmp/big").await.expect("read");
    assert_eq!(whole.len(), 6 * MIB);

    // A reader that asks and does not read holds its answer's six MiB.
    let mut slow = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    let req = format!(
        "GET /v1/sandboxes/{}/files?path=/tmp/big HTTP/1.1\r\nHost: x\r\n\r\n",
        sb.id
    );
    slow.write_all(req.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    slow.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "the slow reader's answer");

    // Another six MiB do not fit: a read and a tar download are refused
    // with 503 (to retry), while a small file still fits.
    let (status, c, msg) = code(d.client.read_file(&sb.id, "/tmp/big").await);
    assert_eq!((status, c), (503, ErrorCode::Unavailable), "{msg}");
    assert!(msg.contains("retry"), "{msg}");
    let (status, c, msg) = code(d.client.download_tar(&sb.id, "/tmp/big").await);
    assert_eq!((status, c), (503, ErrorCode::Unavailable), "{msg}");
    let small = d.client.read_file(&sb.id, "/tmp/small").await;
    assert_eq!(small.expect("a small read fits").len(), MIB);

    // The slow reader leaves: its six MiB come back.
    drop(slow);
    let t = Instant::now();
    loop {
        match d.client.read_file(&sb.id, "/tmp/big").await {
            Ok(b) => {
                assert_eq!(b.len(), 6 * MIB);
                break;
            }
            Err(e) => assert!(
                t.elapsed() < Duration::from_secs(10),
                "the budget did not come back: {e:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    d.client.destroy(&sb.id).await.expect("destroy");
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
}

#[tokio::test]
async fn file_requests_to_a_sandbox_whose_init_died_get_4xx_never_500() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let init = sb.init_pid.expect("a live sandbox reports its init's pid");
    // No file request yet, so the daemon has not opened the root: the
    // first ones race the death of init and its teardown.
    // SAFETY: kill(2) on a pid this test was just given; no memory involved.
    assert_eq!(unsafe { libc::kill(init as i32, libc::SIGKILL) }, 0);
    let t = Instant::now();
    let mut answers = Vec::new();
    while t.elapsed() < Duration::from_secs(3) {
        let r = d.client.stat(&sb.id, "/etc/hostname").await;
        let status = match &r {
            Ok(_) => 200,
            Err(mayfly_client::ClientError::Api { status, .. }) => *status,
            Err(e) => panic!("not an API answer: {e:?}"),
        };
        assert!(status == 200 || (400..500).contains(&status), "{r:?}");
        answers.push(status);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let info = d.client.get(&sb.id).await.expect("get");
    assert_ne!(info.state, SandboxState::Ready, "{info:?}");
    assert!(
        answers.iter().any(|&s| s == 404 || s == 409),
        "the sandbox never stopped answering: {answers:?}"
    );
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
}

#[tokio::test]
async fn a_file_the_sandbox_holds_a_lease_on_is_busy_not_an_internal_error() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    d.sh(&sb.id, "echo data > /tmp/leased").await;
    // A write lease (the sandbox owns the file): the daemon's non-blocking
    // open of it fails with EWOULDBLOCK until the lease is given up.
    // It ignores SIGIO, the signal that asks it to give the lease up.
    let script = "import fcntl, os, signal, time\n\
                  signal.signal(signal.SIGIO, signal.SIG_IGN)\n\
                  fd = os.open('/tmp/leased', os.O_RDONLY)\n\
                  fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)\n\
                  open('/tmp/ready', 'w').close()\n\
                  time.sleep(60)\n";
    let req = mayfly_types::StartProcessRequest {
        argv: vec!["python3".into(), "-c".into(), script.into()],
        ..Default::default()
    };
    d.client.start_process(&sb.id, &req).await.expect("start");
    let t = Instant::now();
    while d.client.stat(&sb.id, "/tmp/ready").await.is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "no lease taken");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, c, msg) = code(d.client.read_file(&sb.id, "/tmp/leased").await);
    assert_eq!((status, c), (409, ErrorCode::Conflict), "{msg}");
    let (status, c, msg) = code(d.client.download_tar(&sb.id, "/tmp").await);
    assert_eq!((status, c), (409, ErrorCode::Conflict), "{msg}");
    d.client.destroy(&sb.id).await.expect("destroy");
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
}

/// A command's collected output is charged to the same budget: past it the
/// rest is counted, not kept (the exec still answers, truncated), and the
/// budget comes back once the answer is built.
#[tokio::test]
async fn command_output_past_the_daemons_buffer_budget_is_counted_not_kept() {
    let budget = 8 * MIB;
    let d = Daemon::start_with(&["--file-buffer-bytes", &budget.to_string()]).await;
    let sb = d.create().await;
    let req = mayfly_types::ExecRequest {
        output_limit: Some(64 << 20),
        ..common::cmd(&["head", "-c", "20971520", "/dev/zero"])
    };
    let r = d.exec_req(&sb.id, &req).await;
    assert_eq!(r.status.exit_code, Some(0));
    assert_eq!(r.stdout_bytes, 20 * MIB as u64, "every byte is counted");
    assert!(r.stdout_truncated, "20 MiB kept under an 8 MiB budget");
    assert!(
        r.stdout.0.len() <= budget,
        "kept {} bytes past the budget",
        r.stdout.0.len()
    );
    // The budget is free again: a 6 MiB read fits.
    d.sh(&sb.id, "truncate -s 6M /tmp/big").await;
    let whole = d.client.read_file(&sb.id, "/tmp/big").await.expect("read");
    assert_eq!(whole.len(), 6 * MIB);
    // Within the budget, output is kept whole.
    let req = mayfly_types::ExecRequest {
        output_limit: Some(64 << 20),
        ..common::cmd(&["head", "-c", "4194304", "/dev/zero"])
    };
    let r = d.exec_req(&sb.id, &req).await;
    assert_eq!((r.stdout.0.len(), r.stdout_truncated), (4 * MIB, false));
}
