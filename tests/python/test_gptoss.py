"""gpt-oss over real HTTP with the official `openai` client: the random-weight gpt-oss GGUF
(gptoss_gguf.py: gpt-oss-20b's attention and routing, MXFP4 experts, a harmony vocabulary and
gpt-oss's real chat template) served with vLLM's gpt-oss flags (`--tool-call-parser openai
--reasoning-parser openai_gptoss`). The model's output is noise, so the tests assert on the
protocol: a forced tool call (named and `required`, streamed and not) comes back as a call
whose arguments validate; the full round trip (the call, then its result as a `tool` message)
renders through the harmony template and answers; free generation stops and reports usage.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import jsonschema
import pytest

from conftest import MODEL_NAME, start_server, stop_server
from gptoss_gguf import write
from test_tools import ASK, TOOLS, WEATHER


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


def check_call(call) -> dict:
    tool = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, tool["function"]["parameters"])
    return arguments


def test_the_server_names_gpt_oss(gptoss_server):
    log = gptoss_server.log()
    assert "gpt-oss" in log, log[-2000:]
    models = gptoss_server.client().models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_call_and_round_trip(gptoss_server, stream):
    client = gptoss_server.client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    if stream:
        chunks = client.chat.completions.create(
            model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice=named,
            max_tokens=256, temperature=0, stream=True,
        )
        name, arguments, finish, call_id = None, "", None, None
        for chunk in chunks:
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or []:
                    name = delta.function.name or name
                    call_id = delta.id or call_id
                    arguments += delta.function.arguments or ""
                finish = choice.finish_reason or finish
        assert (name, finish) == ("get_weather", "tool_calls")
        jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
        return
    response = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice=named,
        max_tokens=256, temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    check_call(call)
    assert response.usage.prompt_tokens > 20 and response.usage.completion_tokens > 0
    # The round trip: the call and its result go back through the harmony template.
    follow_up = client.chat.completions.create(
        model=MODEL_NAME,
        messages=ASK
        + [
            # Its analysis goes back as `reasoning`, which the harmony template renders as
            # the analysis channel (`thinking`).
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()],
             "reasoning": "The user wants the weather: call get_weather."},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 18})},
        ],
        tools=TOOLS,
        max_tokens=16,
        temperature=0,
    )
    assert follow_up.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert follow_up.usage.prompt_tokens > response.usage.prompt_tokens


def test_required_tool_choice_calls_one_of_the_tools(gptoss_server):
    response = gptoss_server.client().chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=256, temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    check_call(call)


def test_free_generation_stops_with_usage(gptoss_server):
    response = gptoss_server.client().chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=24, temperature=0,
        reasoning_effort="low",
    )
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert response.usage.completion_tokens <= 24
