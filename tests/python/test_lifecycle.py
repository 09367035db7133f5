"""Server behaviour over real connections: client disconnects, the SIGTERM drain, TLS and
the API key."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import ssl
import subprocess
import time

import httpx
import openai
import pytest

from conftest import MODEL_NAME, start_server, stop_server

IDLE_WAIT_S = 20.0


def wait_until_idle(server) -> dict[str, float]:
    """Polls /metrics until nothing runs or waits and the KV cache is empty."""
    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        metrics = server.metrics()
        idle = (
            metrics.get("vllm:num_requests_running") == 0
            and metrics.get("vllm:num_requests_waiting") == 0
            and metrics.get("vllm:kv_cache_usage_perc") == 0
        )
        if idle:
            return metrics
        if time.monotonic() > deadline:
            raise AssertionError(f"engine did not go idle: { {k: v for k, v in metrics.items() if 'num_requests' in k or 'kv_cache' in k} }")
        time.sleep(0.1)


def test_disconnected_streams_free_the_engine(server):
    """20 streaming clients hang up mid-stream; their requests are aborted and blocks freed."""

    async def stream_then_drop(http: httpx.AsyncClient, index: int, started: asyncio.Event, counter: list) -> int:
        body = {
            "model": MODEL_NAME,
            "prompt": f"Story number {index}: once upon a time",
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
        }
        chunks = 0
        async with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks += 1
                    if chunks == 2:
                        counter[0] += 1
                        if counter[0] == 20:
                            started.set()
                        # Stay connected until every client is mid-stream, then hang up.
                        await started.wait()
                        break
        return chunks

    async def main() -> list[int]:
        started = asyncio.Event()
        counter = [0]
        limits = httpx.Limits(max_connections=40)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120.0, limits=limits) as http:
            return await asyncio.gather(*(stream_then_drop(http, i, started, counter) for i in range(20)))

    chunk_counts = asyncio.run(main())
    assert chunk_counts == [2] * 20
    metrics = wait_until_idle(server)
    assert metrics["vllm:num_requests_running"] == 0
    assert metrics["vllm:kv_cache_usage_perc"] == 0
    # The aborts are counted as such, and the server still serves.
    assert aborted_count(server) >= 20
    with server.http() as http:
        assert http.get("/health").status_code == 200
        response = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert response.status_code == 200, response.text


def aborted_count(server) -> float:
    with server.http() as http:
        scrape = http.get("/metrics").text
    return sum(
        float(line.rpartition(" ")[2])
        for line in scrape.splitlines()
        if line.startswith("vllm:request_success_total{") and 'finished_reason="abort"' in line
    )


def test_disconnected_non_streaming_requests_free_the_engine(server):
    """A client that gives up on a long non-streaming request aborts it too."""
    before = aborted_count(server)
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 8000, "ignore_eos": True}
    for _ in range(3):
        with server.http(timeout=httpx.Timeout(120.0, read=1.0)) as http:
            with pytest.raises(httpx.ReadTimeout):
                http.post("/v1/completions", json=body)
    wait_until_idle(server)
    deadline = time.monotonic() + IDLE_WAIT_S
    while aborted_count(server) < before + 3:
        assert time.monotonic() < deadline, "the abandoned requests were not aborted"
        time.sleep(0.1)


def test_sigterm_drains_in_flight_streams():
    server = start_server("--shutdown-timeout", "60")
    try:
        _check_drain(server)
    finally:
        stop_server(server)


def _check_drain(server) -> None:
    async def stream(http: httpx.AsyncClient, index: int, first_chunk: asyncio.Event) -> tuple[str | None, int]:
        body = {
            "model": MODEL_NAME,
            "prompt": f"Request {index}: the weather today",
            "max_tokens": 64,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        finish_reason, completion_tokens, done = None, 0, False
        async with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                first_chunk.set()
                for choice in chunk["choices"]:
                    finish_reason = choice.get("finish_reason") or finish_reason
                if chunk.get("usage"):
                    completion_tokens = chunk["usage"]["completion_tokens"]
        assert done, "stream ended without [DONE]"
        return finish_reason, completion_tokens

    async def main() -> tuple[list, int | None]:
        events = [asyncio.Event() for _ in range(8)]
        limits = httpx.Limits(max_connections=20)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120.0, limits=limits) as http:
            tasks = [asyncio.create_task(stream(http, i, events[i])) for i in range(8)]
            await asyncio.gather(*(event.wait() for event in events))
            server.process.send_signal(signal.SIGTERM)
            # A request after the signal: 503 while draining (or refused once it is over).
            late_status = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as late:
                        health = await late.get("/health")
                        if health.status_code == 503:
                            response = await late.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
                            late_status = response.status_code
                            assert response.json()["error"]["code"] == 503
                            break
                except httpx.TransportError:
                    late_status = "refused"
                    break
                await asyncio.sleep(0.02)
            results = await asyncio.gather(*tasks)
            return results, late_status

    results, late_status = asyncio.run(main())
    assert results == [("length", 64)] * 8
    if late_status == "refused":
        # Only acceptable once the drain is over, i.e. the server has already exited.
        assert server.process.wait(timeout=30) == 0
    else:
        assert late_status == 503
    assert server.process.wait(timeout=60) == 0, server.log()[-4000:]
    assert "draining 8 in-flight requests" in server.log()


def test_shutdown_timeout_aborts_what_is_left():
    """A stream that outlives --shutdown-timeout is aborted: it ends with finish_reason
    "abort" and [DONE], and the server still exits 0."""
    server = start_server("--shutdown-timeout", "1")
    try:
        body = {"model": MODEL_NAME, "prompt": "Once", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        chunks, finish_reasons, done = 0, [], False
        with server.http() as http, http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunks += 1
                    finish_reasons += [c["finish_reason"] for c in json.loads(line[6:])["choices"] if c["finish_reason"]]
                    if chunks == 1:
                        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0, server.log()[-4000:]
        assert done and finish_reasons == ["abort"], (done, finish_reasons)
        assert 0 < chunks < 4000
        assert "1 engine requests still running at shutdown; aborting them" in server.log()
    finally:
        stop_server(server)


def _make_certificates(directory) -> tuple[str, str, str]:
    """A throwaway CA and a localhost certificate it signed, with the openssl CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the TLS test needs the openssl CLI to make a self-signed certificate")
    ca_key, ca_cert = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.pem"
    extensions = directory / "server.ext"
    extensions.write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
    )
    run = lambda *args: subprocess.run([openssl, *args], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(ca_key), "-out", str(ca_cert), "-days", "1", "-subj", "/CN=tokenmill test CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "1", "-extfile", str(extensions))
    return str(ca_cert), str(cert), str(key)


def test_tls(tmp_path):
    ca_cert, cert, key = _make_certificates(tmp_path)
    context = ssl.create_default_context(cafile=ca_cert)
    server = start_server("--ssl-keyfile", key, "--ssl-certfile", cert, verify=context)
    try:
        assert server.base_url.startswith("https://")
        client = server.client(http_client=openai.DefaultHttpx2Client(verify=context))
        response = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=3)
        assert response.usage.completion_tokens == 3
        with server.http() as http:
            assert http.get("/health").status_code == 200
        # Without the CA the certificate is not trusted; plain HTTP is not spoken.
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.base_url + "/health", verify=ssl.create_default_context())
        with pytest.raises(httpx.TransportError):
            httpx.get(server.base_url.replace("https://", "http://") + "/health", timeout=10)
    finally:
        stop_server(server)


def test_api_key_and_access_log():
    server = start_server(
        "--api-key",
        "tm-secret",
        "--disable-access-log-for-endpoints",
        "/health,/metrics",
        "--enable-log-requests",
        "--max-log-len",
        "4",
        api_key="tm-secret",
    )
    try:
        wrong = server.client(api_key="not-the-key")
        with pytest.raises(openai.AuthenticationError) as denied:
            wrong.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=2)
        assert denied.value.status_code == 401
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = server.client()
        assert right.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=2).usage.completion_tokens == 2
        assert [m.id for m in right.models.list().data] == [MODEL_NAME]
        with server.http() as http:
            assert http.get("/health").status_code == 200
            assert http.get("/metrics").status_code == 200
            missing = http.post("/tokenize", json={"prompt": "hi"})
            assert missing.status_code == 401
            assert missing.json()["error"]["type"] == "authentication_error"
            keyed = http.post("/tokenize", json={"prompt": "hi"}, headers={"Authorization": "Bearer tm-secret"})
            assert keyed.status_code == 200
            logged = http.post(
                "/v1/completions",
                json={"prompt": "Hello logging", "max_tokens": 1},
                headers={"Authorization": "Bearer tm-secret", "X-Request-Id": "req-42"},
            )
            assert logged.status_code == 200
        log = server.log()
        # Access lines: method, path, status, latency and request id; quiet endpoints skipped.
        assert re.search(r"POST /v1/completions 401 [0-9.]+ms", log), log
        assert re.search(r"POST /v1/completions 200 [0-9.]+ms request_id=req-42", log), log
        assert "GET /health" not in log and "GET /metrics" not in log
        # Prompts are logged only truncated to --max-log-len, and the key never.
        assert '"Hell"' in log and "Hello logging" not in log
        assert "tm-secret" not in log
    finally:
        stop_server(server)
