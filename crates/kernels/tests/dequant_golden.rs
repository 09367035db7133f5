//! Golden dequantization fixtures produced by gguf-py (see `fixtures/make_dequant_fixtures.py`):
//! our decoders must agree with the reference implementation on random blocks.

#![allow(clippy::expect_used)]

use tokenmill_kernels::{dequantize, DType};

fn check(dtype: DType, bytes: &[u8], expected_le: &[u8]) {
    let expected: Vec<f32> = expected_le
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let mut out = vec![0.0f32; expected.len()];
    dequantize(dtype, bytes, &mut out).expect("fixture sizes match");
    for (i, (got, want)) in out.iter().zip(&expected).enumerate() {
        // gguf-py evaluates the same formulas in numpy f32; allow one rounding of slack.
        let slack = want.abs() * 2.0 * f32::EPSILON;
        assert!(
            (got - want).abs() <= slack,
            "{dtype} element {i}: got {got}, gguf-py {want}"
        );
    }
}

macro_rules! golden {
    ($test:ident, $dtype:expr, $name:literal) => {
        #[test]
        fn $test() {
            check(
                $dtype,
                include_bytes!(concat!("fixtures/", $name, ".bin")),
                include_bytes!(concat!("fixtures/", $name, ".f32")),
            );
        }
    };
}

golden!(q8_0_matches_gguf_py, DType::Q8_0, "q8_0");
golden!(q4_0_matches_gguf_py, DType::Q4_0, "q4_0");
golden!(q4_1_matches_gguf_py, DType::Q4_1, "q4_1");
golden!(q4_k_matches_gguf_py, DType::Q4_K, "q4_K");
golden!(q5_k_matches_gguf_py, DType::Q5_K, "q5_K");
golden!(q6_k_matches_gguf_py, DType::Q6_K, "q6_K");
golden!(f16_matches_gguf_py, DType::F16, "f16");
golden!(bf16_matches_gguf_py, DType::BF16, "bf16");
golden!(q5_0_matches_gguf_py, DType::Q5_0, "q5_0");
golden!(q5_1_matches_gguf_py, DType::Q5_1, "q5_1");
golden!(iq4_nl_matches_gguf_py, DType::IQ4_NL, "iq4_nl");
golden!(iq4_xs_matches_gguf_py, DType::IQ4_XS, "iq4_xs");
golden!(mxfp4_matches_gguf_py, DType::MXFP4, "mxfp4");
