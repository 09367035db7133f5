#!/usr/bin/env bash
# Real-HTTP tests of `tokenmill serve` with the official `openai` Python client, httpx and
# LangChain (`langchain-openai`), the KV-event subscriber (pyzmq, msgpack, msgspec), and the
# tools vLLM users point at a server: lm-eval, GuideLLM and schemathesis (tests/python/
# test_eval_tools.py, test_openapi_schemathesis.py):
# sets up a pinned virtualenv in .cache/venv-tests (git-ignored, reused while the pins are
# unchanged), makes sure target/release/tokenmill exists and is not older than the sources,
# and runs pytest over tests/python. Extra arguments go to pytest (e.g. -k drain).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.cache/venv-tests
REQUIREMENTS=(openai==3.54.0 pytest==9.2.0 httpx==0.28.1 langchain-openai==1.7.3 langchain-core==1.7.0 jsonschema==4.25.1 pyzmq==27.3.0 msgpack==1.2.4 msgspec==0.22.0)
# lm-eval's core and its `api` extra (local-completions) need no torch. GuideLLM does: its
# data pipeline is built on torch.utils.data (guidellm/data/loaders/torch.py imports torch
# at start-up), and PyPI's only Linux x86-64 torch wheel is the CUDA build, whose import
# fails without its nvidia-* libraries (checked: `pip install --no-deps torch` then
# `import torch` raises "libcublasLt.so.* not found"). So the venv carries torch with them,
# ~6 GB installed, 5.5 to 8.5 minutes to create here, once per CI run (kept in .cache/ after that
# on a developer machine); nothing in it touches a GPU.
REQUIREMENTS+=("lm-eval[api]==0.4.13" guidellm==0.8.1 torch==2.15.0 schemathesis==4.32.5)
# shellcheck source=lib/pinned-venv.sh
source scripts/lib/pinned-venv.sh
pinned_venv "$VENV" "${REQUIREMENTS[@]}"

BINARY=target/release/tokenmill
if [ ! -x "$BINARY" ] || [ -n "$(find crates Cargo.toml Cargo.lock -newer "$BINARY" -print -quit)" ]; then
  echo "== building $BINARY"
  cargo build --release -p tokenmill
fi

export TOKENMILL_BINARY="${TOKENMILL_BINARY:-$PWD/$BINARY}"
exec "$VENV/bin/python" -m pytest tests/python -q -p no:cacheprovider "$@"
