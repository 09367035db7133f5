"""LoRA serving over real HTTP with the official `openai` client: adapters given at start-up
(both `--lora-modules` forms) and loaded/unloaded at runtime are listed by `/v1/models` with
vLLM's `root`/`parent`, chosen by `model`, guarded by the API key, and counted by
`vllm:lora_requests_info` under load (never more than `--max-loras` running).
"""

from __future__ import annotations

import json
import random
import struct
import threading
import time
from pathlib import Path

import openai
import pytest

from conftest import MODEL_NAME, start_server, stop_server

API_KEY = "lora-test-key"
# SmolLM2-135M: hidden 576, 9 heads and 3 KV heads of 64, 30 layers.
HIDDEN, KV_DIM, LAYERS = 576, 192, 30
PROMPT = "The capital of France is"


def write_adapter(path: Path, rank: int, targets: dict[str, tuple[int, int]], seed: int) -> Path:
    """A PEFT directory with random f32 weights (uniform ±0.25) for `targets` (name → in, out)."""
    rng = random.Random(seed)
    header, chunks, offset = {}, [], 0
    for layer in range(LAYERS):
        for target, (n_in, n_out) in targets.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            for suffix, shape in ((".lora_A.weight", [rank, n_in]), (".lora_B.weight", [n_out, rank])):
                count = shape[0] * shape[1]
                data = struct.pack(f"<{count}f", *(rng.uniform(-0.25, 0.25) for _ in range(count)))
                header[prefix + suffix] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
                chunks.append(data)
                offset += len(data)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(targets), "bias": "none"}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "sql": write_adapter(root / "sql", 8, {"q_proj": (HIDDEN, HIDDEN), "v_proj": (HIDDEN, KV_DIM)}, 1),
        "poet": write_adapter(root / "poet", 4, {"v_proj": (HIDDEN, KV_DIM), "o_proj": (HIDDEN, HIDDEN)}, 2),
        "extra": write_adapter(root / "extra", 8, {"k_proj": (HIDDEN, KV_DIM), "v_proj": (HIDDEN, KV_DIM)}, 3),
    }


@pytest.fixture(scope="module")
def lora_server(adapters):
    poet = json.dumps({"name": "poet", "path": str(adapters["poet"]), "base_model_name": "my-base"})
    server = start_server(
        "--enable-lora",
        "--lora-modules", f"sql={adapters['sql']}", poet,
        "--max-loras", "2",
        "--max-lora-rank", "8",
        "--allow-runtime-lora-updating",
        "--api-key", API_KEY,
        api_key=API_KEY,
    )
    yield server
    stop_server(server)


def complete(client: openai.OpenAI, model: str, max_tokens: int = 8) -> str:
    response = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0)
    assert response.model == model
    return response.choices[0].text


def test_adapters_are_listed_with_root_and_parent(lora_server, adapters):
    cards = {card.id: card for card in lora_server.client().models.list().data}
    assert MODEL_NAME in cards
    assert cards["sql"].model_extra["parent"] == MODEL_NAME
    assert cards["sql"].model_extra["root"] == str(adapters["sql"])
    assert cards["poet"].model_extra["parent"] == "my-base"


def test_the_model_field_picks_the_adapter(lora_server):
    client = lora_server.client()
    base, sql, poet = (complete(client, name) for name in (MODEL_NAME, "sql", "poet"))
    assert sql != base and poet != base and sql != poet
    assert complete(client, "sql") == sql, "greedy output of an adapter is reproducible"
    chat = client.chat.completions.create(model="poet", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert chat.model == "poet"
    with pytest.raises(openai.NotFoundError):
        complete(client, "no-such-adapter")
    assert "lora=sql" in lora_server.log(), "the access log names the adapter"


def test_runtime_load_and_unload(lora_server, adapters):
    body = {"lora_name": "extra", "lora_path": str(adapters["extra"])}
    with lora_server.http() as http:
        assert http.post("/v1/load_lora_adapter", json=body).status_code == 401
        auth = {"Authorization": f"Bearer {API_KEY}"}
        response = http.post("/v1/load_lora_adapter", json=body, headers=auth)
        assert response.status_code == 200, response.text
        again = http.post("/v1/load_lora_adapter", json=body, headers=auth)
        assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
        client = lora_server.client()
        assert "extra" in {card.id for card in client.models.list().data}
        complete(client, "extra")
        response = http.post("/v1/unload_lora_adapter", json={"lora_name": "extra"}, headers=auth)
        assert response.status_code == 200, response.text
        with pytest.raises(openai.NotFoundError):
            complete(client, "extra")
        missing = http.post("/v1/unload_lora_adapter", json={"lora_name": "extra"}, headers=auth)
        assert missing.status_code == 404
        bad = http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nowhere"}, headers=auth)
        assert bad.status_code == 400


def latest_lora_info(server) -> dict[str, str] | None:
    """Labels of the `vllm:lora_requests_info` series with the newest timestamp."""
    with server.http() as http:
        text = http.get("/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    best, labels = -1.0, None
    for line in text.splitlines():
        if line.startswith("vllm:lora_requests_info{"):
            inside, _, value = line.rpartition(" ")
            pairs = inside[len("vllm:lora_requests_info{"):-1]
            parsed = dict(part.split("=", 1) for part in pairs.split('",') if part)
            parsed = {k: v.strip('"') for k, v in parsed.items()}
            if float(value) > best:
                best, labels = float(value), parsed
    return labels


def test_the_gauge_follows_running_and_waiting_adapters(lora_server, adapters):
    client = lora_server.client(timeout=300.0)
    body = {"lora_name": "extra", "lora_path": str(adapters["extra"])}
    with lora_server.http() as http:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        assert http.post("/v1/load_lora_adapter", json=body, headers=auth).status_code == 200
    names = ["sql", "poet", "extra"]
    threads = [threading.Thread(target=complete, args=(client, name, 96)) for name in names for _ in range(2)]
    for thread in threads:
        thread.start()
    seen_waiting = False
    while any(thread.is_alive() for thread in threads):
        labels = latest_lora_info(lora_server)
        if labels:
            assert labels["max_lora"] == "2"
            running = [name for name in labels["running_lora_adapters"].split(",") if name]
            waiting = [name for name in labels["waiting_lora_adapters"].split(",") if name]
            assert len(running) <= 2, labels
            assert set(running) <= set(names) and set(waiting) <= set(names), labels
            seen_waiting |= bool(waiting)
        time.sleep(0.05)
    for thread in threads:
        thread.join()
    assert seen_waiting, "a third adapter never waited behind --max-loras 2"
    time.sleep(0.3)
    final = latest_lora_info(lora_server)
    assert final is not None and final["running_lora_adapters"] == "" and final["waiting_lora_adapters"] == ""
