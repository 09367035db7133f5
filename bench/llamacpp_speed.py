#!/usr/bin/env python3
"""llama.cpp's forward-pass speed on a GGUF, in `tokenmill bench speed --json`'s schema.

Measures, through llama-cpp-python's low-level API (pinned: 0.3.16), the figures
`tokenmill bench speed` measures, so `bench/compare_speed.sh` can put them side by side:

  prefill      one --prompt-len prompt in a single llama_decode (n_batch = n_ubatch = 512 by
               default, as llama-bench's pp512 runs it), logits for the last token only
  decode       --decode-len single-token decodes from an empty context (llama-bench's tg128)
  decode_long  --decode-len single-token decodes right after the prompt (ctx 512→640)
  batched      --batch sequences with --batch-prompt-len prompts (untimed), then
               --batch-decode-steps steps, each one llama_decode of a --batch-token batch

Each decode step takes the argmax of its logits (numpy) as the next token. Every figure runs
--repeats times (decode and batched runs rewrite the same KV positions after removing them);
the median is reported.

With --native-bin DIR the times come from llama.cpp's own tools instead (no Python in the
timed loop): DIR/llama-bench for prefill (pp), decode (tg) and decode after the prompt (tg with
--n-depth), DIR/llama-batched-bench for batched decode (its S_TG time); llama-bench feeds
tokens without sampling them. llama-cpp-python then only reads the model's shape for the
accounting. Defaults follow llama-bench: f16 K/V, flash attention off, mmap on.
GFLOP/s and weight GB/s use tokenmill's accounting (see "accounting" in the JSON); the peaks
are whatever --peak-gflops / --peak-read-gbs pass in (compare_speed.sh takes them from
tokenmill's probes), else the percentages are null.

Usage:
  <venv>/bin/python bench/llamacpp_speed.py --model M.gguf [--threads 2] [--json out.json]
Any python with llama-cpp-python==0.3.16 and numpy works, e.g. /work/cache/refvenv/bin/python.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

try:
    import llama_cpp
except ImportError:  # pragma: no cover - a setup problem, reported plainly
    sys.exit("llama-cpp-python is not installed in this python: pip install llama-cpp-python==0.3.16")

ACCOUNTING = (
    "GFLOP/s = (matmul FLOPs + attention FLOPs) / time; matmul FLOPs = 2 x (q,k,v,o,gate,up,down "
    "parameters x tokens + lm_head parameters x rows with logits); attention FLOPs = 4 x q_dim x "
    "layers per (query, cached position) pair. Weight GB/s = bytes of weights a step reads in "
    "full x steps / time (KV cache reads excluded)."
)


def parse_args() -> argparse.Namespace:
    default_model = os.path.expanduser("~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.environ.get("MODEL", default_model))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--decode-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batch-prompt-len", type=int, default=32)
    p.add_argument("--batch-decode-steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", action="append", default=[],
                   help="prefill, decode, batched (repeatable or comma-separated; default: all)")
    p.add_argument("--n-batch", type=int, default=512, help="n_batch of the single-sequence context")
    p.add_argument("--n-ubatch", type=int, default=512)
    p.add_argument("--flash-attn", action="store_true", help="enable flash attention (llama-bench default: off)")
    p.add_argument("--kv-unified", action="store_true",
                   help="one KV buffer for all batched sequences (default: one stream per sequence)")
    p.add_argument("--no-mmap", action="store_true")
    p.add_argument("--peak-gflops", type=float, default=None)
    p.add_argument("--peak-read-gbs", type=float, default=None)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--native-bin", default=None,
                   help="directory with llama-bench and llama-batched-bench: time those instead")
    args = p.parse_args()
    only = {name.strip() for value in args.only for name in value.split(",") if name.strip()}
    unknown = only - {"prefill", "decode", "batched"}
    if unknown:
        p.error(f"unknown --only value(s): {', '.join(sorted(unknown))}")
    args.only = only or {"prefill", "decode", "batched"}
    for name in ("threads", "prompt_len", "decode_len", "batch", "batch_prompt_len",
                 "batch_decode_steps", "repeats", "n_batch", "n_ubatch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def meta(model, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else None


class Cost:
    """tokenmill's accounting (crates/bench-speed/src/cost.rs) from the GGUF's metadata."""

    def __init__(self, model, vocab_size: int):
        arch = meta(model, "general.architecture") or "llama"
        get = lambda suffix: meta(model, f"{arch}.{suffix}")  # noqa: E731
        self.layers = int(get("block_count"))
        self.hidden = int(get("embedding_length"))
        # Per-layer arrays (Gemma 4's `feed_forward_length`, `head_count_kv`) read as no value
        # here: the MLP then counts as 0 and the KV heads as the query heads, so llama.cpp's
        # GFLOP/s for such a file is a rough figure; its tok/s is what compares.
        self.intermediate = int(get("feed_forward_length") or 0)
        heads = int(get("attention.head_count"))
        kv_heads = int(get("attention.head_count_kv") or heads)
        head_dim = int(get("attention.key_length") or self.hidden // heads)
        q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
        self.vocab = vocab_size
        per_layer = self.hidden * q_dim + 2 * self.hidden * kv_dim + q_dim * self.hidden \
            + 3 * self.hidden * self.intermediate
        self.layer_params = per_layer * self.layers
        self.lm_head_params = vocab_size * self.hidden
        self.attention_flops_per_pair = 4 * q_dim * self.layers

    def matmul_flops(self, tokens: int, logit_rows: int) -> float:
        return 2.0 * (self.layer_params * tokens + self.lm_head_params * logit_rows)

    def attention_flops(self, start: int, end: int) -> float:
        pairs = lambda n: n * (n + 1) / 2  # noqa: E731
        return self.attention_flops_per_pair * (pairs(end) - pairs(min(start, end)))


def decode_weight_bytes(path: str, model_size: int) -> int:
    """All tensors, less an untied embedding table (a decode step reads one row of it); of a
    mixture of experts' `*_exps` tensors only the share of the experts a token uses
    (`expert_used_count / expert_count`), as tokenmill counts them."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return model_size
    reader = GGUFReader(path)
    tensors = {t.name: int(t.n_bytes) for t in reader.tensors}

    def field(key: str, default):
        found = reader.fields.get(key)
        return found.contents() if found is not None else default

    arch = field("general.architecture", "llama")
    experts = int(field(f"{arch}.expert_count", 0))
    used = int(field(f"{arch}.expert_used_count", 0))
    if experts > 0 and used > 0:
        for name, size in tensors.items():
            if name.endswith("_exps.weight"):
                model_size -= size - size * used // experts
    if "output.weight" in tensors:
        return model_size - tensors.get("token_embd.weight", 0)
    return model_size


class Batch:
    """A reusable llama_batch filled from Python lists."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.raw = llama_cpp.llama_batch_init(capacity, 0, 1)

    def fill(self, tokens, positions, seq_ids, logits):
        b = self.raw
        n = len(tokens)
        assert n <= self.capacity
        for i in range(n):
            b.token[i] = int(tokens[i])
            b.pos[i] = int(positions[i])
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = int(seq_ids[i])
            b.logits[i] = 1 if logits[i] else 0
        b.n_tokens = n

    def free(self):
        llama_cpp.llama_batch_free(self.raw)


class Context:
    def __init__(self, model, n_ctx, n_batch, n_ubatch, n_seq_max, args):
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_ubatch
        params.n_seq_max = n_seq_max
        params.n_threads = args.threads
        params.n_threads_batch = args.threads
        params.flash_attn = bool(args.flash_attn)
        params.kv_unified = bool(args.kv_unified)
        params.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            sys.exit(f"llama_init_from_model failed (n_ctx {n_ctx}, n_seq_max {n_seq_max})")
        self.mem = llama_cpp.llama_get_memory(self.ctx)

    def decode(self, batch: Batch):
        rc = llama_cpp.llama_decode(self.ctx, batch.raw)
        if rc != 0:
            sys.exit(f"llama_decode returned {rc}")
        llama_cpp.llama_synchronize(self.ctx)

    def logits(self, rows: int, vocab: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, vocab))

    def remove(self, seq_id: int, p0: int, p1: int = -1):
        llama_cpp.llama_memory_seq_rm(self.mem, seq_id, p0, p1)

    def clear(self):
        llama_cpp.llama_memory_clear(self.mem, True)

    def free(self):
        llama_cpp.llama_free(self.ctx)


def prompt_tokens(length: int, seed: int, vocab: int) -> list[int]:
    return [(i * 7919 + seed * 977 + 13) % vocab for i in range(length)]


def decode_run(ctx: Context, batch: Batch, first: int, start: int, length: int, vocab: int) -> float:
    """`length` single-token decodes at positions start.. (argmax feeds the next), timed."""
    token = first
    began = time.perf_counter()
    for step in range(length):
        batch.fill([token], [start + step], [0], [True])
        ctx.decode(batch)
        token = int(np.argmax(ctx.logits(1, vocab)[0]))
    return time.perf_counter() - began


def phase_shape(key: str, args) -> tuple:
    """(label, sequences, steps, tokens, logit rows, context start, context end) of a figure."""
    P, N = args.prompt_len, args.decode_len
    B, BP, S = args.batch, args.batch_prompt_len, args.batch_decode_steps
    return {
        "prefill": (f"prefill tok/s ({P})", 1, 1, P, 1, 0, P),
        "decode": (f"decode tok/s (ctx 0→{N})", 1, N, N, N, 0, N),
        "decode_long": (f"decode tok/s (ctx {P}→{P + N})", 1, N, N, N, P, P + N),
        "batched": (f"batched decode tok/s ({B} seqs, ctx {BP}→{BP + S})", B, S, B * S, B * S, BP, BP + S),
    }[key]


def phase_record(key, runs, cost, wbytes, args):
    label, sequences, steps, tokens, logit_rows, start, end = phase_shape(key, args)
    seconds = statistics.median(runs)
    rate = (lambda amount: amount / seconds) if seconds > 0 else (lambda amount: 0.0)
    matmul = cost.matmul_flops(tokens, logit_rows)
    attention = sequences * cost.attention_flops(start, end)
    gflops = rate(matmul + attention) / 1e9
    weight_gbs = rate(wbytes * steps) / 1e9
    pct = lambda value, peak: (100.0 * value / peak) if peak else None  # noqa: E731
    return {
        "label": label,
        "sequences": sequences,
        "steps": steps,
        "tokens": tokens,
        "context_start": start,
        "context_end": end,
        "runs_s": runs,
        "seconds": seconds,
        "tok_s": rate(tokens),
        "ms_per_step": 1e3 * seconds / max(steps, 1),
        "matmul_gflop": matmul / 1e9,
        "attention_gflop": attention / 1e9,
        "gflops": gflops,
        "pct_peak_gflops": pct(gflops, args.peak_gflops),
        "weight_gbs": weight_gbs,
        "pct_peak_read_gbs": pct(weight_gbs, args.peak_read_gbs),
    }


def run_tool(argv: list[str]) -> str:
    import subprocess
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def native_bench_flags(args) -> list[str]:
    """llama-bench's flash-attention and mmap flags in its own version's spelling: 0.3.16's
    llama.cpp takes `-fa 1 -mmp 1`, 0c1e570's (0.3.36) `-fa on -lm mmap`."""
    help_text = subprocess.run([os.path.join(args.native_bin, "llama-bench"), "--help"],
                               capture_output=True, text=True).stdout
    if "--load-mode" in help_text:
        return ["-fa", "on" if args.flash_attn else "off",
                "-lm", "none" if args.no_mmap else "mmap"]
    return ["-fa", "1" if args.flash_attn else "0", "-mmp", "0" if args.no_mmap else "1"]


def native_bench(args, extra: list[str]) -> tuple[list[float], str]:
    """Seconds per llama-bench repetition of one test (its samples_ns), and its build commit."""
    out = run_tool([os.path.join(args.native_bin, "llama-bench"), "-m", args.model,
                    "-t", str(args.threads), "-r", str(args.repeats), "-o", "json",
                    "-b", str(args.n_batch), "-ub", str(args.n_ubatch),
                    *native_bench_flags(args), *extra])
    results = json.loads(out)
    if len(results) != 1:
        sys.exit(f"llama-bench returned {len(results)} results for {extra}")
    return [ns / 1e9 for ns in results[0]["samples_ns"]], results[0].get("build_commit", "unknown")


def native_batched(args) -> list[float]:
    """Seconds of llama-batched-bench's decode part (S_TG) per run, --repeats runs."""
    B, BP, S = args.batch, args.batch_prompt_len, args.batch_decode_steps
    argv = [os.path.join(args.native_bin, "llama-batched-bench"), "-m", args.model,
            "-t", str(args.threads), "-tb", str(args.threads), "-c", str(B * (BP + S)),
            "-b", str(max(args.n_batch, B)), "-ub", str(min(args.n_ubatch, max(B * BP, B))),
            "-npp", str(BP), "-ntg", str(S), "-npl", str(B), "--output-format", "jsonl"]
    if args.flash_attn:
        argv += ["-fa", "on"]
    if args.kv_unified:
        argv += ["-kvu"]
    runs = []
    for _ in range(args.repeats):
        lines = [line for line in run_tool(argv).splitlines() if line.startswith("{")]
        if not lines:
            sys.exit("llama-batched-bench printed no jsonl result")
        runs.append(float(json.loads(lines[-1])["t_tg"]))
    return runs


def native_phases(args, cost: Cost, wbytes: int) -> tuple[dict, str]:
    """The same figures, timed by llama-bench and llama-batched-bench; and llama.cpp's commit."""
    P, N, reps = args.prompt_len, args.decode_len, args.repeats
    # (figure, the --only value that selects it, llama-bench test, its flags)
    tests = [
        ("prefill", "prefill", f"pp{P}", ["-p", str(P), "-n", "0"]),
        ("decode", "decode", f"tg{N}", ["-p", "0", "-n", str(N)]),
        ("decode_long", "decode", f"tg{N} at depth {P}", ["-p", "0", "-n", str(N), "-d", str(P)]),
    ]
    phases, build = {}, "unknown"
    for key, only, name, extra in tests:
        if only in args.only:
            print(f"llama-bench: {name} x {reps}", file=sys.stderr)
            runs, build = native_bench(args, extra)
            phases[key] = phase_record(key, runs, cost, wbytes, args)
    if "batched" in args.only:
        B, BP, S = args.batch, args.batch_prompt_len, args.batch_decode_steps
        print(f"llama-batched-bench: {B} sequences, ctx {BP}→{BP + S} x {reps}", file=sys.stderr)
        phases["batched"] = phase_record("batched", native_batched(args), cost, wbytes, args)
    return phases, build


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main() -> None:
    args = parse_args()
    llama_cpp.llama_backend_init()
    # Silence llama.cpp's load log (it goes to stderr and would drown the table).
    log_cb = llama_cpp.llama_log_callback(lambda level, text, data: None)
    llama_cpp.llama_log_set(log_cb, ctypes.c_void_p(0))

    mparams = llama_cpp.llama_model_default_params()
    mparams.use_mmap = not args.no_mmap
    began = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        sys.exit(f"could not load {args.model}")
    vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    cost = Cost(model, vocab)
    model_size = int(llama_cpp.llama_model_size(model))
    wbytes = decode_weight_bytes(args.model, model_size)
    print(f"loaded {args.model} in {time.perf_counter() - began:.2f} s "
          f"({model_size / 1e6:.1f} MB of weights, {wbytes / 1e6:.1f} MB read per decode step)",
          file=sys.stderr)

    phases = {}
    reps = args.repeats
    P, N = args.prompt_len, args.decode_len
    native_build = None
    if args.native_bin:
        phases, native_build = native_phases(args, cost, wbytes)
    if args.only & {"prefill", "decode"} and not args.native_bin:
        ctx = Context(model, P + N, max(args.n_batch, P), args.n_ubatch, 1, args)
        batch = Batch(max(P, 1))
        prompt = prompt_tokens(P, 0, vocab)
        # Warm-up (untimed), like llama-bench's.
        warm = prompt[: min(P, 16)]
        batch.fill(warm, range(len(warm)), [0] * len(warm), [False] * (len(warm) - 1) + [True])
        ctx.decode(batch)
        decode_run(ctx, batch, warm[0], len(warm), 2, vocab)
        ctx.clear()

        def prefill_once() -> float:
            ctx.clear()
            batch.fill(prompt, range(P), [0] * P, [False] * (P - 1) + [True])
            began = time.perf_counter()
            ctx.decode(batch)
            return time.perf_counter() - began

        if "prefill" in args.only:
            print(f"measuring prefill: {P} tokens x {reps} runs", file=sys.stderr)
            runs = [prefill_once() for _ in range(reps)]
            phases["prefill"] = phase_record("prefill", runs, cost, wbytes, args)
        if "decode" in args.only:
            if "prefill" not in args.only:
                prefill_once()
            after_prompt = int(np.argmax(ctx.logits(1, vocab)[0]))
            print(f"measuring decode after the prompt: ctx {P}→{P + N} x {reps} runs", file=sys.stderr)
            runs = []
            for _ in range(reps):
                ctx.remove(0, P, -1)
                runs.append(decode_run(ctx, batch, after_prompt, P, N, vocab))
            long_record = phase_record("decode_long", runs, cost, wbytes, args)
            print(f"measuring decode: ctx 0→{N} x {reps} runs", file=sys.stderr)
            runs = []
            for _ in range(reps):
                ctx.clear()
                runs.append(decode_run(ctx, batch, prompt[0], 0, N, vocab))
            phases["decode"] = phase_record("decode", runs, cost, wbytes, args)
            phases["decode_long"] = long_record
        batch.free()
        ctx.free()

    if "batched" in args.only and not args.native_bin:
        B, BP, S = args.batch, args.batch_prompt_len, args.batch_decode_steps
        print(f"measuring batched decode: {B} sequences, ctx {BP}→{BP + S} x {reps} runs", file=sys.stderr)
        per_seq = BP + S
        n_ctx = B * per_seq
        total_prompt = B * BP
        ctx = Context(model, n_ctx, max(total_prompt, B), min(args.n_ubatch, max(total_prompt, B)), B, args)
        batch = Batch(max(total_prompt, B))
        tokens, positions, seqs = [], [], []
        for seq in range(B):
            tokens += prompt_tokens(BP, seq + 1, vocab)
            positions += list(range(BP))
            seqs += [seq] * BP
        flags = [(i % BP) == BP - 1 for i in range(total_prompt)]
        batch.fill(tokens, positions, seqs, flags)
        ctx.decode(batch)
        first = [int(t) for t in np.argmax(ctx.logits(B, vocab), axis=1)]
        runs = []
        for _ in range(reps):
            for seq in range(B):
                ctx.remove(seq, BP, -1)
            nxt = list(first)
            began = time.perf_counter()
            for step in range(S):
                batch.fill(nxt, [BP + step] * B, range(B), [True] * B)
                ctx.decode(batch)
                nxt = [int(t) for t in np.argmax(ctx.logits(B, vocab), axis=1)]
            runs.append(time.perf_counter() - began)
        phases["batched"] = phase_record("batched", runs, cost, wbytes, args)
        batch.free()
        ctx.free()

    order = ["prefill", "decode", "decode_long", "batched"]
    report = {
        "engine": "llama.cpp",
        "version": (f"llama-bench + llama-batched-bench, llama.cpp {native_build}"
                    if args.native_bin else f"llama-cpp-python {llama_cpp.__version__}"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S"),
        "model": args.model,
        "threads": args.threads,
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "threads": args.threads,
            "peak_gflops": args.peak_gflops,
            "peak_read_gbs": args.peak_read_gbs,
        },
        "model_info": {
            "num_layers": cost.layers,
            "hidden_size": cost.hidden,
            "vocab_size": cost.vocab,
            "layer_params": cost.layer_params,
            "lm_head_params": cost.lm_head_params,
            "attention_flops_per_pair": cost.attention_flops_per_pair,
            "weight_bytes": model_size,
            "decode_weight_bytes": wbytes,
        },
        "settings": {
            "prompt_len": P, "decode_len": N, "batch": args.batch,
            "batch_prompt_len": args.batch_prompt_len, "batch_decode_steps": args.batch_decode_steps,
            "repeats": reps, "n_batch": args.n_batch, "n_ubatch": args.n_ubatch,
            "flash_attn": args.flash_attn, "kv_unified": args.kv_unified,
            "type_k": "f16", "type_v": "f16", "mmap": not args.no_mmap,
        },
        "accounting": ACCOUNTING,
        "phases": {key: phases[key] for key in order if key in phases},
    }
    llama_cpp.llama_model_free(model)

    fmt = lambda value, spec: "n/a" if value is None else format(value, spec)  # noqa: E731
    pct = lambda value: "n/a" if value is None else f"{value:.1f} %"  # noqa: E731
    print(f"model: {args.model} (llama.cpp, {report['version']})")
    print(f"machine: {report['machine']['cpu']}, {report['machine']['cores']} cores; {args.threads} threads; "
          f"peak f32 FMA {fmt(args.peak_gflops, '.1f')} GFLOP/s, memory read {fmt(args.peak_read_gbs, '.1f')} GB/s")
    print(f"median of {reps} runs")
    print()
    print("| figure | tok/s | ms/step | GFLOP/s | % peak | weight GB/s | % peak |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for phase in report["phases"].values():
        print(f"| {phase['label']} | {phase['tok_s']:.1f} | {phase['ms_per_step']:.2f} | {phase['gflops']:.1f} "
              f"| {pct(phase['pct_peak_gflops'])} | {phase['weight_gbs']:.2f} "
              f"| {pct(phase['pct_peak_read_gbs'])} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
