#!/usr/bin/env bash
# Real-HTTP tests of `tokenmill serve` with the official `openai` and `anthropic` Python clients, httpx and
# LangChain (`langchain-openai`, `langchain-anthropic`), the KV-event subscriber (pyzmq, msgpack,
# msgspec), the coding agents OpenAI's Codex CLI (`codex exec` with tokenmill as its provider,
# tests/python/test_codex.py) and Anthropic's Claude Code (`claude -p`, test_claude_code.py), and the
# tools vLLM users point at a server: lm-eval, GuideLLM and schemathesis (tests/python/
# test_eval_tools.py, test_openapi_schemathesis.py):
# sets up a pinned virtualenv in .cache/venv-tests (git-ignored, reused while the pins are
# unchanged), makes sure target/release/tokenmill exists and is not older than the sources,
# and runs pytest over tests/python. Extra arguments go to pytest (e.g. -k drain).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.cache/venv-tests
# Every package pinned in tests/python/requirements.lock (top-level list and how to regenerate
# it in its header), installed with --no-deps. lm-eval's core and its `api` extra
# (local-completions) need no torch. GuideLLM does: its data pipeline is built on
# torch.utils.data (guidellm/data/loaders/torch.py imports torch at start-up), and PyPI's only
# Linux x86-64 torch wheel is the CUDA build, whose import fails without its nvidia-* libraries
# (checked: `pip install --no-deps torch` then `import torch` raises "libcublasLt.so.* not
# found"). So the venv carries torch with them, but not triton (see the lock file): ~5.4 GB
# installed, about 2 minutes to create here, once per CI run (kept in .cache/ after that on a
# developer machine); nothing in it touches a GPU.
# shellcheck source=lib/pinned-venv.sh
source scripts/lib/pinned-venv.sh
pinned_venv "$VENV" --no-deps -r tests/python/requirements.lock

# The coding agents, pinned, in .cache/npm (git-ignored): Codex CLI for
# tests/python/test_codex.py and Claude Code for tests/python/test_claude_code.py. Both go in
# one npm command (an `npm install --no-save` prunes what an earlier one put there) and are
# reinstalled only when a pin changes. Without npm their variables stay unset: the tests skip,
# or fail under TOKENMILL_REQUIRE_ASSETS=1 (scripts/test.sh). Claude Code's postinstall must run
# (npm 11 warns "not yet covered by allowScripts" but runs it): it puts the native binary of the
# optional dependency @anthropic-ai/claude-code-linux-x64 behind bin/claude.exe, which is a stub
# before (with --ignore-scripts the test fails with "Exec format error"). It needs no network.
CODEX_VERSION=0.171.0
CLAUDE_VERSION=2.1.197
NPM_PREFIX=.cache/npm
if command -v npm >/dev/null && { [ -z "${TOKENMILL_CODEX:-}" ] || [ -z "${TOKENMILL_CLAUDE:-}" ]; }; then
  installed() {
    node -p "require('./$NPM_PREFIX/node_modules/$1/package.json').version" 2>/dev/null || true
  }
  if [ "$(installed @openai/codex)" != "$CODEX_VERSION" ] \
    || [ "$(installed @anthropic-ai/claude-code)" != "$CLAUDE_VERSION" ]; then
    echo "== installing @openai/codex@$CODEX_VERSION and @anthropic-ai/claude-code@$CLAUDE_VERSION into $NPM_PREFIX"
    npm install --prefix "$NPM_PREFIX" --no-save --no-audit --no-fund \
      "@openai/codex@$CODEX_VERSION" "@anthropic-ai/claude-code@$CLAUDE_VERSION" >&2
  fi
  export TOKENMILL_CODEX="${TOKENMILL_CODEX:-$PWD/$NPM_PREFIX/node_modules/.bin/codex}"
  export TOKENMILL_CLAUDE="${TOKENMILL_CLAUDE:-$PWD/$NPM_PREFIX/node_modules/.bin/claude}"
fi

BINARY=target/release/tokenmill
if [ ! -x "$BINARY" ] || [ -n "$(find crates Cargo.toml Cargo.lock -newer "$BINARY" -print -quit)" ]; then
  echo "== building $BINARY"
  cargo build --release -p tokenmill
fi

export TOKENMILL_BINARY="${TOKENMILL_BINARY:-$PWD/$BINARY}"
exec "$VENV/bin/python" -m pytest tests/python -q -p no:cacheprovider "$@"
