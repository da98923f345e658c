"""A session holds each distinct message once: consecutive turns share the objects they resend."""

from __future__ import annotations

from pathlib import Path

import httpx

from tapdeck.proxy.capture import interning
from tapdeck.proxy.http.server import create_app
from tapdeck.proxy.service import CaptureService
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.upstream.tiers import EngineSpec

ADMIN = {"Authorization": "Bearer k"}


def _conversation(k: int) -> dict:
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    for i in range(k):
        msgs += [
            {"role": "assistant", "content": f"reply {i}"},
            {"role": "user", "content": [{"type": "text", "text": f"more {i}"}]},
        ]
    return {
        "model": "x",
        "messages": msgs,
        "max_tokens": 4,
        "tools": [{"type": "function", "function": {"name": "ls", "parameters": {}}}],
    }


async def _call(client: httpx.AsyncClient, key: str, k: int) -> None:
    resp = await client.post(
        "/v1/chat/completions", json=_conversation(k), headers={"Authorization": f"Bearer {key}"}
    )
    assert resp.status_code == 200, resp.text


def _requests(service: CaptureService, sid: str) -> list[dict]:
    graph = service._graph(service._sessions[sid])
    return [graph.nodes[s].turn.request for s in sorted(graph.nodes)]


async def test_consecutive_turns_share_the_message_objects_they_resend(upstream, tmp_path: Path):
    store = Store(tmp_path / "capture.db")
    service = CaptureService(
        store, default_engine=EngineSpec(url=upstream.base_url), public_url="http://testserver"
    )
    transport = httpx.ASGITransport(app=create_app(service, admin_key="k"))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        info = (await client.post("/admin/sessions", json={}, headers=ADMIN)).json()
        for k in range(3):
            await _call(client, info["api_key"], k)
        first, second, third = _requests(service, info["id"])
        assert third["messages"] == _conversation(2)["messages"]
        assert all(a is b for a, b in zip(first["messages"], second["messages"], strict=False))
        assert all(a is b for a, b in zip(second["messages"], third["messages"], strict=False))
        assert first["tools"][0] is third["tools"][0]
        # Equal content only: a new message is its own object.
        assert third["messages"][-1] is not second["messages"][-1]
    await service.aclose()
    store.close()


def test_interner_keys_only_the_messages_the_previous_call_did_not_send(monkeypatch):
    keyed = []
    real = interning.content_key
    monkeypatch.setattr(interning, "content_key", lambda obj: keyed.append(obj) or real(obj))
    interner = interning.Interner()
    for k in range(5):
        keyed.clear()
        out = interner.intern(_conversation(k))
        # the first call keys its 2 messages and 1 tool; later ones only their 2 new messages
        assert len(keyed) == (3 if k == 0 else 2)
        assert out.keys["messages"] == [real(m) for m in _conversation(k)["messages"]]
    retry = interner.intern(_conversation(2))
    assert retry.request["messages"][4] is out.request["messages"][4]


def test_interner_keeps_apart_messages_python_calls_equal():
    interner = interning.Interner()
    sent = [{"role": "user", "content": "x", "n": value} for value in (1, True, 1.0)]
    keys = [interner.intern({"messages": [m]}).keys["messages"][0] for m in sent]
    assert len(set(keys)) == 3
    assert [interner.objects[k]["n"] for k in keys] == [1, True, 1.0]
    assert [type(interner.objects[k]["n"]) for k in keys] == [int, bool, float]


def test_interner_reuses_a_previous_list_only_up_to_an_item_boundary():
    """`[{"n":1}` starts `[{"n":12}]` too: only a comma or the closing bracket after the previous
    list's JSON makes its items this call's leading ones."""
    interner = interning.Interner()
    interner.intern({"messages": [{"n": 1}]})
    grown = interner.intern({"messages": [{"n": 12}]})
    assert grown.keys["messages"] == [interning.content_key({"n": 12})]
    assert grown.request["messages"][0] == {"n": 12}
    same = interner.intern({"messages": [{"n": 12}, {"n": 3}]})
    assert same.request["messages"][0] is grown.request["messages"][0]
    assert same.keys["messages"] == [interning.content_key(m) for m in ({"n": 12}, {"n": 3})]
