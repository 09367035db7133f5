//! LoRA serving through the real engine on the default model: a request's greedy output
//! with an adapter is the same alone and batched with other adapters and base requests;
//! adapters change the output; `--max-loras` makes requests wait, never fail; the same
//! adapter reuses its prefix-cache blocks and another adapter does not; unloading an adapter
//! lets its in-flight request finish; evicted adapters are read again on use.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::path::Path;

use common::{config, greedy, run_all, wait_idle};
use tokenmill_engine::{
    Engine, EngineConfig, EngineError, GenerateRequest, LoraConfig, LoraModule, LoraRegistry,
};
use tokenmill_models::{write_random_peft_adapter, LoraTarget, ModelConfig, RandomLoraSpec};

const PROMPT: [u32; 9] = [504, 3575, 282, 4649, 314, 2259, 30, 1218, 7];

/// Three adapters of different ranks and targets, written under `dir`.
fn write_adapters(dir: &Path, model: &ModelConfig) -> Vec<LoraModule> {
    let specs = [
        (8, vec![LoraTarget::Q, LoraTarget::V], 1),
        (16, LoraTarget::ALL.to_vec(), 2),
        (
            4,
            vec![LoraTarget::Gate, LoraTarget::Down, LoraTarget::O],
            3,
        ),
    ];
    specs
        .into_iter()
        .map(|(rank, targets, seed)| {
            let name = format!("adapter{seed}");
            let path = dir.join(&name);
            let spec = RandomLoraSpec {
                rank,
                alpha: 2.0 * rank as f32,
                targets,
                seed,
                a_scale: 0.25,
                b_scale: 0.25,
            };
            write_random_peft_adapter(&path, model, &spec).unwrap();
            LoraModule {
                name,
                path,
                base_model_name: None,
            }
        })
        .collect()
}

fn lora_config(dir: &Path, max_loras: usize) -> EngineConfig {
    let mut config = config(256, 512);
    let model = tokenmill_models::read_model_config(&config.model).unwrap();
    config.lora = Some(LoraConfig {
        max_loras,
        max_lora_rank: 16,
        max_cpu_loras: Some(4),
        modules: write_adapters(dir, &model),
        allowed_roots: Vec::new(),
    });
    config
}

fn with_adapter(registry: &LoraRegistry, name: Option<&str>, prompt: &[u32]) -> GenerateRequest {
    let mut request = greedy(prompt.to_vec(), 12);
    request.lora = name.map(|name| registry.get(name).unwrap().expect("registered"));
    request
}

#[test]
fn adapted_output_does_not_depend_on_the_batch_and_max_loras_only_delays() {
    let dir = tempfile::tempdir().unwrap();
    for max_loras in [3, 1] {
        let engine = Engine::start(&lora_config(dir.path(), max_loras)).unwrap();
        let client = engine.client();
        let registry = client.lora().unwrap().clone();
        let names = [None, Some("adapter1"), Some("adapter2"), Some("adapter3")];
        let alone: Vec<Vec<u32>> = names
            .iter()
            .map(|name| {
                run_all(&client, vec![with_adapter(&registry, *name, &PROMPT)])[0]
                    .token_ids
                    .clone()
            })
            .collect();
        for (index, ids) in alone.iter().enumerate().skip(1) {
            assert_ne!(ids, &alone[0], "adapter {index} left the output unchanged");
        }
        // Other prompts so nothing comes from the prefix cache; then every adapter at once.
        let mixed_prompt: Vec<u32> = PROMPT.iter().map(|t| t + 1).collect();
        let expected: Vec<Vec<u32>> = names
            .iter()
            .map(|name| {
                run_all(&client, vec![with_adapter(&registry, *name, &mixed_prompt)])[0]
                    .token_ids
                    .clone()
            })
            .collect();
        let together = run_all(
            &client,
            names
                .iter()
                .map(|name| with_adapter(&registry, *name, &mixed_prompt))
                .collect(),
        );
        for (index, (out, ids)) in together.iter().zip(&expected).enumerate() {
            assert_eq!(
                &out.token_ids, ids,
                "request {index} changed in the batch (max_loras {max_loras})"
            );
        }
        wait_idle(&client);
        engine.shutdown();
    }
}

#[test]
fn prefix_cache_blocks_are_shared_within_an_adapter_only() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(&lora_config(dir.path(), 2)).unwrap();
    let client = engine.client();
    let registry = client.lora().unwrap().clone();
    let prompt: Vec<u32> = (0..40).map(|i| 1000 + i).collect();
    let cached = |name: Option<&str>| {
        run_all(&client, vec![with_adapter(&registry, name, &prompt)])[0].num_cached_tokens
    };
    assert_eq!(cached(Some("adapter1")), 0);
    assert_eq!(
        cached(Some("adapter2")),
        0,
        "adapter 2 reused adapter 1's blocks"
    );
    assert_eq!(cached(None), 0, "the base model reused an adapter's blocks");
    assert_eq!(
        cached(Some("adapter1")),
        32,
        "adapter 1 missed its own blocks"
    );
    engine.shutdown();
}

#[test]
fn registry_loads_unloads_and_evicts_without_disturbing_requests() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = lora_config(dir.path(), 2);
    if let Some(lora) = config.lora.as_mut() {
        lora.max_cpu_loras = Some(2);
    }
    let engine = Engine::start(&config).unwrap();
    let client = engine.client();
    let registry = client.lora().unwrap().clone();
    // Three registered, two kept in memory.
    assert_eq!(registry.list().len(), 3);
    assert_eq!(registry.num_loaded(), 2);
    let first = run_all(
        &client,
        vec![with_adapter(&registry, Some("adapter1"), &PROMPT)],
    );
    assert_eq!(
        registry.num_loaded(),
        2,
        "reading an evicted adapter evicts another"
    );

    // A request in flight keeps its adapter through an unload.
    let request = with_adapter(&registry, Some("adapter1"), &PROMPT);
    registry.unload("adapter1").unwrap();
    let after = run_all(&client, vec![request]);
    assert_eq!(after[0].token_ids, first[0].token_ids);
    assert!(registry.get("adapter1").unwrap().is_none());
    assert!(matches!(
        registry.unload("adapter1"),
        Err(EngineError::LoraNotFound(_))
    ));

    // Loading under a taken name or from a bad path leaves the registry as it was.
    let path = dir.path().join("adapter2");
    assert!(matches!(
        registry.load("adapter2", path.clone(), None),
        Err(EngineError::LoraAlreadyLoaded(_))
    ));
    assert!(matches!(
        registry.load("again", dir.path().join("missing"), None),
        Err(EngineError::Lora(_))
    ));
    registry.load("again", path, None).unwrap();
    let names: Vec<String> = registry.list().into_iter().map(|l| l.name).collect();
    assert_eq!(names, vec!["adapter2", "adapter3", "again"]);
    // A new registration gets a new id: its blocks are not adapter 2's.
    let ids: Vec<u32> = ["adapter2", "again"]
        .iter()
        .map(|name| registry.get(name).unwrap().unwrap().id)
        .collect();
    assert_ne!(ids[0], ids[1]);
    wait_idle(&client);
    engine.shutdown();
}

#[test]
fn a_start_up_adapter_that_does_not_load_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = lora_config(dir.path(), 1);
    if let Some(lora) = config.lora.as_mut() {
        lora.max_lora_rank = 8;
    }
    let error = Engine::start(&config).unwrap_err().to_string();
    assert!(
        error.contains("--lora-modules adapter2") && error.contains("rank 16"),
        "{error}"
    );
    if let Some(lora) = config.lora.as_mut() {
        lora.max_lora_rank = 16;
        lora.max_cpu_loras = Some(0);
    }
    let error = Engine::start(&config).unwrap_err().to_string();
    assert!(error.contains("--max-cpu-loras"), "{error}");
}

#[test]
fn runtime_loads_read_under_an_allowed_root_and_an_unusable_root_is_refused_at_start() {
    let allowed = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let model = tokenmill_models::read_model_config(&config(256, 512).model).unwrap();
    let inside = write_adapters(allowed.path(), &model);
    let outside = write_adapters(elsewhere.path(), &model);
    let mut lora = LoraConfig::new();
    lora.allowed_roots = vec![allowed.path().to_path_buf()];
    let registry = LoraRegistry::new(model.clone(), lora.clone()).unwrap();

    registry.load_at_runtime("inside", &inside[0].path).unwrap();
    assert!(registry.get("inside").unwrap().is_some());
    match registry.load_at_runtime("outside", &outside[0].path) {
        Err(EngineError::InvalidRequest(message)) => {
            assert!(message.contains("not a readable LoRA adapter"), "{message}");
        }
        other => panic!("an adapter outside the roots loaded: {other:?}"),
    }
    assert!(registry.get("outside").unwrap().is_none());
    // `..` out of the root is resolved before the check.
    let climbing = allowed
        .path()
        .join("..")
        .join(elsewhere.path().file_name().unwrap())
        .join("adapter1");
    assert!(registry.load_at_runtime("climb", &climbing).is_err());

    lora.allowed_roots = vec![allowed.path().join("no-such-dir")];
    match LoraRegistry::new(model, lora) {
        Err(EngineError::Config(message)) => {
            assert!(message.contains("--allowed-lora-root"), "{message}");
        }
        other => panic!("an unusable root was accepted: {other:?}"),
    }
}
