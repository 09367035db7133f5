"""schemathesis (pinned in scripts/test-python.sh) against the live server's /openapi.json.

It generates requests from the document's schemas — valid ones and, in its negative mode,
ones that break a schema constraint — sends them to a running tokenmill and checks every
response: no 5xx, only documented status codes and content types, response bodies that
match their schemas, and requests that break a documented constraint rejected with a 4xx
(so the document's constraints are ones the server enforces). It does not run
`positive_data_acceptance`: some rules the server enforces cannot be written in JSON Schema
(n > 1 needs temperature > 0, min_tokens ≤ max_tokens, a prompt that must fit the context,
stream_options only with stream, ...), so a schema-valid request may still get a 400.

The server runs with a small context (--max-model-len 48) and --max-n 2: the document
carries these limits, so generated generation requests stay short and the run bounded.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from conftest import start_server, stop_server

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
    ]
)
MAX_EXAMPLES = 25
RUN_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def fuzz_server():
    server = start_server("--max-model-len", "48", "--max-n", "2", "--max-num-seqs", "16")
    yield server
    stop_server(server)


def run_schemathesis(server, report_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{server.base_url}/openapi.json",
        "--checks",
        CHECKS,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        "20",
        # One worker: with two, hypothesis parses lambda sources on two threads at once and
        # CPython 3.11's ast module (whose recursion-depth check is not thread-safe, gh-106905)
        # raises "AST constructor recursion depth mismatch" inside schemathesis.
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--suppress-health-check",
        "too_slow,data_too_large,filter_too_much",
        "--report",
        "junit",
        "--report-dir",
        str(report_dir),
        *extra,
    ]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_HOOKS": ""},
        cwd=report_dir,
    )


def test_schemathesis_finds_no_failures(fuzz_server, tmp_path):
    result = run_schemathesis(fuzz_server, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-12000:]
    # Its report lists every operation it tested, each without failures or errors; the
    # generation routes are among them.
    reports = list(tmp_path.glob("junit*.xml"))
    assert len(reports) == 1, output[-4000:]
    suite = ElementTree.parse(reports[0]).getroot()
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    for operation in (
        "POST /v1/completions",
        "POST /v1/chat/completions",
        "POST /tokenize",
        "POST /detokenize",
        "GET /v1/models",
    ):
        assert operation in cases, sorted(cases)
    for name, case in cases.items():
        assert case.find("failure") is None and case.find("error") is None, name
    match = re.search(r"(\d+) generated, (\d+) passed", output)
    assert match and int(match.group(1)) == int(match.group(2)) > 1000, output[-2000:]
    assert fuzz_server.process.poll() is None, "the server died under the fuzzer"
