"""The tool-call protocol checks shared by the tests that serve a random-weight model whose
output is noise (test_gptoss.py, test_gemma4.py): a forced call, named or `required`,
streamed or not, must come back as a call whose arguments validate, and the call with its
result must go back through the model's chat template."""

from __future__ import annotations

import json

import jsonschema

from conftest import MODEL_NAME
from test_tools import ASK, TOOLS, WEATHER

NAMED = {"type": "function", "function": {"name": "get_weather"}}


def check_call(call) -> dict:
    tool = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, tool["function"]["parameters"])
    return arguments


def forced_call_and_round_trip(client, stream: bool, reasoning: dict) -> None:
    """The named forced call; not streamed, also its round trip, with the assistant turn's
    reasoning in `reasoning` (the message key and text the template under test reads)."""
    if stream:
        chunks = client.chat.completions.create(
            model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice=NAMED,
            max_tokens=256, temperature=0, stream=True,
        )
        name, arguments, finish = None, "", None
        for chunk in chunks:
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or []:
                    name = delta.function.name or name
                    arguments += delta.function.arguments or ""
                finish = choice.finish_reason or finish
        assert (name, finish) == ("get_weather", "tool_calls")
        jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
        return
    response = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice=NAMED,
        max_tokens=256, temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    check_call(call)
    assert response.usage.prompt_tokens > 20 and response.usage.completion_tokens > 0
    follow_up = client.chat.completions.create(
        model=MODEL_NAME,
        messages=ASK
        + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()], **reasoning},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 18})},
        ],
        tools=TOOLS,
        max_tokens=16,
        temperature=0,
    )
    assert follow_up.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert follow_up.usage.prompt_tokens > response.usage.prompt_tokens


def required_call(client) -> None:
    response = client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=256, temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    check_call(call)
