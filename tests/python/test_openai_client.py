"""The OpenAI API surface through the official `openai` client, against one shared server."""

from __future__ import annotations

import math

import openai
import pytest

from conftest import MODEL_NAME

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Write one sentence about the sea."}]


def test_models_list(client):
    models = client.models.list()
    ids = [model.id for model in models.data]
    assert ids == [MODEL_NAME]
    card = models.data[0]
    assert card.object == "model"
    max_model_len = card.model_extra["max_model_len"]
    assert isinstance(max_model_len, int) and max_model_len > 0


def test_completion(client):
    response = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=0)
    assert response.object == "text_completion"
    assert response.model == MODEL_NAME
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert choice.text
    assert response.usage.completion_tokens == 8
    assert response.usage.prompt_tokens > 0
    assert response.usage.total_tokens == response.usage.prompt_tokens + 8
    assert response.usage.prompt_tokens_details.cached_tokens is not None


def test_completion_prompt_forms(client):
    tokens = client.completions.create(model=MODEL_NAME, prompt=[PROMPT, "Once upon a time"], max_tokens=3, temperature=0)
    assert [c.index for c in tokens.choices] == [0, 1]
    ids = client.completions.create(model=MODEL_NAME, prompt=[[504, 3575, 282]], max_tokens=3, temperature=0)
    assert ids.usage.prompt_tokens == 3


def test_chat(client):
    response = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=12, temperature=0)
    assert response.object == "chat.completion"
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert 0 < response.usage.completion_tokens <= 12


def test_chat_content_parts_and_max_completion_tokens(client):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Say hi."}, {"type": "text", "text": "Now."}]},
    ]
    response = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_completion_tokens=5, temperature=0, user="someone"
    )
    assert 0 < response.usage.completion_tokens <= 5


def test_streaming_chat_with_usage(client):
    whole = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=16, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=CHAT,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(chunk.usage is None for chunk in chunks[:-1])
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks[:-1])
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks[:-1] if c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]


def test_streaming_completion_with_usage(client):
    whole = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=10, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL_NAME,
            prompt=PROMPT,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 10
    text = "".join(chunk.choices[0].text for chunk in chunks[:-1])
    assert text == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == "length"


def test_n_choices(client):
    response = client.chat.completions.create(
        model=MODEL_NAME, messages=CHAT, max_tokens=8, temperature=1.0, n=3, seed=11
    )
    assert sorted(choice.index for choice in response.choices) == [0, 1, 2]
    assert all(choice.message.content is not None for choice in response.choices)
    completion = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0.8, n=2, extra_body={"ignore_eos": True}
    )
    assert sorted(choice.index for choice in completion.choices) == [0, 1]
    assert completion.usage.completion_tokens == 12
    streamed = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=4, temperature=0.8, n=2, stream=True
    )
    finished = {c.choices[0].index for c in streamed if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_chat_logprobs(client):
    response = client.chat.completions.create(
        model=MODEL_NAME, messages=CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0.0
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert math.isclose(entry.top_logprobs[0].logprob, entry.logprob, abs_tol=1e-4)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
        assert entry.bytes is not None
    assert "".join(entry.token for entry in content) == response.choices[0].message.content


def test_completion_logprobs(client):
    response = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == 5
    assert all(isinstance(value, float) and value <= 0.0 for value in logprobs.token_logprobs)
    assert all(len(top) >= 2 for top in logprobs.top_logprobs)
    assert "".join(logprobs.tokens) == response.choices[0].text
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    assert logprobs.text_offset[0] == 0


def test_echo_logprobs_as_lm_eval_scores(client):
    """lm-eval's loglikelihood request: echo the prompt with its logprobs, one new token."""
    context, continuation = "The capital of France is", " Paris"
    response = client.completions.create(
        model=MODEL_NAME, prompt=context + continuation, max_tokens=1, echo=True, logprobs=1, temperature=0
    )
    choice = response.choices[0]
    assert choice.text.startswith(context + continuation)
    logprobs = choice.logprobs
    prompt_tokens = response.usage.prompt_tokens
    assert len(logprobs.tokens) == prompt_tokens + 1
    assert logprobs.token_logprobs[0] is None
    assert all(isinstance(value, float) and value <= 0.0 for value in logprobs.token_logprobs[1:])
    assert logprobs.top_logprobs[0] is None
    assert all(isinstance(top, dict) and top for top in logprobs.top_logprobs[1:])
    assert "".join(logprobs.tokens[:prompt_tokens]) == context + continuation
    assert logprobs.text_offset[0] == 0
    # The continuation's tokens are scored: a likely continuation is not vanishingly unlikely.
    assert sum(logprobs.token_logprobs[-2:-1]) > -20.0


def test_echo(client):
    response = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4, echo=True, temperature=0)
    plain = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4, temperature=0)
    assert response.choices[0].text == PROMPT + plain.choices[0].text


def test_stop_string_across_token_boundary(client):
    prompt = "List the days of the week:"
    first = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40, temperature=0, logprobs=0)
    text = first.choices[0].text
    tokens = first.choices[0].logprobs.tokens
    assert "".join(tokens) == text
    # A stop string made of the end of one token and the start of the next, first seen there.
    stop = None
    offset = 0
    for left, right in zip(tokens, tokens[1:]):
        offset += len(left)
        if len(left) >= 2 and len(right) >= 2 and left.isascii() and right.isascii():
            candidate = left[-2:] + right[:2]
            if text.find(candidate) == offset - 2:
                stop = candidate
                break
    assert stop is not None, f"no two-token stop string found in {tokens!r}"
    expected = text[: text.find(stop)]
    second = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=40, temperature=0, stop=[stop])
    choice = second.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == expected
    assert choice.model_extra.get("stop_reason") == stop
    # The same through streaming: the held-back partial match is never emitted.
    streamed = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=40, temperature=0, stop=[stop], stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    # And with include_stop_str_in_output the stop string is kept.
    kept = client.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=40,
        temperature=0,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == expected + stop


def test_seed_is_reproducible(client):
    def sample(seed: int) -> str:
        response = client.completions.create(
            model=MODEL_NAME, prompt="Once upon a time", max_tokens=24, temperature=1.0, seed=seed
        )
        return response.choices[0].text

    assert sample(1234) == sample(1234)
    assert len({sample(seed) for seed in (1, 2, 3)}) > 1, "different seeds give different samples"
    chat = [
        client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=16, temperature=1.0, seed=99)
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert chat[0] == chat[1]


def test_vllm_extra_parameters_are_accepted(client):
    extra = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "ignore_eos": True, "min_tokens": 4}
    response = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0.7, extra_body=extra
    )
    assert response.usage.completion_tokens == 6
    chat = client.chat.completions.create(
        model=MODEL_NAME,
        messages=CHAT,
        max_tokens=6,
        temperature=0.7,
        extra_body={**extra, "priority": 0, "request_id": "py-test-1", "return_token_ids": True},
    )
    assert chat.usage.completion_tokens == 6
    assert chat.id == "chatcmpl-py-test-1"
    assert len(chat.choices[0].model_extra["token_ids"]) == 6
    # min_tokens holds back EOS even when greedy wants to stop.
    short = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Reply with just: ok"}],
        max_tokens=20,
        temperature=0,
        extra_body={"min_tokens": 8},
    )
    assert short.usage.completion_tokens >= 8


def test_tokenize_detokenize_round_trip(server):
    text = "Hello, tokenmill! Ünïcödé and emoji 🚀 survive."
    with server.http() as http:
        tokenized = http.post("/tokenize", json={"model": MODEL_NAME, "prompt": text, "add_special_tokens": False})
        assert tokenized.status_code == 200, tokenized.text
        body = tokenized.json()
        assert body["count"] == len(body["tokens"]) > 0
        assert body["max_model_len"] > 0
        detokenized = http.post("/detokenize", json={"model": MODEL_NAME, "tokens": body["tokens"]})
        assert detokenized.status_code == 200, detokenized.text
        assert detokenized.json()["prompt"] == text
        chat = http.post("/tokenize", json={"messages": CHAT, "return_token_strs": True})
        assert chat.status_code == 200, chat.text
        assert len(chat.json()["token_strs"]) == chat.json()["count"]


def test_errors_map_to_openai_exceptions(client):
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=1)
    assert not_found.value.status_code == 404
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=1, temperature=-1)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_NAME, messages=[], max_tokens=1)
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=10**6)
    assert too_long.value.body["param"] == "max_tokens"
