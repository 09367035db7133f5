//! Data parallelism on one host (`--data-parallel-size N`): N engine cores in one process,
//! each an unchanged engine loop with its own scheduler, KV cache (the full configured
//! budget each, as every vLLM DP rank sizes its own cache), thread pool and metrics, over one
//! copy of the weights (`Arc`). The [`crate::EngineClient`] routes each request with
//! [`PrefixBalancer`], aborts it on the engine that owns it (the rank is the request id
//! modulo N), and answers for all of them (alive only when every engine is; stats summed).
//! LoRA adapters live in one registry the engines share, so a load or unload reaches all.

mod affinity;
mod balancer;

pub use affinity::parse_cpu_affinity;
pub(crate) use affinity::pin_current_thread;
pub use balancer::{choose_engine, PrefixBalancer, LOCALITY_SLACK, ROUTING_BLOCKS};

use crate::EngineError;

/// Compute threads of one of `ranks` engines: `--threads` split evenly, else the engine's
/// CPU set, else the machine's cores split evenly; at least one.
pub fn threads_per_engine(
    num_threads: Option<usize>,
    ranks: usize,
    cpus: Option<&[usize]>,
) -> usize {
    let ranks = ranks.max(1);
    match (num_threads, cpus) {
        (Some(threads), _) => threads / ranks,
        (None, Some(cpus)) => cpus.len(),
        (None, None) => std::thread::available_parallelism().map_or(1, |n| n.get()) / ranks,
    }
    .max(1)
}

/// Runs `build` for engine `rank`: on this thread, or with a CPU set on a fresh thread pinned
/// to it, so that the threads `build` starts (the pool, the engine loop) inherit the set.
pub(crate) fn on_cpus<T: Send>(
    rank: usize,
    cpus: Option<&[usize]>,
    build: impl FnOnce() -> T + Send,
) -> Result<T, EngineError> {
    let Some(cpus) = cpus else {
        return Ok(build());
    };
    std::thread::scope(|scope| {
        let builder = std::thread::Builder::new()
            .name(format!("engine-start-{rank}"))
            .spawn_scoped(scope, || {
                pin_current_thread(rank, cpus);
                build()
            })?;
        builder
            .join()
            .map_err(|_| EngineError::Config(format!("starting engine {rank} panicked")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_split_between_engines() {
        assert_eq!(threads_per_engine(Some(8), 2, None), 4);
        assert_eq!(threads_per_engine(Some(8), 2, Some(&[0, 1, 2])), 4);
        assert_eq!(threads_per_engine(Some(1), 4, None), 1);
        assert_eq!(threads_per_engine(None, 2, Some(&[0, 1, 2])), 3);
        assert!(threads_per_engine(None, 1000, None) >= 1);
    }
}
