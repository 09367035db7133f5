//! Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention): the causal depthwise convolution
//! with its rolling window, the per-head preparation of a token (L2-normalised q/k, the decay
//! and beta gates) and the gated delta rule's recurrent update of each head's state.
//!
//! Per value head `h` the state `S` is a `[head_k_dim][head_v_dim]` matrix (row `i` of the key
//! dimension is contiguous). One token with key `k`, query `q` (both L2-normalised, `q` also
//! scaled by `head_k_dim^-1/2`), value `v`, decay `a = exp(g)` and `beta` does
//!
//! ```text
//! S     = a * S
//! mem   = Sᵀ k                 (what the state recalls for this key)
//! delta = (v - mem) * beta
//! S     = S + k ⊗ delta
//! o     = Sᵀ q
//! ```
//!
//! as two passes over the state rows, each a fused multiply-add per element along the value
//! dimension with the key dimension walked in order. Every element's operations are the same
//! whatever the vector width, so the AVX2 and AVX-512 paths ([`DeltaRulePath`]) and the scalar
//! twin give the same bits (tests compare them). A token depends only on its head's state and
//! its own inputs, so running a prompt token by token is exactly batch-invariant: alone,
//! batched, or split into chunks anywhere gives the same state and outputs.

use std::sync::Mutex;

use crate::cpu::CpuFeatures;
use crate::pool::ThreadPool;
use crate::KernelError;

/// Widest value head the recurrence's stack scratch holds (Qwen3.5 / Qwen3-Next: 128).
pub const MAX_HEAD_V_DIM: usize = 256;

/// Which key head a value head reads when there are more value heads than key heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeadOrder {
    /// Value heads are grouped by key head: value head `h` reads key head
    /// `h / (num_v_heads / num_k_heads)` (HF's `repeat_interleave`).
    Grouped,
    /// Value heads cycle through the key heads: value head `h` reads key head
    /// `h % num_k_heads` (llama.cpp's converter reorders the value heads so that ggml's
    /// broadcast works this way).
    Tiled,
}

/// The heads of one Gated DeltaNet layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaRuleShape {
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    pub key_heads: KeyHeadOrder,
}

impl DeltaRuleShape {
    /// Query (and key) width of one token, all key heads.
    pub fn key_dim(&self) -> usize {
        self.num_k_heads * self.head_k_dim
    }

    /// Value width of one token, all value heads.
    pub fn value_dim(&self) -> usize {
        self.num_v_heads * self.head_v_dim
    }

    /// f32 elements of one sequence's recurrent state: one matrix per value head.
    pub fn state_elems(&self) -> usize {
        self.num_v_heads * self.head_k_dim * self.head_v_dim
    }

    /// The key head value head `v_head` reads.
    pub fn key_head(&self, v_head: usize) -> usize {
        match self.key_heads {
            KeyHeadOrder::Grouped => v_head / (self.num_v_heads / self.num_k_heads).max(1),
            KeyHeadOrder::Tiled => v_head % self.num_k_heads.max(1),
        }
    }

    fn validate(&self) -> Result<(), KernelError> {
        let dims = [
            self.num_k_heads,
            self.num_v_heads,
            self.head_k_dim,
            self.head_v_dim,
        ];
        if dims.contains(&0) || !self.num_v_heads.is_multiple_of(self.num_k_heads) {
            return Err(KernelError::InvalidShape(
                "gated delta rule: heads must be positive, value heads a multiple of key heads",
            ));
        }
        if self.head_v_dim > MAX_HEAD_V_DIM {
            return Err(KernelError::InvalidShape(
                "gated delta rule: value heads wider than MAX_HEAD_V_DIM",
            ));
        }
        Ok(())
    }
}

/// The vector path the recurrence runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaRulePath {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl DeltaRulePath {
    /// The widest path this process's [`CpuFeatures`] allow.
    pub fn detect() -> DeltaRulePath {
        DeltaRulePath::from_features(CpuFeatures::get())
    }

    fn from_features(features: &CpuFeatures) -> DeltaRulePath {
        #[cfg(target_arch = "x86_64")]
        {
            let usable = features.usable();
            if usable.avx2 && usable.fma {
                if usable.avx512f {
                    return DeltaRulePath::Avx512;
                }
                return DeltaRulePath::Avx2;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = features;
        DeltaRulePath::Scalar
    }

    /// Every path this CPU runs, widest first, the scalar twin last (for tests and benches).
    pub fn available() -> Vec<DeltaRulePath> {
        let mut paths = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let usable = CpuFeatures::get().usable();
            if usable.avx2 && usable.fma {
                if usable.avx512f {
                    paths.push(DeltaRulePath::Avx512);
                }
                paths.push(DeltaRulePath::Avx2);
            }
        }
        paths.push(DeltaRulePath::Scalar);
        paths
    }

    /// One token's update of one head's `state` (`[q.len()][v.len()]`): see the module docs.
    /// `out` (`v.len()`) receives `Sᵀ q`; `scratch` is at least `v.len()` long.
    #[allow(clippy::too_many_arguments)]
    fn step(
        self,
        state: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        decay: f32,
        beta: f32,
        out: &mut [f32],
        scratch: &mut [f32],
    ) {
        let dv = v.len();
        let (mem, out) = (&mut scratch[..dv], &mut out[..dv]);
        let state = &mut state[..q.len() * dv];
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only chosen (detect/available) when AVX2 and FMA are usable;
            // every slice was cut to the lengths the kernel reads above.
            DeltaRulePath::Avx2 => unsafe {
                x86::recall(state, k, decay, mem);
                delta(v, beta, mem);
                x86::update(state, q, k, mem, out);
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx512` is only chosen when AVX-512 F, AVX2 and FMA are usable; the
            // slices were cut as above.
            DeltaRulePath::Avx512 => unsafe {
                x86::recall_512(state, k, decay, mem);
                delta(v, beta, mem);
                x86::update_512(state, q, k, mem, out);
            },
            DeltaRulePath::Scalar => {
                scalar_recall(state, k, decay, mem, 0);
                delta(v, beta, mem);
                scalar_update(state, q, k, mem, out, 0);
            }
        }
    }
}

/// `mem = v - mem` times `beta`, in place (the same on every path).
fn delta(v: &[f32], beta: f32, mem: &mut [f32]) {
    for (m, &value) in mem.iter_mut().zip(v) {
        *m = (value - *m) * beta;
    }
}

/// First pass from column `from` on: `S *= decay`, `mem = Sᵀ k` (rows in order).
fn scalar_recall(state: &mut [f32], k: &[f32], decay: f32, mem: &mut [f32], from: usize) {
    let dv = mem.len();
    mem[from..].fill(0.0);
    for (row, &key) in state.chunks_exact_mut(dv).zip(k) {
        for (s, m) in row[from..].iter_mut().zip(&mut mem[from..]) {
            let decayed = *s * decay;
            *s = decayed;
            *m = decayed.mul_add(key, *m);
        }
    }
}

/// Second pass from column `from` on: `S += k ⊗ delta`, `out = Sᵀ q` (rows in order).
fn scalar_update(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    delta: &[f32],
    out: &mut [f32],
    from: usize,
) {
    let dv = delta.len();
    out[from..].fill(0.0);
    for ((row, &key), &query) in state.chunks_exact_mut(dv).zip(k).zip(q) {
        for ((s, &d), o) in row[from..]
            .iter_mut()
            .zip(&delta[from..])
            .zip(&mut out[from..])
        {
            let updated = key.mul_add(d, *s);
            *s = updated;
            *o = updated.mul_add(query, *o);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{scalar_recall, scalar_update};

    /// [`scalar_recall`] eight columns at a time (the tail through the scalar twin).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn recall(state: &mut [f32], k: &[f32], decay: f32, mem: &mut [f32]) {
        let dv = mem.len();
        let body = dv - dv % 8;
        let decay8 = _mm256_set1_ps(decay);
        let mut c = 0;
        while c < body {
            let mut acc = _mm256_setzero_ps();
            for (i, &key) in k.iter().enumerate() {
                // SAFETY: c + 8 <= body <= dv, so row i's columns c..c+8 are in `state`
                // (k.len() rows of dv, checked by the caller's cut).
                unsafe {
                    let p = state.as_mut_ptr().add(i * dv + c);
                    let s = _mm256_mul_ps(_mm256_loadu_ps(p), decay8);
                    _mm256_storeu_ps(p, s);
                    acc = _mm256_fmadd_ps(s, _mm256_set1_ps(key), acc);
                }
            }
            // SAFETY: c + 8 <= dv = mem.len().
            unsafe { _mm256_storeu_ps(mem.as_mut_ptr().add(c), acc) };
            c += 8;
        }
        if body < dv {
            scalar_recall(state, k, decay, mem, body);
        }
    }

    /// [`scalar_update`] eight columns at a time (the tail through the scalar twin).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn update(
        state: &mut [f32],
        q: &[f32],
        k: &[f32],
        delta: &[f32],
        out: &mut [f32],
    ) {
        let dv = delta.len();
        let body = dv - dv % 8;
        let mut c = 0;
        while c < body {
            // SAFETY: c + 8 <= dv = delta.len() = out.len().
            let d = unsafe { _mm256_loadu_ps(delta.as_ptr().add(c)) };
            let mut acc = _mm256_setzero_ps();
            for (i, (&key, &query)) in k.iter().zip(q).enumerate() {
                // SAFETY: as in `recall`: row i's columns c..c+8 are in `state`.
                unsafe {
                    let p = state.as_mut_ptr().add(i * dv + c);
                    let s = _mm256_fmadd_ps(_mm256_set1_ps(key), d, _mm256_loadu_ps(p));
                    _mm256_storeu_ps(p, s);
                    acc = _mm256_fmadd_ps(s, _mm256_set1_ps(query), acc);
                }
            }
            // SAFETY: c + 8 <= dv = out.len().
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(c), acc) };
            c += 8;
        }
        if body < dv {
            scalar_update(state, q, k, delta, out, body);
        }
    }

    /// [`scalar_recall`] sixteen columns at a time, then [`recall`]'s eight and the scalar tail.
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) unsafe fn recall_512(state: &mut [f32], k: &[f32], decay: f32, mem: &mut [f32]) {
        let dv = mem.len();
        let body = dv - dv % 16;
        let decay16 = _mm512_set1_ps(decay);
        let mut c = 0;
        while c < body {
            let mut acc = _mm512_setzero_ps();
            for (i, &key) in k.iter().enumerate() {
                // SAFETY: c + 16 <= dv: row i's columns c..c+16 are in `state`.
                unsafe {
                    let p = state.as_mut_ptr().add(i * dv + c);
                    let s = _mm512_mul_ps(_mm512_loadu_ps(p), decay16);
                    _mm512_storeu_ps(p, s);
                    acc = _mm512_fmadd_ps(s, _mm512_set1_ps(key), acc);
                }
            }
            // SAFETY: c + 16 <= dv = mem.len().
            unsafe { _mm512_storeu_ps(mem.as_mut_ptr().add(c), acc) };
            c += 16;
        }
        if body < dv {
            scalar_recall(state, k, decay, mem, body);
        }
    }

    /// [`scalar_update`] sixteen columns at a time (the tail through the scalar twin).
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub(super) unsafe fn update_512(
        state: &mut [f32],
        q: &[f32],
        k: &[f32],
        delta: &[f32],
        out: &mut [f32],
    ) {
        let dv = delta.len();
        let body = dv - dv % 16;
        let mut c = 0;
        while c < body {
            // SAFETY: c + 16 <= dv = delta.len() = out.len().
            let d = unsafe { _mm512_loadu_ps(delta.as_ptr().add(c)) };
            let mut acc = _mm512_setzero_ps();
            for (i, (&key, &query)) in k.iter().zip(q).enumerate() {
                // SAFETY: row i's columns c..c+16 are in `state`.
                unsafe {
                    let p = state.as_mut_ptr().add(i * dv + c);
                    let s = _mm512_fmadd_ps(_mm512_set1_ps(key), d, _mm512_loadu_ps(p));
                    _mm512_storeu_ps(p, s);
                    acc = _mm512_fmadd_ps(s, _mm512_set1_ps(query), acc);
                }
            }
            // SAFETY: c + 16 <= dv = out.len().
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(c), acc) };
            c += 16;
        }
        if body < dv {
            scalar_update(state, q, k, delta, out, body);
        }
    }
}

/// One sequence's run of tokens in a flattened batch: rows `start..start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaRuleSeq {
    pub start: usize,
    pub len: usize,
}

/// One step's prepared inputs, `n` token rows each: `q` and `k` `[n][key_dim]` (L2-normalised,
/// `q` scaled), `v` `[n][value_dim]`, `decay` (`exp(g)`) and `beta` `[n][num_v_heads]`.
#[derive(Debug, Clone, Copy)]
pub struct DeltaRuleInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub decay: &'a [f32],
    pub beta: &'a [f32],
}

/// Runs the gated delta rule over every sequence's run of tokens, token by token, on `pool`
/// (one task per sequence and value head). `states[s]` is sequence `s`'s recurrent state
/// (`shape.state_elems()`), read and left updated; `out` is head-major, `[num_v_heads][n]
/// [head_v_dim]`, each row `Sᵀ q` after its token. Sequences must be in row order and
/// disjoint.
pub fn gated_delta_rule(
    pool: &ThreadPool,
    shape: &DeltaRuleShape,
    inputs: DeltaRuleInputs<'_>,
    seqs: &[DeltaRuleSeq],
    states: Vec<&mut [f32]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    gated_delta_rule_on(
        DeltaRulePath::detect(),
        pool,
        shape,
        inputs,
        seqs,
        states,
        out,
    )
}

/// [`gated_delta_rule`] on a given path (tests and benches compare paths).
pub fn gated_delta_rule_on(
    path: DeltaRulePath,
    pool: &ThreadPool,
    shape: &DeltaRuleShape,
    inputs: DeltaRuleInputs<'_>,
    seqs: &[DeltaRuleSeq],
    states: Vec<&mut [f32]>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    shape.validate()?;
    let (dk, dv, hv) = (shape.head_k_dim, shape.head_v_dim, shape.num_v_heads);
    let n = inputs.decay.len() / hv;
    let lengths = [
        ("gated delta rule q", inputs.q.len(), n * shape.key_dim()),
        ("gated delta rule k", inputs.k.len(), n * shape.key_dim()),
        ("gated delta rule v", inputs.v.len(), n * shape.value_dim()),
        ("gated delta rule beta", inputs.beta.len(), n * hv),
        ("gated delta rule decay", inputs.decay.len(), n * hv),
        ("gated delta rule output", out.len(), n * shape.value_dim()),
        ("gated delta rule states", states.len(), seqs.len()),
    ];
    for (what, actual, expected) in lengths {
        if actual != expected {
            return Err(KernelError::LengthMismatch {
                what,
                expected,
                actual,
            });
        }
    }
    let mut end = 0;
    for seq in seqs {
        if seq.start < end || seq.start + seq.len > n {
            return Err(KernelError::InvalidShape(
                "gated delta rule: sequences out of order, overlapping or past the batch",
            ));
        }
        end = seq.start + seq.len;
    }
    if let Some(state) = states.iter().find(|s| s.len() != shape.state_elems()) {
        return Err(KernelError::LengthMismatch {
            what: "gated delta rule state",
            expected: shape.state_elems(),
            actual: state.len(),
        });
    }
    // One task per (value head, sequence): that head's state of that sequence and its rows
    // of the head-major output, both disjoint from every other task's.
    let mut per_seq_heads: Vec<Vec<&mut [f32]>> = states
        .into_iter()
        .map(|state| state.chunks_exact_mut(dk * dv).collect())
        .collect();
    let mut tasks = Vec::with_capacity(hv * seqs.len());
    for (head, out_head) in out.chunks_exact_mut(n * dv).enumerate() {
        let mut rest = out_head;
        let mut consumed = 0;
        for (index, seq) in seqs.iter().enumerate() {
            let (_, tail) = rest.split_at_mut((seq.start - consumed) * dv);
            let (rows, tail) = tail.split_at_mut(seq.len * dv);
            rest = tail;
            consumed = seq.start + seq.len;
            let state = std::mem::take(&mut per_seq_heads[index][head]);
            tasks.push(Mutex::new((head, *seq, state, rows)));
        }
    }
    let key_dim = shape.key_dim();
    let value_dim = shape.value_dim();
    pool.parallel_for(tasks.len(), &|task| {
        let Ok(mut guard) = tasks[task].lock() else {
            return;
        };
        let (head, seq, ref mut state, ref mut rows) = *guard;
        let key_head = shape.key_head(head);
        let mut scratch = [0.0f32; MAX_HEAD_V_DIM];
        for t in 0..seq.len {
            let row = seq.start + t;
            let qk = row * key_dim + key_head * dk;
            let vo = row * value_dim + head * dv;
            path.step(
                state,
                &inputs.q[qk..qk + dk],
                &inputs.k[qk..qk + dk],
                &inputs.v[vo..vo + dv],
                inputs.decay[row * hv + head],
                inputs.beta[row * hv + head],
                &mut rows[t * dv..(t + 1) * dv],
                &mut scratch,
            );
        }
    });
    Ok(())
}

/// The causal depthwise convolution of one sequence's run of `x` (`[len][channels]`) with
/// `weight` (`[channels][kernel]`, the last tap on the current token), continuing from
/// `window` (`[kernel - 1][channels]`: the inputs of the `kernel - 1` positions before the
/// run, oldest first, zero before position 0), followed by SiLU, into `out`
/// (`[len][channels]`). `window` is left holding the last `kernel - 1` inputs.
pub fn causal_conv1d_silu(
    x: &[f32],
    weight: &[f32],
    window: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    // channels * kernel = weight.len(); channels * (kernel - 1) = window.len().
    let channels = weight.len().saturating_sub(window.len());
    if channels == 0
        || !weight.len().is_multiple_of(channels)
        || !x.len().is_multiple_of(channels)
        || out.len() != x.len()
    {
        return Err(KernelError::InvalidShape(
            "causal conv1d: weight must be [channels][kernel], window [kernel - 1][channels], \
             x and out [len][channels]",
        ));
    }
    let kernel = weight.len() / channels;
    let history = kernel - 1;
    for (token, out_row) in x.chunks_exact(channels).zip(out.chunks_exact_mut(channels)) {
        for (c, o) in out_row.iter_mut().enumerate() {
            let taps = &weight[c * kernel..(c + 1) * kernel];
            let mut acc = 0.0f32;
            for (j, &tap) in taps[..history].iter().enumerate() {
                acc += tap * window[j * channels + c];
            }
            acc += taps[history] * token[c];
            *o = silu(acc);
        }
        if history > 0 {
            window.copy_within(channels.., 0);
            window[(history - 1) * channels..].copy_from_slice(token);
        }
    }
    Ok(())
}

/// `x / (1 + e^-x)` in f32 (libm's exponential, the same on every path).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `1 / (1 + e^-x)`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + e^x)`, `x` itself above 20 (PyTorch's threshold).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Scales each `dim`-wide row of `x` to unit L2 norm (`x * rsqrt(Σx² + eps)`, as the FLA
/// kernels and HF's `l2norm` compute it), then by `scale`.
pub fn l2_normalize_rows(x: &mut [f32], dim: usize, eps: f32, scale: f32) {
    if dim == 0 {
        return;
    }
    for row in x.chunks_exact_mut(dim) {
        let sum = row.iter().fold(0.0f32, |acc, &v| acc + v * v);
        let inverse = 1.0 / (sum + eps).sqrt() * scale;
        row.iter_mut().for_each(|v| *v *= inverse);
    }
}

#[cfg(test)]
mod tests;
