//! Qwen3.5 (Gated DeltaNet hybrid) parity on random-weight checkpoints of real shapes
//! (`fixtures/qwen35_*.json`, `scripts/reference/make_qwen35_fixtures.py`): tokenmill on the
//! HF directory against transformers (F32), tokenmill on the GGUF against llama.cpp on the GGUF
//! its own converter made, the two loads against each other, and a negative control. The
//! checkpoints are rebuilt here from their formula weights, so no model file is downloaded
//! and nothing is skipped.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;
#[path = "support/qwen35.rs"]
mod qwen35;

use common::family::Case;
use qwen35::{load, load_fixture, scratch_dir, teacher_forced, widest_difference, write_gguf};
use tokenmill_models::{CausalLm, ModelSource};

/// Both fixtures: Qwen3.5-0.8B's heads (16 key = 16 value heads, tied head), and twice as
/// many value heads as key heads (untied head), which llama.cpp's converter reorders.
const FIXTURES: [&str; 2] = ["qwen35_08b_like", "qwen35_grouped_values"];

/// Largest difference allowed from a reference's logits (which are O(1) here): four layers
/// in F32, summed in other orders (transformers' chunked DeltaNet algorithm against our
/// token-by-token recurrence; ggml's kernels).
const MAX_DIFFERENCE: f32 = 5e-4;

/// A greedy pick is compared only where the reference's top two differ by more than this.
const DECISIVE_MARGIN: f32 = 0.02;

fn check_cases(model: &dyn CausalLm, cases: &[Case], what: &str) -> f32 {
    qwen35::check_cases(model, cases, what, MAX_DIFFERENCE, DECISIVE_MARGIN)
}

#[test]
fn hf_directory_matches_transformers() {
    for name in FIXTURES {
        let fixture = load_fixture(name);
        let dir = scratch_dir(&format!("qwen35_hf_{name}"));
        qwen35::write_hf_directory(&fixture, &dir, |_, _| {});
        let model = load(ModelSource::HfDirectory(dir));
        assert_eq!(model.config().architecture, "qwen35");
        let worst = check_cases(model.as_ref(), &fixture.transformers, name);
        eprintln!("{name}: largest difference from transformers {worst:e}");
    }
}

#[test]
fn gguf_matches_llama_cpp() {
    for name in FIXTURES {
        let fixture = load_fixture(name);
        let path = scratch_dir("qwen35_gguf").join(format!("{name}.gguf"));
        write_gguf(&fixture, &path);
        let model = load(ModelSource::Gguf(path));
        assert!(!fixture.llama_cpp.is_empty(), "{name}: no llama.cpp runs");
        let worst = check_cases(model.as_ref(), &fixture.llama_cpp, name);
        eprintln!("{name}: largest difference from llama.cpp {worst:e}");
    }
}

#[test]
fn gguf_and_hf_directory_give_the_same_logits() {
    for name in FIXTURES {
        let fixture = load_fixture(name);
        let dir = scratch_dir(&format!("qwen35_both_{name}"));
        let path = dir.join("model.gguf");
        write_gguf(&fixture, &path);
        let hf = qwen35::write_hf_directory(&fixture, &dir.join("hf"), |_, _| {});
        let gguf = load(ModelSource::Gguf(path));
        let hf = load(ModelSource::HfDirectory(hf));
        assert_eq!(
            gguf.config().linear_attention.map(|l| l.conv_dim()),
            hf.config().linear_attention.map(|l| l.conv_dim())
        );
        assert_eq!(gguf.kv_layout(), hf.kv_layout());
        assert_eq!(gguf.state_layout(), hf.state_layout());
        let case = &fixture.transformers[2];
        let a = teacher_forced(gguf.as_ref(), &case.prompt_ids, &case.greedy_ids);
        let b = teacher_forced(hf.as_ref(), &case.prompt_ids, &case.greedy_ids);
        let worst = a
            .iter()
            .flatten()
            .zip(b.iter().flatten())
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        // The same weights (up to `-exp(A_log)` and `1 + w` rounded once) and the same code.
        assert!(worst < 1e-4, "{name}: GGUF and HF logits differ by {worst}");
    }
}

/// One DeltaNet decay of one head in one layer moved: the comparison must fail, so it can.
#[test]
fn a_perturbed_decay_breaks_parity() {
    let name = "qwen35_grouped_values";
    let fixture = load_fixture(name);
    let dir = scratch_dir("qwen35_negative");
    qwen35::write_hf_directory(&fixture, &dir, |tensor, values| {
        if tensor == "model.layers.1.linear_attn.A_log" {
            values[1] += 1.0;
        }
    });
    let model = load(ModelSource::HfDirectory(dir));
    let worst = widest_difference(model.as_ref(), &fixture.transformers);
    assert!(
        worst > 10.0 * MAX_DIFFERENCE,
        "a perturbed A_log still matches transformers within {worst}"
    );
}

/// A `Qwen3_5ForConditionalGeneration` checkpoint (the text config under `text_config`, the
/// head tied at the top level, the text tensors under `model.language_model.`) loads as its
/// text model.
#[test]
fn a_conditional_generation_checkpoint_loads_its_text_model() {
    let fixture = load_fixture("qwen35_08b_like");
    let mut text = fixture.config.clone();
    text["model_type"] = "qwen3_5_text".into();
    let tie = text["tie_word_embeddings"].take();
    let config = serde_json::json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": tie,
        "text_config": text,
        "vision_config": {"depth": 1},
    });
    let dir = scratch_dir("qwen35_conditional_generation");
    let rename = |name: &str| match name.strip_prefix("model.") {
        Some(rest) => format!("model.language_model.{rest}"),
        None => name.to_string(),
    };
    qwen35::write_hf_checkpoint(&fixture, &config, &dir, rename, |_, _| {});
    let model = load(ModelSource::HfDirectory(dir));
    assert!(model.config().tie_word_embeddings);
    let worst = check_cases(
        model.as_ref(),
        &fixture.transformers,
        "conditional generation",
    );
    eprintln!("conditional generation: largest difference from transformers {worst:e}");
}
