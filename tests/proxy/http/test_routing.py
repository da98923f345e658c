"""Routing across dialects and engines, aux routes and annotations, on a real server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tapdeck.proxy.http.server import create_app
from tapdeck.proxy.service import CaptureService
from tapdeck.proxy.sessions.spec import SessionSpec
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.upstream.tiers import EngineSpec

CHAT = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def _open(admin: httpx.Client, **spec) -> dict:
    resp = admin.post("/admin/sessions", json=spec)
    assert resp.status_code == 200, resp.text
    return resp.json()


async def test_app_level_flow_over_asgi_transport(upstream, tmp_path: Path):
    """The FastAPI app without a socket: admin auth, a call, the turn detail, session close."""
    store = Store(tmp_path / "capture.db")
    service = CaptureService(
        store, default_engine=EngineSpec(url=upstream.base_url), public_url="http://testserver"
    )
    app = create_app(service, admin_key="k")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        assert (await client.get("/admin/sessions")).status_code == 401
        admin = {"Authorization": "Bearer k"}
        info = (await client.post("/admin/sessions", json={"metadata": {"k": 1}}, headers=admin)).json()
        assert info["base_urls"]["openai"] == "http://testserver/v1"
        resp = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {info['api_key']}"}
        )
        assert resp.status_code == 200
        assert resp.json()["model"] == "x" and "prompt_token_ids" not in resp.json()
        turn = (await client.get(f"/admin/sessions/{info['id']}/turns/0", headers=admin)).json()
        assert turn["prompt_len"] == 37 and len(turn["sampled_ids"]) == len(turn["logprobs"])
        assert turn["mask"] and set(turn["mask"]) == {1}
        assert (await client.get(f"/admin/sessions/{info['id']}/turns/5", headers=admin)).status_code == 404
        closed = (await client.delete(f"/admin/sessions/{info['id']}", headers=admin)).json()
        assert closed["state"] == "closed" and closed["turns"] == 1
        again = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {info['api_key']}"}
        )
        assert again.status_code == 401
    await service.aclose()
    store.close()


async def test_annotate_merges_metadata_and_publishes(upstream, tmp_path: Path):
    store = Store(tmp_path / "capture.db")
    service = CaptureService(store, default_engine=EngineSpec(url=upstream.base_url), public_url="http://t")
    info = await service.open_session(SessionSpec(metadata={"task": "a"}))
    events = service.events.subscribe()
    pending = asyncio.ensure_future(anext(events))
    while service.events.subscriber_count == 0:
        await asyncio.sleep(0.001)
    summary = service.annotate(info.id, phase="verify", reward=0.5)
    assert summary.metadata == {"task": "a", "phase": "verify", "reward": 0.5}
    event = await asyncio.wait_for(pending, 10)
    assert event["type"] == "session_updated" and event["session"]["metadata"]["reward"] == 0.5
    await service.writes.drain()  # annotate does not hold the loop for its fsync
    assert store.get_session(info.id)["metadata"]["reward"] == 0.5
    await events.aclose()
    await service.aclose()
    store.close()


@pytest.mark.medium
def test_two_sessions_on_two_engines_each_reach_their_own(upstream, embedded_engine, make_server, admin_for):
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    fake = _open(admin)
    real = _open(admin, engine={"url": embedded_engine.base_url, "model": "smollm2"})
    assert real["engine"]["url"] == embedded_engine.base_url
    before = len(upstream.requests)
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=CHAT,
        timeout=120,
        headers={"Authorization": f"Bearer {real['api_key']}"},
    )
    assert r.status_code == 200 and len(upstream.requests) == before
    r = httpx.post(
        f"{server.url}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {fake['api_key']}"}
    )
    assert r.json()["choices"][0]["message"]["content"] == "The capital of France is Paris."
    assert len(upstream.requests) == before + 1


@pytest.mark.medium
def test_count_tokens_is_answered_without_a_turn_and_needs_the_key(embedded_engine, make_server, admin_for):
    import anthropic

    server = make_server(embedded_engine.base_url)
    admin = admin_for(server)
    info = _open(admin)
    client = anthropic.Anthropic(
        base_url=info["base_urls"]["anthropic"], api_key=info["api_key"], max_retries=0
    )
    counted = client.messages.count_tokens(
        model="claude-x", messages=[{"role": "user", "content": "Hello there"}]
    )
    assert counted.input_tokens > 0
    bad = anthropic.Anthropic(
        base_url=info["base_urls"]["anthropic"], api_key="tdk-" + "B" * 43, max_retries=0
    )
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "Hi"}])
    google = httpx.post(
        f"{server.url}/v1beta/models/gemini:countTokens",
        params={"key": info["api_key"]},
        json={"contents": [{"role": "user", "parts": [{"text": "Hello there"}]}]},
    )
    assert google.status_code == 200 and google.json()["totalTokens"] > 0
    assert admin.get(f"/admin/sessions/{info['id']}").json()["turns"] == 0


def test_unknown_key_on_google_route_is_401_in_google_shape(upstream, make_server):
    server = make_server(upstream.base_url)
    resp = httpx.post(
        f"{server.url}/v1beta/models/m:generateContent",
        params={"key": "nope"},
        json={"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]},
    )
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == 401 and "status" in resp.json()["error"]
