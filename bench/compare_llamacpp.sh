#!/usr/bin/env bash
# Head-to-head: tokenmill vs llama.cpp's HTTP server on the same GGUF file.
#
# The peer (PEER) is llama.cpp's own `llama-server` with one slot per client (`--parallel` =
# the highest concurrency, continuous batching, a KV stream per slot), built from the llama.cpp
# sources vendored in the pinned llama-cpp-python sdist; or llama-cpp-python's server, which
# decodes one request at a time and queues the rest.
#
# Both servers get the same threads and context; the identical `tokenmill bench serve`
# workload (random prompts, INPUT_LEN in / OUTPUT_LEN out, greedy, EOS ignored) runs against
# each at every concurrency, alternating which server goes first. Each benchmark runs in its
# own process session, and the idle server is paused (SIGSTOP) meanwhile so it cannot steal
# CPU. Prints a side-by-side markdown table with ratios and the machine, and keeps the raw
# result files.
#
# Usage: bench/compare_llamacpp.sh [GGUF]
# Environment (all optional):
#   MODEL / TOKENMILL_TEST_MODEL  GGUF file (default: ~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   THREADS=2                 compute threads for both servers
#   CONCURRENCIES="1 8 32"    client concurrency levels
#   INPUT_LEN=128 OUTPUT_LEN=128
#   PEER=llama-server         llama-server (batches up to the highest concurrency) or
#                             llama-cpp-python (one request at a time)
#   LLAMA_SERVER_CTX          llama-server's total KV context, split evenly over its slots
#                             (default: highest concurrency × (INPUT_LEN + OUTPUT_LEN + 64)).
#                             Not --kv-unified: with one shared buffer every slot's attention
#                             spans the cells the others (and their cached prompts) hold, which
#                             slowed a C=1 request from 7.5 to 36 ms per token after a C=32 run
#   NUM_PROMPTS               requests per run (default: max(8, 2 × concurrency))
#   ROUNDS=3                  repetitions of the whole alternation; the table shows medians
#                             (values and per-round ratios)
#   CTX=2048                  context length for both servers
#   LLAMACPP_VENV             (PEER=llama-cpp-python) a venv that has (or will get)
#                             llama-cpp-python[server]==0.3.16, e.g. /work/cache/refvenv;
#                             default: $CACHE_DIR/llamacpp-venv
#   CACHE_DIR                 git-ignored cache (default: <repo>/.cache/bench); holds the
#                             llama.cpp build (compiled once), the venv and pip's wheel cache
#   OUT_DIR                   where results go (default: <repo>/bench/results/<timestamp>)
#   TOKENMILL                 the tokenmill binary (default: target/release/tokenmill, built if absent)
#   SERVER_START_TIMEOUT=300  seconds to wait for each server to answer
#   TOKENMILL_ARGS            extra flags for `tokenmill serve`, e.g. "--kv-cache-memory 1GiB"
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-${MODEL:-${TOKENMILL_TEST_MODEL:-$HOME/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf}}}"
THREADS="${THREADS:-2}"
CONCURRENCIES="${CONCURRENCIES:-1 8 32}"
INPUT_LEN="${INPUT_LEN:-128}"
OUTPUT_LEN="${OUTPUT_LEN:-128}"
ROUNDS="${ROUNDS:-3}"
CTX="${CTX:-2048}"
PEER="${PEER:-llama-server}"
CACHE_DIR="${CACHE_DIR:-$ROOT/.cache/bench}"
LLAMACPP_VENV="${LLAMACPP_VENV:-$CACHE_DIR/llamacpp-venv}"
OUT_DIR="${OUT_DIR:-$ROOT/bench/results/$(date -u +%Y%m%d-%H%M%S)}"
TOKENMILL="${TOKENMILL:-$ROOT/target/release/tokenmill}"
SERVER_START_TIMEOUT="${SERVER_START_TIMEOUT:-300}"
SERVED_NAME="bench-model"

log() { printf '[compare] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -f "$MODEL" ]] || die "model file not found: $MODEL (set MODEL=/path/to.gguf)"
[[ "$PEER" == llama-server || "$PEER" == llama-cpp-python ]] \
    || die "PEER must be llama-server or llama-cpp-python, not $PEER"
command -v python3 >/dev/null || die "python3 is required"
command -v curl >/dev/null || die "curl is required"
mkdir -p "$CACHE_DIR" "$OUT_DIR"

# --- tokenmill binary and the llama.cpp peer, pinned -----------------------------------------
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"
ensure_tokenmill "$TOKENMILL" "$ROOT"
MAX_C=1
for c in $CONCURRENCIES; do (( c > MAX_C )) && MAX_C=$c; done
if [[ "$PEER" == llama-server ]]; then
    ensure_llamacpp_native "$CACHE_DIR"
    LLAMA_SERVER_CTX="${LLAMA_SERVER_CTX:-$(( MAX_C * (INPUT_LEN + OUTPUT_LEN + 64) ))}"
    PEER_LABEL="llama-server, llama.cpp vendored in llama-cpp-python $LLAMA_CPP_PYTHON_VERSION; --parallel $MAX_C, --ctx-size $LLAMA_SERVER_CTX split over the slots"
    # llama-server honours ignore_eos itself.
    LLAMA_EXTRA_BODY='{}'
else
    ensure_llamacpp_venv "$LLAMACPP_VENV" "$CACHE_DIR"
    PYTHON="$LLAMACPP_VENV/bin/python"
    PEER_LABEL="llama-cpp-python $LLAMA_CPP_PYTHON_VERSION's server, one request at a time"
    # llama-cpp-python ignores vLLM's ignore_eos; a -100 logit bias on every end-of-generation
    # candidate (eos/eot/eom ids and all control tokens, e.g. <|endoftext|>) gives it the same
    # fixed-length work. Ids come from the GGUF metadata (gguf ships with llama-cpp-python).
    LLAMA_EXTRA_BODY="$("$PYTHON" - "$MODEL" <<'PY' 2>/dev/null || echo '{}'
import json, sys
try:
    from gguf import GGUFReader
except ImportError:
    print("{}"); sys.exit(0)
reader = GGUFReader(sys.argv[1])
ids = set()
for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
    field = reader.fields.get(key)
    if field is not None:
        ids.add(int(field.parts[field.data[0]][0]))
types = reader.fields.get("tokenizer.ggml.token_type")
if types is not None:
    CONTROL = 3
    ids.update(i for i, part in enumerate(types.data) if int(types.parts[part][0]) == CONTROL)
print(json.dumps({"logit_bias": {str(i): -100.0 for i in sorted(ids)}}))
PY
)"
fi
log "llama.cpp extra body: $LLAMA_EXTRA_BODY"

# --- servers, each in its own session ----------------------------------------------------------
declare -A SERVER_PID=()
cleanup() {
    local name pid
    for name in "${!SERVER_PID[@]}"; do
        pid="${SERVER_PID[$name]}"
        kill -CONT -- "-$pid" 2>/dev/null || true
        kill -TERM -- "-$pid" 2>/dev/null || true
    done
    sleep 1
    for name in "${!SERVER_PID[@]}"; do
        kill -KILL -- "-${SERVER_PID[$name]}" 2>/dev/null || true
    done
}
trap cleanup EXIT INT TERM

# start_server NAME URL_TO_POLL COMMAND...: a new session whose id is the server's pid.
start_server() {
    local name="$1" probe="$2"; shift 2
    log "starting $name: $*"
    setsid "$@" >"$OUT_DIR/$name-server.log" 2>&1 &
    SERVER_PID[$name]=$!
    local waited=0
    until curl -fsS -o /dev/null "$probe"; do
        kill -0 "${SERVER_PID[$name]}" 2>/dev/null || { tail -n 30 "$OUT_DIR/$name-server.log" >&2; die "$name exited during start-up"; }
        (( waited++ < SERVER_START_TIMEOUT )) || die "$name did not answer $probe within ${SERVER_START_TIMEOUT}s"
        sleep 1
    done
    log "$name is up (pid ${SERVER_PID[$name]})"
}

pause_server() { kill -STOP -- "-${SERVER_PID[$1]}"; }
resume_server() { kill -CONT -- "-${SERVER_PID[$1]}"; }

TM_PORT="$(free_port)"
read -r -a EXTRA_TOKENMILL_ARGS <<<"${TOKENMILL_ARGS:-}"
start_server tokenmill "http://127.0.0.1:$TM_PORT/health" \
    "$TOKENMILL" serve --model "$MODEL" --host 127.0.0.1 --port "$TM_PORT" \
    --threads "$THREADS" --max-model-len "$CTX" --max-num-seqs "$MAX_C" \
    --served-model-name "$SERVED_NAME" --disable-log-stats "${EXTRA_TOKENMILL_ARGS[@]}"
pause_server tokenmill

LLAMA_PORT="$(free_port)"
if [[ "$PEER" == llama-server ]]; then
    # One slot per client so requests batch (continuous batching is on by default), each slot
    # with its own KV stream of LLAMA_SERVER_CTX / MAX_C tokens.
    start_server llamacpp "http://127.0.0.1:$LLAMA_PORT/health" \
        "$LLAMACPP_BIN/llama-server" --model "$MODEL" --host 127.0.0.1 --port "$LLAMA_PORT" \
        --threads "$THREADS" --threads-batch "$THREADS" --ctx-size "$LLAMA_SERVER_CTX" \
        --parallel "$MAX_C" --cont-batching --alias "$SERVED_NAME" --no-webui
else
    # llama-cpp-python serves one request at a time; by default a new request interrupts the one
    # being generated (cutting it short), so interruption is turned off: later requests queue.
    start_server llamacpp "http://127.0.0.1:$LLAMA_PORT/v1/models" \
        "$PYTHON" -m llama_cpp.server --model "$MODEL" --host 127.0.0.1 --port "$LLAMA_PORT" \
        --n_threads "$THREADS" --n_threads_batch "$THREADS" --n_ctx "$CTX" --model_alias "$SERVED_NAME" \
        --interrupt_requests False
fi
pause_server llamacpp

# --- the identical workload against each, alternating ------------------------------------------
run_bench() {
    local server="$1" port="$2" concurrency="$3" round="$4"
    local prompts="${NUM_PROMPTS:-$(( concurrency * 2 > 8 ? concurrency * 2 : 8 ))}"
    local extra=()
    [[ "$server" == llamacpp ]] && extra=(--extra-body "$LLAMA_EXTRA_BODY")
    log "round $round, C=$concurrency: $server ($prompts prompts)"
    resume_server "$server"
    setsid --wait "$TOKENMILL" bench serve \
        --base-url "http://127.0.0.1:$port" --model "$SERVED_NAME" \
        --dataset-name random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" \
        --num-prompts "$prompts" --max-concurrency "$concurrency" --num-warmups 2 \
        --ignore-eos --temperature 0 --seed 0 \
        --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
        --save-result --result-dir "$OUT_DIR" --result-filename "$server-c$concurrency-r$round.json" \
        --disable-tqdm "${extra[@]}" \
        >"$OUT_DIR/$server-c$concurrency-r$round.txt" 2>&1 \
        || { pause_server "$server"; tail -n 30 "$OUT_DIR/$server-c$concurrency-r$round.txt" >&2; die "bench against $server failed"; }
    pause_server "$server"
}

step=0
for (( round = 1; round <= ROUNDS; round++ )); do
    for c in $CONCURRENCIES; do
        if (( step % 2 == 0 )); then order=(tokenmill llamacpp); else order=(llamacpp tokenmill); fi
        for server in "${order[@]}"; do
            if [[ "$server" == tokenmill ]]; then port="$TM_PORT"; else port="$LLAMA_PORT"; fi
            run_bench "$server" "$port" "$c" "$round"
        done
        step=$(( step + 1 ))
    done
done

# --- the table -------------------------------------------------------------------------------
CPU_MODEL="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
CORES="$(nproc)"
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null | head -n 1)" ]]; then COMMIT="$COMMIT (dirty)"; fi

# Peak resident memory of each server over the whole run (the kernel's high-water mark).
peak_rss_mib() { awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo 0; }
TM_RSS="$(peak_rss_mib "${SERVER_PID[tokenmill]}")"
LLAMA_RSS="$(peak_rss_mib "$(pgrep -s "${SERVER_PID[llamacpp]}" -f 'llama_cpp.server|llama-server' | head -n 1)")"
TM_MEMORY_LINE="$(grep -ho 'Available KV cache memory: .*' "$OUT_DIR/tokenmill-server.log" | head -n 1 | sed 's/\x1b\[[0-9;]*m//g')"

python3 - "$OUT_DIR" "$ROUNDS" "$CONCURRENCIES" <<PY | tee "$OUT_DIR/table.md"
import json, os, statistics, sys
out_dir, rounds, levels = sys.argv[1], int(sys.argv[2]), [int(c) for c in sys.argv[3].split()]
def runs(server, c):
    return [json.load(open(os.path.join(out_dir, f"{server}-c{c}-r{r}.json"))) for r in range(1, rounds + 1)]
rows = [
    ("output tok/s", "output_throughput"),
    ("total tok/s", "total_token_throughput"),
    ("requests/s", "request_throughput"),
    ("TTFT p50 (ms)", "median_ttft_ms"),
    ("TTFT p99 (ms)", "p99_ttft_ms"),
    ("TPOT p50 (ms)", "median_tpot_ms"),
    ("ITL p50 (ms)", "median_itl_ms"),
    ("ITL p99 (ms)", "p99_itl_ms"),
    ("E2E p50 (ms)", "median_e2el_ms"),
    ("completed", "completed"),
    ("failed", "failed"),
    ("input tokens", "total_input_tokens"),
    ("output tokens", "total_output_tokens"),
]
print("# tokenmill vs llama.cpp ($PEER_LABEL)")
print()
print("- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)")
print("- commit: $COMMIT")
print("- machine: $CPU_MODEL, $CORES cores")
print("- model: $(basename "$MODEL"); threads $THREADS; context $CTX")
print(f"- workload: random, $INPUT_LEN in / $OUTPUT_LEN out, greedy, EOS ignored; {rounds} round(s), servers alternated")
print("- peak RSS over the run: tokenmill $TM_RSS MiB ($TM_MEMORY_LINE), llama.cpp $LLAMA_RSS MiB")
print()
print(f"Values are medians over the {rounds} rounds; the ratio is the median of the per-round ratios.")
print()
print("| C | metric | tokenmill | llama.cpp | tokenmill / llama.cpp |")
print("|---:|---|---:|---:|---:|")
for c in levels:
    tm, ll = runs("tokenmill", c), runs("llamacpp", c)
    for label, key in rows:
        a = [run.get(key) or 0 for run in tm]
        b = [run.get(key) or 0 for run in ll]
        ratios = [x / y for x, y in zip(a, b) if y]
        ratio = f"{statistics.median(ratios):.2f}x" if ratios else "n/a"
        digits = 0 if key in ("completed", "failed", "total_input_tokens", "total_output_tokens") else 2
        print(f"| {c} | {label} | {statistics.median(a):.{digits}f} | {statistics.median(b):.{digits}f} | {ratio} |")
print()
print("Throughput ratios above 1 favour tokenmill; latency ratios below 1 favour tokenmill.")
PY
log "results and logs in $OUT_DIR"
