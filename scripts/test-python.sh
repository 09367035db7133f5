#!/usr/bin/env bash
# Real-HTTP tests of `tokenmill serve` with the official `openai` Python client, httpx and
# LangChain (`langchain-openai`), and the KV-event subscriber (pyzmq, msgpack, msgspec):
# sets up a pinned virtualenv in .cache/venv-tests (git-ignored, reused while the pins are
# unchanged), makes sure target/release/tokenmill exists and is not older than the sources,
# and runs pytest over tests/python. Extra arguments go to pytest (e.g. -k drain).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.cache/venv-tests
REQUIREMENTS=(openai==3.54.0 pytest==9.2.0 httpx==0.28.1 langchain-openai==1.7.3 langchain-core==1.7.0 jsonschema==4.25.1 pyzmq==27.3.0 msgpack==1.2.4 msgspec==0.22.0)
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
