#!/usr/bin/env python3
"""Writes random-weight GGUFs of real model shapes for speed measurements (tokenmill bench speed,
llama-bench), so a large model's kernels can be timed without downloading it.

Tensor names, shapes and `llama.*` metadata are those of the real model (Llama-3.2-1B: hidden
2048, 16 layers, 32 query / 8 KV heads of 64, FFN 8192, vocab 128256, tied embeddings;
Llama-3.2-3B; Llama-3.1-8B with its own output matrix; their llama3 RoPE scaling is left out,
which changes no kernel's cost; `qwen3-30b-a3b-l4` is four of Qwen3-30B-A3B's 48 `qwen3moe`
layers: head_dim 128 with QK-norm, 128 experts of 768, eight per token, so a token's cost is the
real model's per layer; its F16 file is 6.2 GB, the Q4_K_M made from it 1.95 GB, so delete the F16
intermediate when only the K-quant is wanted). Weights are normal with std 0.02, norms are 1; tensors are
generated and written one at a time, so memory stays at about one tensor. The tokenizer is the default model's (SmolLM2's GPT-2 BPE with its chat
template), its token list padded with unused `<|reserved_N|>` tokens up to the vocabulary size
(or the vocabulary is that size when `--vocab` is smaller than SmolLM2's 49152), so both
tokenmill and llama.cpp load the files. The output is gibberish; the arithmetic per token is
the real model's.

F16, Q8_0 and Q4_0 are written here with gguf-py (every 2-D weight in that type, 1-D norms F32,
as llama.cpp's converter does); any llama.cpp K-quant mix (e.g. Q4_K_M) is made from the F16
file by llama.cpp's own `llama-quantize` (built by bench/common.sh's ensure_llamacpp_native), so
its tensor-type choices are exactly llama.cpp's; `--kquant-source Q4_0` makes them from a Q4_0 file
instead (`--allow-requantize`), for shapes whose F16 file does not fit the disk (Llama-3.1-8B:
16 GB F16 against 4.7 GB Q4_0).

Files go to a git-ignored cache, `.cache/shapes/<shape>-v<vocab>.<TYPE>.gguf`; existing files
are kept. Run with the pinned gguf-py, e.g.:
    /work/cache/refvenv/bin/python scripts/reference/make_shape_gguf.py \\
        --types F16 Q8_0 Q4_0 Q4_K_M
    /work/cache/refvenv/bin/python scripts/reference/make_shape_gguf.py --vocab 32000 --types Q4_K_M
"""

import argparse
import os
import subprocess

import gguf
import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
DEFAULT_TOKENIZER = os.path.expanduser(
    "~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf"
)
DEFAULT_QUANTIZE = os.path.join(
    ROOT, ".cache/bench/llamacpp-native-0.3.16/build/bin/llama-quantize"
)

SHAPES = {
    "llama-3.2-1b": {
        "hidden": 2048,
        "layers": 16,
        "heads": 32,
        "kv_heads": 8,
        "ffn": 8192,
        "vocab": 128256,
        "context": 131072,
        "rope_base": 500000.0,
        "rms_eps": 1e-5,
        "tied": True,
    },
    "llama-3.2-3b": {
        "hidden": 3072,
        "layers": 28,
        "heads": 24,
        "kv_heads": 8,
        "ffn": 8192,
        "vocab": 128256,
        "context": 131072,
        "rope_base": 500000.0,
        "rms_eps": 1e-5,
        "tied": True,
    },
    "llama-3.1-8b": {
        "hidden": 4096,
        "layers": 32,
        "heads": 32,
        "kv_heads": 8,
        "ffn": 14336,
        "vocab": 128256,
        "context": 131072,
        "rope_base": 500000.0,
        "rms_eps": 1e-5,
        "tied": False,
    },
    "qwen3-30b-a3b-l4": {
        "arch": "qwen3moe",
        "hidden": 2048,
        "layers": 4,
        "heads": 32,
        "kv_heads": 4,
        "head_dim": 128,
        "ffn": 6144,
        "experts": 128,
        "experts_used": 8,
        "expert_ffn": 768,
        "vocab": 151936,
        "context": 40960,
        "rope_base": 1000000.0,
        "rms_eps": 1e-6,
        "tied": False,
    },
}

# Written here; anything else is a llama-quantize type name made from the F16 file.
DIRECT_TYPES = {
    "F16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}

# Tokenizer fields copied from the donor file, besides tokens and token types.
TOKENIZER_KEYS = [
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
]
UNUSED_TOKEN = 5  # llama.cpp LLAMA_TOKEN_TYPE_UNUSED


def copy_tokenizer(writer: gguf.GGUFWriter, donor_path: str, vocab: int) -> None:
    """Copies the donor's tokenizer, its token list cut or padded to `vocab` entries."""
    donor = gguf.GGUFReader(donor_path)
    tokens = list(donor.fields["tokenizer.ggml.tokens"].contents())
    types = list(donor.fields["tokenizer.ggml.token_type"].contents())
    if vocab < len(tokens):
        tokens, types = tokens[:vocab], types[:vocab]
    tokens += [f"<|reserved_{i}|>" for i in range(len(tokens), vocab)]
    types += [UNUSED_TOKEN] * (vocab - len(types))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    for key in TOKENIZER_KEYS:
        field = donor.fields.get(key)
        if field is None:
            continue
        value = field.contents()
        if key == "tokenizer.ggml.merges" and vocab < len(donor.fields["tokenizer.ggml.tokens"].data):
            # A merge whose result was cut from the vocabulary would name a missing token.
            kept = set(tokens)
            value = [m for m in value if m.replace(" ", "", 1) in kept]
        if key.endswith("_token_id") and value >= vocab:
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, main_type, sub_type)


def tensors(shape: dict, vocab: int):
    """(name, numpy shape) of every tensor, in llama.cpp's converter's order."""
    hidden, ffn = shape["hidden"], shape["ffn"]
    head_dim = shape.get("head_dim", hidden // shape["heads"])
    q, kv = shape["heads"] * head_dim, shape["kv_heads"] * head_dim
    yield "token_embd.weight", (vocab, hidden)
    for layer in range(shape["layers"]):
        block = f"blk.{layer}"
        yield f"{block}.attn_norm.weight", (hidden,)
        yield f"{block}.attn_q.weight", (q, hidden)
        yield f"{block}.attn_k.weight", (kv, hidden)
        yield f"{block}.attn_v.weight", (kv, hidden)
        yield f"{block}.attn_output.weight", (hidden, q)
        if shape.get("arch") == "qwen3moe":
            yield f"{block}.attn_q_norm.weight", (head_dim,)
            yield f"{block}.attn_k_norm.weight", (head_dim,)
        yield f"{block}.ffn_norm.weight", (hidden,)
        if "experts" in shape:
            experts, width = shape["experts"], shape["expert_ffn"]
            yield f"{block}.ffn_gate_inp.weight", (experts, hidden)
            yield f"{block}.ffn_gate_exps.weight", (experts, width, hidden)
            yield f"{block}.ffn_up_exps.weight", (experts, width, hidden)
            yield f"{block}.ffn_down_exps.weight", (experts, hidden, width)
            continue
        yield f"{block}.ffn_gate.weight", (ffn, hidden)
        yield f"{block}.ffn_up.weight", (ffn, hidden)
        yield f"{block}.ffn_down.weight", (hidden, ffn)
    yield "output_norm.weight", (hidden,)
    if not shape["tied"]:
        yield "output.weight", (vocab, hidden)


def keeps_f32(tensor_name: str, dims) -> bool:
    """Norms and MoE routers stay F32, as llama.cpp's converter and quantizer keep them."""
    return len(dims) == 1 or tensor_name.endswith("ffn_gate_inp.weight")


def write_direct(path: str, name: str, shape: dict, vocab: int, type_name: str, args) -> None:
    qtype, file_type = DIRECT_TYPES[type_name]
    head_dim = shape.get("head_dim", shape["hidden"] // shape["heads"])
    writer = gguf.GGUFWriter(path + ".tmp", shape.get("arch", "llama"))
    writer.add_name(f"random {name} shape")
    writer.add_block_count(shape["layers"])
    writer.add_context_length(shape["context"])
    writer.add_embedding_length(shape["hidden"])
    writer.add_feed_forward_length(shape["ffn"])
    writer.add_head_count(shape["heads"])
    writer.add_head_count_kv(shape["kv_heads"])
    writer.add_rope_freq_base(shape["rope_base"])
    writer.add_layer_norm_rms_eps(shape["rms_eps"])
    writer.add_rope_dimension_count(head_dim)
    if "head_dim" in shape:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if "experts" in shape:
        writer.add_expert_count(shape["experts"])
        writer.add_expert_used_count(shape["experts_used"])
        writer.add_expert_feed_forward_length(shape["expert_ffn"])
    writer.add_vocab_size(vocab)
    writer.add_file_type(int(file_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    copy_tokenizer(writer, args.tokenizer_from, vocab)
    # Tensor infos first (shapes and sizes are known up front), then the data one tensor at
    # a time: an 8B F16 file never sits in memory whole.
    layout = list(tensors(shape, vocab))
    for tensor_name, dims in layout:
        count = int(np.prod(dims))
        if keeps_f32(tensor_name, dims):
            writer.add_tensor_info(tensor_name, dims, np.dtype(np.float32), 4 * count)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor_info(tensor_name, dims, np.dtype(np.float16), 2 * count)
        else:
            byte_shape = gguf.quants.quant_shape_to_byte_shape(dims, qtype)
            nbytes = int(np.prod(byte_shape))
            writer.add_tensor_info(tensor_name, byte_shape, np.dtype(np.uint8), nbytes, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(args.seed)
    for tensor_name, dims in layout:
        if len(dims) == 1:
            writer.write_tensor_data(np.ones(dims, dtype=np.float32))
            continue
        values = rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)
        if keeps_f32(tensor_name, dims):
            writer.write_tensor_data(values)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.write_tensor_data(values.astype(np.float16))
        else:
            writer.write_tensor_data(gguf.quants.quantize(values, qtype))
        del values
    writer.close()
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    parser.add_argument("--vocab", type=int, help="vocabulary size (default: the model's)")
    parser.add_argument(
        "--types",
        nargs="+",
        default=["F16", "Q8_0", "Q4_0", "Q4_K_M"],
        help="F16/Q8_0/Q4_0 written directly; others (Q4_K_M, Q6_K, ...) by llama-quantize",
    )
    parser.add_argument("--out-dir", default=os.path.join(ROOT, ".cache/shapes"))
    parser.add_argument("--tokenizer-from", default=DEFAULT_TOKENIZER)
    parser.add_argument("--llama-quantize", default=DEFAULT_QUANTIZE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kquant-source",
        choices=["F16", "Q8_0", "Q4_0"],
        default="F16",
        help="direct type llama-quantize reads for the other types (with --allow-requantize "
        "unless F16): Q4_0 needs a quarter of F16's disk (an 8B F16 file is 16 GB); the "
        "tensor-type mix is llama-quantize's either way, only the random values differ",
    )
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    vocab = args.vocab or shape["vocab"]
    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, f"{args.shape}-v{vocab}")
    wanted = [t.upper() for t in args.types]
    source = args.kquant_source
    needs_source = any(t not in DIRECT_TYPES for t in wanted)
    for type_name in [t for t in DIRECT_TYPES if t in wanted or (t == source and needs_source)]:
        path = f"{stem}.{type_name}.gguf"
        if not os.path.exists(path):
            print(f"writing {path}", flush=True)
            write_direct(path, args.shape, shape, vocab, type_name, args)
    for type_name in [t for t in wanted if t not in DIRECT_TYPES]:
        path = f"{stem}.{type_name}.gguf"
        if os.path.exists(path):
            continue
        if not os.access(args.llama_quantize, os.X_OK):
            raise SystemExit(
                f"no llama-quantize at {args.llama_quantize}: source bench/common.sh and run "
                "ensure_llamacpp_native .cache/bench, or pass --llama-quantize"
            )
        print(f"writing {path} (llama-quantize)", flush=True)
        requantize = [] if source == "F16" else ["--allow-requantize"]
        subprocess.run(
            [args.llama_quantize, *requantize, f"{stem}.{source}.gguf", path + ".tmp", type_name, "2"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        os.replace(path + ".tmp", path)
    for type_name in wanted:
        print(f"{stem}.{type_name}.gguf")


if __name__ == "__main__":
    main()
