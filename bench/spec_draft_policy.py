#!/usr/bin/env python3
"""Replays greedy outputs through draft-length policies: how many tokens per step, and what
speed-up over no speculation, each policy would give on a dataset, for a measured cost of a
verification step by its rows.

Greedy output does not depend on speculation, so one run of a server without it gives every
request's prompt and output token ids, and the `ngram` proposer (the same rule as
crates/engine/src/spec/ngram.rs) is replayed over them exactly. Step cost: `--row-costs`, the
`bench speed --only verify` ratios of N-row steps to a one-row step (N = 2, 3, ...), extended
past the table by its mean increment. The replay counts decode steps only: a served run's
output tok/s also holds the prefills, which speculation does not shorten: `--prefill-steps`
(a request's TTFT over the TPOT without speculation) adds them to both sides for the whole
run's speed-up, the figure `bench serve` reports.

    tokenmill serve MODEL --port 8000 &
    python3 bench/spec_draft_policy.py --port 8000 \
        --row-costs 1.29,1.53,1.78,2.00,2.22,2.43,2.62,2.88

Captures `tokenmill bench serve --dataset-name input_grounded` requests through a local proxy
(they are answered with an error, so the bench reports them failed), replays them with
`return_token_ids`, then prints the policies best first and, last, the bound no length rule
can pass: every draft cut to the tokens that will be accepted. Standard library only.
"""

import argparse
import json
import subprocess
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def capture(args):
    """The chat requests `bench serve` sends, forwarding everything else to the server."""
    upstream = f"http://127.0.0.1:{args.port}"
    bodies = []

    class Handler(BaseHTTPRequestHandler):
        def reply(self, code, body):
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def forward(self, data=None):
            request = urllib.request.Request(upstream + self.path, data=data, method=self.command,
                                             headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request) as response:
                    self.reply(response.status, response.read())
            except urllib.error.HTTPError as err:
                self.reply(err.code, err.read())

        def do_GET(self):
            self.forward()

        def do_POST(self):
            data = self.rfile.read(int(self.headers.get("content-length", 0)))
            if "chat/completions" not in self.path:
                return self.forward(data)
            bodies.append(json.loads(data))
            self.reply(500, b'{"error":{"message":"captured","type":"capture","code":500}}')

        def log_message(self, *_):
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    subprocess.run([args.tokenmill, "bench", "serve", "--port", str(proxy.server_address[1]),
                    "--endpoint", "/v1/chat/completions", "--dataset-name", args.dataset,
                    "--num-prompts", str(args.num_prompts), "--max-concurrency", "1",
                    "--temperature", "0", "--num-warmups", "0"],
                   check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy.shutdown()
    return bodies


def replay(args, bodies):
    sequences = []
    for body in bodies:
        body.update(stream=False, return_token_ids=True)
        body.pop("stream_options", None)
        request = urllib.request.Request(f"http://127.0.0.1:{args.port}/v1/chat/completions",
                                         data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request) as response:
            answer = json.load(response)
        sequences.append((answer["prompt_token_ids"], answer["choices"][0]["token_ids"]))
    return sequences


def ngram(tokens, length, low, high):
    """The longest (latest among equals) earlier match of the sequence's end, its continuation."""
    n, best = len(tokens), None
    for end in range(n - 1, low - 1, -1):
        limit, matched = min(high, end), 0
        while matched < limit and tokens[end - 1 - matched] == tokens[n - 1 - matched]:
            matched += 1
        if matched >= low and (best is None or matched > best[1]):
            best = (end, matched)
            if matched == high:
                break
    return [] if best is None else tokens[best[0]:best[0] + length]


def simulate(sequences, draft_length, cost, low, high, prefill=0.0, oracle=False):
    """Tokens per unit of one-row step time, tokens per step, and the whole run's speed-up
    (each request's `prefill` in one-row steps added to both sides), for
    `draft_length(previous)` (previous: None, or (drafted, accepted) of the request's last
    step). `oracle`: cut each draft to the tokens that will be accepted (a bound for any length
    rule, not a rule)."""
    tokens = total = steps = 0
    for prompt, output in sequences:
        i, previous = 1, None  # the first token comes from the prefill
        while i < len(output):
            draft = ngram(prompt + output[:i], draft_length(previous), low, high)
            accepted = 0
            while (accepted < len(draft) and i + accepted < len(output)
                   and draft[accepted] == output[i + accepted]):
                accepted += 1
            if oracle:
                draft = draft[:accepted]
            emitted = min(accepted + 1, len(output) - i)
            previous = (len(draft), accepted) if draft else None
            i += emitted
            tokens += emitted
            total += cost(1 + len(draft))
            steps += 1
    fixed = prefill * len(sequences)
    return tokens / total, tokens / steps, (fixed + tokens) / (fixed + total)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tokenmill", default="target/release/tokenmill")
    parser.add_argument("--dataset", default="input_grounded")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--row-costs", required=True,
                        help="cost of 2, 3, ... rows per step in one-row steps, comma-separated")
    parser.add_argument("--prefill-steps", type=float, default=0.0,
                        help="one request's prefill in one-row steps (TTFT over TPOT without "
                             "speculation), for the whole run's speed-up")
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=5)
    parser.add_argument("--save", help="write the captured (prompt, output) token ids to this file")
    parser.add_argument("--load", help="replay token ids saved by --save instead of a live server")
    args = parser.parse_args()
    ratios = [1.0] + [float(v) for v in args.row_costs.split(",")]
    # Rows past the table: the table's mean increment (its last one can be negative: 16 rows
    # take the AMX tiles and cost less than 15 on the vector kernels).
    step = (ratios[-1] - ratios[0]) / max(len(ratios) - 1, 1)

    def cost(rows):
        return ratios[rows - 1] if rows <= len(ratios) else ratios[-1] + step * (rows - len(ratios))

    if args.load:
        with open(args.load) as f:
            sequences = [tuple(pair) for pair in json.load(f)]
    else:
        sequences = replay(args, capture(args))
    if args.save:
        with open(args.save, "w") as f:
            json.dump(sequences, f)
    print(f"{len(sequences)} requests, {sum(len(o) for _, o in sequences)} output tokens")
    policies = {}
    lengths = (2, 3, 4, 5, 6, 8, 12, 15, 16)
    for k in lengths:
        policies[f"k = {k} every step"] = lambda previous, k=k: k
        for probe in (1, 2, 3):
            if probe < k:
                policies[f"k = {k}, probe {probe} unless the last draft was accepted whole"] = (
                    lambda previous, k=k, probe=probe:
                    k if previous and previous[0] == previous[1] else probe)
    results = []
    for name, policy in policies.items():
        results.append((*simulate(sequences, policy, cost, args.prompt_lookup_min,
                                  args.prompt_lookup_max, args.prefill_steps), name))
    print("decode  whole run  tokens/step")
    for speedup, per_step, whole, name in sorted(results, reverse=True):
        print(f"{speedup:6.3f}x  {whole:6.3f}x  {per_step:5.2f}  {name}")
    longest = max(lengths)
    speedup, per_step, whole = simulate(sequences, lambda previous: longest, cost,
                                        args.prompt_lookup_min, args.prompt_lookup_max,
                                        args.prefill_steps, oracle=True)
    print(f"{speedup:6.3f}x  {whole:6.3f}x  {per_step:5.2f}  bound: each draft cut to the "
          f"tokens that will be accepted (k <= {longest})")


if __name__ == "__main__":
    main()
