#!/usr/bin/env python3
"""Sentences per second for an embedding model: tokenmill (`tokenmill embed`, offline) vs
sentence-transformers (PyTorch CPU) vs fastembed (onnxruntime), at the same thread count,
on the same deterministic corpus of mixed-length sentences. Also checks the three agree
(mean cosine of tokenmill's vectors with each peer's).

Run with the torch venv (sentence-transformers, fastembed), on a quiet machine:

    /work/cache/torchvenv/bin/python bench/compare_embeddings.py --threads 2 \
        [--model ~/.cache/tokenmill/models/all-MiniLM-L6-v2] [--sentences 1000] \
        [--binary target/release/tokenmill] [--skip fastembed] [--rounds 3] [--json out.json] \
        [--bf16] [--f32]

`--bf16` adds two rows: `tokenmill-bf16` (`tokenmill embed --dtype bfloat16`: the encoder's
linear layers in bf16) and `sentence-transformers-bf16` (the same model cast to
torch.bfloat16). The ratio line compares the f32 rows (tokenmill vs the fastest f32 peer).
`tokenmill` runs `--dtype auto`: on a CPU with AMX int8 tiles the encoder's linear layers are
int8 pairs (15-bit fixed point, exact integer sums), elsewhere f32; `--f32` adds
`tokenmill-f32` (`--dtype float32`, one fused f32 chain per output).
`--gguf PATH` adds `tokenmill-gguf`: `tokenmill embed` over a GGUF export of the same model
(e.g. convert_hf_to_gguf.py's `--outtype q8_0`), whose quantized linear layers take the int8
matmul kernels (AVX-512 VNNI / AMX tiles); its mean cosine with the f32 peers is printed.

fastembed loads an ONNX export of the same weights from `--fastembed-model-dir`, written by
bench/export_minilm_onnx.py (fastembed's own download, Qdrant's export, needs Hugging Face).
Each engine embeds the corpus once to warm up; then `--rounds` rounds time every engine once
each, in turn, so a change in machine load hits all of them alike; the best round counts and
the load average is printed with each. Results go to stdout and, with --json, to a file.
"""

import argparse
import atexit
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

WORDS = (
    "the of and to in is was for on that with as by at from his her an be this which or "
    "are it had not were but have one all their there been has when who will more no if out "
    "so said what up its about into than them can only other new some could time these two "
    "may then do first any my now such like our over man me even most made after also did "
    "many before must through back years where much your way well down should because each "
    "just those people how too little state good very make world still own see men work long "
    "retrieval embedding vector search query document passage semantic similarity cpu engine "
    "café naïve résumé 東京 北京 서울 Москва Αθήνα"
).split()


def corpus(n, seed=17):
    """`n` sentences, lengths 3 to ~200 words, skewed short as real queries and passages are."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        length = min(200, max(3, int(rng.lognormvariate(2.7, 0.9))))
        words = [rng.choice(WORDS) for _ in range(length)]
        sentences.append(" ".join(words).capitalize() + ".")
    return sentences


def timed(embed):
    """A warmed-up runner returning (seconds, vectors) per call."""
    embed()

    def run():
        started = time.perf_counter()
        vectors = embed()
        return time.perf_counter() - started, vectors

    return run


def tokenmill(args, sentences, dtype="auto", model=None):
    tmp = tempfile.mkdtemp(prefix="embed-bench-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    source = os.path.join(tmp, "in.jsonl")
    target = os.path.join(tmp, "out.jsonl")
    with open(source, "w") as f:
        for s in sentences:
            f.write(json.dumps({"text": s}) + "\n")

    def run():
        # Model load is inside the process; the binary reports its own embedding time
        # ("embedded N texts ... in S s"), which is what is compared.
        done = subprocess.run(
            [args.binary, "embed", "--model", model or args.model, "--threads", str(args.threads),
             "--input", source, "--output", target, "--truncate-prompt-tokens", "-1",
             "--dtype", dtype],
            check=True, capture_output=True, text=True,
        )
        line = [l for l in done.stderr.splitlines() if l.startswith("embedded ")][-1]
        seconds = float(line.split(" in ")[1].split(" s")[0])
        with open(target) as f:
            vectors = [json.loads(l)["embedding"] for l in f]
        return seconds, vectors

    run()
    return run


def sentence_transformers(args, sentences, bf16=False):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    model = SentenceTransformer(args.model, device="cpu")
    if bf16:
        model = model.to(torch.bfloat16)
        return timed(lambda: model.encode(sentences, batch_size=32, convert_to_tensor=True).float().tolist())
    return timed(lambda: model.encode(sentences, batch_size=32).tolist())


def fastembed(args, sentences):
    from fastembed import TextEmbedding

    model = TextEmbedding(
        "sentence-transformers/all-MiniLM-L6-v2",
        threads=args.threads,
        specific_model_path=args.fastembed_model_dir,
    )
    return timed(lambda: [v.tolist() for v in model.embed(sentences, batch_size=32)])


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.path.expanduser("~/.cache/tokenmill/models/all-MiniLM-L6-v2"))
    parser.add_argument("--binary", default="target/release/tokenmill")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip", action="append", default=[], choices=["tokenmill", "sentence-transformers", "fastembed"])
    parser.add_argument(
        "--fastembed-model-dir", default=os.path.expanduser("~/.cache/tokenmill/fastembed/all-MiniLM-L6-v2")
    )
    parser.add_argument("--json")
    parser.add_argument("--bf16", action="store_true", help="add tokenmill and sentence-transformers bf16 rows")
    parser.add_argument("--f32", action="store_true", help="add a tokenmill --dtype float32 row")
    parser.add_argument("--gguf", help="add a tokenmill row over this GGUF export of the model")
    args = parser.parse_args()
    sentences = corpus(args.sentences)
    engines = [("tokenmill", tokenmill), ("sentence-transformers", sentence_transformers), ("fastembed", fastembed)]
    if args.bf16:
        engines += [
            ("tokenmill-bf16", lambda a, s: tokenmill(a, s, "bfloat16")),
            ("sentence-transformers-bf16", lambda a, s: sentence_transformers(a, s, bf16=True)),
        ]
    if args.f32:
        engines.append(("tokenmill-f32", lambda a, s: tokenmill(a, s, "float32")))
    if args.gguf:
        engines.append(("tokenmill-gguf", lambda a, s: tokenmill(a, s, model=args.gguf)))
    runners = {name: setup(args, sentences) for name, setup in engines if name not in args.skip}
    times, vectors = {name: [] for name in runners}, {}
    for round_ in range(args.rounds):
        for name, run in runners.items():
            seconds, vectors[name] = run()
            times[name].append(seconds)
            load = os.getloadavg()[0]
            print(f"round {round_ + 1} {name:>22}: {len(sentences) / seconds:8.1f} sentences/s "
                  f"({seconds:.3f} s, {args.threads} threads, load average {load:.2f})")
    results = {}
    for name, seconds in times.items():
        best = min(seconds)
        results[name] = {"seconds": best, "sentences_per_s": len(sentences) / best, "rounds": seconds}
        print(f"{name:>22}: {len(sentences) / best:8.1f} sentences/s (best of {len(seconds)})")
    peers = [results[n]["sentences_per_s"] for n in results if not n.startswith("tokenmill") and not n.endswith("-bf16")]
    if "tokenmill-gguf" in results and peers:
        print(f"tokenmill-gguf / fastest f32 peer: {results['tokenmill-gguf']['sentences_per_s'] / max(peers):.2f}x")
    if "tokenmill-f32" in results and peers:
        print(f"tokenmill-f32 / fastest f32 peer: {results['tokenmill-f32']['sentences_per_s'] / max(peers):.2f}x")
    if "tokenmill" in results and peers:
        print(f"tokenmill / fastest peer: {results['tokenmill']['sentences_per_s'] / max(peers):.2f}x")
    if "tokenmill" in vectors:
        for name, vecs in vectors.items():
            if name != "tokenmill":
                cosines = [cosine(a, b) for a, b in zip(vectors["tokenmill"], vecs)]
                mean = sum(cosines) / len(cosines)
                results[name]["mean_cosine_with_tokenmill"] = mean
                results[name]["worst_cosine_with_tokenmill"] = min(cosines)
                print(f"{'':>22}  cosine tokenmill vs {name}: mean {mean:.6f}, worst {min(cosines):.6f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "sentences": len(sentences), "results": results}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
