use super::*;

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// The AVX2 `exp8` of every input, eight lanes at a time (the caller checked AVX2 + FMA).
#[cfg(target_arch = "x86_64")]
fn exp8_each(inputs: &[f32]) -> Vec<f32> {
    use std::arch::x86_64::*;
    let mut out = Vec::with_capacity(inputs.len());
    for chunk in inputs.chunks(8) {
        let mut lanes = [0.0f32; 8];
        lanes[..chunk.len()].copy_from_slice(chunk);
        let mut result = [0.0f32; 8];
        // SAFETY: the caller detected AVX2 and FMA; both arrays hold 8 f32.
        unsafe {
            let x = _mm256_loadu_ps(lanes.as_ptr());
            _mm256_storeu_ps(result.as_mut_ptr(), avx2::exp8(x));
        }
        out.extend_from_slice(&result[..chunk.len()]);
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[test]
fn vector_exp_matches_libm() {
    if VectorOps::detect() == VectorOps::Scalar {
        eprintln!("vector_exp_matches_libm: skipped, this CPU has no AVX2+FMA path");
        return;
    }
    let mut inputs: Vec<f32> = (0..2000).map(|i| -(i as f32) * 0.05).collect();
    inputs.extend([f32::NEG_INFINITY, -87.0, -88.0, -200.0, 0.0, 1.5, 40.0]);
    for (got, x) in exp8_each(&inputs).into_iter().zip(&inputs) {
        let want = x.exp();
        assert!((got - want).abs() <= 2e-7 * want + 1e-37, "{got} vs {want}");
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn eight_key_scores_match_f64_dots() {
    use std::arch::x86_64::*;
    if VectorOps::detect() == VectorOps::Scalar {
        eprintln!("eight_key_scores_match_f64_dots: skipped, this CPU has no AVX2+FMA path");
        return;
    }
    let mut rng = crate::test_util::Rng::new(3);
    for d in [1usize, 7, 8, 9, 17, 48, 64, 80, 100, 256] {
        let query = rng.vec(d, -1.0, 1.0);
        let keys: Vec<Vec<f32>> = (0..8).map(|_| rng.vec(d, -1.0, 1.0)).collect();
        let rows: [*const f32; 8] = std::array::from_fn(|k| keys[k].as_ptr());
        let mut got = [0.0f32; 8];
        // SAFETY: AVX2 and FMA were detected above; every row and the query hold d f32.
        unsafe { _mm256_storeu_ps(got.as_mut_ptr(), avx2::scores8(query.as_ptr(), rows, d)) };
        for (k, key) in keys.iter().enumerate() {
            let exact: f64 = query
                .iter()
                .zip(key)
                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                .sum();
            assert!((f64::from(got[k]) - exact).abs() < 1e-4, "d={d} key {k}");
        }
    }
}

#[test]
fn attend_tile_simd_matches_scalar() {
    let ops = VectorOps::detect();
    let mut rng = crate::test_util::Rng::new(17);
    for d in [1usize, 7, 8, 17, 48, 64, 72, 80, 130, 256] {
        for count in [1usize, 3, 8, 9, 16] {
            let stride = d + 5;
            let keys = rng.vec((count - 1) * stride + d, -1.0, 1.0);
            let values = rng.vec((count - 1) * stride + d, -1.0, 1.0);
            let query = rng.vec(d, -1.0, 1.0);
            let tile = KeyTile {
                keys: &keys,
                values: &values,
                stride,
                count,
            };
            let start = rng.vec(d, -1.0, 1.0);
            let (mut acc_a, mut acc_b) = (start.clone(), start);
            let mut state_a = OnlineSoftmax { max: 0.3, sum: 1.5 };
            let mut state_b = state_a;
            // Two tiles in a row exercise the rescale of an existing accumulator.
            for _ in 0..2 {
                ops.attend_tile(&query, tile, 0.7, &mut state_a, &mut acc_a);
                scalar_attend_tile(&query, tile, 0.7, &mut state_b, &mut acc_b);
            }
            // Bitwise: the scalar twin does the SIMD path's operations in its order.
            assert_eq!(
                state_a.max.to_bits(),
                state_b.max.to_bits(),
                "d={d} count={count}"
            );
            assert_eq!(
                state_a.sum.to_bits(),
                state_b.sum.to_bits(),
                "d={d} count={count}"
            );
            assert_eq!(bits(&acc_a), bits(&acc_b), "d={d} count={count}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn scalar_exp_is_bitwise_exp8() {
    if VectorOps::detect() == VectorOps::Scalar {
        eprintln!("scalar_exp_is_bitwise_exp8: skipped, this CPU has no AVX2+FMA path");
        return;
    }
    let mut rng = crate::test_util::Rng::new(29);
    let mut inputs = rng.vec(20_000, -100.0, 100.0);
    inputs.extend(rng.vec(4_000, -1.0, 1.0));
    inputs.extend([
        f32::NEG_INFINITY,
        f32::INFINITY,
        -87.336_55,
        -87.336_5,
        -87.4,
        88.376_26,
        88.5,
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        -1e-30,
        0.5 * std::f32::consts::LN_2,
    ]);
    for (got, &x) in exp8_each(&inputs).into_iter().zip(&inputs) {
        assert_eq!(got.to_bits(), scalar_exp(x).to_bits(), "exp({x})");
    }
    #[cfg(target_arch = "x86_64")]
    {
        if !VectorOps::available().contains(&VectorOps::Avx512) {
            eprintln!("scalar_exp_is_bitwise_exp8: exp16 skipped, no AVX-512 F/VL path");
            return;
        }
        use std::arch::x86_64::*;
        // The special values at the end come first, so whole chunks of 16 cover them.
        let mut inputs = inputs;
        let tail = inputs.len() % 16;
        inputs.rotate_right(tail);
        for chunk in inputs.chunks_exact(16) {
            let mut got = [0.0f32; 16];
            // SAFETY: the AVX-512 path exists, so AVX2, FMA and AVX-512 F are there; the
            // pointers cover 8 f32 each.
            unsafe {
                let (low, high) = avx2::exp8_pair(
                    _mm256_loadu_ps(chunk.as_ptr()),
                    _mm256_loadu_ps(chunk.as_ptr().add(8)),
                );
                _mm256_storeu_ps(got.as_mut_ptr(), low);
                _mm256_storeu_ps(got.as_mut_ptr().add(8), high);
            }
            for (got, &x) in got.iter().zip(chunk) {
                assert_eq!(got.to_bits(), scalar_exp(x).to_bits(), "exp16({x})");
            }
        }
    }
}

#[test]
fn silu_mul_simd_is_bitwise_its_scalar_twin() {
    let mut rng = crate::test_util::Rng::new(31);
    let mut gate = rng.vec(1003, -30.0, 30.0);
    gate.extend([0.0, -0.0, 90.0, -90.0, 1e-30]);
    let up = rng.vec(gate.len(), -2.0, 2.0);
    let mut simd = gate.clone();
    VectorOps::detect().silu_mul(&mut simd, &up);
    scalar_silu_mul(&mut gate, &up);
    assert_eq!(bits(&simd), bits(&gate));
}

#[test]
fn accumulating_two_pairs_is_bitwise_the_same_as_one_by_one() {
    let mut rng = crate::test_util::Rng::new(23);
    for ops in VectorOps::available() {
        for d in [3usize, 8, 17, 48, 64, 80, 130] {
            for count in [1usize, 5, 16] {
                let stride = d + 3;
                let keys = rng.vec((count - 1) * stride + d, -1.0, 1.0);
                let values = rng.vec((count - 1) * stride + d, -1.0, 1.0);
                let tile = KeyTile {
                    keys: &keys,
                    values: &values,
                    stride,
                    count,
                };
                let mut state = [OnlineSoftmax { max: 0.1, sum: 2.0 }; 2];
                let weights: Vec<TileWeights> = state
                    .iter_mut()
                    .map(|state| {
                        let query = rng.vec(d, -1.0, 1.0);
                        ops.tile_weights(&query, tile, 0.3, state).unwrap()
                    })
                    .collect();
                let start: Vec<Vec<f32>> = (0..2).map(|_| rng.vec(d, -1.0, 1.0)).collect();
                let (mut a, mut b) = (start[0].clone(), start[1].clone());
                ops.accumulate_two(tile, [&weights[0], &weights[1]], [&mut a, &mut b]);
                let (mut x, mut y) = (start[0].clone(), start[1].clone());
                ops.accumulate(tile, &weights[0], &mut x);
                ops.accumulate(tile, &weights[1], &mut y);
                assert_eq!(bits(&a), bits(&x), "{ops:?} d={d} count={count}");
                assert_eq!(bits(&b), bits(&y), "{ops:?} d={d} count={count}");
            }
        }
    }
}

#[test]
fn grouped_pairs_are_bitwise_the_same_as_one_by_one() {
    let mut rng = crate::test_util::Rng::new(29);
    for ops in VectorOps::available() {
        for d in [3usize, 8, 17, 48, 64, 80, 130] {
            for count in [1usize, 3, 4, 5, 8, 9, 12, 16] {
                let stride = d + 3;
                let keys = rng.vec((count - 1) * stride + d, -2.0, 2.0);
                let values = rng.vec((count - 1) * stride + d, -1.0, 1.0);
                let tile = KeyTile {
                    keys: &keys,
                    values: &values,
                    stride,
                    count,
                };
                for n in 1..=GROUP {
                    let queries: Vec<Vec<f32>> = (0..n).map(|_| rng.vec(d, -1.0, 1.0)).collect();
                    let query_refs: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
                    let start = rng.vec(n * d, -1.0, 1.0);
                    let first_states: Vec<OnlineSoftmax> = (0..n)
                        .map(|i| OnlineSoftmax {
                            max: [f32::NEG_INFINITY, 0.2, 3.0][i % 3],
                            sum: [0.0, 1.5, 2.5][i % 3],
                        })
                        .collect();
                    let (mut states, mut accs) = (first_states.clone(), start.clone());
                    // Two tiles in a row exercise the rescale of an existing accumulator.
                    for _ in 0..2 {
                        ops.attend_group(&query_refs, tile, 0.4, &mut states, &mut accs);
                    }
                    for i in 0..n {
                        let mut alone_state = [first_states[i]];
                        let mut alone = start[i * d..(i + 1) * d].to_vec();
                        let mut old_state = first_states[i];
                        let mut old = alone.clone();
                        for _ in 0..2 {
                            let query = [query_refs[i]];
                            ops.attend_group(&query, tile, 0.4, &mut alone_state, &mut alone);
                            ops.attend_tile(query_refs[i], tile, 0.4, &mut old_state, &mut old);
                        }
                        let what = format!("{ops:?} d={d} count={count} n={n} pair {i}");
                        let grouped = &accs[i * d..(i + 1) * d];
                        assert_eq!(bits(grouped), bits(&alone), "{what}");
                        assert_eq!(bits(grouped), bits(&old), "{what}");
                        for state in [alone_state[0], old_state] {
                            assert_eq!(states[i].max.to_bits(), state.max.to_bits(), "{what}");
                            assert_eq!(states[i].sum.to_bits(), state.sum.to_bits(), "{what}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn exp_pair_is_bitwise_scalar_exp() {
    let mut rng = crate::test_util::Rng::new(31);
    let mut inputs = rng.vec(2000, -100.0, 100.0);
    inputs.extend([
        0.0,
        -0.0,
        -87.336_55,
        -87.4,
        88.376_26,
        89.0,
        f32::NEG_INFINITY,
    ]);
    for ops in VectorOps::available() {
        for pair in inputs.chunks_exact(2) {
            let (a, b) = ops.scalar_exp_pair(pair[0], pair[1]);
            assert_eq!(
                a.to_bits(),
                scalar_exp(pair[0]).to_bits(),
                "{ops:?} {}",
                pair[0]
            );
            assert_eq!(
                b.to_bits(),
                scalar_exp(pair[1]).to_bits(),
                "{ops:?} {}",
                pair[1]
            );
        }
    }
}

#[test]
fn attend_tile_ignores_invalid_tiles() {
    let ops = VectorOps::detect();
    let keys = vec![1.0f32; 40];
    let query = [1.0f32; 4];
    let mut acc = [2.0f32; 4];
    let mut state = OnlineSoftmax::EMPTY;
    for (count, len) in [(0, 40), (TILE + 1, 40 * TILE), (11, 40)] {
        let buffer = vec![1.0f32; len];
        let tile = KeyTile {
            keys: &buffer,
            values: &keys,
            stride: 4,
            count,
        };
        ops.attend_tile(&query, tile, 1.0, &mut state, &mut acc);
    }
    assert_eq!(acc, [2.0; 4]);
    assert_eq!(state.sum, 0.0);
}
