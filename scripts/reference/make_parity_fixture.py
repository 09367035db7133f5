#!/usr/bin/env python3
"""Writes crates/models/tests/fixtures/parity_smollm2.json: llama.cpp's greedy continuations and
top-5 logits for the default model, the reference tokenmill's forward pass is held to.

llama.cpp comes from llama-cpp-python 0.3.16 (pinned). 2 threads, no BOS for raw prompts
(matching how llama.cpp's server tokenizes a raw completion prompt), the GGUF's own chat template
for chat prompts. For every prompt the fixture stores the prompt ids, 32 greedy ids (argmax,
lowest id on ties) and, at every generated step, the 5 largest logits, plus the KV cache type
(`kv_cache`), which tokenmill's side of the test then uses too.

KV cache type (--kv): f16 by default, llama.cpp's own default type_k/type_v and tokenmill's
`--kv-cache-dtype auto` for a GGUF file; parity_smollm2.json (Q4_1 weights) is written this way.
With --f32 the default is f32 K/V instead: llama.cpp's f16-KV attention converts Q (and the
softmax weights) to f16 before its dot products with K (and V), tokenmill decodes K/V to f32 and
keeps Q in f32, so f16 KV would add a last-bit-of-f16 difference that the F32 fixture's exact
arithmetic tolerance (1e-4) cannot absorb; parity_smollm2_f32.json keeps f32 K/V on both sides.
The requantized-model fixtures (parity_smollm2_<type>.json) were recorded before this option
with f32 K/V and carry no `kv_cache` field (the test reads that as f32).

With --f32 the model is first dequantized to an all-F32 GGUF (gguf-py; every metadata field
copied with its type, general.file_type set to ALL_F32) in a cache directory outside the
repository, llama.cpp runs that file, and the fixture goes to parity_smollm2_f32.json. With F32
weights neither engine quantizes activations, so the comparison is exact arithmetic against
exact arithmetic (the weights are identical to tokenmill's `dequantize_to_f32`: Q4_1
dequantization, d * q + m in f32, is exact in both).

Run by a developer (not CI), e.g.:
    /work/cache/refvenv/bin/python scripts/reference/make_parity_fixture.py \
        --model ~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf
    /work/cache/refvenv/bin/python scripts/reference/make_parity_fixture.py --f32
"""

import argparse
import json
import os

import jinja2
import llama_cpp
import numpy as np

from gguf_copy import write_f32_copy

RAW_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "The three primary colors are",
    "Water boils at a temperature of",
    "import numpy as np\n\n# Compute the mean of a list\n",
    "The quick brown fox",
    "In machine learning, overfitting means",
    "Café Zürich über 🦀 Rust:",
]
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the ocean.",
    "Explain what a hash map is in one sentence.",
    "How many legs does a spider have?",
    "Give me three tips for better sleep.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 7?",
    "Name a famous painting by Leonardo da Vinci.",
]
NEW_TOKENS = 32
TOP = 5


def render_chat(template: str, content: str, bos: str, eos: str) -> str:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    return env.from_string(template).render(
        messages=[{"role": "user", "content": content}],
        add_generation_prompt=True,
        bos_token=bos,
        eos_token=eos,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model",
        default=os.path.expanduser("~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    parser.add_argument(
        "--out",
        default=os.path.join(
            os.path.dirname(__file__), "../../crates/models/tests/fixtures/parity_smollm2.json"
        ),
    )
    parser.add_argument(
        "--f32",
        action="store_true",
        help="dequantize the model to F32 first and write parity_smollm2_f32.json",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=TOP,
        help="logits stored per step (the requantized-model fixtures keep 2, to stay small)",
    )
    parser.add_argument(
        "--kv",
        choices=["f16", "f32"],
        default=None,
        help="KV cache type on both sides (default: f16, or f32 with --f32)",
    )
    parser.add_argument(
        "--f32-cache",
        default=os.path.expanduser("~/.cache/tokenmill/reference"),
        help="directory for the dequantized F32 copy (outside the repository)",
    )
    args = parser.parse_args()
    kv = args.kv or ("f32" if args.f32 else "f16")
    kv_type = {"f32": 0, "f16": 1}[kv]  # GGML_TYPE_F32, GGML_TYPE_F16
    model_path = args.model
    if args.f32:
        os.makedirs(args.f32_cache, exist_ok=True)
        stem = os.path.splitext(os.path.basename(args.model))[0]
        model_path = os.path.join(args.f32_cache, stem + ".dequantized-F32.gguf")
        if not os.path.exists(model_path):
            write_f32_copy(args.model, model_path + ".tmp")
            os.replace(model_path + ".tmp", model_path)
        if args.out == parser.get_default("out"):
            args.out = args.out.replace("parity_smollm2.json", "parity_smollm2_f32.json")
    llm = llama_cpp.Llama(
        model_path=model_path,
        n_ctx=512,
        n_threads=2,
        n_batch=512,
        logits_all=True,
        type_k=kv_type,
        type_v=kv_type,
        verbose=False,
    )
    template = llm.metadata["tokenizer.chat_template"]
    bos = llm.detokenize([llm.token_bos()]).decode()
    eos = llm.detokenize([llm.token_eos()]).decode()
    cases = [(text, False, text) for text in RAW_PROMPTS]
    cases += [(text, True, render_chat(template, text, bos, eos)) for text in CHAT_PROMPTS]
    out = []
    for text, chat, rendered in cases:
        prompt_ids = llm.tokenize(rendered.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(prompt_ids)
        generated, top_logits = [], []
        for _ in range(NEW_TOKENS):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            # Largest first, lowest id on ties (numpy: a Python sort of the vocabulary takes
            # most of a second per step).
            order = [int(i) for i in np.lexsort((np.arange(len(logits)), -logits))[: args.top]]
            token = order[0]
            generated.append(token)
            top_logits.append([[int(i), float(logits[i])] for i in order])
            llm.eval([token])
        out.append(
            {
                "text": text,
                "chat": chat,
                "prompt_ids": [int(t) for t in prompt_ids],
                "greedy_ids": generated,
                "top_logits": top_logits,
                "completion": llm.detokenize(generated).decode("utf-8", errors="replace"),
            }
        )
    fixture = {
        "model": os.path.basename(model_path),
        "reference": f"llama-cpp-python {llama_cpp.__version__}, {kv} KV cache, 2 threads"
        + (f", weights of {os.path.basename(args.model)} dequantized to F32" if args.f32 else ""),
        "kv_cache": kv,
        "new_tokens": NEW_TOKENS,
        "cases": out,
    }
    with open(args.out, "w") as f:
        json.dump(fixture, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for case in out:
        print(repr(case["text"][:40]), "->", repr(case["completion"][:60]))


if __name__ == "__main__":
    main()
