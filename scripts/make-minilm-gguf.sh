#!/usr/bin/env bash
# Converts all-MiniLM-L6-v2 (scripts/fetch-minilm.sh) to a GGUF of llama.cpp's `bert`
# architecture with llama.cpp's own convert_hf_to_gguf.py, from the llama-cpp-python 0.3.16
# sdist the bench venv vendors, run in the torch venv (torch + gguf). Idempotent; prints the
# file. The GGUF goes next to the model in the cache (git-ignored), never into the repo.
#   LLAMACPP_DIR   the vendored llama.cpp (default: the bench cache's sdist)
#   TORCH_PYTHON   python with torch, transformers, gguf and mistral_common, which the
#                  converter imports (default: /work/cache/torchvenv/bin/python)
#   OUTTYPE        f32 (default) or f16
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
model="$("$here/fetch-minilm.sh")"
llamacpp="${LLAMACPP_DIR:-/work/cache/bench/llamacpp-native-0.3.16/sdist/llama_cpp_python-0.3.16/vendor/llama.cpp}"
python="${TORCH_PYTHON:-/work/cache/torchvenv/bin/python}"
outtype="${OUTTYPE:-f32}"
target="$(dirname "$model")/all-MiniLM-L6-v2.$outtype.gguf"
if [ -s "$target" ]; then
  echo "$target"
  exit 0
fi
if [ ! -f "$llamacpp/convert_hf_to_gguf.py" ]; then
  echo "error: no convert_hf_to_gguf.py under $llamacpp (set LLAMACPP_DIR)" >&2
  exit 1
fi
# The converter's own gguf-py first, so the writer matches the converter.
PYTHONPATH="$llamacpp/gguf-py${PYTHONPATH:+:$PYTHONPATH}" "$python" "$llamacpp/convert_hf_to_gguf.py" \
  "$model" --outtype "$outtype" --outfile "$target.partial" >&2
mv "$target.partial" "$target"
echo "$target"
