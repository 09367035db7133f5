//! The vector operations the VNNI group kernels (`vnni_kernels.rs`) are written in, for two
//! register widths:
//!
//! - [`Ymm`] (AVX-VNNI: AVX2 plus the VEX-encoded `vpdpbusd`): one eight-row group per 256-bit
//!   register, one weight row per 32-bit lane, as the AVX2 kernels.
//! - [`Zmm`] (AVX-512 F + BW + VNNI): two eight-row groups per 512-bit register, the first in
//!   lanes 0..8 and the second in lanes 8..16, so every instruction advances sixteen output
//!   columns against the same broadcast activation bytes.
//!
//! Every method is `#[inline(always)]` and carries no `target_feature` of its own: it is
//! inlined into the `#[target_feature]` entry points of `vnni_kernels.rs`, which enable the
//! features its intrinsics need.
//!
//! Where a method reads weight bytes it takes [`Bases`]: the same offset inside each of the two
//! groups' current group-blocks (`Ymm` reads only the first).

use std::arch::x86_64::*;

/// Base pointers of the current group-block of the two groups a kernel call computes (both the
/// same group where only one is wanted; `Ymm` uses only the first).
#[derive(Clone, Copy)]
pub(crate) struct Bases(pub(crate) *const u8, pub(crate) *const u8);

impl Bases {
    /// Both bases advanced by `offset` bytes.
    ///
    /// # Safety
    /// The advanced pointers stay inside their group-blocks (or one past the end).
    #[inline(always)]
    pub(crate) unsafe fn add(self, offset: usize) -> Bases {
        // SAFETY: the caller's contract.
        unsafe { Bases(self.0.add(offset), self.1.add(offset)) }
    }
}

/// One register width's operations. Integer lanes are 32-bit (`I`), float lanes f32 (`F`);
/// byte-wise methods treat `I` as bytes, `*16` methods as 16-bit words.
///
/// # Safety
/// Every method requires the CPU features of its implementation (see the type's docs); the
/// loads additionally require their bytes to be readable.
pub(crate) trait Lanes {
    type I: Copy;
    type F: Copy;
    /// Whether the second base is read (`Zmm`: two groups per call).
    const PAIRED: bool;

    /// 32 bytes at each base.
    unsafe fn bytes32(at: Bases) -> Self::I;
    /// Eight f16 at each base, widened to f32 lanes.
    unsafe fn f16x8(at: Bases) -> Self::F;
    /// Eight u8 at each base, zero-extended to i32 lanes.
    unsafe fn u8x8(at: Bases) -> Self::I;
    /// Eight i8 at each base, sign-extended to i32 lanes.
    unsafe fn i8x8(at: Bases) -> Self::I;
    /// Eight u16 at each base, zero-extended to i32 lanes.
    unsafe fn u16x8(at: Bases) -> Self::I;
    /// Eight E8M0 bytes at each base as f32 `2^(e - 128)` lanes, bit for bit
    /// [`crate::e8m0_to_f32_half`] (MXFP4's scales).
    unsafe fn e8m0x8(at: Bases) -> Self::F;
    /// Four activation bytes at `at`, broadcast to every 32-bit lane.
    unsafe fn broadcast4(at: *const i8) -> Self::I;
    /// A 16-byte table repeated in every 128-bit lane (for [`Lanes::lookup`]).
    unsafe fn table16(table: &[u8; 16]) -> Self::I;
    /// Writes lanes 0..8 to `first` and (`Zmm`) lanes 8..16 to `second`.
    unsafe fn store(v: Self::F, first: &mut [f32; 8], second: &mut [f32; 8]);

    unsafe fn zero() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    unsafe fn splat8(v: i8) -> Self::I;
    unsafe fn splat32(v: i32) -> Self::I;
    unsafe fn splat_f(v: f32) -> Self::F;

    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn xor(a: Self::I, b: Self::I) -> Self::I;
    /// Each 16-bit word shifted right by 4.
    unsafe fn shr4_16(a: Self::I) -> Self::I;
    /// Each 16-bit word shifted left by 4.
    unsafe fn shl4_16(a: Self::I) -> Self::I;
    /// Each 16-bit word shifted right by 1.
    unsafe fn shr1_16(a: Self::I) -> Self::I;
    /// Each 16-bit word shifted right by `N` (< 16; a constant, so the shift is an immediate
    /// once inlined).
    unsafe fn shr_16<const N: u32>(a: Self::I) -> Self::I;
    /// Bitwise `mask ? a : b`, i.e. `(a & mask) | (b & !mask)` (one `vpternlogd` on AVX-512).
    unsafe fn select(mask: Self::I, a: Self::I, b: Self::I) -> Self::I;
    /// `16` in each byte whose bit `j` (< 8) is set in `bits`, else 0.
    unsafe fn bit_as_16(bits: Self::I, j: usize) -> Self::I;
    /// Each 32-bit lane shifted right by `count` (< 32).
    unsafe fn shr_32(a: Self::I, count: i32) -> Self::I;
    /// Each 32-bit lane shifted left by 4.
    unsafe fn shl4_32(a: Self::I) -> Self::I;
    unsafe fn sub32(a: Self::I, b: Self::I) -> Self::I;
    /// Low 32 bits of the lane products (exact where they fit, as every use here does).
    unsafe fn mul32(a: Self::I, b: Self::I) -> Self::I;
    /// Byte `i` of `table` picked by the low four bits of byte `i` of `index` (`pshufb`).
    unsafe fn lookup(table: Self::I, index: Self::I) -> Self::I;
    /// `acc + Σ₄ u · s` per 32-bit lane, `u` unsigned and `s` signed bytes (`vpdpbusd`: exact,
    /// no saturation).
    unsafe fn dot(acc: Self::I, u: Self::I, s: Self::I) -> Self::I;

    unsafe fn to_f32(a: Self::I) -> Self::F;
    unsafe fn mul_f(a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c`, one rounding.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `-(a · b) + c`, one rounding.
    unsafe fn fnmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
}

/// 256-bit lanes for AVX-VNNI hosts: needs `avx2,fma,f16c,avxvnni`.
pub(crate) struct Ymm;

/// 512-bit lanes: needs `avx512f,avx512bw,avx512vnni` (and `avx2,fma,f16c` for the 256-bit
/// halves it assembles).
pub(crate) struct Zmm;

// SAFETY (every method of both impls): each one only executes the intrinsics of its type's
// documented features, which the `#[target_feature]` functions it is inlined into enable and
// whose callers detected; loads read exactly the bytes the trait documents, which the callers
// guarantee readable.
impl Lanes for Ymm {
    type I = __m256i;
    type F = __m256;
    const PAIRED: bool = false;

    #[inline(always)]
    unsafe fn bytes32(at: Bases) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_loadu_si256(at.0 as *const __m256i) }
    }
    #[inline(always)]
    unsafe fn f16x8(at: Bases) -> __m256 {
        // SAFETY: see the impl note.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.0 as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn u8x8(at: Bases) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.0 as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn i8x8(at: Bases) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(at.0 as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn u16x8(at: Bases) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_cvtepu16_epi32(_mm_loadu_si128(at.0 as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn e8m0x8(at: Bases) -> __m256 {
        // SAFETY: see the impl note.
        unsafe { super::avx2::e8m0_half_x8(Self::u8x8(at)) }
    }
    #[inline(always)]
    unsafe fn broadcast4(at: *const i8) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_set1_epi32((at as *const i32).read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn table16(table: &[u8; 16]) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn store(v: __m256, first: &mut [f32; 8], _second: &mut [f32; 8]) {
        // SAFETY: see the impl note; `first` holds 8 f32.
        unsafe { _mm256_storeu_ps(first.as_mut_ptr(), v) }
    }
    #[inline(always)]
    unsafe fn zero() -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        // SAFETY: see the impl note.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat8(v: i8) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_set1_epi8(v) }
    }
    #[inline(always)]
    unsafe fn splat32(v: i32) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m256 {
        // SAFETY: see the impl note.
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_and_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_or_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn xor(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_xor_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn shr4_16(a: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_srli_epi16::<4>(a) }
    }
    #[inline(always)]
    unsafe fn shl4_16(a: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_slli_epi16::<4>(a) }
    }
    #[inline(always)]
    unsafe fn shr1_16(a: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_srli_epi16::<1>(a) }
    }
    #[inline(always)]
    unsafe fn shr_16<const N: u32>(a: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_srl_epi16(a, _mm_cvtsi32_si128(N as i32)) }
    }
    #[inline(always)]
    unsafe fn select(mask: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_or_si256(_mm256_and_si256(a, mask), _mm256_andnot_si256(mask, b)) }
    }
    #[inline(always)]
    unsafe fn bit_as_16(bits: __m256i, j: usize) -> __m256i {
        // SAFETY: see the impl note.
        unsafe {
            let bit = _mm256_set1_epi8((1u8 << j) as i8);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(bits, bit), bit);
            _mm256_and_si256(set, _mm256_set1_epi8(16))
        }
    }
    #[inline(always)]
    unsafe fn shr_32(a: __m256i, count: i32) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_srl_epi32(a, _mm_cvtsi32_si128(count)) }
    }
    #[inline(always)]
    unsafe fn shl4_32(a: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_slli_epi32::<4>(a) }
    }
    #[inline(always)]
    unsafe fn sub32(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul32(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn lookup(table: __m256i, index: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_shuffle_epi8(table, index) }
    }
    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: see the impl note.
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
    #[inline(always)]
    unsafe fn to_f32(a: __m256i) -> __m256 {
        // SAFETY: see the impl note.
        unsafe { _mm256_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn mul_f(a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl note.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: see the impl note.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: see the impl note.
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
}

impl Lanes for Zmm {
    type I = __m512i;
    type F = __m512;
    const PAIRED: bool = true;

    #[inline(always)]
    unsafe fn bytes32(at: Bases) -> __m512i {
        // SAFETY: see the impl note.
        unsafe {
            let first = _mm256_loadu_si256(at.0 as *const __m256i);
            let second = _mm256_loadu_si256(at.1 as *const __m256i);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(first), second)
        }
    }
    #[inline(always)]
    unsafe fn f16x8(at: Bases) -> __m512 {
        // SAFETY: see the impl note.
        unsafe {
            let halves = _mm256_loadu2_m128i(at.1 as *const __m128i, at.0 as *const __m128i);
            _mm512_cvtph_ps(halves)
        }
    }
    #[inline(always)]
    unsafe fn u8x8(at: Bases) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_cvtepu8_epi32(two_u64(at)) }
    }
    #[inline(always)]
    unsafe fn i8x8(at: Bases) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_cvtepi8_epi32(two_u64(at)) }
    }
    #[inline(always)]
    unsafe fn u16x8(at: Bases) -> __m512i {
        // SAFETY: see the impl note.
        unsafe {
            let halves = _mm256_loadu2_m128i(at.1 as *const __m128i, at.0 as *const __m128i);
            _mm512_cvtepu16_epi32(halves)
        }
    }
    #[inline(always)]
    unsafe fn e8m0x8(at: Bases) -> __m512 {
        // SAFETY: see the impl note.
        unsafe { e8m0_half_x16(Self::u8x8(at)) }
    }
    #[inline(always)]
    unsafe fn broadcast4(at: *const i8) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_set1_epi32((at as *const i32).read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn table16(table: &[u8; 16]) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(table.as_ptr() as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn store(v: __m512, first: &mut [f32; 8], second: &mut [f32; 8]) {
        let mut all = [0.0f32; 16];
        // SAFETY: see the impl note; `all` holds 16 f32.
        unsafe { _mm512_storeu_ps(all.as_mut_ptr(), v) };
        first.copy_from_slice(&all[..8]);
        second.copy_from_slice(&all[8..]);
    }
    #[inline(always)]
    unsafe fn zero() -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        // SAFETY: see the impl note.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat8(v: i8) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_set1_epi8(v) }
    }
    #[inline(always)]
    unsafe fn splat32(v: i32) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m512 {
        // SAFETY: see the impl note.
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn xor(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_xor_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn shr4_16(a: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_srli_epi16::<4>(a) }
    }
    #[inline(always)]
    unsafe fn shl4_16(a: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_slli_epi16::<4>(a) }
    }
    #[inline(always)]
    unsafe fn shr1_16(a: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_srli_epi16::<1>(a) }
    }
    #[inline(always)]
    unsafe fn shr_16<const N: u32>(a: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_srl_epi16(a, _mm_cvtsi32_si128(N as i32)) }
    }
    #[inline(always)]
    unsafe fn select(mask: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl note. 0xE4 is C ? A : B over the truth-table inputs A = 0xF0,
        // B = 0xCC, C = 0xAA.
        unsafe { _mm512_ternarylogic_epi32::<0xE4>(a, b, mask) }
    }
    #[inline(always)]
    unsafe fn bit_as_16(bits: __m512i, j: usize) -> __m512i {
        // SAFETY: see the impl note.
        unsafe {
            let set = _mm512_test_epi8_mask(bits, _mm512_set1_epi8((1u8 << j) as i8));
            _mm512_maskz_mov_epi8(set, _mm512_set1_epi8(16))
        }
    }
    #[inline(always)]
    unsafe fn shr_32(a: __m512i, count: i32) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_srl_epi32(a, _mm_cvtsi32_si128(count)) }
    }
    #[inline(always)]
    unsafe fn shl4_32(a: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_slli_epi32::<4>(a) }
    }
    #[inline(always)]
    unsafe fn sub32(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul32(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn lookup(table: __m512i, index: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_shuffle_epi8(table, index) }
    }
    #[inline(always)]
    unsafe fn dot(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        // SAFETY: see the impl note.
        unsafe { _mm512_dpbusd_epi32(acc, u, s) }
    }
    #[inline(always)]
    unsafe fn to_f32(a: __m512i) -> __m512 {
        // SAFETY: see the impl note.
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn mul_f(a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl note.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see the impl note.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see the impl note.
        unsafe { _mm512_fnmadd_ps(a, b, c) }
    }
}

/// Sixteen E8M0 scale bytes, zero-extended to i32 lanes, as f32 `2^(e - 128)`, bit for bit
/// [`crate::e8m0_to_f32_half`]: the normal `(e - 1) << 23` for `e >= 2`, else the subnormal
/// `0x0020_0000 << e` (the 16-lane twin of `avx2::e8m0_half_x8`).
///
/// # Safety
/// AVX-512 F: carries no `target_feature` of its own and is inlined into callers that enable
/// it ([`Zmm`], the AMX and row-sweep unpacking).
#[inline(always)]
pub(crate) unsafe fn e8m0_half_x16(e: __m512i) -> __m512 {
    // SAFETY: AVX-512 F operations on registers only (the caller's features).
    unsafe {
        let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
        // Shift counts above 31 give 0; those lanes take `normal`.
        let subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
        let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
        _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, subnormal))
    }
}

/// Eight bytes at each base: the first group's in the low half.
///
/// # Safety
/// SSE2; eight bytes readable at each base.
#[inline(always)]
unsafe fn two_u64(at: Bases) -> __m128i {
    // SAFETY: the caller's contract.
    unsafe {
        _mm_unpacklo_epi64(
            _mm_loadl_epi64(at.0 as *const __m128i),
            _mm_loadl_epi64(at.1 as *const __m128i),
        )
    }
}
