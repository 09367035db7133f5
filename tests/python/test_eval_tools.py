"""The evaluation and benchmark tools vLLM users run, against a live tokenmill, with no hub.

- lm-eval (`local-completions` on /v1/completions) with `tokenizer_backend=remote`, i.e.
  tokenmill's `GET /tokenizer_info`, `/tokenize` and `/detokenize`, on two tiny tasks whose
  data is a local file (tests/python/lm_eval_tasks): one scored by loglikelihood (echo +
  logprobs), one by greedy generation with stop strings.
- GuideLLM with synthetic prompts and the directory `tokenmill tokenizer export` writes as
  its processor, at a fixed rate for a fixed number of requests.

Both run as subprocesses with HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE / HF_DATASETS_OFFLINE set
and an empty HF_HOME, so any attempt to reach the Hugging Face hub (a tokenizer or a data set
download) fails the test instead of quietly succeeding.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MODEL_NAME, REPO, binary_path, model_path, start_server, stop_server

TASKS = REPO / "tests/python/lm_eval_tasks"
TOOL_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def tool_server():
    """A server with vLLM's remote-tokenizer endpoint, as `lm_eval` expects it."""
    server = start_server("--enable-tokenizer-info-endpoint", "--max-model-len", "512")
    yield server
    stop_server(server)


def offline_env(tmp_path: Path) -> dict[str, str]:
    """The environment for a tool run: no hub, no user cache, no proxy to the hub."""
    home = tmp_path / "hf-home"
    home.mkdir(exist_ok=True)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("HF_", "HUGGING", "TRANSFORMERS_", "OPENAI_"))
    }
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(home),
        HF_HUB_DISABLE_TELEMETRY="1",
        DO_NOT_TRACK="1",
        OPENAI_API_KEY="unused",
        NO_COLOR="1",
    )
    return env


def run_tool(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(
        command,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, (
        f"{command[:4]} exited {result.returncode}\n--- stdout\n{result.stdout[-6000:]}"
        f"\n--- stderr\n{result.stderr[-6000:]}"
    )
    return result


def test_lm_eval_local_completions_with_the_remote_tokenizer(tool_server, tmp_path):
    output = tmp_path / "lm-eval"
    model_args = ",".join(
        [
            f"base_url={tool_server.api_url}/completions",
            f"model={MODEL_NAME}",
            "tokenizer_backend=remote",
            "tokenized_requests=True",
            "num_concurrent=2",
            "max_retries=1",
            "max_length=512",
        ]
    )
    run_tool(
        [
            sys.executable,
            "-m",
            "lm_eval",
            "run",
            "--model",
            "local-completions",
            "--model_args",
            model_args,
            "--include_path",
            str(TASKS),
            "--tasks",
            "tm_smoke_mc,tm_smoke_gen",
            "--limit",
            "6",
            "--log_samples",
            "--output_path",
            str(output),
        ],
        offline_env(tmp_path),
        REPO,
    )
    results_files = sorted(output.rglob("results_*.json"))
    assert results_files, f"no results under {output}"
    results = json.loads(results_files[-1].read_text())["results"]
    for task, metrics in (("tm_smoke_mc", ("acc,none", "acc_norm,none")), ("tm_smoke_gen", ("exact_match,none",))):
        for metric in metrics:
            value = results[task][metric]
            assert 0.0 <= value <= 1.0, f"{task} {metric} = {value}"

    # Every choice of every multiple-choice item was scored: a finite, negative total
    # logprob per choice (the continuation's tokens, from the echoed prompt logprobs).
    samples = [
        json.loads(line)
        for path in output.rglob("samples_tm_smoke_mc_*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert len(samples) == 6
    for sample in samples:
        scores = [float(response[0][0]) for response in sample["resps"]]
        assert len(scores) == 4, sample["resps"]
        assert all(math.isfinite(score) and score < 0.0 for score in scores), scores
    # The items are easy enough that the right answer is the likeliest for most of them;
    # a tokenizer mismatch (wrong token boundaries between context and continuation)
    # scores garbage and fails this.
    assert results["tm_smoke_mc"]["acc,none"] >= 0.5, results["tm_smoke_mc"]

    generations = [
        json.loads(line)
        for path in output.rglob("samples_tm_smoke_gen_*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert len(generations) == 6
    # lm-eval sent token ids from the remote tokenizer; the same prompt sent as text, greedy
    # with the same stop strings, gives the same completion.
    with tool_server.http() as http:
        for sample in generations:
            prompt = sample["arguments"]["gen_args_0"]["arg_0"]
            response = http.post(
                "/v1/completions",
                json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stop": ["\n", "."]},
            )
            response.raise_for_status()
            assert sample["resps"][0][0] == response.json()["choices"][0]["text"], sample["resps"]


@pytest.fixture(scope="module")
def exported_tokenizer(tmp_path_factory) -> Path:
    """`tokenmill tokenizer export`: the GGUF's tokenizer as a Hugging Face directory."""
    out = tmp_path_factory.mktemp("tokenizer")
    result = subprocess.run(
        [binary_path(), "tokenizer", "export", "--model", model_path(), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    return out


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_guidellm_constant_rate_with_the_exported_tokenizer(tool_server, exported_tokenizer, tmp_path, route):
    requests = 12
    report = tmp_path / "guidellm.json"
    run_tool(
        [
            str(Path(sys.executable).with_name("guidellm")),
            "run",
            "--backend",
            f"kind=openai_http,target={tool_server.base_url},model={MODEL_NAME},request_format={route}",
            "--tokenizer",
            f"kind=huggingface_auto,model={exported_tokenizer}",
            "--data",
            "kind=synthetic_text,prompt_tokens=32,output_tokens=8",
            "--profile",
            "kind=constant,rate=4",
            "--constraint",
            f"kind=max_requests,count={requests}",
            "--output",
            f"kind=json,path={report}",
            "--disable-console-interactive",
        ],
        offline_env(tmp_path),
        tmp_path,
    )
    document = json.loads(report.read_text())
    benchmarks = document["benchmarks"]
    assert len(benchmarks) == 1, benchmarks
    totals = benchmarks[0]["metrics"]["request_totals"]
    assert totals["successful"] == requests, totals
    assert totals["errored"] == 0 and totals["incomplete"] == 0, totals
    # GuideLLM cut its synthetic prompts to 32 tokens with the exported tokenizer; the
    # server's usage counts them the same (plus the chat template's tokens on chat), and
    # every request got its 8 output tokens.
    prompt_tokens = benchmarks[0]["metrics"]["prompt_token_count"]["successful"]
    output_tokens = benchmarks[0]["metrics"]["output_token_count"]["successful"]
    if route == "/v1/completions":
        assert prompt_tokens["min"] == prompt_tokens["max"] == 32, prompt_tokens
    else:
        assert prompt_tokens["min"] > 32, prompt_tokens
    assert output_tokens["min"] == output_tokens["max"] == 8, output_tokens
