//! `/v1/events` and `/v1/sandboxes/{id}/audit`: what happened, and who asked.
//!
//! `GET /v1/events` pages the stored events as JSON, or, with
//! `Accept: text/event-stream`, streams them as server-sent events: first
//! those stored after `since` (or the `Last-Event-ID` a reconnecting client
//! sends), then each new one as it commits, with no gap and no repeat (see
//! [`crate::feed`]). Each event's `id` is its sequence number and its `data`
//! an [`Event`] as JSON; comment lines keep an idle stream alive. Without
//! `since` or `Last-Event-ID`, the stream starts with the next event.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::Stream;
use http::HeaderMap;
use mayfly_types::{ApiError, ErrorCode, Event, ExecAudit};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Who;
use crate::exec::accepts_event_stream;
use crate::extract::{page_limit, truncate, QueryParams, SandboxPath};
use crate::feed::EventFeed;
use crate::listen::Stopping;
use crate::sandboxes::IdParam;
use crate::{AppError, AppState};

/// How many events one page holds when `limit` is absent.
const DEFAULT_EVENT_LIMIT: u32 = 100;
/// The largest page of events one request may ask for.
const MAX_EVENT_LIMIT: u32 = 10_000;
/// How often a quiet stream looks in the store for events that another
/// process (a daemonless run's reaper) wrote.
const STORE_POLL: Duration = Duration::from_secs(1);

/// `?since=N&limit=M` on `GET /v1/events`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Only events with a sequence number above this (JSON: 0 when absent;
    /// a stream without it starts with the next event).
    since: Option<i64>,
    /// At most this many events (100 when absent, at most 10000); JSON only.
    limit: Option<u32>,
}

/// Lifecycle events, oldest first, after sequence number `since`; or, with
/// `Accept: text/event-stream`, a stream of them that stays open.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(EventsQuery,
        ("Last-Event-ID" = Option<i64>, Header,
            description = "Stream only: resume after this sequence number (overrides `since`).")),
    responses(
        (status = 200, description = "A page of events as JSON; or, with `Accept: \
            text/event-stream`, server-sent events whose `id` is the sequence number and \
            whose `data` is an Event, first the stored ones after `since`, then each new \
            one as it is committed. A stream that cannot go on ends with an `error` event \
            (an ApiError).",
            content(
                (Vec<Event> = "application/json"),
                (String = "text/event-stream"),
            )),
        (status = 400, description = "Bad query string or Last-Event-ID.", body = ApiError),
        (status = 403, description = "The stream is for admins; other tenants page.", body = ApiError),
    ))]
pub(crate) async fn list_events(
    State(s): State<AppState>,
    Who(caller): Who,
    QueryParams(q): QueryParams<EventsQuery>,
    headers: HeaderMap,
    stopping: Option<Extension<Stopping>>,
) -> Result<Response, AppError> {
    let since = q.since;
    if let Some(since) = since.filter(|s| *s < 0) {
        return Err(AppError::invalid(format!(
            "since = {since} is negative; sequence numbers start at 1"
        )));
    }
    let limit = page_limit(q.limit, DEFAULT_EVENT_LIMIT, MAX_EVENT_LIMIT)?;
    if !accepts_event_stream(&headers) {
        // A tenant's caller pages its own sandboxes' events only.
        let page = if caller.admin {
            s.api.events(since.unwrap_or(0), limit).await?
        } else {
            s.api
                .tenant_events(&caller.tenant, since.unwrap_or(0), limit)
                .await?
        };
        return Ok(Json(page).into_response());
    }
    if !caller.admin {
        return Err(AppError::new(
            ErrorCode::PermissionDenied,
            "the live event stream carries every tenant's events and is for admin keys; \
             page your own with GET /v1/events?since=N",
        ));
    }
    let since = last_event_id(&headers)?.or(since);
    let feed = EventFeed::new(s.api.clone(), since)?;
    let stop = stopping.map(|Extension(Stopping(rx))| rx);
    Ok(Sse::new(sse_events(feed, stop))
        .keep_alive(KeepAlive::new().interval(s.opts.sse_keep_alive))
        .into_response())
}

/// The `Last-Event-ID` a reconnecting `EventSource` sends, if any.
fn last_event_id(headers: &HeaderMap) -> Result<Option<i64>, AppError> {
    let Some(v) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = v.to_str().unwrap_or("").trim();
    match text.parse::<i64>() {
        Ok(n) if n >= 0 => Ok(Some(n)),
        _ => Err(AppError::invalid(format!(
            "Last-Event-ID `{}` is not an event sequence number",
            truncate(text, 64)
        ))),
    }
}

/// The feed as SSE events; ends when the daemon stops serving (or the
/// engine goes away), or with an `error` event if the store fails.
fn sse_events(
    feed: EventFeed,
    stop: Option<tokio::sync::watch::Receiver<bool>>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    futures_util::stream::unfold(Some((feed, stop)), |state| async move {
        let (mut feed, mut stop) = state?;
        let next = match stop.as_mut() {
            Some(stop) => tokio::select! {
                r = feed.next(STORE_POLL) => r,
                _ = stop.wait_for(|stopped| *stopped) => return None,
            },
            None => feed.next(STORE_POLL).await,
        };
        match next {
            Ok(Some(ev)) => Some((Ok(event_frame(&ev)), Some((feed, stop)))),
            Ok(None) => None,
            Err(e) => {
                tracing::error!(error = %e, "an event stream failed");
                let body = ApiError::new(
                    ErrorCode::Internal,
                    "the event stream cannot go on; reconnect with Last-Event-ID",
                );
                let data = serde_json::to_string(&body).unwrap_or_default();
                Some((Ok(SseEvent::default().event("error").data(data)), None))
            }
        }
    })
}

fn event_frame(ev: &Event) -> SseEvent {
    // An Event always serializes; the fallback keeps the id anyway.
    let data = serde_json::to_string(ev).unwrap_or_else(|_| "{}".to_owned());
    SseEvent::default().id(ev.seq.to_string()).data(data)
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
