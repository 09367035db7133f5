#!/usr/bin/env bash
# Offline forward-pass speed: tokenmill vs llama.cpp on the same GGUF.
#
# llama.cpp is timed by its own tools (PEER=llama-bench: llama-bench and llama-batched-bench,
# built from the llama.cpp sources vendored in the pinned llama-cpp-python sdist; no Python in
# the timed loop) or through llama-cpp-python's bindings (PEER=llama-cpp-python, which samples
# each token with numpy like tokenmill does).
#
# Runs `tokenmill bench speed` and bench/llamacpp_speed.py with the same figures and threads
# (prefill tok/s of one PROMPT_LEN prompt; single-stream decode tok/s from an empty context,
# like llama-bench's tg, and after the prompt; batched decode tok/s of BATCH sequences),
# alternating which engine goes first, ROUNDS times, each run in its own process session
# (`setsid`). Both engines report GFLOP/s and weight GB/s with the same accounting against the
# machine peaks tokenmill's probes measure. Prints a markdown table (figure | tokenmill |
# llama.cpp | ratio, medians over rounds) with date, commit and machine, and keeps every raw
# JSON and log under OUT_DIR.
#
# Usage: bench/compare_speed.sh [GGUF]
# Environment (all optional):
#   MODEL / TOKENMILL_TEST_MODEL  GGUF file (default: ~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   THREADS=2                 compute threads for both engines
#   ROUNDS=3                  alternations; the table shows the median over rounds
#   REPEATS=3                 runs of each figure inside one process (each reports its median)
#   PROMPT_LEN=512 DECODE_LEN=128 BATCH=64 BATCH_PROMPT_LEN=32 BATCH_DECODE_STEPS=32
#   ONLY                      figures to measure, comma-separated (prefill, decode, batched; default: all)
#   PEER=llama-bench          llama-bench (native tools) or llama-cpp-python
#   LLAMACPP_ARGS             extra flags for llamacpp_speed.py (e.g. "--flash-attn --kv-unified")
#   LLAMACPP_VENV             a venv with llama-cpp-python[server]==0.3.16 and numpy, e.g. /work/cache/refvenv;
#                             default: $CACHE_DIR/llamacpp-venv (created and installed if missing)
#   CACHE_DIR                 git-ignored cache (default: <repo>/.cache/bench)
#   OUT_DIR                   where results go (default: <repo>/bench/results/speed-<timestamp>)
#   TOKENMILL                 the tokenmill binary (default: target/release/tokenmill, built if absent)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-${MODEL:-${TOKENMILL_TEST_MODEL:-$HOME/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf}}}"
THREADS="${THREADS:-2}"
ROUNDS="${ROUNDS:-3}"
REPEATS="${REPEATS:-3}"
PROMPT_LEN="${PROMPT_LEN:-512}"
DECODE_LEN="${DECODE_LEN:-128}"
BATCH="${BATCH:-64}"
BATCH_PROMPT_LEN="${BATCH_PROMPT_LEN:-32}"
BATCH_DECODE_STEPS="${BATCH_DECODE_STEPS:-32}"
LLAMACPP_ARGS="${LLAMACPP_ARGS:-}"
PEER="${PEER:-llama-bench}"
CACHE_DIR="${CACHE_DIR:-$ROOT/.cache/bench}"
LLAMACPP_VENV="${LLAMACPP_VENV:-$CACHE_DIR/llamacpp-venv}"
OUT_DIR="${OUT_DIR:-$ROOT/bench/results/speed-$(date -u +%Y%m%d-%H%M%S)}"
TOKENMILL="${TOKENMILL:-$ROOT/target/release/tokenmill}"

log() { printf '[compare-speed] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -f "$MODEL" ]] || die "model file not found: $MODEL (set MODEL=/path/to.gguf)"
[[ "$PEER" == llama-bench || "$PEER" == llama-cpp-python ]] \
    || die "PEER must be llama-bench or llama-cpp-python, not $PEER"
command -v python3 >/dev/null || die "python3 is required"
mkdir -p "$CACHE_DIR" "$OUT_DIR"

# --- tokenmill binary and llama-cpp-python, pinned -------------------------------------------
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"
ensure_tokenmill "$TOKENMILL" "$ROOT"
ensure_llamacpp_venv "$LLAMACPP_VENV" "$CACHE_DIR"
PYTHON="$LLAMACPP_VENV/bin/python"
PEER_ARGS=()
if [[ "$PEER" == llama-bench ]]; then
    ensure_llamacpp_native "$CACHE_DIR"
    PEER_ARGS=(--native-bin "$LLAMACPP_BIN")
fi

LENGTHS=(--prompt-len "$PROMPT_LEN" --decode-len "$DECODE_LEN" --batch "$BATCH"
         --batch-prompt-len "$BATCH_PROMPT_LEN" --batch-decode-steps "$BATCH_DECODE_STEPS"
         --repeats "$REPEATS")
[[ -n "${ONLY:-}" ]] && LENGTHS+=(--only "$ONLY")
PEAK_ARGS=()

run_tokenmill() {
    local round="$1"
    log "round $round: tokenmill"
    setsid --wait "$TOKENMILL" bench speed --model "$MODEL" --threads "$THREADS" "${LENGTHS[@]}" \
        --json "$OUT_DIR/tokenmill-r$round.json" >"$OUT_DIR/tokenmill-r$round.txt" 2>&1 \
        || { tail -n 30 "$OUT_DIR/tokenmill-r$round.txt" >&2; die "tokenmill bench speed failed"; }
    # llama.cpp's percentages use the peaks tokenmill measured most recently.
    mapfile -t PEAK_ARGS < <(python3 - "$OUT_DIR/tokenmill-r$round.json" <<'PY'
import json, sys
machine = json.load(open(sys.argv[1]))["machine"]
print("--peak-gflops"); print(machine["peak_gflops"])
print("--peak-read-gbs"); print(machine["peak_read_gbs"])
PY
)
}

run_llamacpp() {
    local round="$1"
    log "round $round: llama.cpp"
    # shellcheck disable=SC2086  # LLAMACPP_ARGS is a list of flags
    setsid --wait "$PYTHON" "$ROOT/bench/llamacpp_speed.py" --model "$MODEL" --threads "$THREADS" \
        "${LENGTHS[@]}" "${PEAK_ARGS[@]}" "${PEER_ARGS[@]}" $LLAMACPP_ARGS --json "$OUT_DIR/llamacpp-r$round.json" \
        >"$OUT_DIR/llamacpp-r$round.txt" 2>&1 \
        || { tail -n 30 "$OUT_DIR/llamacpp-r$round.txt" >&2; die "llamacpp_speed.py failed"; }
}

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
for (( round = 1; round <= ROUNDS; round++ )); do
    if (( round % 2 == 1 )); then
        run_tokenmill "$round"; run_llamacpp "$round"
    else
        # Peaks for llama.cpp's percentages come from the previous round's tokenmill run.
        run_llamacpp "$round"; run_tokenmill "$round"
    fi
done

# --- the table -------------------------------------------------------------------------------
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
CPU_MODEL="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
CORES="$(nproc)"
LLAMACPP_ISA="$(llamacpp_isa)"
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null | head -n 1)" ]]; then COMMIT="$COMMIT (dirty)"; fi

python3 - "$OUT_DIR" "$ROUNDS" <<PY | tee "$OUT_DIR/table.md"
import json, os, statistics, sys
out_dir, rounds = sys.argv[1], int(sys.argv[2])
load = lambda engine: [json.load(open(os.path.join(out_dir, f"{engine}-r{r}.json"))) for r in range(1, rounds + 1)]
tm, ll = load("tokenmill"), load("llamacpp")
med = lambda runs, get: statistics.median(v for v in (get(run) for run in runs) if v is not None) if any(get(run) is not None for run in runs) else None
peak_gflops = med(tm, lambda r: r["machine"]["peak_gflops"])
peak_gbs = med(tm, lambda r: r["machine"]["peak_read_gbs"])
settings = tm[0]["settings"]
print("# tokenmill vs llama.cpp: forward-pass speed (" + ll[0]["version"] + ")")
print()
print("- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)")
print("- commit: $COMMIT")
print("- machine: $CPU_MODEL, $CORES cores; measured peaks (tokenmill's probes, median of rounds): "
      f"f32 FMA {peak_gflops:.1f} GFLOP/s, memory read {peak_gbs:.1f} GB/s")
print("- SIMD paths: tokenmill " + tm[0]["machine"]["cpu_features"] + "; llama.cpp (GGML_NATIVE build) $LLAMACPP_ISA")
print("- load average (1/5/15 min) before: $LOAD_BEFORE, after: $LOAD_AFTER (other work on the machine skews both engines; llama.cpp's spinning threads suffer most)")
print(f"- model: $(basename "$MODEL"); threads $THREADS; {rounds} round(s), engines alternated, "
      f"each figure the median of {settings['repeats']} runs per round, then the median over rounds")
print("- llama.cpp: " + ", ".join(f"{k} {v}" for k, v in ll[0]["settings"].items()
                                  if k in ("n_batch", "n_ubatch", "flash_attn", "kv_unified", "type_k", "type_v", "mmap")))
print()
print("| figure | tokenmill | llama.cpp | tokenmill / llama.cpp |")
print("|---|---:|---:|---:|")
keys = [k for k in ("prefill", "decode", "decode_long", "batched") if k in tm[0]["phases"] and k in ll[0]["phases"]]
for key in keys:
    label = tm[0]["phases"][key]["label"]
    short = label.split(" tok/s")[0]
    # Percentages of the one pair of peaks in the header, for both engines.
    for name, field, peak, fmt in (("", "tok_s", None, ".1f"), ("ms/step", "ms_per_step", None, ".2f"),
                                   ("GFLOP/s", "gflops", peak_gflops, ".1f"),
                                   ("weight GB/s", "weight_gbs", peak_gbs, ".2f")):
        def cell(runs):
            value = med(runs, lambda r: r["phases"][key][field])
            if value is None:
                return None, "n/a"
            text = format(value, fmt)
            return value, f"{text} ({100 * value / peak:.0f} % of peak)" if peak else text
        (a, a_text), (b, b_text) = cell(tm), cell(ll)
        ratio = f"{a / b:.2f}x" if a is not None and b else "n/a"
        row = label if not name else f"&nbsp;&nbsp;{short}: {name}"
        print(f"| {row} | {a_text} | {b_text} | {ratio} |")
print()
print("tok/s, GFLOP/s and GB/s ratios above 1 favour tokenmill; ms/step ratios below 1 favour tokenmill.")
print("GFLOP/s count matmul + attention FLOPs and weight GB/s the weights a step reads, with the same")
print("accounting for both engines (see \"accounting\" in the JSON files).")
PY
log "results and logs in $OUT_DIR"
