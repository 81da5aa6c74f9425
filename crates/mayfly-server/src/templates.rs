//! `/v1/templates`: build, list, inspect and remove named templates.
//!
//! A build answers with the built template's `TemplateInfo`, or, with
//! `Accept: text/event-stream`, streams `progress` events (a
//! `BuildProgress` each) and ends with one `built` (the `TemplateInfo`) or
//! `error` (an `ApiError`) event.

use std::convert::Infallible;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use http::HeaderMap;
use mayfly_engine::TemplateApi;
use mayfly_types::{ApiError, BuildRequest, ErrorCode, TemplateInfo, TemplateList};

use crate::auth::Who;
use crate::exec::{accepts_event_stream, KEEP_ALIVE};
use crate::extract::{JsonBody, TemplatePath};
use crate::{AppError, AppState};

/// The `{name}` of a template.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct TemplateNameParam {
    /// `[a-z0-9][a-z0-9._-]*`, at most 63 bytes.
    name: String,
}

fn api(s: &AppState) -> Result<&dyn TemplateApi, AppError> {
    s.api.templates().ok_or_else(|| {
        AppError::from(mayfly_engine::EngineError::Unavailable(
            "this daemon has no template registry".into(),
        ))
    })
}

/// Build (or rebuild) a template from its YAML text. Unchanged steps are
/// served from the step cache. Admin only.
#[utoipa::path(post, path = "/v1/templates", tag = "templates",
    request_body(content = BuildRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Built. With `Accept: text/event-stream`, an SSE stream \
            of `progress` events (BuildProgress) ending with one `built` (TemplateInfo) or \
            `error` (ApiError) event.",
            content((TemplateInfo = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "An invalid template file (file, field, line and \
            reason in the message) or a failed step.", body = ApiError),
        (status = 403, description = "Not an admin.", body = ApiError),
        (status = 415, description = "Not `application/json`.", body = ApiError),
    ))]
pub(crate) async fn build_template(
    State(s): State<AppState>,
    Who(caller): Who,
    headers: HeaderMap,
    JsonBody(req): JsonBody<BuildRequest>,
) -> Result<Response, AppError> {
    api(&s)?;
    if !accepts_event_stream(&headers) {
        let info = api(&s)?.template_build(req, &caller, None).await?;
        return Ok(Json(info).into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let state = s.clone();
    let build = tokio::spawn(async move {
        match state.api.templates() {
            Some(t) => t.template_build(req, &caller, Some(tx)).await,
            None => Err(mayfly_engine::EngineError::Unavailable(
                "no registry".into(),
            )),
        }
    });
    let progress = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(|p| {
        Ok::<_, Infallible>(
            SseEvent::default()
                .event("progress")
                .data(serde_json::to_string(&p).unwrap_or_default()),
        )
    });
    let end = futures_util::stream::once(async move {
        let event = match build.await {
            Ok(Ok(info)) => SseEvent::default()
                .event("built")
                .data(serde_json::to_string(&info).unwrap_or_default()),
            Ok(Err(e)) => {
                if e.code() == ErrorCode::Internal {
                    tracing::error!("template build failed: {e}");
                }
                SseEvent::default()
                    .event("error")
                    .data(serde_json::to_string(&e.to_api()).unwrap_or_default())
            }
            Err(e) => SseEvent::default().event("error").data(
                serde_json::to_string(&ApiError::new(ErrorCode::Internal, e.to_string()))
                    .unwrap_or_default(),
            ),
        };
        Ok::<_, Infallible>(event)
    });
    Ok(Sse::new(progress.chain(end))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}

/// The built templates.
#[utoipa::path(get, path = "/v1/templates", tag = "templates",
    responses(
        (status = 200, body = TemplateList),
        (status = 401, description = "A wrong or revoked API key.", body = ApiError),
    ))]
pub(crate) async fn list_templates(
    State(s): State<AppState>,
) -> Result<Json<TemplateList>, AppError> {
    Ok(Json(TemplateList {
        templates: api(&s)?.template_list().await?,
    }))
}

/// One built template: its layers, config, size and spec.
#[utoipa::path(get, path = "/v1/templates/{name}", tag = "templates", params(TemplateNameParam),
    responses(
        (status = 200, body = TemplateInfo),
        (status = 404, description = "No such template.", body = ApiError),
    ))]
pub(crate) async fn get_template(
    State(s): State<AppState>,
    TemplatePath(name): TemplatePath,
) -> Result<Json<TemplateInfo>, AppError> {
    Ok(Json(api(&s)?.template_get(&name).await?))
}

/// Remove a template; layers no other template or live sandbox uses are
/// deleted. Admin only.
#[utoipa::path(delete, path = "/v1/templates/{name}", tag = "templates", params(TemplateNameParam),
    responses(
        (status = 200, body = TemplateInfo),
        (status = 403, description = "Not an admin.", body = ApiError),
        (status = 404, description = "No such template.", body = ApiError),
    ))]
pub(crate) async fn remove_template(
    State(s): State<AppState>,
    Who(caller): Who,
    TemplatePath(name): TemplatePath,
) -> Result<Json<TemplateInfo>, AppError> {
    Ok(Json(api(&s)?.template_remove(&name, &caller).await?))
}
