#!/usr/bin/env python3
"""Writes crates/models/tests/fixtures/family_phi3{,_longrope}.json: llama.cpp's greedy
continuations and top logits for small random-weight Phi-3 GGUFs (`phi3`, the architecture of
Phi-3 and Phi-4-mini), in F32 and quantized to Q8_0 by llama.cpp's own `llama-quantize`.

The models follow make_family_fixtures.py (whose helpers this script imports): every weight
comes from `formula_weights`, which the Rust test computes bit for bit, so the fixture stores
only the spec and the Rust test (crates/models/tests/family_parity.rs) rebuilds the same GGUF
with tokenmill's writer; for the Q8_0 case it quantizes each tensor to the type llama-quantize
gave it (recorded in the fixture) with tokenmill's port of GGML's reference Q8_0 quantizer.

Phi-3's real tensor names and metadata: a fused `attn_qkv` (rows q | k | v), a fused `ffn_up`
holding gate and up (2 x feed_forward_length rows), no `ffn_gate`; partial rotary
(`rope.dimension_count` 12 of head_dim 16, as Phi-4-mini rotates 96 of 128); LongRoPE's
`rope_factors_long.weight` / `rope_factors_short.weight` (rotary_dim / 2 each),
`rope.scaling.original_context_length` and `rope.scaling.attn_factor` (the converter's
`sqrt(1 + ln(s) / ln(original))`, s = context_length / original). Hidden 64, four heads of 16,
two KV heads, three layers, an untied head.

Two files, because llama.cpp picks the factors by its context size (`n_ctx >
original_context_length` takes the long ones) and tokenmill by the model's context length:
- `phi3`: context_length = original = 128, attn_factor 1; llama.cpp at n_ctx 128: short
  factors.
- `phi3_longrope`: context_length 512, original 32, attn_factor sqrt(1 + ln 16 / ln 32);
  llama.cpp at n_ctx 256 (> 32): long factors. Two of the three prompts run past position
  32, the original context.

llama.cpp comes from llama-cpp-python 0.3.16 (pinned), run with an f32 KV cache and 2 threads.

Run by a developer (not CI; about 10 s):
    /work/cache/refvenv/bin/python scripts/reference/make_phi3_fixtures.py \\
        --quantize /work/cache/bench/llamacpp-native-0.3.16/build/bin/llama-quantize
The GGUFs go to a cache directory outside the repository (--cache).
"""

import argparse
import math
import os
import sys

import gguf
import llama_cpp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_family_fixtures import DEFAULT_MODEL  # noqa: E402
from make_moe_fixtures import DEFAULT_QUANTIZE, write_f32_and_q8_fixture  # noqa: E402

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, ROTARY = 64, 4, 2, 128, 3, 12


def phi3_layer_tensors(i):
    head_dim = HIDDEN // HEADS
    p = f"blk.{i}."
    return [
        (p + "attn_norm.weight", [HIDDEN], 0.2, 1.0),
        (p + "attn_qkv.weight", [(HEADS + 2 * KV_HEADS) * head_dim, HIDDEN], 0.2, 0.0),
        (p + "attn_output.weight", [HIDDEN, HEADS * head_dim], 0.15, 0.0),
        (p + "ffn_norm.weight", [HIDDEN], 0.2, 1.0),
        (p + "ffn_up.weight", [2 * FFN, HIDDEN], 0.2, 0.0),
        (p + "ffn_down.weight", [HIDDEN, FFN], 0.15, 0.0),
    ]


def spec_phi3(vocab: int, name: str, context: int, original: int) -> dict:
    scale = context / original
    attn_factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    meta = {
        "context_length": ("u32", context),
        "embedding_length": ("u32", HIDDEN),
        "block_count": ("u32", LAYERS),
        "feed_forward_length": ("u32", FFN),
        "attention.head_count": ("u32", HEADS),
        "attention.head_count_kv": ("u32", KV_HEADS),
        "attention.layer_norm_rms_epsilon": ("f32", 1e-5),
        "rope.dimension_count": ("u32", ROTARY),
        "rope.freq_base": ("f32", 10000.0),
        "rope.scaling.original_context_length": ("u32", original),
        "rope.scaling.attn_factor": ("f32", attn_factor),
    }
    tensors = [("token_embd.weight", [vocab, HIDDEN], 0.5, 0.0)]
    # Divisors of each pair's frequency: long ones from 1 to 8, short ones near 1.
    tensors += [
        ("rope_factors_long.weight", [ROTARY // 2], 3.5, 4.5),
        ("rope_factors_short.weight", [ROTARY // 2], 0.2, 1.1),
    ]
    for i in range(LAYERS):
        tensors += phi3_layer_tensors(i)
    tensors += [
        ("output_norm.weight", [HIDDEN], 0.2, 1.0),
        ("output.weight", [vocab, HIDDEN], 0.5, 0.0),
    ]
    # llama.cpp sets Phi-3 token attributes by `general.name` ("phi3" in it looks up Phi-3's
    # own special tokens, absent from the borrowed vocabulary): a name without it.
    general_name = "tokenmill random longrope model"
    return {
        "arch": "phi3",
        "name": name,
        "general_name": general_name,
        "meta": meta,
        "tensors": tensors,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/tokenmill/reference"))
    parser.add_argument("--quantize", default=DEFAULT_QUANTIZE, help="llama-quantize binary")
    args = parser.parse_args()
    os.makedirs(args.cache, exist_ok=True)
    vocab = len(gguf.GGUFReader(DEFAULT_MODEL).fields["tokenizer.ggml.tokens"].data)
    reference = f"llama-cpp-python {llama_cpp.__version__}, f32 KV cache, 2 threads"
    runs = [
        (spec_phi3(vocab, "phi3", 128, 128), 128),
        (spec_phi3(vocab, "phi3_longrope", 512, 32), 256),
    ]
    for spec, n_ctx in runs:
        write_f32_and_q8_fixture(
            spec, vocab, args.cache, args.quantize, n_ctx, reference + f", n_ctx {n_ctx}"
        )


if __name__ == "__main__":
    main()
