//! `/v1/events` and `/v1/sandboxes/{id}/audit`: what happened, and who asked.

use axum::extract::State;
use axum::Json;
use mayfly_types::{ApiError, Event, ExecAudit};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Who;
use crate::extract::{QueryParams, SandboxPath};
use crate::sandboxes::IdParam;
use crate::{AppError, AppState};

/// How many events one page holds when `limit` is absent.
const DEFAULT_EVENT_LIMIT: u32 = 100;
/// The largest page of events one request may ask for.
const MAX_EVENT_LIMIT: u32 = 10_000;

/// `?since=N&limit=M` on `GET /v1/events`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Only events with a sequence number above this (0 when absent).
    since: Option<i64>,
    /// At most this many events (100 when absent, at most 10000).
    limit: Option<u32>,
}

/// Lifecycle events, oldest first, after sequence number `since`: those of
/// the caller's tenant's sandboxes, unless the caller is an admin.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(EventsQuery),
    responses(
        (status = 200, body = Vec<Event>),
        (status = 400, description = "Bad query string.", body = ApiError),
    ))]
pub(crate) async fn list_events(
    State(s): State<AppState>,
    Who(caller): Who,
    QueryParams(q): QueryParams<EventsQuery>,
) -> Result<Json<Vec<Event>>, AppError> {
    let since = q.since.unwrap_or(0);
    if since < 0 {
        return Err(AppError::invalid(format!(
            "since = {since} is negative; sequence numbers start at 1"
        )));
    }
    let limit = q.limit.unwrap_or(DEFAULT_EVENT_LIMIT);
    if !(1..=MAX_EVENT_LIMIT).contains(&limit) {
        return Err(AppError::invalid(format!(
            "limit = {limit} is out of range; allowed is 1..={MAX_EVENT_LIMIT}"
        )));
    }
    if caller.admin {
        Ok(Json(s.api.events(since, limit).await?))
    } else {
        Ok(Json(
            s.api.tenant_events(&caller.tenant, since, limit).await?,
        ))
    }
}

/// The exec audit trail of one sandbox: argv, exit, duration, bytes, caller.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/audit", tag = "events", params(IdParam),
    responses(
        (status = 200, body = Vec<ExecAudit>),
        (status = 400, description = "Malformed sandbox id.", body = ApiError),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn list_audit(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<Vec<ExecAudit>>, AppError> {
    Ok(Json(s.api.audit(&id).await?))
}
