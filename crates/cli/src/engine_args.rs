//! Engine flags shared by `serve` and `generate`, with vLLM's names.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use tokenmill_core::SchedulingPolicy;
use tokenmill_engine::spec::SpeculativeConfig;
use tokenmill_engine::{CacheDtype, EngineConfig, KvCacheSizing};
use tokenmill_models::ResolveOptions;

use crate::structured_args::StructuredOutputsArgs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    Fcfs,
    Priority,
}

/// Model and engine flags.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// A GGUF file, an HF model directory, or an HF repo id; default: SmolLM2-135M-Instruct.
    #[arg(long, help_heading = "Model")]
    pub model: Option<String>,
    /// HF tokenizer directory (or a tokenizer.json) replacing the model's own tokenizer.
    #[arg(long, help_heading = "Model")]
    pub tokenizer: Option<PathBuf>,
    /// Revision (branch, tag or commit) of an HF repo id, looked up in the HF cache or downloaded.
    #[arg(long, help_heading = "Model")]
    pub revision: Option<String>,
    /// Where HF repos and the default model are downloaded and looked up (default: the HF cache,
    /// and ~/.cache/tokenmill/models for the default model).
    #[arg(long, help_heading = "Model")]
    pub download_dir: Option<PathBuf>,
    /// Seeds the requests that bring no `seed` of their own, in arrival order, so a run is
    /// reproducible; default: fresh entropy per request.
    #[arg(long, help_heading = "Model")]
    pub seed: Option<u64>,
    /// Chat template file or inline Jinja template overriding the model's.
    #[arg(long, help_heading = "Model")]
    pub chat_template: Option<String>,
    /// Maximum prompt + output length; default: the model's context, capped by the KV pool.
    #[arg(long, help_heading = "Model")]
    pub max_model_len: Option<usize>,
    /// KV-cache budget: bytes or a size like 2GiB / 512MiB; default: a quarter of free RAM, at most 4 GiB.
    /// Per engine: with --data-parallel-size N each engine gets this budget.
    #[arg(long, alias = "kv-cache-memory-bytes", value_parser = parse_size, help_heading = "Cache")]
    pub kv_cache_memory: Option<u64>,
    /// KV-cache element type: auto (the model dtype as vLLM picks it: f16 for GGUF files and
    /// float16/float32 checkpoints, bf16 for bfloat16 ones, f32 under --dtype float32), float32
    /// (also fp32, float), float16 (also fp16, half; both tokenmill extensions), bfloat16,
    /// fp8 (= fp8_e4m3), fp8_e4m3, fp8_e5m2. 16 bits halve an f32 cache's bytes per token, fp8
    /// quarters them; fp8 uses a per-tensor scale of 1.0 and saturates.
    #[arg(long, default_value_t = CacheDtype::Auto, help_heading = "Cache")]
    pub kv_cache_dtype: CacheDtype,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16, help_heading = "Cache")]
    pub block_size: usize,
    /// Automatic prefix caching (on by default).
    #[arg(
        long,
        overrides_with = "no_enable_prefix_caching",
        help_heading = "Cache"
    )]
    pub enable_prefix_caching: bool,
    #[arg(long, help_heading = "Cache")]
    pub no_enable_prefix_caching: bool,
    /// Keep every KV block for every layer: no KV cache groups for models mixing
    /// full-attention and sliding-window layers (Gemma 3), and no release of blocks before
    /// the window when every layer has one.
    #[arg(long, help_heading = "Cache")]
    pub disable_hybrid_kv_cache_manager: bool,
    /// Maximum sequences in one step.
    #[arg(long, default_value_t = 64, help_heading = "Scheduler")]
    pub max_num_seqs: usize,
    /// Token budget of one step (chunked prefill splits longer prompts) [default: 512; without
    /// chunked prefill max(max-model-len, 2048)].
    #[arg(long, help_heading = "Scheduler")]
    pub max_num_batched_tokens: Option<usize>,
    /// Split long prompts over several steps (on by default).
    #[arg(
        long,
        overrides_with = "no_enable_chunked_prefill",
        help_heading = "Scheduler"
    )]
    pub enable_chunked_prefill: bool,
    /// Schedule each prompt whole (the step budget must then hold max-model-len tokens).
    #[arg(long, help_heading = "Scheduler")]
    pub no_enable_chunked_prefill: bool,
    #[arg(long, value_enum, default_value_t = PolicyArg::Fcfs, help_heading = "Scheduler")]
    pub scheduling_policy: PolicyArg,
    /// Compute threads; default: all cores. With --data-parallel-size N each engine gets 1/N.
    #[arg(long, help_heading = "Compute")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub structured_outputs: StructuredOutputsArgs,
    /// Speculative decoding, vLLM's JSON: `{"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_min": 2, "prompt_lookup_max": 5}`, `{"method": "suffix",
    /// "num_speculative_tokens": 8}` or `{"method": "draft_model", "model": "draft.gguf",
    /// "num_speculative_tokens": 3}` (plus `disable_by_batch_size`, and the suffix method's
    /// `suffix_decoding_*` keys); other methods and keys are refused by name.
    #[arg(long, value_name = "JSON", help_heading = "Scheduler")]
    pub speculative_config: Option<String>,
}

impl EngineArgs {
    /// Resolves the model (fetching the default one if needed) and builds the engine config.
    pub fn to_config(&self) -> anyhow::Result<EngineConfig> {
        // Checked before the model is resolved (and maybe downloaded), to fail fast.
        let speculative = self
            .speculative_config
            .as_deref()
            .map(SpeculativeConfig::from_json)
            .transpose()?;
        let resolve = ResolveOptions {
            download_dir: self.download_dir.clone(),
            revision: self.revision.clone(),
        };
        let source = tokenmill_models::resolve_model_with(self.model.as_deref(), &resolve)
            .context("cannot resolve the model")?;
        let mut config = EngineConfig::new(source);
        config.tokenizer = self.tokenizer.clone();
        config.seed = self.seed;
        config.chat_template = self.chat_template.clone();
        config.num_threads = self.threads;
        if let Some(bytes) = self.kv_cache_memory {
            config.kv_cache = KvCacheSizing::Bytes(bytes);
        }
        config.kv_cache_dtype = self.kv_cache_dtype;
        if self.block_size == 0 {
            bail!("--block-size must be at least 1");
        }
        config.block_size = self.block_size;
        config.max_model_len = self.max_model_len;
        config.max_num_seqs = self.max_num_seqs;
        config.max_num_batched_tokens = self.max_num_batched_tokens;
        config.enable_chunked_prefill = !self.no_enable_chunked_prefill;
        config.enable_prefix_caching = !self.no_enable_prefix_caching;
        config.disable_hybrid_kv_cache_manager = self.disable_hybrid_kv_cache_manager;
        config.json_grammar = self.structured_outputs.config()?.json;
        config.scheduling_policy = match self.scheduling_policy {
            PolicyArg::Fcfs => SchedulingPolicy::Fcfs,
            PolicyArg::Priority => SchedulingPolicy::Priority,
        };
        config.speculative = speculative;
        Ok(config)
    }
}

/// Parses `1073741824`, `4GiB`, `512MiB`, `4G`, `1.5GB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (e.g. 2GiB, 512MiB, 1073741824)"))?;
    let multiplier: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown size unit '{other}' in '{text}'")),
    };
    Ok((value * multiplier) as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("3parsecs").is_err());
    }
}
