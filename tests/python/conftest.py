"""Fixtures for the real-HTTP tests: a `tokenmill serve` process on a free port.

Each server runs in its own process group with its log in a temporary file; the fixture
reads the bound address from the `Listening on URL` line (the server is started with
`--port 0`, so the OS picks the port) and waits for `/health` before handing it out.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = "tm-test"
STARTUP_TIMEOUT_S = 120.0
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
LISTENING = re.compile(r"Listening on (https?://\S+)")


def model_path() -> str:
    """The default model: TOKENMILL_TEST_MODEL, else the cache path; missing fails the run."""
    path = os.environ.get("TOKENMILL_TEST_MODEL") or os.path.expanduser(
        "~/.cache/tokenmill/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    if not os.path.exists(path):
        pytest.fail(
            f"test model not found at {path}: set TOKENMILL_TEST_MODEL or run scripts/fetch-model.sh",
            pytrace=False,
        )
    return path


def require(what: str, found: bool) -> None:
    """Skips without `what`, or fails under TOKENMILL_REQUIRE_ASSETS=1 (CI provides it)."""
    if found:
        return
    if os.environ.get("TOKENMILL_REQUIRE_ASSETS") == "1":
        pytest.fail(f"{what} (TOKENMILL_REQUIRE_ASSETS=1)", pytrace=False)
    pytest.skip(what)


def launcher(variable: str, what: str) -> str:
    """The executable named by `variable` (scripts/test-python.sh installs the agent CLIs
    and sets it), or skip/fail as `require` does."""
    path = os.environ.get(variable, "")
    require(
        f"{what} not found: scripts/test-python.sh installs it and sets {variable}",
        bool(path) and os.access(path, os.X_OK),
    )
    return path


def gemma_path() -> str:
    """Gemma 3 270M (32k context): the model the coding-agent tests serve."""
    path = os.environ.get("TOKENMILL_GEMMA3_MODEL") or os.path.expanduser(
        "~/.cache/tokenmill/models/gemma-3-270m-q4_k_m.gguf"
    )
    require(f"Gemma 3 270M not found at {path} (scripts/fetch-gemma3.sh)", os.path.exists(path))
    return path


def binary_path() -> str:
    path = os.environ.get("TOKENMILL_BINARY") or str(REPO / "target/release/tokenmill")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: run scripts/test-python.sh (it builds it)", pytrace=False)
    return path


@dataclass
class Server:
    """A running `tokenmill serve` process."""

    process: subprocess.Popen
    base_url: str
    log_path: Path
    verify: object = True
    api_key: str | None = None

    @property
    def api_url(self) -> str:
        return self.base_url + "/v1"

    def log(self) -> str:
        return ANSI_ESCAPE.sub("", self.log_path.read_text(errors="replace"))

    def client(self, **kwargs) -> openai.OpenAI:
        kwargs.setdefault("api_key", self.api_key or "unused")
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 120.0)
        return openai.OpenAI(base_url=self.api_url, **kwargs)

    def http(self, **kwargs) -> httpx.Client:
        kwargs.setdefault("timeout", 120.0)
        kwargs.setdefault("verify", self.verify)
        return httpx.Client(base_url=self.base_url, **kwargs)

    def metrics(self) -> dict[str, float]:
        """Unlabelled-name → value of every sample on /metrics (labels dropped, summed)."""
        with self.http() as http:
            response = http.get("/metrics")
        response.raise_for_status()
        values: dict[str, float] = {}
        for line in response.text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_and_labels, _, value = line.rpartition(" ")
            name = name_and_labels.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(value)
        return values

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM the server and wait for it; SIGKILL the group if it hangs."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise AssertionError(f"server did not exit within {timeout} s:\n{self.log()[-4000:]}")


def start_server(
    *flags: str,
    verify: object = True,
    api_key: str | None = None,
    model: str | None = None,
    served_model_name: str = MODEL_NAME,
    kv_cache_memory: str = "512MiB",
) -> Server:
    """Starts `tokenmill serve` on `model` (default: the default model) with `flags` and
    waits until healthy."""
    log_file = tempfile.NamedTemporaryFile(prefix="tokenmill-serve-", suffix=".log", delete=False)
    command = [
        binary_path(),
        "serve",
        model or model_path(),
        "--port",
        "0",
        "--kv-cache-memory",
        kv_cache_memory,
        "--served-model-name",
        served_model_name,
        "--disable-log-stats",
        *flags,
    ]
    process = subprocess.Popen(
        command,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    log_path = Path(log_file.name)
    log_file.close()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    base_url = None
    while base_url is None:
        text = ANSI_ESCAPE.sub("", log_path.read_text(errors="replace"))
        match = LISTENING.search(text)
        if match:
            base_url = match.group(1).rstrip("/")
            break
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode} before listening:\n{text}")
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            raise AssertionError(f"server did not report its address in time:\n{text}")
        time.sleep(0.05)
    server = Server(process=process, base_url=base_url, log_path=log_path, verify=verify, api_key=api_key)
    with server.http() as http:
        while True:
            try:
                if http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                server.terminate()
                raise AssertionError(f"/health never turned 200:\n{server.log()}")
            time.sleep(0.05)
    return server


AGENT_SETUP = Path(__file__).resolve().parent / "codex"


def start_agent_server(served_model_name: str, *flags: str, kv_cache_memory: str = "512MiB") -> Server:
    """Gemma 3 270M served as the coding-agent tests need it: any answer is text or a valid
    call of the agent's tools (`--tool-call-parser generic`); the base GGUF ships no chat
    template, so tests/python/codex/ holds Gemma 3's, and its default sampling (greedy with a
    strong repetition penalty, 256 tokens at most) makes the tiny model's first answer a short
    text, so the turn ends; requests are logged for the access-log check."""
    return start_server(
        "--enable-auto-tool-choice", "--tool-call-parser", "generic",
        "--chat-template", str(AGENT_SETUP / "gemma3.jinja"),
        "--generation-config", str(AGENT_SETUP),
        "--enable-log-requests", "--max-log-len", "200",
        *flags,
        model=gemma_path(), served_model_name=served_model_name, kv_cache_memory=kv_cache_memory,
    )


def stop_server(server: Server) -> None:
    try:
        server.terminate()
    finally:
        if server.process.poll() is None:
            os.killpg(server.process.pid, signal.SIGKILL)
        server.log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def server():
    """The shared plain-HTTP server most tests talk to."""
    server = start_server()
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return server.client()
