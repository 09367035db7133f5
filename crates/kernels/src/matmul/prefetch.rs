//! Software prefetch of the weight streams the group kernels read (hints only: no result
//! depends on them).
//!
//! A kernel call walks one group (AVX2: eight weight rows) or two (AVX-512 VNNI: sixteen) block
//! by block, and the driver's next call reads the groups stored right after. The hardware
//! prefetchers alone left the kernels waiting on memory at every row count below the AMX
//! threshold (perf put the samples on each block's first load), so each block asks for the
//! block a fixed distance ahead in its own stream and, where a call reads two groups, for the
//! same block of the next call's groups (the in-stream hint past a group's end lands in the
//! group the same call is already reading, so the next call's first blocks were never asked
//! for early).

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

/// How far ahead in its own stream the VNNI kernels prefetch: the first whole group-block at
/// least this many bytes on. K-quant super-blocks (1152-1680 bytes per group) are one block
/// ahead: one-row calls alternating 0/1/2/4 blocks ahead in one process (Xeon, two threads,
/// 128256 × 2048 Q6_K and 131072 × 2048 Q4_K, memory-bound) took 28.1/22.6/23.9/25.2 ms and
/// 20.3/17.5/17.6/21.0 ms (medians); the 32-element block types (144-272 bytes per group) are
/// four to seven blocks ahead.
pub(crate) const VNNI_AHEAD_BYTES: usize = 1024;

/// How far ahead the AVX2 kernels (one group per call) prefetch. Xeon, two threads, the AVX2
/// path forced (`TOKENMILL_KERNELS=avx2`), default model, one-row decode (ctx 0 -> 128),
/// alternated: none 143.2 / 146.5 tok/s, 1024 bytes 181.4 / 179.5, 2048 bytes 199.6 / 209.6 /
/// 188.5 / 188.0, 3072 bytes 169.9 / 190.0, 4096 bytes 175.6 / 172.0; 1B-shape Q4_K_M decode
/// 20.8 / 21.7 -> 23.0 / 24.9 tok/s at 2048. Not measured on an AMD host.
pub(crate) const AVX2_AHEAD_BYTES: usize = 2048;

/// Prefetches, into L1, every cache line of the group-block that starts at `base + ahead`,
/// where `ahead` is `ahead_bytes` rounded up to whole blocks of `stride` bytes (one block at
/// least).
#[inline(always)]
pub(crate) fn stream(base: *const u8, stride: usize, ahead_bytes: usize) {
    let ahead = ahead_bytes.div_ceil(stride).max(1) * stride;
    block(base.wrapping_add(ahead), stride);
}

/// Prefetches, into L1, every cache line of the `stride` bytes at `at`.
#[inline(always)]
pub(crate) fn block(at: *const u8, stride: usize) {
    let mut line = 0;
    while line < stride {
        // SAFETY: a prefetch never faults, whatever the address (wrapping arithmetic: no
        // pointer past its allocation is formed by `add`).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line).cast()) };
        line += 64;
    }
}
