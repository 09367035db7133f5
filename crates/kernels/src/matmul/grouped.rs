//! The matmul driver shared by the eight-row interleaved layouts (`interleaved.rs` for the
//! 32-element block types, `kquant.rs` for the K-quants): output columns are split over the
//! pool by whole groups, and each group meets the activation rows in tiles of up to
//! [`ROW_TILE`]. A layout only supplies the kernel for one (groups, tile) pair; every output
//! element still comes from one per-(weight row, activation row) arithmetic, whatever the tile.

use super::activation::{QuantizedActivations, QuantizedRow};
use super::Isa;
use crate::pool::{SharedMut, ThreadPool};

/// Weight rows per interleaved group: one per 32-bit lane of an AVX2 register.
pub(crate) const GROUP: usize = 8;

/// Results of one kernel call, `[group][activation row][lane]`: the call's first group in
/// `[0]`, and its second in `[1]` where the ISA computes two groups per call
/// ([`Isa::groups_per_call`]).
pub(crate) type PairOut<const R: usize> = [[[f32; GROUP]; R]; 2];

/// The groups one kernel call reads: `first`, and `second` for ISAs that compute two groups
/// per call (the same group as `first` where only one is wanted).
#[derive(Clone, Copy)]
pub(crate) struct GroupPair<'a> {
    pub(crate) first: &'a [u8],
    pub(crate) second: &'a [u8],
    /// Group-blocks per group.
    pub(crate) blocks: usize,
}

/// Activation rows that share each unpacked weight block.
const ROW_TILE: usize = 4;
/// Groups visited for all activation tiles before moving on (sized to stay in L1/L2).
const GROUPS_PER_PASS: usize = 4;

/// A weight layout of eight-row groups.
pub(crate) trait GroupedLayout: Sync {
    /// Rows of the weight (the last group may be padded).
    fn out_features(&self) -> usize;

    /// Computes group `groups[0]` (eight weight rows) against the activation rows `xs`:
    /// `out[0][r][lane]` is weight row `groups[0] · GROUP + lane` against `xs[r]`; ISAs with
    /// [`Isa::groups_per_call`] 2 also compute `groups[1]` into `out[1]` (the driver passes the
    /// same group twice where it wants one).
    fn group_tile<const R: usize>(
        &self,
        isa: Isa,
        groups: [usize; 2],
        xs: &[QuantizedRow<'_>; R],
        out: &mut PairOut<R>,
    );
}

/// Runs activation rows `first_row..first_row + R` against each group in `groups`, handing
/// every group's results (`[row][lane]`) to `write`.
fn run_tiles<L: GroupedLayout, const R: usize>(
    layout: &L,
    isa: Isa,
    groups: std::ops::Range<usize>,
    activations: &QuantizedActivations,
    first_row: usize,
    mut write: impl FnMut(usize, &[[f32; GROUP]]),
) {
    let xs: [QuantizedRow<'_>; R] = std::array::from_fn(|r| activations.row(first_row + r));
    let per_call = isa.groups_per_call();
    for group in groups.clone().step_by(per_call) {
        let second = if group + 1 < groups.end {
            group + per_call - 1
        } else {
            group
        };
        let mut out = [[[0.0f32; GROUP]; R]; 2];
        layout.group_tile::<R>(isa, [group, second], &xs, &mut out);
        write(group, &out[0]);
        if second != group {
            write(second, &out[1]);
        }
    }
}

/// `out[n, out_features] = x · Wᵀ` for activations already quantized into `activations`.
pub(crate) fn matmul_grouped<L: GroupedLayout>(
    layout: &L,
    isa: Isa,
    pool: &ThreadPool,
    activations: &QuantizedActivations,
    n: usize,
    out: &mut [f32],
) {
    let out_features = layout.out_features();
    let n_groups = out_features.div_ceil(GROUP);
    let target_tasks = pool.num_threads() * 4;
    // Whole pairs per task where the ISA computes two groups per call.
    let groups_per_task = n_groups
        .div_ceil(target_tasks)
        .next_multiple_of(isa.groups_per_call())
        .max(1);
    let n_tasks = n_groups.div_ceil(groups_per_task);
    let output = SharedMut::new(out);
    pool.parallel_for(n_tasks, &|task| {
        let first = task * groups_per_task;
        let last = (first + groups_per_task).min(n_groups);
        let mut pass_start = first;
        while pass_start < last {
            let pass_end = (pass_start + GROUPS_PER_PASS).min(last);
            let mut i = 0;
            while i < n {
                let rows = (n - i).min(ROW_TILE);
                let write = |group: usize, results: &[[f32; GROUP]]| {
                    let lanes = GROUP.min(out_features - group * GROUP);
                    for (r, values) in results.iter().enumerate() {
                        // SAFETY: this task alone owns output columns of groups first..last,
                        // and row i + r < n, so the range lies inside `out` (its length was
                        // checked by the caller).
                        let target = unsafe {
                            output.slice_mut((i + r) * out_features + group * GROUP, lanes)
                        };
                        target.copy_from_slice(&values[..lanes]);
                    }
                };
                let groups = pass_start..pass_end;
                match rows {
                    4 => run_tiles::<L, 4>(layout, isa, groups, activations, i, write),
                    3 => run_tiles::<L, 3>(layout, isa, groups, activations, i, write),
                    2 => run_tiles::<L, 2>(layout, isa, groups, activations, i, write),
                    _ => run_tiles::<L, 1>(layout, isa, groups, activations, i, write),
                }
                i += rows;
            }
            pass_start = pass_end;
        }
    });
}
