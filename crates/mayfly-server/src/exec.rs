//! `POST /v1/sandboxes/{id}/exec`: run a command, buffered or streamed.
//!
//! With `Accept: text/event-stream` (or `?stream=true`) the answer is a
//! server-sent event stream, written as the engine produces output:
//!
//! ```text
//! event: stdout
//! data: <base64 bytes>
//!
//! event: stderr
//! data: <base64 bytes>
//!
//! event: exit
//! data: {"exit_code":0,…,"stdout":"","stderr":""}
//! ```
//!
//! `exit` is always last. If the engine's stream ends without an exit (the
//! sandbox died underneath the command), the last event is instead `error`
//! with an `ApiError` JSON body.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use futures_util::Stream;
use http::header::ACCEPT;
use http::HeaderMap;
use mayfly_engine::ExecStream;
use mayfly_types::{ApiError, Bytes64, ErrorCode, ExecEvent, ExecRequest, ExecResult};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Who;
use crate::extract::{JsonBody, QueryParams, SandboxPath};
use crate::metrics::ExecTimer;
use crate::sandboxes::IdParam;
use crate::{AppError, AppState};

/// A comment line this often keeps idle streams alive through proxies.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Query parameters of `POST …/exec`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ExecQuery {
    /// Stream the output as server-sent events (same as `Accept: text/event-stream`).
    #[serde(default)]
    stream: bool,
}

/// Run a command in a sandbox and return its result, or stream it as SSE.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "exec", params(IdParam, ExecQuery),
    request_body(content = ExecRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The command ran. With `Accept: text/event-stream`, \
            an SSE stream of `stdout`/`stderr` events (base64 data) ending with one `exit` \
            event (an ExecResult with empty stdout/stderr), or `error` (an ApiError) if the \
            sandbox died first.",
            content(
                (ExecResult = "application/json"),
                (String = "text/event-stream"),
            )),
        (status = 400, description = "Invalid request.", body = ApiError),
        (status = 404, description = "No such sandbox.", body = ApiError),
        (status = 409, description = "The sandbox is not ready.", body = ApiError),
        (status = 415, description = "Not `application/json`.", body = ApiError),
        (status = 422, description = "The command could not be started.", body = ApiError),
    ))]
pub(crate) async fn exec(
    State(s): State<AppState>,
    Who(caller): Who,
    SandboxPath(id): SandboxPath,
    QueryParams(q): QueryParams<ExecQuery>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<Response, AppError> {
    let timer = ExecTimer::start(&s.metrics);
    if q.stream || accepts_event_stream(&headers) {
        let rx = s.api.exec_stream(&id, req, &caller).await?;
        Ok(Sse::new(sse_events(rx, timer))
            .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
            .into_response())
    } else {
        let result = s.api.exec(&id, req, &caller).await?;
        timer.done();
        Ok(Json(result).into_response())
    }
}

/// Whether any media range in `Accept` is `text/event-stream`.
pub(crate) fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            range
                .split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

/// Turns the engine's channel into SSE events, one per engine event, as they
/// arrive. Ends after `exit` (the exec's round trip, timed by `timer`), or
/// with `error` if the channel closes first.
pub(crate) fn sse_events(
    rx: ExecStream,
    timer: ExecTimer,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    futures_util::stream::unfold(Some((rx, timer)), |state| async move {
        let (mut rx, timer) = state?;
        let event = match rx.recv().await {
            Some(ExecEvent::Stdout(b)) => {
                SseEvent::default().event("stdout").data(STANDARD.encode(b))
            }
            Some(ExecEvent::Stderr(b)) => {
                SseEvent::default().event("stderr").data(STANDARD.encode(b))
            }
            Some(ExecEvent::Exit(result)) => {
                timer.done();
                return Some((Ok(exit_event(result)), None));
            }
            None => {
                let e = ApiError::new(
                    ErrorCode::Unavailable,
                    "the command's output ended without an exit status; the sandbox may have died",
                );
                return Some((Ok(error_event(&e)), None));
            }
        };
        Some((Ok(event), Some((rx, timer))))
    })
}

fn exit_event(mut result: ExecResult) -> SseEvent {
    // The output already went out as events; the exit event carries only status.
    result.stdout = Bytes64::default();
    result.stderr = Bytes64::default();
    match SseEvent::default().event("exit").json_data(&result) {
        Ok(ev) => ev,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode an exec result");
            error_event(&ApiError::new(
                ErrorCode::Internal,
                "cannot encode the exec result",
            ))
        }
    }
}

fn error_event(e: &ApiError) -> SseEvent {
    let data = serde_json::to_string(e)
        .unwrap_or_else(|_| r#"{"code":"internal","message":"internal error"}"#.to_owned());
    SseEvent::default().event("error").data(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn event_stream_is_found_among_several_media_ranges() {
        let mut h = HeaderMap::new();
        h.insert(
            ACCEPT,
            HeaderValue::from_static("application/json;q=0.5, Text/Event-Stream"),
        );
        assert!(accepts_event_stream(&h));
        h.insert(ACCEPT, HeaderValue::from_static("application/json"));
        assert!(!accepts_event_stream(&h));
        assert!(!accepts_event_stream(&HeaderMap::new()));
    }
}
