"""An engine reply over the server's cap (`--max-reply-bytes`) reaches the harness as a 502 naming
the cap, in the dialect it spoke, like every other bad engine reply; replies under it go through."""

from __future__ import annotations

import httpx
import pytest

from tests.support.local_server import server_with_upstream

LIMIT = 1_000_000
CHAT = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
ANTHROPIC = {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
GOOGLE = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with server_with_upstream(tmp_path_factory.mktemp("reply-cap") / "data", max_reply_bytes=LIMIT) as (
        up,
        srv,
    ):
        opened = httpx.post(
            f"{srv.url}/admin/sessions",
            json={},
            timeout=60,
            headers={"Authorization": f"Bearer {srv.admin_key}"},
        )
        assert opened.status_code == 200, opened.text
        key = opened.json()["api_key"]
        yield up, srv, {"Authorization": f"Bearer {key}", "x-api-key": key}


def test_a_reply_over_the_cap_is_a_502_naming_it_in_every_dialect(served):
    up, server, key = served
    up.fault, up.long_chars = "long", 2 * LIMIT
    try:
        chat = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=key, timeout=60)
        messages = httpx.post(f"{server.url}/v1/messages", json=ANTHROPIC, headers=key, timeout=60)
        google = httpx.post(
            f"{server.url}/v1beta/models/m:generateContent", json=GOOGLE, headers=key, timeout=60
        )
    finally:
        up.fault = None
    for reply in (chat, messages, google):
        assert reply.status_code == 502, reply.text
        message = reply.json()["error"]["message"]
        assert f"larger than {LIMIT} bytes" in message and "--max-reply-bytes" in message
    assert messages.json()["type"] == "error"
    assert chat.headers["x-should-retry"] == "true"


def test_a_reply_under_the_cap_goes_through(served):
    up, server, key = served
    up.fault, up.long_chars = "long", LIMIT // 2
    try:
        chat = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=key, timeout=60)
    finally:
        up.fault = None
    assert chat.status_code == 200, chat.text
    assert len(chat.json()["choices"][0]["message"]["content"]) == LIMIT // 2
