//! The result of `tokenmill bench speed`: per-figure medians and rates, the printed table, and
//! the JSON schema `bench/llamacpp_speed.py` writes too (`phases.<key>.<field>`).

use std::fmt::Write as _;

use serde::{Serialize, Serializer};
use tokenmill_models::CausalLm;

use crate::cost::ModelCost;
use crate::measure::PhaseTiming;
use crate::{Phase, SpeedSettings};

/// How GFLOP/s are counted, stated in every report.
pub const FLOP_ACCOUNTING: &str = "GFLOP/s = (matmul FLOPs + attention FLOPs) / time; matmul \
    FLOPs = 2 x (q,k,v,o,gate,up,down parameters x tokens + lm_head parameters x rows with \
    logits); attention FLOPs = 4 x q_dim x layers per (query, cached position) pair. Weight \
    GB/s = bytes of weights a step reads in full x steps / time (KV cache reads excluded).";

/// The machine's measured ceilings, with the threads the probes (and the model) used.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MachinePeak {
    pub cpu: String,
    /// The kernels' view of the CPU (`CpuFeatures` summary: features and the paths used).
    pub cpu_features: String,
    pub cores: usize,
    pub threads: usize,
    /// f32 FMA peak (register-resident loop), GFLOP/s.
    pub peak_gflops: f64,
    /// Streaming read bandwidth of main memory, GB/s.
    pub peak_read_gbs: f64,
}

/// The model's shape as far as the accounting goes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInfo {
    pub num_layers: usize,
    pub hidden_size: usize,
    pub vocab_size: usize,
    #[serde(flatten)]
    pub cost: ModelCost,
    /// All weight storage in the engine's layout.
    pub weight_bytes: u64,
    /// Weights one decode step reads in full.
    pub decode_weight_bytes: u64,
}

/// One figure: medians over the runs and the rates derived from them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseResult {
    #[serde(skip)]
    pub phase: Phase,
    pub label: String,
    pub sequences: u64,
    pub steps: u64,
    pub tokens: u64,
    pub context_start: u64,
    pub context_end: u64,
    pub runs_s: Vec<f64>,
    /// Median seconds of one run.
    pub seconds: f64,
    pub tok_s: f64,
    pub ms_per_step: f64,
    pub matmul_gflop: f64,
    pub attention_gflop: f64,
    pub gflops: f64,
    pub pct_peak_gflops: f64,
    pub weight_gbs: f64,
    pub pct_peak_read_gbs: f64,
    /// Verify figures: ms/step over the one-row verify figure's (same context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_one_row: Option<f64>,
}

/// Everything `tokenmill bench speed` measured (serialized as its `--json` file).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpeedReport {
    pub engine: String,
    pub version: String,
    pub date: String,
    pub model: String,
    pub threads: usize,
    pub machine: MachinePeak,
    pub model_info: ModelInfo,
    pub settings: SettingsRecord,
    pub accounting: String,
    #[serde(serialize_with = "phases_as_map")]
    pub phases: Vec<PhaseResult>,
}

/// The run's settings as recorded in the JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SettingsRecord {
    pub prompt_len: usize,
    pub decode_len: usize,
    pub batch: usize,
    pub batch_prompt_len: usize,
    pub batch_decode_steps: usize,
    /// Rows per step of the verify figures measured (empty when none were).
    pub verify_rows: Vec<usize>,
    pub repeats: usize,
    pub block_size: usize,
    /// `--kv-cache-dtype` as given.
    pub kv_cache_dtype: String,
    /// The element type it stored (`f16` for `auto` on a GGUF file).
    pub kv_cache_storage: String,
    /// Random LoRA adapters the figures ran through (0: the base model) and their rank.
    pub lora_adapters: usize,
    pub lora_rank: usize,
}

fn phases_as_map<S: Serializer>(phases: &[PhaseResult], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_map(phases.iter().map(|phase| (phase.phase.key(), phase)))
}

/// The median (mean of the middle two for an even count); 0 for no values.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn percent(value: f64, peak: f64) -> f64 {
    if peak > 0.0 {
        100.0 * value / peak
    } else {
        0.0
    }
}

impl PhaseResult {
    /// Derives the rates of one figure from its timing.
    pub fn from_timing(
        timing: &PhaseTiming,
        cost: &ModelCost,
        decode_weight_bytes: u64,
        machine: &MachinePeak,
    ) -> PhaseResult {
        let seconds = median(&timing.runs_s);
        let rate = |amount: f64| if seconds > 0.0 { amount / seconds } else { 0.0 };
        let matmul = cost.matmul_flops(timing.tokens, timing.logit_rows);
        // A verify figure's steps each process the same positions again.
        let repeated = match timing.phase {
            Phase::Verify(_) => timing.steps as f64,
            _ => 1.0,
        };
        let attention = repeated
            * timing.sequences as f64
            * cost.attention_flops(timing.context_start, timing.context_end);
        let gflops = rate(matmul + attention) / 1e9;
        let weight_gbs = rate(decode_weight_bytes as f64 * timing.steps as f64) / 1e9;
        PhaseResult {
            phase: timing.phase,
            label: label(timing),
            sequences: timing.sequences,
            steps: timing.steps,
            tokens: timing.tokens,
            context_start: timing.context_start,
            context_end: timing.context_end,
            runs_s: timing.runs_s.clone(),
            seconds,
            tok_s: rate(timing.tokens as f64),
            ms_per_step: 1e3 * seconds / timing.steps.max(1) as f64,
            matmul_gflop: matmul / 1e9,
            attention_gflop: attention / 1e9,
            gflops,
            pct_peak_gflops: percent(gflops, machine.peak_gflops),
            weight_gbs,
            pct_peak_read_gbs: percent(weight_gbs, machine.peak_read_gbs),
            vs_one_row: None,
        }
    }
}

/// The row label of a figure, e.g. `decode tok/s (ctx 512→640)`.
pub fn label(timing: &PhaseTiming) -> String {
    let (start, end) = (timing.context_start, timing.context_end);
    match timing.phase {
        Phase::Prefill => format!("prefill tok/s ({})", timing.tokens),
        Phase::Decode | Phase::DecodeLong => format!("decode tok/s (ctx {start}→{end})"),
        Phase::Verify(rows) => format!("verify {rows} rows/step tok/s (ctx {start})"),
        Phase::Batched => format!(
            "batched decode tok/s ({} seqs, ctx {start}→{end})",
            timing.sequences
        ),
    }
}

impl SpeedReport {
    pub fn new(
        model_path: String,
        model: &dyn CausalLm,
        settings: &SpeedSettings,
        machine: MachinePeak,
        timings: &[PhaseTiming],
    ) -> SpeedReport {
        let config = model.config();
        let cost = ModelCost::from_config(config);
        let decode_weight_bytes = model.decode_weight_bytes() as u64;
        let mut phases: Vec<PhaseResult> = timings
            .iter()
            .map(|timing| PhaseResult::from_timing(timing, &cost, decode_weight_bytes, &machine))
            .collect();
        phases.sort_by_key(|phase| phase.phase);
        let one_row = phases
            .iter()
            .find(|phase| phase.phase == Phase::Verify(1))
            .map(|phase| phase.ms_per_step);
        for phase in &mut phases {
            if let (Phase::Verify(_), Some(base)) = (phase.phase, one_row) {
                if base > 0.0 {
                    phase.vs_one_row = Some(phase.ms_per_step / base);
                }
            }
        }
        SpeedReport {
            engine: "tokenmill".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            date: tokenmill_bench::timestamp_now(),
            model: model_path,
            threads: settings.threads,
            machine,
            model_info: ModelInfo {
                num_layers: config.num_layers,
                hidden_size: config.hidden_size,
                vocab_size: config.vocab_size,
                cost,
                weight_bytes: model.weight_bytes() as u64,
                decode_weight_bytes,
            },
            settings: SettingsRecord {
                prompt_len: settings.prompt_len,
                decode_len: settings.decode_len,
                batch: settings.batch,
                batch_prompt_len: settings.batch_prompt_len,
                batch_decode_steps: settings.batch_decode_steps,
                verify_rows: settings.verify_rows(),
                repeats: settings.repeats,
                block_size: settings.block_size,
                kv_cache_dtype: settings.kv_cache_dtype.as_str().into(),
                kv_cache_storage: settings.kv_storage.name().into(),
                lora_adapters: settings.lora_adapters,
                lora_rank: settings.lora_rank,
            },
            accounting: FLOP_ACCOUNTING.into(),
            phases,
        }
    }
}

/// The printed table: one row per figure, peaks and percentages alongside.
pub fn format_report(report: &SpeedReport) -> String {
    let machine = &report.machine;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model: {} ({:.1} MB of weights, {:.1} MB read per decode step)",
        report.model,
        report.model_info.weight_bytes as f64 / 1e6,
        report.model_info.decode_weight_bytes as f64 / 1e6
    );
    let _ = writeln!(
        out,
        "machine: {}, {} cores ({}); {} threads; peak f32 FMA {:.1} GFLOP/s, memory read {:.1} GB/s",
        machine.cpu,
        machine.cores,
        machine.cpu_features,
        report.threads,
        machine.peak_gflops,
        machine.peak_read_gbs
    );
    let _ = writeln!(
        out,
        "median of {} runs; KV cache dtype {} (stored as {}); GFLOP/s include attention FLOPs \
         (see \"accounting\" in the JSON)",
        report.settings.repeats, report.settings.kv_cache_dtype, report.settings.kv_cache_storage
    );
    if report.settings.lora_adapters > 0 {
        let _ = writeln!(
            out,
            "through {} random rank-{} LoRA adapters (single stream: the first; batched: \
             sequence i uses adapter i mod {}); FLOP and byte figures count the base model only",
            report.settings.lora_adapters, report.settings.lora_rank, report.settings.lora_adapters
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| figure | tok/s | ms/step | GFLOP/s | % of {:.0} | weight GB/s | % of {:.1} |",
        machine.peak_gflops, machine.peak_read_gbs
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    for phase in &report.phases {
        let ratio = phase
            .vs_one_row
            .map(|ratio| format!(", {ratio:.2}× one row"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| {}{ratio} | {:.1} | {:.2} | {:.1} | {:.1} % | {:.2} | {:.1} % |",
            phase.label,
            phase.tok_s,
            phase.ms_per_step,
            phase.gflops,
            phase.pct_peak_gflops,
            phase.weight_gbs,
            phase.pct_peak_read_gbs
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn rates_follow_from_the_median_run() {
        let cost = ModelCost {
            layer_params: 1_000_000,
            lm_head_params: 500_000,
            attention_flops_per_pair: 100,
        };
        let machine = MachinePeak {
            cpu: "test".into(),
            cpu_features: "avx2".into(),
            cores: 2,
            threads: 2,
            peak_gflops: 10.0,
            peak_read_gbs: 20.0,
        };
        let timing = PhaseTiming {
            phase: Phase::Batched,
            sequences: 4,
            steps: 10,
            tokens: 40,
            logit_rows: 40,
            context_start: 2,
            context_end: 12,
            runs_s: vec![0.5, 0.1, 0.2],
        };
        let result = PhaseResult::from_timing(&timing, &cost, 1_000_000, &machine);
        assert_eq!(result.seconds, 0.2);
        assert!((result.tok_s - 200.0).abs() < 1e-9);
        assert!((result.ms_per_step - 20.0).abs() < 1e-9);
        let matmul = 2.0 * (1e6 * 40.0 + 5e5 * 40.0);
        // Positions 2..12 attend to 3 + ... + 12 = 75 positions, for 4 sequences.
        let attention = 4.0 * 75.0 * 100.0;
        assert!((result.matmul_gflop - matmul / 1e9).abs() < 1e-12);
        assert!((result.attention_gflop - attention / 1e9).abs() < 1e-12);
        assert!((result.gflops - (matmul + attention) / 0.2 / 1e9).abs() < 1e-9);
        assert!((result.pct_peak_gflops - 10.0 * result.gflops).abs() < 1e-9);
        assert!((result.weight_gbs - 1e6 * 10.0 / 0.2 / 1e9).abs() < 1e-12);
        assert!((result.pct_peak_read_gbs - 5.0 * result.weight_gbs).abs() < 1e-9);
        assert_eq!(result.label, "batched decode tok/s (4 seqs, ctx 2→12)");
    }
}
