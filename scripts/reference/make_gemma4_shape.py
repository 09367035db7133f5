#!/usr/bin/env python3
"""Writes random-weight Gemma 4 GGUFs of E2B's and E4B's layer shapes with six layers, for
speed measurements (`tokenmill bench speed`, llama-bench) on the same file.

Each is a `Gemma4ForCausalLM` of the model's widths (E2B: hidden 1536, MLP 6144 doubled in
the KV-shared layers; E4B: hidden 2560, MLP 10240, 2 KV heads; both 8 query heads of 256 on
sliding layers and 512 on global ones, per-layer embeddings of 256, the 262,144-token
vocabulary, soft-capping at 30) with six layers (four sliding, two global, the last two
sharing KV) in transformers' own random initialisation, saved as BF16 and converted by
llama.cpp's `convert_hf_to_gguf.py --outtype q8_0` (a synthetic vocabulary in place of the
tokenizer: llama-bench and `bench speed` feed token ids). The shapes are the public configs'
as far as this script's author knew them; the output is noise, the arithmetic per token the
real layers'.

Run with the torch venv: `make_gemma4_shape.py --llama-cpp SRC --out DIR [--only e2b]`.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from make_gemma4_fixtures import convert_to_gguf  # noqa: E402

BASE = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "vocab_size": 262144,
    "vocab_size_per_layer_input": 262144,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "head_dim": 256,
    "global_head_dim": 512,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "sliding_window": 512,
    "layer_types": ["sliding_attention"] * 3
    + ["full_attention", "sliding_attention", "full_attention"],
    "final_logit_softcapping": 30.0,
    "hidden_size_per_layer_input": 256,
    "num_kv_shared_layers": 2,
    "attention_k_eq_v": False,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
        },
    },
}

SHAPES = {
    "gemma4-e2b-l6": {
        "hidden_size": 1536,
        "intermediate_size": 6144,
        "num_key_value_heads": 1,
        "use_double_wide_mlp": True,
    },
    "gemma4-e4b-l6": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_key_value_heads": 2,
        "use_double_wide_mlp": False,
    },
}


def main() -> None:
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-cpp", required=True, help="llama.cpp source tree")
    parser.add_argument("--out", required=True, help="directory for the HF dirs and GGUFs")
    parser.add_argument("--only", help="one shape's name")
    args = parser.parse_args()
    for name, shape in SHAPES.items():
        if args.only and args.only not in name:
            continue
        gguf_path = os.path.join(args.out, f"{name}.Q8_0.gguf")
        if os.path.exists(gguf_path):
            print(f"kept {gguf_path}")
            continue
        spec = dict(BASE, **shape)
        model_dir = os.path.join(args.out, name)
        config = Gemma4TextConfig(**{k: v for k, v in spec.items() if k != "architectures"})
        torch.manual_seed(0)
        model = Gemma4ForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(model_dir, safe_serialization=True)
        del model
        vocab = {f"<t{i}>": i for i in range(spec["vocab_size"])}
        with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
            json.dump({"model": {"vocab": vocab}, "added_tokens": []}, f)
        convert_to_gguf(args.llama_cpp, model_dir, gguf_path, spec["vocab_size"], "q8_0")
        print(f"wrote {gguf_path}")


if __name__ == "__main__":
    main()
