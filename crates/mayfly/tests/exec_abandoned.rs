//! Commands whose callers leave: a buffered exec whose client hangs up, and
//! a streamed one whose listener goes (silent, or writing past its output
//! limit), are killed at once, and still audited; nothing is left running
//! for the daemon to drain.

mod common;

use std::time::Duration;

use common::host::commands_left;
use common::{cmd, Daemon};
use mayfly_types::ExecRequest;

/// Waits up to 10 s for sandbox `id` to run nothing but its init.
async fn nothing_left(id: &str, init_pid: Option<u32>) {
    let gone = common::eventually(Duration::from_secs(10), || {
        commands_left(id, init_pid).is_empty()
    })
    .await;
    assert!(
        gone,
        "commands outlived their callers: {:?}",
        commands_left(id, init_pid)
    );
}

#[tokio::test]
async fn a_buffered_exec_whose_client_hangs_up_is_killed_and_audited() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let sleep = cmd(&["sleep", "1000"]);
    let exec = d.client.exec(&sb.id, &sleep);
    assert!(
        tokio::time::timeout(Duration::from_secs(1), exec)
            .await
            .is_err(),
        "sleep 1000 answered within a second"
    );
    nothing_left(sb.id.as_str(), sb.init_pid).await;
    // Its audit row is written once its end is in (off the hung-up request).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let trail = d.client.audit(&sb.id).await.expect("audit");
        let row = trail.iter().find(|a| a.argv == ["sleep", "1000"]);
        if let Some(a) = row {
            assert_eq!(a.signal, Some(libc::SIGKILL), "{a:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned command has no audit row: {trail:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The sandbox serves on.
    assert_eq!(d.sh(&sb.id, "echo on").await, "on\n");
}

#[tokio::test]
async fn a_streamed_exec_whose_listener_goes_is_killed_silent_or_past_its_limit() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    // Silent: nothing is ever sent that could fail.
    let stream = d
        .client
        .exec_stream(&sb.id, &cmd(&["sleep", "1000"]))
        .await
        .expect("starting a streamed exec");
    drop(stream);
    nothing_left(sb.id.as_str(), sb.init_pid).await;
    // Writing without end, long past its limit (where nothing more is sent).
    let req = ExecRequest {
        output_limit: Some(1 << 16),
        ..cmd(&["cat", "/dev/zero"])
    };
    let mut stream = d
        .client
        .exec_stream(&sb.id, &req)
        .await
        .expect("starting a streamed exec");
    let first = stream.next_event().await.expect("reading the stream");
    assert!(first.is_some(), "no output arrived");
    drop(stream);
    nothing_left(sb.id.as_str(), sb.init_pid).await;
}
