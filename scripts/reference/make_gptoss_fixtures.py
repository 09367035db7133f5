#!/usr/bin/env python3
"""Writes crates/models/tests/fixtures/gptoss_*.json: a random-weight gpt-oss checkpoint's spec
and two references' greedy ids and top logits on it.

`gptoss_20b_like` is a `GptOssForCausalLM` config with gpt-oss-20b's attention (64 query heads
of 64, 8 KV heads, biases, a learned sink per head, sliding and full layers alternating, YaRN
32x over 4,096 positions untruncated, base 150,000) and its routing (32 experts, 4 per token,
router and expert biases, the clamped SwiGLU), at hidden 512, experts 256 wide, four layers,
a sliding window of 16 (gpt-oss's is 128: 16 makes the 48-token runs cross it) and 512 tokens.

The experts are **MXFP4**: their values are E2M1 levels times a power-of-two scale per 32
inputs, drawn from an integer formula (`mxfp4_codes`, twin of the Rust test's), so transformers
runs exactly the values the GGUF's MXFP4 blocks hold. Every other weight is a formula weight
(`formula_weights`, as for the other families). So the Rust tests rebuild both without Python:

- transformers 5.25 (F32, eager, no cache) runs the HF directory `save_pretrained` wrote;
- llama.cpp (llama-cpp-python 0.3.36, vendored llama.cpp 0c1e570, f32 KV cache, 2 threads)
  runs the GGUF its own `convert_hf_to_gguf.py --outtype f32` made of that directory, with the
  expert tensors then rewritten as MXFP4 blocks of the same values (gguf-py; the converter
  keeps unquantized HF experts at the out type) and a synthetic 512-token vocabulary.

Run as `make_qwen35_fixtures.py` is run (same venvs and arguments).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

os.environ["USE_HUB_KERNELS"] = "0"
sys.path.insert(0, os.path.dirname(__file__))
from make_qwen35_fixtures import (  # noqa: E402
    fnv1a,
    formula_hash,
    formula_weights,
    random_prompts,
    synthetic_vocab,
)
from make_qwen35_fixtures import run_transformers_with  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "../../crates/models/tests/fixtures")

# 2 x E2M1: ggml's `kvalues_mxfp4`.
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


def gptoss_20b_like() -> dict:
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": 512,
        "hidden_size": 512,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "swiglu_limit": 7.0,
        "hidden_act": "silu",
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
            "rope_theta": 150000.0,
        },
        "pad_token_id": 0,
        "eos_token_id": 1,
    }


SPECS = {"gptoss_20b_like": gptoss_20b_like}


def mxfp4_codes(gguf_name: str, shape, e_base: int):
    """An MXFP4 tensor of GGUF layout `shape` (`[experts, rows, columns]`, blocks of 32 along
    the columns): each element's 4-bit code is `hash % 16`, each block's E8M0 scale
    `e_base + hash' % 2` (the seed's second hash is of the name's FNV-1a xor 0xA5A5A5A5).
    Returns (codes, scales, values)."""
    count = int(np.prod(shape))
    seed = fnv1a(gguf_name)
    codes = (formula_hash(seed, count) % np.uint64(16)).astype(np.uint8)
    scales = (np.uint64(e_base) + formula_hash(seed ^ 0xA5A5A5A5, count // 32) % np.uint64(2)).astype(np.uint8)
    # 2^(e - 128), exact in f32 for these exponents.
    half = np.ldexp(np.float32(1.0), scales.astype(np.int32) - 128).astype(np.float32)
    values = KVALUES[codes].reshape(-1, 32) * half[:, None]
    return codes, scales, values.reshape(shape).astype(np.float32)


def mxfp4_bytes(codes: np.ndarray, scales: np.ndarray, shape) -> np.ndarray:
    """GGUF MXFP4 blocks (`e`, then 16 bytes: element j's code low, element j + 16's high)."""
    blocks = codes.reshape(-1, 32)
    packed = blocks[:, :16] | (blocks[:, 16:] << 4)
    data = np.concatenate([scales[:, None], packed], axis=1).astype(np.uint8)
    experts, rows, columns = shape
    return data.reshape(experts, rows, columns // 32 * 17)


def expert_tensors(spec: dict):
    """Per layer, the GGUF-layout MXFP4 experts: name -> (shape, e_base)."""
    e, h, i = spec["num_local_experts"], spec["hidden_size"], spec["intermediate_size"]
    out = {}
    for layer in range(spec["num_hidden_layers"]):
        out[f"blk.{layer}.ffn_gate_exps.weight"] = ([e, i, h], 121)
        out[f"blk.{layer}.ffn_up_exps.weight"] = ([e, i, h], 121)
        out[f"blk.{layer}.ffn_down_exps.weight"] = ([e, h, i], 121)
    return out


def scale_and_offset(name: str, shape) -> tuple:
    """Norms near 1 (gpt-oss multiplies by the weight itself), sinks and biases of O(1) and
    O(0.1), matrices of unit output variance, a router twice that (decisive picks)."""
    if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
        return 0.1, 1.0
    if name.endswith("sinks"):
        return 1.5, 0.0
    if name.endswith("bias"):
        return 0.1, 0.0
    if name.endswith("embed_tokens.weight"):
        return 1.0, 0.0
    fan_in = shape[-1]
    if name.endswith("router.weight"):
        return float(2.0 * np.sqrt(3.0 / fan_in)), 0.0
    return float(np.sqrt(3.0 / fan_in)), 0.0


def make_checkpoint(spec: dict, out_dir: str) -> list:
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(**{k: v for k, v in spec.items() if k != "architectures"})
    model = GptOssForCausalLM(config).to(torch.float32)
    experts = expert_tensors(spec)
    tensors = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                layer = name.split(".")[2]
                if name.endswith("gate_up_proj"):
                    gate_name = f"blk.{layer}.ffn_gate_exps.weight"
                    up_name = f"blk.{layer}.ffn_up_exps.weight"
                    _, _, gate = mxfp4_codes(gate_name, *experts[gate_name])
                    _, _, up = mxfp4_codes(up_name, *experts[up_name])
                    # HF: x @ W with W [experts, hidden, 2 * width], gate and up interleaved.
                    both = np.empty(param.shape, dtype=np.float32)
                    both[:, :, 0::2] = gate.transpose(0, 2, 1)
                    both[:, :, 1::2] = up.transpose(0, 2, 1)
                    param.copy_(torch.from_numpy(both))
                    for gguf_name in (gate_name, up_name):
                        shape, e_base = experts[gguf_name]
                        tensors.append({"name": gguf_name, "shape": shape, "scale": 0.0,
                                        "offset": 0.0, "mxfp4_e_base": e_base})
                else:
                    down_name = f"blk.{layer}.ffn_down_exps.weight"
                    shape, e_base = experts[down_name]
                    _, _, down = mxfp4_codes(down_name, shape, e_base)
                    param.copy_(torch.from_numpy(down.transpose(0, 2, 1).copy()))
                    tensors.append({"name": down_name, "shape": shape, "scale": 0.0,
                                    "offset": 0.0, "mxfp4_e_base": e_base})
                continue
            scale, offset = scale_and_offset(name, list(param.shape))
            values = formula_weights(fnv1a(name), param.numel(), scale, offset)
            param.copy_(torch.from_numpy(values).reshape(param.shape))
            tensors.append(
                {"name": name, "shape": list(param.shape), "scale": scale, "offset": offset}
            )
    model.save_pretrained(out_dir, safe_serialization=True)
    vocab = {f"<t{i}>": i for i in range(spec["vocab_size"])}
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump({"model": {"vocab": vocab}, "added_tokens": []}, f)
    return tensors


def convert_to_gguf(llama_cpp_dir: str, model_dir: str, out_path: str, spec: dict) -> None:
    """The converter's F32 GGUF, then its expert tensors as MXFP4 blocks of the same values."""
    sys.path.insert(0, llama_cpp_dir)
    sys.path.insert(0, os.path.join(llama_cpp_dir, "gguf-py"))
    import convert_hf_to_gguf
    import gguf
    from conversion import gpt_oss
    from gguf_copy import write_converted_copy

    vocab = spec["vocab_size"]

    def set_vocab(self):
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("default")
        self.gguf_writer.add_token_list(synthetic_vocab(vocab))
        self.gguf_writer.add_token_types([1] * vocab)
        self.gguf_writer.add_token_merges(["Ġ Ġ"])
        self.gguf_writer.add_add_bos_token(False)

    gpt_oss.GptOssModel.set_vocab = set_vocab
    f32_path = out_path + ".f32"
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outtype", "f32", "--outfile", f32_path]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv
    experts = expert_tensors(spec)

    def add_tensor(writer, name, values, _tensor):
        if name in experts:
            shape, e_base = experts[name]
            codes, scales, exact = mxfp4_codes(name, shape, e_base)
            assert np.array_equal(values, exact), f"{name}: converter changed the values"
            writer.add_tensor(name, mxfp4_bytes(codes, scales, shape),
                              raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            writer.add_tensor(name, values)

    write_converted_copy(f32_path, out_path, 0, add_tensor)
    os.remove(f32_path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python 0.3.36")
    parser.add_argument("--llama-cpp", help="llama.cpp source tree (convert_hf_to_gguf.py)")
    parser.add_argument("--work", default=None, help="where to keep the checkpoints")
    parser.add_argument("--stage", choices=["all", "transformers", "llama"], default="all")
    args = parser.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="gptoss-fixtures-")
    for index, (name, make_spec) in enumerate(SPECS.items()):
        spec = make_spec()
        model_dir = os.path.join(work, name)
        path = os.path.join(FIXTURES, f"{name}.json")
        if args.stage in ("all", "transformers"):
            import torch
            import transformers
            from transformers import GptOssForCausalLM

            os.makedirs(model_dir, exist_ok=True)
            tensors = make_checkpoint(spec, model_dir)
            prompts = random_prompts(spec["vocab_size"], 61 + index)
            fixture = {
                "reference": {
                    "transformers": f"transformers {transformers.__version__}, torch "
                    f"{torch.__version__}, F32, eager attention, no cache",
                },
                "weights": "formula_weights(fnv1a(hf_name), count, scale, offset), F32; "
                "experts: mxfp4_codes(gguf_name, shape, mxfp4_e_base)",
                "config": spec,
                "tensors": tensors,
                "transformers": run_transformers_with(GptOssForCausalLM, model_dir, prompts),
                "llama_cpp": [],
            }
        else:
            with open(path) as f:
                fixture = json.load(f)
        if args.stage in ("all", "llama"):
            gguf_path = os.path.join(work, f"{name}.gguf")
            convert_to_gguf(args.llama_cpp, model_dir, gguf_path, spec)
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
                llama["reference"] + ", GGUF from its convert_hf_to_gguf.py --outtype f32, "
                "experts rewritten as MXFP4 blocks of the same values"
            )
            fixture["llama_cpp"] = llama["cases"]
        with open(path, "w") as f:
            json.dump(fixture, f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
