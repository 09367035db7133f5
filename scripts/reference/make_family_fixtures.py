#!/usr/bin/env python3
"""Writes crates/models/tests/fixtures/family_{qwen3,gemma3}.json: llama.cpp's greedy
continuations and top logits for small random-weight Qwen3 and Gemma 3 GGUFs, and, with
--gemma3-270m, for the real Gemma 3 270M weights dequantized to F32.

Random-weight models. Every weight comes from a formula both this script and the Rust test
compute bit for bit (an integer hash of the element index and a per-tensor seed, mapped to
float32 with exact float32 operations; see `formula_weights`), so the fixture stores only the
model's spec (metadata and, per tensor, name, shape, seed, scale and offset) and the Rust test
rebuilds the same GGUF with tokenmill's own writer: CI needs no Python, no llama.cpp and no
stored model file. Shapes are small (hidden 64, head_dim 32 != hidden / heads, a few layers)
but the names and metadata are the real ones; the tokenizer metadata is the default model's
(llama.cpp needs one to load; prompts are given as ids). Gemma 3 gets a sliding window of 16
positions, shorter than the prompts, seven layers (layer 5 global, the others local) and
linear RoPE scaling (factor 4, global layers only), so the window, the two RoPE tables and the
layer pattern all matter. Qwen3 has an untied head, Gemma 3 a tied one.

llama.cpp comes from llama-cpp-python 0.3.16 (pinned), run with an f32 KV cache and 2 threads.
For every prompt the fixture stores the prompt ids, the greedy ids (argmax, lowest id on ties)
and, at every generated step, the TOP largest logits.

Run by a developer (not CI):
    /work/cache/refvenv/bin/python scripts/reference/make_family_fixtures.py
    /work/cache/refvenv/bin/python scripts/reference/make_family_fixtures.py --gemma3-270m
The generated GGUFs go to a cache directory outside the repository (--cache).
"""

import argparse
import json
import os

import gguf
import llama_cpp
import numpy as np

FIXTURES = os.path.join(os.path.dirname(__file__), "../../crates/models/tests/fixtures")
DEFAULT_MODEL = os.path.expanduser("~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3_270M = os.path.expanduser("~/.cache/tokenmill/models/gemma-3-270m-q4_k_m.gguf")
TOP = 8


def fnv1a(name: str) -> int:
    """32-bit FNV-1a of the tensor name: its seed."""
    h = 0x811C9DC5
    for byte in name.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def formula_weights(seed: int, count: int, scale: float, offset: float) -> np.ndarray:
    """`offset + scale * u` with `u` in [-1, 1] from an integer hash of (seed, index).

    The Rust twin (`formula_weights` in crates/models/tests/family_parity.rs) does the same
    u64 wrapping arithmetic and the same float32 operations in the same order."""
    mask = np.uint64(0xFFFFFFFF)
    x = np.arange(count, dtype=np.uint64) * np.uint64(0x9E3779B1)
    x = (x + np.uint64((seed * 0x85EBCA77 + 0x165667B1) & 0xFFFFFFFF)) & mask
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x2C1B3C6D)) & mask
    x ^= x >> np.uint64(12)
    x = (x * np.uint64(0x297A2D39)) & mask
    x ^= x >> np.uint64(15)
    u = ((x % np.uint64(20001)).astype(np.float32) - np.float32(10000.0)) / np.float32(10000.0)
    return u * np.float32(scale) + np.float32(offset)


def spec_qwen3(vocab: int) -> dict:
    hidden, heads, kv_heads, head_dim, ffn, layers = 64, 4, 2, 32, 128, 3
    meta = {
        "context_length": ("u32", 2048),
        "embedding_length": ("u32", hidden),
        "block_count": ("u32", layers),
        "feed_forward_length": ("u32", ffn),
        "attention.head_count": ("u32", heads),
        "attention.head_count_kv": ("u32", kv_heads),
        "attention.key_length": ("u32", head_dim),
        "attention.value_length": ("u32", head_dim),
        "attention.layer_norm_rms_epsilon": ("f32", 1e-6),
        "rope.freq_base": ("f32", 1000000.0),
    }
    tensors = [("token_embd.weight", [vocab, hidden], 0.5, 0.0)]
    for i in range(layers):
        tensors += layer_tensors(i, hidden, heads, kv_heads, head_dim, ffn, gemma=False)
    tensors += [
        ("output_norm.weight", [hidden], 0.2, 1.0),
        ("output.weight", [vocab, hidden], 0.5, 0.0),
    ]
    return {"arch": "qwen3", "meta": meta, "tensors": tensors}


def spec_gemma3(vocab: int) -> dict:
    hidden, heads, kv_heads, head_dim, ffn, layers = 64, 4, 1, 32, 128, 7
    meta = {
        "context_length": ("u32", 2048),
        "embedding_length": ("u32", hidden),
        "block_count": ("u32", layers),
        "feed_forward_length": ("u32", ffn),
        "attention.head_count": ("u32", heads),
        "attention.head_count_kv": ("u32", kv_heads),
        "attention.key_length": ("u32", head_dim),
        "attention.value_length": ("u32", head_dim),
        "attention.layer_norm_rms_epsilon": ("f32", 1e-6),
        "attention.sliding_window": ("u32", 16),
        "rope.freq_base": ("f32", 1000000.0),
        "rope.scaling.type": ("str", "linear"),
        "rope.scaling.factor": ("f32", 4.0),
    }
    tensors = [("token_embd.weight", [vocab, hidden], 0.15, 0.0)]
    for i in range(layers):
        tensors += layer_tensors(i, hidden, heads, kv_heads, head_dim, ffn, gemma=True)
    tensors += [("output_norm.weight", [hidden], 0.2, 1.0)]
    return {"arch": "gemma3", "meta": meta, "tensors": tensors}


def layer_tensors(i, hidden, heads, kv_heads, head_dim, ffn, gemma):
    """(name, shape outermost first, scale, offset) of block i; norms are offset 1."""
    p = f"blk.{i}."
    out = [
        (p + "attn_norm.weight", [hidden], 0.2, 1.0),
        (p + "attn_q.weight", [heads * head_dim, hidden], 0.2, 0.0),
        (p + "attn_k.weight", [kv_heads * head_dim, hidden], 0.2, 0.0),
        (p + "attn_v.weight", [kv_heads * head_dim, hidden], 0.2, 0.0),
        (p + "attn_q_norm.weight", [head_dim], 0.2, 1.0),
        (p + "attn_k_norm.weight", [head_dim], 0.2, 1.0),
        (p + "attn_output.weight", [hidden, heads * head_dim], 0.15, 0.0),
        (p + "ffn_norm.weight", [hidden], 0.2, 1.0),
        (p + "ffn_gate.weight", [ffn, hidden], 0.2, 0.0),
        (p + "ffn_up.weight", [ffn, hidden], 0.2, 0.0),
        (p + "ffn_down.weight", [hidden, ffn], 0.15, 0.0),
    ]
    if gemma:
        out += [
            (p + "post_attention_norm.weight", [hidden], 0.2, 1.0),
            (p + "post_ffw_norm.weight", [hidden], 0.2, 1.0),
        ]
    return out


def write_random_gguf(spec: dict, path: str) -> None:
    arch = spec["arch"]
    tokenizer = gguf.GGUFReader(DEFAULT_MODEL)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(spec.get("general_name", f"tokenmill random {arch}"))
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    for key, (kind, value) in spec["meta"].items():
        name = f"{arch}.{key}"
        if kind == "u32":
            writer.add_uint32(name, value)
        elif kind == "f32":
            writer.add_float32(name, value)
        else:
            writer.add_string(name, value)
    for name, field in tokenizer.fields.items():
        if name.startswith("tokenizer.") and name != "tokenizer.chat_template":
            main_type = field.types[0]
            sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), main_type, sub_type)
    for name, shape, scale, offset in spec["tensors"]:
        count = int(np.prod(shape))
        data = formula_weights(fnv1a(name), count, scale, offset).reshape(shape)
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def run_llama(model_path: str, prompts, new_tokens: int, n_ctx: int) -> list:
    llm = llama_cpp.Llama(
        model_path=model_path,
        n_ctx=n_ctx,
        n_threads=2,
        n_batch=n_ctx,
        logits_all=True,
        type_k=0,  # GGML_TYPE_F32
        type_v=0,
        verbose=False,
    )
    cases = []
    for text, prompt_ids in prompts:
        llm.reset()
        llm.eval(prompt_ids)
        generated, top_logits = [], []
        for _ in range(new_tokens):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            order = np.lexsort((np.arange(len(logits)), -logits))[:TOP]
            token = int(order[0])
            generated.append(token)
            top_logits.append([[int(i), float(logits[i])] for i in order])
            llm.eval([token])
        case = {
            "prompt_ids": [int(t) for t in prompt_ids],
            "greedy_ids": generated,
            "top_logits": top_logits,
        }
        if text is not None:
            case["text"] = text
            case["completion"] = llm.detokenize(generated).decode("utf-8", errors="replace")
        cases.append(case)
    return cases


def random_prompts(vocab: int):
    """Id sequences of 5, 23 and 40 tokens (two longer than the window)."""
    prompts = []
    for n, seed in [(5, 11), (23, 12), (40, 13)]:
        u = formula_weights(seed, n, 1.0, 0.0)
        ids = [int((float(v) + 1.0) / 2.0 * (vocab - 1)) for v in u]
        prompts.append((None, ids))
    return prompts


GEMMA_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "The three primary colors are",
    "Water boils at a temperature of",
    "import numpy as np\n\n# Compute the mean of a list\n",
    "The quick brown fox",
    "In machine learning, overfitting means",
]


def long_gemma_prompt() -> str:
    """A raw prompt over 512 tokens (the 270M model's sliding window)."""
    sentences = [
        "The history of the printing press begins in the fifteenth century.",
        "Johannes Gutenberg combined movable metal type with an oil-based ink.",
        "Books became cheaper, and literacy spread across European cities.",
        "Scholars exchanged ideas faster than ever before.",
        "Newspapers appeared in the seventeenth century and changed politics.",
    ]
    text = " ".join(sentences[i % len(sentences)] for i in range(60))
    return text + " In summary, the printing press"


def write_f32_copy(src: str, dst: str) -> None:
    """Writes `src` with every tensor dequantized to F32 and all metadata copied."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            writer.add_key_value(name, int(gguf.LlamaFileType.ALL_F32), field.types[0])
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), main_type, sub_type)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(int(n) for n in reversed(tensor.shape))
        writer.add_tensor(tensor.name, np.ascontiguousarray(data, dtype=np.float32).reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_fixture(name: str, fixture: dict) -> None:
    with open(os.path.join(FIXTURES, name), "w") as f:
        json.dump(fixture, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/tokenmill/reference"))
    parser.add_argument(
        "--gemma3-270m",
        action="store_true",
        help="also write family_gemma3_270m_f32.json from the real weights (F32 copy)",
    )
    args = parser.parse_args()
    os.makedirs(args.cache, exist_ok=True)
    vocab = len(gguf.GGUFReader(DEFAULT_MODEL).fields["tokenizer.ggml.tokens"].data)
    reference = f"llama-cpp-python {llama_cpp.__version__}, f32 KV cache, 2 threads"
    for spec in [spec_qwen3(vocab), spec_gemma3(vocab)]:
        path = os.path.join(args.cache, f"random-{spec['arch']}-f32.gguf")
        write_random_gguf(spec, path)
        cases = run_llama(path, random_prompts(vocab), 16, 256)
        fixture = {
            "reference": reference,
            "weights": "formula_weights(fnv1a(name), count, scale, offset), F32",
            "arch": spec["arch"],
            "meta": [[k, kind, value] for k, (kind, value) in spec["meta"].items()],
            "tensors": [
                {"name": n, "shape": s, "scale": sc, "offset": o} for n, s, sc, o in spec["tensors"]
            ],
            "cases": cases,
        }
        write_fixture(f"family_{spec['arch']}.json", fixture)
        print(spec["arch"], [c["greedy_ids"][:8] for c in cases])
    if args.gemma3_270m:
        f32_path = os.path.join(args.cache, "gemma-3-270m-q4_k_m.dequantized-F32.gguf")
        if not os.path.exists(f32_path):
            write_f32_copy(GEMMA3_270M, f32_path + ".tmp")
            os.replace(f32_path + ".tmp", f32_path)
        tokenizer = llama_cpp.Llama(model_path=f32_path, vocab_only=True, verbose=False)
        prompts = []
        for text in GEMMA_PROMPTS + [long_gemma_prompt()]:
            # BOS as llama.cpp adds it for Gemma (tokenizer.ggml.add_bos_token).
            prompts.append((text, tokenizer.tokenize(text.encode(), add_bos=True, special=False)))
        del tokenizer
        cases = run_llama(f32_path, prompts, 32, 1024)
        fixture = {
            "reference": reference + ", weights of gemma-3-270m-q4_k_m.gguf dequantized to F32",
            "model": "gemma-3-270m-q4_k_m.gguf",
            "cases": cases,
        }
        write_fixture("family_gemma3_270m_f32.json", fixture)
        for case in cases:
            print(repr(case["text"][:40]), len(case["prompt_ids"]), "->", repr(case["completion"][:60]))


if __name__ == "__main__":
    main()
