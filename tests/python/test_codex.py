"""OpenAI's Codex CLI (`@openai/codex`, npm) run non-interactively (`codex exec`) against
`tokenmill serve` as a custom provider over the Responses API (`wire_api = "responses"`).

Codex is installed by scripts/test-python.sh (`npm install --prefix .cache/npm
@openai/codex@<pinned>`), which passes its launcher in TOKENMILL_CODEX; this test installs
nothing. The model is Gemma 3 270M (32k context: Codex's instructions and tool list are
~10k tokens, past the default model's 2k) with `--tool-call-parser generic`, so any answer
is either text or a valid call of one of Codex's tools; tests/python/codex/ holds its chat
template (Gemma 3's turn format: the base GGUF has none) and the server's default sampling. A 270M base model writes poor
answers; what is checked is the protocol: Codex finishes the turn (exit 0), reports no error
event, and every request it sent was answered 200 (Codex's retries are off, so one refused
request would fail the run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import launcher, start_agent_server, stop_server

SERVED_NAME = "tm-codex"
PROMPT = "Say hello to me in one short sentence. Do not run any commands."
# Codex's first prompt is ~9,900 tokens: about 2 minutes of cold prefill on two CPU cores.
CODEX_TIMEOUT_S = 240
ACCESS = re.compile(r"tokenmill::access: POST /v1/responses (\d{3})")


@pytest.fixture(scope="module")
def codex_server():
    codex = launcher("TOKENMILL_CODEX", "Codex CLI")
    server = start_agent_server(SERVED_NAME, "--max-model-len", "16384")
    yield server, codex
    stop_server(server)


def codex_home(directory: Path, base_url: str) -> Path:
    home = directory / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'''model = "{SERVED_NAME}"
model_provider = "tokenmill"

[model_providers.tokenmill]
name = "tokenmill"
base_url = "{base_url}"
wire_api = "responses"
env_key = "TOKENMILL_API_KEY"
request_max_retries = 0
stream_max_retries = 0
'''
    )
    return home


def test_codex_exec_runs_to_completion(codex_server):
    server, codex = codex_server
    with tempfile.TemporaryDirectory(prefix="tokenmill-codex-") as tmp:
        directory = Path(tmp)
        home = codex_home(directory, server.api_url)
        workdir = directory / "work"
        workdir.mkdir()
        env = {**os.environ, "CODEX_HOME": str(home), "TOKENMILL_API_KEY": "unused", "NO_COLOR": "1"}
        run = subprocess.run(
            [codex, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
             "--ephemeral", "--json", "--color", "never", PROMPT],
            cwd=workdir, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=CODEX_TIMEOUT_S,
        )
    log = server.log()
    detail = f"stdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-4000:]}\nserver log:\n{log[-4000:]}"
    assert run.returncode == 0, detail
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    kinds = [event.get("type") for event in events]
    assert "turn.completed" in kinds, detail
    assert "error" not in kinds and "turn.failed" not in kinds, detail
    # Codex's requests reached the Responses route and every one was answered 200.
    statuses = ACCESS.findall(log)
    assert statuses and set(statuses) == {"200"}, detail
