"""Replay on the real embedded engine through `POST /admin/sessions/{id}/replay`: a conversation
captured through the proxy from the embedded engine (the F16 file), scored again by that same
engine, drifts by about nothing (a capture-fidelity check), in one request for its one chain; scored
by an engine on the shipped Q4_1 file, it drifts by what quantisation moves (bench/model_fidelity.py's
order). The replies validate against the routes' models."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tapdeck.runner.recipes.logprob_mismatch import MAX, MEAN, OUTSIDE
from tapdeck.runner.replay.drift import K3_KL
from tapdeck.schema.replay import ReplayList, ReplayLogprobs, ReplayResult
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


@dataclass
class Captured:
    url: str
    admin: dict[str, str]
    session_id: str


@pytest.fixture(scope="module")
def captured(embedded_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    """A server on the embedded engine holding one captured three-turn conversation."""
    with local_server_on(embedded_engine, tmp_path_factory.mktemp("replay") / "data") as server:
        admin = {"Authorization": f"Bearer {server.admin_key}"}
        yield Captured(server.url, admin, _conversation(server.url, admin))


def _replay(captured: Captured, engine_url: str) -> ReplayResult:
    reply = httpx.post(
        f"{captured.url}/admin/sessions/{captured.session_id}/replay",
        json={"engine": engine_url},
        headers=captured.admin,
        timeout=600,
    )
    assert reply.status_code == 200, reply.text
    return ReplayResult.model_validate(reply.json())


def test_replaying_a_capture_on_the_engine_that_sampled_it_drifts_by_about_nothing(
    embedded_engine: Any, captured: Captured
) -> None:
    url, admin, sid = captured.url, captured.admin, captured.session_id
    result = _replay(captured, embedded_engine.url)
    assert result.requests == 1 and not result.chunked
    assert [t.scored for t in result.turns] == [True, True, True]
    figures = result.session
    assert figures is not None and figures.tokens == 72
    # Measured: mean 0.002, max 0.01 nats (the engine decodes one token at a time, prompt
    # logprobs come from one batched pass: llama.cpp's float rounding differs between the two).
    assert figures.metrics[MEAN] < 0.01 and figures.metrics[MAX] < 0.05
    assert figures.metrics[OUTSIDE] == 0.0 and 0.0 <= figures.metrics[K3_KL] < 1e-3

    listed = httpx.get(f"{url}/admin/sessions/{sid}/replays", headers=admin, timeout=60)
    assert ReplayList.model_validate(listed.json()).replays[-1].id == result.id
    got = httpx.get(f"{url}/admin/sessions/{sid}/replays/{result.id}/logprobs", headers=admin, timeout=60)
    pairs = ReplayLogprobs.model_validate(got.json())
    assert [t.seq for t in pairs.turns] == [t.seq for t in result.turns]
    assert sum(len(t.reference) for t in pairs.turns) == 72
    trace = httpx.get(f"{url}/admin/sessions/{sid}/trace", headers=admin, timeout=60).json()
    assert {e["metadata"]["reference"] for e in trace["turns"]} == {f"smollm2@{embedded_engine.base_url}"}

    refused = httpx.post(
        f"{url}/admin/sessions/{sid}/replay", json={"engine": "embedded"}, headers=admin, timeout=60
    )
    assert refused.status_code == 400 and "runs no embedded engine" in refused.text

    gone = httpx.delete(f"{url}/admin/sessions/{sid}/replays/{result.id}", headers=admin, timeout=60)
    assert result.id not in [r.id for r in ReplayList.model_validate(gone.json()).replays]


def test_a_replay_on_another_model_file_shows_its_drift(captured: Captured) -> None:
    from tapdeck.runner.engine.embedded import EmbeddedEngine
    from tapdeck.runner.engine.model_file import shipped_model_path

    with EmbeddedEngine(shipped_model_path()) as q4:
        result = _replay(captured, q4.url)
    figures = result.session
    assert figures is not None and figures.tokens == 72 and result.requests == 1
    # bench/model_fidelity.py: Q4_1 against F16, 0.10-0.12 nats mean over each position's top 20
    assert 0.02 < figures.metrics[MEAN] < 0.5 and figures.metrics[MAX] > 0.1
    assert figures.metrics[K3_KL] > 0.0
    assert figures.largest[0].delta == pytest.approx(
        figures.largest[0].reference_logprob - figures.largest[0].sampler_logprob
    )
