"""Anthropic's Claude Code (`@anthropic-ai/claude-code`, npm) run non-interactively
(`claude -p --output-format json`) against `tokenmill serve` over the Messages API
(`ANTHROPIC_BASE_URL`).

Claude Code is installed by scripts/test-python.sh (pinned, in .cache/npm), which passes its
launcher in TOKENMILL_CLAUDE; this test installs nothing. What Claude Code sends is the
agent's real traffic: `/v1/messages?beta=true` with its ~21k-token system prompt, 24 tools
(zod schemas: `propertyNames`, `additionalProperties`, nested `anyOf`), adaptive thinking,
`output_config.effort`, `context_management` edits and prompt-cache breakpoints. The model is
Gemma 3 270M (32k context) with `--tool-call-parser generic`, so any answer is text or a
valid call of one of its tools; tests/python/codex/ holds the chat template and default
sampling it shares with the Codex test. CLAUDE_CODE_MAX_OUTPUT_TOKENS keeps Claude Code's
`max_tokens` inside the 32k context (it asks 32,000 by default; tokenmill's 400 names the
limit and Claude Code would retry smaller, but one refused request is what this test counts).
A 270M base model writes poor answers; what is checked is the protocol: Claude Code ends
with a `result` that is no error, and every request it sent was answered 200."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import launcher, start_agent_server, stop_server

SERVED_NAME = "tm-claude"
PROMPT = "Say hello to me in one short sentence. Do not use any tools."
# Claude Code's first prompt is ~21,100 tokens: about 2 minutes of cold prefill on two Zen 3
# cores; its later requests hit the prefix cache.
CLAUDE_TIMEOUT_S = 420
ACCESS = re.compile(r"tokenmill::access: POST (/v1/messages\S*) (\d{3})")


@pytest.fixture(scope="module")
def claude_server():
    claude = launcher("TOKENMILL_CLAUDE", "Claude Code")
    server = start_agent_server(SERVED_NAME, kv_cache_memory="1GiB")
    yield server, claude
    stop_server(server)


def test_claude_code_print_mode_runs_to_completion(claude_server):
    server, claude = claude_server
    with tempfile.TemporaryDirectory(prefix="tokenmill-claude-") as tmp:
        directory = Path(tmp)
        home = directory / "home"
        home.mkdir()
        workdir = directory / "work"
        workdir.mkdir()
        env = {
            **os.environ,
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": server.base_url,
            "ANTHROPIC_API_KEY": "unused",
            "ANTHROPIC_MODEL": SERVED_NAME,
            "ANTHROPIC_SMALL_FAST_MODEL": SERVED_NAME,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": SERVED_NAME,
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "1024",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "NO_COLOR": "1",
        }
        run = subprocess.run(
            [claude, "-p", PROMPT, "--output-format", "json"],
            cwd=workdir, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=CLAUDE_TIMEOUT_S,
        )
    log = server.log()
    detail = f"stdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-4000:]}\nserver log:\n{log[-4000:]}"
    assert run.returncode == 0, detail
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result.get("type") == "result", detail
    assert result.get("is_error") is False and result.get("subtype") == "success", detail
    # Claude Code's requests reached the Messages route and every one was answered 200.
    statuses = [status for _, status in ACCESS.findall(log)]
    assert statuses and set(statuses) == {"200"}, detail
    # The usage Claude Code reports is the server's: its prompt was read, not dropped.
    assert result.get("usage", {}).get("input_tokens", 0) + result.get("usage", {}).get(
        "cache_read_input_tokens", 0
    ) > 10_000, detail
