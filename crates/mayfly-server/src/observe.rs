//! `GET /v1/sandboxes/{id}/usage` and `GET /v1/stats`: what a sandbox uses
//! now, and the evidence over a window of time.

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use mayfly_types::{ApiError, SandboxUsage, StatsReport};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Who;
use crate::extract::{truncate, QueryParams, SandboxPath};
use crate::sandboxes::IdParam;
use crate::{AppError, AppState};

/// The window when none is asked for.
const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);
/// The longest window a report may cover.
const MAX_WINDOW: Duration = Duration::from_secs(90 * 24 * 3600);
/// The longest `task` label value (labels are capped at 1024 bytes).
const MAX_TASK: usize = 1024;

/// What a sandbox uses now: CPU seconds, memory (current, peak, limit),
/// pids, OOM kills, and the disk its writable layers take.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/usage", tag = "sandboxes", params(IdParam),
    responses(
        (status = 200, body = SandboxUsage),
        (status = 400, description = "Malformed sandbox id.", body = ApiError),
        (status = 404, description = "No such sandbox.", body = ApiError),
        (status = 409, description = "The sandbox is not live.", body = ApiError),
    ))]
pub(crate) async fn usage(
    State(s): State<AppState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxUsage>, AppError> {
    Ok(Json(s.api.usage(&id).await?))
}

/// `?window=1h&task=LABEL` on `GET /v1/stats`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct StatsParams {
    /// How far back the report reaches from now (`90s`, `30m`, `1h`, `7d`;
    /// 1h when absent, at most 90 days).
    window: Option<String>,
    /// Only sandboxes whose `task` label is this.
    task: Option<String>,
}

/// Spin-up p50/p95/p99 (cold and pool), exec counts, and iterations per
/// five-minute window grouped by the sandboxes' `task` label.
#[utoipa::path(get, path = "/v1/stats", tag = "events", params(StatsParams),
    responses(
        (status = 200, body = StatsReport),
        (status = 400, description = "Bad window or task.", body = ApiError),
    ))]
pub(crate) async fn stats(
    State(s): State<AppState>,
    Who(caller): Who,
    QueryParams(q): QueryParams<StatsParams>,
) -> Result<Json<StatsReport>, AppError> {
    let window = match q.window.as_deref() {
        None => DEFAULT_WINDOW,
        Some(w) => parse_window(w)?,
    };
    if let Some(task) = &q.task {
        if task.is_empty() || task.len() > MAX_TASK {
            return Err(AppError::invalid(format!(
                "task must be 1 to {MAX_TASK} bytes long"
            )));
        }
    }
    Ok(Json(s.api.stats(window, q.task.as_deref(), &caller).await?))
}

/// `1h`, `30m`, `90s`, `7d`, `1h30m`: between one second and 90 days.
fn parse_window(w: &str) -> Result<Duration, AppError> {
    let bad = |why: &str| {
        AppError::invalid(format!(
            "window `{}` {why}; use a duration like 90s, 30m, 1h or 7d",
            truncate(w, 64)
        ))
    };
    let d = humantime::parse_duration(w.trim()).map_err(|_| bad("is not a duration"))?;
    if d < Duration::from_secs(1) || d > MAX_WINDOW {
        return Err(bad("is out of range (1s to 90d)"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_as_durations_within_bounds() {
        assert_eq!(parse_window("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_window("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_window("7d").unwrap(), Duration::from_secs(7 * 86400));
        for bad in ["", "soon", "-1h", "0s", "500ms", "91d", "1h;DROP"] {
            let e = parse_window(bad).unwrap_err();
            assert_eq!(e.status(), http::StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
