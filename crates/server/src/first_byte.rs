//! A deadline for a connection's first byte.
//!
//! hyper's header-read timeout starts once hyper reads a request head, but the connection
//! builder first waits for bytes to tell HTTP/1 from HTTP/2, with no timeout: a client that
//! connects and sends nothing would hold the connection forever. [`FirstByteAcceptor`] wraps
//! every accepted stream (after TLS, when there is TLS) so that a read still waiting for the
//! first byte when the deadline passes fails, which closes the connection. From the first
//! byte on, hyper's own timeout bounds each request head, idle keep-alive included.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum_server::accept::Accept;
use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// Wraps another acceptor's streams in [`FirstByteDeadline`].
#[derive(Debug, Clone)]
pub(crate) struct FirstByteAcceptor<A> {
    inner: A,
    timeout: Duration,
}

impl<A> FirstByteAcceptor<A> {
    pub(crate) fn new(inner: A, timeout: Duration) -> Self {
        FirstByteAcceptor { inner, timeout }
    }
}

impl<I, S, A> Accept<I, S> for FirstByteAcceptor<A>
where
    A: Accept<I, S>,
    A::Future: Send + 'static,
    A::Stream: Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = FirstByteDeadline<A::Stream>;
    type Service = A::Service;
    type Future = BoxFuture<'static, io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let accepted = self.inner.accept(stream, service);
        let timeout = self.timeout;
        Box::pin(async move {
            let (stream, service) = accepted.await?;
            Ok((FirstByteDeadline::new(stream, timeout), service))
        })
    }
}

/// A stream whose reads fail with `TimedOut` if no byte has arrived by the deadline.
#[derive(Debug)]
pub(crate) struct FirstByteDeadline<S> {
    inner: S,
    /// `None` once a byte arrived.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<S> FirstByteDeadline<S> {
    fn new(inner: S, timeout: Duration) -> Self {
        FirstByteDeadline {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FirstByteDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.deadline = None;
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                let expired = this
                    .deadline
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if expired {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no request arrived within the header read timeout",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FirstByteDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
