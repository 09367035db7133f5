use super::*;
use crate::test_util::Rng;

/// Random prepared inputs for `n` tokens of `shape` (unit-norm q/k, gates in range).
struct Case {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    decay: Vec<f32>,
    beta: Vec<f32>,
}

impl Case {
    fn new(shape: &DeltaRuleShape, n: usize, seed: u64) -> Case {
        let mut rng = Rng::new(seed);
        let mut q = rng.vec(n * shape.key_dim(), -1.0, 1.0);
        let mut k = rng.vec(n * shape.key_dim(), -1.0, 1.0);
        let scale = 1.0 / (shape.head_k_dim as f32).sqrt();
        l2_normalize_rows(&mut q, shape.head_k_dim, 1e-6, scale);
        l2_normalize_rows(&mut k, shape.head_k_dim, 1e-6, 1.0);
        Case {
            q,
            k,
            v: rng.vec(n * shape.value_dim(), -1.0, 1.0),
            decay: rng.vec(n * shape.num_v_heads, 0.5, 1.0),
            beta: rng.vec(n * shape.num_v_heads, 0.0, 1.0),
        }
    }

    fn inputs(&self) -> DeltaRuleInputs<'_> {
        DeltaRuleInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            decay: &self.decay,
            beta: &self.beta,
        }
    }

    /// Rows `from..to` only (a chunk of one sequence).
    fn rows(&self, shape: &DeltaRuleShape, from: usize, to: usize) -> Case {
        let (kd, vd, h) = (shape.key_dim(), shape.value_dim(), shape.num_v_heads);
        Case {
            q: self.q[from * kd..to * kd].to_vec(),
            k: self.k[from * kd..to * kd].to_vec(),
            v: self.v[from * vd..to * vd].to_vec(),
            decay: self.decay[from * h..to * h].to_vec(),
            beta: self.beta[from * h..to * h].to_vec(),
        }
    }
}

fn shape(num_k_heads: usize, num_v_heads: usize, dk: usize, dv: usize) -> DeltaRuleShape {
    DeltaRuleShape {
        num_k_heads,
        num_v_heads,
        head_k_dim: dk,
        head_v_dim: dv,
        key_heads: KeyHeadOrder::Grouped,
    }
}

/// Runs `seqs` of `case` on `path`, each sequence from its state in `states`.
fn run(
    path: DeltaRulePath,
    pool: &ThreadPool,
    shape: &DeltaRuleShape,
    case: &Case,
    seqs: &[DeltaRuleSeq],
    states: &mut [Vec<f32>],
) -> Vec<f32> {
    let n = case.decay.len() / shape.num_v_heads;
    let mut out = vec![f32::NAN; n * shape.value_dim()];
    let borrowed: Vec<&mut [f32]> = states.iter_mut().map(|s| s.as_mut_slice()).collect();
    gated_delta_rule_on(path, pool, shape, case.inputs(), seqs, borrowed, &mut out).unwrap();
    out
}

/// The recurrence in f64, straight from the definition (HF's `torch_recurrent_gated_delta_rule`).
fn reference(shape: &DeltaRuleShape, case: &Case, state: &mut [f64]) -> Vec<f64> {
    let (dk, dv, hv) = (shape.head_k_dim, shape.head_v_dim, shape.num_v_heads);
    let n = case.decay.len() / hv;
    let mut out = vec![0.0; n * shape.value_dim()];
    for t in 0..n {
        for h in 0..hv {
            let kh = shape.key_head(h);
            let q = &case.q[t * shape.key_dim() + kh * dk..][..dk];
            let k = &case.k[t * shape.key_dim() + kh * dk..][..dk];
            let v = &case.v[t * shape.value_dim() + h * dv..][..dv];
            let s = &mut state[h * dk * dv..(h + 1) * dk * dv];
            let decay = f64::from(case.decay[t * hv + h]);
            s.iter_mut().for_each(|x| *x *= decay);
            for j in 0..dv {
                let mem: f64 = (0..dk).map(|i| s[i * dv + j] * f64::from(k[i])).sum();
                let delta = (f64::from(v[j]) - mem) * f64::from(case.beta[t * hv + h]);
                for i in 0..dk {
                    s[i * dv + j] += f64::from(k[i]) * delta;
                }
            }
            for j in 0..dv {
                out[h * n * dv + t * dv + j] =
                    (0..dk).map(|i| s[i * dv + j] * f64::from(q[i])).sum();
            }
        }
    }
    out
}

#[test]
fn every_path_matches_the_scalar_twin_bit_for_bit() {
    let pool = ThreadPool::new(2);
    for (shape, n) in [
        (shape(2, 4, 32, 128), 7),
        (shape(3, 3, 16, 20), 5),
        (shape(1, 2, 8, 37), 4),
    ] {
        let case = Case::new(&shape, n, 7);
        let seqs = [
            DeltaRuleSeq { start: 0, len: 3 },
            DeltaRuleSeq {
                start: 3,
                len: n - 3,
            },
        ];
        let init = Rng::new(3).vec(shape.state_elems(), -0.5, 0.5);
        let mut scalar_states = vec![init.clone(), vec![0.0; shape.state_elems()]];
        let scalar = run(
            DeltaRulePath::Scalar,
            &pool,
            &shape,
            &case,
            &seqs,
            &mut scalar_states,
        );
        for path in DeltaRulePath::available() {
            let mut states = vec![init.clone(), vec![0.0; shape.state_elems()]];
            let out = run(path, &pool, &shape, &case, &seqs, &mut states);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&scalar), "{path:?} output, {shape:?}");
            assert_eq!(bits(&states[0]), bits(&scalar_states[0]), "{path:?} state");
            assert_eq!(bits(&states[1]), bits(&scalar_states[1]), "{path:?} state");
        }
    }
    if !DeltaRulePath::available().contains(&DeltaRulePath::Avx512) {
        eprintln!("gated delta rule: AVX-512 path skipped (not on this CPU)");
    }
}

#[test]
fn matches_the_f64_definition() {
    let pool = ThreadPool::new(2);
    for key_heads in [KeyHeadOrder::Grouped, KeyHeadOrder::Tiled] {
        let shape = DeltaRuleShape {
            key_heads,
            ..shape(2, 4, 32, 24)
        };
        let case = Case::new(&shape, 9, 11);
        let init = Rng::new(5).vec(shape.state_elems(), -0.5, 0.5);
        let mut expected_state: Vec<f64> = init.iter().map(|&x| f64::from(x)).collect();
        let expected = reference(&shape, &case, &mut expected_state);
        let mut states = vec![init];
        let out = run(
            DeltaRulePath::detect(),
            &pool,
            &shape,
            &case,
            &[DeltaRuleSeq { start: 0, len: 9 }],
            &mut states,
        );
        for (a, b) in out.iter().zip(&expected) {
            assert!((f64::from(*a) - b).abs() < 1e-5, "{a} vs {b}");
        }
        for (a, b) in states[0].iter().zip(&expected_state) {
            assert!((f64::from(*a) - b).abs() < 1e-5, "{a} vs {b}");
        }
    }
}

#[test]
fn a_run_split_anywhere_gives_the_same_bits() {
    let pool = ThreadPool::new(2);
    let shape = shape(2, 4, 16, 24);
    let n = 11;
    let case = Case::new(&shape, n, 13);
    let path = DeltaRulePath::detect();
    let mut whole_state = vec![vec![0.0; shape.state_elems()]];
    let whole = run(
        path,
        &pool,
        &shape,
        &case,
        &[DeltaRuleSeq { start: 0, len: n }],
        &mut whole_state,
    );
    for split in [1, 4, 10] {
        let mut state = vec![vec![0.0; shape.state_elems()]];
        let mut outs = Vec::new();
        for (from, to) in [(0, split), (split, n)] {
            let part = case.rows(&shape, from, to);
            let seq = [DeltaRuleSeq {
                start: 0,
                len: to - from,
            }];
            outs.push((from, to, run(path, &pool, &shape, &part, &seq, &mut state)));
        }
        assert_eq!(state[0], whole_state[0], "state after a split at {split}");
        let dv = shape.head_v_dim;
        for h in 0..shape.num_v_heads {
            for (from, to, out) in &outs {
                let len = to - from;
                for t in 0..len {
                    assert_eq!(
                        out[(h * len + t) * dv..(h * len + t + 1) * dv],
                        whole[(h * n + from + t) * dv..(h * n + from + t + 1) * dv]
                    );
                }
            }
        }
    }
}

#[test]
fn shapes_and_orders_are_checked() {
    let pool = ThreadPool::new(1);
    let shape = shape(1, 2, 8, 8);
    let case = Case::new(&shape, 4, 1);
    let mut out = vec![0.0; 4 * shape.value_dim()];
    let mut a = vec![0.0; shape.state_elems()];
    let mut b = vec![0.0; shape.state_elems()];
    let overlapping = [
        DeltaRuleSeq { start: 0, len: 3 },
        DeltaRuleSeq { start: 2, len: 2 },
    ];
    let states: Vec<&mut [f32]> = vec![&mut a, &mut b];
    assert!(
        gated_delta_rule(&pool, &shape, case.inputs(), &overlapping, states, &mut out).is_err()
    );
    let mut short = vec![0.0; 3];
    let states: Vec<&mut [f32]> = vec![&mut short];
    let one = [DeltaRuleSeq { start: 0, len: 4 }];
    assert!(gated_delta_rule(&pool, &shape, case.inputs(), &one, states, &mut out).is_err());
}

#[test]
fn key_head_orders() {
    let grouped = shape(2, 6, 4, 4);
    let tiled = DeltaRuleShape {
        key_heads: KeyHeadOrder::Tiled,
        ..grouped
    };
    let heads = |s: &DeltaRuleShape| (0..6).map(|h| s.key_head(h)).collect::<Vec<_>>();
    assert_eq!(heads(&grouped), [0, 0, 0, 1, 1, 1]);
    assert_eq!(heads(&tiled), [0, 1, 0, 1, 0, 1]);
}

#[test]
fn conv_matches_the_definition_and_continues_across_splits() {
    let (channels, kernel, n) = (5, 4, 7);
    let mut rng = Rng::new(2);
    let x = rng.vec(n * channels, -1.0, 1.0);
    let weight = rng.vec(channels * kernel, -1.0, 1.0);
    let mut window = vec![0.0; (kernel - 1) * channels];
    let mut whole = vec![0.0; n * channels];
    causal_conv1d_silu(&x, &weight, &mut window, &mut whole).unwrap();
    for t in 0..n {
        for c in 0..channels {
            let mut acc = 0.0f64;
            for j in 0..kernel {
                let pos = t as isize - (kernel - 1 - j) as isize;
                if pos >= 0 {
                    acc += f64::from(weight[c * kernel + j])
                        * f64::from(x[pos as usize * channels + c]);
                }
            }
            let expected = acc / (1.0 + (-acc).exp());
            assert!((f64::from(whole[t * channels + c]) - expected).abs() < 1e-5);
        }
    }
    // The window carries the last kernel - 1 inputs: any split gives the same bits.
    for split in [1, 2, 5] {
        let mut window = vec![0.0; (kernel - 1) * channels];
        let mut out = vec![0.0; n * channels];
        let (first, second) = out.split_at_mut(split * channels);
        causal_conv1d_silu(&x[..split * channels], &weight, &mut window, first).unwrap();
        causal_conv1d_silu(&x[split * channels..], &weight, &mut window, second).unwrap();
        assert_eq!(out, whole, "split at {split}");
    }
    let mut bad = vec![0.0; 2];
    assert!(causal_conv1d_silu(&x, &weight, &mut bad, &mut whole).is_err());
}
