//! Random PEFT adapters from a seed, for tests, benchmarks and the reference script
//! (`scripts/reference/make_lora_fixtures.py` draws the same values from the same seed, so
//! no adapter file needs committing).

use std::path::Path;

use super::LoraTarget;
use crate::config::ModelConfig;
use crate::error::{io_error, Result};

/// What to draw: rank, `lora_alpha`, targets (every layer), seed. `A` and `B` entries are
/// `u · scale` with `u` uniform in `[-1, 1)` from splitmix64 (24-bit, so exact in f32).
#[derive(Debug, Clone, PartialEq)]
pub struct RandomLoraSpec {
    pub rank: usize,
    pub alpha: f32,
    pub targets: Vec<LoraTarget>,
    pub seed: u64,
    pub a_scale: f32,
    pub b_scale: f32,
}

/// splitmix64, the generator the Python script repeats.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_unit(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn fill(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.next_unit() * scale).collect()
    }
}

/// Writes `adapter_config.json` and an F32 `adapter_model.safetensors` into `dir` (created
/// if needed). Values are drawn layer by layer, target by target in `spec.targets` order,
/// `A` (`[rank, in]`, row-major) before `B` (`[out, rank]`).
pub fn write_random_peft_adapter(
    dir: &Path,
    config: &ModelConfig,
    spec: &RandomLoraSpec,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let mut rng = SplitMix64(spec.seed);
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    let mut push = |name: String, shape: [usize; 2], values: Vec<f32>| {
        let start = data.len();
        data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        header.insert(
            name,
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    };
    for layer in 0..config.num_layers {
        for &target in &spec.targets {
            let (input, output) = target.dims(config);
            let module = match target {
                LoraTarget::Gate | LoraTarget::Up | LoraTarget::Down => "mlp",
                _ => "self_attn",
            };
            let prefix = format!(
                "base_model.model.model.layers.{layer}.{module}.{}",
                target.hf_name()
            );
            let a = rng.fill(spec.rank * input, spec.a_scale);
            push(format!("{prefix}.lora_A.weight"), [spec.rank, input], a);
            let b = rng.fill(output * spec.rank, spec.b_scale);
            push(format!("{prefix}.lora_B.weight"), [output, spec.rank], b);
        }
    }
    let mut header_bytes = serde_json::Value::Object(header).to_string().into_bytes();
    while !header_bytes.len().is_multiple_of(8) {
        header_bytes.push(b' ');
    }
    let mut file = (header_bytes.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header_bytes);
    file.extend_from_slice(&data);
    let weights = dir.join("adapter_model.safetensors");
    std::fs::write(&weights, file).map_err(io_error(&weights))?;
    let targets: Vec<&str> = spec.targets.iter().map(|t| t.hf_name()).collect();
    let adapter_config = serde_json::json!({
        "peft_type": "LORA",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "target_modules": targets,
        "bias": "none",
        "use_rslora": false,
        "task_type": "CAUSAL_LM",
    });
    let config_path = dir.join("adapter_config.json");
    std::fs::write(&config_path, adapter_config.to_string()).map_err(io_error(&config_path))?;
    Ok(())
}
