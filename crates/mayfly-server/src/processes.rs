//! `/v1/sandboxes/{id}/processes`: background processes.

use axum::extract::State;
use axum::Json;
use http::StatusCode;
use mayfly_types::{
    ApiError, ProcessInfo, ProcessOutput, SignalRequest, StartProcessRequest, MAX_TIMEOUT_MS,
};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Who;
use crate::extract::{JsonBody, OptionalJsonBody, ProcessPath, QueryParams, SandboxPath};
use crate::sandboxes::IdParam;
use crate::{AppError, AppState};

/// SIGKILL, what `kill` sends when the request names no signal.
const SIGKILL: i32 = 9;
/// The highest signal number Linux has (SIGRTMAX).
const MAX_SIGNAL: i32 = 64;

/// The `{id}` and `{handle}` path parameters, for the OpenAPI document.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct ProcessParams {
    /// The sandbox id.
    #[param(example = "mf-abcdefghjkmn")]
    id: String,
    /// The process handle returned when it was started.
    handle: u64,
}

/// `?timeout_ms=N` on `POST …/wait`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct WaitQuery {
    /// Give up waiting after this many milliseconds and return the current
    /// state; wait until exit when absent. At most 24 h.
    timeout_ms: Option<u64>,
}

/// Start a command in the background.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes", tag = "processes", params(IdParam),
    request_body(content = StartProcessRequest, content_type = "application/json"),
    responses(
        (status = 201, body = ProcessInfo),
        (status = 400, description = "Invalid request.", body = ApiError),
        (status = 404, description = "No such sandbox.", body = ApiError),
        (status = 409, description = "The sandbox is not ready.", body = ApiError),
        (status = 422, description = "The command could not be started.", body = ApiError),
    ))]
pub(crate) async fn start_process(
    State(s): State<AppState>,
    Who(caller): Who,
    SandboxPath(id): SandboxPath,
    JsonBody(req): JsonBody<StartProcessRequest>,
) -> Result<(StatusCode, Json<ProcessInfo>), AppError> {
    let info = s.api.start_process(&id, req, &caller).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// List a sandbox's background processes.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "processes", params(IdParam),
    responses(
        (status = 200, body = Vec<ProcessInfo>),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn list_processes(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<Vec<ProcessInfo>>, AppError> {
    Ok(Json(s.api.list_processes(&id).await?))
}

/// List the sandbox's services: state, restarts, the end of their log.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/services", tag = "processes", params(IdParam),
    responses(
        (status = 200, body = Vec<mayfly_types::ServiceInfo>),
        (status = 404, description = "No such sandbox.", body = ApiError),
    ))]
pub(crate) async fn list_services(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<Vec<mayfly_types::ServiceInfo>>, AppError> {
    Ok(Json(s.api.services(&id).await?))
}

/// Wait for a background process to exit, or for the timeout.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{handle}/wait", tag = "processes",
    params(ProcessParams, WaitQuery),
    responses(
        (status = 200, description = "The process's state when it exited or the wait timed out.",
            body = ProcessInfo),
        (status = 400, description = "Bad handle or timeout.", body = ApiError),
        (status = 404, description = "No such sandbox or process.", body = ApiError),
    ))]
pub(crate) async fn wait_process(
    State(s): State<AppState>,
    ProcessPath(id, handle): ProcessPath,
    QueryParams(q): QueryParams<WaitQuery>,
) -> Result<Json<ProcessInfo>, AppError> {
    if let Some(t) = q.timeout_ms.filter(|t| *t > MAX_TIMEOUT_MS) {
        return Err(AppError::invalid(format!(
            "timeout_ms = {t} is out of range; allowed is 0..={MAX_TIMEOUT_MS}"
        )));
    }
    Ok(Json(s.api.wait_process(&id, handle, q.timeout_ms).await?))
}

/// Read what a background process has written so far.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{handle}/output", tag = "processes",
    params(ProcessParams),
    responses(
        (status = 200, body = ProcessOutput),
        (status = 404, description = "No such sandbox or process.", body = ApiError),
    ))]
pub(crate) async fn process_output(
    State(s): State<AppState>,
    ProcessPath(id, handle): ProcessPath,
) -> Result<Json<ProcessOutput>, AppError> {
    Ok(Json(s.api.process_output(&id, handle).await?))
}

/// Send a signal to a background process (SIGKILL when the body is empty).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{handle}/kill", tag = "processes",
    params(ProcessParams),
    request_body(content = Option<SignalRequest>, content_type = "application/json"),
    responses(
        (status = 200, body = ProcessInfo),
        (status = 400, description = "Bad signal number.", body = ApiError),
        (status = 404, description = "No such sandbox or process.", body = ApiError),
    ))]
pub(crate) async fn kill_process(
    State(s): State<AppState>,
    ProcessPath(id, handle): ProcessPath,
    OptionalJsonBody(req): OptionalJsonBody<KillBody>,
) -> Result<Json<ProcessInfo>, AppError> {
    let signal = req.0.signal.unwrap_or(SIGKILL);
    if !(1..=MAX_SIGNAL).contains(&signal) {
        return Err(AppError::invalid(format!(
            "signal {signal} is out of range; allowed is 1..={MAX_SIGNAL}"
        )));
    }
    Ok(Json(s.api.signal_process(&id, handle, signal).await?))
}

/// A [`SignalRequest`] that defaults to "no signal named" for an empty body.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub(crate) struct KillBody(SignalRequest);

impl Default for KillBody {
    fn default() -> Self {
        KillBody(SignalRequest { signal: None })
    }
}
