//! The OpenAPI document matches the router, route for route.

mod support;

use std::collections::BTreeSet;

use http::Method;
use mayfly_server::{route_table, ApiDoc};
use support::*;
use utoipa::OpenApi as _;

fn doc_routes() -> BTreeSet<(String, String)> {
    let doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    let paths = doc["paths"].as_object().expect("paths is an object");
    paths
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .expect("a path item is an object")
                .keys()
                .filter(|k| {
                    matches!(
                        k.as_str(),
                        "get" | "put" | "post" | "delete" | "patch" | "head"
                    )
                })
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect()
}

fn router_routes() -> BTreeSet<(String, String)> {
    route_table()
        .into_iter()
        .map(|(m, p)| (m.to_string(), p.to_owned()))
        .collect()
}

#[test]
fn every_route_is_documented_and_every_documented_route_exists() {
    let doc = doc_routes();
    let router = router_routes();
    let undocumented: Vec<_> = router.difference(&doc).collect();
    let phantom: Vec<_> = doc.difference(&router).collect();
    assert!(
        undocumented.is_empty(),
        "routes missing from the OpenAPI document: {undocumented:?}"
    );
    assert!(
        phantom.is_empty(),
        "documented routes the router lacks: {phantom:?}"
    );
    assert_eq!(
        router.len(),
        route_table().len(),
        "no route is listed twice"
    );
}

#[tokio::test]
async fn every_route_in_the_table_is_really_served_with_its_method() {
    let (app, _) = test_app();
    let sb = create(&app).await;
    for (method, path) in route_table() {
        let uri = path
            .replace("{id}", sb.id.as_str())
            .replace("{handle}", "1");
        let a = send(&app, empty_req(method.clone(), &uri)).await;
        let e = serde_json::from_slice::<mayfly_types::ApiError>(&a.body).ok();
        let unrouted = a.status == 405 || e.is_some_and(|e| e.message.starts_with("no route for"));
        assert!(
            !unrouted,
            "{method} {path} is in the table but not served: {}",
            a.status
        );
    }
    // And a method the table does not list for a path is refused.
    let a = send(&app, empty_req(Method::PATCH, "/v1/events")).await;
    a.api_error(405);
    let allow = a
        .headers
        .get("allow")
        .map(|v| v.to_str().unwrap_or("").to_owned());
    assert!(
        allow.is_some_and(|v| v.contains("GET")),
        "405 names the allowed methods"
    );
}

#[test]
fn every_operation_documents_its_errors_as_api_error() {
    let doc = serde_json::to_value(ApiDoc::openapi()).expect("serializes");
    let mut missing = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("path item") {
            let responses = op["responses"].as_object().expect("responses");
            let meta = path == "/healthz" || path == "/openapi.json";
            let has_error = responses.keys().any(|s| s.starts_with('4'));
            if !meta && !has_error {
                missing.push(format!("{method} {path}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "operations without a documented 4xx: {missing:?}"
    );
}

/// The document is checked in, so API changes show up in review. Regenerate
/// with `UPDATE_SNAPSHOTS=1 cargo test -p mayfly-server --test openapi`.
#[test]
fn the_document_matches_its_snapshot() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
    let current = ApiDoc::openapi()
        .to_pretty_json()
        .expect("the document serializes")
        + "\n";
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &current).expect("the snapshot can be written");
        return;
    }
    let saved = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        saved == current,
        "{} is out of date; if the API change is intended, run \
         `UPDATE_SNAPSHOTS=1 cargo test -p mayfly-server --test openapi` and review the diff",
        path.display()
    );
}
