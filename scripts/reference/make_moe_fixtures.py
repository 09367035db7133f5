#!/usr/bin/env python3
"""Writes crates/models/tests/fixtures/family_{qwen3moe,mixtral}.json: llama.cpp's greedy
continuations and top logits for small random-weight mixture-of-experts GGUFs, in F32 and
quantized to Q8_0 by llama.cpp's own `llama-quantize`.

The models follow make_family_fixtures.py (whose helpers this script imports): every weight
comes from `formula_weights`, which the Rust test computes bit for bit, so the fixture stores
only the spec and the Rust test (crates/models/tests/moe_parity.rs) rebuilds the same GGUF with
tokenmill's writer; for the Q8_0 case it quantizes each tensor to the type llama-quantize gave
it (recorded in the fixture) with tokenmill's port of GGML's reference Q8_0 quantizer. Shapes:
hidden 64, three layers, eight experts, two per token. `qwen3moe` has Qwen3's QK-norm and
head_dim 32 and an untied head; Mixtral is the `llama` architecture with `llama.expert_count`,
head_dim 16 and a tied head. Router weights are larger than the others so tokens spread over
the experts.

llama.cpp comes from llama-cpp-python 0.3.16 (pinned), run with an f32 KV cache and 2 threads.

Run by a developer (not CI; about 20 s):
    /work/cache/refvenv/bin/python scripts/reference/make_moe_fixtures.py \\
        --quantize /work/cache/bench/llamacpp-native-0.3.16/build/bin/llama-quantize
The GGUFs go to a cache directory outside the repository (--cache).
"""

import argparse
import os
import subprocess
import sys

import gguf
import llama_cpp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_family_fixtures import (  # noqa: E402
    DEFAULT_MODEL,
    layer_tensors,
    random_prompts,
    run_llama,
    write_fixture,
    write_random_gguf,
)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
DEFAULT_QUANTIZE = os.path.join(
    ROOT, ".cache/bench/llamacpp-native-0.3.16/build/bin/llama-quantize"
)
EXPERTS, USED = 8, 2


def moe_layer_tensors(i, hidden, heads, kv_heads, head_dim, expert_ffn, qk_norm):
    """Block i: the dense block's attention and norms, the FFN replaced by a router and the
    3-D expert tensors `[experts, rows, columns]`."""
    dropped = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
    if not qk_norm:
        dropped += ("attn_q_norm.weight", "attn_k_norm.weight")
    out = [
        t
        for t in layer_tensors(i, hidden, heads, kv_heads, head_dim, expert_ffn, gemma=False)
        if not t[0].endswith(dropped)
    ]
    p = f"blk.{i}."
    out += [
        (p + "ffn_gate_inp.weight", [EXPERTS, hidden], 1.0, 0.0),
        (p + "ffn_gate_exps.weight", [EXPERTS, expert_ffn, hidden], 0.2, 0.0),
        (p + "ffn_up_exps.weight", [EXPERTS, expert_ffn, hidden], 0.2, 0.0),
        (p + "ffn_down_exps.weight", [EXPERTS, hidden, expert_ffn], 0.15, 0.0),
    ]
    return out


def spec_qwen3moe(vocab: int) -> dict:
    hidden, heads, kv_heads, head_dim, expert_ffn, layers = 64, 4, 2, 32, 64, 3
    meta = {
        "context_length": ("u32", 2048),
        "embedding_length": ("u32", hidden),
        "block_count": ("u32", layers),
        "feed_forward_length": ("u32", 128),
        "expert_feed_forward_length": ("u32", expert_ffn),
        "expert_count": ("u32", EXPERTS),
        "expert_used_count": ("u32", USED),
        "attention.head_count": ("u32", heads),
        "attention.head_count_kv": ("u32", kv_heads),
        "attention.key_length": ("u32", head_dim),
        "attention.value_length": ("u32", head_dim),
        "attention.layer_norm_rms_epsilon": ("f32", 1e-6),
        "rope.freq_base": ("f32", 1000000.0),
    }
    tensors = [("token_embd.weight", [vocab, hidden], 0.5, 0.0)]
    for i in range(layers):
        tensors += moe_layer_tensors(i, hidden, heads, kv_heads, head_dim, expert_ffn, True)
    tensors += [
        ("output_norm.weight", [hidden], 0.2, 1.0),
        ("output.weight", [vocab, hidden], 0.5, 0.0),
    ]
    return {"arch": "qwen3moe", "name": "qwen3moe", "meta": meta, "tensors": tensors}


def spec_mixtral(vocab: int) -> dict:
    hidden, heads, kv_heads, expert_ffn, layers = 64, 4, 2, 96, 3
    meta = {
        "context_length": ("u32", 2048),
        "embedding_length": ("u32", hidden),
        "block_count": ("u32", layers),
        "feed_forward_length": ("u32", expert_ffn),
        "expert_count": ("u32", EXPERTS),
        "expert_used_count": ("u32", USED),
        "attention.head_count": ("u32", heads),
        "attention.head_count_kv": ("u32", kv_heads),
        "attention.layer_norm_rms_epsilon": ("f32", 1e-5),
        "rope.freq_base": ("f32", 1000000.0),
    }
    tensors = [("token_embd.weight", [vocab, hidden], 0.5, 0.0)]
    for i in range(layers):
        tensors += moe_layer_tensors(i, hidden, heads, kv_heads, hidden // heads, expert_ffn, False)
    tensors += [("output_norm.weight", [hidden], 0.2, 1.0)]
    return {"arch": "llama", "name": "mixtral", "meta": meta, "tensors": tensors}


def write_f32_and_q8_fixture(
    spec: dict, vocab: int, cache: str, quantize: str, n_ctx: int, reference: str
) -> None:
    """Writes `spec` as a random-weight F32 GGUF and its llama-quantize Q8_0 copy into `cache`,
    runs llama.cpp on both with context `n_ctx` and stores family_<name>.json."""
    path = os.path.join(cache, f"random-{spec['name']}-f32.gguf")
    write_random_gguf(spec, path)
    cases = run_llama(path, random_prompts(vocab), 16, n_ctx)
    q8_path = os.path.join(cache, f"random-{spec['name']}-q8_0.gguf")
    subprocess.run([quantize, path, q8_path, "Q8_0"], check=True, capture_output=True)
    q8_types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(q8_path).tensors}
    q8_cases = run_llama(q8_path, random_prompts(vocab), 16, n_ctx)
    fixture = {
        "reference": reference,
        "weights": "formula_weights(fnv1a(name), count, scale, offset), F32",
        "arch": spec["arch"],
        "meta": [[k, kind, value] for k, (kind, value) in spec["meta"].items()],
        "tensors": [
            {"name": n, "shape": s, "scale": sc, "offset": o} for n, s, sc, o in spec["tensors"]
        ],
        "cases": cases,
        "q8_0": {
            "quantizer": "llama-quantize (llama.cpp of llama-cpp-python 0.3.16) Q8_0",
            "tensor_types": q8_types,
            "cases": q8_cases,
        },
    }
    write_fixture(f"family_{spec['name']}.json", fixture)
    print(spec["name"], [c["greedy_ids"][:8] for c in cases])
    print(spec["name"], "q8_0", [c["greedy_ids"][:8] for c in q8_cases])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/tokenmill/reference"))
    parser.add_argument("--quantize", default=DEFAULT_QUANTIZE, help="llama-quantize binary")
    args = parser.parse_args()
    os.makedirs(args.cache, exist_ok=True)
    vocab = len(gguf.GGUFReader(DEFAULT_MODEL).fields["tokenizer.ggml.tokens"].data)
    reference = f"llama-cpp-python {llama_cpp.__version__}, f32 KV cache, 2 threads"
    for spec in [spec_qwen3moe(vocab), spec_mixtral(vocab)]:
        write_f32_and_q8_fixture(spec, vocab, args.cache, args.quantize, 256, reference)


if __name__ == "__main__":
    main()
