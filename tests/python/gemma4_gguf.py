"""A random-weight Gemma 4 GGUF to serve: Gemma 4 E2B's layer pattern at toy width (sliding
and global layers with their own head sizes, proportional RoPE on a quarter of the global
heads, per-layer embeddings, the last two layers sharing earlier layers' KV with double-wide
MLPs, logit soft-capping) under Gemma 4's real tokenizer and chat template: every
`tokenizer.*` key of llama.cpp's `ggml-vocab-gemma-4.gguf` (262,144 tokens, fetched by
scripts/fetch-gemma4-vocab.sh), with its `tokenizer.chat_template` (an earlier Gemma 4
template) replaced by google/gemma-4-31B-it's current one, the template of
crates/text/tests/fixtures/chat_templates_gemma4.json (llama.cpp's
models/templates/google-gemma-4-31B-it.jinja).
Weights are seeded noise (numpy); the big tables (token and per-layer embeddings) are F16.
Its output is noise; the tests that serve it assert on the protocol.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

from gguf_file import GGML_F16, GGML_F32, T_ARRAY, T_BOOL, T_F32, T_I32, T_STRING, T_U32, read_metadata, write

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "crates/text/tests/fixtures/chat_templates_gemma4.json"

HIDDEN, HEADS, KV_HEADS, SWA_HEAD, FULL_HEAD = 64, 2, 1, 32, 64
FFN, PER_LAYER, WINDOW = 128, 8, 16
LAYERS = ["swa", "swa", "full", "swa", "full"]
SHARED = 2  # the last two layers read layer 1's (sliding) and layer 2's (global) KV


def vocab_file() -> Path:
    out = subprocess.run(
        [str(REPO / "scripts/fetch-gemma4-vocab.sh")],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _kind(value):
    if isinstance(value, bool):
        return T_BOOL
    if isinstance(value, int):
        return T_U32
    if isinstance(value, float):
        return T_F32
    return T_STRING


def _tokenizer_metadata() -> list:
    # The vocabulary file's own types: token_type is i32, scores f32, the rest as named.
    kinds = {
        "tokenizer.ggml.tokens": (T_ARRAY, T_STRING),
        "tokenizer.ggml.merges": (T_ARRAY, T_STRING),
        "tokenizer.ggml.scores": (T_ARRAY, T_F32),
        "tokenizer.ggml.token_type": (T_ARRAY, T_I32),
    }
    metadata = read_metadata(vocab_file())
    metadata["tokenizer.chat_template"] = json.loads(TEMPLATES.read_text())["template"]
    return [
        (key, kinds.get(key, _kind(value)), value)
        for key, value in metadata.items()
        if key.startswith("tokenizer.")
    ]


def write_model(path: str | Path) -> Path:
    rng = np.random.default_rng(4)
    tokenizer = _tokenizer_metadata()
    vocab = next(len(v) for k, _, v in tokenizer if k == "tokenizer.ggml.tokens")
    layers = len(LAYERS)
    arch = "gemma4"
    widths = [FFN * (2 if i >= layers - SHARED else 1) for i in range(layers)]
    metadata = [
        ("general.architecture", T_STRING, arch),
        (f"{arch}.block_count", T_U32, layers),
        (f"{arch}.context_length", T_U32, 4096),
        (f"{arch}.embedding_length", T_U32, HIDDEN),
        (f"{arch}.feed_forward_length", (T_ARRAY, T_U32), widths),
        (f"{arch}.attention.head_count", T_U32, HEADS),
        (f"{arch}.attention.head_count_kv", T_U32, KV_HEADS),
        (f"{arch}.attention.key_length", T_U32, FULL_HEAD),
        (f"{arch}.attention.value_length", T_U32, FULL_HEAD),
        (f"{arch}.attention.key_length_swa", T_U32, SWA_HEAD),
        (f"{arch}.attention.value_length_swa", T_U32, SWA_HEAD),
        (f"{arch}.attention.sliding_window", T_U32, WINDOW),
        (f"{arch}.attention.sliding_window_pattern", (T_ARRAY, T_BOOL), [t == "swa" for t in LAYERS]),
        (f"{arch}.attention.shared_kv_layers", T_U32, SHARED),
        (f"{arch}.embedding_length_per_layer_input", T_U32, PER_LAYER),
        (f"{arch}.rope.dimension_count", T_U32, FULL_HEAD),
        (f"{arch}.rope.dimension_count_swa", T_U32, SWA_HEAD),
        (f"{arch}.rope.freq_base", T_F32, 1_000_000.0),
        (f"{arch}.rope.freq_base_swa", T_F32, 10_000.0),
        (f"{arch}.attention.layer_norm_rms_epsilon", T_F32, 1e-6),
        (f"{arch}.final_logit_softcapping", T_F32, 30.0),
        *tokenizer,
    ]

    def f32(name: str, shape: list[int], scale: float = 0.05, center: float = 0.0):
        values = rng.standard_normal(int(np.prod(shape)), dtype=np.float32) * scale + center
        return (name, shape, GGML_F32, values.astype("<f4").tobytes())

    def f16(name: str, shape: list[int], scale: float):
        values = rng.standard_normal(int(np.prod(shape)), dtype=np.float32) * scale
        return (name, shape, GGML_F16, values.astype("<f2").tobytes())

    rotated = FULL_HEAD // 8  # partial_rotary_factor 0.25: a quarter of the pairs turn
    factors = np.array([1.0 if pair < rotated else 1e30 for pair in range(FULL_HEAD // 2)], "<f4")
    tensors = [
        ("rope_freqs.weight", [FULL_HEAD // 2], GGML_F32, factors.tobytes()),
        f16("token_embd.weight", [vocab, HIDDEN], 0.05),
        f16("per_layer_token_embd.weight", [vocab, layers * PER_LAYER], 0.05),
        f32("per_layer_model_proj.weight", [layers * PER_LAYER, HIDDEN]),
        f32("per_layer_proj_norm.weight", [PER_LAYER], 0.05, 1.0),
        f32("output_norm.weight", [HIDDEN], 0.05, 1.0),
    ]
    for i, kind in enumerate(LAYERS):
        head = SWA_HEAD if kind == "swa" else FULL_HEAD
        blk = f"blk.{i}"
        tensors += [
            f32(f"{blk}.attn_norm.weight", [HIDDEN], 0.05, 1.0),
            f32(f"{blk}.attn_q.weight", [HEADS * head, HIDDEN]),
            f32(f"{blk}.attn_q_norm.weight", [head], 0.05, 1.0),
            f32(f"{blk}.attn_k.weight", [KV_HEADS * head, HIDDEN]),
            f32(f"{blk}.attn_k_norm.weight", [head], 0.05, 1.0),
            f32(f"{blk}.attn_v.weight", [KV_HEADS * head, HIDDEN]),
            f32(f"{blk}.attn_output.weight", [HIDDEN, HEADS * head]),
            f32(f"{blk}.post_attention_norm.weight", [HIDDEN], 0.05, 1.0),
            f32(f"{blk}.ffn_norm.weight", [HIDDEN], 0.05, 1.0),
            f32(f"{blk}.ffn_gate.weight", [widths[i], HIDDEN]),
            f32(f"{blk}.ffn_up.weight", [widths[i], HIDDEN]),
            f32(f"{blk}.ffn_down.weight", [HIDDEN, widths[i]]),
            f32(f"{blk}.post_ffw_norm.weight", [HIDDEN], 0.05, 1.0),
            f32(f"{blk}.inp_gate.weight", [PER_LAYER, HIDDEN]),
            f32(f"{blk}.proj.weight", [HIDDEN, PER_LAYER]),
            f32(f"{blk}.post_norm.weight", [HIDDEN], 0.05, 1.0),
            f32(f"{blk}.layer_output_scale.weight", [1], 0.0, 1.0),
        ]
    return write(path, metadata, tensors)
