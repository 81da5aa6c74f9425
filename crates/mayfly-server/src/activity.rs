//! Traffic as activity: wrappers that touch a sandbox's idle clock
//! ([`SandboxActivity`]) whenever bytes flow on a long-lived connection to
//! it, a TCP forward, a relayed WebSocket or a streamed response, so a
//! sandbox in use through one of those does not idle out because no new
//! request arrived. A connection left open and silent keeps nothing alive.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use mayfly_engine::SandboxActivity;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A byte stream whose reads and writes touch `activity`.
pub(crate) struct Touching<S> {
    inner: S,
    activity: Option<SandboxActivity>,
}

impl<S> Touching<S> {
    pub(crate) fn new(inner: S, activity: Option<SandboxActivity>) -> Self {
        Touching { inner, activity }
    }

    fn touch(&self) {
        if let Some(a) = &self.activity {
            a.touch();
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Touching<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Touching<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A response body whose data frames touch `activity`.
#[derive(Debug)]
pub struct TouchingBody<B> {
    inner: B,
    activity: Option<SandboxActivity>,
}

impl<B> TouchingBody<B> {
    pub(crate) fn new(inner: B, activity: Option<SandboxActivity>) -> Self {
        TouchingBody { inner, activity }
    }
}

impl<B: Body + Unpin> Body for TouchingBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r {
            if f.data_ref().is_some_and(Buf::has_remaining) {
                if let Some(a) = &self.activity {
                    a.touch();
                }
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
