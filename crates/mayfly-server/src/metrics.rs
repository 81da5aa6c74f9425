//! `GET /metrics`: Prometheus metrics, in the OpenMetrics text format.
//!
//! Where each figure comes from:
//!
//! * counters and the create, claim and destroy histograms: lifecycle
//!   events (`ready`, `claimed`, `failed`, `destroyed`, `oom_kill`), read
//!   through an [`EventFeed`] that is drained at each scrape, so a scrape
//!   sees every event committed before it, including those another process
//!   wrote into the same store;
//! * `mayfly_exec_seconds`: timed by the exec handler, request to result
//!   (or to the `exit` event of a stream);
//! * gauges (live sandboxes, pool fill): computed at scrape time from the
//!   engine.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::header::CONTENT_TYPE;
use mayfly_engine::SandboxApi;
use mayfly_types::{ApiError, Event};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::feed::EventFeed;
use crate::{AppError, AppState};

/// The OpenMetrics text format's media type.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bucket bounds in seconds, 100 µs to 10 s: an exec or a create from a
/// pool takes well under a millisecond to a few, a cold create a few
/// milliseconds, a destroy of a sandbox with much page cache a second.
const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The longest a label value taken from an event may be.
const MAX_LABEL: usize = 64;

type Label1 = [(&'static str, String); 1];
type Label2 = [(&'static str, String); 2];
type Histograms = Family<Label1, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The daemon's metrics and the feed that keeps the event-driven ones.
pub(crate) struct Metrics {
    registry: Registry,
    create: Histograms,
    claim: Histogram,
    exec: Histogram,
    destroy: Histogram,
    live: Family<Label2, Gauge>,
    pool_ready: Family<Label1, Gauge>,
    pool_target: Family<Label1, Gauge>,
    creates: Family<Label1, Counter>,
    create_failures: Family<Label1, Counter>,
    oom_kills: Counter,
    ttl_kills: Counter,
    ended: Family<Label1, Counter>,
    /// Drained at each scrape; one scrape at a time.
    feed: tokio::sync::Mutex<Option<EventFeed>>,
}

impl Metrics {
    /// Metrics fed by `api`'s events from now on.
    pub(crate) fn new(api: &Arc<dyn SandboxApi>) -> Metrics {
        let feed = match EventFeed::new(api.clone(), None) {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::error!(error = %e, "subscribing to events failed; event-driven metrics stay at zero");
                None
            }
        };
        let mut m = Metrics {
            registry: Registry::default(),
            create: Histograms::new_with_constructor(histogram as fn() -> Histogram),
            claim: histogram(),
            exec: histogram(),
            destroy: histogram(),
            live: Family::default(),
            pool_ready: Family::default(),
            pool_target: Family::default(),
            creates: Family::default(),
            create_failures: Family::default(),
            oom_kills: Counter::default(),
            ttl_kills: Counter::default(),
            ended: Family::default(),
            feed: tokio::sync::Mutex::new(feed),
        };
        m.register();
        // Both sources show from the first scrape, at zero.
        for source in ["cold", "pool"] {
            let label = [("source", source.to_owned())];
            let _ = m.creates.get_or_create(&label);
            let _ = m.create.get_or_create(&label);
        }
        m
    }

    /// Names and describes every metric in the registry. prometheus-client
    /// ends each help text with a period of its own, and `_seconds` and
    /// `_total` come from the unit and the type.
    fn register(&mut self) {
        let r = &mut self.registry;
        let s = || Unit::Seconds;
        r.register_with_unit(
            "mayfly_create",
            "Create to ready, by where the sandbox came from \
             (cold: booted on request; pool: claimed from a warm pool)",
            s(),
            self.create.clone(),
        );
        r.register_with_unit(
            "mayfly_claim",
            "Claims of a sandbox from a warm pool",
            s(),
            self.claim.clone(),
        );
        r.register_with_unit(
            "mayfly_exec",
            "Exec round trip as the server sees it: request to result, \
             or to the exit event of a stream",
            s(),
            self.exec.clone(),
        );
        r.register_with_unit(
            "mayfly_destroy",
            "Destroy, from the kill to the sandbox's end being recorded",
            s(),
            self.destroy.clone(),
        );
        r.register(
            "mayfly_live_sandboxes",
            "Live sandboxes (creating, ready or stopping) by tenant \
             (unclaimed: waiting in a pool) and template",
            self.live.clone(),
        );
        r.register(
            "mayfly_pool_ready",
            "Booted, unclaimed sandboxes in each warm pool",
            self.pool_ready.clone(),
        );
        r.register(
            "mayfly_pool_target",
            "How many unclaimed sandboxes each warm pool keeps",
            self.pool_target.clone(),
        );
        r.register(
            "mayfly_creates",
            "Sandboxes created, by where they came from",
            self.creates.clone(),
        );
        r.register(
            "mayfly_create_failures",
            "Creates that failed after their sandbox was recorded, by error code",
            self.create_failures.clone(),
        );
        r.register(
            "mayfly_oom_kills",
            "Processes killed by the OOM killer inside sandboxes",
            self.oom_kills.clone(),
        );
        r.register(
            "mayfly_ttl_kills",
            "Sandboxes destroyed because their TTL ran out",
            self.ttl_kills.clone(),
        );
        r.register(
            "mayfly_sandboxes_ended",
            "Sandboxes that ended, by why (user, ttl, oom, init_exited, \
             daemon_shutdown and others)",
            self.ended.clone(),
        );
    }

    /// Times one exec round trip.
    pub(crate) fn observe_exec(&self, took: Duration) {
        self.exec.observe(took.as_secs_f64());
    }

    /// Counts what one event says.
    fn apply(&self, ev: &Event) {
        let d = &ev.detail;
        let secs =
            |key: &str, per_sec: f64| d.get(key).and_then(|v| v.as_f64()).map(|v| v / per_sec);
        match ev.kind.as_str() {
            "ready" => {
                // A sandbox booted ahead for a pool is no one's create; its
                // claim is.
                let for_pool = d.get("pool").is_some_and(|p| !p.is_null())
                    || d.get("source").and_then(|s| s.as_str()) == Some("pool");
                if !for_pool {
                    let cold = [("source", "cold".to_owned())];
                    self.creates.get_or_create(&cold).inc();
                    if let Some(s) = secs("create_ms", 1e3) {
                        self.create.get_or_create(&cold).observe(s);
                    }
                }
            }
            "claimed" => {
                let pool = [("source", "pool".to_owned())];
                self.creates.get_or_create(&pool).inc();
                if let Some(s) = secs("claim_us", 1e6) {
                    self.claim.observe(s);
                    self.create.get_or_create(&pool).observe(s);
                }
            }
            "failed" => {
                let reason = label(d.get("reason"));
                self.create_failures
                    .get_or_create(&[("reason", reason)])
                    .inc();
            }
            "oom_kill" => {
                let n = d.get("count").and_then(|c| c.as_u64()).unwrap_or(1);
                self.oom_kills.inc_by(n);
            }
            "destroyed" => {
                let reason = label(d.get("reason"));
                if reason == "ttl" {
                    self.ttl_kills.inc();
                }
                self.ended.get_or_create(&[("reason", reason)]).inc();
                if let Some(s) = secs("destroy_ms", 1e3) {
                    self.destroy.observe(s);
                }
            }
            _ => {}
        }
    }

    /// Brings the event-driven metrics up to date and the gauges to now,
    /// and encodes everything.
    pub(crate) async fn scrape(&self, api: &dyn SandboxApi) -> Result<String, AppError> {
        let mut feed = self.feed.lock().await;
        if let Some(feed) = feed.as_mut() {
            // Whatever other processes wrote into the store, too.
            feed.catch_up();
            while let Some(ev) = feed.try_next().await? {
                self.apply(&ev);
            }
        }
        let mut live: BTreeMap<(String, String), i64> = BTreeMap::new();
        for sb in api.list(mayfly_engine::ListSandboxes::default()).await? {
            let tenant = sb.tenant.unwrap_or_else(|| "unclaimed".to_owned());
            *live.entry((tenant, sb.template.to_string())).or_default() += 1;
        }
        let pools = api.pools().await?;
        // Label sets that are gone (a tenant with no sandbox left, a pool
        // removed) must not linger; the feed's lock keeps scrapes apart.
        self.live.clear();
        for ((tenant, template), n) in live {
            self.live
                .get_or_create(&[("tenant", tenant), ("template", template)])
                .set(n);
        }
        self.pool_ready.clear();
        self.pool_target.clear();
        for p in pools {
            let name = [("pool", p.name)];
            self.pool_ready.get_or_create(&name).set(i64::from(p.ready));
            self.pool_target
                .get_or_create(&name)
                .set(i64::from(p.target));
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .map_err(|e| AppError::internal(format!("encoding the metrics: {e}")))?;
        Ok(out)
    }
}

/// A label value from an event's detail: the reason's first clause
/// (`user; cgroup removal failed` → `user`), only `[a-z0-9_]`, bounded, so
/// a label's values stay a small set.
fn label(v: Option<&serde_json::Value>) -> String {
    let Some(s) = v.and_then(|v| v.as_str()) else {
        return "unknown".to_owned();
    };
    let head = s.split(';').next().unwrap_or("").trim();
    let clean: String = head
        .chars()
        .take(MAX_LABEL)
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect();
    if clean.is_empty() {
        "unknown".to_owned()
    } else {
        clean
    }
}

/// Times an exec from its request; see [`Metrics::observe_exec`].
pub(crate) struct ExecTimer {
    metrics: Arc<Metrics>,
    t0: Instant,
}

impl ExecTimer {
    pub(crate) fn start(metrics: &Arc<Metrics>) -> Self {
        ExecTimer {
            metrics: metrics.clone(),
            t0: Instant::now(),
        }
    }

    pub(crate) fn done(self) {
        self.metrics.observe_exec(self.t0.elapsed());
    }
}

/// Prometheus metrics of this daemon, in the OpenMetrics text format.
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses(
        (status = 200, description = "The metrics (OpenMetrics 1.0 text).",
            content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body = String),
        (status = 401, description = "A TCP request without the bearer token.", body = ApiError),
        (status = 403, description = "Not an admin: the metrics name every tenant.", body = ApiError),
    ))]
pub(crate) async fn metrics(
    State(s): State<AppState>,
    crate::auth::Who(caller): crate::auth::Who,
) -> Result<Response, AppError> {
    if !caller.admin {
        return Err(AppError::new(
            mayfly_types::ErrorCode::PermissionDenied,
            "the metrics name every tenant's sandboxes and are for admin keys",
        ));
    }
    let text = s.metrics.scrape(s.api.as_ref()).await?;
    Ok(([(CONTENT_TYPE, CONTENT_TYPE_OPENMETRICS)], text).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_from_event_details_are_bounded_and_plain() {
        assert_eq!(label(Some(&serde_json::json!("ttl"))), "ttl");
        assert_eq!(
            label(Some(&serde_json::json!("user; cgroup removal failed"))),
            "user"
        );
        assert_eq!(
            label(Some(&serde_json::json!("Owner-Died: x"))),
            "owner_died__x"
        );
        assert_eq!(label(Some(&serde_json::json!(""))), "unknown");
        assert_eq!(label(Some(&serde_json::json!(3))), "unknown");
        assert_eq!(label(None), "unknown");
        assert_eq!(
            label(Some(&serde_json::json!("a".repeat(500)))).len(),
            MAX_LABEL
        );
    }
}
