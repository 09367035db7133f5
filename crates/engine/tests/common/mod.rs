//! Shared helpers for the engine's real-model tests.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokenmill_engine::{
    Engine, EngineClient, EngineConfig, GenerateRequest, KvCacheSizing, RequestEvent,
    SamplingParams, StopOptions,
};
use tokenmill_models::ModelSource;

pub use tokenmill_test_assets::default_model as model_path;

/// `CARGO_TARGET_TMPDIR/name`, written by `build` unless a complete file is already there: the
/// writer goes to a per-process name first and is renamed into place, so test processes
/// running at once never see a partial file, and later runs reuse it.
pub fn derived_gguf(name: &str, build: impl FnOnce() -> tokenmill_gguf::GgufWriter) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(name);
    if path.exists() {
        return path;
    }
    let partial = dir.join(format!("{name}.{}", std::process::id()));
    build().write_to(&partial).unwrap();
    std::fs::rename(&partial, &path).unwrap();
    path
}

/// The default model with a sliding window of `SLIDING_WINDOW` positions on every layer
/// (`llama.attention.sliding_window`, as a Mistral-style file declares it): its GGUF with that
/// one key added ([`derived_gguf`]).
pub fn sliding_window_model_path() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        derived_gguf(
            &format!("default-model-window-{SLIDING_WINDOW}.gguf"),
            || {
                let file = tokenmill_gguf::GgufFile::open(&model_path()).unwrap();
                let mut writer = tokenmill_gguf::GgufWriter::new();
                for (key, value) in file.metadata() {
                    writer.add_metadata(key, value.clone());
                }
                writer.add_metadata(
                    "llama.attention.sliding_window",
                    tokenmill_gguf::MetadataValue::U32(SLIDING_WINDOW as u32),
                );
                for info in file.tensors() {
                    let data = file.tensor_data(info).unwrap().to_vec();
                    writer.add_tensor(&info.name, &info.dims, info.ggml_type, data);
                }
                writer
            },
        )
    })
    .clone()
}

/// The window of [`sliding_window_model_path`]: shorter than most test prompts.
pub const SLIDING_WINDOW: usize = 24;

/// An engine config over the default model with `num_blocks` KV blocks of 16 tokens.
pub fn config(num_blocks: usize, max_model_len: usize) -> EngineConfig {
    config_for(model_path(), num_blocks, max_model_len)
}

/// [`config`] over the model at `model`.
pub fn config_for(model: PathBuf, num_blocks: usize, max_model_len: usize) -> EngineConfig {
    let mut config = EngineConfig::new(ModelSource::from_path(model));
    let probe = Engine::bytes_per_block_for(&config).expect("model config loads");
    config.kv_cache = KvCacheSizing::Bytes((probe * num_blocks) as u64);
    config.max_model_len = Some(max_model_len);
    config
}

/// A greedy request for `prompt` generating exactly `max_tokens` tokens.
pub fn greedy(prompt: Vec<u32>, max_tokens: u32) -> GenerateRequest {
    let mut request = GenerateRequest::new(prompt);
    request.sampling = SamplingParams::greedy();
    request.stop = StopOptions {
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..StopOptions::default()
    };
    request
}

/// Collected output of one request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Collected {
    pub token_ids: Vec<u32>,
    pub text: String,
    pub num_cached_tokens: usize,
    pub finish_reason: Option<tokenmill_engine::FinishReason>,
}

/// Submits all requests at once and waits for every result (input order).
pub fn run_all(client: &EngineClient, requests: Vec<GenerateRequest>) -> Vec<Collected> {
    let mut streams: Vec<_> = requests
        .into_iter()
        .map(|r| client.add_request(r).expect("engine accepts"))
        .collect();
    streams
        .iter_mut()
        .map(|stream| {
            let mut out = Collected::default();
            while let Some(event) = stream.blocking_recv() {
                match event {
                    RequestEvent::Output(o) => {
                        out.token_ids.extend(o.new_token_ids);
                        out.text.push_str(&o.new_text);
                        out.num_cached_tokens = out.num_cached_tokens.max(o.num_cached_tokens);
                        if o.finish_reason.is_some() {
                            out.finish_reason = o.finish_reason;
                        }
                    }
                    RequestEvent::Rejected(e) | RequestEvent::Error(e) => {
                        panic!("request failed: {e}")
                    }
                    RequestEvent::Failed(failure) => panic!("request failed: {failure:?}"),
                }
            }
            out
        })
        .collect()
}

/// The greedy token ids of `prompts` (`max_tokens` each) from a fresh engine for `config`,
/// submitted one after another (`one_by_one`) or all together; the engine is shut down after.
pub fn greedy_token_ids(
    config: &EngineConfig,
    prompts: &[Vec<u32>],
    max_tokens: u32,
    one_by_one: bool,
) -> Vec<Vec<u32>> {
    greedy_run(config, prompts, max_tokens, one_by_one).0
}

/// [`greedy_token_ids`], with the engine's metrics ([`samples`]) scraped once it is idle.
pub fn greedy_run(
    config: &EngineConfig,
    prompts: &[Vec<u32>],
    max_tokens: u32,
    one_by_one: bool,
) -> (Vec<Vec<u32>>, BTreeMap<String, f64>) {
    let engine = Engine::start(config).unwrap();
    let client = engine.client();
    let requests = || prompts.iter().map(|p| greedy(p.clone(), max_tokens));
    let out: Vec<Vec<u32>> = if one_by_one {
        requests()
            .map(|r| run_all(&client, vec![r])[0].token_ids.clone())
            .collect()
    } else {
        run_all(&client, requests().collect())
            .into_iter()
            .map(|c| c.token_ids)
            .collect()
    };
    wait_idle(&client);
    let scrape = samples(&engine.metrics().encode().unwrap());
    engine.shutdown();
    (out, scrape)
}

/// Waits until the engine reports no running or waiting requests.
pub fn wait_idle(client: &EngineClient) -> tokenmill_engine::EngineStats {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = client.stats();
        if stats.num_running == 0 && stats.num_waiting == 0 {
            return stats;
        }
        assert!(
            Instant::now() < deadline,
            "engine did not go idle: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deterministic varied prompts: token ids drawn from ordinary text tokens.
pub fn prompts(count: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    (0..count)
        .map(|_| {
            let len = 4 + (next() % 60) as usize;
            // Ids 300..20000 are ordinary subword tokens in the SmolLM2 vocabulary.
            (0..len).map(|_| 300 + next() % 19_700).collect()
        })
        .collect()
}

/// `name{labels}` → value, from the Prometheus text exposition.
pub fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The sample `name` of the engine served as `tm-test`, with `extra_label` when given.
pub fn value(
    samples: &BTreeMap<String, f64>,
    name: &str,
    extra_label: Option<(&str, &str)>,
) -> f64 {
    samples
        .iter()
        .find(|(key, _)| {
            let Some((metric, labels)) = key.split_once('{') else {
                return key.as_str() == name;
            };
            metric == name
                && labels.contains("model_name=\"tm-test\"")
                && labels.contains("engine=\"0\"")
                && extra_label.is_none_or(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no sample {name} {extra_label:?}"))
}
