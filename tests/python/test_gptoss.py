"""gpt-oss over real HTTP with the official `openai` client: the random-weight gpt-oss GGUF
(gptoss_gguf.py: gpt-oss-20b's attention and routing, MXFP4 experts, a harmony vocabulary and
gpt-oss's real chat template) served with vLLM's gpt-oss flags (`--tool-call-parser openai
--reasoning-parser openai_gptoss`). The model's output is noise, so the tests assert on the
protocol: a forced tool call (named and `required`, streamed and not) comes back as a call
whose arguments validate; the full round trip (the call, then its result as a `tool` message)
renders through the harmony template and answers; free generation stops and reports usage.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from conftest import MODEL_NAME, start_server, stop_server
from gptoss_gguf import write
from test_tools import ASK, TOOLS
from tool_protocol import forced_call_and_round_trip, required_call


@pytest.fixture(scope="module")
def gptoss_server():
    with tempfile.TemporaryDirectory(prefix="tokenmill-gptoss-") as work:
        model = write(Path(work) / "gptoss-20b-like.gguf")
        server = start_server(
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "openai",
            "--reasoning-parser",
            "openai_gptoss",
            model=str(model),
        )
        try:
            yield server
        finally:
            stop_server(server)


def test_the_server_names_gpt_oss(gptoss_server):
    log = gptoss_server.log()
    assert "gpt-oss" in log, log[-2000:]
    models = gptoss_server.client().models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_call_and_round_trip(gptoss_server, stream):
    # The round trip: the call and its result go back through the harmony template; its
    # analysis goes back as `reasoning`, which the harmony template renders as the analysis
    # channel (`thinking`).
    forced_call_and_round_trip(
        gptoss_server.client(), stream, {"reasoning": "The user wants the weather: call get_weather."}
    )


def test_required_tool_choice_calls_one_of_the_tools(gptoss_server):
    required_call(gptoss_server.client())


def test_free_generation_stops_with_usage(gptoss_server):
    response = gptoss_server.client().chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=24, temperature=0,
        reasoning_effort="low",
    )
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert response.usage.completion_tokens <= 24
