//! The one CPU-feature detection every kernel family derives its code path from.
//!
//! Features are read once per process and cached; each family (matmul's `Isa`, attention's
//! `VectorOps`, the KV cache's `KvCodec`, the peak probe's `FmaKernel`) maps them to the path it
//! runs with a `From<&CpuFeatures>`, so tests can build the scalar twin from
//! [`CpuFeatures::NONE`] and the SIMD one from [`CpuFeatures::get`] side by side.

use std::fmt;
use std::sync::OnceLock;

mod kernel_path;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tiles;

pub use kernel_path::{KernelPath, KernelsOverride, KERNELS_ENV};

/// x86 features of this CPU that the kernels use (AMX additionally needs the OS permission,
/// see [`amx_enabled`]). Each is true only when both the CPU and the OS support it, and
/// `TOKENMILL_KERNELS` ([`KERNELS_ENV`]) may narrow them (never widen) to force a slower
/// [`KernelPath`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuFeatures {
    /// 256-bit integer and float vectors.
    pub avx2: bool,
    /// Fused multiply-add on 256-bit float vectors.
    pub fma: bool,
    /// f16 ↔ f32 vector conversions.
    pub f16c: bool,
    /// AVX-512 foundation (512-bit vectors, mask registers).
    pub avx512f: bool,
    /// AVX-512 byte and word integer instructions.
    pub avx512bw: bool,
    /// AVX-512 vector length extensions: EVEX forms of 128/256-bit instructions, with 32
    /// vector registers (attention's wide pair groups).
    pub avx512vl: bool,
    /// AVX-512 VNNI: int8 dot products accumulating into int32 (`vpdpbusd`).
    pub avx512vnni: bool,
    /// The same dot products on 256-bit vectors without AVX-512 (AVX-VNNI).
    pub avxvnni: bool,
    /// AVX-512 BF16: bf16 pair dot products accumulating into f32 (`vdpbf16ps`).
    pub avx512bf16: bool,
    /// AMX int8 tile multiplies (`tdpbssd`). Linux additionally wants a per-process permission
    /// request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`) before the first tile instruction.
    pub amx_int8: bool,
    /// AMX tile registers and their configuration.
    pub amx_tile: bool,
    /// AMX bf16 tile multiplies (`tdpbf16ps`), the encoder's bf16 GEMM (same permission).
    pub amx_bf16: bool,
    /// What `TOKENMILL_KERNELS` did to the fields above.
    pub kernels_override: KernelsOverride,
}

impl CpuFeatures {
    /// No features: every family takes its scalar path (tests' reference twin).
    pub const NONE: CpuFeatures = CpuFeatures {
        avx2: false,
        fma: false,
        f16c: false,
        avx512f: false,
        avx512bw: false,
        avx512vl: false,
        avx512vnni: false,
        avxvnni: false,
        avx512bf16: false,
        amx_int8: false,
        amx_tile: false,
        amx_bf16: false,
        kernels_override: KernelsOverride::None,
    };

    /// Every feature (tests ask for everything and get what the CPU has through `usable`).
    #[cfg(test)]
    pub(crate) const ALL: CpuFeatures = CpuFeatures {
        avx2: true,
        fma: true,
        f16c: true,
        avx512f: true,
        avx512bw: true,
        avx512vl: true,
        avx512vnni: true,
        avxvnni: true,
        avx512bf16: true,
        amx_int8: true,
        amx_tile: true,
        amx_bf16: true,
        kernels_override: KernelsOverride::None,
    };

    /// This CPU's features, detected on first use and cached for the process.
    pub fn get() -> &'static CpuFeatures {
        static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
        FEATURES.get_or_init(|| {
            let value = std::env::var(KERNELS_ENV).ok();
            kernel_path::apply_override(CpuFeatures::detect(), value.as_deref())
        })
    }

    #[cfg(target_arch = "x86_64")]
    fn detect() -> CpuFeatures {
        let extra = x86::extra_features();
        CpuFeatures {
            avx2: std::is_x86_feature_detected!("avx2"),
            fma: std::is_x86_feature_detected!("fma"),
            f16c: std::is_x86_feature_detected!("f16c"),
            avx512f: std::is_x86_feature_detected!("avx512f"),
            avx512bw: std::is_x86_feature_detected!("avx512bw"),
            avx512vl: std::is_x86_feature_detected!("avx512vl"),
            avx512vnni: std::is_x86_feature_detected!("avx512vnni"),
            avxvnni: extra.avxvnni,
            avx512bf16: extra.avx512bf16 && std::is_x86_feature_detected!("avx512f"),
            amx_int8: extra.amx_int8,
            amx_tile: extra.amx_tile,
            amx_bf16: extra.amx_bf16,
            kernels_override: KernelsOverride::None,
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> CpuFeatures {
        CpuFeatures::NONE
    }

    /// The features both `self` and this CPU have. Every family maps this, not the value it
    /// was given, so a path chosen from a hand-made `CpuFeatures` (a test asking for the SIMD
    /// twin) never runs an instruction the CPU lacks: that is what the kernels' `SAFETY`
    /// notes rely on.
    pub(crate) fn usable(&self) -> CpuFeatures {
        let cpu = CpuFeatures::get();
        CpuFeatures {
            avx2: self.avx2 && cpu.avx2,
            fma: self.fma && cpu.fma,
            f16c: self.f16c && cpu.f16c,
            avx512f: self.avx512f && cpu.avx512f,
            avx512bw: self.avx512bw && cpu.avx512bw,
            avx512vl: self.avx512vl && cpu.avx512vl,
            avx512vnni: self.avx512vnni && cpu.avx512vnni,
            avxvnni: self.avxvnni && cpu.avxvnni,
            avx512bf16: self.avx512bf16 && cpu.avx512bf16,
            amx_int8: self.amx_int8 && cpu.amx_int8,
            amx_tile: self.amx_tile && cpu.amx_tile,
            amx_bf16: self.amx_bf16 && cpu.amx_bf16,
            kernels_override: self.kernels_override,
        }
    }

    /// One line for logs and bench headers, e.g. `avx2 fma f16c (kernels: AVX2)`: the features
    /// and the matmul [`KernelPath`] they select (with any `TOKENMILL_KERNELS` override).
    pub fn summary(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for CpuFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let named = [
            (self.avx2, "avx2"),
            (self.fma, "fma"),
            (self.f16c, "f16c"),
            (self.avx512f, "avx512f"),
            (self.avx512bw, "avx512bw"),
            (self.avx512vl, "avx512vl"),
            (self.avx512vnni, "avx512vnni"),
            (self.avxvnni, "avxvnni"),
            (self.avx512bf16, "avx512bf16"),
            (self.amx_int8, "amx_int8"),
            (self.amx_tile, "amx_tile"),
            (self.amx_bf16, "amx_bf16"),
        ];
        let mut any = false;
        for (_, name) in named.iter().filter(|(present, _)| *present) {
            if any {
                f.write_str(" ")?;
            }
            f.write_str(name)?;
            any = true;
        }
        if !any {
            f.write_str("no SIMD features")?;
        }
        let kernels = KernelPath::from(self);
        write!(f, " (kernels: {kernels}{})", self.kernels_override)
    }
}

/// The line start-up logs and bench headers print: [`CpuFeatures::summary`] of this process's
/// features, plus the AMX int8 tiles when [`amx_enabled`] (CPU, OS grant and `TOKENMILL_AMX`)
/// lets them run, e.g. `... amx_int8 amx_tile (kernels: AVX-512 VNNI) + AMX int8 tiles for
/// batches of 8+ rows`. Calling it asks for the AMX grant if nothing has yet.
pub fn runtime_summary() -> String {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut line = CpuFeatures::get().summary();
    #[cfg(target_arch = "x86_64")]
    if amx_enabled() {
        line.push_str(&format!(
            " + AMX int8 tiles for batches of {}",
            crate::matmul::amx_min_rows_summary()
        ));
    }
    line
}

/// The environment variable that switches the AMX kernels off when set to `0` (or `off`,
/// `false`, `no`); read once, on the first [`amx_enabled`] call.
pub const AMX_ENV: &str = "TOKENMILL_AMX";

/// Whether the AMX int8 kernels may run in this process: the CPU and OS support AMX
/// (`amx_tile` and `amx_int8`), the environment does not switch them off
/// ([`AMX_ENV`]`=0`), and Linux granted the tile-data permission. The first call asks for it
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); later calls return the cached
/// answer, and the outcome is logged once. Linux keeps the permission per process, so a
/// grant covers every thread, including those started before; [`crate::ThreadPool::new`]
/// still asks first thing, before its workers exist, so the request never races a kernel and
/// the log line appears at startup. Without the grant the first tile instruction faults
/// (SIGILL), so no AMX kernel runs unless this returns true.
pub fn amx_enabled() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        if let Ok(value) = std::env::var(AMX_ENV) {
            if switched_off(&value) {
                tracing::info!("AMX: switched off by {AMX_ENV}={value}, int8 tiles not used");
                return false;
            }
        }
        let cpu = CpuFeatures::get();
        if !(cpu.amx_tile && cpu.amx_int8) {
            tracing::debug!("AMX: not available on this CPU/OS, int8 tiles not used");
            return false;
        }
        match request_tile_data() {
            Ok(()) => {
                tracing::info!("AMX: tile-data permission granted, int8 tiles enabled");
                true
            }
            Err(reason) => {
                tracing::warn!("AMX: tile-data permission refused ({reason}), int8 tiles not used");
                false
            }
        }
    })
}

/// Whether an [`AMX_ENV`] (or other on/off switch) value switches the feature off.
pub(crate) fn switched_off(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "0" | "off" | "false" | "no"
    )
}

/// Asks Linux for permission to use AMX tile data, then reads the permitted set back to be
/// sure the grant holds (the request is idempotent: asking again once granted succeeds).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> Result<(), String> {
    const ARCH_GET_XCOMP_PERM: libc::c_long = 0x1022;
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these codes reads or sets this process's xstate permissions
    // only; the GET form writes one u64 through the pointer, which points at a live local.
    let (requested, read, permitted) = unsafe {
        let requested = libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        );
        let error = std::io::Error::last_os_error();
        if requested != 0 {
            return Err(format!("arch_prctl(ARCH_REQ_XCOMP_PERM): {error}"));
        }
        let mut permitted = 0u64;
        let read = libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_GET_XCOMP_PERM,
            &mut permitted as *mut u64,
        );
        (requested, read, permitted)
    };
    debug_assert_eq!(requested, 0);
    if read != 0 {
        return Err(format!(
            "arch_prctl(ARCH_GET_XCOMP_PERM): {}",
            std::io::Error::last_os_error()
        ));
    }
    if permitted & (1 << XFEATURE_XTILEDATA) == 0 {
        return Err(format!("permitted xfeatures {permitted:#x} lack tile data"));
    }
    Ok(())
}

/// Other OSes have no AMX permission call the kernels know; AMX stays off there.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tile_data() -> Result<(), String> {
    Err("no AMX permission request on this OS".to_owned())
}

/// Features `is_x86_feature_detected!` does not report on every toolchain the workspace
/// supports (rust-version 1.86; AMX detection is unstable even on current ones), read from
/// CPUID and XCR0 directly.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};

    #[derive(Debug, Default)]
    pub(super) struct Extra {
        pub(super) avxvnni: bool,
        pub(super) avx512bf16: bool,
        pub(super) amx_int8: bool,
        pub(super) amx_tile: bool,
        pub(super) amx_bf16: bool,
    }

    /// XCR0 bits the OS sets when it saves the register state: SSE and AVX (YMM), and AMX's
    /// tile configuration and tile data.
    const XCR0_AVX: u64 = 0b110;
    const XCR0_AMX: u64 = (1 << 17) | (1 << 18);

    // CPUID is a safe intrinsic on current toolchains and `unsafe` on rust-version 1.86.
    #[allow(unused_unsafe)]
    pub(super) fn extra_features() -> Extra {
        // SAFETY: CPUID exists on every x86_64 CPU; leaf 0 reports the highest leaf.
        let max_leaf = unsafe { __cpuid(0) }.eax;
        if max_leaf < 7 {
            return Extra::default();
        }
        // SAFETY: leaf 1 exists (max_leaf >= 7).
        let osxsave = unsafe { __cpuid(1) }.ecx & (1 << 27) != 0;
        if !osxsave {
            return Extra::default();
        }
        // SAFETY: OSXSAVE is set, so XGETBV is enabled and the `xsave` feature is present.
        let xcr0 = unsafe { read_xcr0() };
        // SAFETY: leaf 7 exists (max_leaf >= 7); sub-leaf 1 reads as zeros where unsupported.
        let (leaf7, leaf7_1) = unsafe { (__cpuid_count(7, 0), __cpuid_count(7, 1)) };
        let os_amx = xcr0 & XCR0_AMX == XCR0_AMX;
        Extra {
            avxvnni: xcr0 & XCR0_AVX == XCR0_AVX && leaf7_1.eax & (1 << 4) != 0,
            // The caller also requires AVX-512 F (whose detection checks the OS saves ZMM).
            avx512bf16: leaf7_1.eax & (1 << 5) != 0,
            amx_tile: os_amx && leaf7.edx & (1 << 24) != 0,
            amx_int8: os_amx && leaf7.edx & (1 << 25) != 0,
            amx_bf16: os_amx && leaf7.edx & (1 << 22) != 0,
        }
    }

    /// # Safety
    /// The CPU must support XSAVE with OSXSAVE set (CPUID.1:ECX bit 27).
    #[target_feature(enable = "xsave")]
    unsafe fn read_xcr0() -> u64 {
        // SAFETY: the caller checked OSXSAVE; register 0 (XCR0) always exists then.
        unsafe { _xgetbv(0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_summary_names_amx_exactly_when_it_runs() {
        let line = runtime_summary();
        eprintln!("runtime summary: {line}");
        assert!(line.starts_with(&CpuFeatures::get().summary()), "{line}");
        assert_eq!(line.contains("AMX int8 tiles"), amx_enabled(), "{line}");
    }

    #[test]
    fn detection_is_cached_and_described() {
        let features = CpuFeatures::get();
        assert!(std::ptr::eq(features, CpuFeatures::get()));
        let summary = features.summary();
        eprintln!("CPU features: {summary}");
        let path = KernelPath::from(features);
        assert!(summary.contains(&format!("(kernels: {path}")), "{summary}");
        // TOKENMILL_KERNELS=scalar clears avx2 on purpose.
        #[cfg(target_arch = "x86_64")]
        if !matches!(features.kernels_override, KernelsOverride::Forced(_)) {
            assert_eq!(features.avx2, std::is_x86_feature_detected!("avx2"));
        }
    }

    /// Every family derives its path from one `CpuFeatures`: none gives the scalar twins, the
    /// detected set gives the SIMD paths exactly where the CPU has their features.
    #[test]
    fn every_family_follows_the_features() {
        use crate::kv_dtype::KvCodec;
        use crate::matmul::Isa;
        use crate::peak::FmaKernel;
        use crate::simd::VectorOps;

        let none = &CpuFeatures::NONE;
        assert_eq!(Isa::from(none), Isa::Scalar);
        assert_eq!(VectorOps::from(none), VectorOps::Scalar);
        assert_eq!(KvCodec::from(none), KvCodec::Scalar);
        assert_eq!(FmaKernel::from(none), FmaKernel::Scalar);

        let cpu = CpuFeatures::get();
        let simd = [
            (
                "matmul",
                Isa::from(cpu) != Isa::Scalar,
                cpu.avx2 && cpu.fma && cpu.f16c,
            ),
            (
                "attention",
                VectorOps::from(cpu) != VectorOps::Scalar,
                cpu.avx2 && cpu.fma,
            ),
            (
                "kv codec",
                KvCodec::from(cpu) != KvCodec::Scalar,
                cpu.avx2 && cpu.f16c,
            ),
            (
                "fma peak",
                FmaKernel::from(cpu) != FmaKernel::Scalar,
                cpu.avx2 && cpu.fma,
            ),
        ];
        for (family, vectorized, expected) in simd {
            assert_eq!(
                vectorized,
                cfg!(target_arch = "x86_64") && expected,
                "{family}"
            );
            if !vectorized {
                eprintln!("{family}: no SIMD path on this CPU, only the scalar one is tested");
            }
        }
        assert_eq!(Isa::detect(), Isa::from(cpu));
    }

    #[test]
    fn asking_for_features_the_cpu_lacks_gets_only_what_it_has() {
        let everything = CpuFeatures::ALL;
        let cpu = CpuFeatures {
            kernels_override: KernelsOverride::None,
            ..*CpuFeatures::get()
        };
        assert_eq!(everything.usable(), cpu);
        assert_eq!(CpuFeatures::NONE.usable(), CpuFeatures::NONE);
    }

    /// Asking again returns the cached answer and the OS request itself is idempotent; a CPU
    /// without AMX is never granted it.
    #[test]
    fn amx_permission_is_idempotent_and_falls_back() {
        let first = amx_enabled();
        assert_eq!(amx_enabled(), first);
        let cpu = CpuFeatures::get();
        if !(cpu.amx_tile && cpu.amx_int8) {
            assert!(!first);
        }
        if first {
            assert_eq!(request_tile_data(), Ok(()));
            assert_eq!(request_tile_data(), Ok(()));
        } else {
            eprintln!(
                "AMX not enabled in this process ({cpu}; {AMX_ENV}={:?}): AMX kernels skipped",
                std::env::var(AMX_ENV).ok()
            );
        }
    }

    #[test]
    fn amx_switch_values() {
        for off in ["0", "off", "OFF", " false", "no"] {
            assert!(switched_off(off), "{off}");
        }
        for on in ["1", "on", "", "yes"] {
            assert!(!switched_off(on), "{on}");
        }
    }

    #[test]
    fn no_features_reads_as_scalar() {
        assert_eq!(
            CpuFeatures::NONE.summary(),
            "no SIMD features (kernels: scalar)"
        );
        let partial = CpuFeatures {
            avx2: true,
            fma: true,
            ..CpuFeatures::NONE
        };
        assert_eq!(partial.summary(), "avx2 fma (kernels: scalar)");
    }
}
