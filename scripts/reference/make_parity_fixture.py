#!/usr/bin/env python3
"""Writes crates/models/tests/fixtures/parity_smollm2.json: llama.cpp's greedy continuations and
top-5 logits for the default model, the reference tokenmill's forward pass is held to.

llama.cpp comes from llama-cpp-python 0.3.16 (pinned). The KV cache is set to f32 (tokenmill's
cache is f32; llama.cpp defaults to f16), 2 threads, no BOS for raw prompts (matching how
llama.cpp's server tokenizes a raw completion prompt), the GGUF's own chat template for chat
prompts. For every prompt the fixture stores the prompt ids, 32 greedy ids (argmax, lowest id on
ties) and, at every generated step, the 5 largest logits.

Run by a developer (not CI), e.g.:
    /work/cache/refvenv/bin/python scripts/reference/make_parity_fixture.py \
        --model ~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import json
import os

import jinja2
import llama_cpp
import numpy as np

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
    args = parser.parse_args()
    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=512,
        n_threads=2,
        n_batch=512,
        logits_all=True,
        type_k=0,  # GGML_TYPE_F32
        type_v=0,
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
            order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))[:TOP]
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
        "model": os.path.basename(args.model),
        "reference": f"llama-cpp-python {llama_cpp.__version__}, f32 KV cache, 2 threads",
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
