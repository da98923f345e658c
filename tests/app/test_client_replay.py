"""The client's replay methods over a real server (runner routes mounted) and a reference shaped
like vLLM (tests/support/fake_vllm.py serves `prompt_logprobs`): replay, list, per-token logprobs,
delete, and the refusals as `ApiError`s naming why."""

from __future__ import annotations

from pathlib import Path

import pytest

from tapdeck.app.client import ApiError, TapdeckClient
from tapdeck.proxy.store.database import Store
from tapdeck.schema.replay import ReplayRequest
from tests.support.fake_vllm import FakeVllm
from tests.support.local_server import local_server_on
from tests.support.replay_sessions import OFF, SPIKE, chain_turns, reference_scores, store_session


@pytest.mark.medium
async def test_the_client_replays_a_session_reads_both_logprobs_and_deletes_the_replay(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    turns = chain_turns()
    with Store(data / "capture.db") as store:
        store_session(store, "s-a", turns)
    with (
        FakeVllm(answer=None, prompt_scores=reference_scores(turns)) as engine,
        local_server_on(engine, data) as server,
    ):
        client = TapdeckClient(server.url, server.admin_key)
        try:
            result = await client.replay("s-a", ReplayRequest(engine=engine.url))
            assert [t.scored for t in result.turns] == [True, True, True]
            assert [r.id for r in await client.replays("s-a")] == [result.id]
            pairs = await client.replay_logprobs("s-a", result.id)
            assert [p.seq for p in pairs.turns] == [t.seq for t in turns]
            for pair, turn in zip(pairs.turns, turns, strict=True):
                off = [OFF] * turn.sampled_ids.size
                if turn.seq == SPIKE[0]:
                    off[SPIKE[1]] = SPIKE[2]
                assert pair.sampler == pytest.approx(turn.logprobs.tolist())
                assert [r - s for r, s in zip(pair.reference, pair.sampler, strict=True)] == pytest.approx(
                    off
                )
            with pytest.raises(ApiError, match="no replay rp-none"):
                await client.replay_logprobs("s-a", "rp-none")
            with pytest.raises(ApiError, match="runs no embedded engine"):
                await client.replay("s-a")  # the default: this server's engine is no embedded one
            assert await client.delete_replay("s-a", result.id) == []
            assert await client.replays("s-a") == []
        finally:
            await client.aclose()
