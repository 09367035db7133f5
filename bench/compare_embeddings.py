#!/usr/bin/env python3
"""Sentences per second for an embedding model: tokenmill (`tokenmill embed`, offline) vs
sentence-transformers (PyTorch CPU) vs fastembed (onnxruntime), at the same thread count,
on the same deterministic corpus of mixed-length sentences. Also checks the three agree
(mean cosine of tokenmill's vectors with each peer's).

Run with the torch venv (sentence-transformers, fastembed), on a quiet machine:

    /work/cache/torchvenv/bin/python bench/compare_embeddings.py --threads 4 \
        [--model ~/.cache/tokenmill/models/all-MiniLM-L6-v2] [--sentences 1000] \
        [--binary target/release/tokenmill] [--skip fastembed] [--json out.json]

fastembed loads its ONNX export of sentence-transformers/all-MiniLM-L6-v2 from its own
cache (`--fastembed-cache`; it downloads there when online). Each engine embeds the corpus
once to warm up, then `--repeats` times timed; the best run counts. Results go to stdout
(one line per engine) and, with --json, to a file in the bench/RESULTS.md style.
"""

import argparse
import json
import math
import os
import random
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


def timed(run, repeats):
    run()  # warm-up
    best = math.inf
    vectors = None
    for _ in range(repeats):
        started = time.perf_counter()
        vectors = run()
        best = min(best, time.perf_counter() - started)
    return best, vectors


def tokenmill(args, sentences):
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "in.jsonl")
        target = os.path.join(tmp, "out.jsonl")
        with open(source, "w") as f:
            for s in sentences:
                f.write(json.dumps({"text": s}) + "\n")

        def run():
            # Model load is inside the process; the binary reports its own embedding time
            # ("embedded N texts ... in S s"), which is what is compared.
            done = subprocess.run(
                [args.binary, "embed", "--model", args.model, "--threads", str(args.threads),
                 "--input", source, "--output", target, "--truncate-prompt-tokens", "-1"],
                check=True, capture_output=True, text=True,
            )
            line = [l for l in done.stderr.splitlines() if l.startswith("embedded ")][-1]
            seconds = float(line.split(" in ")[1].split(" s")[0])
            with open(target) as f:
                vectors = [json.loads(l)["embedding"] for l in f]
            return seconds, vectors

        run()
        best, vectors = math.inf, None
        for _ in range(args.repeats):
            seconds, vectors = run()
            best = min(best, seconds)
        return best, vectors


def sentence_transformers(args, sentences):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    model = SentenceTransformer(args.model, device="cpu")
    return timed(lambda: model.encode(sentences, batch_size=32).tolist(), args.repeats)


def fastembed(args, sentences):
    from fastembed import TextEmbedding

    model = TextEmbedding(
        "sentence-transformers/all-MiniLM-L6-v2", threads=args.threads, cache_dir=args.fastembed_cache
    )
    return timed(lambda: [v.tolist() for v in model.embed(sentences, batch_size=32)], args.repeats)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.path.expanduser("~/.cache/tokenmill/models/all-MiniLM-L6-v2"))
    parser.add_argument("--binary", default="target/release/tokenmill")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", action="append", default=[], choices=["tokenmill", "sentence-transformers", "fastembed"])
    parser.add_argument("--fastembed-cache", default=os.path.expanduser("~/.cache/tokenmill/fastembed"))
    parser.add_argument("--json")
    args = parser.parse_args()
    sentences = corpus(args.sentences)
    engines = [("tokenmill", tokenmill), ("sentence-transformers", sentence_transformers), ("fastembed", fastembed)]
    results, vectors = {}, {}
    for name, run in engines:
        if name in args.skip:
            continue
        seconds, vecs = run(args, sentences)
        results[name] = {"seconds": seconds, "sentences_per_s": len(sentences) / seconds}
        vectors[name] = vecs
        print(f"{name:>22}: {len(sentences) / seconds:8.1f} sentences/s ({seconds:.3f} s, {args.threads} threads)")
    if "tokenmill" in vectors:
        for name, vecs in vectors.items():
            if name != "tokenmill":
                mean = sum(cosine(a, b) for a, b in zip(vectors["tokenmill"], vecs)) / len(vecs)
                results[name]["mean_cosine_with_tokenmill"] = mean
                print(f"{'':>22}  mean cosine tokenmill vs {name}: {mean:.6f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "sentences": len(sentences), "results": results}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
