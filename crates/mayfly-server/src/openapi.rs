//! The OpenAPI document served at `/openapi.json`.

use std::sync::OnceLock;

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi as OpenApiDoc;
use utoipa::{Modify, OpenApi};

use crate::{
    events, exec, files, forward, metrics, observe, pools, ports, processes, routes, run,
    sandboxes, tenancy,
};

/// Mayfly's API description. Every handler is listed; a test checks the
/// document against the route table.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Mayfly",
        description = "Ephemeral isolated sandboxes. Served on a unix socket (no token; the \
            socket's mode guards it) and optionally on TCP, where every request needs \
            `Authorization: Bearer <token>`. An API key (`Bearer mfk_…`, on either) acts \
            for its tenant, which sees only its own sandboxes and is held to its quotas \
            (429 with `Retry-After` past one). Every error is JSON `{code, message}`.",
    ),
    paths(
        routes::healthz,
        routes::openapi_json,
        metrics::metrics,
        sandboxes::create_sandbox,
        sandboxes::list_sandboxes,
        sandboxes::get_sandbox,
        sandboxes::destroy_sandbox,
        sandboxes::keepalive,
        crate::egress::get_egress,
        crate::egress::patch_egress,
        exec::exec,
        run::run,
        processes::start_process,
        processes::list_processes,
        processes::list_services,
        processes::wait_process,
        processes::process_output,
        processes::kill_process,
        files::read_file,
        files::write_file,
        files::remove_file,
        files::stat_file,
        files::list_dir,
        files::mkdir,
        files::rename,
        files::upload_archive,
        files::download_archive,
        crate::artifacts::list_artifacts,
        crate::artifacts::get_artifact,
        events::list_events,
        events::list_audit,
        pools::list_pools,
        pools::set_pool,
        pools::drain_pool,
        crate::templates::list_templates,
        crate::templates::build_template,
        crate::templates::get_template,
        crate::templates::remove_template,
        tenancy::list_tenants,
        tenancy::get_tenant,
        tenancy::put_tenant,
        tenancy::delete_tenant,
        tenancy::create_key,
        tenancy::list_keys,
        tenancy::revoke_key,
        observe::usage,
        observe::stats,
        ports::list_ports,
        ports::expose_port,
        ports::unexpose_port,
        forward::connect_port,
        ports::set_override,
        ports::remove_override,
        ports::list_routes,
        ports::put_route,
        ports::delete_route,
    ),
    components(schemas(mayfly_types::ErrorCode, mayfly_types::ExitStatus)),
    modifiers(&BearerOnTcp),
    tags(
        (name = "meta", description = "Health, metrics and this document."),
        (name = "sandboxes", description = "Sandbox lifecycle."),
        (name = "exec", description = "Foreground commands, buffered or streamed."),
        (name = "processes", description = "Background commands."),
        (name = "files", description = "Files and tar archives inside a sandbox."),
        (name = "artifacts", description = "Files, trees and the workspace patch a sandbox left behind, kept after it is destroyed."),
        (name = "events", description = "Lifecycle events, the exec audit trail, and stats."),
        (name = "pools", description = "Warm pools of booted, never-used sandboxes."),
        (name = "templates", description = "Named templates: YAML specs built into cached layers."),
        (name = "tenants", description = "Tenants, their quotas, and API keys (admin only)."),
        (name = "gateway", description = "Exposed ports, preview tokens, TCP forwarding, routes and overrides."),
    ),
)]
pub struct ApiDoc;

/// Declares the bearer scheme TCP listeners require.
struct BearerOnTcp;

impl Modify for BearerOnTcp {
    fn modify(&self, doc: &mut OpenApiDoc) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The daemon's token (TCP only), or an API key `mfk_…` (either listener).",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document, built once.
pub(crate) fn document() -> &'static OpenApiDoc {
    static DOC: OnceLock<OpenApiDoc> = OnceLock::new();
    DOC.get_or_init(ApiDoc::openapi)
}

/// Raw bytes in a request or response body (files, tar archives), for the
/// document: `{type: string, format: binary}` rather than an integer array.
pub(crate) struct Binary;

impl utoipa::PartialSchema for Binary {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::Binary,
            )))
            .description(Some("Raw bytes."))
            .into()
    }
}

impl utoipa::ToSchema for Binary {}
