//! Helpers of the template tests: build requests, creates of a named
//! template, warm-pool claims and the teardown that waits for a drained
//! pool's sandboxes to go.

use std::path::Path;
use std::time::{Duration, Instant};

use mayfly_client::BuildEvent;
use mayfly_types::{
    BuildProgress, BuildRequest, CreateRequest, PoolSpec, SandboxInfo, SandboxSource, TemplateInfo,
    TemplateRef,
};

use super::Daemon;

/// A build of `spec`, named `file` in error messages, with `copy` sources
/// relative to `context`.
pub fn build_req(spec: String, file: &str, context: Option<&Path>) -> BuildRequest {
    BuildRequest {
        spec,
        file: Some(file.into()),
        context: context.map(|c| c.display().to_string()),
        registry_auth: None,
        no_cache: false,
    }
}

/// A create of the named template with everything else defaulted.
pub fn named(name: &str) -> CreateRequest {
    CreateRequest {
        template: Some(TemplateRef::Named(name.into())),
        ..Default::default()
    }
}

/// The median of `v`.
pub fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Builds through the streamed API and returns the template and every
/// progress event, in order.
pub async fn build_streamed(d: &Daemon, req: &BuildRequest) -> (TemplateInfo, Vec<BuildProgress>) {
    let mut stream = d
        .client
        .build_template_stream(req)
        .await
        .unwrap_or_else(|e| panic!("starting the build: {e}; daemon log:\n{}", d.log()));
    let mut events = Vec::new();
    loop {
        match stream.next_event().await {
            Ok(Some(BuildEvent::Progress(p))) => events.push(p),
            Ok(Some(BuildEvent::Built(info))) => return (*info, events),
            Ok(None) => panic!("the build stream ended without a template: {events:?}"),
            Err(e) => panic!("the build failed: {e}; events {events:?}"),
        }
    }
}

/// `(index, cached)` of each `StepDone` event, in order.
pub fn steps_done(events: &[BuildProgress]) -> Vec<(usize, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            BuildProgress::StepDone { index, cached, .. } => Some((*index, *cached)),
            _ => None,
        })
        .collect()
}

/// Sets a pool of `template` named after it, `target` sandboxes.
pub async fn set_template_pool(d: &Daemon, template: &str, target: u32) {
    d.client
        .set_pool(
            template,
            &PoolSpec {
                template: Some(template.to_owned()),
                target: Some(target),
                max: Some(target),
                ..Default::default()
            },
        )
        .await
        .expect("setting the template's pool");
}

/// Waits (up to 120 s) for the pool to hold a booted sandbox, then claims
/// it with a create of the template; the create must come from the pool.
pub async fn claim_from_pool(d: &Daemon, template: &str) -> SandboxInfo {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pools = d.client.pools().await.expect("pools");
        if pools.iter().any(|p| p.name == template && p.ready >= 1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pool never filled: {pools:?}; daemon log:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sb = d.create_with(&named(template)).await;
    assert_eq!(sb.source, SandboxSource::Pool, "not a claim: {sb:?}");
    sb
}

/// Drains `pool` (when given), destroys `ids`, and waits (up to 30 s) until
/// the pool is empty and no sandbox is alive, so that what the template
/// removal collects no longer depends on a teardown still running.
pub async fn destroy_all(d: &Daemon, pool: Option<&str>, ids: &[mayfly_types::SandboxId]) {
    if let Some(pool) = pool {
        d.client.drain_pool(pool).await.expect("drain");
    }
    for id in ids {
        d.client.destroy(id).await.expect("destroy");
    }
    // The drained pool's sandboxes go in the background; layers of a
    // sandbox still being torn down are kept.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pools = d.client.pools().await.expect("pools");
        let idle = pools
            .iter()
            .filter(|p| Some(p.name.as_str()) == pool)
            .all(|p| p.ready == 0 && p.filling == 0);
        let live = d.client.list(true).await.expect("list");
        let live = live.iter().filter(|s| !s.state.is_terminal()).count();
        if idle && live == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "sandboxes still alive: {pools:?}, {live} live"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many layers the daemon's layer store holds.
pub fn stored_layers(d: &Daemon) -> usize {
    std::fs::read_dir(d.state_dir.join("layers/sha256"))
        .map(|r| r.count())
        .unwrap_or(0)
}
