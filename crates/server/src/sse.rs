//! Server-sent events plumbing shared by the streaming routes.
//!
//! A streaming handler spawns one task that reads the engine streams of all its choices and
//! writes SSE events into a channel the response body drains. When the client goes away the
//! channel closes, the task returns, and dropping the engine streams aborts the requests.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, BoxStream, SelectAll, StreamExt};
use serde::Serialize;
use tokenmill_engine::{RequestEvent, RequestStream};
use tokenmill_protocol::ErrorResponse;
use tokio::sync::mpsc;

/// Events queued ahead of a slow client before the producer waits.
const CHANNEL_DEPTH: usize = 64;

pub(crate) type EventSender = mpsc::Sender<Result<Event, Infallible>>;

/// The engine streams of every choice, merged; items are `(choice index, event)`.
pub(crate) type MergedStreams = SelectAll<BoxStream<'static, (u32, RequestEvent)>>;

pub(crate) fn merge(streams: Vec<(u32, RequestStream)>) -> MergedStreams {
    stream::select_all(streams.into_iter().map(|(index, request_stream)| {
        stream::unfold(request_stream, move |mut s| async move {
            s.recv().await.map(|event| ((index, event), s))
        })
        .boxed()
    }))
}

/// A channel and the SSE response that drains it (keep-alive comments while idle).
pub(crate) fn channel() -> (EventSender, Response) {
    channel_with(KeepAlive::default())
}

/// [`channel`] with its own keep-alive (Anthropic's streams send `ping` events).
pub(crate) fn channel_with(keep_alive: KeepAlive) -> (EventSender, Response) {
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    let body = stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let response = Sse::new(body).keep_alive(keep_alive).into_response();
    (tx, response)
}

/// The next engine event, or `None` when every choice finished or the client disconnected.
pub(crate) async fn next_event(
    tx: &EventSender,
    merged: &mut MergedStreams,
) -> Option<(u32, RequestEvent)> {
    tokio::select! {
        event = merged.next() => event,
        () = tx.closed() => None,
    }
}

/// Sends one JSON `data:` event; `false` when the client is gone.
pub(crate) async fn send_json<T: Serialize>(tx: &EventSender, value: &T) -> bool {
    match serde_json::to_string(value) {
        Ok(json) => tx.send(Ok(Event::default().data(json))).await.is_ok(),
        Err(err) => {
            tracing::error!("cannot serialize an SSE chunk: {err}");
            false
        }
    }
}

/// Sends one named event (`event: NAME`, `data: JSON`); `false` when the client is gone.
pub(crate) async fn send_named<T: Serialize>(tx: &EventSender, name: &str, value: &T) -> bool {
    match serde_json::to_string(value) {
        Ok(json) => tx
            .send(Ok(Event::default().event(name).data(json)))
            .await
            .is_ok(),
        Err(err) => {
            tracing::error!("cannot serialize an SSE event: {err}");
            false
        }
    }
}

/// An error in the middle of a stream: an OpenAI error object as a data event, then `[DONE]`
/// so clients that wait for the terminator (as vLLM sends it) stop reading.
pub(crate) async fn send_error(tx: &EventSender, error: ErrorResponse) {
    if send_json(tx, &error).await {
        send_done(tx).await;
    }
}

/// Ends a stream whose request the engine did not complete: a request it refused gets a 400
/// error object with the reason, an engine failure a 500 one (details logged, not shown).
pub(crate) async fn send_engine_failure(tx: &EventSender, event: RequestEvent) {
    let error = match event {
        RequestEvent::Rejected(message) => ErrorResponse::invalid_request(message),
        RequestEvent::Error(message) => {
            tracing::error!("request failed mid-stream: {message}");
            ErrorResponse::internal("The engine failed this request.")
        }
        RequestEvent::Failed(failure) => ErrorResponse::internal(failure.message()),
        RequestEvent::Output(_) => return,
    };
    send_error(tx, error).await;
}

/// The terminating `data: [DONE]`.
pub(crate) async fn send_done(tx: &EventSender) {
    let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
}
