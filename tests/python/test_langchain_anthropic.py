"""LangChain's `ChatAnthropic` (langchain-anthropic, pinned in tests/python/requirements.lock)
pointed at tokenmill's Messages API on the default model: `invoke`, `stream`, `bind_tools`
(a named tool and `any`), `with_structured_output` (tool calling and the native
`json_schema` method), and a tool round trip with a `ToolMessage`."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

from conftest import MODEL_NAME, start_server, stop_server

KEY = "sk-ant-langchain"


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(max_length=20)
    unit: Literal["celsius", "fahrenheit"]


@pytest.fixture(scope="module")
def anthropic_server():
    server = start_server(
        "--enable-auto-tool-choice", "--tool-call-parser", "generic",
        "--api-key", KEY, api_key=KEY,
    )
    yield server
    stop_server(server)


def chat_model(server, **kwargs):
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(model=MODEL_NAME, base_url=server.base_url, api_key=KEY,
                         max_tokens=kwargs.pop("max_tokens", 40), temperature=0, max_retries=0,
                         **kwargs)


def test_invoke_and_stream_agree(anthropic_server):
    llm = chat_model(anthropic_server)
    message = llm.invoke("What is the capital of France?")
    assert isinstance(message.content, str) and message.content.strip(), message
    usage = message.usage_metadata
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0, usage
    chunks = list(llm.stream("What is the capital of France?"))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    streamed = merged.content if isinstance(merged.content, str) else "".join(
        part.get("text", "") for part in merged.content if isinstance(part, dict))
    assert streamed == message.content


@pytest.mark.parametrize("tool_choice", ["GetWeather", "any"])
def test_bind_tools_calls_the_tool(anthropic_server, tool_choice):
    llm = chat_model(anthropic_server, max_tokens=80).bind_tools([GetWeather], tool_choice=tool_choice)
    message = llm.invoke("What is the weather like in Paris?")
    assert [call["name"] for call in message.tool_calls] == ["GetWeather"], message
    GetWeather.model_validate(message.tool_calls[0]["args"])


def test_a_tool_round_trip(anthropic_server):
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = chat_model(anthropic_server, max_tokens=80).bind_tools([GetWeather], tool_choice="GetWeather")
    question = HumanMessage("What is the weather like in Paris?")
    call = llm.invoke([question])
    result = ToolMessage("18 degrees and sunny", tool_call_id=call.tool_calls[0]["id"])
    answer = chat_model(anthropic_server).bind_tools([GetWeather]).invoke([question, call, result])
    assert answer.content, answer


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_with_structured_output(anthropic_server, method):
    structured = chat_model(anthropic_server, max_tokens=80).with_structured_output(GetWeather, method=method)
    result = structured.invoke("What is the weather like in Paris?")
    assert isinstance(result, GetWeather), result
