"""The pooling server over real HTTP with the clients retrieval pipelines use: the official
`openai` client's `embeddings.create` (base64 by default, and floats) and LangChain's
`OpenAIEmbeddings`, on all-MiniLM-L6-v2 (scripts/fetch-minilm.sh; skipped when absent),
compared with sentence-transformers' vectors stored in the repo's fixture; and the default
model, a decoder, served as an embedder (`--runner pooling --convert embed`, last-token
pooled and normalized, as vLLM serves Qwen3-Embedding)."""

from __future__ import annotations

import base64
import json
import math
import os
import struct

import openai
import pytest

from conftest import MODEL_NAME, REPO, model_path, start_server, stop_server

FIXTURE = REPO / "crates/models/tests/fixtures/minilm_embeddings.json"


def minilm_path() -> str:
    return os.environ.get("TOKENMILL_MINILM_MODEL") or os.path.expanduser(
        "~/.cache/tokenmill/models/all-MiniLM-L6-v2"
    )


@pytest.fixture(scope="module")
def embed_server():
    path = minilm_path()
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        message = f"all-MiniLM-L6-v2 not found at {path} (scripts/fetch-minilm.sh)"
        # scripts/test.sh fetches it and sets this: then a missing model is a failure.
        if os.environ.get("TOKENMILL_REQUIRE_ASSETS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    server = start_server("--runner", "pooling", model=path)
    yield server
    stop_server(server)


def reference() -> dict[str, list[float]]:
    data = json.loads(FIXTURE.read_text())
    vectors = {}
    for item in data["items"]:
        raw = base64.b64decode(item["embedding_f16"])
        vectors[item["text"]] = list(struct.unpack(f"<{len(raw) // 2}e", raw))
    return vectors


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_openai_client_embeddings_match_sentence_transformers(embed_server):
    client = embed_server.client()
    texts = ["Hello world.", "Paris is the capital of France.", "東京は日本の首都です。"]
    expected = reference()
    for encoding_format in (openai.NOT_GIVEN, "float"):
        response = client.embeddings.create(
            model=MODEL_NAME, input=texts, encoding_format=encoding_format
        )
        assert response.model == MODEL_NAME
        assert [d.index for d in response.data] == [0, 1, 2]
        assert response.usage.prompt_tokens == response.usage.total_tokens > 0
        for text, item in zip(texts, response.data):
            assert len(item.embedding) == 384
            assert abs(math.sqrt(sum(x * x for x in item.embedding)) - 1.0) < 1e-5
            assert cosine(item.embedding, expected[text]) >= 0.9999


def test_openai_client_errors(embed_server):
    client = embed_server.client()
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.embeddings.create(model=MODEL_NAME, input="")
    with pytest.raises(openai.BadRequestError, match="matryoshka"):
        client.embeddings.create(model=MODEL_NAME, input="hi", dimensions=64)
    with pytest.raises(openai.BadRequestError, match="pooling"):
        client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}]
        )
    # The server is still up.
    assert client.embeddings.create(model=MODEL_NAME, input="still here").data


def test_langchain_openai_embeddings(embed_server):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model=MODEL_NAME,
        base_url=embed_server.api_url,
        api_key="unused",
        check_embedding_ctx_length=False,
    )
    documents = embeddings.embed_documents(["Paris is the capital of France.", "I like apples."])
    query = embeddings.embed_query("What is the capital of France?")
    assert len(documents) == 2 and len(query) == 384
    assert cosine(query, documents[0]) > cosine(query, documents[1])
    expected = reference()
    assert cosine(documents[0], expected["Paris is the capital of France."]) >= 0.9999


@pytest.fixture(scope="module")
def decoder_embed_server():
    server = start_server(
        "--runner", "pooling", "--convert", "embed", "--pooler-config",
        '{"pooling_type": "LAST", "normalize": true}',
    )
    yield server
    stop_server(server)


def test_openai_client_embeds_with_a_decoder(decoder_embed_server):
    client = decoder_embed_server.client()
    texts = ["The capital of France is Paris.", "hi", "東京は日本の首都です。"]
    batched = client.embeddings.create(model=MODEL_NAME, input=texts, encoding_format="float")
    assert [item.index for item in batched.data] == [0, 1, 2]
    for item in batched.data:
        assert len(item.embedding) == 576  # SmolLM2-135M's hidden size
        assert abs(math.sqrt(sum(x * x for x in item.embedding)) - 1.0) < 1e-5
    assert batched.usage.prompt_tokens > len(texts)
    # Batch invariance: each text alone gets the vector it got in the batch.
    for text, item in zip(texts, batched.data):
        alone = client.embeddings.create(model=MODEL_NAME, input=text, encoding_format="float")
        assert alone.data[0].embedding == item.embedding
    # base64 (the client's default) carries the same vectors.
    encoded = client.embeddings.create(model=MODEL_NAME, input=texts)
    for item, want in zip(encoded.data, batched.data):
        assert max(abs(a - b) for a, b in zip(item.embedding, want.embedding)) < 1e-6
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=MODEL_NAME, input="hi", dimensions=100000)
    assert "dimensions" in str(error.value)
