#!/usr/bin/env bash
# Makes the test assets that nothing downloads as they are, idempotently. scripts/test.sh
# does not run it yet, so the tests below still skip in CI (crates/test-assets marks them
# `made_by_test_script: false`): regenerated here, the Q5_0 file does not reproduce its
# fixture (max logit difference 0.90, one decisive greedy mismatch, on every kernel path;
# Q5_1 does), and the MiniLM converter needs torch and mistral_common. Until that is settled:
#
#   requantized   the default model re-quantized to Q5_0 and Q5_1 (gguf-py's reference
#                 quantizers) and to IQ4_NL, IQ4_XS and Q4_K_M (llama.cpp's llama-quantize),
#                 for crates/models/tests/parity_llama_cpp.rs, into the reference cache
#                 ($TOKENMILL_REFERENCE_DIR, else ~/.cache/tokenmill/reference);
#   minilm-gguf   all-MiniLM-L6-v2 converted to GGUF by llama.cpp's convert_hf_to_gguf.py, next
#                 to the model in the cache (crates/models/tests/bert_parity.rs). The converter
#                 imports torch, transformers and mistral_common: give a python that has them
#                 (the Python test venv) as $CONVERTER_PYTHON.
#
# Both use the llama.cpp that the pinned llama-cpp-python 0.3.16 sdist vendors, the one the
# parity fixtures were made with (its sources, a tools venv with numpy, PyYAML, cmake and ninja,
# and the llama-quantize build live in .cache/test-assets, git-ignored). Usage:
#   scripts/make-test-assets.sh requantized
#   CONVERTER_PYTHON=.cache/venv-tests/bin/python scripts/make-test-assets.sh minilm-gguf
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.16
root="$PWD/.cache/test-assets"
tools_venv="$root/venv"
sdist_dir="$root/sdist"
llamacpp="$sdist_dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
build="$root/llama.cpp-build"
reference="${TOKENMILL_REFERENCE_DIR:-$HOME/.cache/tokenmill/reference}"

# shellcheck source=lib/pinned-venv.sh
source scripts/lib/pinned-venv.sh

tools() {
  pinned_venv "$tools_venv" numpy==2.4.6 PyYAML==6.0.4 cmake==4.4.5 ninja==1.13.2
}

sources() {
  if [ ! -f "$llamacpp/convert_hf_to_gguf.py" ]; then
    echo "== downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (vendors llama.cpp)" >&2
    mkdir -p "$sdist_dir"
    "$tools_venv/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python \
      --dest "$sdist_dir" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2
    tar -xzf "$sdist_dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$sdist_dir"
  fi
}

llama_quantize() {
  local tool="$build/bin/llama-quantize"
  if [ ! -x "$tool" ]; then
    echo "== building llama-quantize (release, no native flags; a few minutes on 2 cores)" >&2
    PATH="$tools_venv/bin:$PATH" cmake -S "$llamacpp" -B "$build" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
    PATH="$tools_venv/bin:$PATH" cmake --build "$build" --target llama-quantize \
      -j "$(nproc)" >/dev/null
  fi
  echo "$tool"
}

requantized() {
  local model stem type quantize=""
  model="${TOKENMILL_TEST_MODEL:-$(scripts/fetch-model.sh)}"
  stem="$(basename "$model" .gguf)"
  for type in q5_0 q5_1 iq4_nl iq4_xs q4_k_m; do
    local out="$reference/$stem.requantized-${type^^}.gguf"
    if [ -s "$out" ]; then
      echo "$out"
      continue
    fi
    case "$type" in
      q5_*) ;;
      *) [ -n "$quantize" ] || quantize="$(llama_quantize)" ;;
    esac
    echo "== re-quantizing the default model to ${type^^}" >&2
    LLAMA_QUANTIZE="$quantize" PYTHONPATH="$llamacpp/gguf-py" \
      "$tools_venv/bin/python" scripts/reference/requantize_model.py \
      --type "$type" --model "$model" --cache "$reference" >&2
    echo "$out"
  done
}

minilm_gguf() {
  local python="${CONVERTER_PYTHON:?set CONVERTER_PYTHON to a python with torch, transformers and mistral_common}"
  LLAMACPP_DIR="$llamacpp" TORCH_PYTHON="$python" scripts/make-minilm-gguf.sh
}

case "${1:-}" in
  requantized) tools; sources; requantized ;;
  minilm-gguf) tools; sources; minilm_gguf ;;
  *) echo "usage: $0 requantized|minilm-gguf" >&2; exit 2 ;;
esac
