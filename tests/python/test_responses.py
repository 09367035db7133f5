"""OpenAI's Responses API (`/v1/responses`) through the official `openai` client, on the default
model (SmolLM2-135M-Instruct: its template has no tool support, so function tools run in the
generic mode, `--tool-call-parser generic`).

Covered: create plain / streamed (sequence numbers, the event order, concatenated deltas equal
to the final object) / with a function tool (required and auto) and its round trip /
`responses.parse` with a Pydantic model; a custom (free-form) tool whose input a regex holds,
streamed as `custom_tool_call_input` events, and its output sent back; two turns by `previous_response_id` whose second
reads the prefix cache; GET / DELETE / input_items; background runs, cancel (KV blocks freed)
and a cut stream resumed with `starting_after` equal to an uninterrupted greedy run; a
kill -9 restart (stored responses survive, an interrupted background run reads `failed`);
the API key scoping the store; two replicas sharing a PostgreSQL store (a conversation
continued on the other replica, a dead replica's background run failed by the live one); bad input, each an OpenAI-shaped error, the server still
serving and its KV cache empty afterwards; the OpenAI Agents SDK running an agent with one
function tool."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from conftest import MODEL_NAME, start_server, stop_server

WEATHER = {
    "type": "function",
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
    "strict": True,
}
GREEDY = {"temperature": 0}
FACTS = "Background: " + " ".join(f"fact {i} is true." for i in range(120))


def wait_idle(server, timeout: float = 30.0) -> dict:
    """Waits until nothing runs and the KV cache is empty; returns the metrics."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = server.metrics()
        idle = metrics.get("vllm:num_requests_running", 0) == 0 and metrics.get("vllm:kv_cache_usage_perc", 0) == 0
        if idle or time.monotonic() > deadline:
            return metrics
        time.sleep(0.1)


@pytest.fixture(scope="module")
def store_dir():
    with tempfile.TemporaryDirectory(prefix="tokenmill-responses-") as path:
        yield Path(path)


@pytest.fixture(scope="module")
def rserver(store_dir):
    server = start_server(
        "--enable-auto-tool-choice", "--tool-call-parser", "generic",
        "--responses-store", str(store_dir / "responses.sqlite3"),
    )
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def client(rserver) -> openai.OpenAI:
    return rserver.client()


def test_create_plain(client):
    response = client.responses.create(model=MODEL_NAME, input="Say hello.", max_output_tokens=8, **GREEDY)
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.output_text.strip()
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.output[0].content[0].type == "output_text"
    assert response.usage.input_tokens > 0 and 0 < response.usage.output_tokens <= 8
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.store is True and response.model == MODEL_NAME
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"


def test_stream_events_concatenate_to_the_final_object(client):
    kwargs = dict(model=MODEL_NAME, input="Name three colors.", max_output_tokens=16, **GREEDY)
    events = list(client.responses.create(stream=True, **kwargs))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", types[-1]]
    assert types[-1] in ("response.completed", "response.incomplete")
    final = events[-1].response
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == final.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == streamed
    item_done = next(e for e in events if e.type == "response.output_item.done")
    assert item_done.item.model_dump() == final.output[0].model_dump()
    # Greedy: the unstreamed response says the same.
    assert client.responses.create(**kwargs).output_text == streamed


def check_weather_call(item) -> dict:
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.call_id.startswith("call_") and item.id.startswith("fc_")
    args = json.loads(item.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    return args


def test_function_tool_required_then_round_trip(client):
    ask = "What is the weather like in Paris?"
    first = client.responses.create(model=MODEL_NAME, input=ask, tools=[WEATHER], tool_choice="required", **GREEDY)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls, first.output
    check_weather_call(calls[0])
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C."}
    # Continued by id...
    by_id = client.responses.create(model=MODEL_NAME, previous_response_id=first.id, input=[result],
                                    tools=[WEATHER], tool_choice="none", max_output_tokens=16, **GREEDY)
    assert by_id.output[0].type == "message" and by_id.output_text
    # ... and with the whole history sent back: the same prompt, so the same answer.
    history = [{"role": "user", "content": ask}] + [item.model_dump(exclude_none=True) for item in first.output] + [result]
    whole = client.responses.create(model=MODEL_NAME, input=history, tools=[WEATHER], tool_choice="none",
                                    max_output_tokens=16, **GREEDY)
    assert whole.output_text == by_id.output_text
    assert whole.usage.input_tokens == by_id.usage.input_tokens


def test_function_tool_auto_streamed(client):
    stream = client.responses.create(model=MODEL_NAME, input="What is the weather like in Oslo?", tools=[WEATHER],
                                     tool_choice="auto", stream=True, **GREEDY)
    events = list(stream)
    final = events[-1].response
    assert final.output, final
    for item in final.output:
        if item.type == "function_call":
            check_weather_call(item)
            deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta"
                             and e.item_id == item.id)
            assert deltas == item.arguments
        else:
            assert item.type == "message"


SHOUT = {
    "type": "custom",
    "name": "shout",
    "description": "Shouts one word.",
    "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]{3,8}"},
}


def test_custom_tool_forced_streamed_then_round_trip(client):
    ask = "Shout the word hello."
    stream = client.responses.create(model=MODEL_NAME, input=ask, tools=[SHOUT],
                                     tool_choice={"type": "custom", "name": "shout"}, stream=True,
                                     max_output_tokens=40, **GREEDY)
    events = list(stream)
    final = events[-1].response
    assert events[-1].type == "response.completed", events[-1]
    call = final.output[0]
    assert call.type == "custom_tool_call" and call.name == "shout", final.output
    assert call.id.startswith("ctc_") and call.call_id.startswith("call_")
    assert re.fullmatch("[A-Z]{3,8}", call.input), call.input
    deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    assert deltas == call.input
    done = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert len(done) == 1 and done[0].input == call.input and done[0].item_id == call.id
    result = {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "HELLO!"}
    history = [{"role": "user", "content": ask}, call.model_dump(exclude_none=True), result]
    answer = client.responses.create(model=MODEL_NAME, input=history, tools=[SHOUT], tool_choice="none",
                                     max_output_tokens=16, **GREEDY)
    assert answer.output[0].type == "message" and answer.output_text
    # A Lark grammar cannot be held inside the tool envelope: a 400 naming its syntax.
    lark = {**SHOUT, "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "A"'}}
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(model=MODEL_NAME, input=ask, tools=[lark])
    assert error.value.body["param"] == "tools[0].format.syntax"


class City(BaseModel):
    name: str = Field(max_length=20)
    country: Literal["France", "Germany", "Italy"]
    capital: bool


def test_parse_with_a_pydantic_model(client):
    parsed = client.responses.parse(model=MODEL_NAME, input="Describe Paris as JSON.", text_format=City,
                                    max_output_tokens=60, **GREEDY)
    assert isinstance(parsed.output_parsed, City), parsed.output_text
    assert parsed.text.format.type == "json_schema"


def test_two_turns_by_previous_response_id_read_the_cache(client):
    first = client.responses.create(model=MODEL_NAME, input=FACTS + " Is fact 3 true?", max_output_tokens=4, **GREEDY)
    second = client.responses.create(model=MODEL_NAME, previous_response_id=first.id,
                                     input="And is fact 7 true?", max_output_tokens=4, **GREEDY)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens > 400, second.usage


def test_get_delete_and_input_items(client, rserver):
    items = [{"role": "user", "content": f"Message {i}."} for i in range(5)]
    created = client.responses.create(model=MODEL_NAME, input=items, max_output_tokens=4,
                                      metadata={"topic": "test"}, **GREEDY)
    fetched = client.responses.retrieve(created.id)
    assert fetched.model_dump() == created.model_dump()
    assert fetched.metadata == {"topic": "test"}
    newest_first = client.responses.input_items.list(created.id)
    texts = [item.content[0].text for item in newest_first.data]
    assert texts == [f"Message {i}." for i in reversed(range(5))]
    page = client.responses.input_items.list(created.id, order="asc", limit=2)
    assert [item.content[0].text for item in page.data] == ["Message 0.", "Message 1."]
    assert page.has_more
    following = client.responses.input_items.list(created.id, order="asc", limit=2, after=page.data[-1].id)
    assert [item.content[0].text for item in following.data] == ["Message 2.", "Message 3."]
    # Auto-pagination walks them all.
    assert len(list(client.responses.input_items.list(created.id, order="asc", limit=2))) == 5
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)
    # store: false keeps nothing.
    unstored = client.responses.create(model=MODEL_NAME, input="Hi.", store=False, max_output_tokens=2)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


LONG_RUN = dict(model=MODEL_NAME, input="Count from one to one thousand.", max_output_tokens=1500,
                extra_body={"ignore_eos": True})


def test_background_run_and_cancel_frees_the_cache(client, rserver):
    started = client.responses.create(background=True, **LONG_RUN)
    assert started.status in ("queued", "in_progress") and started.background
    time.sleep(0.5)
    assert client.responses.retrieve(started.id).status in ("queued", "in_progress")
    cancelled = client.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(started.id).status == "cancelled"
    metrics = wait_idle(rserver)
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0
    # A finished background run completes by itself.
    short = client.responses.create(background=True, model=MODEL_NAME, input="Hi.", max_output_tokens=4, **GREEDY)
    deadline = time.monotonic() + 60
    while client.responses.retrieve(short.id).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert client.responses.retrieve(short.id).status in ("completed", "incomplete")
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(client.responses.create(model=MODEL_NAME, input="Hi.", max_output_tokens=2).id)


def test_a_cut_stream_resumes_without_losing_a_token(client):
    kwargs = dict(model=MODEL_NAME, input="Tell me about the sea.", max_output_tokens=48, **GREEDY)
    uninterrupted = client.responses.create(**kwargs).output_text
    stream = client.responses.create(background=True, stream=True, **kwargs)
    first_part, last_seen, response_id = "", None, None
    for event in stream:
        last_seen = event.sequence_number
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta":
            first_part += event.delta
            if len(first_part) >= 10:
                break
    stream.close()
    assert response_id and last_seen is not None
    resumed = client.responses.retrieve(response_id, stream=True, starting_after=last_seen)
    rest = list(resumed)
    assert rest[0].sequence_number == last_seen + 1
    second_part = "".join(e.delta for e in rest if e.type == "response.output_text.delta")
    assert first_part + second_part == uninterrupted
    assert rest[-1].response.output_text == uninterrupted


def test_hosted_tools_are_declared_not_offered(rserver):
    body = {"model": MODEL_NAME, "input": "Hi.", "max_output_tokens": 2,
            "tools": [{"type": "web_search"}, WEATHER], "tool_choice": "none"}
    with rserver.http() as http:
        response = http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-tokenmill-skipped-tools"] == "web_search"
    assert "hosted tools not offered" in rserver.log()


def test_bad_input_is_an_openai_error_and_the_server_recovers(client, rserver):
    def bad(status, **body):
        with rserver.http() as http:
            response = http.post("/v1/responses", json={"model": MODEL_NAME, **body})
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["message"] and error["type"]
        return error

    assert bad(400, input=[{"type": "web_search_call", "id": "ws_1"}])["param"] == "input[0].type"
    assert "previous_response_id" in bad(404, input="Hi.", previous_response_id="resp_missing")["param"]
    assert "call_nope" in bad(400, input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}])["message"]
    assert bad(400, input="Hi.", tools=[{"type": "web_search"}], tool_choice={"type": "web_search"})["param"] == "tool_choice"
    assert bad(400, input="word " * 12000)["param"] == "input"
    assert "frobnicate" in bad(400, input="Hi.", frobnicate=1)["message"]
    assert bad(400, input="Hi.", include=["code_interpreter_call.outputs"])["param"] == "include[0]"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL_NAME, input="Hi.", previous_response_id="resp_missing")
    # Still serving, counted like chat requests, nothing left in the KV cache.
    before = rserver.metrics().get("vllm:request_success_total", 0.0)
    assert client.responses.create(model=MODEL_NAME, input="Hi.", max_output_tokens=2).output
    metrics = wait_idle(rserver)
    assert metrics["vllm:request_success_total"] == before + 1
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0


def test_openapi_lists_the_routes(rserver):
    with rserver.http() as http:
        paths = http.get("/openapi.json").json()["paths"]
    for path in ("/v1/responses", "/v1/responses/{id}", "/v1/responses/{id}/input_items",
                 "/v1/responses/{id}/cancel"):
        assert path in paths


def test_a_restart_keeps_the_store_and_fails_interrupted_runs(tmp_path):
    key = "sk-responses"
    flags = ("--responses-store", str(tmp_path / "store.sqlite3"), "--api-key", key)
    server = start_server(*flags, api_key=key)
    try:
        client = server.client()
        kept = client.responses.create(model=MODEL_NAME, input="Remember me.", max_output_tokens=4, **GREEDY)
        running = client.responses.create(background=True, **LONG_RUN)
        time.sleep(0.5)
        # Scoped by the API key: nothing readable without it.
        with server.http() as http:
            assert http.get(f"/v1/responses/{kept.id}").status_code == 401
            assert http.get(f"/v1/responses/{kept.id}/input_items").status_code == 401
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
    finally:
        stop_server(server)
    restarted = start_server(*flags, api_key=key)
    try:
        client = restarted.client()
        assert client.responses.retrieve(kept.id).model_dump() == kept.model_dump()
        interrupted = client.responses.retrieve(running.id)
        assert interrupted.status == "failed", interrupted.status
        assert interrupted.error.message
        # The conversation goes on after the restart.
        follow = client.responses.create(model=MODEL_NAME, previous_response_id=kept.id, input="Still there?",
                                         max_output_tokens=4)
        assert follow.output
    finally:
        stop_server(restarted)


def postgres_url() -> str:
    """The shared store's server (`scripts/start-postgres.sh`, exported by scripts/test.sh)."""
    url = os.environ.get("TOKENMILL_TEST_POSTGRES", "")
    if not url:
        if os.environ.get("TOKENMILL_REQUIRE_ASSETS") == "1":
            pytest.fail("TOKENMILL_TEST_POSTGRES is not set (run scripts/start-postgres.sh)")
        pytest.skip("no PostgreSQL server (run scripts/start-postgres.sh, set TOKENMILL_TEST_POSTGRES)")
    return url


def test_replicas_share_a_postgres_store():
    flags = ("--responses-store", postgres_url())
    first, second = start_server(*flags), start_server(*flags)
    try:
        a, b = first.client(), second.client()
        turn = a.responses.create(model=MODEL_NAME, input="Name a French city.", max_output_tokens=8, **GREEDY)
        # The conversation goes on at the other replica, which reads the first turn's context.
        follow = b.responses.create(model=MODEL_NAME, previous_response_id=turn.id, input="And a German one?",
                                    max_output_tokens=8, **GREEDY)
        assert follow.previous_response_id == turn.id
        assert follow.usage.input_tokens > turn.usage.input_tokens + turn.usage.output_tokens
        assert b.responses.retrieve(turn.id).model_dump() == turn.model_dump()
        items = a.responses.input_items.list(follow.id)
        assert [item.type for item in items.data] == ["message"]
        # A background run of a replica that dies is failed by the one that lives (its periodic
        # sweep), not left in_progress; one that runs on a live replica is never touched.
        running = a.responses.create(background=True, **LONG_RUN)
        time.sleep(0.5)
        assert b.responses.retrieve(running.id).status in ("queued", "in_progress")
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait()
        deadline = time.monotonic() + 40
        while b.responses.retrieve(running.id).status != "failed" and time.monotonic() < deadline:
            time.sleep(0.5)
        interrupted = b.responses.retrieve(running.id)
        assert interrupted.status == "failed", interrupted.status
        assert "stopped before it finished" in interrupted.error.message
        b.responses.delete(follow.id)
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(follow.id)
    finally:
        stop_server(first)
        stop_server(second)


def test_the_agents_sdk_runs_an_agent_with_a_function_tool(rserver):
    agents = pytest.importorskip("agents")
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    called = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        called.append(city)
        return f"It is sunny in {city}."

    model = OpenAIResponsesModel(model=MODEL_NAME, openai_client=openai.AsyncOpenAI(
        base_url=rserver.api_url, api_key="unused", max_retries=0))
    agent = Agent(name="weather", instructions="Answer weather questions with the tool.", tools=[get_weather],
                  model=model, model_settings=agents.ModelSettings(tool_choice="required", temperature=0,
                                                                   max_tokens=48))
    # `required` on the first turn; the SDK resets tool_choice after a call (reset_tool_choice).
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4,
                             run_config=RunConfig(tracing_disabled=True))
    assert called, result
    assert isinstance(result.final_output, str) and result.final_output
