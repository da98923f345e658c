"""What one session samples never changes what another sends: the tool-argument memo is per
session. And an `/admin/events` client that leaves ends its stream without an error."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tapdeck.proxy.http.server import _event_stream
from tests.support.fake_vllm import FakeVllm
from tests.support.vllm_recordings import vllm_fixture as recorded

SAMPLED = {"A": '{"cmd": "ls"}', "B": '{"cmd":"ls"}'}
"""The same object, sampled as two different strings by two GRPO siblings."""


@pytest.fixture
def tool_engine() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A vLLM-shaped upstream that answers a Bash tool call, sampled per session as SAMPLED says
    (the session is named by the first user message)."""
    basic = recorded("chat_basic")["response"]

    def answer(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        who = body["messages"][0]["content"]
        who = who if isinstance(who, str) else who[0]["text"]
        reply = copy.deepcopy(basic)
        message = reply["choices"][0]["message"]
        message["content"] = None
        message["tool_calls"] = [
            {"id": f"call_{who}", "type": "function", "function": {"name": "Bash", "arguments": SAMPLED[who]}}
        ]
        reply["choices"][0]["finish_reason"] = "tool_calls"
        return 200, reply

    with FakeVllm(answer=answer) as engine:
        yield engine.base_url, engine.requests


def test_tool_arguments_sampled_in_one_session_never_render_another(
    tool_engine: tuple[str, list[dict[str, Any]]], make_server: Any, admin_for: Any
) -> None:
    url, seen = tool_engine
    server = make_server(url)
    admin = admin_for(server)
    keys = {who: admin.post("/admin/sessions", json={}).json()["api_key"] for who in SAMPLED}
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]

    def call(who: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        resp = httpx.post(
            f"{server.url}/v1/messages",
            timeout=60,
            headers={"x-api-key": keys[who]},
            json={"model": "m", "max_tokens": 16, "tools": tools, "messages": messages},
        )
        assert resp.status_code == 200, resp.text
        return resp.json()

    first = {who: call(who, [{"role": "user", "content": who}]) for who in SAMPLED}
    for who in SAMPLED:
        [use] = [b for b in first[who]["content"] if b["type"] == "tool_use"]
        assert use["input"] == {"cmd": "ls"}
        call(
            who,
            [
                {"role": "user", "content": who},
                {"role": "assistant", "content": [use]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "ok"}],
                },
            ],
        )
        history = seen[-1]["messages"][1]["tool_calls"][0]["function"]["arguments"]
        assert history == SAMPLED[who]
    assert json.loads(SAMPLED["A"]) == json.loads(SAMPLED["B"])


async def test_an_events_client_that_leaves_ends_the_stream_cleanly(upstream: Any, tmp_path: Any) -> None:
    from tapdeck.proxy.service import CaptureService
    from tapdeck.proxy.store.database import Store
    from tapdeck.proxy.upstream.tiers import EngineSpec

    with Store(tmp_path / "capture.db") as store:
        service = CaptureService(
            store, default_engine=EngineSpec(url=upstream.base_url), public_url="http://t"
        )
        stream = _event_stream(service)
        assert await anext(stream) == b": connected\n\n"
        waiting = asyncio.ensure_future(anext(stream))
        while service.events.subscriber_count == 0:
            await asyncio.sleep(0.001)
        # What the HTTP server does when the client hangs up: cancel the task iterating.
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await stream.aclose()
        assert service.events.subscriber_count == 0
        await service.aclose()
