#!/usr/bin/env bash
# Issue 16's three speculative-decoding figures in one sitting: output tok/s of `bench serve`
# without speculation, with `ngram` and with `suffix`, alternated run by run (the order rotating
# by round), one server per run (each in its own process session), for
#   grounded  the input_grounded dataset (code edits, quotes), one request at a time;
#   chat      16 short open-ended chat prompts, 128 tokens each, one at a time;
#   c32       128 random 128-token prompts, 64 tokens each (EOS ignored), 32 at a time (four
#             waves: with two, a run lasted ~5 s and rounds swung by 10 %).
# Prints one line per run (output tok/s, mean TTFT and TPOT) and, per workload, the ratio of the
# round means to the plain runs' and each arm's TPOT per round.
# Timing on a shared host drifts by the minute: read the ratios of one sitting, and keep
# builds and other benchmarks off the machine while it runs.
#
# Usage: bench/spec_sitting.sh [ROUNDS]
# Environment (all optional):
#   MODEL          GGUF file (default: the default model in ~/.cache/tokenmill)
#   CHAT_TEMPLATE  --chat-template for models whose file has none (a base model)
#   K=15           num_speculative_tokens; ngram looks up 2..5-token n-grams
#   WORKLOADS      "grounded chat c32" (any subset, in order)
#   TOKENMILL      binary (default: target/release/tokenmill, built if absent)
#   OUT_DIR        results (default: <repo>/bench/results/spec-<timestamp>)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${1:-2}"
MODEL="${MODEL:-$HOME/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
K="${K:-15}"
WORKLOADS="${WORKLOADS:-grounded chat c32}"
TOKENMILL="${TOKENMILL:-$ROOT/target/release/tokenmill}"
OUT_DIR="${OUT_DIR:-$ROOT/bench/results/spec-$(date -u +%Y%m%d-%H%M%S)}"

log() { printf '[spec-sitting] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -f "$MODEL" ]] || die "model file not found: $MODEL (scripts/fetch-model.sh)"
# shellcheck source=bench/common.sh
source "$ROOT/bench/common.sh"
ensure_tokenmill "$TOKENMILL" "$ROOT"
mkdir -p "$OUT_DIR"

cat >"$OUT_DIR/chat.jsonl" <<'JSONL'
{"prompt": "Why is the sky blue?"}
{"prompt": "Write a poem about autumn leaves."}
{"prompt": "What are three tips for staying productive?"}
{"prompt": "Explain how a rainbow forms."}
{"prompt": "Describe your ideal weekend."}
{"prompt": "What is the difference between weather and climate?"}
{"prompt": "Give me a recipe idea for dinner tonight."}
{"prompt": "Why do cats purr?"}
{"prompt": "Write a short story about a lost key."}
{"prompt": "How do airplanes stay in the air?"}
{"prompt": "What makes a good friend?"}
{"prompt": "Suggest a name for a coffee shop and explain it."}
{"prompt": "Why do we dream?"}
{"prompt": "Describe the ocean to someone who has never seen it."}
{"prompt": "What are the benefits of reading books?"}
{"prompt": "Write a limerick about a programmer."}
JSONL

trap stop_tokenmill EXIT INT TERM

# run_one WORKLOAD METHOD ROUND: one server, one `bench serve` (its result in
# OUT_DIR/WORKLOAD-METHOD-rROUND.json). Runs in this shell, so the EXIT trap stops the server
# whatever fails.
run_one() {
    local workload="$1" method="$2" round="$3" port name
    port="$(free_port)"
    name="$workload-$method-r$round"
    local serve=(--model "$MODEL")
    [[ -n "${CHAT_TEMPLATE:-}" ]] && serve+=(--chat-template "$CHAT_TEMPLATE")
    case "$method" in
        none) ;;
        ngram) serve+=(--speculative-config "{\"method\":\"ngram\",\"num_speculative_tokens\":$K,\"prompt_lookup_min\":2,\"prompt_lookup_max\":5}") ;;
        suffix) serve+=(--speculative-config "{\"method\":\"suffix\",\"num_speculative_tokens\":$K}") ;;
    esac
    local load=()
    case "$workload" in
        grounded) load=(--endpoint /v1/chat/completions --dataset-name input_grounded --num-prompts 8
                        --max-concurrency 1 --temperature 0 --num-warmups 1) ;;
        chat) load=(--endpoint /v1/chat/completions --dataset-name custom --dataset-path "$OUT_DIR/chat.jsonl"
                    --custom-output-len 128 --num-prompts 16 --max-concurrency 1 --temperature 0 --num-warmups 1) ;;
        c32) load=(--endpoint /v1/completions --dataset-name random --random-input-len 128
                   --random-output-len 64 --num-prompts 128 --max-concurrency 32 --num-warmups 2 --ignore-eos --seed 0) ;;
        *) die "unknown workload: $workload" ;;
    esac
    start_tokenmill "$TOKENMILL" "$port" "$OUT_DIR/$name.server.log" "${serve[@]}"
    setsid --wait "$TOKENMILL" bench serve --base-url "http://127.0.0.1:$port" "${load[@]}" --disable-tqdm \
        --save-result --result-dir "$OUT_DIR" --result-filename "$name.json" \
        >"$OUT_DIR/$name.txt" 2>&1 || die "bench serve failed (see $OUT_DIR/$name.txt)"
    stop_tokenmill
}

log "model $MODEL, k = $K, $ROUNDS round(s) of: $WORKLOADS; results in $OUT_DIR"
for round in $(seq "$ROUNDS"); do
    # The arms' order rotates by round (none ngram suffix, then ngram suffix none, ...), so a
    # drift of the host within a round does not always favour the same arm.
    methods=(none ngram suffix)
    shift_by=$(( (round - 1) % 3 ))
    order=("${methods[@]:shift_by}" "${methods[@]:0:shift_by}")
    for workload in $WORKLOADS; do
        for method in "${order[@]}"; do
            run_one "$workload" "$method" "$round"
            # Output tok/s, then mean TTFT and TPOT: the plain runs' TPOT shows the host's state
            # (the one-row step streams the weights from the shared cache and moves the most).
            python3 - "$OUT_DIR/$workload-$method-r$round.json" "$workload $method round $round" <<'PY' \
                | tee -a "$OUT_DIR/runs.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}: {r['output_throughput']:.2f} output tok/s, "
      f"TTFT {r['mean_ttft_ms']:.0f} ms, TPOT {r['mean_tpot_ms']:.2f} ms")
PY
        done
    done
done

COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
VERSION="$("$TOKENMILL" --version 2>/dev/null || echo unknown)"
# The table reads the runs' result files (not the lines above): output tok/s and mean TPOT.
python3 - "$OUT_DIR" "$ROUNDS" "$WORKLOADS" "$COMMIT" "$MODEL" "$K" "$VERSION" <<'PY' | tee "$OUT_DIR/table.md"
import json, os, sys
out_dir, rounds, workloads, commit, model, k, version = sys.argv[1:]
methods = ("none", "ngram", "suffix")
def results(workload, method):
    return [json.load(open(os.path.join(out_dir, f"{workload}-{method}-r{r}.json")))
            for r in range(1, int(rounds) + 1)]
print(f"checkout {commit}, binary {version}, model {os.path.basename(model)}, k = {k}")
print()
print("| workload | no speculation | ngram | suffix | ngram / none | suffix / none |")
print("|---|---|---|---|---:|---:|")
tpot_lines = []
for workload in workloads.split():
    runs = {m: results(workload, m) for m in methods}
    tps = {m: [r["output_throughput"] for r in runs[m]] for m in methods}
    cells = [" / ".join(f"{v:.1f}" for v in tps[m]) for m in methods]
    mean = {m: sum(tps[m]) / len(tps[m]) for m in methods}
    print(f"| {workload} | {' | '.join(cells)} | {mean['ngram'] / mean['none']:.2f}x "
          f"| {mean['suffix'] / mean['none']:.2f}x |")
    tpots = [f"{m} " + " / ".join(f"{r['mean_tpot_ms']:.2f}" for r in runs[m]) for m in methods]
    tpot_lines.append(f"- {workload}, mean TPOT ms: {'; '.join(tpots)}")
print()
print("\n".join(tpot_lines))
PY
