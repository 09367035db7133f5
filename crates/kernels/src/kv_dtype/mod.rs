//! Element types of the paged KV cache and their conversions from and to f32.
//!
//! vLLM's `--kv-cache-dtype` stores K and V in a narrower type than the activations: 16-bit
//! floats halve the cache, 8-bit floats quarter it. Every value of these types is exactly
//! representable in f32, so decoding is exact: attention over a reduced-precision cache
//! computes exactly what it would over an f32 cache holding the decoded values, and keeps
//! every bitwise batch-invariance property of the f32 path. Only the encoding (in
//! [`crate::write_kv`]) rounds, once per value, round-to-nearest-even.
//!
//! Encoders saturate: a finite value beyond the type's largest finite value (±inf as well)
//! becomes that largest value, so finite activations never turn into inf or NaN (fp8 uses a
//! per-tensor scale of 1.0, as vLLM does without calibrated scales). NaN stays NaN.
//!
//! The scalar functions here are the reference; the AVX2/F16C paths (`avx2.rs`) are bitwise
//! equal to them (tests check every 8- and 16-bit code and random, tie, subnormal and
//! saturating values).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod tests;

use crate::cpu::CpuFeatures;
use crate::dtype::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// The element type K and V are stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvCacheDType {
    /// IEEE single precision: the activations' own type, stored as is.
    #[default]
    F32,
    /// IEEE half precision (llama.cpp's default KV type).
    F16,
    /// bfloat16.
    BF16,
    /// OCP fp8 E4M3 "fn" (bias 7, no infinities, max 448; `0x7f`/`0xff` are NaN).
    Fp8E4m3,
    /// OCP fp8 E5M2 (the high byte of an f16: bias 15, max 57344).
    Fp8E5m2,
}

impl KvCacheDType {
    /// Every KV cache type.
    pub const ALL: [KvCacheDType; 5] = [
        KvCacheDType::F32,
        KvCacheDType::F16,
        KvCacheDType::BF16,
        KvCacheDType::Fp8E4m3,
        KvCacheDType::Fp8E5m2,
    ];

    /// Bytes one stored element takes.
    pub fn element_bytes(self) -> usize {
        match self {
            KvCacheDType::F32 => 4,
            KvCacheDType::F16 | KvCacheDType::BF16 => 2,
            KvCacheDType::Fp8E4m3 | KvCacheDType::Fp8E5m2 => 1,
        }
    }

    /// A short name (`"f32"`, `"f16"`, `"bf16"`, `"fp8_e4m3"`, `"fp8_e5m2"`).
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDType::F32 => "f32",
            KvCacheDType::F16 => "f16",
            KvCacheDType::BF16 => "bf16",
            KvCacheDType::Fp8E4m3 => "fp8_e4m3",
            KvCacheDType::Fp8E5m2 => "fp8_e5m2",
        }
    }

    /// The stored value closest to `value` (round-to-nearest-even, saturating).
    pub fn round(self, value: f32) -> f32 {
        match self {
            KvCacheDType::F32 => value,
            KvCacheDType::F16 => f16_to_f32(f32_to_f16_saturating(value)),
            KvCacheDType::BF16 => bf16_to_f32(f32_to_bf16_saturating(value)),
            KvCacheDType::Fp8E4m3 => fp8_e4m3_to_f32(f32_to_fp8_e4m3(value)),
            KvCacheDType::Fp8E5m2 => fp8_e5m2_to_f32(f32_to_fp8_e5m2(value)),
        }
    }
}

impl std::fmt::Display for KvCacheDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One layer's K or V cache, owned, in its storage type.
#[derive(Debug, Clone, PartialEq)]
pub enum KvCacheBuffer {
    F32(Vec<f32>),
    F16(Vec<u16>),
    BF16(Vec<u16>),
    Fp8E4m3(Vec<u8>),
    Fp8E5m2(Vec<u8>),
}

impl KvCacheBuffer {
    /// `len` zeros (all-zero bits are +0.0 in every type).
    pub fn zeros(dtype: KvCacheDType, len: usize) -> KvCacheBuffer {
        match dtype {
            KvCacheDType::F32 => KvCacheBuffer::F32(vec![0.0; len]),
            KvCacheDType::F16 => KvCacheBuffer::F16(vec![0; len]),
            KvCacheDType::BF16 => KvCacheBuffer::BF16(vec![0; len]),
            KvCacheDType::Fp8E4m3 => KvCacheBuffer::Fp8E4m3(vec![0; len]),
            KvCacheDType::Fp8E5m2 => KvCacheBuffer::Fp8E5m2(vec![0; len]),
        }
    }

    /// `values` encoded into `dtype`, as [`crate::write_kv`] would store them.
    pub fn from_f32(dtype: KvCacheDType, values: &[f32]) -> KvCacheBuffer {
        let mut buffer = KvCacheBuffer::zeros(dtype, values.len());
        buffer
            .as_slice_mut()
            .encode_at(KvCodec::detect(), 0, values);
        buffer
    }

    pub fn dtype(&self) -> KvCacheDType {
        self.as_slice().dtype()
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element decoded to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        let slice = self.as_slice();
        let mut out = vec![0.0; slice.len()];
        slice.decode_at(KvCodec::detect(), 0, &mut out);
        out
    }

    pub fn as_slice(&self) -> KvCacheSlice<'_> {
        match self {
            KvCacheBuffer::F32(values) => KvCacheSlice::F32(values),
            KvCacheBuffer::F16(values) => KvCacheSlice::F16(values),
            KvCacheBuffer::BF16(values) => KvCacheSlice::BF16(values),
            KvCacheBuffer::Fp8E4m3(values) => KvCacheSlice::Fp8E4m3(values),
            KvCacheBuffer::Fp8E5m2(values) => KvCacheSlice::Fp8E5m2(values),
        }
    }

    pub fn as_slice_mut(&mut self) -> KvCacheSliceMut<'_> {
        match self {
            KvCacheBuffer::F32(values) => KvCacheSliceMut::F32(values),
            KvCacheBuffer::F16(values) => KvCacheSliceMut::F16(values),
            KvCacheBuffer::BF16(values) => KvCacheSliceMut::BF16(values),
            KvCacheBuffer::Fp8E4m3(values) => KvCacheSliceMut::Fp8E4m3(values),
            KvCacheBuffer::Fp8E5m2(values) => KvCacheSliceMut::Fp8E5m2(values),
        }
    }
}

/// A borrowed K or V cache in its storage type, as [`crate::paged_attention`] reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvCacheSlice<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    BF16(&'a [u16]),
    Fp8E4m3(&'a [u8]),
    Fp8E5m2(&'a [u8]),
}

impl<'a> From<&'a [f32]> for KvCacheSlice<'a> {
    fn from(values: &'a [f32]) -> KvCacheSlice<'a> {
        KvCacheSlice::F32(values)
    }
}

impl<'a> From<&'a Vec<f32>> for KvCacheSlice<'a> {
    fn from(values: &'a Vec<f32>) -> KvCacheSlice<'a> {
        KvCacheSlice::F32(values)
    }
}

impl KvCacheSlice<'_> {
    pub fn dtype(&self) -> KvCacheDType {
        match self {
            KvCacheSlice::F32(_) => KvCacheDType::F32,
            KvCacheSlice::F16(_) => KvCacheDType::F16,
            KvCacheSlice::BF16(_) => KvCacheDType::BF16,
            KvCacheSlice::Fp8E4m3(_) => KvCacheDType::Fp8E4m3,
            KvCacheSlice::Fp8E5m2(_) => KvCacheDType::Fp8E5m2,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KvCacheSlice::F32(values) => values.len(),
            KvCacheSlice::F16(values) | KvCacheSlice::BF16(values) => values.len(),
            KvCacheSlice::Fp8E4m3(values) | KvCacheSlice::Fp8E5m2(values) => values.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Asks the CPU to start loading the cache lines of `rows` (a hint: it reads nothing into
    /// the program and changes no result). Rows that do not fit the slice are skipped.
    pub(crate) fn prefetch_rows(&self, rows: Rows) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            const LINE: usize = 64;
            let (base, len, bytes) = match *self {
                KvCacheSlice::F32(v) => (v.as_ptr().cast::<u8>(), v.len(), 4),
                KvCacheSlice::F16(v) | KvCacheSlice::BF16(v) => {
                    (v.as_ptr().cast::<u8>(), v.len(), 2)
                }
                KvCacheSlice::Fp8E4m3(v) | KvCacheSlice::Fp8E5m2(v) => (v.as_ptr(), v.len(), 1),
            };
            if rows.width == 0 {
                return;
            }
            for row in 0..rows.count {
                let start = rows.start + row * rows.stride;
                if start + rows.width > len {
                    break;
                }
                let (first, last) = (start * bytes, (start + rows.width) * bytes - 1);
                let mut at = first;
                while at <= last {
                    // SAFETY: `at` lies inside the slice (`start + width <= len` elements);
                    // a prefetch never faults and reads nothing into the program.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(at).cast::<i8>()) };
                    at = (at / LINE + 1) * LINE;
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = rows;
    }

    /// Decodes `out.len()` elements starting at element `start` into `out`. The caller keeps
    /// the range inside the slice (checked: an out-of-range call decodes nothing).
    pub(crate) fn decode_at(&self, codec: KvCodec, start: usize, out: &mut [f32]) {
        let rows = Rows {
            start,
            stride: out.len(),
            count: 1,
            width: out.len(),
        };
        self.decode_rows(codec, rows, out);
    }

    /// Decodes `rows` (strided in this slice) into consecutive rows of `out`. Rows that do not
    /// fit this slice or `out` are skipped (callers validate shapes first).
    pub(crate) fn decode_rows(&self, codec: KvCodec, rows: Rows, out: &mut [f32]) {
        match *self {
            KvCacheSlice::F32(values) => {
                for row in 0..rows.count {
                    if let Some((source, target)) = rows.row(values, out, row) {
                        target.copy_from_slice(source);
                    }
                }
            }
            KvCacheSlice::F16(codes) => codec.decode_f16(codes, rows, out),
            KvCacheSlice::BF16(codes) => codec.decode_bf16(codes, rows, out),
            KvCacheSlice::Fp8E4m3(codes) => codec.decode_fp8_e4m3(codes, rows, out),
            KvCacheSlice::Fp8E5m2(codes) => codec.decode_fp8_e5m2(codes, rows, out),
        }
    }
}

/// `count` rows of `width` elements, row `r` starting at element `start + r * stride` of a
/// cache slice and landing at `r * width` of a contiguous output.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows {
    pub(crate) start: usize,
    pub(crate) stride: usize,
    pub(crate) count: usize,
    pub(crate) width: usize,
}

impl Rows {
    /// One row of `len` elements from the start.
    #[cfg(test)]
    pub(crate) fn contiguous(len: usize) -> Rows {
        Rows {
            start: 0,
            stride: len,
            count: 1,
            width: len,
        }
    }

    /// Row `row`'s source and target, or `None` if either is out of range.
    #[inline]
    pub(crate) fn row<'s, 'o, T>(
        &self,
        source: &'s [T],
        out: &'o mut [f32],
        row: usize,
    ) -> Option<(&'s [T], &'o mut [f32])> {
        let from = self.start.checked_add(row.checked_mul(self.stride)?)?;
        let source = source.get(from..from.checked_add(self.width)?)?;
        let at = row.checked_mul(self.width)?;
        let target = out.get_mut(at..at.checked_add(self.width)?)?;
        Some((source, target))
    }
}

/// A mutably borrowed K or V cache in its storage type, as [`crate::write_kv`] fills it.
#[derive(Debug, PartialEq)]
pub enum KvCacheSliceMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [u16]),
    BF16(&'a mut [u16]),
    Fp8E4m3(&'a mut [u8]),
    Fp8E5m2(&'a mut [u8]),
}

impl<'a> From<&'a mut [f32]> for KvCacheSliceMut<'a> {
    fn from(values: &'a mut [f32]) -> KvCacheSliceMut<'a> {
        KvCacheSliceMut::F32(values)
    }
}

impl<'a> From<&'a mut Vec<f32>> for KvCacheSliceMut<'a> {
    fn from(values: &'a mut Vec<f32>) -> KvCacheSliceMut<'a> {
        KvCacheSliceMut::F32(values)
    }
}

impl KvCacheSliceMut<'_> {
    pub fn dtype(&self) -> KvCacheDType {
        self.as_slice().dtype()
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_slice(&self) -> KvCacheSlice<'_> {
        match self {
            KvCacheSliceMut::F32(values) => KvCacheSlice::F32(values),
            KvCacheSliceMut::F16(values) => KvCacheSlice::F16(values),
            KvCacheSliceMut::BF16(values) => KvCacheSlice::BF16(values),
            KvCacheSliceMut::Fp8E4m3(values) => KvCacheSlice::Fp8E4m3(values),
            KvCacheSliceMut::Fp8E5m2(values) => KvCacheSlice::Fp8E5m2(values),
        }
    }

    /// Encodes `values` into elements `start..start + values.len()`. The caller keeps the
    /// range inside the slice (checked: an out-of-range call writes nothing).
    pub(crate) fn encode_at(&mut self, codec: KvCodec, start: usize, values: &[f32]) {
        let range = start..start.saturating_add(values.len());
        match self {
            KvCacheSliceMut::F32(target) => {
                if let Some(target) = target.get_mut(range) {
                    target.copy_from_slice(values);
                }
            }
            KvCacheSliceMut::F16(target) => {
                if let Some(target) = target.get_mut(range) {
                    codec.encode_f16(values, target);
                }
            }
            KvCacheSliceMut::BF16(target) => {
                if let Some(target) = target.get_mut(range) {
                    codec.encode_bf16(values, target);
                }
            }
            KvCacheSliceMut::Fp8E4m3(target) => {
                if let Some(target) = target.get_mut(range) {
                    codec.encode_fp8_e4m3(values, target);
                }
            }
            KvCacheSliceMut::Fp8E5m2(target) => {
                if let Some(target) = target.get_mut(range) {
                    codec.encode_fp8_e5m2(values, target);
                }
            }
        }
    }
}

/// Which conversion routines this CPU runs: AVX2 with F16C, or the scalar references.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KvCodec {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl From<&CpuFeatures> for KvCodec {
    fn from(features: &CpuFeatures) -> KvCodec {
        #[cfg(target_arch = "x86_64")]
        {
            let usable = features.usable();
            if usable.avx2 && usable.f16c {
                return KvCodec::Avx2;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = features;
        KvCodec::Scalar
    }
}

impl KvCodec {
    /// The path for this process's [`CpuFeatures`].
    pub(crate) fn detect() -> KvCodec {
        KvCodec::from(CpuFeatures::get())
    }

    /// Converts `min(values.len(), out.len())` elements.
    pub(crate) fn encode_f16(self, values: &[f32], out: &mut [u16]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and F16C.
            KvCodec::Avx2 => unsafe { avx2::encode_f16(values, out) },
            KvCodec::Scalar => encode_with(values, out, f32_to_f16_saturating),
        }
    }

    pub(crate) fn encode_bf16(self, values: &[f32], out: &mut [u16]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and F16C.
            KvCodec::Avx2 => unsafe { avx2::encode_bf16(values, out) },
            KvCodec::Scalar => encode_with(values, out, f32_to_bf16_saturating),
        }
    }

    pub(crate) fn encode_fp8_e4m3(self, values: &[f32], out: &mut [u8]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and F16C.
            KvCodec::Avx2 => unsafe { avx2::encode_fp8(&E4M3, values, out) },
            KvCodec::Scalar => encode_with(values, out, f32_to_fp8_e4m3),
        }
    }

    pub(crate) fn encode_fp8_e5m2(self, values: &[f32], out: &mut [u8]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and F16C.
            KvCodec::Avx2 => unsafe { avx2::encode_fp8(&E5M2, values, out) },
            KvCodec::Scalar => encode_with(values, out, f32_to_fp8_e5m2),
        }
    }

    /// Decodes `rows` of `codes` into consecutive rows of `out`.
    pub(crate) fn decode_f16(self, codes: &[u16], rows: Rows, out: &mut [f32]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and F16C.
            KvCodec::Avx2 => unsafe { avx2::decode_f16_rows(codes, rows, out) },
            KvCodec::Scalar => decode_rows_with(codes, rows, out, f16_to_f32),
        }
    }

    pub(crate) fn decode_bf16(self, codes: &[u16], rows: Rows, out: &mut [f32]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and F16C.
            KvCodec::Avx2 => unsafe { avx2::decode_bf16_rows(codes, rows, out) },
            KvCodec::Scalar => decode_rows_with(codes, rows, out, bf16_to_f32),
        }
    }

    pub(crate) fn decode_fp8_e4m3(self, codes: &[u8], rows: Rows, out: &mut [f32]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and F16C.
            KvCodec::Avx2 => unsafe { avx2::decode_fp8_e4m3_rows(codes, rows, out) },
            KvCodec::Scalar => decode_rows_with(codes, rows, out, fp8_e4m3_to_f32),
        }
    }

    pub(crate) fn decode_fp8_e5m2(self, codes: &[u8], rows: Rows, out: &mut [f32]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` is only constructed after detecting AVX2 and F16C.
            KvCodec::Avx2 => unsafe { avx2::decode_fp8_e5m2_rows(codes, rows, out) },
            KvCodec::Scalar => decode_rows_with(codes, rows, out, fp8_e5m2_to_f32),
        }
    }
}

fn encode_with<T>(values: &[f32], out: &mut [T], encode: impl Fn(f32) -> T) {
    for (slot, &value) in out.iter_mut().zip(values) {
        *slot = encode(value);
    }
}

pub(super) fn decode_with<T: Copy>(codes: &[T], out: &mut [f32], decode: impl Fn(T) -> f32) {
    for (slot, &code) in out.iter_mut().zip(codes) {
        *slot = decode(code);
    }
}

/// `decode_with` over each of `rows`.
fn decode_rows_with<T: Copy>(codes: &[T], rows: Rows, out: &mut [f32], decode: impl Fn(T) -> f32) {
    for row in 0..rows.count {
        if let Some((source, target)) = rows.row(codes, out, row) {
            decode_with(source, target, &decode);
        }
    }
}

/// Largest finite f16, 65504.
pub(crate) const F16_MAX: f32 = 65504.0;

/// Largest finite bfloat16, `0x7f7f` (about 3.39e38).
pub(crate) const BF16_MAX: f32 = f32::from_bits(0x7f7f_0000);

/// `value` limited to `[-limit, limit]`; NaN passes through (as AVX's `min(limit, x)` then
/// `max(-limit, x)` keeps it).
fn clamp_keeping_nan(value: f32, limit: f32) -> f32 {
    if value > limit {
        limit
    } else if value < -limit {
        -limit
    } else {
        value
    }
}

/// f32 to f16 bits, round-to-nearest-even, saturating at ±65504 instead of overflowing to inf.
pub fn f32_to_f16_saturating(value: f32) -> u16 {
    f32_to_f16(clamp_keeping_nan(value, F16_MAX))
}

/// f32 to bfloat16 bits, round-to-nearest-even, saturating at the largest finite bfloat16.
pub fn f32_to_bf16_saturating(value: f32) -> u16 {
    f32_to_bf16(clamp_keeping_nan(value, BF16_MAX))
}

/// Geometry of an 8-bit float: 1 sign bit, `8 - 1 - mantissa_bits` exponent bits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fp8Format {
    pub(crate) mantissa_bits: u32,
    pub(crate) bias: i32,
    /// Largest finite magnitude code (`0x7e` for E4M3, `0x7b` for E5M2).
    pub(crate) max_code: u32,
    /// The magnitude code written for NaN.
    pub(crate) nan_code: u32,
}

pub(crate) const E4M3: Fp8Format = Fp8Format {
    mantissa_bits: 3,
    bias: 7,
    max_code: 0x7e,
    nan_code: 0x7f,
};

pub(crate) const E5M2: Fp8Format = Fp8Format {
    mantissa_bits: 2,
    bias: 15,
    max_code: 0x7b,
    nan_code: 0x7e,
};

impl Fp8Format {
    /// f32 bits of the smallest normal magnitude, `2^(1 - bias)`.
    pub(crate) fn min_normal_bits(&self) -> u32 {
        ((127 + 1 - self.bias) as u32) << 23
    }

    /// `2^(bias - 1 + mantissa_bits)`: scales a subnormal magnitude to its integer code.
    pub(crate) fn subnormal_scale(&self) -> f32 {
        f32::from_bits(((127 + self.bias - 1 + self.mantissa_bits as i32) as u32) << 23)
    }

    /// Rounds an f32 to this format: subnormal magnitudes by scaling to an integer and
    /// rounding half to even; normal ones by rounding the f32 bits' dropped mantissa bits half
    /// to even (a carry moves into the exponent, as it should) and rebiasing the exponent.
    /// Codes past the largest finite one saturate to it.
    pub(crate) fn encode(&self, value: f32) -> u8 {
        let bits = value.to_bits();
        let sign = (bits >> 24) & 0x80;
        if value.is_nan() {
            return (sign | self.nan_code) as u8;
        }
        let magnitude = bits & 0x7fff_ffff;
        let code = if magnitude < self.min_normal_bits() {
            // Exact: a power-of-two scale of a value far from f32's range limits.
            let scaled = f32::from_bits(magnitude) * self.subnormal_scale();
            // At most 2^mantissa_bits, which is exactly the smallest normal's code.
            scaled.round_ties_even() as u32
        } else {
            let shift = 23 - self.mantissa_bits;
            let rounded = magnitude + ((1 << (shift - 1)) - 1) + ((magnitude >> shift) & 1);
            (rounded >> shift) - (((127 - self.bias) as u32) << self.mantissa_bits)
        };
        (sign | code.min(self.max_code)) as u8
    }
}

/// f32 to fp8 E4M3 (fn): round-to-nearest-even, saturating at ±448.
pub fn f32_to_fp8_e4m3(value: f32) -> u8 {
    E4M3.encode(value)
}

/// f32 to fp8 E5M2: round-to-nearest-even, saturating at ±57344.
pub fn f32_to_fp8_e5m2(value: f32) -> u8 {
    E5M2.encode(value)
}

/// fp8 E4M3 (fn) to f32 (exact; `0x7f`/`0xff` are NaN).
pub fn fp8_e4m3_to_f32(code: u8) -> f32 {
    let exponent = i32::from((code >> 3) & 0x0f);
    let mantissa = f32::from(code & 0x07);
    let magnitude = if exponent == 0x0f && code & 0x07 == 0x07 {
        f32::NAN
    } else if exponent == 0 {
        mantissa * (1.0 / 512.0)
    } else {
        (1.0 + mantissa / 8.0) * 2f32.powi(exponent - 7)
    };
    if code & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// fp8 E5M2 to f32 (exact): the code is the high byte of an f16.
pub fn fp8_e5m2_to_f32(code: u8) -> f32 {
    f16_to_f32(u16::from(code) << 8)
}
