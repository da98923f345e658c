"""Self-replay on the real embedded engine through `POST /admin/sessions/{id}/replay`: a
conversation captured through the proxy from the embedded engine, scored again by that same engine,
drifts by about nothing (the capture-fidelity check the issue asks for), in one request for its one
chain; the replies validate against the routes' models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tapdeck.runner.recipes.logprob_mismatch import MAX, MEAN, OUTSIDE
from tapdeck.runner.replay.drift import K3_KL
from tapdeck.schema.replay import ReplayList, ReplayResult
from tests.support.local_server import local_server_on
from tests.support.vllm_recordings import vllm_fixture

pytestmark = pytest.mark.slow

OBSERVATIONS = ["Output of `ls`:\nfoo.txt\nbar.py", "Output of `cat foo.txt`:\nhello world"]


def _conversation(url: str, admin: dict[str, str]) -> str:
    """Three sampled calls at temperature 1 (the engine's logprobs are then the raw ones, as
    prompt logprobs are), each resending the reply plus an observation; token-in keeps one chain."""
    info = httpx.post(
        f"{url}/admin/sessions", json={"rollout_type": "train", "token_in": True}, headers=admin, timeout=120
    ).json()
    messages = list(vllm_fixture("chat_multiturn_1")["request"]["messages"])
    for k in range(3):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=300,
            headers={"Authorization": f"Bearer {info['api_key']}"},
            json={"model": "smollm2", "messages": messages, "temperature": 1.0, "seed": 5, "max_tokens": 24},
        )
        assert r.status_code == 200, r.text
        if k < 2:
            messages += [
                {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                {"role": "user", "content": OBSERVATIONS[k]},
            ]
    return str(info["id"])


def test_replaying_a_capture_on_the_engine_that_sampled_it_drifts_by_about_nothing(
    embedded_engine: Any, tmp_path: Path
) -> None:
    with local_server_on(embedded_engine, tmp_path / "data") as server:
        admin = {"Authorization": f"Bearer {server.admin_key}"}
        sid = _conversation(server.url, admin)
        reply = httpx.post(
            f"{server.url}/admin/sessions/{sid}/replay",
            json={"engine": embedded_engine.url},
            headers=admin,
            timeout=600,
        )
        assert reply.status_code == 200, reply.text
        result = ReplayResult.model_validate(reply.json())
        assert result.requests == 1 and not result.chunked
        assert [t.scored for t in result.turns] == [True, True, True]
        figures = result.session
        assert figures is not None and figures.tokens == 72
        # Measured: mean 0.002, max 0.01 nats (the engine decodes one token at a time, prompt
        # logprobs come from one batched pass: llama.cpp's float rounding differs between the two).
        assert figures.metrics[MEAN] < 0.01 and figures.metrics[MAX] < 0.05
        assert figures.metrics[OUTSIDE] == 0.0 and 0.0 <= figures.metrics[K3_KL] < 1e-3

        listed = httpx.get(f"{server.url}/admin/sessions/{sid}/replays", headers=admin, timeout=60)
        assert [r.id for r in ReplayList.model_validate(listed.json()).replays] == [result.id]
        trace = httpx.get(f"{server.url}/admin/sessions/{sid}/trace", headers=admin, timeout=60).json()
        assert {e["metadata"]["reference"] for e in trace["turns"]} == {f"smollm2@{embedded_engine.base_url}"}

        refused = httpx.post(
            f"{server.url}/admin/sessions/{sid}/replay",
            json={"engine": "embedded"},
            headers=admin,
            timeout=60,
        )
        assert refused.status_code == 400 and "runs no embedded engine" in refused.text

        gone = httpx.delete(
            f"{server.url}/admin/sessions/{sid}/replays/{result.id}", headers=admin, timeout=60
        )
        assert ReplayList.model_validate(gone.json()).replays == []
        trace = httpx.get(f"{server.url}/admin/sessions/{sid}/trace", headers=admin, timeout=60).json()
        assert all("reference" not in e["metadata"] for e in trace["turns"])
