#!/usr/bin/env python3
"""Writes a random-weight GGUF of gpt-oss-20b's layer shapes with few layers, for speed
measurements (`tokenmill bench speed`, llama-bench) on the same file.

gpt-oss-20b's widths: hidden 2880, 64 query heads of 64 and 8 KV heads (Q/K/V/O biases, a sink
per head), sliding (128) and full layers alternating, YaRN 32x over 4,096 positions, 32 experts
of 2880 (4 per token, router and expert biases), the 201,088-token vocabulary, an untied head.
The experts are MXFP4 (random codes, E8M0 scales 2^-9..2^-6: the released files' type), the
other matrices Q8_0 (random int8 under a fixed scale: about what the released GGUF's non-expert
tensors cost per weight), norms and biases F32. Nothing is converted: the tensors are written
in GGUF's layout with llama.cpp's gguf-py (`--llama-cpp SRC`: the sources vendored in the
llama-cpp-python 0.3.36 sdist), as llama.cpp's converter names them. The output is noise; the
arithmetic and bytes per token are the real layers'.

Usage: make_gptoss_shape.py --llama-cpp SRC --out FILE [--layers 4]
"""

import argparse
import os
import sys

import numpy as np

VOCAB = 201088
HIDDEN = 2880
HEADS, KV_HEADS, HEAD_DIM = 64, 8, 64
EXPERTS, USED, WIDTH = 32, 4, 2880


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-cpp", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(args.llama_cpp, "gguf-py"))
    import gguf

    rng = np.random.default_rng(7)
    arch = "gpt-oss"
    writer = gguf.GGUFWriter(args.out, arch)
    writer.add_block_count(args.layers)
    writer.add_context_length(131072)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(WIDTH)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(150000.0)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(32.0)
    writer.add_rope_scaling_orig_ctx_len(4096)
    writer.add_rope_scaling_yarn_beta_fast(32.0)
    writer.add_rope_scaling_yarn_beta_slow(1.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_expert_count(EXPERTS)
    writer.add_expert_used_count(USED)
    writer.add_expert_feed_forward_length(WIDTH)
    writer.add_sliding_window(128)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    # A synthetic byte-level vocabulary (llama-bench and `bench speed` feed ids).
    tokens = [f"<t{i}>" for i in range(VOCAB)]
    tokens[0], tokens[1], tokens[2] = "Ġ", "ĠĠ", "a"
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * VOCAB)
    writer.add_token_merges(["Ġ Ġ"])
    writer.add_eos_token_id(2)

    def q8_0(rows: int, columns: int) -> np.ndarray:
        blocks = rows * columns // 32
        scale = np.full((blocks, 1), np.float16(2.0 ** -10)).view(np.uint8)
        quants = rng.integers(-127, 128, size=(blocks, 32), dtype=np.int8).view(np.uint8)
        return np.concatenate([scale, quants], axis=1).reshape(rows, columns // 32 * 34)

    def mxfp4(experts: int, rows: int, columns: int) -> np.ndarray:
        blocks = experts * rows * columns // 32
        scales = rng.integers(119, 123, size=(blocks, 1), dtype=np.uint8)
        codes = rng.integers(0, 256, size=(blocks, 16), dtype=np.uint8)
        return np.concatenate([scales, codes], axis=1).reshape(experts, rows, columns // 32 * 17)

    def small(*shape: int, scale: float = 0.02, offset: float = 0.0) -> np.ndarray:
        return (rng.standard_normal(shape).astype(np.float32) * scale + offset).astype(np.float32)

    Q8, MX = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.MXFP4
    writer.add_tensor("token_embd.weight", q8_0(VOCAB, HIDDEN), raw_dtype=Q8)
    for layer in range(args.layers):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", small(HIDDEN, scale=0.0, offset=1.0))
        writer.add_tensor(p + "post_attention_norm.weight", small(HIDDEN, scale=0.0, offset=1.0))
        for name, rows in (("attn_q", HEADS * HEAD_DIM), ("attn_k", KV_HEADS * HEAD_DIM), ("attn_v", KV_HEADS * HEAD_DIM)):
            writer.add_tensor(p + name + ".weight", q8_0(rows, HIDDEN), raw_dtype=Q8)
            writer.add_tensor(p + name + ".bias", small(rows))
        writer.add_tensor(p + "attn_output.weight", q8_0(HIDDEN, HEADS * HEAD_DIM), raw_dtype=Q8)
        writer.add_tensor(p + "attn_output.bias", small(HIDDEN))
        writer.add_tensor(p + "attn_sinks.weight", small(HEADS, scale=1.0))
        writer.add_tensor(p + "ffn_gate_inp.weight", small(EXPERTS, HIDDEN))
        writer.add_tensor(p + "ffn_gate_inp.bias", small(EXPERTS))
        writer.add_tensor(p + "ffn_gate_exps.weight", mxfp4(EXPERTS, WIDTH, HIDDEN), raw_dtype=MX)
        writer.add_tensor(p + "ffn_up_exps.weight", mxfp4(EXPERTS, WIDTH, HIDDEN), raw_dtype=MX)
        writer.add_tensor(p + "ffn_down_exps.weight", mxfp4(EXPERTS, HIDDEN, WIDTH), raw_dtype=MX)
        writer.add_tensor(p + "ffn_gate_exps.bias", small(EXPERTS, WIDTH))
        writer.add_tensor(p + "ffn_up_exps.bias", small(EXPERTS, WIDTH))
        writer.add_tensor(p + "ffn_down_exps.bias", small(EXPERTS, HIDDEN))
    writer.add_tensor("output_norm.weight", small(HIDDEN, scale=0.0, offset=1.0))
    writer.add_tensor("output.weight", q8_0(VOCAB, HIDDEN), raw_dtype=Q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(args.out)


if __name__ == "__main__":
    main()
