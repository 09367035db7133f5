//! Snapshots of engine state for metrics, logs and health checks.

use tokenmill_core::capacity;

use tokenmill_models::KvCacheDType;

use crate::CacheDtype;

/// Engine state after the most recent step. Counters are cumulative since start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    pub num_running: usize,
    pub num_waiting: usize,
    /// Used blocks / total blocks, 0..=1 (cached free blocks do not count as used); with
    /// recurrent-state slots, used bytes of blocks and slots over all of them.
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
    /// Recurrent-state slots (0 for a model without recurrent layers).
    pub num_state_slots: usize,
    /// Of those, slots no request holds.
    pub num_free_state_slots: usize,
}

impl EngineStats {
    /// Several data-parallel engines' states as one: counts and counters summed, KV usage
    /// over all their blocks.
    pub fn combined(engines: &[EngineStats]) -> EngineStats {
        let mut total = EngineStats::default();
        let mut used_blocks = 0.0;
        for engine in engines {
            total.num_running += engine.num_running;
            total.num_waiting += engine.num_waiting;
            total.prefix_cache_queries += engine.prefix_cache_queries;
            total.prefix_cache_hits += engine.prefix_cache_hits;
            total.num_preemptions += engine.num_preemptions;
            total.num_steps += engine.num_steps;
            total.prompt_tokens += engine.prompt_tokens;
            total.generation_tokens += engine.generation_tokens;
            total.last_step_tokens += engine.last_step_tokens;
            total.num_blocks += engine.num_blocks;
            total.num_free_blocks += engine.num_free_blocks;
            total.num_cached_free_blocks += engine.num_cached_free_blocks;
            total.num_state_slots += engine.num_state_slots;
            total.num_free_state_slots += engine.num_free_state_slots;
            used_blocks += engine.kv_cache_usage * engine.num_blocks as f64;
        }
        total.kv_cache_usage = match engines {
            [only] => only.kv_cache_usage,
            _ if total.num_blocks > 0 => used_blocks / total.num_blocks as f64,
            _ => 0.0,
        };
        total
    }
}

/// The KV capacity the engine started with (vLLM's start-up lines).
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityReport {
    pub kv_cache_bytes: u64,
    /// `--kv-cache-dtype` as given.
    pub kv_cache_dtype: CacheDtype,
    /// The element type it stores (`auto` resolved for the model).
    pub kv_storage: KvCacheDType,
    pub num_blocks: u32,
    pub block_size: usize,
    pub max_model_len: usize,
    /// The most blocks one max-length request holds at once, over all KV cache groups:
    /// `max_model_len` in blocks per full-attention group, fewer in sliding-window groups
    /// whose blocks before the window are released.
    pub blocks_per_request: usize,
    /// KV cache groups sharing the pool (1 unless the hybrid KV cache manager groups the
    /// layers): a sequence position takes one block slot in each.
    pub num_kv_cache_groups: usize,
    /// Recurrent-state slots reserved out of `kv_cache_bytes` before the blocks (0 for a model
    /// without recurrent layers): one per sequence that may run (`max_num_seqs`).
    pub num_state_slots: usize,
    /// Bytes of one state slot over all recurrent layers.
    pub bytes_per_state_slot: u64,
}

impl CapacityReport {
    /// Tokens the cache holds: blocks per group times the block size (vLLM's
    /// `num_blocks // len(kv_cache_groups) * block_size`).
    pub fn num_tokens(&self) -> usize {
        let blocks_per_group = self.num_blocks / self.num_kv_cache_groups.max(1) as u32;
        capacity::kv_cache_size_tokens(blocks_per_group, self.block_size)
    }

    /// Bytes the recurrent-state slots take out of the KV cache memory.
    pub fn state_bytes(&self) -> u64 {
        (self.num_state_slots as u64).saturating_mul(self.bytes_per_state_slot)
    }

    /// Max-length requests that can run at once: what the blocks hold, and with recurrent
    /// layers at most one per state slot.
    pub fn max_concurrency(&self) -> f64 {
        let blocks = capacity::block_concurrency(self.num_blocks, self.blocks_per_request);
        if self.num_state_slots > 0 {
            blocks.min(self.num_state_slots as f64)
        } else {
            blocks
        }
    }

    /// vLLM's start-up lines after a line naming the cache's element type; for a model with
    /// recurrent layers a last line gives the state slots (the concurrency line counts them).
    pub fn log_lines(&self) -> Vec<String> {
        let storage = self.kv_storage;
        let bytes = storage.element_bytes();
        let mut lines = vec![
            format!(
                "KV cache dtype: {} (stored as {storage}, {bytes} byte{} per element)",
                self.kv_cache_dtype,
                if bytes == 1 { "" } else { "s" }
            ),
            capacity::available_memory_line(self.kv_cache_bytes),
            capacity::kv_cache_size_line(self.num_tokens()),
            capacity::concurrency_line(self.max_concurrency(), self.max_model_len),
        ];
        if self.num_state_slots > 0 {
            lines.push(capacity::state_cache_line(
                self.num_state_slots,
                self.bytes_per_state_slot,
            ));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_stats_sum_counts_and_weigh_kv_usage_by_blocks() {
        let a = EngineStats {
            num_running: 2,
            num_waiting: 1,
            kv_cache_usage: 0.5,
            num_blocks: 100,
            generation_tokens: 7,
            ..Default::default()
        };
        let b = EngineStats {
            num_running: 1,
            kv_cache_usage: 0.25,
            num_blocks: 100,
            generation_tokens: 3,
            ..Default::default()
        };
        let total = EngineStats::combined(&[a.clone(), b]);
        assert_eq!((total.num_running, total.num_waiting), (3, 1));
        assert_eq!(total.generation_tokens, 10);
        assert_eq!(total.num_blocks, 200);
        assert!((total.kv_cache_usage - 0.375).abs() < 1e-12);
        assert_eq!(EngineStats::combined(std::slice::from_ref(&a)), a);
    }

    #[test]
    fn capacity_lines_have_vllm_shape() {
        let report = CapacityReport {
            kv_cache_bytes: 4_789_000_000,
            kv_cache_dtype: CacheDtype::Fp8,
            kv_storage: KvCacheDType::Fp8E4m3,
            num_blocks: 38_314,
            block_size: 16,
            max_model_len: 131_072,
            blocks_per_request: 8_192,
            num_kv_cache_groups: 1,
            num_state_slots: 0,
            bytes_per_state_slot: 0,
        };
        let lines = report.log_lines();
        let [dtype, memory, size, concurrency] = &lines[..] else {
            panic!("four lines without state slots: {lines:?}");
        };
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
        let auto = CapacityReport {
            kv_cache_dtype: CacheDtype::Auto,
            kv_storage: KvCacheDType::F16,
            ..report
        };
        assert_eq!(
            auto.log_lines()[0],
            "KV cache dtype: auto (stored as f16, 2 bytes per element)"
        );
        // Six groups share the blocks: each position takes one block slot in every group.
        let hybrid = CapacityReport {
            num_kv_cache_groups: 6,
            blocks_per_request: 8_192 + 5 * 161,
            ..report
        };
        assert_eq!(hybrid.log_lines()[2], "KV cache size: 102,160 tokens");
        assert_eq!(
            hybrid.log_lines()[3],
            "Maximum concurrency for 131,072 tokens per request: 4.26x"
        );
        // Recurrent layers: the blocks hold 4.68 max-length requests, but 3 state slots run
        // at most 3; the slots' bytes get a line of their own.
        let with_state = CapacityReport {
            num_state_slots: 3,
            bytes_per_state_slot: 18 << 20,
            ..report
        };
        let lines = with_state.log_lines();
        assert_eq!(lines.len(), 5);
        assert_eq!(
            lines[3],
            "Maximum concurrency for 131,072 tokens per request: 3.00x"
        );
        assert_eq!(
            lines[4],
            "Recurrent state cache: 3 slots of 18.00 MiB (0.05 GiB), one per running sequence"
        );
        assert_eq!(with_state.state_bytes(), 3 * (18 << 20));
        let roomy = CapacityReport {
            num_state_slots: 64,
            ..with_state
        };
        assert!((roomy.max_concurrency() - 38_314.0 / 8_192.0).abs() < 1e-12);
    }
}
