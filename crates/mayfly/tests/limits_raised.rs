//! Limits above the defaults: a stub's cgroup is prepared with the default
//! limits, so a create asking for more raises them (on cgroup v1 with swap
//! accounting, the memory+swap limit first, which the kernel requires).

mod common;

use common::{cmd, Daemon};
use mayfly_types::{ExecRequest, Limits};

#[tokio::test]
async fn a_sandbox_can_have_more_memory_than_the_default() {
    let d = Daemon::start().await;
    let sb = d
        .create_limited(Limits {
            memory_bytes: Some(1 << 30),
            ..Limits::default()
        })
        .await;
    assert_eq!(sb.limits.memory_bytes, 1 << 30);
    let usage = d.client.usage(&sb.id).await.expect("usage");
    assert_eq!(usage.memory_limit_bytes, 1 << 30);
    // 768 MiB, touched: more than the default 512 MiB would let live.
    let big = "b = bytearray(768 << 20); b[::4096] = b'x' * len(b[::4096]); print('fits')";
    let r = d
        .exec_req(
            &sb.id,
            &ExecRequest {
                timeout_ms: Some(60_000),
                ..cmd(&["python3", "-c", big])
            },
        )
        .await;
    assert_eq!(
        (r.status.exit_code, common::text(&r.stdout.0)),
        (Some(0), "fits\n".to_owned()),
        "stderr: {}",
        common::text(&r.stderr.0)
    );
    // And less than the default, on the next prepared stub.
    let small = d
        .create_limited(Limits {
            memory_bytes: Some(64 << 20),
            ..Limits::default()
        })
        .await;
    let usage = d.client.usage(&small.id).await.expect("usage");
    assert_eq!(usage.memory_limit_bytes, 64 << 20);
}
