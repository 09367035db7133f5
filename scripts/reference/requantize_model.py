#!/usr/bin/env python3
"""Writes the default model re-quantized to another weight type, for the loading and parity
tests of that type (crates/models/tests/requantized.rs).

- q5_0, q5_1: gguf-py reads the default GGUF, dequantizes every tensor and re-quantizes each
  2-D weight (token embedding included) with its reference quantizer; 1-D norms stay F32.
- iq4_nl, iq4_xs, q4_k_m: llama.cpp's own quantizer (llama-cpp-python 0.3.16,
  `llama_model_quantize`) on the model dequantized to F32, so tensor types are what a
  downloaded file of that type holds: IQ4_XS falls back to IQ4_NL for rows of 576 (no multiple
  of 256), Q4_K_M is mostly Q5_0 for the same reason.

Files go to a cache outside the repository (default ~/.cache/tokenmill/reference), named
`<model stem>.requantized-<TYPE>.gguf`. Then, for the parity fixture:

    /work/cache/refvenv/bin/python scripts/reference/requantize_model.py --type q5_0
    /work/cache/refvenv/bin/python scripts/reference/make_parity_fixture.py --top 2 \\
        --model ~/.cache/tokenmill/reference/SmolLM2-135M-Instruct.Q4_1.requantized-Q5_0.gguf \\
        --out crates/models/tests/fixtures/parity_smollm2_q5_0.json
"""

import argparse
import os
import subprocess

import gguf

from gguf_copy import write_converted_copy, write_f32_copy

GGUF_PY = {
    "q5_0": (gguf.GGMLQuantizationType.Q5_0, gguf.LlamaFileType.MOSTLY_Q5_0),
    "q5_1": (gguf.GGMLQuantizationType.Q5_1, gguf.LlamaFileType.MOSTLY_Q5_1),
}
# llama.cpp's file types (`enum llama_ftype`), which llama-quantize also takes by name.
LLAMA_CPP = {
    "iq4_nl": 25,
    "iq4_xs": 30,
    "q4_k_m": 15,
}


def requantize_with_gguf_py(src: str, dst: str, qtype, file_type) -> None:
    def add_tensor(writer, name, values, _tensor):
        if values.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, values)

    write_converted_copy(src, dst, int(file_type), add_tensor)


def requantize_with_llama_cpp(src: str, dst: str, ftype: int, cache: str) -> None:
    stem = os.path.splitext(os.path.basename(src))[0]
    f32 = os.path.join(cache, stem + ".dequantized-F32.gguf")
    if not os.path.exists(f32):
        write_f32_copy(src, f32 + ".tmp")
        os.replace(f32 + ".tmp", f32)
    quantize_tool = os.environ.get("LLAMA_QUANTIZE")
    if quantize_tool:
        # The same llama_model_quantize with its default parameters, from the CLI tool built
        # from the same llama.cpp (scripts/make-test-assets.sh builds it; no Python package).
        subprocess.run([quantize_tool, f32, dst, str(ftype), "2"], check=True,
                       stdout=subprocess.DEVNULL)
        return
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    status = llama_cpp.llama_model_quantize(f32.encode(), dst.encode(), params)
    if status != 0:
        raise SystemExit(f"llama_model_quantize failed with status {status}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--type", required=True, choices=sorted([*GGUF_PY, *LLAMA_CPP]))
    parser.add_argument(
        "--model",
        default=os.path.expanduser("~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/tokenmill/reference"))
    args = parser.parse_args()
    os.makedirs(args.cache, exist_ok=True)
    stem = os.path.splitext(os.path.basename(args.model))[0]
    out = os.path.join(args.cache, f"{stem}.requantized-{args.type.upper()}.gguf")
    if args.type in GGUF_PY:
        requantize_with_gguf_py(args.model, out + ".tmp", *GGUF_PY[args.type])
    else:
        requantize_with_llama_cpp(args.model, out + ".tmp", LLAMA_CPP[args.type], args.cache)
    os.replace(out + ".tmp", out)
    counts = {}
    for tensor in gguf.GGUFReader(out).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    print(out, counts)


if __name__ == "__main__":
    main()
