//! The publisher thread: a single-threaded async runtime owning the PUB socket (and the ROUTER
//! replay socket), fed by the engine loop through a bounded queue it never waits on.
//!
//! Every batch gets the next sequence number (from 0) when the engine hands it over, so a
//! batch dropped because the queue was full leaves a gap subscribers can see (vLLM's loop
//! waits instead), and goes out as vLLM's three frames
//! `[topic, sequence as 8 big-endian bytes, msgpack batch]`; the last `buffer_steps` encoded
//! batches stay for replay. A replay request `[identity, "", start as 8 big-endian bytes]`
//! (a DEALER or REQ peer) is answered with `[identity, "", seq, batch]` for every buffered
//! batch from `start` on, then the end marker `[identity, "", -1 as 8 bytes, ""]`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokenmill_core::KvCacheEvent;
use tokenmill_metrics::EngineMetrics;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterRecvHalf, RouterSendHalf, RouterSocket, Socket, SocketRecv};
use zeromq::{SocketSend, ZmqMessage};

use super::config::{KvEventsConfig, ZmqEndpoint};
use super::wire::encode_batch;
use crate::EngineError;

/// One engine step's events.
struct Batch {
    seq: u64,
    ts: f64,
    events: Vec<KvCacheEvent>,
}

/// The engine loop's handle on the publisher thread. Dropping it lets the thread send what
/// is queued and exit.
pub(crate) struct KvEventPublisher {
    batches: mpsc::Sender<Batch>,
    next_seq: AtomicU64,
    metrics: Arc<EngineMetrics>,
}

impl std::fmt::Debug for KvEventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvEventPublisher").finish_non_exhaustive()
    }
}

/// What the thread needs from the config, resolved for one data-parallel rank.
struct Settings {
    endpoint: ZmqEndpoint,
    replay_endpoint: Option<ZmqEndpoint>,
    topic: Bytes,
    buffer_steps: usize,
    hwm: usize,
    dp_rank: usize,
}

impl KvEventPublisher {
    /// Starts the thread for data-parallel rank `dp_rank` (its ports are the configured ones
    /// plus the rank); fails when a socket cannot be bound.
    pub fn start(
        config: &KvEventsConfig,
        dp_rank: usize,
        metrics: Arc<EngineMetrics>,
    ) -> Result<KvEventPublisher, EngineError> {
        let invalid = |reason: String| EngineError::Config(format!("--kv-events-config: {reason}"));
        let resolve = |endpoint: &str| {
            ZmqEndpoint::parse(endpoint)
                .and_then(|parsed| parsed.for_rank(dp_rank))
                .map_err(invalid)
        };
        let settings = Settings {
            endpoint: resolve(&config.endpoint)?,
            replay_endpoint: config.replay_endpoint.as_deref().map(resolve).transpose()?,
            topic: Bytes::from(config.topic.clone().into_bytes()),
            buffer_steps: config.buffer_steps,
            hwm: config.hwm,
            dp_rank,
        };
        let (batches, receiver) = mpsc::channel(config.max_queue_size);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread_metrics = Arc::clone(&metrics);
        std::thread::Builder::new()
            .name(format!("kv-events-{dp_rank}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = ready_tx.send(Err(format!("cannot start its runtime: {err}")));
                        return;
                    }
                };
                runtime.block_on(run(settings, receiver, thread_metrics, ready_tx));
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(KvEventPublisher {
                batches,
                next_seq: AtomicU64::new(0),
                metrics,
            }),
            Ok(Err(reason)) => Err(invalid(reason)),
            Err(_) => Err(invalid("the publisher thread exited".to_owned())),
        }
    }

    /// Queues one step's events; when the queue is full they are dropped and counted.
    pub fn publish(&self, events: Vec<KvCacheEvent>) {
        let count = events.len() as u64;
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64());
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        if self.batches.try_send(Batch { seq, ts, events }).is_err() {
            self.metrics.record_kv_events_dropped(count);
        }
    }
}

async fn run(
    settings: Settings,
    mut batches: mpsc::Receiver<Batch>,
    metrics: Arc<EngineMetrics>,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let address = settings.endpoint.address();
    let mut socket = PubSocket::new();
    if settings.endpoint.binds() {
        if let Err(err) = socket.bind(&address).await {
            let _ = ready.send(Err(format!("cannot bind {address}: {err}")));
            return;
        }
    }
    let mut replay = None;
    if let Some(endpoint) = &settings.replay_endpoint {
        let mut router = RouterSocket::new();
        if let Err(err) = router.bind(&endpoint.address()).await {
            let address = endpoint.address();
            let _ = ready.send(Err(format!("cannot bind {address}: {err}")));
            return;
        }
        replay = Some(router.split());
    }
    let _ = ready.send(Ok(()));

    // PUB sending runs in its own task, so a slow subscriber holds up neither the intake nor
    // replay; `pending` counts batches handed to it and not yet sent (the high-water mark).
    let pending = Arc::new(AtomicUsize::new(0));
    let (outgoing, to_send) = mpsc::unbounded_channel();
    let sender = tokio::spawn(send_loop(
        socket,
        (!settings.endpoint.binds()).then_some(address),
        to_send,
        Arc::clone(&pending),
    ));
    let (mut replay_out, mut requests, receiver) = match replay {
        Some((send_half, recv_half)) => {
            let (tx, rx) = mpsc::unbounded_channel();
            (
                Some(send_half),
                Some(rx),
                Some(tokio::spawn(receive_requests(recv_half, tx))),
            )
        }
        None => (None, None, None),
    };

    let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::new();
    loop {
        tokio::select! {
            batch = batches.recv() => {
                let Some(batch) = batch else { break };
                let seq = batch.seq;
                let payload = match encode_batch(batch.ts, &batch.events, settings.dp_rank) {
                    Ok(payload) => Bytes::from(payload),
                    Err(err) => {
                        tracing::error!("kv events: cannot encode a batch: {err}");
                        continue;
                    }
                };
                let mut message = ZmqMessage::from(settings.topic.clone());
                message.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
                message.push_back(payload.clone());
                if settings.hwm == 0 || pending.load(Ordering::Acquire) < settings.hwm {
                    pending.fetch_add(1, Ordering::AcqRel);
                    if outgoing.send(message).is_err() {
                        break;
                    }
                } else {
                    metrics.record_kv_events_dropped(batch.events.len() as u64);
                }
                if settings.buffer_steps > 0 {
                    if buffer.len() == settings.buffer_steps {
                        buffer.pop_front();
                    }
                    buffer.push_back((seq, payload));
                }
            }
            Some(request) = recv_request(&mut requests) => {
                if let Some(out) = replay_out.as_mut() {
                    serve_replay(out, request, &buffer).await;
                }
            }
        }
    }
    drop(outgoing);
    let _ = sender.await;
    if let Some(receiver) = receiver {
        receiver.abort();
    }
}

/// The next replay request, or never when there is no replay socket.
async fn recv_request(
    requests: &mut Option<mpsc::UnboundedReceiver<ZmqMessage>>,
) -> Option<ZmqMessage> {
    match requests {
        Some(requests) => requests.recv().await,
        None => std::future::pending().await,
    }
}

async fn send_loop(
    mut socket: PubSocket,
    connect: Option<String>,
    mut to_send: mpsc::UnboundedReceiver<ZmqMessage>,
    pending: Arc<AtomicUsize>,
) {
    if let Some(address) = connect {
        if let Err(err) = socket.connect(&address).await {
            tracing::error!("kv events: cannot connect to {address}: {err}");
        }
    }
    while let Some(message) = to_send.recv().await {
        if let Err(err) = socket.send(message).await {
            tracing::warn!("kv events: publish failed: {err}");
        }
        pending.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn receive_requests(mut socket: RouterRecvHalf, requests: mpsc::UnboundedSender<ZmqMessage>) {
    loop {
        match socket.recv().await {
            Ok(message) => {
                if requests.send(message).is_err() {
                    return;
                }
            }
            Err(err) => {
                tracing::debug!("kv events: replay socket: {err}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Answers one replay request from the buffer, then sends the end marker.
async fn serve_replay(
    out: &mut RouterSendHalf,
    request: ZmqMessage,
    buffer: &VecDeque<(u64, Bytes)>,
) {
    let frames = request.into_vec();
    let [identity, delimiter, start] = frames.as_slice() else {
        tracing::warn!(
            "kv events: replay request of {} frames, not 3",
            frames.len()
        );
        return;
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
        tracing::warn!("kv events: replay start is {} bytes, not 8", start.len());
        return;
    };
    let start = u64::from_be_bytes(start);
    let reply = |seq: Bytes, payload: Bytes| {
        let mut message = ZmqMessage::from(identity.clone());
        message.push_back(delimiter.clone());
        message.push_back(seq);
        message.push_back(payload);
        message
    };
    for (seq, payload) in buffer.iter().filter(|(seq, _)| *seq >= start) {
        let message = reply(Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone());
        if let Err(err) = out.send(message).await {
            tracing::warn!("kv events: replay reply failed: {err}");
            return;
        }
    }
    let end = reply(Bytes::copy_from_slice(&(-1i64).to_be_bytes()), Bytes::new());
    if let Err(err) = out.send(end).await {
        tracing::warn!("kv events: replay end marker failed: {err}");
    }
}
