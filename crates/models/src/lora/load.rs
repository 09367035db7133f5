//! Reading adapters: PEFT directories (`adapter_config.json` + `adapter_model.safetensors`)
//! and llama.cpp GGUF LoRA files (`general.type = adapter`), into per-layer [`LoraStack`]s
//! checked against the base model's shapes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokenmill_gguf::GgufFile;
use tokenmill_kernels::{dequantize, f32_to_bf16, f32_to_f16, DType, QMatrix};

use super::{LoraAdapter, LoraError, LoraGroup, LoraPart, LoraStack, LoraTarget};
use crate::config::{ModelConfig, RopeStyle};
use crate::loader::TensorStore;

/// The `adapter_config.json` fields that change what the weights mean. Fields that only
/// describe training (dropout, task type) do not.
#[derive(Debug, Deserialize)]
struct PeftConfig {
    #[serde(default)]
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f32,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    target_modules: Option<serde_json::Value>,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    bias: Option<String>,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    rank_pattern: HashMap<String, serde_json::Value>,
    #[serde(default)]
    alpha_pattern: HashMap<String, serde_json::Value>,
}

/// Where one adapter tensor goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Site {
    layer: usize,
    target: LoraTarget,
}

/// `A` and `B` of one site as read, f32, logical shapes `[rank, in]` and `[out, rank]`.
#[derive(Default)]
struct RawPair {
    a: Option<(Vec<f32>, Vec<usize>, String)>,
    b: Option<(Vec<f32>, Vec<usize>, String)>,
}

impl LoraAdapter {
    /// Reads the adapter at `path` (a PEFT directory or a GGUF LoRA file) for a base model
    /// of `config`, refusing ranks above `max_rank`.
    pub fn load(
        path: &Path,
        config: &ModelConfig,
        max_rank: usize,
    ) -> Result<LoraAdapter, LoraError> {
        if let Some(reason) = config.lora_unsupported_reason() {
            return Err(LoraError::UnsupportedBase(reason));
        }
        let Ok(metadata) = std::fs::metadata(path) else {
            return Err(LoraError::MissingPath(path.to_path_buf()));
        };
        if metadata.is_dir() {
            load_peft(path, config, max_rank)
        } else if metadata.is_file() {
            load_gguf(path, config, max_rank)
        } else {
            // A FIFO or a device would block or stream forever once opened.
            Err(LoraError::NotAnAdapter {
                path: path.to_path_buf(),
                message: "not a regular file or a directory".into(),
            })
        }
    }
}

fn load_peft(dir: &Path, config: &ModelConfig, max_rank: usize) -> Result<LoraAdapter, LoraError> {
    let config_path = dir.join("adapter_config.json");
    let weights_path = dir.join("adapter_model.safetensors");
    if !config_path.is_file() {
        return Err(LoraError::NotAnAdapter {
            path: dir.to_path_buf(),
            message: "no adapter_config.json".into(),
        });
    }
    if !weights_path.is_file() {
        return Err(LoraError::NotAnAdapter {
            path: dir.to_path_buf(),
            message: "no adapter_model.safetensors (adapter_model.bin is not read)".into(),
        });
    }
    let bad_config = |message: String| LoraError::Config {
        path: dir.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(&config_path).map_err(|e| bad_config(e.to_string()))?;
    let peft: PeftConfig = serde_json::from_str(&text).map_err(|e| bad_config(e.to_string()))?;
    if let Some(kind) = peft.peft_type.as_deref().filter(|kind| *kind != "LORA") {
        return Err(bad_config(format!("peft_type `{kind}` is not LORA")));
    }
    if peft.use_dora {
        return Err(bad_config(
            "DoRA adapters (use_dora) are not supported".into(),
        ));
    }
    if peft.fan_in_fan_out {
        return Err(bad_config(
            "fan_in_fan_out adapters are not supported".into(),
        ));
    }
    if let Some(bias) = peft.bias.as_deref().filter(|bias| *bias != "none") {
        return Err(bad_config(format!("bias `{bias}` is not supported")));
    }
    if !peft.rank_pattern.is_empty() || !peft.alpha_pattern.is_empty() {
        return Err(bad_config(
            "per-module rank_pattern/alpha_pattern are not supported".into(),
        ));
    }
    if let Some(module) = peft.modules_to_save.iter().flatten().next() {
        return Err(LoraError::UnsupportedTarget {
            module: format!("{module} (modules_to_save)"),
        });
    }
    // A list is checked by name; a string is a regex over module paths, and the tensors
    // present say what it matched.
    if let Some(serde_json::Value::Array(modules)) = &peft.target_modules {
        for module in modules {
            let name = module.as_str().unwrap_or_default();
            if LoraTarget::from_hf_name(name).is_none() {
                return Err(LoraError::UnsupportedTarget {
                    module: module.to_string().trim_matches('"').to_string(),
                });
            }
        }
    }
    check_rank(peft.r, max_rank)?;
    if peft.r == 0 {
        return Err(bad_config("r is 0".into()));
    }
    let scale = if peft.use_rslora {
        peft.lora_alpha / (peft.r as f32).sqrt()
    } else {
        peft.lora_alpha / peft.r as f32
    };
    let corrupt = |message: String| LoraError::Corrupt {
        path: weights_path.clone(),
        message,
    };
    let store =
        TensorStore::from_safetensors_file(&weights_path).map_err(|e| corrupt(e.to_string()))?;
    let mut raw: HashMap<Site, RawPair> = HashMap::new();
    for name in store.names() {
        let (site, is_a) = parse_peft_name(name, config)?;
        let tensor = store.get(name).map_err(|e| corrupt(e.to_string()))?;
        let mut values = vec![0.0f32; tensor.shape.iter().product()];
        dequantize(tensor.dtype, &tensor.bytes, &mut values).map_err(|e| corrupt(e.to_string()))?;
        let entry = (values, tensor.shape.to_vec(), name.to_string());
        let pair = raw.entry(site).or_default();
        if is_a {
            pair.a = Some(entry);
        } else {
            pair.b = Some(entry);
        }
    }
    // llama.cpp's converter permutes Llama's Q/K rows so RoPE rotates adjacent pairs; the
    // adapter's B rows are outputs of the same layer, so they follow.
    let permute = config.rope_style == RopeStyle::Normal;
    assemble(dir, raw, config, Some(peft.r), scale, permute)
}

/// `(site, is_a)` of a PEFT tensor name such as
/// `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`.
fn parse_peft_name(name: &str, config: &ModelConfig) -> Result<(Site, bool), LoraError> {
    let unsupported = || LoraError::UnsupportedTarget {
        module: name.to_string(),
    };
    let (prefix, is_a) = if let Some(prefix) = name.strip_suffix(".lora_A.weight") {
        (prefix, true)
    } else if let Some(prefix) = name.strip_suffix(".lora_B.weight") {
        (prefix, false)
    } else {
        return Err(unsupported());
    };
    let module = prefix.rsplit('.').next().unwrap_or_default();
    let target = LoraTarget::from_hf_name(module).ok_or_else(|| LoraError::UnsupportedTarget {
        module: module.to_string(),
    })?;
    let layer = prefix
        .split_once("layers.")
        .and_then(|(_, rest)| rest.split('.').next())
        .and_then(|index| index.parse::<usize>().ok())
        .ok_or_else(unsupported)?;
    check_layer(name, layer, config)?;
    check_target(module, target, config)?;
    Ok((Site { layer, target }, is_a))
}

/// The MLP targets do not exist in a mixture-of-experts base (its experts have no adapter
/// hook): refused at load, so no request ever runs with an adapter half applied.
fn check_target(module: &str, target: LoraTarget, config: &ModelConfig) -> Result<(), LoraError> {
    let mlp = matches!(target, LoraTarget::Gate | LoraTarget::Up | LoraTarget::Down);
    if mlp && config.moe.is_some() {
        return Err(LoraError::ExpertTarget {
            module: module.to_string(),
        });
    }
    Ok(())
}

fn load_gguf(path: &Path, config: &ModelConfig, max_rank: usize) -> Result<LoraAdapter, LoraError> {
    let corrupt = |message: String| LoraError::Corrupt {
        path: path.to_path_buf(),
        message,
    };
    let file = GgufFile::open(path).map_err(|e| corrupt(e.to_string()))?;
    let not_adapter = |message: String| LoraError::NotAnAdapter {
        path: path.to_path_buf(),
        message,
    };
    match file.get_str("general.type") {
        Some("adapter") => {}
        other => {
            return Err(not_adapter(format!(
                "general.type is {other:?}, expected \"adapter\""
            )))
        }
    }
    match file.get_str("adapter.type") {
        Some("lora") => {}
        other => {
            return Err(not_adapter(format!(
                "adapter.type is {other:?}, expected \"lora\""
            )))
        }
    }
    if let Some(arch) = file.architecture() {
        if arch != config.architecture.name() {
            return Err(LoraError::ArchitectureMismatch {
                adapter: arch.to_string(),
                base: config.architecture.name().to_string(),
            });
        }
    }
    let alpha = file.get_f64("adapter.lora.alpha").unwrap_or(0.0) as f32;
    let store = TensorStore::from_gguf(&file);
    let mut raw: HashMap<Site, RawPair> = HashMap::new();
    let mut rank = 0;
    for name in store.names() {
        let (site, is_a) = parse_gguf_name(name, config)?;
        let tensor = store.get(name).map_err(|e| corrupt(e.to_string()))?;
        let mut values = vec![0.0f32; tensor.shape.iter().product()];
        dequantize(tensor.dtype, &tensor.bytes, &mut values).map_err(|e| corrupt(e.to_string()))?;
        if is_a {
            rank = rank.max(tensor.shape.first().copied().unwrap_or(0));
        }
        let entry = (values, tensor.shape.to_vec(), name.to_string());
        let pair = raw.entry(site).or_default();
        if is_a {
            pair.a = Some(entry);
        } else {
            pair.b = Some(entry);
        }
    }
    check_rank(rank, max_rank)?;
    // llama.cpp: `scale = alpha / rank`, or 1 when the file has no alpha. Ranks agree per
    // file in practice; the check below refuses a file where they do not.
    let scale = if alpha == 0.0 || rank == 0 {
        1.0
    } else {
        alpha / rank as f32
    };
    assemble(path, raw, config, Some(rank), scale, false)
}

/// `(site, is_a)` of a GGUF LoRA tensor name such as `blk.3.attn_q.weight.lora_a`.
fn parse_gguf_name(name: &str, config: &ModelConfig) -> Result<(Site, bool), LoraError> {
    let (prefix, is_a) = if let Some(prefix) = name.strip_suffix(".weight.lora_a") {
        (prefix, true)
    } else if let Some(prefix) = name.strip_suffix(".weight.lora_b") {
        (prefix, false)
    } else {
        return Err(LoraError::UnsupportedTarget {
            module: name.to_string(),
        });
    };
    let parsed = prefix.strip_prefix("blk.").and_then(|rest| {
        let (layer, module) = rest.split_once('.')?;
        Some((layer.parse::<usize>().ok()?, module))
    });
    let Some((layer, module)) = parsed else {
        return Err(LoraError::UnsupportedTarget {
            module: name.to_string(),
        });
    };
    let target =
        LoraTarget::from_gguf_name(module).ok_or_else(|| LoraError::UnsupportedTarget {
            module: module.to_string(),
        })?;
    check_layer(name, layer, config)?;
    check_target(module, target, config)?;
    Ok((Site { layer, target }, is_a))
}

fn check_rank(rank: usize, max_rank: usize) -> Result<(), LoraError> {
    if rank > max_rank {
        return Err(LoraError::RankTooLarge { rank, max_rank });
    }
    Ok(())
}

fn check_layer(tensor: &str, layer: usize, config: &ModelConfig) -> Result<(), LoraError> {
    if layer >= config.num_layers {
        return Err(LoraError::LayerOutOfRange {
            tensor: tensor.to_string(),
            layer,
            num_layers: config.num_layers,
        });
    }
    Ok(())
}

fn check_shape(tensor: &str, actual: &[usize], expected: [usize; 2]) -> Result<(), LoraError> {
    if actual != expected {
        return Err(LoraError::ShapeMismatch {
            tensor: tensor.to_string(),
            expected: expected.to_vec(),
            actual: actual.to_vec(),
        });
    }
    Ok(())
}

/// One target's checked `A` `[r, in]` and `B` `[out, r]` (f32 as read) and `r`.
type CheckedPair = (Vec<f32>, Vec<f32>, usize);

/// Checks every pair against the base shapes and builds the adapter.
fn assemble(
    path: &Path,
    raw: HashMap<Site, RawPair>,
    config: &ModelConfig,
    rank: Option<usize>,
    scale: f32,
    permute_qk: bool,
) -> Result<LoraAdapter, LoraError> {
    if raw.is_empty() {
        return Err(LoraError::NotAnAdapter {
            path: path.to_path_buf(),
            message: "no LoRA tensors".into(),
        });
    }
    let corrupt = |message: String| LoraError::Corrupt {
        path: path.to_path_buf(),
        message,
    };
    let mut checked: Vec<[Option<CheckedPair>; 7]> =
        (0..config.num_layers).map(|_| Default::default()).collect();
    let mut max_rank = 0;
    for (site, pair) in raw {
        let (a, a_shape, a_name) = match (pair.a, &pair.b) {
            (Some(a), _) => a,
            (None, Some((_, _, b_name))) => return Err(LoraError::Unpaired(b_name.clone())),
            (None, None) => continue,
        };
        let Some((mut b, b_shape, b_name)) = pair.b else {
            return Err(LoraError::Unpaired(a_name));
        };
        let (in_features, out_features) = site.target.dims(config);
        let r = rank.unwrap_or_else(|| a_shape.first().copied().unwrap_or(0));
        check_shape(&a_name, &a_shape, [r, in_features])?;
        check_shape(&b_name, &b_shape, [out_features, r])?;
        if permute_qk {
            let heads = match site.target {
                LoraTarget::Q => Some(config.num_heads),
                LoraTarget::K => Some(config.num_kv_heads),
                _ => None,
            };
            if let Some(heads) = heads {
                b = permute_rows(&b, heads, config.head_dim, r);
            }
        }
        max_rank = max_rank.max(r);
        checked[site.layer][site.target as usize] = Some((a, b, r));
    }
    let layers = checked
        .into_iter()
        .map(|mut targets| {
            let mut stacks: [Option<LoraStack>; 4] = Default::default();
            for (slot, group) in stacks.iter_mut().zip(LoraGroup::ALL) {
                *slot =
                    stack_group(group, &mut targets, config).map_err(|e| corrupt(e.to_string()))?;
            }
            Ok(stacks)
        })
        .collect::<Result<Vec<_>, LoraError>>()?;
    Ok(LoraAdapter {
        path: PathBuf::from(path),
        rank: max_rank,
        scale,
        layers,
    })
}

/// The [`LoraStack`] of `group` from the checked pairs of one layer (taken out of `targets`);
/// `None` when the adapter targets none of the group's layers there.
fn stack_group(
    group: LoraGroup,
    targets: &mut [Option<CheckedPair>; 7],
    config: &ModelConfig,
) -> Result<Option<LoraStack>, tokenmill_kernels::KernelError> {
    let mut a_rows = Vec::new();
    let mut parts = Vec::new();
    let mut column = 0;
    let mut in_features = 0;
    for &target in group.targets() {
        let (input, output) = target.dims(config);
        in_features = input;
        if let Some((a, b, r)) = targets[target as usize].take() {
            let start = a_rows.len() / input.max(1);
            a_rows.extend_from_slice(&a);
            parts.push(LoraPart {
                target,
                ranks: start..start + r,
                b: half_matrix(r, output, &transpose(&b, output, r))?,
                column,
            });
        }
        column += output;
    }
    if parts.is_empty() {
        return Ok(None);
    }
    let stacked_rank = a_rows.len() / in_features.max(1);
    Ok(Some(LoraStack {
        a: half_matrix(stacked_rank, in_features, &a_rows)?,
        parts,
    }))
}

/// `values` `[rows][columns]` as `[columns][rows]`.
fn transpose(values: &[f32], rows: usize, columns: usize) -> Vec<f32> {
    (0..columns)
        .flat_map(|c| (0..rows).map(move |r| values[r * columns + c]))
        .collect()
}

/// A 16-bit matrix of `values`: F16 (rounded to nearest), or BF16 if a value is beyond F16's
/// range, which would otherwise become infinite (see [`LoraStack`]).
fn half_matrix(
    rows: usize,
    columns: usize,
    values: &[f32],
) -> Result<QMatrix, tokenmill_kernels::KernelError> {
    let fits_f16 = values.iter().all(|v| v.abs() <= 65504.0);
    let (dtype, convert): (DType, fn(f32) -> u16) = if fits_f16 {
        (DType::F16, f32_to_f16)
    } else {
        (DType::BF16, f32_to_bf16)
    };
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|&v| convert(v).to_le_bytes())
        .collect();
    QMatrix::from_bytes(dtype, rows, columns, &bytes)
}

/// llama.cpp's Q/K row permutation: within each head, HF's row `j * head_dim/2 + i` (two
/// halves) becomes row `2i + j` (adjacent pairs). `values` is `[heads * head_dim][width]`.
fn permute_rows(values: &[f32], heads: usize, head_dim: usize, width: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0.0f32; values.len()];
    for head in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let from = (head * head_dim + j * half + i) * width;
                let to = (head * head_dim + 2 * i + j) * width;
                out[to..to + width].copy_from_slice(&values[from..from + width]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_interleaves_each_heads_halves() {
        // One head of dim 4, width 1: HF rows [r0 r1 | r2 r3] → GGUF [r0 r2 r1 r3].
        let rows = permute_rows(&[0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0], 2, 4, 1);
        assert_eq!(rows, vec![0.0, 2.0, 1.0, 3.0, 10.0, 12.0, 11.0, 13.0]);
    }
}
