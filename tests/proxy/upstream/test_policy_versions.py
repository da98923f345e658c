"""Every turn carries the policy version that sampled it (docs/capture.md, "Policy versions").

Through a real capture server in front of the fake vLLM, shaped as each engine reports versions:
vLLM's dev-mode `GET /weight_info` (`{"weight_version": <str or null>}`, read before and after each
call; vllm/entrypoints/serve/dev/rlhf/api_router.py), SGLang's `metadata.weight_version` in each
OpenAI reply (sglang/srt/entrypoints/openai/serving_chat.py), and an engine saying nothing, whose
turns take the version a trainer posts to `POST /admin/engines/version`. A call in flight while the
version changes is held by the fake on an event, so the update lands mid-call without a sleep.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tapdeck.proxy.upstream.tiers import EngineSpec
from tests.support.capture_server import CaptureServer, capture_server
from tests.support.fake_vllm import NO_ROUTE, FakeVllm
from tests.support.vllm_recordings import vllm_fixture


@pytest.fixture
def engine() -> Iterator[FakeVllm]:
    with FakeVllm() as up:
        yield up


@pytest.fixture
def capture(engine: FakeVllm, tmp_path: Path) -> Iterator[CaptureServer]:
    with capture_server(EngineSpec(url=engine.base_url), tmp_path, keepalive_s=0.5) as server:
        yield server


def _session(capture: CaptureServer) -> tuple[str, str]:
    info = capture.open_session(rollout_type="train")
    return info["id"], info["api_key"]


def _call(capture: CaptureServer, key: str) -> None:
    body = {**vllm_fixture("chat_basic")["request"], "stream": False}
    reply = httpx.post(
        f"{capture.url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text


def _weight_info_reads(engine: FakeVllm) -> int:
    return sum(1 for s in engine.sent if s.method == "GET" and s.path == "/weight_info")


def _post(capture: CaptureServer, body: Any) -> httpx.Response:
    return capture.admin.post("/admin/engines/version", json=body)


def test_turns_take_the_version_the_trainer_posted_and_the_rollout_its_span(engine, capture):
    sid, key = _session(capture)
    _call(capture, key)  # nothing posted yet: unknown, not 0
    assert _post(capture, {"version": 0}).status_code == 200
    _call(capture, key)
    listing = _post(capture, {"version": 1, "engine": engine.base_url}).json()
    assert [(e["engine"], e["version"], e["source"]) for e in listing["engines"]] == [
        (None, 0, "trainer"),
        (engine.url, 1, "trainer"),
    ]
    _call(capture, key)

    turns = [capture.turn(sid, seq) for seq in range(3)]
    assert [t["policy_version"] for t in turns] == [None, 0, 1]
    assert [t["policy_source"] for t in turns] == [None, "trainer", "trainer"]
    assert all("policy_version_straddled" not in t or t["policy_version_straddled"] is None for t in turns)
    assert capture.summary(sid)["policy"] == {"oldest": 0, "newest": 1, "straddled": 0}
    graph = capture.admin.get(f"/admin/sessions/{sid}/graph").json()
    assert [t["policy_version"] for t in graph["turns"]] == [None, 0, 1]
    trace = capture.admin.get(f"/admin/sessions/{sid}/trace").json()
    assert [t["metadata"]["policy_version"] for t in trace["turns"]] == [None, 0, 1]
    doc = capture.admin.get(f"/admin/sessions/{sid}/rollout").json()
    assert doc["policy"] == {"oldest": 0, "newest": 1, "straddled": 0}
    # The engine has no weight-info route: probed once, then never read again.
    assert _weight_info_reads(engine) == 1


def test_a_version_posted_while_a_call_is_in_flight_stamps_it_as_straddling(engine, capture):
    sid, key = _session(capture)
    _post(capture, {"version": 4})
    engine.gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(_call, capture, key)
        try:
            assert engine.arrived.wait(30)
            _post(capture, {"version": 5, "engine": engine.base_url + "/"})
        finally:
            engine.gate.set()
        call.result(timeout=60)

    turn = capture.turn(sid, 0)
    assert turn["policy_version"] is None  # never silently one of the two
    assert turn["policy_version_straddled"] == [4, 5]
    straddle = [f for f in turn["findings"] if f["code"] == "policy_version_straddled"]
    assert len(straddle) == 1 and straddle[0]["level"] == "WARN"
    assert "version 4 when it was sent, 5 when it was answered" in straddle[0]["detail"]
    assert capture.summary(sid)["policy"] == {"oldest": 4, "newest": 5, "straddled": 1}
    entry = capture.admin.get(f"/admin/sessions/{sid}/trace").json()["turns"][0]
    assert entry["metadata"]["policy_version"] is None
    assert entry["metadata"]["policy_version_straddled"] == [4, 5]


def test_a_call_resent_after_the_engine_refused_it_during_an_update_has_the_new_version(engine, capture):
    """Refused with vLLM's 503 while the weights change, then resent: the reply came from the new
    weights alone, so the turn is theirs, not a straddle of the version it was first sent under."""
    import time

    sid, key = _session(capture)
    _post(capture, {"version": 4})
    chat_sent = len([s for s in engine.sent if s.path.endswith("/chat/completions")])
    engine.scaling = True
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(_call, capture, key)
        deadline = time.monotonic() + 30
        # Refused as the model call itself (the prompt's /tokenize before it is refused too).
        while len([s for s in engine.sent if s.path.endswith("/chat/completions")]) == chat_sent:
            assert time.monotonic() < deadline and not call.done(), "the call never reached the engine"
            time.sleep(0.02)
        _post(capture, {"version": 5})
        engine.scaling = False
        call.result(timeout=60)

    turn = capture.turn(sid, 0)
    assert (turn["policy_version"], turn.get("policy_version_straddled")) == (5, None)
    assert "policy_version_straddled" not in {f["code"] for f in turn["findings"]}


def test_vllm_weight_info_is_read_before_and_after_each_call_and_wins_over_the_trainer(engine, capture):
    engine.weight_info = "7"
    sid, key = _session(capture)
    _post(capture, {"version": 99})
    _call(capture, key)
    engine.gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(_call, capture, key)
        try:
            assert engine.arrived.wait(30)
            engine.weight_info = "8"  # the trainer's update_weight_version, mid-call
        finally:
            engine.gate.set()
        call.result(timeout=60)

    first, second = capture.turn(sid, 0), capture.turn(sid, 1)
    assert (first["policy_version"], first["policy_source"]) == (7, "weight_info")
    assert second["policy_version"] is None and second["policy_version_straddled"] == [7, 8]
    assert _weight_info_reads(engine) == 1 + 2 * 2  # the probe, then before and after each call
    versions = capture.admin.get("/admin/engines/version").json()["engines"]
    assert {(e["engine"], e["version"], e["source"]) for e in versions} == {
        (None, 99, "trainer"),
        (engine.url, 8, "weight_info"),
    }


def test_a_null_weight_version_leaves_the_turn_to_the_trainers_version(engine, capture):
    engine.weight_info = None  # vLLM before any update_weight_version
    sid, key = _session(capture)
    _post(capture, {"version": "step-3"})
    _call(capture, key)
    turn = capture.turn(sid, 0)
    assert (turn["policy_version"], turn["policy_source"]) == ("step-3", "trainer")


def test_sglang_replies_carry_their_version_and_no_route_is_read_after_the_first(engine, capture):
    engine.reply_weight_version = "12"
    engine.weight_info = NO_ROUTE
    sid, key = _session(capture)
    for _ in range(3):
        _call(capture, key)
    turns = [capture.turn(sid, seq) for seq in range(3)]
    assert [(t["policy_version"], t["policy_source"]) for t in turns] == [(12, "reply")] * 3
    assert _weight_info_reads(engine) == 1


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"version": -1}, "`version` must be"),
        ({"version": True}, "`version` must be"),
        ({"version": 1.5}, "`version` must be"),
        ({"version": ""}, "`version` must be"),
        ({}, "`version` must be"),
        ({"version": 1, "engine": "localhost:8000"}, "`engine` must be an http(s) URL"),
        ({"version": 1, "model": "x"}, "unknown field(s) model"),
        ([1], "must be a JSON object"),
    ],
)
def test_a_bad_version_post_is_a_400_saying_what_is_wrong(capture, body, says):
    reply = _post(capture, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()
    assert error["kind"] == "invalid_request_error" and error["retryable"] is False
    assert says in error["detail"]


def test_posting_a_version_needs_the_admin_key(capture):
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        reply = httpx.post(f"{capture.url}/admin/engines/version", json={"version": 1}, headers=headers)
        assert reply.status_code == 401
    assert capture.admin.get("/admin/engines/version").json() == {"engines": []}
