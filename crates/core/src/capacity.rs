//! Sizing the KV cache: blocks from a memory budget, and the numbers of vLLM's start-up lines
//! `Available KV cache memory: 4.46 GiB`, `KV cache size: 613,024 tokens` and
//! `Maximum concurrency for 131,072 tokens per request: 4.68x`.

/// Bytes one block occupies across all layers: keys and values of `block_size` tokens.
pub fn bytes_per_block(
    num_layers: usize,
    block_size: usize,
    num_kv_heads: usize,
    head_dim: usize,
    bytes_per_element: usize,
) -> usize {
    2usize
        .saturating_mul(num_layers)
        .saturating_mul(block_size)
        .saturating_mul(num_kv_heads)
        .saturating_mul(head_dim)
        .saturating_mul(bytes_per_element)
}

/// Whole blocks that fit in `budget_bytes` (0 when a block has no size), capped to the
/// largest pool [`crate::BlockPool`] accepts.
pub fn num_blocks_for_budget(budget_bytes: u64, bytes_per_block: usize) -> u32 {
    if bytes_per_block == 0 {
        return 0;
    }
    let blocks = budget_bytes / bytes_per_block as u64;
    u32::try_from(blocks)
        .unwrap_or(u32::MAX - 1)
        .min(u32::MAX - 1)
}

/// Tokens the whole cache holds.
pub fn kv_cache_size_tokens(num_blocks: u32, block_size: usize) -> usize {
    (num_blocks as usize).saturating_mul(block_size)
}

/// How many requests of `tokens_per_request` tokens fit at once, counting whole blocks per
/// request as vLLM does.
pub fn max_concurrency(num_blocks: u32, block_size: usize, tokens_per_request: usize) -> f64 {
    let blocks_per_request = tokens_per_request.div_ceil(block_size.max(1));
    if blocks_per_request == 0 {
        return 0.0;
    }
    f64::from(num_blocks) / blocks_per_request as f64
}

/// `613024` → `613,024` (Python's `{:,}`).
pub fn format_thousands(value: usize) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `Available KV cache memory: 4.46 GiB`
pub fn available_memory_line(budget_bytes: u64) -> String {
    format!(
        "Available KV cache memory: {:.2} GiB",
        budget_bytes as f64 / f64::from(1u32 << 30)
    )
}

/// `KV cache size: 613,024 tokens` for a cache of `num_tokens` tokens (with several KV cache
/// groups: the blocks per group times the block size, see
/// [`crate::KvCacheConfig::num_tokens`]).
pub fn kv_cache_size_line(num_tokens: usize) -> String {
    format!("KV cache size: {} tokens", format_thousands(num_tokens))
}

/// `Maximum concurrency for 131,072 tokens per request: 4.68x`, where one such request holds
/// at most `blocks_per_request` blocks at once (`max_model_len` in whole blocks; fewer under a
/// sliding window, see [`crate::KvCacheConfig::max_blocks_per_request`]).
pub fn max_concurrency_line(
    num_blocks: u32,
    blocks_per_request: usize,
    max_model_len: usize,
) -> String {
    concurrency_line(
        block_concurrency(num_blocks, blocks_per_request),
        max_model_len,
    )
}

/// Max-length requests the blocks hold at once when each holds `blocks_per_request`.
pub fn block_concurrency(num_blocks: u32, blocks_per_request: usize) -> f64 {
    if blocks_per_request == 0 {
        0.0
    } else {
        f64::from(num_blocks) / blocks_per_request as f64
    }
}

/// `Maximum concurrency for 131,072 tokens per request: 4.68x` for a computed `concurrency`
/// (with recurrent-state slots: the blocks' concurrency capped by the slots, one per running
/// sequence).
pub fn concurrency_line(concurrency: f64, max_model_len: usize) -> String {
    format!(
        "Maximum concurrency for {} tokens per request: {concurrency:.2}x",
        format_thousands(max_model_len),
    )
}

/// `Recurrent state cache: 64 slots of 18.00 MiB (1.12 GiB), one per running sequence`: what
/// a hybrid model's recurrent layers reserve out of the KV cache memory.
pub fn state_cache_line(num_slots: usize, bytes_per_slot: u64) -> String {
    let mib = bytes_per_slot as f64 / f64::from(1u32 << 20);
    let total_gib = num_slots as f64 * bytes_per_slot as f64 / f64::from(1u32 << 30);
    format!(
        "Recurrent state cache: {} slots of {mib:.2} MiB ({total_gib:.2} GiB), one per running \
         sequence",
        format_thousands(num_slots)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_block_bytes() {
        // 30 layers, 3 KV heads of 64, f32 cache, 16-token blocks.
        assert_eq!(bytes_per_block(30, 16, 3, 64, 4), 2 * 30 * 16 * 3 * 64 * 4);
        let per_block = bytes_per_block(30, 16, 3, 64, 4);
        assert_eq!(
            num_blocks_for_budget(per_block as u64 * 10 + 5, per_block),
            10
        );
        assert_eq!(num_blocks_for_budget(100, 0), 0);
    }

    #[test]
    fn vllm_startup_lines() {
        // 38,314 blocks of 16 = 613,024 tokens; 131,072 tokens need 8,192 blocks: 4.68x.
        assert_eq!(
            kv_cache_size_line(kv_cache_size_tokens(38_314, 16)),
            "KV cache size: 613,024 tokens"
        );
        assert_eq!(
            max_concurrency_line(38_314, 131_072 / 16, 131_072),
            "Maximum concurrency for 131,072 tokens per request: 4.68x"
        );
        assert_eq!(
            available_memory_line(4_788_000_000),
            "Available KV cache memory: 4.46 GiB"
        );
        // A 4,096-token window with 512-token steps: 289 blocks a request, not 8,192.
        assert_eq!(
            max_concurrency_line(38_314, 289, 131_072),
            "Maximum concurrency for 131,072 tokens per request: 132.57x"
        );
    }

    #[test]
    fn state_cache_line_names_slots_and_bytes() {
        assert_eq!(
            state_cache_line(64, 18 << 20),
            "Recurrent state cache: 64 slots of 18.00 MiB (1.12 GiB), one per running sequence"
        );
        assert_eq!(
            concurrency_line(3.0, 32_768),
            "Maximum concurrency for 32,768 tokens per request: 3.00x"
        );
    }

    #[test]
    fn concurrency_counts_whole_blocks() {
        assert!((max_concurrency(10, 16, 17) - 5.0).abs() < 1e-12);
        assert_eq!(max_concurrency(10, 16, 0), 0.0);
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(format_thousands(0), "0");
        assert_eq!(format_thousands(999), "999");
        assert_eq!(format_thousands(1_000), "1,000");
        assert_eq!(format_thousands(1_234_567), "1,234,567");
    }
}
