#!/usr/bin/env python3
"""Exports all-MiniLM-L6-v2 (the safetensors directory scripts/fetch-minilm.sh fetched) to
ONNX for fastembed, which otherwise downloads Qdrant's export from Hugging Face (offline
machines cannot). The graph is transformers' BertModel (input_ids, attention_mask,
token_type_ids → last_hidden_state), as Qdrant's is; fastembed mean-pools and normalizes it.

    /work/cache/torchvenv/bin/python bench/export_minilm_onnx.py \
        [--model ~/.cache/tokenmill/models/all-MiniLM-L6-v2] [--out ~/.cache/tokenmill/fastembed/all-MiniLM-L6-v2]

Prints the output directory (model.onnx plus the tokenizer files fastembed reads); idempotent.
"""

import argparse
import os
import shutil
import sys

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json", "vocab.txt"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.path.expanduser("~/.cache/tokenmill/models/all-MiniLM-L6-v2"))
    parser.add_argument("--out", default=os.path.expanduser("~/.cache/tokenmill/fastembed/all-MiniLM-L6-v2"))
    args = parser.parse_args()
    target = os.path.join(args.out, "model.onnx")
    if not os.path.exists(target):
        import torch
        from transformers import AutoModel

        model = AutoModel.from_pretrained(args.model).eval()
        ids = torch.ones((2, 16), dtype=torch.int64)
        os.makedirs(args.out, exist_ok=True)
        partial = target + ".partial"
        with torch.no_grad():
            torch.onnx.export(
                model,
                (ids, torch.ones_like(ids), torch.zeros_like(ids)),
                partial,
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=["last_hidden_state"],
                dynamic_axes={name: {0: "batch", 1: "sequence"} for name in
                              ["input_ids", "attention_mask", "token_type_ids", "last_hidden_state"]},
                opset_version=17,
                dynamo=False,
            )
        os.replace(partial, target)
    for name in TOKENIZER_FILES:
        source = os.path.join(args.model, name)
        if os.path.exists(source):
            shutil.copyfile(source, os.path.join(args.out, name))
    print(args.out)


if __name__ == "__main__":
    sys.exit(main())
