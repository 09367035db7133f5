#!/usr/bin/env python3
"""Embedding and cross-encoder parity fixtures from sentence-transformers / transformers.

Run by a developer (not in CI) with the torch venv:

    /work/cache/torchvenv/bin/python scripts/reference/make_embedding_fixtures.py \
        [--model ~/.cache/tokenmill/models/all-MiniLM-L6-v2]

Writes into crates/models/tests/fixtures/:

* `minilm_embeddings.json`: for each sentence (Unicode, long, short), the HF tokenizer's ids
  and sentence-transformers' normalized embedding as little-endian f16 in base64 (f16 moves
  a unit vector's cosine by ~1e-7, far below the 0.9999 bound the Rust test checks).
* `cross_encoder.json`: a `BertForSequenceClassification` whose weights follow a formula
  (`formula_weight` below; crates/models/tests/bert_parity.rs writes the same safetensors),
  its config, token-id pairs and transformers' logits.

Pinned versions (recorded in the fixtures too): torch 2.15.0, transformers 4.57.1,
sentence-transformers 5.7.0, tokenizers 0.22.2.
"""

import argparse
import base64
import json
import math
import os
import sys

import numpy as np
import torch

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "models", "tests", "fixtures")

SENTENCES = [
    "Hello world.",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors so that similar meanings land close together.",
    "Paris is the capital of France.",
    "What is the capital of France?",
    "I like apples.",
    "Apples are my favourite fruit.",
    "The stock market fell sharply on Tuesday after the central bank raised interest rates.",
    "Rust is a systems programming language focused on safety and speed.",
    "Machine learning models need data.",
    "¿Dónde está la biblioteca?",
    "Ich habe keine Zeit, weil ich arbeiten muss.",
    "Le café est très chaud ce matin.",
    "東京は日本の首都です。",
    "北京是中国的首都。",
    "서울은 한국의 수도입니다.",
    "Москва — столица России.",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "Emoji test 🎉🚀 with symbols ∑ ∫ √ and accents: naïve café résumé.",
    "ALL CAPS SENTENCE SHOULD BE LOWERCASED BY THE TOKENIZER.",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\nin the text",
    "Numbers: 3.14159, 2,718, 1e-10 and 42.",
    "e-mail: someone@example.com, url: https://example.org/path?q=1",
    "unbelievably antidisestablishmentarianism supercalifragilisticexpialidocious",
    "x" * 300,
    "word " * 120,
    "Short.",
    "Yes",
    "No!",
    "?",
    "The cat sat on the mat.",
    "A cat was sitting on a mat.",
    "Dogs are loyal animals.",
    "The weather today is sunny with a light breeze.",
    "It is raining heavily in London.",
    "How do I reset my password?",
    "Click 'Forgot password' on the login page to reset it.",
    "The mitochondria is the powerhouse of the cell.",
    "Photosynthesis converts light energy into chemical energy.",
    "She sells sea shells by the sea shore.",
    "To be, or not to be, that is the question.",
    "In 1492, Columbus sailed the ocean blue.",
    "def add(a, b):\n    return a + b",
    "SELECT name FROM users WHERE id = 7;",
    "The Eiffel Tower is located in Paris and was completed in 1889 for the World's Fair. "
    "It is one of the most recognisable structures in the world, attracting millions of "
    "visitors every year, and it was the tallest man-made structure until 1930. "
    "Engineers from Gustave Eiffel's company designed and built the wrought-iron lattice tower.",
    " ".join(f"token{i}" for i in range(200)),
    "Ünïcödé ñormalization — “quotes” and ‘apostrophes’ … ellipsis",
    "résumé vs resume",
    "[CLS] special tokens written in text [SEP]",
    "mixed 中文 and English words together",
    "final sentence number fifty-six.",
]


def f16_base64(vector):
    return base64.b64encode(np.asarray(vector, dtype="<f2").tobytes()).decode("ascii")


def minilm(model_dir):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    model = SentenceTransformer(model_dir, device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    max_len = model.max_seq_length
    vectors = model.encode(SENTENCES, batch_size=8, convert_to_numpy=True)
    items = []
    for sentence, vector in zip(SENTENCES, vectors):
        ids = tokenizer(sentence, truncation=True, max_length=max_len)["input_ids"]
        items.append(
            {
                "text": sentence,
                "ids": ids,
                "norm": float(np.linalg.norm(vector.astype(np.float64))),
                "embedding_f16": f16_base64(vector),
            }
        )
    return {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "versions": versions(),
        "max_seq_length": max_len,
        "dimension": int(vectors.shape[1]),
        "items": items,
    }


CROSS_CONFIG = {
    "architectures": ["BertForSequenceClassification"],
    "model_type": "bert",
    "vocab_size": 97,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "hidden_act": "gelu",
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "num_labels": 1,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}


def formula_weight(name, shape):
    """Deterministic weights from the tensor's name and element index (the Rust test writes
    the same): a sine of the index with a per-name phase, scaled so activations stay O(1)."""
    count = math.prod(shape)
    phase = sum(ord(c) for c in name) % 97
    index = np.arange(count, dtype=np.float64)
    values = np.sin(index * 0.731 + phase * 0.1)
    if name.endswith("LayerNorm.weight"):
        values = 1.0 + 0.1 * values
    elif name.endswith("bias"):
        values = 0.05 * values
    else:
        values = values * (1.0 / math.sqrt(shape[-1]))
    return values.astype(np.float32).reshape(shape)


def cross_encoder():
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(**CROSS_CONFIG)
    model = BertForSequenceClassification(config).eval()
    state = model.state_dict()
    for name, tensor in state.items():
        if name.endswith("position_ids") or name.endswith("token_type_ids"):
            continue
        tensor.copy_(torch.from_numpy(formula_weight(name, list(tensor.shape))))
    model.load_state_dict(state)
    rng = np.random.default_rng(17)
    pairs = []
    for _ in range(6):
        a = [1] + rng.integers(3, 97, rng.integers(2, 12)).tolist() + [2]
        b = rng.integers(3, 97, rng.integers(2, 20)).tolist() + [2]
        pairs.append((a, b))
    items = []
    with torch.no_grad():
        for a, b in pairs:
            ids = torch.tensor([a + b])
            types = torch.tensor([[0] * len(a) + [1] * len(b)])
            logits = model(input_ids=ids, token_type_ids=types).logits[0].tolist()
            items.append({"ids": a + b, "type_ids": [0] * len(a) + [1] * len(b), "logits": logits})
    names = sorted(n for n in state if not n.endswith("_ids"))
    shapes = {n: list(state[n].shape) for n in names}
    return {"versions": versions(), "config": CROSS_CONFIG, "tensors": shapes, "items": items}


def versions():
    import sentence_transformers
    import tokenizers
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence-transformers": sentence_transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model", default=os.path.expanduser("~/.cache/tokenmill/models/all-MiniLM-L6-v2")
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    os.makedirs(FIXTURES, exist_ok=True)
    for name, data in [("minilm_embeddings.json", minilm(args.model)), ("cross_encoder.json", cross_encoder())]:
        path = os.path.join(FIXTURES, name)
        with open(path, "w") as f:
            json.dump(data, f, ensure_ascii=False, indent=None)
            f.write("\n")
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
