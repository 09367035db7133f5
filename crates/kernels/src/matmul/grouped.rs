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
    let n_groups = layout.out_features().div_ceil(GROUP);
    let per_call = isa.groups_per_call();
    let output = SharedMut::new(out);
    // Whole calls per range, so every range's first group is a multiple of `per_call`.
    pool.parallel_ranges(
        n_groups.div_ceil(per_call),
        super::PIECES_PER_THREAD,
        &|calls| {
            let groups = calls.start * per_call..(calls.end * per_call).min(n_groups);
            // SAFETY: this call alone writes the columns of its groups, rows 0..n of `out`,
            // whose length (n × out_features) the caller checked.
            unsafe { run_groups(layout, isa, activations, 0..n, groups, output) };
        },
    );
}

/// Groups per task when `n_groups` groups are split into about `target_tasks` tasks: whole
/// pairs where the ISA computes two groups per call, so a task's pairs start at even groups
/// whatever the split.
pub(crate) fn groups_per_task(isa: Isa, n_groups: usize, target_tasks: usize) -> usize {
    n_groups
        .div_ceil(target_tasks.max(1))
        .next_multiple_of(isa.groups_per_call())
        .max(1)
}

/// One task of a grouped matmul: activation rows `rows` (rows of `activations` and of `out`,
/// `[rows][out_features]`) against the weight groups `groups`, whose first group is a multiple
/// of [`Isa::groups_per_call`]. Each output element's arithmetic depends only on its weight row
/// and activation row, never on `rows` or `groups`.
///
/// # Safety
/// `out` must hold at least `rows.end × out_features` elements and be alive, and no other
/// thread may touch the columns of `groups` in `rows` while this runs.
pub(crate) unsafe fn run_groups<L: GroupedLayout>(
    layout: &L,
    isa: Isa,
    activations: &QuantizedActivations,
    rows: std::ops::Range<usize>,
    groups: std::ops::Range<usize>,
    output: SharedMut<f32>,
) {
    let out_features = layout.out_features();
    let mut pass_start = groups.start;
    while pass_start < groups.end {
        let pass_end = (pass_start + GROUPS_PER_PASS).min(groups.end);
        let mut i = rows.start;
        while i < rows.end {
            let tile = (rows.end - i).min(ROW_TILE);
            let write = |group: usize, results: &[[f32; GROUP]]| {
                let lanes = GROUP.min(out_features - group * GROUP);
                for (r, values) in results.iter().enumerate() {
                    // SAFETY: the caller gives this task the columns of `groups` in `rows`
                    // alone, and row i + r < rows.end lies inside `out`.
                    let target =
                        unsafe { output.slice_mut((i + r) * out_features + group * GROUP, lanes) };
                    target.copy_from_slice(&values[..lanes]);
                }
            };
            let pass = pass_start..pass_end;
            match tile {
                4 => run_tiles::<L, 4>(layout, isa, pass, activations, i, write),
                3 => run_tiles::<L, 3>(layout, isa, pass, activations, i, write),
                2 => run_tiles::<L, 2>(layout, isa, pass, activations, i, write),
                _ => run_tiles::<L, 1>(layout, isa, pass, activations, i, write),
            }
            i += tile;
        }
        pass_start = pass_end;
    }
}
