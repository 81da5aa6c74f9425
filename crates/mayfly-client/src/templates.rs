//! Named templates: build (streamed progress), list, inspect, remove.

use http::Method;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use mayfly_types::{ApiError, BuildProgress, BuildRequest, TemplateInfo, TemplateList};

use crate::sse::Parser;
use crate::{json_body, Body, Client, ClientError};

/// What a streamed build reports.
#[derive(Debug, Clone, PartialEq)]
pub enum BuildEvent {
    Progress(BuildProgress),
    /// The build finished; the stream ends after this.
    Built(Box<TemplateInfo>),
}

/// The events of one streamed build, in order: progress, then `Built`.
#[derive(Debug)]
pub struct BuildStream {
    body: Incoming,
    parser: Parser,
    request: String,
    finished: bool,
}

impl Client {
    /// `POST /v1/templates`: builds a template and waits for it.
    pub async fn build_template(&self, req: &BuildRequest) -> Result<TemplateInfo, ClientError> {
        self.json(Method::POST, "/v1/templates", json_body(req)?)
            .await
    }

    /// `POST /v1/templates` with `Accept: text/event-stream`: the build's
    /// progress as it happens.
    pub async fn build_template_stream(
        &self,
        req: &BuildRequest,
    ) -> Result<BuildStream, ClientError> {
        let (resp, request) = self
            .call_for_events(Method::POST, "/v1/templates", json_body(req)?)
            .await?;
        Ok(BuildStream {
            body: resp.into_body(),
            parser: Parser::default(),
            request,
            finished: false,
        })
    }

    /// `GET /v1/templates`.
    pub async fn templates(&self) -> Result<Vec<TemplateInfo>, ClientError> {
        let list: TemplateList = self.json(Method::GET, "/v1/templates", Body::Empty).await?;
        Ok(list.templates)
    }

    /// `GET /v1/templates/{name}`.
    pub async fn template(&self, name: &str) -> Result<TemplateInfo, ClientError> {
        self.json(Method::GET, &format!("/v1/templates/{name}"), Body::Empty)
            .await
    }

    /// `DELETE /v1/templates/{name}`.
    pub async fn remove_template(&self, name: &str) -> Result<TemplateInfo, ClientError> {
        self.json(
            Method::DELETE,
            &format!("/v1/templates/{name}"),
            Body::Empty,
        )
        .await
    }
}

impl BuildStream {
    /// The next event; `None` after `Built`. A failed build is an
    /// [`ClientError::Api`] with the daemon's error.
    pub async fn next_event(&mut self) -> Result<Option<BuildEvent>, ClientError> {
        loop {
            if self.finished {
                return Ok(None);
            }
            while let Some(raw) = self.parser.next().map_err(|r| self.protocol(r))? {
                match raw.name.as_str() {
                    "progress" => {
                        let p = serde_json::from_str(&raw.data)
                            .map_err(|e| self.protocol(&format!("bad progress event: {e}")))?;
                        return Ok(Some(BuildEvent::Progress(p)));
                    }
                    "built" => {
                        self.finished = true;
                        let info = serde_json::from_str(&raw.data)
                            .map_err(|e| self.protocol(&format!("bad built event: {e}")))?;
                        return Ok(Some(BuildEvent::Built(Box::new(info))));
                    }
                    "error" => {
                        self.finished = true;
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
                None => return Err(self.protocol("the build stream ended without a result")),
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
