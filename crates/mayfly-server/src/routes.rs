//! The one route table.
//!
//! Routes are added through [`Routes`], which records each (method, path) as
//! it goes, so a test can check the table against the OpenAPI document in
//! both directions.

use std::sync::Arc;

use axum::response::IntoResponse;
use axum::routing::{delete, get, patch, post, put};
use axum::{middleware, Json, Router};
use http::Method;
use mayfly_engine::SandboxApi;

use crate::error::{catch_panic, log_internal_errors, method_not_allowed, no_such_route};
use crate::{
    auth, events, exec, files, forward, metrics, observe, openapi, pools, ports, processes, run,
    sandboxes, templates, tenancy, AppState, ServerOptions,
};

/// Builds the API router over `api`.
///
/// Serve it with [`crate::serve`], which attaches a [`crate::Peer`] to each
/// connection. Served any other way, requests carry no peer and are treated
/// like TCP ones: they need the bearer token.
pub fn app(api: Arc<dyn SandboxApi>, opts: ServerOptions) -> Router {
    let state = AppState {
        metrics: Arc::new(crate::metrics::Metrics::new(&api)),
        api,
        opts: Arc::new(opts),
    };
    let api = table()
        .router
        .fallback(no_such_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .layer(middleware::map_request(guard_body));
    // The dashboard's static files are outside authentication: they hold no
    // data, and the page sends the caller's token with its API calls.
    crate::dashboard::router()
        .merge(api)
        .layer(middleware::from_fn(log_internal_errors))
        .layer(middleware::from_fn(catch_panic))
        .with_state(state)
}

/// A request body may not stall: the connection's own deadlines never cut
/// a request in flight (`crate::conn`), so a body that stops arriving would
/// hold its connection, and its place under the listener's cap, for good.
/// One that sends nothing for [`crate::gateway::body::BODY_IDLE`] while
/// awaited ends in an error, which the handler's extractor answers (4xx).
async fn guard_body(req: axum::extract::Request) -> axum::extract::Request {
    use crate::gateway::body::{Guarded, BODY_IDLE};
    req.map(|b| axum::body::Body::new(Guarded::new(b, BODY_IDLE)))
}

/// Every (method, path) the router serves, in the router's path syntax.
pub fn route_table() -> Vec<(Method, &'static str)> {
    table().table
}

fn table() -> Routes {
    use events::*;
    use exec::*;
    use files::*;
    use pools::*;
    use processes::*;
    use sandboxes::*;
    use templates::*;
    use tenancy::*;
    const SANDBOX: &str = "/v1/sandboxes/{id}";
    const PROCESSES: &str = "/v1/sandboxes/{id}/processes";
    const FILES: &str = "/v1/sandboxes/{id}/files";
    const ARCHIVE: &str = "/v1/sandboxes/{id}/archive";
    const TENANT: &str = "/v1/tenants/{name}";
    const PORT: &str = "/v1/sandboxes/{id}/ports/{port}";
    const OVERRIDE: &str = "/v1/sandboxes/{id}/overrides/{service}";
    const ROUTE: &str = "/v1/routes/{name}";
    Routes::default()
        .add(Method::GET, "/healthz", get(healthz))
        .add(Method::GET, "/openapi.json", get(openapi_json))
        .add(Method::GET, "/metrics", get(metrics::metrics))
        .add(Method::POST, "/v1/sandboxes", post(create_sandbox))
        .add(Method::GET, "/v1/sandboxes", get(list_sandboxes))
        .add(Method::GET, SANDBOX, get(get_sandbox))
        .add(Method::DELETE, SANDBOX, delete(destroy_sandbox))
        .add(Method::POST, "/v1/sandboxes/{id}/exec", post(exec))
        .add(Method::POST, "/v1/run", post(run::run))
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/keepalive",
            post(keepalive),
        )
        .add(
            Method::GET,
            "/v1/sandboxes/{id}/egress",
            get(crate::egress::get_egress),
        )
        .add(
            Method::PATCH,
            "/v1/sandboxes/{id}/egress",
            patch(crate::egress::patch_egress),
        )
        .add(Method::POST, PROCESSES, post(start_process))
        .add(Method::GET, PROCESSES, get(list_processes))
        .add(
            Method::GET,
            "/v1/sandboxes/{id}/services",
            get(list_services),
        )
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/processes/{handle}/wait",
            post(wait_process),
        )
        .add(
            Method::GET,
            "/v1/sandboxes/{id}/processes/{handle}/output",
            get(process_output),
        )
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/processes/{handle}/kill",
            post(kill_process),
        )
        .add(Method::GET, FILES, get(read_file))
        .add(Method::PUT, FILES, put(write_file))
        .add(Method::DELETE, FILES, delete(remove_file))
        .add(Method::GET, "/v1/sandboxes/{id}/files/stat", get(stat_file))
        .add(Method::GET, "/v1/sandboxes/{id}/files/list", get(list_dir))
        .add(Method::POST, "/v1/sandboxes/{id}/files/mkdir", post(mkdir))
        .add(
            Method::POST,
            "/v1/sandboxes/{id}/files/rename",
            post(rename),
        )
        .add(Method::PUT, ARCHIVE, put(upload_archive))
        .add(Method::GET, ARCHIVE, get(download_archive))
        .add(
            Method::GET,
            "/v1/sandboxes/{id}/artifacts",
            get(crate::artifacts::list_artifacts),
        )
        .add(
            Method::GET,
            "/v1/sandboxes/{id}/artifacts/{name}",
            get(crate::artifacts::get_artifact),
        )
        .add(Method::GET, "/v1/events", get(list_events))
        .add(Method::GET, "/v1/sandboxes/{id}/audit", get(list_audit))
        .add(Method::GET, "/v1/pools", get(list_pools))
        .add(Method::PUT, "/v1/pools/{name}", put(set_pool))
        .add(Method::POST, "/v1/pools/{name}/drain", post(drain_pool))
        .add(Method::GET, "/v1/templates", get(list_templates))
        .add(Method::POST, "/v1/templates", post(build_template))
        .add(Method::GET, "/v1/templates/{name}", get(get_template))
        .add(
            Method::DELETE,
            "/v1/templates/{name}",
            delete(remove_template),
        )
        .add(Method::GET, "/v1/tenants", get(list_tenants))
        .add(Method::GET, TENANT, get(get_tenant))
        .add(Method::PUT, TENANT, put(put_tenant))
        .add(Method::DELETE, TENANT, delete(delete_tenant))
        .add(Method::POST, "/v1/keys", post(create_key))
        .add(Method::GET, "/v1/keys", get(list_keys))
        .add(Method::DELETE, "/v1/keys/{id}", delete(revoke_key))
        .add(Method::GET, "/v1/sandboxes/{id}/usage", get(observe::usage))
        .add(Method::GET, "/v1/stats", get(observe::stats))
        .add(
            Method::GET,
            "/v1/sandboxes/{id}/ports",
            get(ports::list_ports),
        )
        .add(Method::PUT, PORT, put(ports::expose_port))
        .add(Method::DELETE, PORT, delete(ports::unexpose_port))
        .add(
            Method::GET,
            "/v1/sandboxes/{id}/ports/{port}/connect",
            get(forward::connect_port),
        )
        .add(Method::PUT, OVERRIDE, put(ports::set_override))
        .add(Method::DELETE, OVERRIDE, delete(ports::remove_override))
        .add(Method::GET, "/v1/routes", get(ports::list_routes))
        .add(Method::PUT, ROUTE, put(ports::put_route))
        .add(Method::DELETE, ROUTE, delete(ports::delete_route))
}

/// A router under construction plus the list of what it serves.
#[derive(Default)]
struct Routes {
    router: Router<AppState>,
    table: Vec<(Method, &'static str)>,
}

impl Routes {
    /// Adds one method on one path. `method` must be the method `route`
    /// serves; the OpenAPI test catches a mismatch.
    fn add(
        mut self,
        method: Method,
        path: &'static str,
        route: axum::routing::MethodRouter<AppState>,
    ) -> Self {
        self.router = self.router.route(path, route);
        self.table.push((method, path));
        self
    }
}

/// `GET /healthz`: the daemon is up and serving.
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, description = "The daemon is serving.", body = Health)))]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health { ok: true })
}

/// The body of `GET /healthz`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct Health {
    pub ok: bool,
}

/// `GET /openapi.json`: this API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "The OpenAPI document.", body = Object)))]
pub(crate) async fn openapi_json() -> impl IntoResponse {
    Json(openapi::document())
}
