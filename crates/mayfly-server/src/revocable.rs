//! Requests that outlive a revoked key. A key is checked when a request
//! arrives; a request that stays open (an event stream, an exec's output,
//! a run, a TCP forward) is re-checked whenever a key is revoked or a
//! tenant removed, and cut if its key no longer authenticates.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use mayfly_engine::SandboxApi;

/// A future that ends once `key` stops authenticating (it was revoked, or
/// its tenant removed). Never ends on a daemon without tenancy.
pub(crate) type Revoked = Pin<Box<dyn Future<Output = ()> + Send>>;

pub(crate) fn until_revoked(api: Arc<dyn SandboxApi>, key: String) -> Revoked {
    Box::pin(async move {
        let Some(mut moves) = api.tenancy().map(|t| t.revocations()) else {
            return std::future::pending().await;
        };
        loop {
            if moves.changed().await.is_err() {
                // The engine is gone; the daemon is stopping anyway.
                return std::future::pending().await;
            }
            let valid = match api.tenancy() {
                Some(t) => t.authenticate(&key).await.is_ok(),
                None => false,
            };
            if !valid {
                return;
            }
        }
    })
}

/// A response body that fails (so the connection is cut, not ended as if
/// complete) once its request's key is revoked.
pub(crate) struct Revocable {
    body: Body,
    revoked: Option<Revoked>,
}

impl Revocable {
    pub(crate) fn wrap(body: Body, revoked: Revoked) -> Body {
        Body::new(Revocable {
            body,
            revoked: Some(revoked),
        })
    }
}

impl http_body::Body for Revocable {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        match &mut this.revoked {
            Some(r) => {
                if r.as_mut().poll(cx).is_ready() {
                    this.revoked = None;
                    return Poll::Ready(Some(Err(axum::Error::new("the API key was revoked"))));
                }
            }
            // Revoked already: the error was given; nothing more follows.
            None => return Poll::Ready(None),
        }
        Pin::new(&mut this.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.revoked.is_some() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
