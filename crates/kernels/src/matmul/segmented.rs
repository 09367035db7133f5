//! Several matrices of one shape, each over its own run of rows, in one call: the grouped
//! GEMM of a mixture-of-experts layer, where every expert multiplies the rows routed to it.
//!
//! Segments on the eight-row group layouts that AMX does not take share one parallel region:
//! its tasks are (segment, run of groups) pairs, so a decode step's eight small expert
//! products cost one fork-join instead of eight, and the pool's threads split the work across
//! experts rather than only within one. Their activations are quantized once, per row. Other
//! segments (AMX-sized ones, float weights) run as ordinary [`QMatrix::matmul`] calls. Every
//! output element comes from the same per-(weight row, activation row) arithmetic as
//! `QMatrix::matmul` of that segment alone, so results are bitwise those of one call per
//! segment, whatever the other segments are.

use super::grouped::{groups_per_task, run_groups, GROUP};
use super::{Isa, MatmulScratch, QMatrix, Storage};
use crate::pool::{SharedMut, ThreadPool};
use crate::KernelError;

/// The segments of [`QMatrix::matmul_segments`]: segment `s` is rows
/// `starts[s]..starts[s + 1]` of the input and the output, multiplied by `weight(s)`.
#[derive(Clone, Copy)]
pub struct Segments<'a, 'w> {
    /// Row boundaries, non-decreasing, one more than the segments.
    pub starts: &'a [usize],
    /// Each segment's matrix; all of one shape.
    pub weight: &'a (dyn Fn(usize) -> &'w QMatrix + Sync),
}

impl std::fmt::Debug for Segments<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segments")
            .field("starts", &self.starts)
            .finish_non_exhaustive()
    }
}

impl Segments<'_, '_> {
    fn count(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    fn rows(&self, s: usize) -> std::ops::Range<usize> {
        self.starts[s]..self.starts[s + 1]
    }
}

impl QMatrix {
    /// `out[r] = x[r] · W(s)ᵀ` for every row `r` of every segment `s` (`x` is `[n][in]`,
    /// `out` `[n][out]`, `n = starts[last]`; empty segments are skipped). Bitwise equal to
    /// [`QMatrix::matmul`] of each segment's rows alone.
    pub fn matmul_segments(
        pool: &ThreadPool,
        segments: Segments<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut MatmulScratch,
    ) -> Result<(), KernelError> {
        let count = segments.count();
        let Some(n) = segments.starts.last().copied().filter(|&n| n > 0) else {
            return Ok(());
        };
        let first = (segments.weight)(0);
        let (k, m) = (first.in_features, first.out_features);
        check_segments(segments, k, m)?;
        first.check_shapes(x, n, out)?;
        let isa = Isa::detect();
        let shared = |s: usize| shares_region((segments.weight)(s), segments.rows(s).len());
        let n_shared = (0..count).filter(|&s| shared(s)).count();
        if n_shared > 0 && m > 0 {
            let activations = &mut scratch.activations;
            let non_empty = (0..count).filter(|&s| !segments.rows(s).is_empty()).count();
            if n_shared == non_empty {
                activations.quantize(pool, x, n, k)?;
            } else {
                activations.resize(n, k)?;
                for s in (0..count).filter(|&s| shared(s)) {
                    activations.quantize_rows(x, segments.rows(s));
                }
            }
            let activations = &*activations;
            let n_groups = m.div_ceil(GROUP);
            let target_tasks = pool.num_threads() * 4;
            let chunks = target_tasks.div_ceil(n_shared).max(1);
            let per_task = groups_per_task(isa, n_groups, chunks);
            let chunks = n_groups.div_ceil(per_task);
            let output = SharedMut::new(out);
            pool.parallel_for(count * chunks, &|task| {
                let s = task / chunks;
                if !shared(s) {
                    return;
                }
                let start = (task % chunks) * per_task;
                let groups = start..(start + per_task).min(n_groups);
                let rows = segments.rows(s);
                // SAFETY: segments are disjoint in rows and chunks in groups, so this task
                // alone writes these rows' columns of `groups`; `out` holds n × m elements
                // (checked above) and rows.end <= n.
                unsafe {
                    match &(segments.weight)(s).storage {
                        Storage::Interleaved(g) => {
                            run_groups(g, isa, activations, rows, groups, output);
                        }
                        Storage::KQuant(g) => run_groups(g, isa, activations, rows, groups, output),
                        Storage::Float { .. } | Storage::Half { .. } => {}
                    }
                }
            });
        }
        for s in (0..count).filter(|&s| !shared(s)) {
            let rows = segments.rows(s);
            if rows.is_empty() {
                continue;
            }
            (segments.weight)(s).matmul(
                pool,
                &x[rows.start * k..rows.end * k],
                rows.len(),
                &mut out[rows.start * m..rows.end * m],
                scratch,
            )?;
        }
        Ok(())
    }
}

/// Whether a segment of `rows` rows on `weight` runs in the shared region: a group layout
/// that the AMX tiles do not take for that many rows (where [`QMatrix::matmul`] would run the
/// same group kernels).
fn shares_region(weight: &QMatrix, rows: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if super::amx::Amx::detect().is_some() && rows >= super::amx::min_rows(weight.dtype) {
        return false;
    }
    rows > 0 && matches!(weight.storage, Storage::Interleaved(_) | Storage::KQuant(_))
}

fn check_segments(segments: Segments<'_, '_>, k: usize, m: usize) -> Result<(), KernelError> {
    if segments.starts.windows(2).any(|w| w[1] < w[0]) {
        return Err(KernelError::InvalidShape(
            "segmented matmul needs non-decreasing row starts",
        ));
    }
    for s in 0..segments.count() {
        let weight = (segments.weight)(s);
        if weight.in_features != k || weight.out_features != m {
            return Err(KernelError::InvalidShape(
                "segmented matmul needs matrices of one shape",
            ));
        }
    }
    Ok(())
}
