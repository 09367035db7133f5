#!/usr/bin/env python3
"""Writes crates/models/tests/fixtures/lora_smollm2_f32.json: transformers + PEFT greedy ids and
top-5 logits for the default model with random LoRA adapters, which tokenmill's LoRA path is
held to (crates/models/tests/lora_parity.rs).

The adapters are not committed: each is drawn from a seed with splitmix64, exactly as
tokenmill_models::write_random_peft_adapter draws it (24-bit uniforms in [-1, 1), times a
scale, in f32; layer by layer, target by target, A [rank, in] before B [out, rank]), so the
Rust test regenerates the same weights. Two adapters: rank 8 on q/v, rank 16 on all seven
projections.

transformers reads the GGUF itself (`from_pretrained(dir, gguf_file=...)`: the Q4_1 weights
dequantized to f32, Q/K rows back in HF order), so the base is the F32-dequantized model the
Rust test loads with `dequantize_to_f32`. Prompts are token ids (no tokenizer involved).

Run by a developer (not CI), with the pinned torch/transformers/peft venv:
    /work/cache/torchvenv/bin/python scripts/reference/make_lora_fixtures.py \
        --model ~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import copy
import json
import os

import numpy as np
import peft
import torch
import transformers

ADAPTERS = [
    {"rank": 8, "alpha": 16.0, "targets": ["q_proj", "v_proj"], "seed": 1,
     "a_scale": 0.1, "b_scale": 0.1},
    {"rank": 16, "alpha": 32.0,
     "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
     "seed": 2, "a_scale": 0.1, "b_scale": 0.1},
]
# "The capital of France is", "The quick brown fox", "def fibonacci(n):\n    " (from
# parity_smollm2.json).
PROMPTS = [
    [504, 3575, 282, 4649, 314],
    [504, 2365, 6354, 16438],
    [1604, 3987, 46477, 24, 94, 727, 2367],
]
NEW_TOKENS = 16
TOP = 5
MASK64 = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed: int):
        self.state = seed & MASK64

    def units(self, count: int) -> np.ndarray:
        # uint64 arithmetic wraps, as the Rust generator's wrapping_add/wrapping_mul do.
        with np.errstate(over="ignore"):
            steps = np.arange(1, count + 1, dtype=np.uint64)
            z = np.uint64(self.state) + steps * np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
        self.state = (self.state + count * 0x9E3779B97F4A7C15) & MASK64
        # 24-bit integers are exact in f32, and so are the divide, the double and the minus 1.
        top = (z >> np.uint64(40)).astype(np.float32)
        return top / np.float32(1 << 24) * np.float32(2.0) - np.float32(1.0)


def dims(config, target):
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = hidden // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (q, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}[target]


def module(layer, target):
    return layer.mlp if target in ("gate_proj", "up_proj", "down_proj") else layer.self_attn


def with_adapter(base, spec):
    config = peft.LoraConfig(r=spec["rank"], lora_alpha=spec["alpha"],
                             target_modules=spec["targets"], lora_dropout=0.0, bias="none")
    model = peft.get_peft_model(base, config)
    rng = SplitMix64(spec["seed"])
    layers = model.base_model.model.model.layers
    for layer in layers:
        for target in spec["targets"]:
            n_in, n_out = dims(base.config, target)
            proj = getattr(module(layer, target), target)
            a = rng.units(spec["rank"] * n_in) * np.float32(spec["a_scale"])
            b = rng.units(n_out * spec["rank"]) * np.float32(spec["b_scale"])
            with torch.no_grad():
                proj.lora_A["default"].weight.copy_(torch.from_numpy(a.reshape(spec["rank"], n_in)))
                proj.lora_B["default"].weight.copy_(torch.from_numpy(b.reshape(n_out, spec["rank"])))
    model.eval()
    return model


def greedy(model, prompt):
    ids = list(prompt)
    greedy_ids, top_logits = [], []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            values, indices = torch.topk(logits, TOP)
            top_logits.append([[int(i), float(v)] for i, v in zip(indices, values)])
            # argmax, lowest id on ties (torch.argmax returns the first maximum).
            next_id = int(torch.argmax(logits))
            greedy_ids.append(next_id)
            ids.append(next_id)
    return greedy_ids, top_logits


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..",
                        "crates/models/tests/fixtures/lora_smollm2_f32.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    directory, name = os.path.split(os.path.expanduser(args.model))
    base = transformers.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, dtype=torch.float32)
    cases = []
    for index, spec in enumerate(ADAPTERS):
        model = with_adapter(copy.deepcopy(base), spec)
        for prompt in PROMPTS:
            ids, top = greedy(model, prompt)
            cases.append({"adapter": index, "prompt_ids": prompt, "greedy_ids": ids,
                          "top_logits": top})
    fixture = {
        "model": name,
        "reference": f"transformers {transformers.__version__}, peft {peft.__version__}, "
                     f"torch {torch.__version__}, f32, weights of {name} dequantized by "
                     "transformers' GGUF reader",
        "new_tokens": NEW_TOKENS,
        "adapters": ADAPTERS,
        "cases": cases,
    }
    with open(args.out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
