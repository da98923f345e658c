"""The real `openai` SDK, through the proxy, to the embedded engine: what the SDK parsed and what
the proxy captured must agree, and every turn is durable before its reply arrives."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from tapdeck.proxy.store.database import Store

pytestmark = pytest.mark.slow

SYSTEM = "You are a concise assistant that helps with shell tasks."
OBSERVATIONS = ["Output of `ls`:\nfoo.txt\nbar.py", "Output of `cat foo.txt`:\nhello world"]


def _open(admin: httpx.Client, **spec) -> dict:
    resp = admin.post("/admin/sessions", json=spec)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_openai_sdk_three_turn_conversation_captured_as_one_root(embedded_engine, make_server, admin_for):
    server = make_server(embedded_engine.base_url)
    admin = admin_for(server)
    info = _open(admin, metadata={"task": "demo"})
    assert info["tier"] == "tokens" and info["rollout_type"] == "train"
    client = openai.OpenAI(base_url=info["base_urls"]["openai"], api_key=info["api_key"], max_retries=0)

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List the files."}]
    contents = []
    for i in range(3):
        resp = client.chat.completions.create(
            model="my-harness-model", messages=messages, max_tokens=12, temperature=0
        )
        assert resp.model == "my-harness-model"
        text = resp.choices[0].message.content
        assert isinstance(text, str)
        assert resp.usage.prompt_tokens > 0 and resp.usage.completion_tokens > 0
        contents.append(text)
        messages.append({"role": "assistant", "content": text})
        if i < 2:
            messages.append({"role": "user", "content": OBSERVATIONS[i]})

    summary = admin.get(f"/admin/sessions/{info['id']}").json()
    assert summary["turns"] == 3
    assert summary["roots"] == 1
    assert summary["trainable_tokens"] > 0
    prompt_lens = []
    for seq in range(3):
        turn = admin.get(f"/admin/sessions/{info['id']}/turns/{seq}").json()
        assert turn["parent"] == (None if seq == 0 else seq - 1)
        assert turn["sampled_ids"], f"turn {seq} has no sampled ids"
        assert len(turn["logprobs"]) == len(turn["sampled_ids"])
        assert all(math.isfinite(lp) and lp <= 0 for lp in turn["logprobs"])
        assert turn["response"]["content"] == contents[seq]
        assert turn["meta"]["client_model"] == "my-harness-model"
        prompt_lens.append(turn["prompt_len"])
    assert prompt_lens[0] < prompt_lens[1] < prompt_lens[2]

    trace = admin.get(f"/admin/sessions/{info['id']}/trace").json()
    assert len(trace["turns"]) == 3
    assert all(t["prompt_token_ids"] and t["completion_token_ids"] for t in trace["turns"])


def test_openai_sdk_stream_matches_capture_and_turn_is_durable_first(
    embedded_engine, make_server, admin_for, tmp_path
):
    server = make_server(embedded_engine.base_url)
    admin = admin_for(server)
    info = _open(admin, alternatives=5)
    client = openai.OpenAI(base_url=info["base_urls"]["openai"], api_key=info["api_key"], max_retries=0)
    stream = client.chat.completions.create(
        model="m",
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
        top_logprobs=2,
    )
    text, logprobs, alternatives, finish, usage = "", [], set(), None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                logprobs.extend(e.logprob for e in choice.logprobs.content)
                alternatives.update(len(e.top_logprobs) for e in choice.logprobs.content)
            finish = choice.finish_reason or finish
    # Read the store from a separate connection right away: the turn was committed before the reply.
    _record, turns = Store(server.config.capture_db).load_session(info["id"])
    assert len(turns) == 1
    turn = turns[0]
    assert turn.response["content"] == text
    assert finish == turn.finish_reason
    assert usage is not None and usage.completion_tokens == len(turn.sampled_ids)
    assert logprobs == pytest.approx(turn.logprobs.tolist())
    assert turn.prompt_ids is not None and len(turn.prompt_ids) > 0
    # The client gets the 2 alternatives it asked for; the session captures the 5 it asked for.
    assert alternatives == {2}
    assert {len(alts) for alts in turn.top_logprobs} == {5}


def test_session_header_and_alternative_key_headers_are_recorded(embedded_engine, make_server, admin_for):
    server = make_server(embedded_engine.base_url)
    admin = admin_for(server)
    info = _open(admin)
    resp = httpx.post(
        f"{server.url}/V1/Chat/Completions",
        timeout=120,
        headers={"x-api-key": info["api_key"], "x-session-id": "opencode-ses-42"},
        json={"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert resp.status_code == 200, resp.text
    turn = admin.get(f"/admin/sessions/{info['id']}/turns/0").json()
    assert turn["meta"]["header_session_id"] == "opencode-ses-42"
    assert turn["meta"]["dialect"] == "chat"
