"""Through the real app and a recorded-vLLM upstream: hosted tools become a WARN finding on the
stored turn, and Google's `:streamGenerateContent` without `alt=sse` is a streamed JSON array.

The upstream is a loopback server answering with the recorded vLLM 0.32 bodies (tests/fixtures/vllm:
`models` and `chat_basic`, whose text is "The capital of France is Paris."), after a short pause
so that the proxy's keepalives (every 20 ms here) land inside the streams.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tapdeck.proxy.upstream.tiers import EngineSpec
from tests.support.capture_server import CaptureServer, capture_server
from tests.support.fake_vllm import FakeVllm
from tests.support.findings import rendered
from tests.support.vllm_recordings import vllm_error

UPSTREAM_PAUSE_S = 0.15
HOSTED = "the engine cannot run hosted tools"
BODY = {
    "contents": [{"role": "user", "parts": [{"text": "What is the capital of France?"}]}],
    "generationConfig": {"maxOutputTokens": 8},
}


SCRIPT = FakeVllm(delay=UPSTREAM_PAUSE_S)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureServer]:
    with (
        SCRIPT,
        capture_server(
            EngineSpec(url=SCRIPT.base_url), tmp_path_factory.mktemp("capture"), keepalive_s=0.02
        ) as server,
    ):
        yield server


def _dropped(turn: dict[str, Any]) -> list[str]:
    return [f for f in rendered(turn["findings"]) if f.startswith("[WARN] dropped_tools:")]


@pytest.mark.parametrize(
    "path, body, names",
    [
        (
            "/v1/responses",
            {
                "model": "m",
                "input": "hi",
                "max_output_tokens": 8,
                "tools": [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["v"]}],
            },
            "web_search, file_search",
        ),
        (
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "web_search_20250305",
        ),
        (
            "/v1beta/models/g:generateContent",
            {**BODY, "tools": [{"googleSearch": {}}, {"codeExecution": {}}]},
            "googleSearch, codeExecution",
        ),
    ],
    ids=["responses", "anthropic", "google"],
)
def test_dropped_hosted_tools_are_a_warn_finding_on_the_stored_turn(
    app: CaptureServer, path: str, body: dict, names: str
) -> None:
    info = app.open_session()
    reply = httpx.post(
        f"{app.url}{path}",
        json=body,
        timeout=30,
        headers={
            "Authorization": f"Bearer {info['api_key']}",
            "x-api-key": info["api_key"],
            "x-goog-api-key": info["api_key"],
        },
    )
    assert reply.status_code == 200, reply.text
    assert _dropped(app.turn(info["id"], 0)) == [f"[WARN] dropped_tools: {names} ({HOSTED})"]


def test_a_turns_request_findings_name_that_turn(app: CaptureServer) -> None:
    # Said of the turn, not of the whole session: the session's findings list tells them apart.
    info = app.open_session()
    body = {**BODY, "tools": [{"googleSearch": {}}]}
    for _ in range(2):
        reply = httpx.post(
            f"{app.url}/v1beta/models/g:generateContent",
            json=body,
            timeout=30,
            headers={"x-goog-api-key": info["api_key"]},
        )
        assert reply.status_code == 200, reply.text
    for seq in (0, 1):
        dropped = [f for f in app.turn(info["id"], seq)["findings"] if f["code"] == "dropped_tools"]
        assert [f["turn"] for f in dropped] == [seq]


def test_no_dropped_tools_no_finding(app: CaptureServer) -> None:
    info = app.open_session()
    reply = httpx.post(
        f"{app.url}/v1beta/models/g:generateContent",
        json=BODY,
        timeout=30,
        headers={"x-goog-api-key": info["api_key"]},
    )
    assert reply.status_code == 200
    assert _dropped(app.turn(info["id"], 0)) == []


def _text(response: dict[str, Any]) -> str:
    return "".join(
        p.get("text", "")
        for c in response["candidates"]
        for p in c["content"]["parts"]
        if not p.get("thought")
    )


@pytest.mark.parametrize("method", ["streamGenerateContent", "STREAMGENERATECONTENT"])
def test_google_stream_without_alt_sse_is_a_json_array(app: CaptureServer, method: str) -> None:
    info = app.open_session()
    headers = {"x-goog-api-key": info["api_key"]}
    whole = httpx.post(f"{app.url}/v1beta/models/g:generateContent", json=BODY, headers=headers, timeout=30)
    with httpx.stream(
        "POST", f"{app.url}/v1beta/models/g:{method}", json=BODY, headers=headers, timeout=30
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("application/json")
        raw = b"".join(stream.iter_bytes())
    assert raw.startswith(b"[") and raw.endswith(b"]")
    # The upstream pause spans several keepalive intervals: whitespace, never an SSE comment.
    assert b"\n" in raw and b": keepalive" not in raw and b"data:" not in raw
    chunks = json.loads(raw)
    assert isinstance(chunks, list) and chunks
    assert "".join(_text(c) for c in chunks) == _text(whole.json()) == "The capital of France is Paris."
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP" and chunks[-1]["usageMetadata"]


def test_google_stream_with_alt_sse_stays_sse(app: CaptureServer) -> None:
    info = app.open_session()
    reply = httpx.post(
        f"{app.url}/v1beta/models/g:streamGenerateContent",
        params={"ALT": "SSE"},
        json=BODY,
        headers={"x-goog-api-key": info["api_key"]},
        timeout=30,
    )
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
    assert "".join(_text(e) for e in events) == "The capital of France is Paris."


def test_google_json_array_stream_error_is_an_error_element(app: CaptureServer) -> None:
    # The engine fails after the first keepalive is due, so the array has started (HTTP 200): the
    # error can only be its last element.
    info = app.open_session()
    SCRIPT.answer = lambda body: (500, vllm_error(500, "engine core died", "InternalServerError"))
    try:
        reply = httpx.post(
            f"{app.url}/v1beta/models/g:streamGenerateContent",
            json=BODY,
            headers={"x-goog-api-key": info["api_key"]},
            timeout=30,
        )
    finally:
        SCRIPT.answer = "chat_basic"
    assert reply.status_code == 200
    body = json.loads(reply.content)
    assert isinstance(body, list) and body[-1]["error"]["code"] >= 500 and body[-1]["error"]["status"]


def test_anthropic_mcp_servers_are_dropped_as_hosted_tools_with_a_finding(app: CaptureServer) -> None:
    # Anthropic's MCP connector calls these servers' tools itself; the engine never sees them.
    info = app.open_session()
    client = anthropic.Anthropic(
        api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
    )
    message = client.beta.messages.create(
        model="claude-x",
        max_tokens=8,
        messages=[{"role": "user", "content": "hi"}],
        mcp_servers=[{"type": "url", "url": "https://mcp.example/sse", "name": "git"}],
        betas=["mcp-client-2025-04-04"],
    )
    assert message.content[0].text == "The capital of France is Paris."
    assert _dropped(app.turn(info["id"], 0)) == [f"[WARN] dropped_tools: mcp_servers[git] ({HOSTED})"]
