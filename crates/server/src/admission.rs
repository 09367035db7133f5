//! A bound on the expensive work a request needs before it reaches the engine: chat-template
//! renders, grammar and schema compiles, and tokenizing long prompts. Each job runs on the
//! blocking pool (never on an async worker that `/health`, `/metrics` and every stream share)
//! and at most `jobs` of them run at once, so N hostile requests occupy N permits, not every
//! core or tokio's 512 blocking threads. Callers beyond the permits wait in turn; beyond
//! [`QUEUED_PER_JOB`] waiting per permit they get a 503 with `Retry-After` at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::error::ApiError;

/// Texts up to this many bytes tokenize inline: a few thousand tokens take about a
/// millisecond, less than the hop to the pool is worth. Longer ones go through the pool.
pub(crate) const INLINE_TOKENIZE_BYTES: usize = 16 << 10;

/// Waiting callers per permit before new ones get a 503.
const QUEUED_PER_JOB: usize = 64;

/// The admission pool's permits and its waiting count (`Clone` shares both).
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    permits: Arc<Semaphore>,
    waiting: Arc<AtomicUsize>,
    jobs: usize,
}

/// Counts one caller as waiting until it holds a permit or gives up (a dropped future: the
/// client went away).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    /// A pool running at most `jobs` (at least 1) jobs at once.
    pub(crate) fn new(jobs: usize) -> Admission {
        let jobs = jobs.max(1);
        Admission {
            permits: Arc::new(Semaphore::new(jobs)),
            waiting: Arc::new(AtomicUsize::new(0)),
            jobs,
        }
    }

    /// Jobs running now.
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        self.jobs - self.permits.available_permits()
    }

    /// Callers waiting for a permit now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Runs `work` on the blocking pool once a permit is free. The permit is held until the
    /// work ends, even if the caller stops waiting for it (the core is busy either way). A
    /// panic in `work` is a 500 whose details go to the log (`what` names the job there).
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let permit = {
            let _waiting = self.enter_queue()?;
            Arc::clone(&self.permits)
                .acquire_owned()
                .await
                .map_err(|e| ApiError::Internal(format!("{what}: admission pool closed: {e}")))?
        };
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| ApiError::Internal(format!("{what} task: {e}")))
    }

    fn enter_queue(&self) -> Result<Waiting<'_>, ApiError> {
        let before = self.waiting.fetch_add(1, Ordering::AcqRel);
        let waiting = Waiting(&self.waiting);
        if before >= self.jobs.saturating_mul(QUEUED_PER_JOB)
            && self.permits.available_permits() == 0
        {
            return Err(ApiError::unavailable(format!(
                "The server is busy preparing other requests ({} running, {before} waiting); \
                 retry later.",
                self.jobs
            )));
        }
        Ok(waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_than_the_permits_run_at_once_and_all_finish() {
        let admission = Admission::new(2);
        let now = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let jobs = (0..24).map(|i| {
            let admission = admission.clone();
            let (now, peak) = (Arc::clone(&now), Arc::clone(&peak));
            tokio::spawn(async move {
                admission
                    .run("test job", move || {
                        let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(running, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(5));
                        now.fetch_sub(1, Ordering::SeqCst);
                        i
                    })
                    .await
            })
        });
        let results = futures::future::join_all(jobs).await;
        let mut done: Vec<usize> = results
            .into_iter()
            .map(|r| r.ok().and_then(|r| r.ok()))
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        done.sort_unstable();
        assert_eq!(done, (0..24).collect::<Vec<_>>());
        assert_eq!(peak.load(Ordering::SeqCst), 2, "at most two jobs at once");
        assert_eq!((admission.running(), admission.waiting()), (0, 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_is_a_503_and_a_gone_caller_leaves_it() {
        let admission = Admission::new(1);
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let (started, is_started) = tokio::sync::oneshot::channel();
        let blocker = {
            let admission = admission.clone();
            tokio::spawn(async move {
                admission
                    .run("blocker", move || {
                        let _ = started.send(());
                        let _ = hold.recv();
                    })
                    .await
            })
        };
        assert!(is_started.await.is_ok());
        assert_eq!(admission.running(), 1);
        // Fill the queue: every waiter sits behind the blocker.
        let waiters: Vec<_> = (0..QUEUED_PER_JOB)
            .map(|_| {
                let admission = admission.clone();
                tokio::spawn(async move { admission.run("waiter", || ()).await })
            })
            .collect();
        while admission.waiting() < QUEUED_PER_JOB {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let refused = admission.run("one too many", || ()).await;
        let status = refused.err().map(|e| e.to_error_response().status());
        assert_eq!(status, Some(503));
        // A caller that gives up (its client went away) no longer counts as waiting.
        waiters[0].abort();
        while admission.waiting() >= QUEUED_PER_JOB {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(release.send(()).is_ok());
        assert!(matches!(blocker.await, Ok(Ok(()))));
        for waiter in waiters.into_iter().skip(1) {
            assert!(matches!(waiter.await, Ok(Ok(()))));
        }
        assert_eq!((admission.running(), admission.waiting()), (0, 0));
    }

    #[tokio::test]
    async fn a_panicking_job_is_a_500_and_frees_its_permit() {
        let admission = Admission::new(1);
        let failed = admission
            .run("panicking job", || -> u32 { panic!("boom") })
            .await;
        let status = failed.err().map(|e| e.to_error_response().status());
        assert_eq!(status, Some(500));
        assert_eq!(admission.run("next", || 7).await.ok(), Some(7));
    }
}
