//! gpt-oss parity on a random-weight checkpoint of gpt-oss-20b's attention and routing
//! (`fixtures/gptoss_20b_like.json`, `scripts/reference/make_gptoss_fixtures.py`): 64 heads of
//! 64 with 8 KV heads, Q/K/V/O biases, a learned sink per head, sliding and full layers
//! alternating, YaRN 32x untruncated, 32 experts (4 per token) with router and expert biases
//! and the clamped SwiGLU, the experts in MXFP4. tokenmill on the GGUF against transformers
//! (F32, on exactly the values the MXFP4 blocks hold) and against llama.cpp on the GGUF its
//! converter made; the same GGUF with F32 experts; chunked and batched against whole; negative
//! controls. The checkpoint is rebuilt from its formulas: nothing is downloaded or skipped.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;
#[path = "support/gpt_oss.rs"]
mod gpt_oss;
#[path = "support/qwen35.rs"]
mod qwen35;

use gpt_oss::Experts;
use qwen35::{check_cases, load, load_fixture, prompt_in_chunks, scratch_dir, widest_difference};
use tokenmill_models::{CausalLm, ModelSource, RopeScaling};

const NAME: &str = "gptoss_20b_like";

/// Largest difference from transformers with F32 experts (logits O(3)): four layers in F32
/// summed in other orders.
const MAX_DIFFERENCE: f32 = 2e-3;

/// A greedy pick is compared only where the reference's top two differ by more than this.
const DECISIVE_MARGIN: f32 = 0.02;

fn gguf_model(
    test: &str,
    experts: Experts,
    edit: impl Fn(&str, &mut Vec<f32>),
) -> Box<dyn CausalLm> {
    let fixture = load_fixture(NAME);
    let path = scratch_dir(&format!("gptoss_{test}")).join(format!("{NAME}.gguf"));
    gpt_oss::write_gguf(NAME, &fixture, &path, experts, edit);
    load(ModelSource::Gguf(path))
}

#[test]
fn f32_experts_match_transformers() {
    let fixture = load_fixture(NAME);
    let model = gguf_model("f32", Experts::F32, |_, _| {});
    assert_eq!(model.config().architecture, "gpt-oss");
    let worst = check_cases(
        model.as_ref(),
        &fixture.transformers,
        "F32 experts",
        MAX_DIFFERENCE,
        DECISIVE_MARGIN,
    );
    eprintln!("F32 experts: largest difference from transformers {worst:e}");
}

/// Each teacher-forced step's largest difference from a reference's top logits.
fn step_differences(model: &dyn CausalLm, cases: &[common::family::Case]) -> Vec<f32> {
    let mut out = Vec::new();
    for case in cases {
        let rows = qwen35::teacher_forced(model, &case.prompt_ids, &case.greedy_ids);
        for (row, top) in rows.iter().zip(&case.top_logits) {
            let worst = top
                .iter()
                .map(|&(token, expected)| (row[token as usize] - expected).abs())
                .fold(0.0f32, f32::max);
            out.push(worst);
        }
    }
    out.sort_by(f32::total_cmp);
    out
}

/// With MXFP4 experts the rows entering them are quantized to int8 per 32 (llama.cpp's
/// Q8_0, as for every quantized weight), which moves these random-weight logits (O(3)) by
/// ~0.05 a step, and by up to ~0.6 where a token's top-4 experts flip. llama.cpp itself,
/// on the same GGUF, is as far from transformers (0.04-0.78 per step, measured when the
/// fixture was made). So the check is on the distribution: the median step within
/// [`MEDIAN_MXFP4`], every step within [`WORST_MXFP4`] (a wrong nibble order or scale
/// breaks both by far: the negative control).
const MEDIAN_MXFP4: f32 = 0.12;
const WORST_MXFP4: f32 = 1.0;

#[test]
fn mxfp4_experts_match_transformers_and_llama_cpp() {
    let fixture = load_fixture(NAME);
    assert!(!fixture.llama_cpp.is_empty(), "no llama.cpp runs");
    let model = gguf_model("mxfp4", Experts::Mxfp4, |_, _| {});
    for (reference, cases) in [
        ("transformers", &fixture.transformers),
        ("llama.cpp", &fixture.llama_cpp),
    ] {
        let steps = step_differences(model.as_ref(), cases);
        let (median, worst) = (steps[steps.len() / 2], steps[steps.len() - 1]);
        eprintln!("MXFP4 experts vs {reference}: median step {median:e}, worst {worst:e}");
        assert!(
            median <= MEDIAN_MXFP4 && worst <= WORST_MXFP4,
            "{reference}: {steps:?}"
        );
    }
    // The MXFP4 experts take 17 bytes per 32 weights, against the F32 file's 128.
    let f32_model = gguf_model("mxfp4_bytes", Experts::F32, |_, _| {});
    assert!(4 * model.weight_bytes() < f32_model.weight_bytes() * 2);
}

/// Negative control of the MXFP4 check: the same codes with every block's scale one step
/// up (each expert weight doubled) must fall outside it.
#[test]
fn doubled_mxfp4_scales_break_parity() {
    let fixture = load_fixture(NAME);
    let path = scratch_dir("gptoss_mxfp4_negative").join(format!("{NAME}.gguf"));
    gpt_oss::write_gguf_scaled(NAME, &fixture, &path, 1);
    let model = load(ModelSource::Gguf(path));
    let steps = step_differences(model.as_ref(), &fixture.transformers);
    let median = steps[steps.len() / 2];
    eprintln!("doubled scales: median step {median:e}");
    assert!(median > 3.0 * MEDIAN_MXFP4, "{steps:?}");
}

/// What the GGUF says: YaRN untruncated (gpt-oss's training; llama.cpp's converter does not
/// record it), even layers sliding, sinks and biases on.
#[test]
fn the_gguf_config_is_gpt_oss() {
    let model = gguf_model("config", Experts::F32, |_, _| {});
    let config = model.config();
    assert!(matches!(
        config.rope_scaling,
        RopeScaling::Yarn {
            truncate: false,
            original_max_position_embeddings: 4096,
            ..
        }
    ));
    let windows: Vec<_> = (0..4).map(|l| config.layer_sliding_window(l)).collect();
    assert_eq!(windows, [Some(16), None, Some(16), None]);
    assert!(config.attention_sinks && config.attention_bias && config.attention_output_bias);
    assert!(config.expert_bias && config.clamped_swiglu.is_some());
    assert!(model.decode_weight_bytes() < model.weight_bytes());
}

/// A prompt past the sliding window, prefilled whole, in chunks, and beside another
/// sequence, gives bitwise the same logits: sinks, windows and experts depend on nothing but
/// the row's own context.
#[test]
fn chunked_and_batched_runs_equal_the_whole_prompt() {
    let model = gguf_model("chunked", Experts::Mxfp4, |_, _| {});
    let model = model.as_ref();
    let prompt: Vec<u32> = (0..41).map(|i| (i * 29 + 3) % 512).collect();
    let other: Vec<u32> = (0..21).map(|i| (i * 13 + 7) % 512).collect();
    let run = |chunks: &[usize], with_other: bool| {
        prompt_in_chunks(model, &prompt, with_other.then_some(&other[..]), chunks)
    };
    let whole = run(&[41], false);
    let chunked = run(&[10, 20, 11], false);
    let batched = run(&[10, 20, 11], true);
    assert_eq!(whole.last(), chunked.last());
    assert_eq!(chunked, batched);
    let decoded = run(&[30, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], true);
    assert_eq!(whole.last(), decoded.last());
}

/// Negative controls: sinks given to the wrong heads (reversed), one expert's gate bias
/// moved, or the router's bias negated must break parity, so the comparison can fail.
#[test]
fn moved_sinks_and_biases_break_parity() {
    let fixture = load_fixture(NAME);
    type Edit = fn(&mut Vec<f32>);
    let edits: [(&str, Edit); 3] = [
        ("blk.1.attn_sinks.weight", |v| v.reverse()),
        ("blk.2.ffn_gate_exps.bias", |v| {
            v.iter_mut().take(256 * 4).for_each(|x| *x = -*x * 20.0)
        }),
        ("blk.0.ffn_gate_inp.bias", |v| {
            v.iter_mut().for_each(|x| *x = -*x * 30.0)
        }),
    ];
    for (tensor, edit) in edits {
        let model = gguf_model("negative", Experts::F32, |name, values| {
            if name == tensor {
                edit(values);
            }
        });
        let worst = widest_difference(model.as_ref(), &fixture.transformers);
        assert!(
            worst > 10.0 * MAX_DIFFERENCE,
            "{tensor} perturbed still matches transformers within {worst}"
        );
        eprintln!("{tensor} perturbed: largest difference {worst:e}");
    }
}

/// Both HF forms (`save_pretrained`'s unquantized experts, the released MXFP4 blocks) load
/// as the GGUF of the same values does: the same config and cache, and logits equal to the
/// GGUF's of the same expert type (bitwise: the same bytes reach the same kernels).
#[test]
fn hf_directories_load_like_the_gguf() {
    let fixture = load_fixture(NAME);
    for (form, hf_experts, experts) in [
        ("unquantized", gpt_oss::HfExperts::Unquantized, Experts::F32),
        ("mxfp4", gpt_oss::HfExperts::Mxfp4, Experts::Mxfp4),
    ] {
        let dir = scratch_dir(&format!("gptoss_hf_{form}"));
        gpt_oss::write_hf_directory(NAME, &fixture, &dir, hf_experts);
        let hf = load(ModelSource::HfDirectory(dir));
        let gguf = gguf_model(&format!("hf_{form}"), experts, |_, _| {});
        assert_eq!(hf.config().moe, gguf.config().moe, "{form}");
        assert_eq!(
            hf.config().rope_scaling,
            gguf.config().rope_scaling,
            "{form}"
        );
        assert_eq!(hf.kv_layout(), gguf.kv_layout(), "{form}");
        assert_eq!(hf.weight_bytes(), gguf.weight_bytes(), "{form}");
        let case = &fixture.transformers[1];
        let a = qwen35::teacher_forced(hf.as_ref(), &case.prompt_ids, &case.greedy_ids);
        let b = qwen35::teacher_forced(gguf.as_ref(), &case.prompt_ids, &case.greedy_ids);
        assert_eq!(a, b, "{form}");
    }
}
