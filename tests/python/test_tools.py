"""Tool calling through the official `openai` client and LangChain, on the default model
(SmolLM2-135M-Instruct, whose chat template has no tool support, so the server runs the
generic mode: tools described in a system prompt, the answer constrained to JSON).

`required` and named choices must always yield calls whose arguments validate against the
tool's schema, streamed or not; streamed calls must follow the delta invariant (first delta:
index, id, type, name; later ones only argument fragments); a full round trip renders through
the chat template; LangChain's bind_tools and with_structured_output work unchanged."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from conftest import MODEL_NAME, start_server, stop_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 20}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]


def check_arguments(name: str, arguments: str) -> dict:
    """The arguments parse as JSON and satisfy the named tool's schema."""
    args = json.loads(arguments)
    if name == "get_weather":
        assert set(args) == {"city", "unit"}, args
        assert isinstance(args["city"], str) and len(args["city"]) <= 20
        assert args["unit"] in ("celsius", "fahrenheit")
    else:
        assert name == "get_time", name
        assert set(args) == {"timezone"} and isinstance(args["timezone"], str), args
    return args


def collect_stream(stream) -> tuple[dict[int, dict], str, str | None]:
    """Rebuilds calls from streamed deltas, asserting the delta invariant on the way."""
    calls: dict[int, dict] = {}
    content = ""
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            if call.index not in calls:
                assert call.index == len(calls), "call indices count up from 0"
                assert call.id and call.id.startswith("call_")
                assert call.type == "function" and call.function.name
                calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": call.function.arguments or ""}
            else:
                assert call.id is None and call.type is None and call.function.name is None
                calls[call.index]["arguments"] += call.function.arguments or ""
        if choice.finish_reason:
            finish = choice.finish_reason
    return calls, content, finish


@pytest.fixture(scope="module")
def tool_server():
    server = start_server("--enable-auto-tool-choice", "--tool-call-parser", "generic")
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def tool_client(tool_server):
    return tool_server.client()


@pytest.mark.parametrize("parallel", [True, False])
def test_required_always_calls_a_tool(tool_client, parallel):
    response = tool_client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=parallel, max_tokens=120, temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls and (parallel or len(calls) == 1)
    assert len({call.id for call in calls}) == len(calls)
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        check_arguments(call.function.name, call.function.arguments)


def test_named_function_streamed_and_not(tool_client):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    response = tool_client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=80, temperature=0,
    )
    message = response.choices[0].message
    assert response.choices[0].finish_reason == "tool_calls"
    assert [call.function.name for call in message.tool_calls] == ["get_weather"]
    expected = check_arguments("get_weather", message.tool_calls[0].function.arguments)

    stream = tool_client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=80, temperature=0, stream=True,
    )
    calls, content, finish = collect_stream(stream)
    assert finish == "tool_calls" and content == ""
    assert [call["name"] for call in calls.values()] == ["get_weather"]
    # Greedy: the streamed fragments concatenate to the same arguments.
    assert check_arguments("get_weather", calls[0]["arguments"]) == expected
    assert calls[0]["arguments"] == message.tool_calls[0].function.arguments


def test_required_streamed_with_parallel_calls(tool_client):
    stream = tool_client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Weather in Paris and the time in Tokyo, please."}],
        tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0, stream=True,
    )
    calls, _, finish = collect_stream(stream)
    assert calls
    for call in calls.values():
        if finish == "tool_calls":
            check_arguments(call["name"], call["arguments"])


def test_auto_answers_with_text_or_calls(tool_client):
    response = tool_client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0,
    )
    choice = response.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason in ("tool_calls", "length")
    else:
        assert isinstance(choice.message.content, str) and not choice.message.content.startswith("{")


def test_full_round_trip(tool_client, tool_server):
    first = tool_client.chat.completions.create(
        model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80, temperature=0,
    )
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "22 degrees and sunny"},
    ]
    final = tool_client.chat.completions.create(
        model=MODEL_NAME, messages=history, tools=TOOLS, tool_choice="none", max_tokens=30, temperature=0,
    )
    assert isinstance(final.choices[0].message.content, str) and final.choices[0].message.content
    assert not final.choices[0].message.tool_calls
    # The tool result and the earlier call reached the prompt through the chat template.
    with tool_server.http() as http:
        tokens = http.post("/tokenize", json={"model": MODEL_NAME, "messages": history}).json()["tokens"]
        prompt = http.post("/detokenize", json={"model": MODEL_NAME, "tokens": tokens}).json()["prompt"]
    assert "22 degrees and sunny" in prompt and "get_weather" in prompt


def test_auto_without_the_flags_is_vllms_400(client):
    import openai

    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=5)
    assert '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set' in str(error.value)


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(max_length=20)
    unit: Literal["celsius", "fahrenheit"]


def langchain_model(server):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL_NAME, base_url=server.api_url, api_key="unused", max_tokens=80, temperature=0)


def test_langchain_bind_tools_invoke_and_stream(tool_server):
    llm = langchain_model(tool_server).bind_tools([GetWeather], tool_choice="GetWeather")
    message = llm.invoke("What is the weather like in Paris?")
    assert [call["name"] for call in message.tool_calls] == ["GetWeather"]
    GetWeather.model_validate(message.tool_calls[0]["args"])

    chunks = list(llm.stream("What is the weather like in Paris?"))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert [call["name"] for call in merged.tool_calls] == ["GetWeather"]
    assert merged.tool_calls[0]["args"] == message.tool_calls[0]["args"]


def test_langchain_with_structured_output_function_calling(tool_server):
    structured = langchain_model(tool_server).with_structured_output(GetWeather, method="function_calling")
    result = structured.invoke("What is the weather like in Paris?")
    assert isinstance(result, GetWeather)
