//! Snapshots of engine state for metrics, logs and health checks.

use tokenmill_core::capacity;

use crate::CacheDtype;

/// Engine state after the most recent step. Counters are cumulative since start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    pub num_running: usize,
    pub num_waiting: usize,
    /// Used blocks / total blocks, 0..=1 (cached free blocks do not count as used).
    pub kv_cache_usage: f64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub num_preemptions: u64,
    pub num_steps: u64,
    /// Prompt tokens computed (prefill), cumulative.
    pub prompt_tokens: u64,
    /// Tokens generated, cumulative.
    pub generation_tokens: u64,
    /// Tokens scheduled in the most recent step.
    pub last_step_tokens: usize,
    pub num_blocks: usize,
    /// Blocks on the free queue (including cached ones kept for prefix hits).
    pub num_free_blocks: usize,
    /// Free blocks still holding a cached prefix.
    pub num_cached_free_blocks: usize,
}

/// The KV capacity the engine started with (vLLM's start-up lines).
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityReport {
    pub kv_cache_bytes: u64,
    /// `--kv-cache-dtype` as given.
    pub kv_cache_dtype: CacheDtype,
    pub num_blocks: u32,
    pub block_size: usize,
    pub max_model_len: usize,
}

impl CapacityReport {
    pub fn num_tokens(&self) -> usize {
        capacity::kv_cache_size_tokens(self.num_blocks, self.block_size)
    }

    /// vLLM's start-up lines, one per element, after a line naming the cache's element type.
    pub fn log_lines(&self) -> [String; 4] {
        let storage = self.kv_cache_dtype.storage();
        let bytes = storage.element_bytes();
        [
            format!(
                "KV cache dtype: {} (stored as {storage}, {bytes} byte{} per element)",
                self.kv_cache_dtype,
                if bytes == 1 { "" } else { "s" }
            ),
            capacity::available_memory_line(self.kv_cache_bytes),
            capacity::kv_cache_size_line(self.num_blocks, self.block_size),
            capacity::max_concurrency_line(self.num_blocks, self.block_size, self.max_model_len),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_lines_have_vllm_shape() {
        let report = CapacityReport {
            kv_cache_bytes: 4_789_000_000,
            kv_cache_dtype: CacheDtype::Fp8,
            num_blocks: 38_314,
            block_size: 16,
            max_model_len: 131_072,
        };
        let [dtype, memory, size, concurrency] = report.log_lines();
        assert_eq!(
            dtype,
            "KV cache dtype: fp8 (stored as fp8_e4m3, 1 byte per element)"
        );
        assert_eq!(memory, "Available KV cache memory: 4.46 GiB");
        assert_eq!(size, "KV cache size: 613,024 tokens");
        assert_eq!(
            concurrency,
            "Maximum concurrency for 131,072 tokens per request: 4.68x"
        );
    }
}
