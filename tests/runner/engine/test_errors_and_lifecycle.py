"""vLLM-shaped errors with vLLM's status codes, client disconnects, and the `tapdeck engine` CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.vllm_recordings import vllm_fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine_2k():
    """An engine with vLLM's recorded max_model_len (2048), so error texts compare verbatim."""
    from tapdeck.runner.engine.embedded import EmbeddedEngine

    with EmbeddedEngine(n_ctx=2048) as eng:
        yield eng


@pytest.mark.parametrize("case", [c["case"] for c in vllm_fixture("errors")["cases"]])
def test_error_bodies_equal_vllm(engine_2k, case):
    rec = next(c for c in vllm_fixture("errors")["cases"] if c["case"] == case)
    url = f"{engine_2k.url}{rec['endpoint']}"
    if "_raw_body" in rec["request"]:
        r = httpx.post(
            url,
            content=rec["request"]["_raw_body"],
            headers={"content-type": "application/json"},
            timeout=120,
        )
    else:
        r = httpx.post(url, json=rec["request"], timeout=120)
    assert r.status_code == rec["status"]
    if rec["status"] == 200:
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
        assert r.json()["prompt_token_ids"] is None
    else:
        assert r.headers["content-type"] == "application/json"
        assert r.json() == rec["body"]


def test_unknown_model_is_404_on_every_route(embedded_engine):
    for path, body in [
        ("/v1/completions", {"model": "nope", "prompt": "hi"}),
        ("/tokenize", {"model": "nope", "prompt": "hi"}),
    ]:
        r = httpx.post(f"{embedded_engine.url}{path}", json=body)
        assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"


def _wait_idle(engine, timeout: float = 60.0) -> None:
    """Block until no generation holds the engine (fails the test if one never ends)."""
    assert engine.core.lock.acquire(timeout=timeout), "generation kept running"
    engine.core.lock.release()


def test_stream_stops_generating_when_the_client_leaves(engine_2k):
    req = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Count to ten."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
        "temperature": 1.0,
    }
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", f"{engine_2k.base_url}/chat/completions", json=req) as r:
            lines = r.iter_lines()
            for _ in range(6):
                next(lines)
    _wait_idle(engine_2k)
    assert engine_2k.core.model.cached_tokens < 1000


def test_non_streaming_call_stops_when_the_client_leaves(engine_2k):
    req = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Count to ten."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "temperature": 1.0,
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{engine_2k.base_url}/chat/completions", json=req, timeout=1.0)
    _wait_idle(engine_2k)
    assert engine_2k.core.model.cached_tokens < 1000
    ok = httpx.post(
        f"{engine_2k.base_url}/chat/completions",
        timeout=120,
        json={"model": "smollm2", "messages": req["messages"], "max_tokens": 2},
    )
    assert ok.status_code == 200


def test_cli_engine_serves_until_interrupted():
    exe = Path(sys.executable).parent / "tapdeck"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from tapdeck.app.cli import main; main()"]
    proc = subprocess.Popen(
        [
            *cmd,
            "engine",
            "--port",
            "0",
            "--n-ctx",
            "1024",
            "--served-name",
            "tiny-test",
            "--return-tokens-as-token-ids",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # Ctrl-C as a terminal sends it: were SIGINT ignored in this test
        # process, the engine would inherit that and never see the interrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = proc.stdout.readline()
        assert "serving tiny-test" in line, line + proc.stderr.read()
        base = line.rsplit(" at ", 1)[1].strip()
        models = httpx.get(f"{base}/models", timeout=30).json()
        assert models["data"][0]["id"] == "tiny-test"
        assert models["data"][0]["max_model_len"] == 1024
        body = httpx.post(
            f"{base}/chat/completions",
            timeout=120,
            json={
                "model": "tiny-test",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
                "logprobs": True,
                "return_token_ids": True,
            },
        ).json()
        ids = body["choices"][0]["token_ids"]
        assert [e["token"] for e in body["choices"][0]["logprobs"]["content"]] == [
            f"token_id:{t}" for t in ids
        ]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
