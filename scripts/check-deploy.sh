#!/usr/bin/env bash
# Offline checks of deploy/ (deploy/ci/check_deploy.py says what is checked): the Kubernetes
# manifests with kubernetes-validate, the custom resources against deploy/schemas/, probes and
# the shutdown arithmetic, `tokenmill serve` flags against the binary's --help, the container
# recipe's build step against CI's; then a self-test that breaks each of those and must see it
# caught, and, when TOKENMILL_TEST_MODEL is set, the recipe's command line run on the CI binary
# until /health answers. Sets up a pinned virtualenv in .cache/venv-deploy (git-ignored, reused
# while the pins are unchanged); needs PyPI only for that.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.cache/venv-deploy
REQUIREMENTS=(kubernetes-validate==1.34.1 jsonschema==4.26.0 pyyaml==6.0.3)
# shellcheck source=lib/pinned-venv.sh
source scripts/lib/pinned-venv.sh
pinned_venv "$VENV" "${REQUIREMENTS[@]}"

BINARY=target/release/tokenmill
if [ -z "${TOKENMILL_BINARY:-}" ] && { [ ! -x "$BINARY" ] || [ -n "$(find crates Cargo.toml Cargo.lock -newer "$BINARY" -print -quit)" ]; }; then
  echo "== building $BINARY"
  cargo build --release -p tokenmill
fi

SMOKE=()
if [ -n "${TOKENMILL_TEST_MODEL:-}" ]; then
  SMOKE=(--smoke-model "$TOKENMILL_TEST_MODEL")
fi
exec "$VENV/bin/python" deploy/ci/check_deploy.py --root . \
  --binary "${TOKENMILL_BINARY:-$PWD/$BINARY}" --self-test "${SMOKE[@]}"
