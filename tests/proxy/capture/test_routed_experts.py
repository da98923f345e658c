"""MoE routing (`proxy/capture/routing.py`): read from recorded vLLM bodies given `routed_experts`
exactly as vLLM's protocol sends it (base64 `.npy` bytes of a (prompt + completion - 1, layers,
experts per token) integer array), stored per turn as an array, exported beside the logprobs, and
kept by a token-in call's `/v1/completions` reply."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tapdeck.proxy.capture.routing import read_routed_experts, routing_text
from tapdeck.proxy.config import ServerConfig
from tapdeck.proxy.store.database import Store
from tapdeck.proxy.upstream.client import parse_capture
from tapdeck.proxy.upstream.reply_check import check_reply
from tapdeck.proxy.upstream.token_in import completion_as_chat
from tests.support.fake_vllm import FakeVllm
from tests.support.local_server import running
from tests.support.vllm_recordings import vllm_fixture, vllm_reply_to

LAYERS, TOP_K = 3, 2


def vllm_routing(tokens: int, dtype: str = "uint16", seed: int = 0) -> tuple[np.ndarray, str]:
    """A routing array for `tokens` tokens and its wire text, as vLLM encodes it."""
    arr = np.random.default_rng(seed).integers(0, 60, size=(tokens - 1, LAYERS, TOP_K)).astype(dtype)
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return arr, base64.b64encode(buf.getvalue()).decode("ascii")


def chat_reply(routed: str | None) -> dict[str, Any]:
    reply = vllm_fixture("chat_basic")["response"]
    assert reply["choices"][0]["routed_experts"] is None  # as recorded: the flag was off
    reply["choices"][0]["routed_experts"] = routed
    return reply


def tokens_of(reply: dict[str, Any]) -> int:
    return len(reply["prompt_token_ids"]) + len(reply["choices"][0]["token_ids"])


def test_a_chat_replys_routing_is_read_as_the_array_vllm_encoded() -> None:
    n = tokens_of(chat_reply(None))
    assert n == 45  # the recorded 37 prompt ids and 8 sampled ones: the rows below say so
    for dtype in ("uint8", "uint16", "int32"):
        arr, text = vllm_routing(n, dtype)
        cap = parse_capture(chat_reply(text))
        assert cap.findings == []
        assert isinstance(cap.routed_experts, np.ndarray)
        assert cap.routed_experts.dtype == dtype and np.array_equal(cap.routed_experts, arr)
    assert parse_capture(chat_reply(None)).routed_experts is None


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ([[[1, 2]]], "a list, not base64 .npy text"),
        ("not base64!", "not base64 .npy text"),
        (base64.b64encode(b"plain bytes").decode(), "not base64 .npy text"),
        (vllm_routing(5)[1], "4 rows for 45 tokens"),
        (routing_text(np.zeros((44, 3), dtype=np.int32)), "shape (44, 3) of int32"),
        (routing_text(np.zeros((44, 3, 2), dtype=np.float32)), "of float32"),
    ],
)
def test_routing_that_is_not_vllms_is_left_out_with_a_warning(raw: Any, why: str) -> None:
    checked = check_reply(chat_reply(raw), "http://engine/v1")
    [finding] = [f for f in checked.capture.findings if f.code == "bad_routed_experts"]
    assert finding.level == "WARN" and why in finding.detail
    assert checked.capture.routed_experts is None
    assert checked.capture.logprobs is not None  # the turn still trains
    assert "routed_experts" not in checked.reply["choices"][0]  # nor is it passed on


def test_rows_are_checked_only_against_ids_the_reply_has() -> None:
    arr, text = vllm_routing(5)
    routed, findings = read_routed_experts(text, None)
    assert findings == [] and routed is not None and np.array_equal(routed, arr)


def test_a_token_in_completions_reply_keeps_its_routing() -> None:
    reply = vllm_fixture("completions_ids")["response"]
    choice = reply["choices"][0]
    assert choice["routed_experts"] is None  # as recorded
    arr, choice["routed_experts"] = vllm_routing(len(choice["prompt_token_ids"]) + len(choice["token_ids"]))
    cap = parse_capture(completion_as_chat(reply, top_k=0))
    assert cap.findings == [] and cap.routed_experts is not None and np.array_equal(cap.routed_experts, arr)


def test_routing_is_stored_per_turn_as_an_array_and_exported_beside_the_logprobs(
    tmp_path: Path,
) -> None:
    base = chat_reply(None)
    arr, text = vllm_routing(tokens_of(base))

    def answer(body: dict[str, Any]) -> tuple[int, Any]:
        return 200, vllm_reply_to(body, chat_reply(text))

    data = tmp_path / "data"
    with FakeVllm(answer=answer) as engine:
        config = ServerConfig(host="127.0.0.1", port=0, data_dir=data, engine_url=engine.base_url)
        with running(config) as (server, admin):
            info = admin.post("/admin/sessions", json={"rollout_type": "train"}).json()
            assert info["tier"] == "tokens"
            reply = httpx.post(
                f"{server.url}/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {info['api_key']}"},
                timeout=60,
            )
            assert reply.status_code == 200, reply.text
            live = server.service._sessions[info["id"]].graph.nodes[0].turn.routed_experts
            assert isinstance(live, np.ndarray) and np.array_equal(live, arr)
            trace = admin.get(f"/admin/sessions/{info['id']}/trace").json()
            document = admin.get(f"/admin/sessions/{info['id']}/rollout").json()
    [turn] = trace["turns"]
    assert turn["metadata"]["routed_experts"] == text  # in vLLM's own encoding
    assert set(turn) == {  # OpenEnv's TrainingTurn forbids any other key
        "node_id",
        "prompt_token_ids",
        "completion_token_ids",
        "per_token_logps",
        "loss_mask",
        "request",
        "response",
        "metadata",
    }
    [sequence] = document["sequences"]
    assert sequence["routed_experts"] == text and len(sequence["input_ids"]) == arr.shape[0] + 1

    # Stored as the array itself (`.npy` bytes, dtype kept), read back by a read-only reader.
    store = Store(data / "capture.db", read_only=True)
    try:
        _, [stored] = store.load_session(info["id"])
    finally:
        store.close()
    assert stored.routed_experts is not None
    assert stored.routed_experts.dtype == np.uint16 and np.array_equal(stored.routed_experts, arr)


def test_a_store_an_older_tapdeck_wrote_reads_as_holding_no_routing(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "capture.db"
    Store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE routed_experts")
    store = Store(path, read_only=True)
    try:
        assert store._routing("s-1") == {}
    finally:
        store.close()
