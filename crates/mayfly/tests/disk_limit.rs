//! Disk limits: a sandbox whose writable layers pass `limits.disk_bytes`
//! is destroyed (reason `disk`, with a `disk_limit` event saying what was
//! found), its layers go with it, and one within its limit lives on.

mod common;

use common::events::wait_for_event;
use common::{assert_no_leaks, Daemon};
use mayfly_types::{Limits, SandboxState};

#[tokio::test]
async fn a_sandbox_past_its_disk_limit_is_destroyed_and_one_within_lives_on() {
    let d = Daemon::start().await;
    let limited = |bytes: u64| Limits {
        disk_bytes: Some(bytes),
        ..Limits::default()
    };
    let hog = d.create_limited(limited(64 << 20)).await;
    assert_eq!(hog.limits.disk_bytes, 64 << 20);
    let calm = d.create_limited(limited(64 << 20)).await;
    // 32 MiB is within the limit; 256 MiB (half in the root, half in the
    // workspace: both are the sandbox's writable layers) is not.
    d.sh(
        &calm.id,
        "head -c 33554432 /dev/zero > /workspace/ok && sync",
    )
    .await;
    let _ = d
        .client
        .exec(
            &hog.id,
            &common::cmd(&[
                "sh",
                "-c",
                "head -c 134217728 /dev/zero > /big; \
                 head -c 134217728 /dev/zero > /workspace/big; sync; sleep 30",
            ]),
        )
        .await;
    let ev = wait_for_event(&d, &hog.id, "disk_limit").await;
    assert!(
        ev.detail["bytes"].as_u64().is_some_and(|b| b > 64 << 20),
        "{ev:?}"
    );
    let ended = wait_for_event(&d, &hog.id, "destroyed").await;
    assert_eq!(ended.detail["reason"], "disk", "{ended:?}");
    let info = d.client.get(&hog.id).await.expect("get");
    assert_eq!(
        (info.state, info.reason.as_deref()),
        (SandboxState::Destroyed, Some("disk"))
    );
    assert_no_leaks(&d.state_dir, &[hog.id.as_str()]);
    // The calm one was measured too (the host's disk grew past its limit)
    // and lives on.
    assert_eq!(d.sh(&calm.id, "echo alive").await, "alive\n");
    assert!(common::events::events_of(&d, &calm.id, "disk_limit")
        .await
        .is_empty());
}

#[tokio::test]
async fn disk_limits_out_of_range_are_refused() {
    let d = Daemon::start().await;
    for bytes in [1 << 20, u64::MAX] {
        let e = d
            .client
            .create(&mayfly_types::CreateRequest {
                limits: Limits {
                    disk_bytes: Some(bytes),
                    ..Limits::default()
                },
                ..mayfly_types::CreateRequest::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Some(mayfly_types::ErrorCode::InvalidArgument),
            "{e}"
        );
    }
}
