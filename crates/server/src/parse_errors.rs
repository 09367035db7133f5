//! OpenAI-style JSON bodies for the responses hyper writes by itself.
//!
//! When an HTTP/1 request head cannot be parsed, hyper answers before any of our code runs
//! (`hyper::proto::h1::role::Server::on_error`) with a bare status and `content-length: 0`:
//! 400 for a malformed request line or header (bad method, URI, version, header syntax, a bad
//! `content-length`/`transfer-encoding`), 414 for a URI over hyper's limit and 431 for a head
//! larger than the read buffer or with more headers than allowed. hyper offers no hook to
//! change those responses, so [`JsonParseErrors`] wraps each connection's stream and
//! recognises that exact write (a 400/414/431 head with `content-length: 0`, no
//! `content-type` and nothing after it — our handlers never answer a 4xx without a JSON body)
//! and writes the same status with an [`ErrorResponse`] body instead. hyper closes the
//! connection right after such a response, so nothing else on the connection changes.
//!
//! What stays as hyper leaves it: a request head that times out (the connection is closed
//! with no response, as hyper does), HTTP/2 protocol errors (answered with `RST_STREAM` or
//! `GOAWAY` frames, which have no body), and TLS handshake failures (no HTTP at all).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum_server::accept::Accept;
use futures::future::BoxFuture;
use tokenmill_protocol::ErrorResponse;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The largest request head hyper buffers (bytes); a larger one is a 431.
pub(crate) const MAX_REQUEST_HEAD_BYTES: usize = 64 * 1024;

/// The most header fields in one request; more is a 431.
pub(crate) const MAX_REQUEST_HEADERS: usize = 100;

/// Wraps another acceptor's streams in [`JsonParseErrors`].
#[derive(Debug, Clone)]
pub(crate) struct JsonParseErrorAcceptor<A> {
    inner: A,
}

impl<A> JsonParseErrorAcceptor<A> {
    pub(crate) fn new(inner: A) -> Self {
        JsonParseErrorAcceptor { inner }
    }
}

impl<I, S, A> Accept<I, S> for JsonParseErrorAcceptor<A>
where
    A: Accept<I, S>,
    A::Future: Send + 'static,
    A::Stream: Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = JsonParseErrors<A::Stream>;
    type Service = A::Service;
    type Future = BoxFuture<'static, io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let accepted = self.inner.accept(stream, service);
        Box::pin(async move {
            let (stream, service) = accepted.await?;
            Ok((JsonParseErrors::new(stream), service))
        })
    }
}

/// A stream whose writes of hyper's automatic parse-error responses are replaced by the same
/// status with a JSON error body.
#[derive(Debug)]
pub(crate) struct JsonParseErrors<S> {
    inner: S,
    /// A replacement being written: its bytes, how many went out, and the length of hyper's
    /// write it stands for (what `poll_write` reports once it is all out).
    pending: Option<Replacement>,
}

#[derive(Debug)]
struct Replacement {
    bytes: Vec<u8>,
    written: usize,
    replaces: usize,
}

impl<S> JsonParseErrors<S> {
    fn new(inner: S) -> Self {
        JsonParseErrors {
            inner,
            pending: None,
        }
    }
}

impl<S: AsyncWrite + Unpin> JsonParseErrors<S> {
    /// Writes what is left of the replacement; `Ready(Ok(n))` with the length of the write
    /// it replaced once it is all out.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<usize>>> {
        let Some(replacement) = self.pending.as_mut() else {
            return Poll::Ready(Ok(None));
        };
        while replacement.written < replacement.bytes.len() {
            let rest = &replacement.bytes[replacement.written..];
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            replacement.written += n;
        }
        let replaces = replacement.replaces;
        self.pending = None;
        Poll::Ready(Ok(Some(replaces)))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonParseErrors<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_none() {
            match json_parse_error_response(buf) {
                Some(bytes) => {
                    this.pending = Some(Replacement {
                        bytes,
                        written: 0,
                        replaces: buf.len(),
                    });
                }
                None => return Pin::new(&mut this.inner).poll_write(cx, buf),
            }
        }
        // hyper retries a pending write with the same bytes; the replacement continues.
        match ready!(this.poll_replacement(cx))? {
            Some(replaced) => Poll::Ready(Ok(replaced)),
            None => Pin::new(&mut this.inner).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    // Not vectored: hyper then writes each response head as one flat buffer, which is what
    // `json_parse_error_response` recognises (a head split over several buffers would not
    // be recognised and would go out bare).
    fn is_write_vectored(&self) -> bool {
        false
    }
}

/// If `buf` is exactly one of hyper's automatic parse-error responses (a 400, 414 or 431
/// head with `content-length: 0`, no `content-type` and nothing after the head), the same
/// response with an OpenAI JSON error body; otherwise `None`.
fn json_parse_error_response(buf: &[u8]) -> Option<Vec<u8>> {
    let head = buf.strip_suffix(b"\r\n\r\n")?;
    if head.windows(4).any(|window| window == b"\r\n\r\n") {
        return None;
    }
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let (version, rest) = status_line.split_once(' ')?;
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return None;
    }
    let code = rest.split(' ').next()?;
    let message = match code {
        "400" => "The request could not be parsed: malformed HTTP/1.1 request line or header."
            .to_string(),
        "414" => "The request URI is too long.".to_string(),
        "431" => format!(
            "The request header fields are too large: a request head may have at most \
             {MAX_REQUEST_HEADERS} headers and {MAX_REQUEST_HEAD_BYTES} bytes."
        ),
        _ => return None,
    };
    let mut headers = Vec::new();
    let mut empty_body = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        if name.eq_ignore_ascii_case("content-type") {
            return None;
        }
        if name.eq_ignore_ascii_case("content-length") {
            empty_body = value.trim() == "0";
            continue;
        }
        if name.eq_ignore_ascii_case("connection") {
            continue;
        }
        headers.push(line);
    }
    if !empty_body {
        return None;
    }
    let status = code.parse::<u16>().ok()?;
    let error_type = if status == 400 {
        "invalid_request_error"
    } else {
        "request_too_large"
    };
    let body = serde_json::to_vec(&ErrorResponse::new(status, error_type, message)).ok()?;
    let mut response = Vec::with_capacity(buf.len() + body.len() + 64);
    response.extend_from_slice(status_line.as_bytes());
    response.extend_from_slice(b"\r\ncontent-type: application/json\r\n");
    response.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    // hyper closes the connection after these responses; say so.
    response.extend_from_slice(b"connection: close\r\n");
    for header in headers {
        response.extend_from_slice(header.as_bytes());
        response.extend_from_slice(b"\r\n");
    }
    response.extend_from_slice(b"\r\n");
    response.extend_from_slice(&body);
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(response: &[u8]) -> (String, serde_json::Value) {
        let text = std::str::from_utf8(response).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        (head.to_string(), serde_json::from_str(body).unwrap())
    }

    #[test]
    fn hypers_bare_parse_errors_get_a_json_body() {
        for (code, kind) in [
            ("400 Bad Request", "invalid_request_error"),
            ("414 URI Too Long", "request_too_large"),
            ("431 Request Header Fields Too Large", "request_too_large"),
        ] {
            let bare = format!(
                "HTTP/1.1 {code}\r\ncontent-length: 0\r\ndate: Thu, 26 Nov 2026 16:00:00 GMT\r\n\r\n"
            );
            let rewritten = json_parse_error_response(bare.as_bytes()).unwrap();
            let (head, body) = split(&rewritten);
            assert!(head.starts_with(&format!("HTTP/1.1 {code}\r\n")), "{head}");
            assert!(head.contains("content-type: application/json"), "{head}");
            assert!(head.contains("connection: close"), "{head}");
            assert!(head.contains("date: Thu, 26 Nov 2026"), "{head}");
            let length = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .unwrap();
            assert_eq!(
                length.parse::<usize>().unwrap(),
                serde_json::to_vec(&body).unwrap().len()
            );
            assert_eq!(body["error"]["type"], kind);
            assert_eq!(body["error"]["code"], code[..3].parse::<u64>().unwrap());
        }
    }

    #[test]
    fn other_writes_pass_through() {
        for other in [
            // Our own errors carry a body and a content type.
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 5\r\n\r\n",
            // Other statuses, bodies, and a write that holds more than one head.
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nHTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
            "data: {\"text\": \"HTTP/1.1 400 Bad Request\"}\n\n",
            "HTTP/2 400\r\ncontent-length: 0\r\n\r\n",
        ] {
            assert_eq!(json_parse_error_response(other.as_bytes()), None, "{other}");
        }
    }
}
