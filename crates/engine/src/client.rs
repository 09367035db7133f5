//! Talking to the engine threads once they run ([`crate::startup`] starts them): the
//! [`Engine`] handle, the cloneable [`EngineClient`] and each request's [`RequestStream`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokenmill_metrics::EngineMetrics;

use tokenmill_core::{BlockHashExtraKeys, RequestId, SchedulingPolicy};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::core_loop::{Command, Shared};
use crate::dp::{self, PrefixBalancer};
use crate::lora::LoraRegistry;
use crate::model_runner::LoadedModel;
use crate::request::{GenerateRequest, RequestEvent};
use crate::stats::{CapacityReport, EngineStats};
use crate::EngineError;

/// A running engine: the engine threads (one per data-parallel rank) plus what clients need
/// (tokenizer, limits).
pub struct Engine {
    pub(crate) client: EngineClient,
    pub(crate) loaded: Arc<LoadedModel>,
    pub(crate) capacity: CapacityReport,
    /// Engine 0's registry, with the other ranks' attached (one scrape for all).
    pub(crate) metrics: Arc<EngineMetrics>,
    pub(crate) threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("capacity", &self.capacity)
            .field("data_parallel_size", &self.threads.len())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// The Prometheus registry the engine feeds (served on `/metrics`); with several
    /// engines, engine 0's, whose scrape includes the others'.
    pub fn metrics(&self) -> &Arc<EngineMetrics> {
        &self.metrics
    }

    pub fn client(&self) -> EngineClient {
        self.client.clone()
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.loaded
    }

    /// The KV capacity of one engine (each data-parallel engine has this much).
    pub fn capacity(&self) -> &CapacityReport {
        &self.capacity
    }

    /// Aborts whatever is in flight and joins the engine threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for core in self.client.cores.iter() {
            let _ = core.commands.send(Command::Shutdown);
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One engine thread as clients see it: its command channel, its state after the latest
/// step, and its requests in flight (the balancer's load).
#[derive(Debug)]
pub(crate) struct CoreHandle {
    pub(crate) commands: Sender<Command>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) in_flight: Arc<AtomicUsize>,
}

/// One request counted in its engine's load until dropped (finished or abandoned).
#[derive(Debug)]
struct LoadTicket(Arc<AtomicUsize>);

impl Drop for LoadTicket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A cheap, cloneable handle to the engine threads.
#[derive(Debug, Clone)]
pub struct EngineClient {
    /// One per data-parallel rank, in rank order.
    pub(crate) cores: Arc<[CoreHandle]>,
    /// Present with more than one engine.
    pub(crate) balancer: Option<Arc<Mutex<PrefixBalancer>>>,
    pub(crate) next_id: Arc<AtomicU64>,
    pub(crate) max_model_len: usize,
    pub(crate) scheduling_policy: SchedulingPolicy,
    pub(crate) lora: Option<Arc<LoraRegistry>>,
}

impl EngineClient {
    /// The served LoRA adapters; `None` unless LoRA serving is on (`--enable-lora`). One
    /// registry serves every engine, so loading or unloading reaches them all.
    pub fn lora(&self) -> Option<&Arc<LoraRegistry>> {
        self.lora.as_ref()
    }

    /// Submits a request to the engine the balancer picks; its outputs arrive on the
    /// returned stream. Dropping the stream aborts the request.
    pub fn add_request(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        if !self.is_alive() {
            return Err(EngineError::EngineDead);
        }
        let rank = self.route(&request);
        let core = self.cores.get(rank).ok_or(EngineError::EngineDead)?;
        // The rank is the id modulo the engine count, so an abort finds the owner.
        let ranks = self.cores.len() as u64;
        let request_id =
            RequestId(self.next_id.fetch_add(1, Ordering::Relaxed) * ranks + rank as u64);
        core.in_flight.fetch_add(1, Ordering::Relaxed);
        let ticket = LoadTicket(Arc::clone(&core.in_flight));
        let (events_tx, events_rx) = unbounded_channel();
        core.commands
            .send(Command::Add {
                request_id,
                request: Box::new(request),
                events: events_tx,
            })
            .map_err(|_| EngineError::EngineDead)?;
        Ok(RequestStream {
            request_id,
            events: events_rx,
            commands: core.commands.clone(),
            finished: false,
            ticket: Some(ticket),
        })
    }

    /// The engine for `request`: the only one, or the balancer's choice.
    fn route(&self, request: &GenerateRequest) -> usize {
        let Some(balancer) = &self.balancer else {
            return 0;
        };
        let loads: Vec<usize> = self
            .cores
            .iter()
            .map(|core| core.in_flight.load(Ordering::Relaxed))
            .collect();
        let extra_keys = BlockHashExtraKeys {
            cache_salt: request.cache_salt.clone(),
            adapter_id: request.lora.as_ref().map(|lora| lora.id),
        };
        match balancer.lock() {
            Ok(mut balancer) => balancer.route(&request.prompt_token_ids, extra_keys, &loads),
            Err(_) => dp::choose_engine(&loads, None, 0),
        }
    }

    /// Aborts a request on the engine that owns it.
    pub fn abort(&self, request_id: RequestId) {
        let rank = (request_id.0 % self.cores.len() as u64) as usize;
        if let Some(core) = self.cores.get(rank) {
            let _ = core.commands.send(Command::Abort(request_id));
        }
    }

    /// False once any engine thread stopped or crashed.
    pub fn is_alive(&self) -> bool {
        self.cores
            .iter()
            .all(|core| core.shared.alive.load(Ordering::SeqCst))
    }

    /// The state after the most recent step, summed over the engines.
    pub fn stats(&self) -> EngineStats {
        EngineStats::combined(&self.engine_stats())
    }

    /// Each engine's state after its most recent step, in rank order.
    pub fn engine_stats(&self) -> Vec<EngineStats> {
        self.cores
            .iter()
            .map(|core| {
                core.shared
                    .stats
                    .lock()
                    .map(|s| s.clone())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// How many engines serve (`--data-parallel-size`).
    pub fn data_parallel_size(&self) -> usize {
        self.cores.len()
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// How the scheduler orders waiting requests (`priority` is only meaningful under
    /// [`SchedulingPolicy::Priority`]).
    pub fn scheduling_policy(&self) -> SchedulingPolicy {
        self.scheduling_policy
    }
}

/// The output events of one request. Dropping it before the request finished aborts it.
#[derive(Debug)]
pub struct RequestStream {
    request_id: RequestId,
    events: UnboundedReceiver<RequestEvent>,
    commands: Sender<Command>,
    finished: bool,
    /// Counts the request in its engine's load until it finishes.
    ticket: Option<LoadTicket>,
}

impl RequestStream {
    pub fn request_id(&self) -> RequestId {
        self.request_id
    }

    /// The next event, or `None` once the request finished (or the engine went away).
    pub async fn recv(&mut self) -> Option<RequestEvent> {
        if self.finished {
            return None;
        }
        let event = self.events.recv().await;
        self.note(&event);
        event
    }

    /// Blocking variant for synchronous callers (offline generation, the CLI).
    pub fn blocking_recv(&mut self) -> Option<RequestEvent> {
        if self.finished {
            return None;
        }
        let event = self.events.blocking_recv();
        self.note(&event);
        event
    }

    fn note(&mut self, event: &Option<RequestEvent>) {
        match event {
            Some(RequestEvent::Output(output)) if output.finish_reason.is_some() => {
                self.finished = true;
            }
            Some(RequestEvent::Rejected(_) | RequestEvent::Error(_) | RequestEvent::Failed(_))
            | None => {
                self.finished = true;
            }
            Some(RequestEvent::Output(_)) => {}
        }
        if self.finished {
            self.ticket = None;
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.commands.send(Command::Abort(self.request_id));
        }
    }
}
