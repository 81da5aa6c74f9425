//! Observability: the live event stream, metrics, usage and stats.

use http::Method;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use mayfly_types::{ApiError, Event, SandboxId, SandboxUsage, StatsReport};

use crate::sse::Parser;
use crate::{encode, Body, Client, ClientError};

impl Client {
    /// `GET /v1/events` with `Accept: text/event-stream`: the stored events
    /// after `since` (or, with `None`, none of them), then each new one as
    /// the daemon commits it; read them with [`EventStream::next_event`].
    pub async fn event_stream(&self, since: Option<i64>) -> Result<EventStream, ClientError> {
        let path = match since {
            Some(s) => format!("/v1/events?since={s}"),
            None => "/v1/events".to_owned(),
        };
        let (resp, what) = self
            .call_for_events(Method::GET, &path, Body::Empty)
            .await?;
        Ok(EventStream {
            body: resp.into_body(),
            parser: Parser::default(),
            request: what,
        })
    }

    /// `GET /metrics`: the daemon's metrics, OpenMetrics text.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let bytes = self.bytes(Method::GET, "/metrics").await?;
        String::from_utf8(bytes.to_vec()).map_err(|_| ClientError::Protocol {
            request: "GET /metrics".to_owned(),
            reason: "the metrics are not UTF-8".to_owned(),
        })
    }

    /// `GET /v1/sandboxes/{id}/usage`: what a live sandbox uses now.
    pub async fn usage(&self, id: &SandboxId) -> Result<SandboxUsage, ClientError> {
        let p = format!("/v1/sandboxes/{id}/usage");
        self.json(Method::GET, &p, Body::Empty).await
    }

    /// `GET /v1/stats?window=W&task=T`: spin-up percentiles, exec counts and
    /// iterations per five-minute window over `window` (e.g. `1h`; the
    /// daemon's default when `None`).
    pub async fn stats(
        &self,
        window: Option<&str>,
        task: Option<&str>,
    ) -> Result<StatsReport, ClientError> {
        let mut q = Vec::new();
        if let Some(w) = window {
            q.push(format!("window={}", encode(w)));
        }
        if let Some(t) = task {
            q.push(format!("task={}", encode(t)));
        }
        let p = if q.is_empty() {
            "/v1/stats".to_owned()
        } else {
            format!("/v1/stats?{}", q.join("&"))
        };
        self.json(Method::GET, &p, Body::Empty).await
    }
}

/// The daemon's lifecycle events as it commits them, in order, each once.
#[derive(Debug)]
pub struct EventStream {
    body: Incoming,
    parser: Parser,
    request: String,
}

impl EventStream {
    /// The next event, waiting for it; `None` when the daemon ends the
    /// stream (it is shutting down). Reconnect with the last `seq` seen as
    /// `since` to go on without a gap.
    pub async fn next_event(&mut self) -> Result<Option<Event>, ClientError> {
        loop {
            while let Some(raw) = self.parser.next().map_err(|r| self.protocol(r))? {
                match raw.name.as_str() {
                    "" | "message" => {
                        let ev = serde_json::from_str(&raw.data)
                            .map_err(|e| self.protocol(&format!("bad event: {e}")))?;
                        return Ok(Some(ev));
                    }
                    "error" => {
                        let error: ApiError = serde_json::from_str(&raw.data)
                            .map_err(|e| self.protocol(&format!("bad error event: {e}")))?;
                        return Err(ClientError::Api {
                            status: error.code.http_status(),
                            error,
                        });
                    }
                    _ => {}
                }
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.parser.push(&data);
                    }
                }
                Some(Err(e)) => {
                    return Err(ClientError::Transport {
                        request: self.request.clone(),
                        source: Box::new(e),
                    })
                }
                None => return Ok(None),
            }
        }
    }

    fn protocol(&self, reason: &str) -> ClientError {
        ClientError::Protocol {
            request: self.request.clone(),
            reason: reason.to_owned(),
        }
    }
}
