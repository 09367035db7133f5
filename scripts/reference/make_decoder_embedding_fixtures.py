#!/usr/bin/env python3
"""Decoder-embedder parity fixture from transformers: crates/models/tests/fixtures/decoder_embeddings.json.

Two small decoders whose weights follow a formula (`decoder_weight` below; the Rust test
crates/models/tests/decoder_embedding.rs writes the same safetensors, so no model file is
stored):

* `qwen3`: a Qwen3 (QK-norm, head_dim 32 != hidden / heads, tied embeddings) saved the way
  Qwen3-Embedding is: as the bare `Qwen3Model` (tensor names without `model.`, no
  `lm_head`), with sentence-transformers' `modules.json` (last-token pooling + Normalize) and
  a tokenizer whose post-processor appends `<|endoftext|>` (Qwen3-Embedding's tokenizer
  does; vLLM tokenizes with special tokens, so the EOS is the pooled last token).
* `llama`: a Llama (grouped-query attention, untied `lm_head`) saved as `LlamaForCausalLM`,
  no sentence-transformers modules (vLLM's defaults for a converted decoder: LAST,
  normalized).

For each model and each token-id sequence the fixture stores transformers' final hidden
states (after the final norm, `AutoModel(...).last_hidden_state`) pooled three ways — last
token, mean and first token — each L2-normalized (`torch.nn.functional.normalize`). Each
sequence runs alone (no padding), as tokenmill's rows do.

Run by a developer (not CI), with pinned versions recorded in the fixture:
    /tmp/probefull/bin/python scripts/reference/make_decoder_embedding_fixtures.py
"""

import json
import math
import os
import sys

import numpy as np
import torch

FIXTURES = os.path.join(os.path.dirname(__file__), "../../crates/models/tests/fixtures")

VOCAB = 128
EOS = VOCAB - 1  # `<|endoftext|>` in the Qwen3 tokenizer the Rust test writes

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "bos_token_id": EOS,
    "eos_token_id": EOS,
}

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def decoder_weight(name, shape):
    """Deterministic weights from the tensor's name and element index (the Rust test writes
    the same): a sine of the index with a per-name phase; norms near 1, matrices scaled by
    1/sqrt(fan-in) so activations stay O(1)."""
    count = math.prod(shape)
    phase = sum(ord(c) for c in name) % 97
    index = np.arange(count, dtype=np.float64)
    values = np.sin(index * 0.731 + phase * 0.1)
    if name.endswith("norm.weight"):
        values = 1.0 + 0.1 * values
    else:
        values = values * (1.0 / math.sqrt(shape[-1]))
    return values.astype(np.float32).reshape(shape)


def sequences(rng, eos):
    """Token-id sequences of mixed lengths (1 to 40); with `eos`, each ends with it."""
    out = []
    for length in [1, 2, 5, 9, 17, 24, 33, 40]:
        body = rng.integers(3, VOCAB - 1, length - (1 if eos else 0)).tolist()
        out.append(body + ([EOS] if eos else []))
    return out


def run(name, config_dict, bare, eos):
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    fields = {k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")}
    config = AutoConfig.for_model(config_dict["model_type"], **fields)
    config._attn_implementation = "eager"
    model = (AutoModel if bare else AutoModelForCausalLM).from_config(config).eval()
    state = model.state_dict()
    for tensor_name, tensor in state.items():
        tensor.copy_(torch.from_numpy(decoder_weight(tensor_name, list(tensor.shape))))
    model.load_state_dict(state)
    body = model if bare else model.model
    rng = np.random.default_rng(23 if bare else 29)
    items = []
    with torch.no_grad():
        for ids in sequences(rng, eos):
            hidden = body(input_ids=torch.tensor([ids])).last_hidden_state[0]
            pooled = {
                "last": hidden[-1],
                "mean": hidden.mean(dim=0),
                "cls": hidden[0],
            }
            item = {"ids": ids}
            for key, vector in pooled.items():
                item[key] = torch.nn.functional.normalize(vector, dim=0).tolist()
            items.append(item)
    names = sorted(state)
    shapes = {n: list(state[n].shape) for n in names}
    return {"name": name, "bare_model": bare, "config": config_dict, "tensors": shapes, "items": items}


def versions():
    import tokenizers
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
    }


def main():
    torch.manual_seed(0)
    os.makedirs(FIXTURES, exist_ok=True)
    data = {
        "versions": versions(),
        "models": [
            run("qwen3", QWEN3, bare=True, eos=True),
            run("llama", LLAMA, bare=False, eos=False),
        ],
    }
    path = os.path.join(FIXTURES, "decoder_embeddings.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=None)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
