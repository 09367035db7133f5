//! What the Responses API keeps besides the engine: the store (`--responses-store`, a
//! SQLite file by default) and, in memory, each background run's event log, so a client that
//! lost its stream resumes it (`GET /v1/responses/{id}?stream=true&starting_after=N`) and a
//! cancel can reach the engine request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokenmill_engine::RequestId;
use tokenmill_protocol::{ResponseEvent, ResponseObject, SequencedEvent};
use tokenmill_response_store::{ResponseStore, StoreError, StoredResponse};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::responses_output::EventSink;
use crate::state::unix_now;

/// Finished runs whose event logs are kept for replay (the oldest go first).
const KEPT_FINISHED_RUNS: usize = 256;

/// One background run: its event log, its latest response object and its engine request.
#[derive(Debug)]
pub(crate) struct BackgroundRun {
    /// Serialized events; the index is the sequence number.
    events: Mutex<Vec<(&'static str, String)>>,
    /// How many events there are, and whether the log is complete.
    progress: watch::Sender<(usize, bool)>,
    pub response: Mutex<ResponseObject>,
    pub engine_request: Mutex<Option<RequestId>>,
    cancel: AtomicBool,
}

impl BackgroundRun {
    pub fn new(response: ResponseObject) -> Self {
        BackgroundRun {
            events: Mutex::new(Vec::new()),
            progress: watch::channel((0, false)).0,
            response: Mutex::new(response),
            engine_request: Mutex::new(None),
            cancel: AtomicBool::new(false),
        }
    }

    /// Marks the run cancelled; `true` the first time.
    pub fn request_cancel(&self) -> bool {
        !self.cancel.swap(true, Ordering::SeqCst)
    }

    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    pub fn is_done(&self) -> bool {
        self.progress.borrow().1
    }

    /// The latest response object.
    pub fn snapshot(&self) -> Option<ResponseObject> {
        self.response.lock().ok().map(|r| r.clone())
    }

    fn append(&self, event: &ResponseEvent) {
        let Ok(mut events) = self.events.lock() else {
            return;
        };
        let sequenced = SequencedEvent {
            event: event.clone(),
            sequence_number: events.len() as u64,
        };
        match serde_json::to_string(&sequenced) {
            Ok(json) => events.push((event.name(), json)),
            Err(err) => tracing::error!("cannot serialize a response event: {err}"),
        }
        let len = events.len();
        drop(events);
        self.progress.send_replace((len, false));
    }

    /// Closes the log: subscribers stop after its last event.
    pub fn finish(&self) {
        let len = self.events.lock().map_or(0, |events| events.len());
        self.progress.send_replace((len, true));
    }

    /// Events from sequence number `from` on, and whether the log is complete after them.
    fn read_from(&self, from: usize) -> (Vec<(&'static str, String)>, bool) {
        let done = self.progress.borrow().1;
        let events = self
            .events
            .lock()
            .map(|events| events.get(from..).map(<[_]>::to_vec).unwrap_or_default())
            .unwrap_or_default();
        (events, done)
    }

    /// Follows the log from sequence number `from`: `send` each event (name, JSON) until the
    /// log is complete or `send` returns `false`.
    pub async fn follow<F, Fut>(&self, mut from: usize, mut send: F)
    where
        F: FnMut(&'static str, String) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let mut progress = self.progress.subscribe();
        loop {
            let _ = progress.borrow_and_update();
            let (events, done) = self.read_from(from);
            from += events.len();
            for (name, json) in events {
                if !send(name, json).await {
                    return;
                }
            }
            if done && self.read_from(from).0.is_empty() {
                return;
            }
            if progress.changed().await.is_err() {
                return;
            }
        }
    }
}

/// A background run's events go to its log.
pub(crate) struct LogSink(pub Arc<BackgroundRun>);

impl EventSink for LogSink {
    async fn emit(&mut self, event: ResponseEvent) -> bool {
        if let ResponseEvent::InProgress { response } = &event {
            if let Ok(mut current) = self.0.response.lock() {
                current.status = response.status;
            }
        }
        self.0.append(&event);
        true
    }
}

/// The store and the background runs.
#[derive(Debug, Default)]
pub(crate) struct Responses {
    pub store: Option<Arc<ResponseStore>>,
    runs: Mutex<HashMap<String, Arc<BackgroundRun>>>,
    /// Ids of runs in the order they started (to drop the oldest finished ones).
    order: Mutex<Vec<String>>,
}

impl Responses {
    pub fn new(store: Option<Arc<ResponseStore>>) -> Self {
        Responses {
            store,
            ..Responses::default()
        }
    }

    pub fn run(&self, id: &str) -> Option<Arc<BackgroundRun>> {
        self.runs.lock().ok()?.get(id).cloned()
    }

    pub fn add_run(&self, id: &str, run: Arc<BackgroundRun>) {
        let (Ok(mut runs), Ok(mut order)) = (self.runs.lock(), self.order.lock()) else {
            return;
        };
        runs.insert(id.to_string(), run);
        order.push(id.to_string());
        let finished: Vec<String> = order
            .iter()
            .filter(|id| runs.get(*id).is_some_and(|run| run.is_done()))
            .cloned()
            .collect();
        let over = finished.len().saturating_sub(KEPT_FINISHED_RUNS);
        for id in finished.into_iter().take(over) {
            runs.remove(&id);
            order.retain(|kept| kept != &id);
        }
    }

    pub fn remove_run(&self, id: &str) {
        if let (Ok(mut runs), Ok(mut order)) = (self.runs.lock(), self.order.lock()) {
            runs.remove(id);
            order.retain(|kept| kept != id);
        }
    }

    /// Runs a store operation on the blocking pool; `None` without a store.
    pub async fn with_store<T, F>(&self, op: F) -> Result<Option<T>, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&ResponseStore) -> Result<T, StoreError> + Send + 'static,
    {
        let Some(store) = self.store.clone() else {
            return Ok(None);
        };
        tokio::task::spawn_blocking(move || op(&store))
            .await
            .map_err(|e| ApiError::Internal(format!("response store task: {e}")))?
            .map(Some)
            .map_err(|e| ApiError::Internal(e.to_string()))
    }

    /// Stores a response with its input and context (one transaction); counts evictions.
    pub async fn save(
        &self,
        metrics: &tokenmill_metrics::EngineMetrics,
        stored: StoredResponse,
    ) -> Result<(), ApiError> {
        let evicted = self
            .with_store(move |store| store.put(&stored, unix_now()))
            .await?;
        if let Some(evicted) = evicted.filter(|n| *n > 0) {
            metrics.record_response_store_evictions(evicted);
        }
        Ok(())
    }
}

/// The error of a stored response whose server stopped before it finished.
pub const INTERRUPTED_RUN_MESSAGE: &str = "The server running this response stopped before it \
     finished; the response was not resumed.";

/// How often a server looks for runs that a dead server (a replica sharing the store, or this
/// one before a restart) left unfinished, and for responses past their age.
const STORE_SWEEP_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Every [`STORE_SWEEP_PERIOD`]: fails the unfinished runs of servers that are gone and evicts
/// what is past the store's TTL (counted in the evictions metric). Runs until aborted.
pub(crate) async fn sweep_store(state: crate::state::AppState) {
    let responses = &state.inner.responses;
    if responses.store.is_none() {
        return;
    }
    loop {
        tokio::time::sleep(STORE_SWEEP_PERIOD).await;
        let swept = responses
            .with_store(|store| {
                let failed = store.recover_unfinished(INTERRUPTED_RUN_MESSAGE)?;
                let evicted = store.evict(unix_now())?;
                Ok((failed, evicted))
            })
            .await;
        match swept {
            Ok(Some((failed, evicted))) => {
                if !failed.is_empty() {
                    tracing::warn!(
                        "responses store: {} unfinished response(s) of a server that stopped \
                         marked failed",
                        failed.len()
                    );
                }
                if evicted > 0 {
                    state.inner.metrics.record_response_store_evictions(evicted);
                }
            }
            Ok(None) => return,
            Err(e) => tracing::warn!("responses store sweep: {e:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenmill_protocol::ResponsesRequest;

    #[tokio::test]
    async fn a_follower_gets_every_event_after_its_start_then_stops() {
        let request = ResponsesRequest::default();
        let response = ResponseObject::new("resp_x".into(), 0, "m".into(), &request, true);
        let run = Arc::new(BackgroundRun::new(response.clone()));
        let mut sink = LogSink(Arc::clone(&run));
        for _ in 0..3 {
            sink.emit(ResponseEvent::Created {
                response: Box::new(response.clone()),
            })
            .await;
        }
        let follower = {
            let run = Arc::clone(&run);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                run.follow(2, |_, json| {
                    seen.push(json);
                    async { true }
                })
                .await;
                seen
            })
        };
        sink.emit(ResponseEvent::Error {
            code: None,
            message: "late".into(),
            param: None,
        })
        .await;
        run.finish();
        let seen = follower.await.unwrap();
        assert_eq!(seen.len(), 2);
        assert!(seen[0].contains("\"sequence_number\":2"), "{}", seen[0]);
        assert!(seen[1].contains("late"));
    }
}
