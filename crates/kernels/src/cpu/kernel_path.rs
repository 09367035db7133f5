//! Which matmul kernel path runs ([`KernelPath`]), chosen from the CPU's features, and the
//! `TOKENMILL_KERNELS` override that narrows those features to force a path for benchmarking
//! and comparison.

use std::fmt;

use super::CpuFeatures;

/// The environment variable that forces a kernel path.
pub const KERNELS_ENV: &str = "TOKENMILL_KERNELS";

/// The int8/float matmul kernel families, slowest first. Every path gives bitwise the same
/// results (each has the scalar twin's arithmetic); they differ only in speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KernelPath {
    /// Portable Rust, the reference twin of every SIMD kernel.
    Scalar,
    /// AVX2 + FMA + F16C: `maddubs`/`madd` integer dots on 256-bit vectors.
    Avx2,
    /// AVX2 plus AVX-VNNI: 256-bit `vpdpbusd` (client cores without AVX-512).
    AvxVnni,
    /// AVX-512 F + BW + VNNI: 512-bit `vpdpbusd`, two eight-row groups per register.
    Avx512,
}

impl KernelPath {
    /// Every path, slowest first.
    pub const ALL: [KernelPath; 4] = [
        KernelPath::Scalar,
        KernelPath::Avx2,
        KernelPath::AvxVnni,
        KernelPath::Avx512,
    ];

    /// The value `TOKENMILL_KERNELS` takes for this path.
    pub fn env_value(self) -> &'static str {
        match self {
            KernelPath::Scalar => "scalar",
            KernelPath::Avx2 => "avx2",
            KernelPath::AvxVnni => "avx-vnni",
            KernelPath::Avx512 => "avx512",
        }
    }

    /// The path a `TOKENMILL_KERNELS` value names (case-insensitive; `_` and `-` alike).
    pub fn parse(value: &str) -> Option<KernelPath> {
        let value = value.trim().to_ascii_lowercase().replace('_', "-");
        match value.as_str() {
            "scalar" => Some(KernelPath::Scalar),
            "avx2" => Some(KernelPath::Avx2),
            "avx-vnni" | "avxvnni" => Some(KernelPath::AvxVnni),
            "avx512" | "avx-512" | "avx512-vnni" => Some(KernelPath::Avx512),
            _ => None,
        }
    }

    /// The features this path needs that `features` lacks (names as in the summary line).
    pub fn missing(self, features: &CpuFeatures) -> Vec<&'static str> {
        let avx2 = [
            (features.avx2, "avx2"),
            (features.fma, "fma"),
            (features.f16c, "f16c"),
        ];
        let needed: &[(bool, &str)] = match self {
            KernelPath::Scalar => &[],
            KernelPath::Avx2 => &avx2,
            KernelPath::AvxVnni => &[avx2[0], avx2[1], avx2[2], (features.avxvnni, "avxvnni")],
            KernelPath::Avx512 => &[
                avx2[0],
                avx2[1],
                avx2[2],
                (features.avx512f, "avx512f"),
                (features.avx512bw, "avx512bw"),
                (features.avx512vnni, "avx512vnni"),
            ],
        };
        needed
            .iter()
            .filter(|(present, _)| !present)
            .map(|&(_, name)| name)
            .collect()
    }

    /// `features` narrowed to what this path (and nothing faster) uses. AMX, which is no
    /// `KernelPath`, is cleared too: a forced path compares one kernel family alone.
    pub(crate) fn narrow(self, features: &CpuFeatures) -> CpuFeatures {
        let keep_avx2 = self >= KernelPath::Avx2;
        let keep_avx512 = self == KernelPath::Avx512;
        CpuFeatures {
            avx2: features.avx2 && keep_avx2,
            fma: features.fma && keep_avx2,
            f16c: features.f16c && keep_avx2,
            avx512f: features.avx512f && keep_avx512,
            avx512bw: features.avx512bw && keep_avx512,
            avx512vl: features.avx512vl && keep_avx512,
            avx512vnni: features.avx512vnni && keep_avx512,
            avxvnni: features.avxvnni && self == KernelPath::AvxVnni,
            avx512bf16: features.avx512bf16 && keep_avx512,
            amx_int8: false,
            amx_tile: false,
            amx_bf16: false,
            kernels_override: KernelsOverride::Forced(self),
        }
    }
}

impl fmt::Display for KernelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelPath::Scalar => "scalar",
            KernelPath::Avx2 => "AVX2",
            KernelPath::AvxVnni => "AVX-VNNI",
            KernelPath::Avx512 => "AVX-512 VNNI",
        })
    }
}

impl From<&CpuFeatures> for KernelPath {
    /// The fastest path whose features `features` has and this CPU has too
    /// (`CpuFeatures::usable`).
    fn from(features: &CpuFeatures) -> KernelPath {
        let usable = features.usable();
        KernelPath::ALL
            .into_iter()
            .rev()
            .find(|path| path.missing(&usable).is_empty())
            .unwrap_or(KernelPath::Scalar)
    }
}

/// What `TOKENMILL_KERNELS` did to the detected features.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelsOverride {
    /// Unset (or `auto`): the CPU's own features.
    #[default]
    None,
    /// The features were narrowed to this path's.
    Forced(KernelPath),
    /// The CPU lacks this path: the request was ignored.
    Unsupported(KernelPath),
    /// The value named no path: ignored.
    Unknown,
}

/// Applies `TOKENMILL_KERNELS` (`value`, if set) to the CPU's `features`. A path the CPU lacks
/// or an unknown value is reported on stderr and ignored, never fatal.
pub(crate) fn apply_override(features: CpuFeatures, value: Option<&str>) -> CpuFeatures {
    let Some(value) =
        value.filter(|v| !v.trim().is_empty() && !v.trim().eq_ignore_ascii_case("auto"))
    else {
        return features;
    };
    let Some(path) = KernelPath::parse(value) else {
        eprintln!(
            "warning: {KERNELS_ENV}={value:?} names no kernel path (expected auto, scalar, avx2, \
             avx-vnni or avx512); ignored"
        );
        return CpuFeatures {
            kernels_override: KernelsOverride::Unknown,
            ..features
        };
    };
    let missing = path.missing(&features);
    if !missing.is_empty() {
        eprintln!(
            "warning: {KERNELS_ENV}={value}: this CPU lacks {}; ignored",
            missing.join(" ")
        );
        return CpuFeatures {
            kernels_override: KernelsOverride::Unsupported(path),
            ..features
        };
    }
    path.narrow(&features)
}

impl fmt::Display for KernelsOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelsOverride::None => Ok(()),
            KernelsOverride::Forced(path) => {
                write!(f, ", forced by {KERNELS_ENV}={}", path.env_value())
            }
            KernelsOverride::Unsupported(path) => write!(
                f,
                ", {KERNELS_ENV}={} ignored: CPU lacks it",
                path.env_value()
            ),
            KernelsOverride::Unknown => write!(f, ", {KERNELS_ENV} ignored: unknown value"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_to_paths() {
        for path in KernelPath::ALL {
            assert_eq!(KernelPath::parse(path.env_value()), Some(path));
        }
        assert_eq!(KernelPath::parse(" AVX_VNNI "), Some(KernelPath::AvxVnni));
        assert_eq!(KernelPath::parse("avx-512"), Some(KernelPath::Avx512));
        assert_eq!(KernelPath::parse("sse2"), None);
    }

    #[test]
    fn the_override_only_narrows() {
        let all = CpuFeatures::ALL;
        assert_eq!(apply_override(all, None), all);
        assert_eq!(apply_override(all, Some("auto")), all);
        assert_eq!(apply_override(all, Some("")), all);
        for path in KernelPath::ALL {
            let forced = apply_override(all, Some(path.env_value()));
            assert_eq!(forced.kernels_override, KernelsOverride::Forced(path));
            // Exactly this path's features are left: it is the fastest they allow.
            assert!(path.missing(&forced).is_empty(), "{path}");
            for faster in KernelPath::ALL.into_iter().filter(|&p| p > path) {
                assert!(
                    !faster.missing(&forced).is_empty(),
                    "{path} leaves {faster}"
                );
            }
            assert!(!forced.amx_int8 && !forced.amx_tile && !forced.amx_bf16);
        }
        // A path the CPU lacks, or an unknown value: ignored, the features stay the CPU's.
        let avx2_only = KernelPath::Avx2.narrow(&all);
        let refused = apply_override(avx2_only, Some("avx512"));
        assert_eq!(
            refused.kernels_override,
            KernelsOverride::Unsupported(KernelPath::Avx512)
        );
        assert_eq!(
            CpuFeatures {
                kernels_override: avx2_only.kernels_override,
                ..refused
            },
            avx2_only
        );
        let unknown = apply_override(all, Some("neon"));
        assert_eq!(unknown.kernels_override, KernelsOverride::Unknown);
        assert_eq!(
            CpuFeatures {
                kernels_override: KernelsOverride::None,
                ..unknown
            },
            all
        );
    }

    #[test]
    fn the_summary_names_the_override() {
        let forced = KernelsOverride::Forced(KernelPath::Avx2).to_string();
        assert_eq!(forced, ", forced by TOKENMILL_KERNELS=avx2");
        assert!(KernelsOverride::Unsupported(KernelPath::Avx512)
            .to_string()
            .contains("TOKENMILL_KERNELS=avx512 ignored"));
        assert_eq!(KernelsOverride::None.to_string(), "");
    }
}
