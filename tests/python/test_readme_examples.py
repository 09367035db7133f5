"""The README's "Using the server" examples, run as written against a live server.

The curl command and the Python snippet are read from README.md itself (only the address
changes to the test server's port), so an example that drifts from what the server accepts
fails here. The server is started under the README's model name.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, start_server, stop_server

README_ADDRESS = "http://127.0.0.1:8000"
README_MODEL = "SmolLM2-135M-Instruct"


def using_the_server_blocks() -> dict[str, list[str]]:
    """The fenced code blocks of the README's "Using the server" section, by language."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Using the server", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, list[str]] = {}
    for language, body in re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S):
        blocks.setdefault(language, []).append(body)
    return blocks


@pytest.fixture(scope="module")
def readme_server():
    server = start_server(served_model_name=README_MODEL)
    yield server
    stop_server(server)


def test_the_readme_curl_example_works(readme_server):
    commands = [block for block in using_the_server_blocks()["sh"] if "curl" in block]
    assert commands, "no curl example in the README"
    command = commands[0].replace(README_ADDRESS, readme_server.base_url)
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["object"] == "chat.completion", reply
    assert reply["model"] == README_MODEL
    assert reply["choices"][0]["message"]["content"].strip(), reply


def test_the_readme_python_example_works(readme_server):
    snippet = using_the_server_blocks()["python"][0].replace(README_ADDRESS, readme_server.base_url)
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "the example printed no reply"


def test_the_readme_anthropic_example_works(readme_server):
    snippets = [block for block in using_the_server_blocks()["python"] if "import anthropic" in block]
    assert snippets, "no Anthropic SDK example in the README"
    snippet = snippets[0].replace(README_ADDRESS, readme_server.base_url)
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "the example printed no reply"


def test_the_readme_responses_example_works(readme_server):
    snippets = [block for block in using_the_server_blocks()["python"] if "responses.create" in block]
    assert snippets, "no Responses API example in the README"
    snippet = snippets[0].replace(README_ADDRESS, readme_server.base_url)
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "the example printed no reply"
