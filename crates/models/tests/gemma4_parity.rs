//! Gemma 4 (text) parity on random-weight checkpoints of real shapes (`fixtures/gemma4_*.json`,
//! `scripts/reference/make_gemma4_fixtures.py`): an E2B-like model (per-layer embeddings,
//! KV-shared last layers with double-wide MLPs, 512-wide global heads with proportional RoPE)
//! a 31B-like one (global layers with V from K's projection and their own KV heads) and a
//! 26B-A4B-like one (the 31B's attention, and routed experts beside every layer's MLP).
//! tokenmill on the HF directory against transformers (F32), on the GGUF against llama.cpp on
//! the GGUF its converter made, the two loads against each other, chunked against whole, and
//! negative controls. The checkpoints are rebuilt from their formula weights: nothing is
//! downloaded and nothing skipped.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;
#[path = "support/gemma4.rs"]
mod gemma4;
#[path = "support/qwen35.rs"]
mod qwen35;

use qwen35::{
    check_cases, load, load_fixture, prompt_in_chunks, scratch_dir, teacher_forced,
    widest_difference, BLOCK_SIZE,
};
use tokenmill_models::{CausalLm, KvCacheDType, KvCacheGrouping, ModelSource, MoeConfig};

const FIXTURES: [&str; 3] = ["gemma4_e2b_like", "gemma4_31b_like", "gemma4_26b_a4b_like"];

/// Largest difference allowed from a reference's logits (soft-capped at 30, O(10) here): six
/// layers in F32 summed in other orders.
const MAX_DIFFERENCE: f32 = 2e-3;

/// Against llama.cpp: ggml's CPU GELU reads a table of f16 values (`GGML_GELU_FP16`), so
/// llama.cpp and transformers themselves differ by up to 0.019 on these fixtures' top logits.
const MAX_DIFFERENCE_LLAMA: f32 = 0.03;

/// A greedy pick is compared only where the reference's top two differ by more than this.
const DECISIVE_MARGIN: f32 = 0.02;

/// The fixture's HF directory (in a directory of `test`'s own: tests run in parallel),
/// loaded, with `edit` applied to its tensors first.
fn hf_model(test: &str, name: &str, edit: impl Fn(&str, &mut Vec<f32>)) -> Box<dyn CausalLm> {
    let fixture = load_fixture(name);
    let dir = scratch_dir(&format!("gemma4_{test}_{name}"));
    qwen35::write_hf_directory(&fixture, &dir, edit);
    load(ModelSource::HfDirectory(dir))
}

fn gguf_model(test: &str, name: &str) -> Box<dyn CausalLm> {
    let fixture = load_fixture(name);
    let path = scratch_dir(&format!("gemma4_{test}")).join(format!("{name}.gguf"));
    gemma4::write_gguf(&fixture, &path);
    load(ModelSource::Gguf(path))
}

#[test]
fn hf_directory_matches_transformers() {
    for name in FIXTURES {
        let fixture = load_fixture(name);
        let model = hf_model("transformers", name, |_, _| {});
        assert_eq!(model.config().architecture, "gemma4");
        let worst = check_cases(
            model.as_ref(),
            &fixture.transformers,
            name,
            MAX_DIFFERENCE,
            DECISIVE_MARGIN,
        );
        eprintln!("{name}: largest difference from transformers {worst:e}");
    }
}

#[test]
fn gguf_matches_llama_cpp() {
    for name in FIXTURES {
        let fixture = load_fixture(name);
        assert!(!fixture.llama_cpp.is_empty(), "{name}: no llama.cpp runs");
        let model = gguf_model("llama", name);
        let worst = check_cases(
            model.as_ref(),
            &fixture.llama_cpp,
            name,
            MAX_DIFFERENCE_LLAMA,
            DECISIVE_MARGIN,
        );
        eprintln!("{name}: largest difference from llama.cpp {worst:e}");
    }
}

#[test]
fn gguf_and_hf_directory_give_the_same_model() {
    for name in FIXTURES {
        let fixture = load_fixture(name);
        let (gguf, hf) = (gguf_model("both", name), hf_model("both", name, |_, _| {}));
        let (a, b) = (gguf.config(), hf.config());
        assert_eq!(
            (a.full_attention, a.kv_shared_layers, a.per_layer_input_size),
            (b.full_attention, b.kv_shared_layers, b.per_layer_input_size),
            "{name}"
        );
        assert_eq!(
            (&a.layer_intermediate_sizes, a.moe),
            (&b.layer_intermediate_sizes, b.moe),
            "{name}"
        );
        assert_eq!(gguf.kv_layout(), hf.kv_layout(), "{name}");
        let case = &fixture.transformers[2];
        let x = teacher_forced(gguf.as_ref(), &case.prompt_ids, &case.greedy_ids);
        let y = teacher_forced(hf.as_ref(), &case.prompt_ids, &case.greedy_ids);
        let worst = x
            .iter()
            .flatten()
            .zip(y.iter().flatten())
            .map(|(p, q)| (p - q).abs())
            .fold(0.0f32, f32::max);
        // The same weights and code; only the unrotated pairs' divisor differs (1e30 in the
        // GGUF's `rope_freqs.weight`, infinite from the HF config).
        assert!(worst < 1e-4, "{name}: GGUF and HF logits differ by {worst}");
    }
}

/// The E2B-like cache: the two KV-shared layers keep nothing, the global layer's K/V are
/// 512 wide with its one KV head, the sliding layers' 256; the 31B-like global layers keep
/// 2 heads of 512 against the sliding layers' 4 of 256.
#[test]
fn the_cache_holds_only_the_layers_that_compute_kv() {
    let e2b = hf_model("layout", "gemma4_e2b_like", |_, _| {});
    let layout = e2b.kv_layout();
    assert_eq!(layout.len(), 4);
    let dims: Vec<(usize, usize, Option<usize>)> = layout
        .iter()
        .map(|l| (l.num_kv_heads, l.head_dim, l.sliding_window))
        .collect();
    assert_eq!(
        dims,
        [
            (1, 256, Some(16)),
            (1, 256, Some(16)),
            (1, 256, Some(16)),
            (1, 512, None)
        ]
    );
    let config = e2b.config();
    assert_eq!(config.kv_source_layer(4), 2);
    assert_eq!(config.kv_source_layer(5), 3);
    let k_eq_v = hf_model("layout", "gemma4_31b_like", |_, _| {});
    let dims: Vec<(usize, usize)> = k_eq_v
        .kv_layout()
        .iter()
        .map(|l| (l.num_kv_heads, l.head_dim))
        .collect();
    assert_eq!(dims, [(4, 256), (2, 512), (4, 256), (2, 512)]);
    // Hybrid groups: the sliding and full layers share buffers as wide as the widest.
    let grouping = KvCacheGrouping::hybrid(layout).unwrap();
    assert_eq!(
        grouping.bytes_per_block(BLOCK_SIZE, KvCacheDType::F32),
        2 * BLOCK_SIZE * 512 * 4
    );
}

/// The 26B-A4B-like layers route each token to 2 of 8 experts of 128 beside their 256-wide
/// MLP, in the HF directory and the GGUF alike.
#[test]
fn the_moe_fixture_has_experts_beside_its_mlp() {
    let expected = MoeConfig {
        num_experts: 8,
        experts_used: 2,
        expert_intermediate_size: 128,
    };
    for model in [
        hf_model("moe_config", "gemma4_26b_a4b_like", |_, _| {}),
        gguf_model("moe_config", "gemma4_26b_a4b_like"),
    ] {
        let config = model.config();
        assert_eq!(config.moe, Some(expected));
        assert_eq!(config.intermediate_size, 256);
        assert!(model.decode_weight_bytes() < model.weight_bytes());
    }
}

/// A prompt prefilled in one step, in three chunks, and decoded token by token beside
/// another sequence gives bitwise the same logits: KV-shared layers read what the earlier
/// chunks wrote, and a token's experts do not depend on what shares its step.
#[test]
fn chunked_and_batched_runs_equal_the_whole_prompt() {
    for name in ["gemma4_e2b_like", "gemma4_26b_a4b_like"] {
        chunked_and_batched_runs_equal_the_whole_prompt_of(name);
    }
}

fn chunked_and_batched_runs_equal_the_whole_prompt_of(name: &str) {
    let model = hf_model("chunked", name, |_, _| {});
    let model = model.as_ref();
    let prompt: Vec<u32> = (0..37).map(|i| (i * 29 + 3) % 512).collect();
    let other: Vec<u32> = (0..21).map(|i| (i * 13 + 7) % 512).collect();
    let run = |chunks: &[usize], with_other: bool| {
        prompt_in_chunks(model, &prompt, with_other.then_some(&other[..]), chunks)
    };
    let whole = run(&[37], false);
    let chunked = run(&[10, 20, 7], false);
    let batched = run(&[10, 20, 7], true);
    assert_eq!(whole.last(), chunked.last(), "{name}");
    assert_eq!(chunked, batched, "{name}");
}

/// The KV-shared layers run only on the rows the logits depend on: asking for the last two
/// rows' logits (the earlier rows are dropped after the last cache-writing layer) gives
/// bitwise the rows of a run that asks for every row's (nothing dropped).
#[test]
fn kv_shared_layers_on_the_logits_rows_only_change_no_value() {
    let model = hf_model("pruned", "gemma4_e2b_like", |_, _| {});
    let tokens: Vec<u32> = (0..29).map(|i| (i * 31 + 5) % 512).collect();
    let every_row = teacher_forced(model.as_ref(), &tokens[..1], &tokens[1..]);
    let last_two = teacher_forced(model.as_ref(), &tokens[..27], &tokens[27..]);
    assert_eq!(every_row.len(), 28);
    assert_eq!(last_two.len(), 2);
    assert!(every_row[26..] == last_two[..], "pruned rows differ");
}

/// Negative controls: a moved weight in a KV-shared layer's query norm, or in one layer's
/// per-layer embedding gate, must break parity, so the comparison can fail.
#[test]
fn perturbed_shared_layer_and_per_layer_gate_break_parity() {
    let fixture = load_fixture("gemma4_e2b_like");
    for tensor in [
        "model.layers.5.self_attn.q_norm.weight",
        "model.layers.1.per_layer_input_gate.weight",
    ] {
        let model = hf_model("negative", "gemma4_e2b_like", |name, values| {
            if name == tensor {
                values.iter_mut().take(64).for_each(|v| *v = -*v * 3.0);
            }
        });
        let worst = widest_difference(model.as_ref(), &fixture.transformers);
        assert!(
            worst > 10.0 * MAX_DIFFERENCE,
            "{tensor} perturbed still matches transformers within {worst}"
        );
    }
}

/// A change to one tensor's values.
type Edit = fn(&mut Vec<f32>);

/// Negative controls of the mixture of experts: the per-expert scales given to the wrong
/// experts (reversed), or part of the router's input scale moved, must break parity.
#[test]
fn moved_router_scales_break_parity() {
    let name = "gemma4_26b_a4b_like";
    let fixture = load_fixture(name);
    let edits: [(&str, Edit); 2] = [
        ("model.layers.1.router.per_expert_scale", |values| {
            values.reverse()
        }),
        ("model.layers.2.router.scale", |values| {
            values.iter_mut().take(64).for_each(|v| *v = -*v * 3.0)
        }),
    ];
    for (tensor, edit) in edits {
        let model = hf_model("moe_negative", name, |hf_name, values| {
            if hf_name == tensor {
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

/// LoRA adapters are refused by name on Gemma 4 (its global and KV-shared layers do not have
/// the one Q/K/V geometry the adapter hooks assume), before any file is read.
#[test]
fn lora_adapters_are_refused_by_name() {
    let model = hf_model("lora", "gemma4_e2b_like", |_, _| {});
    let error = tokenmill_models::LoraAdapter::load(
        std::path::Path::new("/nonexistent/adapter"),
        model.config(),
        16,
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("not supported on Gemma 4"),
        "{error}"
    );
}

/// A `Gemma4ForConditionalGeneration` checkpoint (the text config under `text_config`, the
/// text tensors under `model.language_model.`, vision and audio towers beside them) loads as
/// its text model.
#[test]
fn a_conditional_generation_checkpoint_loads_its_text_model() {
    let fixture = load_fixture("gemma4_e2b_like");
    let config = serde_json::json!({
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": fixture.config,
        "vision_config": {"model_type": "gemma4_vision"},
        "audio_config": {"model_type": "gemma4_audio"},
    });
    let dir = scratch_dir("gemma4_conditional_generation");
    let rename = |name: &str| match name.strip_prefix("model.") {
        Some(rest) => format!("model.language_model.{rest}"),
        None => name.to_string(),
    };
    qwen35::write_hf_checkpoint(&fixture, &config, &dir, rename, |_, _| {});
    let model = load(ModelSource::HfDirectory(dir));
    assert_eq!(model.config().architecture, "gemma4");
    let worst = check_cases(
        model.as_ref(),
        &fixture.transformers,
        "conditional generation",
        MAX_DIFFERENCE,
        DECISIVE_MARGIN,
    );
    eprintln!("conditional generation: largest difference from transformers {worst:e}");
}
