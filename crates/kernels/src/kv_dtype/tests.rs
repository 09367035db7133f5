use super::*;
use crate::test_util::Rng;

/// The codecs to check: the scalar reference always, AVX2 when this CPU has it.
fn codecs() -> Vec<KvCodec> {
    let detected = KvCodec::detect();
    if detected == KvCodec::Scalar {
        eprintln!("no AVX2+F16C on this CPU: only the scalar codec is tested");
    }
    vec![KvCodec::Scalar, detected]
}

/// Same value, NaN counting as equal to NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// E4M3 decoded from its definition, in f64: `(-1)^s * 2^(e-7) * (1 + m/8)`, subnormals
/// `(-1)^s * 2^-6 * m/8`, `S.1111.111` NaN.
fn e4m3_table() -> Vec<f64> {
    (0..=255u32)
        .map(|code| {
            let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
            let exponent = ((code >> 3) & 0xf) as i32;
            let mantissa = f64::from(code & 7);
            if exponent == 15 && code & 7 == 7 {
                f64::NAN
            } else if exponent == 0 {
                sign * 2f64.powi(-6) * mantissa / 8.0
            } else {
                sign * 2f64.powi(exponent - 7) * (1.0 + mantissa / 8.0)
            }
        })
        .collect()
}

/// E5M2 from its definition: bias 15, exponent 31 is inf (mantissa 0) or NaN.
fn e5m2_table() -> Vec<f64> {
    (0..=255u32)
        .map(|code| {
            let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
            let exponent = ((code >> 2) & 0x1f) as i32;
            let mantissa = f64::from(code & 3);
            match exponent {
                31 if mantissa == 0.0 => sign * f64::INFINITY,
                31 => f64::NAN,
                0 => sign * 2f64.powi(-14) * mantissa / 4.0,
                _ => sign * 2f64.powi(exponent - 15) * (1.0 + mantissa / 4.0),
            }
        })
        .collect()
}

#[test]
fn scalar_fp8_decoders_match_the_format_definitions() {
    for (code, &want) in e4m3_table().iter().enumerate() {
        let got = f64::from(fp8_e4m3_to_f32(code as u8));
        assert!(
            got == want || (got.is_nan() && want.is_nan()),
            "e4m3 {code:#04x}"
        );
    }
    for (code, &want) in e5m2_table().iter().enumerate() {
        let got = f64::from(fp8_e5m2_to_f32(code as u8));
        assert!(
            got == want || (got.is_nan() && want.is_nan()),
            "e5m2 {code:#04x}"
        );
    }
    assert_eq!(fp8_e4m3_to_f32(0x7e), 448.0);
    assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
    assert_eq!(fp8_e5m2_to_f32(0x7b), 57344.0);
}

#[test]
fn decoders_match_the_scalar_reference_on_every_code() {
    let bytes: Vec<u8> = (0..=255u8).collect();
    let halves: Vec<u16> = (0..=u16::MAX).collect();
    for codec in codecs() {
        // Odd lengths and offsets exercise the vector body and the scalar tail.
        for skip in [0, 3] {
            let mut out = vec![0.0f32; 256 - skip];
            codec.decode_fp8_e4m3(&bytes[skip..], Rows::contiguous(out.len()), &mut out);
            for (code, &value) in bytes[skip..].iter().zip(&out) {
                assert!(same(value, fp8_e4m3_to_f32(*code)), "{codec:?} e4m3 {code}");
            }
            codec.decode_fp8_e5m2(&bytes[skip..], Rows::contiguous(out.len()), &mut out);
            for (code, &value) in bytes[skip..].iter().zip(&out) {
                assert!(same(value, fp8_e5m2_to_f32(*code)), "{codec:?} e5m2 {code}");
            }
            let mut out = vec![0.0f32; halves.len() - skip];
            codec.decode_f16(&halves[skip..], Rows::contiguous(out.len()), &mut out);
            for (code, &value) in halves[skip..].iter().zip(&out) {
                assert!(same(value, f16_to_f32(*code)), "{codec:?} f16 {code:#06x}");
            }
            codec.decode_bf16(&halves[skip..], Rows::contiguous(out.len()), &mut out);
            for (code, &value) in halves[skip..].iter().zip(&out) {
                assert!(
                    same(value, bf16_to_f32(*code)),
                    "{codec:?} bf16 {code:#06x}"
                );
            }
        }
    }
}

/// Every finite code decodes and re-encodes to itself (±0 included), in every codec.
#[test]
fn finite_codes_round_trip() {
    for codec in codecs() {
        let bytes: Vec<u8> = (0..=255u8).collect();
        let mut values = vec![0.0f32; 256];
        let mut again = vec![0u8; 256];
        codec.decode_fp8_e4m3(&bytes, Rows::contiguous(values.len()), &mut values);
        codec.encode_fp8_e4m3(&values, &mut again);
        for (&code, &back) in bytes.iter().zip(&again) {
            if code & 0x7f != 0x7f {
                assert_eq!(back, code, "{codec:?} e4m3");
            }
        }
        codec.decode_fp8_e5m2(&bytes, Rows::contiguous(values.len()), &mut values);
        codec.encode_fp8_e5m2(&values, &mut again);
        for (&code, &back) in bytes.iter().zip(&again) {
            if code & 0x7f < 0x7c {
                assert_eq!(back, code, "{codec:?} e5m2");
            }
        }
        let halves: Vec<u16> = (0..=u16::MAX).collect();
        let mut values = vec![0.0f32; halves.len()];
        let mut again = vec![0u16; halves.len()];
        codec.decode_f16(&halves, Rows::contiguous(values.len()), &mut values);
        codec.encode_f16(&values, &mut again);
        for (&code, &back) in halves.iter().zip(&again) {
            if code & 0x7c00 != 0x7c00 {
                assert_eq!(back, code, "{codec:?} f16");
            }
        }
        codec.decode_bf16(&halves, Rows::contiguous(values.len()), &mut values);
        codec.encode_bf16(&values, &mut again);
        for (&code, &back) in halves.iter().zip(&again) {
            if code & 0x7f80 != 0x7f80 {
                assert_eq!(back, code, "{codec:?} bf16");
            }
        }
    }
}

/// Values that stress the encoders: every midpoint between neighbouring codes (ties) and the
/// values just beside them, subnormals, ±0, huge and infinite values, NaN, and random values
/// over many magnitudes.
fn hard_values(rng: &mut Rng, decoded: impl Fn(u32) -> f32, codes: u32) -> Vec<f32> {
    let mut values = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        1e-30,
        65504.0,
        65519.0,
        65520.0,
        1e5,
        448.0,
        464.0,
        465.0,
        480.0,
        1000.0,
        57344.0,
        61439.0,
        61440.0,
        f32::from_bits(0x7f7f_8000),
        f32::from_bits(0x7f7f_7fff),
        -3.0e38,
    ];
    let finite: Vec<f32> = (0..codes)
        .map(&decoded)
        .filter(|v| v.is_finite() && *v >= 0.0)
        .collect();
    let mut sorted = finite.clone();
    sorted.sort_by(f32::total_cmp);
    for pair in sorted.windows(2) {
        let middle = ((f64::from(pair[0]) + f64::from(pair[1])) / 2.0) as f32;
        for value in [
            middle,
            f32::from_bits(middle.to_bits() + 1),
            f32::from_bits(middle.to_bits().saturating_sub(1)),
        ] {
            values.push(value);
            values.push(-value);
        }
    }
    for _ in 0..20_000 {
        let exponent = rng.below(80) as i32 - 40;
        let value = rng.uniform(-1.0, 1.0) * 2f32.powi(exponent);
        values.push(value);
    }
    values.push(f32::NAN);
    values.push(-f32::NAN);
    values
}

#[test]
fn encoders_match_the_scalar_reference_bitwise() {
    let mut rng = Rng::new(17);
    let e4m3 = hard_values(&mut rng, |c| fp8_e4m3_to_f32(c as u8), 128);
    let e5m2 = hard_values(&mut rng, |c| fp8_e5m2_to_f32(c as u8), 128);
    let f16 = hard_values(&mut rng, |c| f16_to_f32(c as u16), 0x8000);
    // bfloat16 midpoints: every 251st code keeps the list short.
    let bf16 = hard_values(&mut rng, |c| bf16_to_f32((c * 251 % 0x8000) as u16), 0x8000);
    for codec in codecs() {
        for skip in [0, 5] {
            let values = &e4m3[skip..];
            let mut out = vec![0u8; values.len()];
            codec.encode_fp8_e4m3(values, &mut out);
            for (&value, &code) in values.iter().zip(&out) {
                assert_eq!(code, f32_to_fp8_e4m3(value), "{codec:?} e4m3 {value:e}");
            }
            let values = &e5m2[skip..];
            let mut out = vec![0u8; values.len()];
            codec.encode_fp8_e5m2(values, &mut out);
            for (&value, &code) in values.iter().zip(&out) {
                assert_eq!(code, f32_to_fp8_e5m2(value), "{codec:?} e5m2 {value:e}");
            }
            let values = &f16[skip..];
            let mut out = vec![0u16; values.len()];
            codec.encode_f16(values, &mut out);
            for (&value, &code) in values.iter().zip(&out) {
                assert_eq!(
                    code,
                    f32_to_f16_saturating(value),
                    "{codec:?} f16 {value:e}"
                );
            }
            let values = &bf16[skip..];
            let mut out = vec![0u16; values.len()];
            codec.encode_bf16(values, &mut out);
            for (&value, &code) in values.iter().zip(&out) {
                assert_eq!(
                    code,
                    f32_to_bf16_saturating(value),
                    "{codec:?} bf16 {value:e}"
                );
            }
        }
    }
}

/// The scalar encoders round to the nearest code, ties to the even code, and saturate; no
/// finite input becomes NaN or infinite.
#[test]
fn encoders_round_to_nearest_even_and_saturate() {
    let mut rng = Rng::new(23);
    for dtype in [
        KvCacheDType::F16,
        KvCacheDType::BF16,
        KvCacheDType::Fp8E4m3,
        KvCacheDType::Fp8E5m2,
    ] {
        let (codes, decode, max): (u32, Box<dyn Fn(u32) -> f32>, f32) = match dtype {
            KvCacheDType::F16 => (0x8000, Box::new(|c| f16_to_f32(c as u16)), F16_MAX),
            KvCacheDType::BF16 => (0x8000, Box::new(|c| bf16_to_f32(c as u16)), BF16_MAX),
            KvCacheDType::Fp8E4m3 => (128, Box::new(|c| fp8_e4m3_to_f32(c as u8)), 448.0),
            _ => (128, Box::new(|c| fp8_e5m2_to_f32(c as u8)), 57344.0),
        };
        // Non-negative finite codes in value order; the code's parity is its mantissa's.
        let mut grid: Vec<(f32, u32)> = (0..codes)
            .map(|c| (decode(c), c))
            .filter(|(v, _)| v.is_finite())
            .collect();
        grid.sort_by(|a, b| a.0.total_cmp(&b.0));
        let values = hard_values(&mut rng, &decode, codes.min(128));
        for value in values.into_iter().filter(|v| !v.is_nan()) {
            let rounded = dtype.round(value);
            assert!(rounded.is_finite(), "{dtype} {value:e} became {rounded}");
            assert_eq!(rounded.is_sign_negative(), value.is_sign_negative());
            let magnitude = value.abs();
            if magnitude >= max {
                assert_eq!(rounded.abs(), max, "{dtype} {value:e} saturates");
                continue;
            }
            let above = grid.partition_point(|&(v, _)| v < magnitude);
            let (high, high_code) = grid[above];
            let (low, low_code) = grid[above.saturating_sub(1)];
            let (low_gap, high_gap) = (
                f64::from(magnitude) - f64::from(low),
                f64::from(high) - f64::from(magnitude),
            );
            let tie = low_gap == high_gap && high != magnitude;
            if tie {
                assert_ne!(
                    low_code % 2,
                    high_code % 2,
                    "{dtype}: neighbours differ in parity"
                );
            }
            let want = if high == magnitude || high_gap < low_gap || (tie && high_code % 2 == 0) {
                high
            } else {
                low
            };
            assert_eq!(rounded.abs(), want, "{dtype} {value:e}");
        }
        assert!(dtype.round(f32::NAN).is_nan());
    }
}

#[test]
fn buffers_encode_and_decode_every_type() {
    let values = [0.5f32, -1.25, 3.0, 1000.0, -0.0, 1e-3, 7.0, 65536.0, 2.0];
    for dtype in KvCacheDType::ALL {
        let buffer = KvCacheBuffer::from_f32(dtype, &values);
        assert_eq!(buffer.dtype(), dtype);
        assert_eq!(buffer.len(), values.len());
        let decoded = buffer.to_f32();
        for (&value, &back) in values.iter().zip(&decoded) {
            assert_eq!(
                back.to_bits(),
                dtype.round(value).to_bits(),
                "{dtype} {value}"
            );
        }
        assert_eq!(KvCacheBuffer::zeros(dtype, 4).to_f32(), vec![0.0; 4]);
    }
    assert_eq!(KvCacheDType::Fp8E4m3.round(1000.0), 448.0);
    assert_eq!(KvCacheDType::Fp8E5m2.round(1e6), 57344.0);
    assert_eq!(KvCacheDType::F16.round(1e6), 65504.0);
    assert_eq!(KvCacheDType::F16.element_bytes(), 2);
    assert_eq!(KvCacheDType::Fp8E5m2.element_bytes(), 1);
}
