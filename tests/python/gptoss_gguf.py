"""A random-weight gpt-oss GGUF to serve: the parity fixture's checkpoint
(crates/models/tests/fixtures/gptoss_20b_like.json: gpt-oss-20b's attention and routing at
hidden 512, four layers, MXFP4 experts) rebuilt from its formulas (numpy only; the formulas
are scripts/reference/make_gptoss_fixtures.py's), with a harmony vocabulary of 512 tokens
(GPT-2's 256 byte-level characters, placeholders, and gpt-oss's special tokens at the top),
the o200k pre-tokenizer (`gpt-4o`) and gpt-oss's real chat template
(crates/text/tests/fixtures/chat_template_gpt_oss.jinja). Its output is noise; the tests that
serve it assert on the protocol.

The GGUF is written by hand (gguf_file.py), so the test venv needs no `gguf` package.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts/reference"))

from make_gptoss_fixtures import expert_tensors, mxfp4_bytes, mxfp4_codes  # noqa: E402
from make_qwen35_fixtures import fnv1a, formula_weights, synthetic_vocab  # noqa: E402

from gguf_file import GGML_F32, GGML_MXFP4, T_ARRAY, T_BOOL, T_F32, T_I32, T_STRING, T_U32  # noqa: E402
from gguf_file import write as write_gguf  # noqa: E402

FIXTURE = REPO / "crates/models/tests/fixtures/gptoss_20b_like.json"
TEMPLATE = REPO / "crates/text/tests/fixtures/chat_template_gpt_oss.jinja"

# gpt-oss's special tokens (o200k_harmony names), placed at the top of the small vocabulary.
SPECIALS = [
    "<|startoftext|>",
    "<|endoftext|>",
    "<|return|>",
    "<|constrain|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|call|>",
]

def _gguf_name(hf: str) -> str:
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in fixed:
        return fixed[hf]
    layer, short = hf[len("model.layers."):].split(".", 1)
    names = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "self_attn.sinks": "attn_sinks.weight",
        "mlp.router.weight": "ffn_gate_inp.weight",
        "mlp.router.bias": "ffn_gate_inp.bias",
        "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
    }
    for proj, short_name in [("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_output")]:
        for part in ("weight", "bias"):
            names[f"self_attn.{proj}_proj.{part}"] = f"{short_name}.{part}"
    return f"blk.{layer}.{names[short]}"


def write(path: str | Path) -> Path:
    fixture = json.loads(FIXTURE.read_text())
    config = fixture["config"]
    vocab = config["vocab_size"]
    tokens = synthetic_vocab(vocab)
    first_special = vocab - len(SPECIALS)
    tokens[first_special:] = SPECIALS
    types = [1] * vocab
    for index in range(first_special, vocab):
        types[index] = 3
    special = {name: first_special + i for i, name in enumerate(SPECIALS)}
    rope = config["rope_parameters"]
    arch = "gpt-oss"
    metadata = [
        ("general.architecture", T_STRING, arch),
        (f"{arch}.block_count", T_U32, config["num_hidden_layers"]),
        (f"{arch}.context_length", T_U32, config["max_position_embeddings"]),
        (f"{arch}.embedding_length", T_U32, config["hidden_size"]),
        (f"{arch}.feed_forward_length", T_U32, config["intermediate_size"]),
        (f"{arch}.attention.head_count", T_U32, config["num_attention_heads"]),
        (f"{arch}.attention.head_count_kv", T_U32, config["num_key_value_heads"]),
        (f"{arch}.attention.key_length", T_U32, config["head_dim"]),
        (f"{arch}.attention.value_length", T_U32, config["head_dim"]),
        (f"{arch}.attention.sliding_window", T_U32, config["sliding_window"]),
        (f"{arch}.expert_count", T_U32, config["num_local_experts"]),
        (f"{arch}.expert_used_count", T_U32, config["num_experts_per_tok"]),
        (f"{arch}.expert_feed_forward_length", T_U32, config["intermediate_size"]),
        (f"{arch}.rope.scaling.type", T_STRING, "yarn"),
        (f"{arch}.rope.scaling.factor", T_F32, rope["factor"]),
        (f"{arch}.rope.scaling.original_context_length", T_U32, rope["original_max_position_embeddings"]),
        (f"{arch}.rope.scaling.yarn_beta_fast", T_F32, rope["beta_fast"]),
        (f"{arch}.rope.scaling.yarn_beta_slow", T_F32, rope["beta_slow"]),
        (f"{arch}.rope.freq_base", T_F32, rope["rope_theta"]),
        (f"{arch}.attention.layer_norm_rms_epsilon", T_F32, config["rms_norm_eps"]),
        ("tokenizer.ggml.model", T_STRING, "gpt2"),
        ("tokenizer.ggml.pre", T_STRING, "gpt-4o"),
        ("tokenizer.ggml.tokens", (T_ARRAY, T_STRING), tokens),
        ("tokenizer.ggml.token_type", (T_ARRAY, T_I32), types),
        ("tokenizer.ggml.merges", (T_ARRAY, T_STRING), []),
        ("tokenizer.ggml.bos_token_id", T_U32, special["<|startoftext|>"]),
        ("tokenizer.ggml.eos_token_id", T_U32, special["<|return|>"]),
        ("tokenizer.ggml.padding_token_id", T_U32, special["<|endoftext|>"]),
        ("tokenizer.ggml.add_bos_token", T_BOOL, False),
        ("tokenizer.chat_template", T_STRING, TEMPLATE.read_text()),
    ]
    tensors: list[tuple[str, list[int], int, bytes]] = []
    for spec in fixture["tensors"]:
        name, shape = spec["name"], spec["shape"]
        if "mxfp4_e_base" in spec:
            continue
        values = formula_weights(fnv1a(name), int(np.prod(shape)), spec["scale"], spec["offset"])
        if name.endswith("mlp.experts.gate_up_proj_bias"):
            layer = name.split(".")[2]
            values = values.reshape(shape)
            for part, offset in (("gate", 0), ("up", 1)):
                split = np.ascontiguousarray(values[:, offset::2])
                tensors.append((f"blk.{layer}.ffn_{part}_exps.bias", list(split.shape), GGML_F32, split.tobytes()))
            continue
        tensors.append((_gguf_name(name), shape, GGML_F32, values.astype("<f4").tobytes()))
    for name, (shape, e_base) in expert_tensors(config).items():
        codes, scales, _ = mxfp4_codes(name, shape, e_base)
        tensors.append((name, shape, GGML_MXFP4, mxfp4_bytes(codes, scales, shape).tobytes()))

    return write_gguf(path, metadata, tensors)
