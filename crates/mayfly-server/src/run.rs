//! `POST /v1/run`: one command in a sandbox made for it.
//!
//! The daemon creates the sandbox (a warm pool serves it when one fits),
//! starts the command and streams it exactly like a streamed exec, with one
//! `sandbox` event first (the new sandbox's `SandboxInfo`); the sandbox's id
//! is also in the `X-Mayfly-Sandbox` header. The sandbox is destroyed as soon
//! as the stream ends: after the `exit` event, or when the client goes away
//! mid-run. One request instead of create, exec and destroy saves two round
//! trips on the path of `mayfly run`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use http::HeaderValue;
use mayfly_engine::{Caller, SandboxApi};
use mayfly_types::{ApiError, RunRequest, SandboxId};

use crate::auth::Who;
use crate::exec::{sse_events, KEEP_ALIVE};
use crate::extract::JsonBody;
use crate::metrics::ExecTimer;
use crate::{AppError, AppState};

/// The response header naming the sandbox a run made.
pub const SANDBOX_HEADER: &str = "x-mayfly-sandbox";

/// Run one command in a new sandbox, streamed as SSE; the sandbox is
/// destroyed when the command ends.
#[utoipa::path(post, path = "/v1/run", tag = "exec",
    request_body(content = RunRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The sandbox is up and the command started: an SSE \
            stream of one `sandbox` event (a SandboxInfo), then `stdout`/`stderr` events \
            (base64 data) and one `exit` event (an ExecResult with empty stdout/stderr), or \
            `error` (an ApiError) if the sandbox died first. The sandbox's id is also in the \
            `X-Mayfly-Sandbox` header. The sandbox is destroyed when the stream ends.",
            content((String = "text/event-stream"))),
        (status = 400, description = "Invalid request.", body = ApiError),
        (status = 415, description = "Not `application/json`.", body = ApiError),
        (status = 422, description = "The command could not be started.", body = ApiError),
        (status = 403, description = "Refused for good: a tenant key naming a host path \
            (a `dir:` template, a local repository), or a quota no wait can satisfy (zero, \
            or smaller than the sandbox alone).", body = ApiError),
        (status = 429, description = "A tenant quota or a host limit was reached; \
            `Retry-After` says when to try again.", body = ApiError),
    ))]
pub(crate) async fn run(
    State(s): State<AppState>,
    Who(caller): Who,
    JsonBody(req): JsonBody<RunRequest>,
) -> Result<Response, AppError> {
    let timer = ExecTimer::start(&s.metrics);
    let info = s.api.create(req.sandbox, &caller).await?;
    // From here on the sandbox goes when this guard does: on an error
    // below, or once the stream below has ended or been dropped.
    let guard = DestroyOnDrop {
        api: s.api.clone(),
        id: info.id.clone(),
        caller,
    };
    let rx = s.api.exec_stream(&info.id, req.exec, &guard.caller).await?;
    let first = SseEvent::default()
        .event("sandbox")
        .json_data(&info)
        .map_err(|e| AppError::internal(format!("cannot encode the sandbox: {e}")))?;
    let events = futures_util::stream::once(async move { Ok::<_, Infallible>(first) })
        .chain(sse_events(rx, timer))
        .map(move |ev| {
            let _keep = &guard;
            ev
        });
    let mut resp = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    if let Ok(v) = HeaderValue::from_str(info.id.as_str()) {
        resp.headers_mut().insert(SANDBOX_HEADER, v);
    }
    Ok(resp)
}

/// Destroys a run's sandbox when dropped, in the background.
struct DestroyOnDrop {
    api: Arc<dyn SandboxApi>,
    id: SandboxId,
    caller: Caller,
}

impl Drop for DestroyOnDrop {
    fn drop(&mut self) {
        let (api, id, caller) = (self.api.clone(), self.id.clone(), self.caller.clone());
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::error!(%id, "no runtime to destroy a run's sandbox on; its TTL will");
            return;
        };
        rt.spawn(async move {
            if let Err(e) = api.destroy(&id, &caller).await {
                tracing::warn!(%id, error = %e, "destroying a run's sandbox failed");
            }
        });
    }
}
