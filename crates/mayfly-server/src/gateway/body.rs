//! A request body on its way upstream that may not stall: a client that
//! sends a body's bytes slowly, or stops halfway, would otherwise hold its
//! client connection, an upstream connection and their places for as long
//! as it likes (a request in flight is never cut by the connection's own
//! deadlines, [`crate::conn`]).

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// How long a request body may go without sending anything.
pub const BODY_IDLE: Duration = Duration::from_secs(60);

/// Why a guarded body ended early.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the client sent nothing of the request body for {0:?}")]
    Stalled(Duration),
    #[error("reading the request body: {0}")]
    Read(Box<dyn std::error::Error + Send + Sync>),
}

/// `B`, ended with [`BodyError::Stalled`] when no frame has come for
/// `limit` while one was awaited. The timer is armed only while the
/// upstream waits for the body, so a body the upstream reads slowly is not
/// cut, and a request without a body never arms it.
pub struct Guarded<B> {
    inner: B,
    limit: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    /// A frame came since the timer was last armed.
    moved: bool,
}

impl<B> Guarded<B> {
    pub fn new(inner: B, limit: Duration) -> Guarded<B> {
        Guarded {
            inner,
            limit,
            timer: None,
            moved: false,
        }
    }
}

impl<B> Body for Guarded<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.moved = true;
                Poll::Ready(frame.map(|f| f.map_err(|e| BodyError::Read(e.into()))))
            }
            Poll::Pending => {
                let limit = this.limit;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if std::mem::take(&mut this.moved) {
                    timer.as_mut().reset(Instant::now() + limit);
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(BodyError::Stalled(limit)))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{BodyExt as _, StreamBody};
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::ReceiverStream;

    use super::*;

    type Chunks = StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>;

    fn channel() -> (mpsc::Sender<Result<Frame<Bytes>, Infallible>>, Chunks) {
        let (tx, rx) = mpsc::channel(4);
        (tx, StreamBody::new(ReceiverStream::new(rx)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_halfway_is_cut_at_the_limit() {
        let (tx, body) = channel();
        tx.send(Ok(Frame::data(Bytes::from("half")))).await.unwrap();
        let started = Instant::now();
        let mut g = Guarded::new(body, Duration::from_secs(60));
        let first = g.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "half");
        let err = g.frame().await.unwrap().unwrap_err();
        assert!(matches!(err, BodyError::Stalled(_)), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_coming_slower_than_the_limit_in_all_is_not_cut() {
        let (tx, body) = channel();
        tokio::spawn(async move {
            for i in 0..5 {
                tokio::time::sleep(Duration::from_secs(40)).await;
                let _ = tx.send(Ok(Frame::data(Bytes::from(format!("{i}"))))).await;
            }
        });
        let all = Guarded::new(body, Duration::from_secs(60))
            .collect()
            .await
            .expect("every wait was under the limit")
            .to_bytes();
        assert_eq!(all, "01234");
    }
}
