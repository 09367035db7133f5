#!/usr/bin/env python3
"""Writes crates/models/tests/fixtures/gemma4_*.json: random-weight Gemma 4 text checkpoints'
specs and two references' greedy ids and top logits on them.

Each spec is a `Gemma4ForCausalLM` config of a real shape with few layers and a small
vocabulary: `gemma4_e2b_like` has E2B's heads (8 x 256 sliding, 512-wide global heads, one KV
head), per-layer embeddings, KV-shared last layers and their double-wide MLPs;
`gemma4_31b_like` has the 31B's kind of global layer (V from K's projection, fewer KV heads
than the sliding layers) and no per-layer embeddings; `gemma4_26b_a4b_like` adds the
26B-A4B's routed experts (8 of 128, 2 per token) beside each layer's MLP. Weights are formula weights (the twin
of `formula_weights` in crates/models/tests/common/family.rs), so the Rust tests rebuild the
checkpoints without Python:

- transformers 5.25 (F32, eager, no cache: the whole sequence each step) runs the HF
  directory `save_pretrained` wrote;
- llama.cpp (llama-cpp-python 0.3.36, vendored llama.cpp 0c1e570, f32 KV cache, 2 threads)
  runs the GGUF its own `convert_hf_to_gguf.py --outtype f32` made of that directory (a
  synthetic 512-token vocabulary in place of a tokenizer: prompts are ids).

Run as `make_qwen35_fixtures.py` is run (same venvs and arguments); it reuses that script's
formula, vocabulary and llama.cpp runner.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

os.environ["USE_HUB_KERNELS"] = "0"
sys.path.insert(0, os.path.dirname(__file__))
from make_qwen35_fixtures import (  # noqa: E402
    fnv1a,
    formula_weights,
    random_prompts,
    run_llama,
    run_transformers_with,
    synthetic_vocab,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "../../crates/models/tests/fixtures")


def e2b_like() -> dict:
    """E2B's attention (8 heads of 256 on sliding layers, 512 on global ones, one KV head,
    proportional RoPE on a quarter of the global pairs), per-layer embeddings of 256, the last
    two layers sharing KV with double-wide MLPs; hidden 512, six layers, 512 tokens."""
    return {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": 512,
        "vocab_size_per_layer_input": 512,
        "hidden_size": 512,
        "intermediate_size": 768,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "global_head_dim": 512,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "sliding_window": 16,
        "layer_types": ["sliding_attention"] * 3
        + ["full_attention", "sliding_attention", "full_attention"],
        "final_logit_softcapping": 30.0,
        "hidden_size_per_layer_input": 256,
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "attention_k_eq_v": False,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
            },
        },
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 1,
    }


def k_eq_v_like() -> dict:
    """The 31B's global layers (V from K's projection, 2 KV heads of 512 against the sliding
    layers' 4 of 256), no per-layer embeddings, no KV sharing; four layers."""
    spec = e2b_like()
    spec.update(
        {
            "num_hidden_layers": 4,
            "num_key_value_heads": 4,
            "num_global_key_value_heads": 2,
            "attention_k_eq_v": True,
            "hidden_size_per_layer_input": 0,
            "num_kv_shared_layers": 0,
            "use_double_wide_mlp": False,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
        }
    )
    return spec


def moe_like() -> dict:
    """The 26B-A4B's kind of layer: the 31B-like attention (V from K's projection on the
    global layers) and, beside each layer's dense MLP (the shared expert, 256 wide), 8 routed
    experts of 128, 2 per token; four layers, no per-layer embeddings."""
    spec = k_eq_v_like()
    spec.update(
        {
            "intermediate_size": 256,
            "enable_moe_block": True,
            "num_experts": 8,
            "top_k_experts": 2,
            "moe_intermediate_size": 128,
        }
    )
    return spec


SPECS = {
    "gemma4_e2b_like": e2b_like,
    "gemma4_31b_like": k_eq_v_like,
    "gemma4_26b_a4b_like": moe_like,
}


def scale_and_offset(name: str, shape) -> tuple:
    """Plain norms near 1, the layer scalars and the router's scales near 1, matrices of unit
    output variance, a small embedding, router scores of O(1) spread."""
    if re.search(r"norm(_\d)?\.weight$", name) or name.endswith("router.scale"):
        return 0.1, 1.0
    if name.endswith("layer_scalar") or name.endswith("per_expert_scale"):
        return 0.2, 1.0
    if name.endswith("router.proj.weight"):
        # The router reads a normed input scaled by hidden^-0.5: at unit output variance its
        # scores would be nearly equal and the top-k a matter of rounding; at about 2.3 they
        # separate, so both references pick the same experts.
        return 4.0, 0.0
    if name.endswith("embed_tokens.weight"):
        # The tied head's logits would saturate E2B's soft cap (30) at unit scale.
        return 0.25, 0.0
    if name.endswith("embed_tokens_per_layer.weight"):
        return 1.0, 0.0
    fan_in = shape[-1]
    return float(np.sqrt(3.0 / fan_in)), 0.0


def make_checkpoint(spec: dict, out_dir: str) -> list:
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(**{k: v for k, v in spec.items() if k != "architectures"})
    model = Gemma4ForCausalLM(config).to(torch.float32)
    tensors = []
    with torch.no_grad():
        named = list(model.named_parameters()) + [
            (n, b) for n, b in model.named_buffers() if n.endswith("layer_scalar")
        ]
        for name, param in named:
            scale, offset = scale_and_offset(name, list(param.shape))
            values = formula_weights(fnv1a(name), param.numel(), scale, offset)
            param.copy_(torch.from_numpy(values).reshape(param.shape))
            tensors.append(
                {"name": name, "shape": list(param.shape), "scale": scale, "offset": offset}
            )
    model.save_pretrained(out_dir, safe_serialization=True)
    # A tokenizer.json only so the converter can count the vocabulary.
    vocab = {f"<t{i}>": i for i in range(spec["vocab_size"])}
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump({"model": {"vocab": vocab}, "added_tokens": []}, f)
    return tensors


def convert_to_gguf(
    llama_cpp_dir: str, model_dir: str, out_path: str, vocab: int, outtype: str = "f32"
) -> None:
    sys.path.insert(0, llama_cpp_dir)
    sys.path.insert(0, os.path.join(llama_cpp_dir, "gguf-py"))
    import convert_hf_to_gguf
    from conversion import gemma

    def set_vocab(self):
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("default")
        self.gguf_writer.add_token_list(synthetic_vocab(vocab))
        self.gguf_writer.add_token_types([1] * vocab)
        self.gguf_writer.add_token_merges(["Ġ Ġ"])
        self.gguf_writer.add_add_bos_token(False)

    gemma.Gemma4Model.set_vocab = set_vocab
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outtype", outtype, "--outfile", out_path]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python 0.3.36")
    parser.add_argument("--llama-cpp", help="llama.cpp source tree (convert_hf_to_gguf.py)")
    parser.add_argument("--work", default=None, help="where to keep the checkpoints")
    parser.add_argument("--only", help="one spec's name")
    parser.add_argument("--stage", choices=["all", "transformers", "llama"], default="all")
    args = parser.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="gemma4-fixtures-")
    for index, (name, make_spec) in enumerate(SPECS.items()):
        if args.only and name != args.only:
            continue
        spec = make_spec()
        model_dir = os.path.join(work, name)
        path = os.path.join(FIXTURES, f"{name}.json")
        if args.stage in ("all", "transformers"):
            import torch
            import transformers
            from transformers import Gemma4ForCausalLM

            os.makedirs(model_dir, exist_ok=True)
            tensors = make_checkpoint(spec, model_dir)
            prompts = random_prompts(spec["vocab_size"], 47 + index)
            fixture = {
                "reference": {
                    "transformers": f"transformers {transformers.__version__}, torch "
                    f"{torch.__version__}, F32, eager attention, no cache",
                },
                "weights": "formula_weights(fnv1a(hf_name), count, scale, offset), F32",
                "config": spec,
                "tensors": tensors,
                "transformers": run_transformers_with(Gemma4ForCausalLM, model_dir, prompts),
                "llama_cpp": [],
            }
        else:
            with open(path) as f:
                fixture = json.load(f)
        if args.stage in ("all", "llama"):
            gguf_path = os.path.join(work, f"{name}.gguf")
            convert_to_gguf(args.llama_cpp, model_dir, gguf_path, spec["vocab_size"])
            prompts_path = os.path.join(work, f"{name}.prompts.json")
            with open(prompts_path, "w") as f:
                json.dump([case["prompt_ids"] for case in fixture["transformers"]], f)
            runner = os.path.join(os.path.dirname(__file__), "make_qwen35_fixtures.py")
            out = subprocess.run(
                [args.llama_python, runner, "--run-llama", gguf_path, prompts_path],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            llama = json.loads(out)
            fixture["reference"]["llama_cpp"] = (
                llama["reference"] + ", GGUF from its convert_hf_to_gguf.py --outtype f32"
            )
            fixture["llama_cpp"] = llama["cases"]
        with open(path, "w") as f:
            json.dump(fixture, f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
