//! KV pages are touched lazily: allocating a large cache adds (almost) nothing to the
//! process's resident memory (pages become resident as `write_kv` fills blocks), so an idle
//! server's RSS is the weights plus a small margin, whatever `--kv-cache-memory` says.
//!
//! Reads `RssAnon` from /proc/self/status, so it runs on Linux only (elsewhere it prints a
//! skip). One test in its own binary: no other test allocates in this process meanwhile.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use tokenmill_models::{KvCacheDType, KvCacheStorage, LayerKvLayout};

/// Anonymous resident memory of this process in bytes, where /proc tells it.
fn rss_anon_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("RssAnon:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

const MIB: u64 = 1 << 20;

#[test]
fn kv_pages_become_resident_only_when_written() {
    let Some(before) = rss_anon_bytes() else {
        eprintln!("skipped: no RssAnon in /proc/self/status (not Linux)");
        return;
    };
    // The default model's shape: 30 layers of 3 KV heads × 64; 4,096 blocks of 16 tokens are
    // 65,536 tokens, 1.4 GiB in f16 (2.8 GiB in f32).
    let layout = vec![
        LayerKvLayout {
            num_kv_heads: 3,
            head_dim: 64,
            sliding_window: None,
        };
        30
    ];
    for dtype in [KvCacheDType::F16, KvCacheDType::F32] {
        let (num_blocks, block_size) = (4096, 16);
        let total = KvCacheStorage::bytes_per_block(&layout, block_size, dtype) * num_blocks;
        let cache = KvCacheStorage::with_dtype(&layout, num_blocks, block_size, dtype);
        let allocated = rss_anon_bytes().unwrap();
        let grown = allocated.saturating_sub(before);
        eprintln!(
            "{dtype}: a {} MiB cache added {} KiB of resident memory",
            total as u64 / MIB,
            grown / 1024
        );
        // Untouched: the allocator's zeroed pages stay unmapped until written.
        assert!(
            grown < 16 * MIB,
            "{dtype}: allocating a {} MiB KV cache made {} MiB resident",
            total as u64 / MIB,
            grown / MIB
        );
        assert_eq!(cache.num_blocks(), num_blocks);
        drop(cache);
    }
}
