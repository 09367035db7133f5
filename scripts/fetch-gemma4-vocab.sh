#!/usr/bin/env bash
# Fetch Gemma 4's real tokenizer as a vocabulary-only GGUF into the model cache, idempotently.
# llama.cpp keeps it for its tokenizer tests (models/ggml-vocab-gemma-4.gguf, 16 MB: Gemma 4's
# 262,144 tokens and 514,906 merges, no weights); the pinned llama-cpp-python 0.3.36 sdist
# (vendored llama.cpp 0c1e570, the one the Gemma 4 fixtures were made with) ships it, so the
# sdist is downloaded from PyPI into a temporary directory, the one file extracted and checked
# against its sha256. Cache dir: $TOKENMILL_MODEL_DIR, else ~/.cache/tokenmill/models. Prints
# the file's path.
set -euo pipefail
dir="${TOKENMILL_MODEL_DIR:-$HOME/.cache/tokenmill/models}"
name="ggml-vocab-gemma-4.gguf"
version="0.3.36"
member="llama_cpp_python-$version/vendor/llama.cpp/models/$name"
sha256="58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65"
target="$dir/$name"
if [ -s "$target" ]; then
  echo "$target"
  exit 0
fi
mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetching the llama-cpp-python $version sdist from PyPI ..." >&2
if ! python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
  "llama-cpp-python==$version" -d "$tmp" >&2; then
  echo "error: could not download llama-cpp-python $version from PyPI (is pip installed and PyPI reachable?)" >&2
  exit 1
fi
tar -xzf "$tmp/llama_cpp_python-$version.tar.gz" -C "$tmp" "$member"
actual="$(sha256sum "$tmp/$member" | cut -d' ' -f1)"
if [ "$actual" != "$sha256" ]; then
  echo "error: sha256 $actual of $name does not match $sha256" >&2
  exit 1
fi
mv "$tmp/$member" "$target.partial"
mv "$target.partial" "$target"
echo "$target"
