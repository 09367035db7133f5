#!/usr/bin/env python3
"""Writes crates/models/tests/fixtures/qwen35_*.json: a random-weight Qwen3.5 (Gated DeltaNet
hybrid) checkpoint's spec and two references' greedy ids and top logits on it.

Each spec is a `Qwen3_5ForCausalLM` config of a real shape with few layers (three Gated
DeltaNet layers and one gated full-attention layer) and a small vocabulary. Its weights are
formula weights (`formula_weights(fnv1a(hf_name), count, scale, offset)`, the twin of the Rust
test's), so the Rust test rebuilds the same checkpoint without Python:

- transformers 5.25 (F32, eager, no cache: the whole sequence each step) runs the HF
  directory `save_pretrained` wrote;
- llama.cpp (llama-cpp-python 0.3.36, vendored llama.cpp 0c1e570, f32 KV cache, 2 threads)
  runs the GGUF its own `convert_hf_to_gguf.py --outtype f32 --no-mtp` made of that
  directory (a synthetic 512-token vocabulary in place of a tokenizer: prompts are ids).

Run with the torch venv (`.cache/torch-venv`: Python 3.12, torch, transformers==5.25 installed
with `--no-deps` beside its other requirements: its `kernels` pin is not on PyPI, and
`USE_HUB_KERNELS=0` keeps the torch reference paths), `--llama-python` a Python with
llama-cpp-python==0.3.36 built from the sdist, `--llama-cpp` the sdist's `vendor/llama.cpp`,
`--work` a directory for the checkpoints. `--stage transformers` / `--stage llama` split the
two references (the second reuses the first's `--work`).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

# The hub kernels (`kernels` package) are neither installed nor wanted: the torch reference
# implementations are the reference.
os.environ["USE_HUB_KERNELS"] = "0"

FIXTURES = os.path.join(os.path.dirname(__file__), "../../crates/models/tests/fixtures")
TOP = 8
NEW_TOKENS = 8


def fnv1a(name: str) -> int:
    h = 0x811C9DC5
    for byte in name.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def formula_weights(seed: int, count: int, scale: float, offset: float) -> np.ndarray:
    """The twin of `formula_weights` in crates/models/tests/common/family.rs."""
    x = formula_hash(seed, count)
    u = ((x % np.uint64(20001)).astype(np.float32) - np.float32(10000.0)) / np.float32(10000.0)
    return u * np.float32(scale) + np.float32(offset)


def formula_hash(seed: int, count: int) -> np.ndarray:
    """The integer hash under `formula_weights` (the twin of the Rust tests' `formula_hash`)."""
    mask = np.uint64(0xFFFFFFFF)
    x = np.arange(count, dtype=np.uint64) * np.uint64(0x9E3779B1)
    x = (x + np.uint64((seed * 0x85EBCA77 + 0x165667B1) & 0xFFFFFFFF)) & mask
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x2C1B3C6D)) & mask
    x ^= x >> np.uint64(12)
    x = (x * np.uint64(0x297A2D39)) & mask
    x ^= x >> np.uint64(15)
    return x


def qwen35_08b_like() -> dict:
    """Qwen3.5-0.8B's heads (attention 8 x 256 with 2 KV heads, partial rotary 0.25;
    DeltaNet 16 key and 16 value heads of 128, kernel 4), tied head; hidden 512, MLP 512,
    four layers and 512 tokens to keep the checkpoint small."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": 512,
        "hidden_size": 512,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 16,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
    }


def grouped_values() -> dict:
    """Twice as many value heads as key heads (as Qwen3.5-9B/27B), an untied head: the
    value-head reordering llama.cpp's converter does, at a smaller size."""
    spec = qwen35_08b_like()
    spec.update(
        {
            "hidden_size": 256,
            "intermediate_size": 384,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "tie_word_embeddings": False,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
        }
    )
    return spec


SPECS = {"qwen35_08b_like": qwen35_08b_like, "qwen35_grouped_values": grouped_values}


def scale_and_offset(name: str, shape) -> tuple:
    """Formula parameters per tensor: `(1 + w)` norms near 1, the DeltaNet output norm's
    plain weight near 1, matrices of unit output variance, gates and decays in range."""
    if name.endswith("linear_attn.norm.weight"):
        return 0.1, 1.0
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return 0.1, 0.0
    if name.endswith("A_log") or name.endswith("dt_bias"):
        return 1.0, 0.0
    if name.endswith("conv1d.weight"):
        return 0.5, 0.0
    if name.endswith("embed_tokens.weight"):
        return 1.0, 0.0
    fan_in = shape[-1]
    return float(np.sqrt(3.0 / fan_in)), 0.0


def make_checkpoint(spec: dict, out_dir: str) -> list:
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(**{k: v for k, v in spec.items() if k != "architectures"})
    model = Qwen3_5ForCausalLM(config).to(torch.float32)
    tensors = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale, offset = scale_and_offset(name, list(param.shape))
            values = formula_weights(fnv1a(name), param.numel(), scale, offset)
            param.copy_(torch.from_numpy(values).reshape(param.shape))
            tensors.append(
                {"name": name, "shape": list(param.shape), "scale": scale, "offset": offset}
            )
    model.save_pretrained(out_dir, safe_serialization=True)
    return tensors


def run_transformers(model_dir: str, prompts) -> list:
    from transformers import Qwen3_5ForCausalLM

    return run_transformers_with(Qwen3_5ForCausalLM, model_dir, prompts)


def run_transformers_with(model_class, model_dir: str, prompts) -> list:
    """Greedy runs of `model_class` (F32, eager attention, the whole sequence each step),
    with the top logits of each step (also used by `make_gemma4_fixtures.py`)."""
    import torch

    model = model_class.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    cases = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            generated, top_logits = [], []
            for _ in range(NEW_TOKENS):
                logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1].numpy()
                order = np.lexsort((np.arange(len(logits)), -logits))[:TOP]
                token = int(order[0])
                generated.append(token)
                top_logits.append([[int(i), float(logits[i])] for i in order])
                ids.append(token)
            cases.append(
                {"prompt_ids": list(prompt), "greedy_ids": generated, "top_logits": top_logits}
            )
    return cases


def synthetic_vocab(size: int) -> list:
    """GPT-2's byte-level characters, then placeholders: enough for llama.cpp to load."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    tokens = [chr(c) for c in cs]
    return tokens + [f"<t{i}>" for i in range(len(tokens), size)]


def convert_to_gguf(llama_cpp_dir: str, model_dir: str, out_path: str, vocab: int) -> None:
    """llama.cpp's own converter, with `set_vocab` writing the synthetic vocabulary."""
    sys.path.insert(0, llama_cpp_dir)
    sys.path.insert(0, os.path.join(llama_cpp_dir, "gguf-py"))
    import convert_hf_to_gguf
    from conversion import qwen

    def set_vocab(self):
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("default")
        self.gguf_writer.add_token_list(synthetic_vocab(vocab))
        self.gguf_writer.add_token_types([1] * vocab)
        self.gguf_writer.add_token_merges(["Ġ Ġ"])
        self.gguf_writer.add_add_bos_token(False)

    qwen.Qwen3_5TextModel.set_vocab = set_vocab
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outtype", "f32", "--no-mtp", "--outfile", out_path]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


def run_llama(model_path: str, prompts) -> list:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=model_path,
        n_ctx=256,
        n_threads=2,
        n_batch=256,
        logits_all=True,
        type_k=0,
        type_v=0,
        verbose=False,
    )
    cases = []
    for prompt in prompts:
        llm.reset()
        llm.eval(prompt)
        generated, top_logits = [], []
        for _ in range(NEW_TOKENS):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            order = np.lexsort((np.arange(len(logits)), -logits))[:TOP]
            token = int(order[0])
            generated.append(token)
            top_logits.append([[int(i), float(logits[i])] for i in order])
            llm.eval([token])
        cases.append({"prompt_ids": list(prompt), "greedy_ids": generated, "top_logits": top_logits})
    return {"reference": f"llama-cpp-python {llama_cpp.__version__}, f32 KV cache, 2 threads",
            "cases": cases}


def random_prompts(vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, size=n)] for n in (5, 23, 40)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python 0.3.36")
    parser.add_argument("--llama-cpp", help="llama.cpp source tree (convert_hf_to_gguf.py)")
    parser.add_argument("--work", default=None, help="where to keep the checkpoints")
    parser.add_argument("--only", help="one spec's name")
    parser.add_argument(
        "--stage",
        choices=["all", "transformers", "llama"],
        default="all",
        help="transformers: write the fixture's transformers runs (llama.cpp's left empty); "
        "llama: add llama.cpp's runs to the fixture written before (same --work)",
    )
    parser.add_argument("--run-llama", nargs=2, metavar=("GGUF", "PROMPTS_JSON"))
    args = parser.parse_args()
    if args.run_llama:
        gguf_path, prompts_path = args.run_llama
        with open(prompts_path) as f:
            prompts = json.load(f)
        json.dump(run_llama(gguf_path, prompts), sys.stdout)
        return

    work = args.work or tempfile.mkdtemp(prefix="qwen35-fixtures-")
    for index, (name, make_spec) in enumerate(SPECS.items()):
        if args.only and name != args.only:
            continue
        spec = make_spec()
        model_dir = os.path.join(work, name)
        path = os.path.join(FIXTURES, f"{name}.json")
        if args.stage in ("all", "transformers"):
            import torch
            import transformers

            os.makedirs(model_dir, exist_ok=True)
            tensors = make_checkpoint(spec, model_dir)
            prompts = random_prompts(spec["vocab_size"], 46 + index)
            fixture = {
                "reference": {
                    "transformers": f"transformers {transformers.__version__}, torch "
                    f"{torch.__version__}, F32, eager attention, no cache",
                },
                "weights": "formula_weights(fnv1a(hf_name), count, scale, offset), F32",
                "config": spec,
                "tensors": tensors,
                "transformers": run_transformers(model_dir, prompts),
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
            out = subprocess.run(
                [args.llama_python, __file__, "--run-llama", gguf_path, prompts_path],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            llama = json.loads(out)
            fixture["reference"]["llama_cpp"] = (
                llama["reference"] + ", GGUF from its convert_hf_to_gguf.py --outtype f32 --no-mtp"
            )
            fixture["llama_cpp"] = llama["cases"]
        with open(path, "w") as f:
            json.dump(fixture, f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
