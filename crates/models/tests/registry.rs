//! The model registry: every registered family loads a tiny model of its own through
//! `load_model`, from a GGUF file and from an HF directory of the same weights, recognises
//! it as its own (architecture, family name, the cache layout it declares before loading),
//! and both containers give the same logits.
//!
//! A family added to the registry without a tiny model here fails
//! `every_registered_family_round_trips_a_tiny_model`: give it one in `tiny_model_of`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "support/gemma4.rs"]
mod gemma4;
#[path = "support/gpt_oss.rs"]
mod gpt_oss;
#[path = "support/qwen35.rs"]
mod qwen35;

use std::path::{Path, PathBuf};

use common::family::{write_gguf, write_hf_directory, Fixture};
use common::tiny::{TinyConfig, TinyModel};
use tokenmill_models::{
    kv_layout, load_model, read_model_config, registered_architectures, state_layout, Architecture,
    CausalLm, KvCacheDType, LoadOptions, ModelSource, Workspace,
};

/// GGUF and HF logits of the same f32 weights differ by summation order at most (Llama's
/// GGUF rows are llama.cpp's permutation of HF's).
const TOLERANCE: f32 = 1e-4;

/// A tiny model of the family `architecture` names, written to `dir` as a GGUF file and an
/// HF directory; `None` for a family without one.
fn tiny_model_of(architecture: &str, dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let (gguf, hf) = (dir.join("model.gguf"), dir.join("hf"));
    let tiny = |config: TinyConfig| {
        let model = TinyModel::random(config, 7);
        model.write_gguf(&gguf);
        model.write_hf_directory(&hf, "F32", 1);
    };
    let fixture = |name: &str| {
        let fixture: Fixture = common::load_fixture(name);
        write_gguf(&fixture, &gguf);
        std::fs::create_dir_all(&hf).unwrap();
        write_hf_directory(&fixture, &hf);
    };
    match architecture {
        "llama" => tiny(TinyConfig::llama()),
        "mistral" => tiny(TinyConfig::mistral()),
        "qwen2" => tiny(TinyConfig::qwen2()),
        "qwen3" => fixture("family_qwen3.json"),
        "qwen3moe" => fixture("family_qwen3moe.json"),
        "gemma3" => fixture("family_gemma3.json"),
        "phi3" => fixture("family_phi3.json"),
        "gemma4" => {
            let fixture = qwen35::load_fixture("gemma4_e2b_like");
            gemma4::write_gguf(&fixture, &gguf);
            qwen35::write_hf_directory(&fixture, &hf, |_, _| {});
        }
        "qwen35" => {
            let fixture = qwen35::load_fixture("qwen35_grouped_values");
            qwen35::write_gguf(&fixture, &gguf);
            qwen35::write_hf_directory(&fixture, &hf, |_, _| {});
        }
        "gpt-oss" => {
            let fixture = qwen35::load_fixture("gptoss_20b_like");
            let experts = gpt_oss::Experts::Mxfp4;
            gpt_oss::write_gguf("gptoss_20b_like", &fixture, &gguf, experts, |_, _| {});
            let form = gpt_oss::HfExperts::Mxfp4;
            gpt_oss::write_hf_directory("gptoss_20b_like", &fixture, &hf, form);
        }
        _ => return None,
    }
    Some((gguf, hf))
}

fn logits(model: &dyn CausalLm) -> Vec<f32> {
    let vocab = model.config().vocab_size as u32;
    let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % vocab).collect();
    let forced: Vec<u32> = (0..4).map(|i| (i * 11 + 2) % vocab).collect();
    let mut logits = Vec::new();
    common::teacher_forced_logits(
        model,
        &prompt,
        &forced,
        KvCacheDType::F32,
        &mut Workspace::new(),
        &mut logits,
    );
    logits
}

fn check_family(architecture: Architecture) {
    let name = architecture.name();
    let dir = tempfile::tempdir().unwrap();
    let (gguf, hf) = tiny_model_of(name, dir.path())
        .unwrap_or_else(|| panic!("family `{name}` has no tiny model in tests/registry.rs"));
    let mut all_logits = Vec::new();
    let mut family_names = Vec::new();
    for source in [ModelSource::Gguf(gguf), ModelSource::HfDirectory(hf)] {
        let config = read_model_config(&source).unwrap();
        assert_eq!(config.architecture, architecture, "{source:?}");
        let model = load_model(&source, &LoadOptions::default()).unwrap();
        assert_eq!(model.config(), &config, "{source:?}");
        assert_eq!(kv_layout(&config).unwrap(), model.kv_layout(), "{source:?}");
        assert_eq!(
            state_layout(&config).unwrap(),
            model.state_layout(),
            "{source:?}"
        );
        let logits = logits(model.as_ref());
        assert!(logits.iter().all(|x| x.is_finite()), "{source:?}");
        family_names.push(config.family());
        all_logits.push(logits);
    }
    assert_eq!(family_names[0], family_names[1], "{name}");
    let widest = all_logits[0]
        .iter()
        .zip(&all_logits[1])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        widest <= TOLERANCE,
        "{name}: GGUF and HF logits differ by {widest}"
    );
}

#[test]
fn every_registered_family_round_trips_a_tiny_model() {
    let architectures: Vec<Architecture> = registered_architectures().collect();
    assert!(architectures.len() >= 7, "{architectures:?}");
    for architecture in architectures {
        check_family(architecture);
    }
}

#[test]
fn unknown_architectures_are_refused_with_the_known_ones() {
    let error = Architecture::from_name("falcon").unwrap_err().to_string();
    for architecture in registered_architectures() {
        assert!(error.contains(architecture.name()), "{error}");
    }
}
