//! FLOP and byte accounting of a forward pass, from the model's shape alone.
//!
//! Matmul FLOPs are `2 × parameters × rows`: every layer's q, k, v, o, gate, up and down
//! projections for every token, and the lm_head only for the rows that produce logits (a
//! prefill computes logits for its last token only). Attention FLOPs are counted separately
//! and explicitly: a query at position `p` scores and mixes `p + 1` cached keys and values,
//! `2 × head_dim` FLOPs each for `q·k` and for `p·v`, per query head and layer. RMSNorm, RoPE,
//! SiLU and softmax are left out (well under 1 % here).

use serde::Serialize;
use tokenmill_models::ModelConfig;

/// What one token costs in a given model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelCost {
    /// Matmul parameters every token goes through: all layers' q, k, v, o, gate, up, down
    /// (for a mixture of experts: the router and the experts a token uses).
    pub layer_params: u64,
    /// Parameters of the output projection (`vocab × hidden`), for rows with logits.
    pub lm_head_params: u64,
    /// Attention FLOPs per (query, cached key) pair, across layers: `4 × q_dim × layers`.
    pub attention_flops_per_pair: u64,
}

impl ModelCost {
    pub fn from_config(config: &ModelConfig) -> ModelCost {
        let hidden = config.hidden_size as u64;
        let mut layer_params = 0u64;
        for layer in 0..config.num_layers {
            // Layers differ in Gemma 4: its global layers' heads, K without V, KV-shared
            // layers projecting Q alone, double-wide MLPs, per-layer embedding gates.
            let (kv_heads, head_dim) = config.layer_kv_geometry(layer);
            let layer_q = (config.num_heads * head_dim) as u64;
            let kv_dim = (kv_heads * head_dim) as u64;
            let kv_projections = if config.kv_source_layer(layer) != layer {
                0
            } else if config.layer_sliding_window(layer).is_none()
                && config
                    .full_attention
                    .is_some_and(|full| full.values_are_keys)
            {
                1
            } else {
                2
            };
            // A mixture of experts runs the router and `experts_used` experts per token.
            let ffn = match config.moe {
                Some(moe) => {
                    moe.num_experts as u64 * hidden
                        + 3 * hidden * moe.expert_intermediate_size as u64 * moe.experts_used as u64
                }
                None => 3 * hidden * config.layer_intermediate_size(layer) as u64, // gate, up, down
            };
            let per_layer_input = config
                .per_layer_input_size
                .map_or(0, |width| 2 * hidden * width as u64);
            layer_params += hidden * layer_q // q
                + kv_projections * hidden * kv_dim // k, v
                + layer_q * hidden // o
                + ffn
                + per_layer_input;
        }
        // Gemma 4's per-layer embeddings project the embedding once per token.
        let embedding_projection = config
            .per_layer_input_size
            .map_or(0, |width| hidden * (width * config.num_layers) as u64);
        let attention_q: u64 = (0..config.num_layers)
            .map(|layer| (config.num_heads * config.layer_kv_geometry(layer).1) as u64)
            .sum();
        ModelCost {
            layer_params: layer_params + embedding_projection,
            lm_head_params: config.vocab_size as u64 * hidden,
            attention_flops_per_pair: 4 * attention_q,
        }
    }

    /// Matmul FLOPs of a step (or steps) over `tokens` rows, `logit_rows` of them with logits.
    pub fn matmul_flops(&self, tokens: u64, logit_rows: u64) -> f64 {
        2.0 * (self.layer_params as f64 * tokens as f64
            + self.lm_head_params as f64 * logit_rows as f64)
    }

    /// Attention FLOPs of one sequence processing positions `start..end` (causal: the query
    /// at `p` attends to `p + 1` positions).
    pub fn attention_flops(&self, start: u64, end: u64) -> f64 {
        let pairs = |n: u64| n as f64 * (n as f64 + 1.0) / 2.0;
        self.attention_flops_per_pair as f64 * (pairs(end) - pairs(start.min(end)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenmill_models::{Architecture, RopeScaling, RopeStyle};

    /// SmolLM2-135M's shape (the default model).
    fn smollm2() -> ModelConfig {
        ModelConfig {
            architecture: Architecture::from_name("llama").expect("a registered family"),
            family_name: "Llama",
            vocab_size: 49152,
            hidden_size: 576,
            intermediate_size: 1536,
            num_layers: 30,
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            rotary_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 100_000.0,
            rope_scaling: RopeScaling::None,
            rope_freq_factors: None,
            rope_style: RopeStyle::Normal,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            attention_bias: false,
            qk_norm: false,
            sliding_window: None,
            sliding_window_pattern: None,
            rope_local_theta: None,
            query_pre_attn_scalar: None,
            final_logit_softcapping: None,
            moe: None,
            linear_attention: None,
            attention_output_gate: false,
            sliding_layers: None,
            full_attention: None,
            kv_shared_layers: 0,
            per_layer_input_size: None,
            layer_intermediate_sizes: None,
            value_norm: false,
            attention_sinks: false,
            attention_output_bias: false,
            expert_bias: false,
            clamped_swiglu: None,
        }
    }

    #[test]
    fn smollm2_costs_about_270_mflop_per_token() {
        let cost = ModelCost::from_config(&smollm2());
        // Per layer: q 576², k/v 576·192 each, o 576², gate/up/down 576·1536 each.
        let per_layer = 576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536;
        assert_eq!(per_layer, 3_538_944);
        assert_eq!(cost.layer_params, 30 * per_layer);
        assert_eq!(cost.lm_head_params, 49152 * 576);
        assert_eq!(cost.attention_flops_per_pair, 4 * 576 * 30);
        // DESIGN.md's "≈ 270 MFLOP per token" (all 134.5 M matmul parameters, lm_head included).
        let per_token = cost.matmul_flops(1, 1);
        assert_eq!(per_token, 2.0 * 134_479_872.0);
        assert!((per_token / 1e6 - 269.0).abs() < 1.0);
        // A 512-token prefill computes logits for one row only.
        assert_eq!(
            cost.matmul_flops(512, 1),
            2.0 * (512.0 * 106_168_320.0 + 28_311_552.0)
        );
    }

    #[test]
    fn a_mixture_of_experts_counts_the_router_and_the_experts_a_token_uses() {
        let mut config = smollm2();
        config.moe = Some(tokenmill_models::MoeConfig {
            num_experts: 128,
            experts_used: 8,
            expert_intermediate_size: 768,
        });
        let cost = ModelCost::from_config(&config);
        let attention = 576 * 576 + 2 * 576 * 192 + 576 * 576;
        let ffn = 128 * 576 + 8 * 3 * 576 * 768;
        assert_eq!(cost.layer_params, 30 * (attention + ffn));
    }

    #[test]
    fn attention_counts_every_causal_pair() {
        let cost = ModelCost::from_config(&smollm2());
        let per_pair = cost.attention_flops_per_pair as f64;
        // One token at position 0 attends to itself only.
        assert_eq!(cost.attention_flops(0, 1), per_pair);
        // Positions 0..4 attend to 1 + 2 + 3 + 4 positions.
        assert_eq!(cost.attention_flops(0, 4), 10.0 * per_pair);
        // Decoding positions 512..640 after a 512-token prompt: 513 + ... + 640.
        let pairs: u64 = (513..=640).sum();
        assert_eq!(cost.attention_flops(512, 640), pairs as f64 * per_pair);
        assert_eq!(cost.attention_flops(5, 5), 0.0);
        assert_eq!(cost.attention_flops(7, 3), 0.0);
    }
}
