"""Token-in capture end to end on the embedded engine: a sampled conversation through the proxy
stays one token chain, the harness gets the engine's reply text, and the row's logprobs are what
one forward pass over the exported ids gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.local_server import local_server_on
from tests.support.vllm_recordings import vllm_fixture

pytestmark = pytest.mark.slow

N_CTX = 8192
OBSERVATIONS = ["Output of `ls`:\nfoo.txt\nbar.py", "Output of `cat foo.txt`:\nhello world"]


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    """The embedded engine at SmolLM2's trained context (re-scoring uses the same RoPE)."""
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    from tapdeck.runner.engine.embedded import EmbeddedEngine

    with EmbeddedEngine(n_ctx=N_CTX) as eng:
        yield eng


def _conversation(url: str, admin: str, token_in: bool) -> tuple[str, list[dict[str, Any]]]:
    """Three sampled calls, each resending the reply verbatim plus an observation."""
    info = httpx.post(
        f"{url}/admin/sessions",
        json={"rollout_type": "train", "token_in": token_in},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=120,
    ).json()
    messages = list(vllm_fixture("chat_multiturn_1")["request"]["messages"])
    replies = []
    for k in range(3):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=300,
            headers={"Authorization": f"Bearer {info['api_key']}"},
            json={"model": "smollm2", "messages": messages, "temperature": 1.0, "seed": 4, "max_tokens": 24},
        )
        assert r.status_code == 200, r.text
        replies.append(r.json())
        if k < 2:
            messages += [
                {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                {"role": "user", "content": OBSERVATIONS[k]},
            ]
    return info["id"], replies


def test_token_id_prompt_gives_the_reply_the_chat_route_gives(engine):
    """The same prompt ids and seed on both routes: same text, ids and logprobs, so a harness
    cannot tell a token-in call from a text one."""
    from tapdeck.proxy.upstream.client import parse_capture
    from tapdeck.proxy.upstream.token_in import completion_as_chat

    sampling = {
        "model": "smollm2",
        "temperature": 1.0,
        "seed": 11,
        "max_tokens": 24,
        "return_token_ids": True,
    }
    chat = httpx.post(
        f"{engine.base_url}/chat/completions",
        timeout=300,
        json={
            **sampling,
            "messages": vllm_fixture("chat_multiturn_1")["request"]["messages"],
            "logprobs": True,
            "top_logprobs": 0,
        },
    ).json()
    legacy = httpx.post(
        f"{engine.base_url}/completions",
        timeout=300,
        json={**sampling, "prompt": chat["prompt_token_ids"], "logprobs": 0},
    ).json()
    again = completion_as_chat(legacy, top_k=0)
    assert again["choices"][0]["message"]["content"] == chat["choices"][0]["message"]["content"]
    a, b = parse_capture(chat), parse_capture(again)
    assert a.prompt_ids.tolist() == b.prompt_ids.tolist()
    assert a.sampled_ids.tolist() == b.sampled_ids.tolist()
    assert np.allclose(a.logprobs, b.logprobs, atol=1e-6)


def test_embedded_engine_answers_the_reasoning_marker_probe_as_vllm_does(engine):
    """SmolLM2 has no reasoning markers: the embedded engine's `/tokenize` gives the probe the
    ids and token texts recorded vLLM gave, so both are read as not-reasoning."""
    from tapdeck.proxy.upstream.reasoning import probe_body, read_markers

    rec = vllm_fixture("tokenize_reasoning_markers")
    mine = httpx.post(f"{engine.url}/tokenize", json=probe_body(engine.served_name), timeout=60).json()
    assert (mine["tokens"], mine["token_strs"]) == (rec["response"]["tokens"], rec["response"]["token_strs"])
    markers = read_markers(mine)
    assert markers.known and not markers.found


def test_token_in_conversation_is_one_chain_with_engine_logprobs(engine, tmp_path: Path):
    from tapdeck.runner.engine.rescore import rescore

    with local_server_on(engine, tmp_path / "data") as server:
        headers = {"Authorization": f"Bearer {server.admin_key}"}
        sid, replies = _conversation(server.url, server.admin_key, token_in=True)
        doc = httpx.get(f"{server.url}/admin/sessions/{sid}/rollout", headers=headers, timeout=120).json()
        trace = httpx.get(f"{server.url}/admin/sessions/{sid}/trace", headers=headers, timeout=120).json()

    modes = [t["meta"].get("capture_mode", {}) for t in doc["turns"]]
    assert [m.get("mode") for m in modes] == ["text", "ids", "ids"]
    assert modes[0]["reason"] == "not_held"
    assert [t["link_kind"] for t in doc["turns"]] == ["root", "prefix", "prefix"]
    assert (doc["stats"]["breaks"], doc["stats"]["fragmentation"]) == (0, 1.0)
    for turn, reply in zip(doc["turns"], replies, strict=True):
        assert turn["response"]["content"] == reply["choices"][0]["message"]["content"]
    assert [row["metadata"]["capture_mode"] for row in trace["turns"]] == ["text", "ids", "ids"]

    # Each row's logprobs are the engine's on exactly the row's ids: replaying the row the way the
    # engine decodes (context in a batch, each sampled token alone) gives them back.
    for row in trace["turns"]:
        ids = row["prompt_token_ids"] + row["completion_token_ids"]
        again = rescore(ids, len(row["prompt_token_ids"]), mode="decode", engine_n_ctx=N_CTX)
        assert np.abs(again - np.asarray(row["per_token_logps"])).max() < 1e-4

    # The last row holds the whole conversation: one forward pass over it, as a trainer does,
    # scores every call's sampled tokens; batched and single-token kernels round differently.
    last = trace["turns"][-1]
    ids = last["prompt_token_ids"] + last["completion_token_ids"]
    captured = [
        (len(row["prompt_token_ids"]) + i, lp)
        for row in trace["turns"]
        for i, lp in enumerate(row["per_token_logps"])
    ]
    assert all(ids[: len(r["prompt_token_ids"])] == r["prompt_token_ids"] for r in trace["turns"])
    one_pass = rescore(ids, 1, temperature=1.0, engine_n_ctx=N_CTX)
    gaps = np.array([abs(one_pass[pos - 1] - lp) for pos, lp in captured])
    assert gaps.mean() < 0.2, gaps
