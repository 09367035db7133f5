//! A deadline for a connection's first byte.
//!
//! hyper's header-read timeout starts once hyper reads a request head, but the connection
//! builder first waits for bytes to tell HTTP/1 from HTTP/2, with no timeout: a client that
//! connects and sends nothing would hold the connection forever. [`FirstByteAcceptor`] wraps
//! every accepted stream (after TLS, when there is TLS) so that a read still waiting for the
//! first byte when the deadline passes fails, which closes the connection. From the first
//! byte on, hyper's own timeout bounds each request head, idle keep-alive included.
//!
//! The same wrapper refuses HTTP/2: the server speaks HTTP/1.1 only (hyper's HTTP/2 would
//! escape the header, body and idle timeouts above). A connection whose first bytes are the
//! HTTP/2 preface (`PRI * HTTP/2.0...`, prior knowledge; no HTTP/1 method is `PRI`) fails
//! its read and is closed before hyper can start an HTTP/2 session. (`Upgrade: h2c` is not
//! honoured either: hyper's HTTP/1 server does not switch protocols by itself.)

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

/// The start of the HTTP/2 connection preface.
const HTTP2_PREFACE_START: &[u8] = b"PRI ";

/// A stream whose reads fail with `TimedOut` if no byte has arrived by the deadline, and with
/// `InvalidData` if the connection opens with the HTTP/2 preface.
#[derive(Debug)]
pub(crate) struct FirstByteDeadline<S> {
    inner: S,
    /// `None` once a byte arrived.
    deadline: Option<Pin<Box<Sleep>>>,
    /// How many leading bytes matched [`HTTP2_PREFACE_START`]; `None` once they differ or
    /// all of it was checked.
    preface_matched: Option<usize>,
}

impl<S> FirstByteDeadline<S> {
    fn new(inner: S, timeout: Duration) -> Self {
        FirstByteDeadline {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
            preface_matched: Some(0),
        }
    }

    /// Checks newly read bytes against the HTTP/2 preface; `true` when the connection has
    /// turned out to be HTTP/2.
    fn is_http2(&mut self, new_bytes: &[u8]) -> bool {
        let Some(matched) = self.preface_matched else {
            return false;
        };
        let expected = &HTTP2_PREFACE_START[matched..];
        let compared = new_bytes.len().min(expected.len());
        if new_bytes[..compared] != expected[..compared] {
            self.preface_matched = None;
            return false;
        }
        let matched = matched + compared;
        if matched == HTTP2_PREFACE_START.len() {
            self.preface_matched = None;
            return true;
        }
        self.preface_matched = Some(matched);
        false
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
                    if this.is_http2(&buf.filled()[before..]) {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "HTTP/2 is not served (HTTP/1.1 only)",
                        )));
                    }
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
