//! A persistent fork-join thread pool tuned for many short parallel loops.
//!
//! A decode step runs a few hundred small kernels, each worth a few microseconds of work per
//! core, so waking threads through the OS for every kernel would dominate. Workers spin on an
//! atomic job word for a short while after each job and only then park on a condvar; the
//! caller thread always takes part in the work. Tasks are handed out through an atomic
//! counter, so which thread runs which task varies, but kernels write disjoint outputs whose
//! values never depend on the executing thread.
//!
//! Join protocol: a job is published as an *open* epoch in `state` (high 32 bits epoch, odd =
//! open; low 32 bits = workers inside). A worker enters by incrementing the count with a CAS
//! that also checks the epoch, and leaves by decrementing it. When the caller has run out of
//! tasks it *closes* the epoch and waits only for workers that entered. A worker that is
//! descheduled (the machine is shared) therefore never delays a job it did not join.
//!
//! Panics: a panicking task is caught on whichever thread ran it; the remaining tasks still run,
//! `parallel_for` waits for every entered worker to leave, and then resumes the first panic on
//! the caller with `std::panic::resume_unwind`. No worker can touch the closure after
//! `parallel_for` returns or unwinds, so borrowed data is never used after its lifetime.
//!
//! Re-entrancy: a `parallel_for` issued while the pool is already running a job (from inside a
//! task, or from a second thread sharing the pool) runs its tasks serially on the calling thread.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking. A decode step issues its kernels back to back
/// with gaps well under this, so workers stay hot during generation and sleep when idle.
const SPIN_BEFORE_PARK: Duration = Duration::from_micros(300);

type Task = dyn Fn(usize) + Sync;

/// The job currently published to the workers. Written only by the thread that holds the
/// `busy` flag, while the previous epoch is closed and no worker is inside it.
struct Job {
    task: *const Task,
    n_tasks: usize,
}

fn epoch_of(state: u64) -> u64 {
    state >> 32
}

fn is_open(state: u64) -> bool {
    epoch_of(state) % 2 == 1
}

struct Shared {
    /// `epoch << 32 | workers_inside`; odd epochs are open jobs.
    state: AtomicU64,
    job: UnsafeCell<Job>,
    /// Next task index to hand out.
    next_task: AtomicUsize,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    busy: AtomicBool,
    shutdown: AtomicBool,
    panicked: Mutex<Option<Box<dyn std::any::Any + Send + 'static>>>,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is the only non-Sync field. It is written by the thread holding `busy` while
// the epoch is closed and no worker is inside (count 0, observed with Acquire), then published
// by a Release store of an open epoch. Workers read it only after entering that epoch with an
// AcqRel CAS, and the writer does not write again until they leave (Release decrement). The
// raw task pointer targets a `Sync` closure, so calling it from several threads is allowed.
unsafe impl Sync for Shared {}
// SAFETY: see above; the pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// A fixed set of worker threads that run `parallel_for` jobs together with the caller.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads)
            .finish()
    }
}

impl Default for ThreadPool {
    /// A pool with one thread per available core.
    fn default() -> Self {
        let n_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        ThreadPool::new(n_threads)
    }
}

/// What [`ThreadPool::for_row_chunks`] runs per range: `(first row, rows, each buffer's rows)`.
pub type RowChunkFn<'a, const N: usize> = dyn Fn(usize, usize, [&mut [f32]; N]) + Sync + 'a;

impl ThreadPool {
    /// Starts a pool of `n_threads` threads in total: the caller plus `n_threads - 1` workers
    /// (`0` is treated as `1`). If the OS refuses to spawn a worker, the pool runs with fewer.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        // The AMX tile-data permission is asked for (once per process) before any worker
        // exists and before any kernel runs: see `crate::cpu::amx_enabled`.
        crate::cpu::amx_enabled();
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                task: std::ptr::null::<fn(usize)>() as *const Task,
                n_tasks: 0,
            }),
            next_task: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            panicked: Mutex::new(None),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(n_threads - 1);
        for index in 1..n_threads {
            let worker_shared = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("tokenmill-kernel-{index}"))
                .spawn(move || worker_loop(&worker_shared));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(_) => break,
            }
        }
        let n_threads = workers.len() + 1;
        ThreadPool {
            shared,
            workers,
            n_threads,
        }
    }

    /// Threads that execute tasks, counting the caller.
    pub fn num_threads(&self) -> usize {
        self.n_threads
    }

    /// Row-wise work over several row-major buffers at once: `f(first, rows, parts)` for
    /// consecutive ranges of at most `chunk` rows (`first..first + rows`), where `parts[i]` is
    /// those rows of `buffers[i]` (`widths[i]` values per row), each range's parts handed to
    /// exactly one call. Runs on the calling thread when one range covers every row.
    ///
    /// Panics if a buffer is shorter than `rows` rows of its width or `chunk` is 0.
    pub fn for_row_chunks<const N: usize>(
        &self,
        rows: usize,
        chunk: usize,
        buffers: [&mut [f32]; N],
        widths: [usize; N],
        f: &RowChunkFn<'_, N>,
    ) {
        assert!(chunk > 0, "for_row_chunks: chunk of 0 rows");
        for (buffer, width) in buffers.iter().zip(widths) {
            assert!(
                buffer.len() >= rows * width,
                "for_row_chunks: a buffer is shorter than its rows"
            );
        }
        if rows <= chunk {
            let mut buffers = buffers;
            let parts: [&mut [f32]; N] = std::array::from_fn(|i| {
                let buffer = std::mem::take(&mut buffers[i]);
                &mut buffer[..rows * widths[i]]
            });
            f(0, rows, parts);
            return;
        }
        let shared = buffers.map(SharedMut::new);
        self.parallel_for(rows.div_ceil(chunk), &|task| {
            let first = task * chunk;
            let count = chunk.min(rows - first);
            // SAFETY: task `task` alone gets rows `first..first + count` of every buffer (the
            // ranges of different tasks are disjoint), inside each buffer (lengths checked
            // above), and the buffers outlive the parallel region.
            let parts: [&mut [f32]; N] = std::array::from_fn(|i| unsafe {
                shared[i].slice_mut(first * widths[i], count * widths[i])
            });
            f(first, count, parts);
        });
    }

    /// Runs `f` over disjoint ranges covering `0..n_items` across the caller and the workers,
    /// returning when all have finished. Each thread owns one contiguous share and works
    /// through it front to back in `pieces` calls (so it streams its part of a weight matrix in
    /// order); a thread whose share is done takes pieces from the back of the largest share
    /// still open, so a thread that starts late or runs slow (a busy core on a shared host)
    /// delays the job by at most one piece instead of its whole share. Panics as
    /// [`ThreadPool::parallel_for`].
    pub fn parallel_ranges(
        &self,
        n_items: usize,
        pieces: usize,
        f: &(dyn Fn(std::ops::Range<usize>) + Sync),
    ) {
        let threads = self.n_threads.min(n_items);
        if threads <= 1 {
            if n_items > 0 {
                f(0..n_items);
            }
            return;
        }
        let shares = Shares::new(n_items, threads, pieces);
        self.parallel_for(threads, &|own| {
            while let Some(range) = shares.claim_front(own) {
                f(range);
            }
            while let Some(range) = shares.steal() {
                f(range);
            }
        });
    }

    /// Runs `f(0)`, ..., `f(n_tasks - 1)` across the caller and the workers and returns when all
    /// have finished. Re-raises the first task panic after every task has stopped.
    pub fn parallel_for(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        let serial = n_tasks == 1
            || self.workers.is_empty()
            || self
                .shared
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err();
        if serial {
            for index in 0..n_tasks {
                f(index);
            }
            return;
        }
        let shared = &*self.shared;
        // SAFETY: erasing the closure's lifetime is sound because this function does not return
        // (or unwind) before the epoch is closed and every entered worker has left, after which
        // no worker dereferences the pointer again.
        let task: *const Task =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Task>(f) };
        // SAFETY: we hold `busy`, and the previous epoch was closed with no worker inside, so
        // nobody reads `job` now; the Release store of the open epoch below publishes it.
        unsafe {
            *shared.job.get() = Job { task, n_tasks };
        }
        shared.next_task.store(0, Ordering::Relaxed);
        let closed_epoch = epoch_of(shared.state.load(Ordering::Relaxed));
        let open_epoch = closed_epoch + 1;
        shared.state.store(open_epoch << 32, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = shared
                .sleep_lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            shared.wake.notify_all();
        }

        run_tasks(shared, f, n_tasks);

        // Close the epoch: from here no worker can enter; wait for those inside.
        let closed = shared.state.fetch_add(1 << 32, Ordering::AcqRel) + (1 << 32);
        let mut inside = closed & 0xffff_ffff;
        let mut spins = 0u32;
        while inside != 0 {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            inside = shared.state.load(Ordering::Acquire) & 0xffff_ffff;
        }
        let panic = shared
            .panicked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        shared.busy.store(false, Ordering::Release);
        if let Some(payload) = panic {
            std::panic::resume_unwind(payload);
        }
    }
}

/// The shares of a [`ThreadPool::parallel_ranges`] job: per thread `front << 32 | back` of the
/// items not yet handed out, and the piece size each claim takes.
struct Shares {
    open: Vec<AtomicU64>,
    piece: usize,
}

impl Shares {
    fn new(n_items: usize, threads: usize, pieces: usize) -> Shares {
        assert!(
            u32::try_from(n_items).is_ok(),
            "parallel_ranges: more than u32::MAX items"
        );
        let share = n_items.div_ceil(threads);
        let open = (0..threads)
            .map(|t| {
                AtomicU64::new(Shares::pack(
                    (t * share).min(n_items),
                    ((t + 1) * share).min(n_items),
                ))
            })
            .collect();
        Shares {
            open,
            piece: share.div_ceil(pieces.max(1)).max(1),
        }
    }

    /// A share's state: `front << 32 | back` (both fit: `new` checks the item count).
    fn pack(front: usize, back: usize) -> u64 {
        (front as u64) << 32 | back as u64
    }

    /// `(front, back)` of a share's state.
    fn unpack(state: u64) -> (usize, usize) {
        ((state >> 32) as usize, (state & 0xffff_ffff) as usize)
    }

    /// The next piece from the front of share `own`.
    fn claim_front(&self, own: usize) -> Option<std::ops::Range<usize>> {
        let slot = &self.open[own];
        let mut state = slot.load(Ordering::Acquire);
        loop {
            let (front, back) = Shares::unpack(state);
            if front >= back {
                return None;
            }
            let end = (front + self.piece).min(back);
            match slot.compare_exchange_weak(
                state,
                Shares::pack(end, back),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(front..end),
                Err(now) => state = now,
            }
        }
    }

    /// A piece from the back of the share with the most items left, if any is left.
    fn steal(&self) -> Option<std::ops::Range<usize>> {
        loop {
            let (slot, state) = self
                .open
                .iter()
                .map(|slot| (slot, slot.load(Ordering::Acquire)))
                .max_by_key(|(_, state)| {
                    let (front, back) = Shares::unpack(*state);
                    back.saturating_sub(front)
                })?;
            let (front, back) = Shares::unpack(state);
            if front >= back {
                return None;
            }
            let start = back.saturating_sub(self.piece).max(front);
            if slot
                .compare_exchange(
                    state,
                    Shares::pack(front, start),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                return Some(start..back);
            }
        }
    }
}

/// Claims and runs tasks until none are left, recording the first panic.
fn run_tasks(shared: &Shared, task: &(dyn Fn(usize) + Sync), n_tasks: usize) {
    loop {
        let index = shared.next_task.fetch_add(1, Ordering::Relaxed);
        if index >= n_tasks {
            break;
        }
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| task(index))) {
            let mut slot = shared
                .panicked
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() {
                *slot = Some(payload);
            }
        }
    }
}

/// Waits until the state shows an open epoch other than `last_epoch` (or shutdown).
fn wait_for_job(shared: &Shared, last_epoch: u64) -> u64 {
    let fresh = |state: u64| is_open(state) && epoch_of(state) != last_epoch;
    let started = Instant::now();
    let mut spins = 0u32;
    loop {
        let state = shared.state.load(Ordering::Acquire);
        if fresh(state) || shared.shutdown.load(Ordering::Acquire) {
            return state;
        }
        spins += 1;
        if !spins.is_multiple_of(64) || started.elapsed() < SPIN_BEFORE_PARK {
            std::hint::spin_loop();
            continue;
        }
        let mut guard = shared
            .sleep_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shared.sleepers.fetch_add(1, Ordering::SeqCst);
        loop {
            let state = shared.state.load(Ordering::SeqCst);
            if fresh(state) || shared.shutdown.load(Ordering::SeqCst) {
                shared.sleepers.fetch_sub(1, Ordering::SeqCst);
                return state;
            }
            guard = shared
                .wake
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

fn worker_loop(shared: &Shared) {
    let mut last_epoch = 0u64;
    loop {
        let mut state = wait_for_job(shared, last_epoch);
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Enter the open epoch unless the caller closed it meanwhile.
        let entered = loop {
            if !is_open(state) || epoch_of(state) == last_epoch {
                break false;
            }
            match shared.state.compare_exchange_weak(
                state,
                state + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break true,
                Err(current) => state = current,
            }
        };
        last_epoch = epoch_of(state);
        if !entered {
            continue;
        }
        // SAFETY: entering the open epoch (AcqRel CAS) happens-after the caller's write of
        // `job`, and the caller keeps the closure alive until we leave below.
        let job = unsafe { &*shared.job.get() };
        // SAFETY: the pointer came from a live `&(dyn Fn(usize) + Sync)` (see above).
        let task = unsafe { &*job.task };
        run_tasks(shared, task, job.n_tasks);
        shared.state.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = self
                .shared
                .sleep_lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.shared.wake.notify_all();
        }
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
    }
}

/// A raw pointer to an output buffer that parallel tasks write at disjoint indices.
///
/// Kernels split their output by task (e.g. a range of columns across all rows) in shapes a
/// `chunks_mut` cannot express; each user documents why its writes are disjoint.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the wrapper only hands out element writes that callers prove disjoint across tasks.
unsafe impl<T: Send> Sync for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub(crate) fn new(slice: &mut [T]) -> Self {
        SharedMut {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
        }
    }

    /// Writes `value` at `index`.
    ///
    /// # Safety
    /// No other thread may read or write `index` concurrently, and the buffer must be alive.
    #[inline(always)]
    pub(crate) unsafe fn write(&self, index: usize, value: T) {
        debug_assert!(index < self.len);
        // SAFETY: the caller guarantees exclusivity and that `index` is in bounds.
        unsafe { self.ptr.add(index).write(value) }
    }

    /// A mutable view of `start..start + len`.
    ///
    /// # Safety
    /// No other live reference (on any thread) may overlap this range while the view lives,
    /// and the underlying buffer must outlive it.
    pub(crate) unsafe fn slice_mut<'a>(&self, start: usize, len: usize) -> &'a mut [T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "SharedMut range out of bounds"
        );
        // SAFETY: in bounds (checked above); exclusivity is the caller's obligation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// Every row of every buffer goes to exactly one call, with that row's values, whether
    /// the rows fit one chunk (the calling thread) or several (the pool).
    #[test]
    fn row_chunks_hand_out_every_row_once() {
        let pool = ThreadPool::new(2);
        for rows in [0, 1, 7, 8, 9, 41] {
            let mut a: Vec<f32> = (0..rows * 3).map(|i| i as f32).collect();
            let mut b = vec![0.0f32; rows * 2 + 5];
            pool.for_row_chunks(
                rows,
                8,
                [&mut a, &mut b],
                [3, 2],
                &|first, count, [a, b]| {
                    assert!(count <= 8 && a.len() == 3 * count && b.len() == 2 * count);
                    for (r, (a, b)) in a.chunks_exact_mut(3).zip(b.chunks_exact_mut(2)).enumerate()
                    {
                        assert_eq!(a[0], (3 * (first + r)) as f32);
                        a.iter_mut().for_each(|v| *v = -*v);
                        b.iter_mut().for_each(|v| *v += 1.0);
                    }
                },
            );
            assert!(a.iter().enumerate().all(|(i, &v)| v == -(i as f32)));
            assert!(
                b[..rows * 2].iter().all(|&v| v == 1.0) && b[rows * 2..].iter().all(|&v| v == 0.0)
            );
        }
    }

    #[test]
    fn runs_every_task_exactly_once() {
        for n_threads in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n_threads);
            assert_eq!(pool.num_threads(), n_threads);
            for n_tasks in [0, 1, 2, 7, 100, 1000] {
                let counts: Vec<AtomicU64> = (0..n_tasks).map(|_| AtomicU64::new(0)).collect();
                pool.parallel_for(n_tasks, &|i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            }
        }
    }

    /// Every item goes to exactly one call, in ranges of at most one piece, for any thread
    /// count, item count and piece count.
    #[test]
    fn ranges_cover_every_item_once() {
        for n_threads in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n_threads);
            for n_items in [0usize, 1, 2, 7, 100, 1000] {
                for pieces in [0usize, 1, 3, 4] {
                    let counts: Vec<AtomicU64> = (0..n_items).map(|_| AtomicU64::new(0)).collect();
                    let share = n_items.div_ceil(n_threads.min(n_items).max(1));
                    let piece = share.div_ceil(pieces.max(1)).max(1);
                    pool.parallel_ranges(n_items, pieces, &|range| {
                        assert!(!range.is_empty() && range.end <= n_items, "{range:?}");
                        if n_threads.min(n_items) > 1 {
                            assert!(range.len() <= piece, "{range:?} over a piece of {piece}");
                        }
                        for i in range {
                            counts[i].fetch_add(1, Ordering::Relaxed);
                        }
                    });
                    assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
                }
            }
        }
    }

    /// Owners take pieces from the front of their share; a thief takes from the back of the
    /// share with most items left, and nothing is handed out twice.
    #[test]
    fn shares_hand_out_fronts_to_owners_and_backs_to_thieves() {
        let shares = Shares::new(10, 2, 5);
        assert_eq!(shares.claim_front(0), Some(0..1));
        assert_eq!(shares.claim_front(0), Some(1..2));
        // Share 1 (5..10) has the most left.
        assert_eq!(shares.steal(), Some(9..10));
        assert_eq!(shares.claim_front(1), Some(5..6));
        // Now share 0 (2..5) and share 1 (6..9) tie; whichever is robbed loses its back item.
        let stolen = shares.steal().expect("items left");
        assert!(stolen == (4..5) || stolen == (8..9), "{stolen:?}");
        let mut rest = Vec::new();
        while let Some(range) = shares.claim_front(0).or_else(|| shares.claim_front(1)) {
            rest.push(range);
        }
        assert_eq!(shares.steal(), None);
        let mut items: Vec<usize> = [0..1, 1..2, 9..10, 5..6, stolen]
            .into_iter()
            .chain(rest)
            .flatten()
            .collect();
        items.sort_unstable();
        assert_eq!(items, (0..10).collect::<Vec<_>>());
    }

    /// A thread held up inside its first piece costs the job that piece only: the other
    /// thread runs every other piece, its own share and the stalled one's.
    #[test]
    fn a_stalled_share_is_taken_over() {
        let pool = ThreadPool::new(2);
        let first = std::sync::Mutex::new(None);
        let by_stalled = AtomicU64::new(0);
        let by_other = AtomicU64::new(0);
        pool.parallel_ranges(64, 4, &|range| {
            let me = std::thread::current().id();
            let stalled = *first
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert(me)
                == me;
            if stalled && by_stalled.load(Ordering::Relaxed) == 0 {
                std::thread::sleep(Duration::from_millis(200));
            }
            let counter = if stalled { &by_stalled } else { &by_other };
            counter.fetch_add(range.len() as u64, Ordering::Relaxed);
        });
        // Shares of 32 items in pieces of 8: the stalled thread ran its first piece only.
        assert_eq!(by_stalled.load(Ordering::Relaxed), 8);
        assert_eq!(by_other.load(Ordering::Relaxed), 56);
    }

    #[test]
    fn many_back_to_back_jobs() {
        let pool = ThreadPool::new(2);
        let total = AtomicU64::new(0);
        for round in 0..5000u64 {
            pool.parallel_for(4, &|i| {
                total.fetch_add(round * 4 + i as u64, Ordering::Relaxed);
            });
        }
        let n = 5000u64 * 4;
        assert_eq!(total.load(Ordering::Relaxed), n * (n - 1) / 2);
    }

    #[test]
    fn wakes_parked_workers() {
        let pool = ThreadPool::new(3);
        let total = AtomicU64::new(0);
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(5));
            pool.parallel_for(16, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 48);
    }

    #[test]
    fn nested_calls_run_serially() {
        let pool = ThreadPool::new(2);
        let total = AtomicU64::new(0);
        pool.parallel_for(4, &|_| {
            pool.parallel_for(3, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn task_panic_propagates_after_all_tasks_finish() {
        let pool = ThreadPool::new(2);
        let finished = AtomicU64::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.parallel_for(64, &|i| {
                if i == 5 {
                    panic!("task five failed");
                }
                finished.fetch_add(1, Ordering::Relaxed);
            });
        }));
        assert!(result.is_err());
        assert_eq!(finished.load(Ordering::Relaxed), 63);
        // The pool stays usable.
        let total = AtomicU64::new(0);
        pool.parallel_for(8, &|_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 8);
    }
}
