"""A default engine that does not answer yet is awaited (proxy/upstream/default_engine.py): what
counts as "not up yet" (a refused connect, a timeout, a 503), what is an answer refused at once,
and the wait from the first try to the engine answering, or to its limit; a run resumed on it
meanwhile is refused (503) and stays resumable.

Against a fake vLLM started on a port only once the wait is under way, as a vLLM that binds its
port but listens only once its weights are loaded shows it.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.upstream.address import EngineAddressError, EngineNotUpYet, not_up_yet, settle_blocking
from tapdeck.proxy.upstream.default_engine import RETRY_AFTER_S, DefaultEngine, EngineLoading
from tapdeck.proxy.upstream.tiers import EngineSpec
from tests.support.fake_vllm import FakeVllm
from tests.support.ports import free_port

REQUEST = httpx.Request("GET", "http://gpu-box:8000/v1/models")


def _error(url: str, timeout: float = 5.0) -> httpx.HTTPError:
    try:
        httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        return exc
    raise AssertionError(f"{url} answered")


def test_a_refused_connect_a_timeout_and_a_503_are_an_engine_not_up_yet() -> None:
    assert not_up_yet(_error(f"http://127.0.0.1:{free_port()}/v1/models"))
    # A port bound and listening that never accepts: the connect completes, no answer comes.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        assert not_up_yet(_error(f"http://127.0.0.1:{held.getsockname()[1]}/v1/models", timeout=0.2))
    assert not_up_yet(httpx.Response(503, request=REQUEST))


@pytest.mark.parametrize("status", [200, 401, 403, 404, 500])
def test_any_other_reply_is_an_answer(status: int) -> None:
    assert not not_up_yet(httpx.Response(status, text="<html>hello</html>", request=REQUEST))


def test_a_name_that_does_not_resolve_is_an_answer() -> None:
    assert not not_up_yet(_error("http://no-such-host.invalid:8000/v1/models"))


def test_settling_a_port_where_nothing_listens_is_an_engine_not_up_yet() -> None:
    with pytest.raises(EngineNotUpYet) as err:
        settle_blocking(f"127.0.0.1:{free_port()}")
    assert err.value.status == 502 and "no engine answered" in err.value.message


@pytest.mark.parametrize("engine", [FakeVllm(listing=None), FakeVllm(fault="html")], ids=["404", "html"])
def test_settling_an_engine_that_answers_as_no_engine_is_refused_not_awaited(engine: FakeVllm) -> None:
    with engine, pytest.raises(EngineAddressError) as err:
        settle_blocking(engine.url)
    assert not isinstance(err.value, EngineNotUpYet)


def test_an_awaited_engine_is_a_503_with_retry_after_until_it_answers_then_its_settled_spec() -> None:
    port = free_port()
    engine = DefaultEngine.awaiting(EngineSpec(url=f"127.0.0.1:{port}"), limit_s=60, pause_s=0.05)
    assert engine.try_now() is False
    wait = engine.waiting()
    assert wait is not None and wait.url == f"127.0.0.1:{port}" and wait.limit_s == 60
    assert wait.line().startswith(f"waiting for the engine at 127.0.0.1:{port} (")
    with pytest.raises(EngineLoading) as err:
        engine.get()
    assert isinstance(err.value, ProxyError)
    assert (err.value.status, err.value.retry_after, err.value.retryable) == (503, RETRY_AFTER_S, True)
    assert engine.spec is None and not engine.wait(0)

    up = FakeVllm()
    engine.keep_trying()
    try:
        up.start(port)
        assert engine.wait(30), "the engine never settled"
        assert engine.failure is None and engine.waiting() is None
        assert engine.get() == engine.spec == EngineSpec(url=up.base_url)
    finally:
        engine.close()
        up.stop()


def test_an_engine_that_never_answers_is_given_up_on_once_the_limit_passes() -> None:
    address = f"http://127.0.0.1:{free_port()}/v1"
    engine = DefaultEngine.awaiting(EngineSpec(url=address), limit_s=0.3, pause_s=0.05)
    assert engine.try_now() is False
    engine.keep_trying()
    assert engine.wait(30)
    failure = engine.failure
    assert failure is not None and failure.status == 502
    assert failure.message.startswith(f"no engine answered at '{address}': tried GET {address}/models")
    assert failure.message.endswith("s; --engine-wait)") and "(waited " in failure.message
    with pytest.raises(EngineAddressError):
        engine.get()


def test_with_no_time_to_wait_the_first_try_refuses() -> None:
    engine = DefaultEngine.awaiting(EngineSpec(url=f"127.0.0.1:{free_port()}"), limit_s=0)
    with pytest.raises(EngineAddressError, match=r"\(waited 0 s; --engine-wait\)$"):
        engine.try_now()


def test_an_engine_that_answers_without_the_model_asked_for_is_refused() -> None:
    with FakeVllm() as up:
        engine = DefaultEngine.awaiting(EngineSpec(url=up.url, model="not-served"), limit_s=60)
        with pytest.raises(EngineAddressError) as err:
            engine.try_now()
    assert err.value.status == 400 and "does not serve model 'not-served'" in err.value.message
    assert engine.wait(0) and engine.failure is err.value


async def test_resuming_a_run_on_an_awaited_engine_is_a_503_that_leaves_the_run_resumable(tmp_path) -> None:
    from tapdeck.runner.batch import BatchRunner, RunPlan

    engine = EngineSpec(url=f"http://127.0.0.1:{free_port()}/v1", model="m")
    made = BatchRunner(None, data_dir=tmp_path, default_engine=engine)
    run_id = (await made.create(RunPlan(harness="terminus-2", tasks=["hello-file"]))).id
    # Two servers on the data dir, both awaiting the engine: the second is refused as the first
    # was, not told that the first runs the run (its lock was given back with the 503).
    for _ in range(2):
        resumed = BatchRunner(
            None, data_dir=tmp_path, default_engine=DefaultEngine.awaiting(engine, limit_s=60)
        )
        with pytest.raises(EngineLoading):
            resumed.start(run_id)
        assert resumed.get(run_id)[0].state == "interrupted"
