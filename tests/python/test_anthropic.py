"""Anthropic's Messages API through the official `anthropic` Python SDK (pinned in
tests/python/requirements.lock), on the default model (SmolLM2-135M-Instruct, whose template
has no tool support, so tools run in the generic mode: described in a system prompt, the
answer constrained to JSON).

Covered: messages.create, the messages.stream helper and its final message, tools (`any`,
a named `tool`, `auto` with the generic parser), a tool round trip, streamed `input_json_delta`s
that concatenate to exactly the final `input`, thinking blocks with a reasoning parser,
count_tokens, prefix-cache reads in the usage, and the SDK parsing each error tokenmill returns
into its typed exception, with the server still serving and its KV cache empty afterwards."""

from __future__ import annotations

import json

import anthropic
import pytest

from conftest import MODEL_NAME, start_server, stop_server

KEY = "sk-ant-test"
ALIAS = "claude-sonnet-4-6"
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
TIME = {
    "name": "get_time",
    "description": "Current time in a timezone.",
    "input_schema": {
        "type": "object",
        "properties": {"timezone": {"type": "string", "maxLength": 20}},
        "required": ["timezone"],
        "additionalProperties": False,
    },
    "cache_control": {"type": "ephemeral"},
}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
# This SDK no longer has `temperature` as an argument (newer Claude models fix it); the API
# still takes it, and greedy decoding makes streamed and unstreamed replies comparable.
GREEDY = {"temperature": 0}


def check_input(name: str, tool_input: dict) -> None:
    """A call's input satisfies its tool's schema."""
    if name == "get_weather":
        assert set(tool_input) == {"city", "unit"}, tool_input
        assert isinstance(tool_input["city"], str) and len(tool_input["city"]) <= 20
        assert tool_input["unit"] in ("celsius", "fahrenheit")
    else:
        assert name == "get_time", name
        assert set(tool_input) == {"timezone"}, tool_input


@pytest.fixture(scope="module")
def anthropic_server():
    # A second --served-model-name: a Claude model name pointed at the served model.
    server = start_server(
        "--enable-auto-tool-choice", "--tool-call-parser", "generic",
        "--served-model-name", MODEL_NAME, ALIAS,
        "--api-key", KEY,
        api_key=KEY,
    )
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def claude(anthropic_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=anthropic_server.base_url, api_key=KEY, max_retries=0, timeout=120.0)


def test_create_plain_with_an_alias(claude):
    message = claude.messages.create(
        model=ALIAS, max_tokens=24, extra_body=GREEDY,
        system="You are a helpful assistant.",
        messages=[{"role": "user", "content": "Name three colors."}],
    )
    assert isinstance(message, anthropic.types.Message)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == ALIAS
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 24
    assert message.usage.cache_creation_input_tokens == 0


def test_stream_helper_and_final_message(claude):
    kwargs = dict(model=MODEL_NAME, max_tokens=24, extra_body=GREEDY,
                  messages=[{"role": "user", "content": "Write one sentence about the sea."}])
    plain = claude.messages.create(**kwargs)
    with claude.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == plain.content[0].text
    assert final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert final.id.startswith("msg_")


def tool_blocks(message) -> list:
    return [block for block in message.content if block.type == "tool_use"]


@pytest.mark.parametrize("parallel_off", [False, True])
def test_any_always_calls_a_tool(claude, parallel_off):
    message = claude.messages.create(
        model=MODEL_NAME, max_tokens=120, extra_body=GREEDY, messages=ASK, tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": parallel_off},
    )
    calls = tool_blocks(message)
    assert message.stop_reason == "tool_use"
    assert calls and (not parallel_off or len(calls) == 1)
    for call in calls:
        assert call.id.startswith("toolu_")
        check_input(call.name, call.input)


def test_named_tool_streamed_partial_json_is_the_input(claude):
    kwargs = dict(model=MODEL_NAME, max_tokens=100, extra_body=GREEDY, messages=ASK, tools=TOOLS,
                  tool_choice={"type": "tool", "name": "get_weather"})
    plain = claude.messages.create(**kwargs)
    assert [call.name for call in tool_blocks(plain)] == ["get_weather"]
    check_input("get_weather", tool_blocks(plain)[0].input)

    partial: dict[int, str] = {}
    with claude.messages.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial[event.index] = partial.get(event.index, "") + event.delta.partial_json
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    for index, block in enumerate(final.content):
        if block.type == "tool_use":
            # Exactly the final input, byte for byte, and the same call as unstreamed (greedy).
            assert partial[index] == json.dumps(block.input, separators=(",", ":"), ensure_ascii=False)
            assert block.input == tool_blocks(plain)[0].input


def test_auto_with_the_generic_parser(claude):
    message = claude.messages.create(
        model=MODEL_NAME, max_tokens=120, extra_body=GREEDY, messages=ASK, tools=TOOLS,
        tool_choice={"type": "auto"},
    )
    calls = tool_blocks(message)
    if calls:
        assert message.stop_reason == "tool_use"
        for call in calls:
            check_input(call.name, call.input)
    else:
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert message.content and message.content[0].type == "text"


def test_a_tool_round_trip(claude):
    first = claude.messages.create(
        model=MODEL_NAME, max_tokens=100, extra_body=GREEDY, messages=ASK, tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    call = tool_blocks(first)[0]
    history = ASK + [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees, sunny"},
        ]},
    ]
    answer = claude.messages.create(
        model=MODEL_NAME, max_tokens=40, extra_body=GREEDY, messages=history, tools=TOOLS,
        tool_choice={"type": "none"},
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.content[0].type == "text" and answer.content[0].text.strip()
    assert not tool_blocks(answer)


def test_count_tokens_matches_the_usage(claude):
    messages = [{"role": "user", "content": "Count my tokens, please."}]
    counted = claude.messages.count_tokens(model=MODEL_NAME, messages=messages)
    with_tools = claude.messages.count_tokens(model=MODEL_NAME, messages=messages, tools=TOOLS)
    assert with_tools.input_tokens > counted.input_tokens > 0
    message = claude.messages.create(model=MODEL_NAME, max_tokens=2, messages=messages)
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == counted.input_tokens


def test_a_repeated_long_prefix_reads_the_cache(claude):
    system = [{"type": "text", "text": "Background: " + " ".join(f"fact {i} is true." for i in range(120)),
               "cache_control": {"type": "ephemeral"}}]
    usages = []
    for question in ("Is fact 3 true?", "Is fact 7 true?"):
        message = claude.messages.create(model=MODEL_NAME, max_tokens=4, system=system,
                                         messages=[{"role": "user", "content": question}])
        usages.append(message.usage)
    assert usages[1].cache_read_input_tokens > 400, usages
    assert usages[1].input_tokens < usages[0].input_tokens + usages[0].cache_read_input_tokens


def test_errors_are_typed_exceptions_and_the_server_recovers(anthropic_server, claude):
    with pytest.raises(anthropic.BadRequestError) as bad_field:
        claude.messages.create(model=MODEL_NAME, max_tokens=8, messages=ASK, extra_body={"frobnicate": 1})
    assert "frobnicate" in str(bad_field.value)
    assert bad_field.value.body["error"]["type"] == "invalid_request_error"

    wrong_key = anthropic.Anthropic(base_url=anthropic_server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong_key.messages.create(model=MODEL_NAME, max_tokens=8, messages=ASK)

    with pytest.raises(anthropic.NotFoundError) as unknown:
        claude.messages.create(model="claude-opus-4-1", max_tokens=8, messages=ASK)
    assert "claude-opus-4-1" in str(unknown.value)

    with pytest.raises(anthropic.BadRequestError) as too_long:
        claude.messages.create(model=MODEL_NAME, max_tokens=8,
                               messages=[{"role": "user", "content": "word " * 12000}])
    assert "prompt is too long" in str(too_long.value)
    assert too_long.value.response.headers["request-id"].startswith("req_")

    with pytest.raises(anthropic.BadRequestError) as image:
        claude.messages.create(model=MODEL_NAME, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert "image" in str(image.value)

    # Still serving, counted in vLLM's request metrics, nothing left in the KV cache.
    before = anthropic_server.metrics().get("vllm:request_success_total", 0.0)
    message = claude.messages.create(model=MODEL_NAME, max_tokens=4, messages=ASK)
    assert message.content
    metrics = anthropic_server.metrics()
    assert metrics["vllm:request_success_total"] == before + 1
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0


def test_raw_http_conventions(anthropic_server):
    body = {"model": MODEL_NAME, "max_tokens": 4, "stream": True, "messages": ASK}
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14"}
    with anthropic_server.http() as http:
        with http.stream("POST", "/v1/messages?beta=true", json=body, headers=headers) as response:
            assert response.status_code == 200
            assert response.headers["request-id"].startswith("req_")
            text = "".join(response.iter_text())
    names = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]


@pytest.fixture(scope="module")
def thinking_server():
    server = start_server("--reasoning-parser", "deepseek_r1")
    yield server
    stop_server(server)


def test_thinking_blocks_with_a_reasoning_parser(thinking_server):
    claude = anthropic.Anthropic(base_url=thinking_server.base_url, api_key="unused", max_retries=0)
    # deepseek_r1 reads everything before `</think>` as reasoning (the template opened it).
    kwargs = dict(model=MODEL_NAME, max_tokens=16, extra_body=GREEDY, thinking={"type": "adaptive"},
                  messages=[{"role": "user", "content": "Think about the number 7."}])
    message = claude.messages.create(**kwargs)
    assert message.content[0].type == "thinking"
    assert message.content[0].thinking and message.content[0].signature
    with claude.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert final.content[0].thinking == message.content[0].thinking
    assert final.content[0].signature == message.content[0].signature
    # Earlier thinking is sent back with the history and accepted.
    follow_up = claude.messages.create(
        model=MODEL_NAME, max_tokens=4, thinking={"type": "disabled"},
        messages=kwargs["messages"] + [{"role": "assistant", "content": message.content},
                                       {"role": "user", "content": "Go on."}],
    )
    assert follow_up.content


def test_a_thinking_budget_caps_the_thinking_block(thinking_server):
    """`thinking.budget_tokens` is enforced: the engine forces `</think>` once the thinking has
    spent the budget (deepseek_r1 reads the output as thinking until then; this small model
    never closes it by itself), so the answer gets the rest of `max_tokens`."""
    claude = anthropic.Anthropic(base_url=thinking_server.base_url, api_key="unused", max_retries=0)
    budget = 1024
    message = claude.messages.create(
        model=MODEL_NAME, max_tokens=budget + 24, extra_body=GREEDY,
        thinking={"type": "enabled", "budget_tokens": budget},
        messages=[{"role": "user", "content": "Think about the number 7."}])
    kinds = [block.type for block in message.content]
    assert kinds[0] == "thinking" and "text" in kinds, kinds
    thinking = message.content[0].thinking
    counted = thinking_server.http().post(
        "/tokenize", json={"model": MODEL_NAME, "prompt": thinking, "add_special_tokens": False})
    assert 0 < counted.json()["count"] <= budget + 8, counted.json()["count"]
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text.strip(), message
    # The thinking ran into the budget (the close was forced, not the model's own).
    assert message.usage.output_tokens > budget, message.usage
