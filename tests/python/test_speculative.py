"""Speculative decoding over real HTTP with the official `openai` client: servers started with
`--speculative-config` (`ngram`, and `draft_model` with the default model as its own draft)
give greedy completions and chat replies identical to the shared server without speculation,
alone, concurrently and streamed, and `/metrics` shows drafts proposed and accepted under
vLLM's `vllm:spec_decode_*` names.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from conftest import MODEL_NAME, model_path, start_server, stop_server

# Input-grounded prompts: the greedy continuation copies spans of the prompt, so prompt lookup
# finds drafts and the target accepts many of them.
PROMPTS = [
    "one two three four five six seven eight nine ten, one two three four five six seven eight nine ten, one two",
    "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return a + b\n\n\ndef add(",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,",
]
CHAT = [
    {
        "role": "user",
        "content": "Repeat this sentence exactly: The library opens at nine and closes at five on weekdays.",
    }
]
MAX_TOKENS = 32


def speculative_configs() -> dict[str, str]:
    return {
        "ngram": json.dumps(
            {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
        ),
        "draft_model": json.dumps({"method": "draft_model", "model": model_path(), "num_speculative_tokens": 3}),
    }


@pytest.fixture(scope="module", params=["ngram", "draft_model"])
def spec_server(request):
    server = start_server("--speculative-config", speculative_configs()[request.param])
    server.method = request.param
    yield server
    stop_server(server)


def complete(client: openai.OpenAI, prompt: str, **kwargs):
    return client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, **kwargs)


def chat(client: openai.OpenAI, **kwargs):
    return client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0, **kwargs)


def test_greedy_completions_and_logprobs_match_plain_decoding(spec_server, client):
    spec_client = spec_server.client()
    for prompt in PROMPTS:
        plain = complete(client, prompt, logprobs=2)
        speculative = complete(spec_client, prompt, logprobs=2)
        assert speculative.choices[0].text == plain.choices[0].text, prompt
        assert speculative.choices[0].finish_reason == plain.choices[0].finish_reason
        assert speculative.usage.completion_tokens == plain.usage.completion_tokens
        assert speculative.choices[0].logprobs.tokens == plain.choices[0].logprobs.tokens
        assert speculative.choices[0].logprobs.token_logprobs == plain.choices[0].logprobs.token_logprobs


def test_concurrent_greedy_completions_match_plain_decoding(spec_server, client):
    """Requests decoding together (the draft model drafts for them in shared passes)."""
    spec_client = spec_server.client()
    expected = [complete(client, prompt).choices[0].text for prompt in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda prompt: complete(spec_client, prompt).choices[0].text, PROMPTS))
    assert got == expected


def test_greedy_chat_matches_plain_decoding(spec_server, client):
    plain = chat(client)
    speculative = chat(spec_server.client())
    assert speculative.choices[0].message.content == plain.choices[0].message.content
    assert speculative.choices[0].finish_reason == plain.choices[0].finish_reason
    assert speculative.usage.completion_tokens == plain.usage.completion_tokens


def test_streaming_matches_plain_decoding(spec_server, client):
    spec_client = spec_server.client()
    plain = complete(client, PROMPTS[0])
    chunks = list(complete(spec_client, PROMPTS[0], stream=True, stream_options={"include_usage": True}))
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert text == plain.choices[0].text
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    # Several tokens accepted in one step still reach the client as deltas.
    assert sum(1 for chunk in chunks if chunk.choices and chunk.choices[0].text) > 1

    expected_chat = chat(client).choices[0].message.content
    stream = chat(spec_client, stream=True)
    content = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert content == expected_chat


def test_metrics_show_drafts_and_acceptance(spec_server):
    names = [
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    ]
    before = spec_server.metrics()
    response = complete(spec_server.client(), PROMPTS[0])
    after = spec_server.metrics()
    drafts, draft_tokens, accepted, per_position = (after.get(name, 0.0) - before.get(name, 0.0) for name in names)
    assert drafts > 0
    assert 0 < accepted <= draft_tokens
    assert per_position == accepted
    # The counting prompt runs to `max_tokens`: no stop token leaves drafts after it unverified.
    assert response.choices[0].finish_reason == "length"
    if spec_server.method == "draft_model":
        # The target as its own draft: every drafted token is the target's greedy token.
        assert accepted == draft_tokens
