#!/usr/bin/env bash
# Time to first token with a long shared prefix already in the prefix cache, against the same
# requests served with prefix caching off.
#
# Every request is PREFIX_LEN shared tokens followed by SUFFIX_LEN random ones (`bench serve`'s
# prefix_repetition dataset with one prefix), sent one at a time. With caching on, the first
# request fills the cache and is left out; the median TTFT of the rest is the cached figure.
# With `--no-enable-prefix-caching` every request prefills the whole prompt: the uncached
# figure. Each server runs in its own process session; the benchmark client too.
#
# Usage: bench/prefix_cache_ttft.sh [GGUF]
# Environment (all optional):
#   MODEL / TOKENMILL_TEST_MODEL   GGUF file (default: the default model in ~/.cache/tokenmill)
#   PREFIX_LEN=1024 SUFFIX_LEN=32 OUTPUT_LEN=4 NUM_PROMPTS=9 THREADS=2
#   TOKENMILL                      binary (default: target/release/tokenmill, built if absent)
#   OUT_DIR                        results (default: <repo>/bench/results/prefix-<timestamp>)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-${MODEL:-${TOKENMILL_TEST_MODEL:-$HOME/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf}}}"
PREFIX_LEN="${PREFIX_LEN:-1024}"
SUFFIX_LEN="${SUFFIX_LEN:-32}"
OUTPUT_LEN="${OUTPUT_LEN:-4}"
NUM_PROMPTS="${NUM_PROMPTS:-9}"
THREADS="${THREADS:-2}"
TOKENMILL="${TOKENMILL:-$ROOT/target/release/tokenmill}"
OUT_DIR="${OUT_DIR:-$ROOT/bench/results/prefix-$(date -u +%Y%m%d-%H%M%S)}"

log() { printf '[prefix-ttft] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -f "$MODEL" ]] || die "model file not found: $MODEL"
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"
ensure_tokenmill "$TOKENMILL" "$ROOT"
mkdir -p "$OUT_DIR"

trap stop_tokenmill EXIT INT TERM

run_mode() {
    local mode="$1" port
    port="$(free_port)"
    local flags=()
    [[ "$mode" == uncached ]] && flags=(--no-enable-prefix-caching)
    log "$mode: starting tokenmill on port $port"
    start_tokenmill "$TOKENMILL" "$port" "$OUT_DIR/$mode-server.log" --model "$MODEL" --threads "$THREADS" \
        --max-model-len $(( PREFIX_LEN + SUFFIX_LEN + OUTPUT_LEN + 64 )) --disable-log-stats \
        "${flags[@]}"
    setsid --wait "$TOKENMILL" bench serve --base-url "http://127.0.0.1:$port" \
        --dataset-name prefix_repetition --prefix-repetition-prefix-len "$PREFIX_LEN" \
        --prefix-repetition-suffix-len "$SUFFIX_LEN" --prefix-repetition-num-prefixes 1 \
        --prefix-repetition-output-len "$OUTPUT_LEN" --num-prompts "$NUM_PROMPTS" \
        --max-concurrency 1 --temperature 0 --seed 0 --ignore-eos --disable-tqdm \
        --save-result --result-dir "$OUT_DIR" --result-filename "$mode.json" \
        >"$OUT_DIR/$mode.txt" 2>&1 || die "bench serve failed (see $OUT_DIR/$mode.txt)"
    stop_tokenmill
}

run_mode cached
run_mode uncached

COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
python3 - "$OUT_DIR" <<PY | tee "$OUT_DIR/table.md"
import json, os, statistics, sys
out = sys.argv[1]
cached = json.load(open(os.path.join(out, "cached.json")))["ttfts"][1:]
uncached = json.load(open(os.path.join(out, "uncached.json")))["ttfts"]
c, u = statistics.median(cached) * 1000, statistics.median(uncached) * 1000
print("# TTFT with a cached prefix")
print()
print("- date: $(date -u +%Y-%m-%dT%H:%M:%SZ); commit: $COMMIT; threads $THREADS")
print("- prompts: $PREFIX_LEN shared + $SUFFIX_LEN random tokens, $OUTPUT_LEN output, one at a time")
print()
print("| | median TTFT (ms) | requests |")
print("|---|---:|---:|")
print(f"| prefix cached (first request excluded) | {c:.1f} | {len(cached)} |")
print(f"| prefix caching off | {u:.1f} | {len(uncached)} |")
print()
print(f"cached / uncached = {c / u:.3f}")
PY
log "results in $OUT_DIR"
