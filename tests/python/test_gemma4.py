"""Gemma 4 over real HTTP with the official `openai` client and httpx: a random-weight Gemma 4
GGUF (gemma4_gguf.py: E2B's layer pattern at toy width, with Gemma 4's real 262,144-token
tokenizer and google/gemma-4's chat template from llama.cpp's vocabulary file) served with
vLLM's Gemma 4 flags (`--tool-call-parser gemma4 --reasoning-parser gemma4`).

- The template: for every conversation of crates/text/tests/fixtures/chat_templates_gemma4.json
  (rendered there by transformers' Jinja2 renderer: plain, system, a tool round trip with
  reasoning, a thinking answer, each with and without `enable_thinking`), the tokens the
  server prompts with (`/tokenize` of the messages, and a chat request's `prompt_tokens`) are
  exactly the tokens of the reference rendering.
- The model's output is noise, so the rest asserts on the protocol: a forced tool call (named
  and `required`, streamed and not) comes back as a Gemma 4 call whose arguments validate, its
  result goes back through the template; streamed free text concatenates to what the
  non-streamed request returns.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import httpx
import pytest

from conftest import MODEL_NAME, start_server, stop_server
from gemma4_gguf import write_model
from tool_protocol import forced_call_and_round_trip, required_call

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = json.loads((REPO / "crates/text/tests/fixtures/chat_templates_gemma4.json").read_text())


@pytest.fixture(scope="module")
def gemma4_server():
    with tempfile.TemporaryDirectory(prefix="tokenmill-gemma4-") as work:
        model = write_model(Path(work) / "gemma4-e2b-like.gguf")
        server = start_server(
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "gemma4",
            "--reasoning-parser",
            "gemma4",
            model=str(model),
        )
        try:
            yield server
        finally:
            stop_server(server)


def tokenize(server, body: dict) -> list[int]:
    response = httpx.post(f"{server.base_url}/tokenize", json={"model": MODEL_NAME, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def test_the_server_names_gemma_4(gemma4_server):
    log = gemma4_server.log()
    assert "Gemma 4" in log, log[-2000:]
    assert [m.id for m in gemma4_server.client().models.list().data] == [MODEL_NAME]


@pytest.mark.parametrize(
    "case",
    TEMPLATES["cases"],
    ids=[f"{c['conversation']}-thinking={bool(c['chat_template_kwargs'])}" for c in TEMPLATES["cases"]],
)
def test_prompts_are_the_reference_templates_tokens(gemma4_server, case):
    expected = tokenize(gemma4_server, {"prompt": case["expected"], "add_special_tokens": False})
    assert expected[0] == 2, "the reference rendering starts with <bos>"
    body = {"messages": case["messages"], "chat_template_kwargs": case["chat_template_kwargs"]}
    if case["tools"]:
        body["tools"] = case["tools"]
    assert tokenize(gemma4_server, body) == expected
    response = httpx.post(
        f"{gemma4_server.base_url}/v1/chat/completions",
        json={"model": MODEL_NAME, "max_tokens": 1, "temperature": 0, **body},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == len(expected)


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_call_and_round_trip(gemma4_server, stream):
    # The round trip: the call, its reasoning and its result go back through Gemma 4's
    # template (tool_call / tool_response blocks).
    forced_call_and_round_trip(
        gemma4_server.client(), stream, {"reasoning_content": "The user wants the weather: call get_weather."}
    )


def test_required_tool_choice_calls_one_of_the_tools(gemma4_server):
    required_call(gemma4_server.client())


def test_streamed_text_is_the_whole_answer(gemma4_server):
    client = gemma4_server.client()
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    whole = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=24, temperature=0,
    )
    assert whole.usage.completion_tokens <= 24
    content, reasoning = "", ""
    for chunk in client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=24, temperature=0, stream=True,
    ):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
    message = whole.choices[0].message
    assert content == (message.content or "")
    assert reasoning == (getattr(message, "reasoning_content", None) or "")
