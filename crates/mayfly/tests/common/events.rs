//! A daemon's lifecycle events, as a test reads them.

use std::time::Duration;

use mayfly_types::Event;

use super::Daemon;

/// The events of kind `kind` of sandbox `id` so far.
pub async fn events_of(d: &Daemon, id: &mayfly_types::SandboxId, kind: &str) -> Vec<Event> {
    d.client
        .events(0, 10_000)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| e.sandbox_id.as_deref() == Some(id.as_str()) && e.kind == kind)
        .collect()
}

/// Waits (up to 30 s: OOM kills and destroys are slow on a busy host) for
/// the latest `kind` event of sandbox `id`.
pub async fn wait_for_event(d: &Daemon, id: &mayfly_types::SandboxId, kind: &str) -> Event {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(e) = events_of(d, id, kind).await.pop() {
            return e;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no `{kind}` event for {id} within 30 s; events: {:?}; log:\n{}",
            d.client.events(0, 10_000).await,
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
