//! `docs/grafana/mayfly.json`, the Grafana dashboard for `GET /metrics`:
//! every metric and label its queries use is one the daemon exports (read
//! back by the real OpenMetrics parser), and the document is one Grafana
//! imports (unique panel ids, a datasource input, panels on the grid).

mod support;

use std::collections::{BTreeMap, BTreeSet};

use http::{Method, StatusCode};
use serde_json::{json, Value};
use support::openmetrics::parse;
use support::*;

const DASHBOARD: &str = include_str!("../../../docs/grafana/mayfly.json");

/// A scrape in which every family has at least one sample: a pool, creates
/// of both sources, a failure, an OOM kill, an end (histograms and plain
/// counters are exported from the start).
async fn full_scrape() -> BTreeMap<String, support::openmetrics::Family> {
    let (router, fake) = test_app();
    let r = send(
        &router,
        json_req(Method::PUT, "/v1/pools/py", r#"{"target":2}"#),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let a = create(&router).await;
    // One event of each kind the metrics count.
    let id = Some(&a.id);
    for (sandbox, kind, detail) in [
        (id, "ready", json!({"create_ms": 3.0, "source": "cold"})),
        (id, "claimed", json!({"claim_us": 40, "pool": "py"})),
        (None, "failed", json!({"reason": "internal"})),
        (id, "oom_kill", json!({"count": 1, "total": 1})),
        (id, "destroyed", json!({"reason": "ttl", "destroy_ms": 1.5})),
    ] {
        fake.emit(sandbox, kind, detail);
    }
    let a = send(&router, empty_req(Method::GET, "/metrics")).await;
    parse(std::str::from_utf8(&a.body).expect("metrics are text"))
}

/// The `mayfly_…` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("mayfly_") {
        let tail = &rest[i..];
        let n = tail
            .bytes()
            .take_while(|b| b.is_ascii_lowercase() || *b == b'_')
            .count();
        out.push(tail[..n].to_string());
        rest = &tail[n..];
    }
    out
}

/// The labels an expression groups by: `by (a, b)`.
fn grouped_by(expr: &str) -> Vec<String> {
    expr.split("by (")
        .skip(1)
        .flat_map(|s| s.split(')').next().unwrap_or_default().split(','))
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty() && l != "le")
        .collect()
}

fn targets(dash: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            out.push((
                p["title"].as_str().expect("title").to_string(),
                t["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    out
}

#[tokio::test]
async fn every_metric_and_label_the_dashboard_queries_is_exported() {
    let dash: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let families = full_scrape().await;
    // Sample name → the label names its samples carry.
    let mut samples: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for fam in families.values() {
        for (name, labels, _) in &fam.samples {
            samples
                .entry(name.clone())
                .or_default()
                .extend(labels.keys().cloned());
        }
    }
    let mut used = BTreeSet::new();
    for (title, expr) in targets(&dash) {
        let names = metric_names(&expr);
        assert!(
            !names.is_empty(),
            "`{title}` queries no Mayfly metric: {expr}"
        );
        for name in names {
            let labels = samples.get(&name).unwrap_or_else(|| {
                panic!("`{title}` queries {name}, which /metrics does not export: {expr}")
            });
            for l in grouped_by(&expr) {
                assert!(
                    labels.contains(&l),
                    "`{title}` groups {name} by `{l}`, a label it does not have ({labels:?})"
                );
            }
            used.insert(name.trim_end_matches("_bucket").to_string());
        }
    }
    // Every family is on the dashboard somewhere.
    for fam in families.keys() {
        let shown = used.iter().any(|u| u.starts_with(fam.as_str()));
        assert!(shown, "the dashboard shows nothing of {fam}");
    }
}

#[test]
fn the_dashboard_imports_into_grafana() {
    let dash: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    assert_eq!(dash["__inputs"][0]["pluginId"], "prometheus");
    let input = format!(
        "${{{}}}",
        dash["__inputs"][0]["name"].as_str().expect("name")
    );
    let mut ids = BTreeSet::new();
    for p in dash["panels"].as_array().expect("panels") {
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "duplicate panel id: {p}"
        );
        assert_eq!(p["datasource"]["uid"], input.as_str(), "{}", p["title"]);
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().expect("x"), g["w"].as_u64().expect("w"));
        assert!(
            x + w <= 24 && g["h"].as_u64().expect("h") > 0,
            "{} is off the grid",
            p["title"]
        );
        let refs: BTreeSet<_> = p["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .map(|t| t["refId"].as_str().expect("refId"))
            .collect();
        assert_eq!(
            refs.len(),
            p["targets"].as_array().map_or(0, Vec::len),
            "{}",
            p["title"]
        );
    }
    // The spin-up percentiles the issue asks for: P50 and P95, by source.
    let spin: Vec<_> = targets(&dash)
        .into_iter()
        .filter(|(_, e)| e.contains("mayfly_create_seconds_bucket"))
        .map(|(_, e)| e)
        .collect();
    for q in ["0.5", "0.95"] {
        assert!(
            spin.iter()
                .any(|e| e.starts_with(&format!("histogram_quantile({q},"))
                    && grouped_by(e) == ["source"]),
            "no P{} spin-up by source: {spin:?}",
            q.trim_start_matches("0.").trim_end_matches('5').to_string() + "5"
        );
    }
}
