"""`--public-url`: validated, advertised by sessions, and checked from inside the sandbox."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from tapdeck.proxy.config import ServerConfig, check_public_url
from tapdeck.proxy.sessions.spec import base_urls_for
from tapdeck.runner.batch import RunPlan
from tapdeck.runner.cli_agents import ProxyUnreachableError, check_proxy_reachable, proxy_root
from tapdeck.runner.sandboxes.host import HostSandbox
from tests.support.fake_vllm import models_only_engine
from tests.support.local_server import local_server_on
from tests.support.vllm_recordings import vllm_fixture


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_public_url_is_checked_and_trimmed() -> None:
    assert check_public_url("http://gpu-box:18300/") == "http://gpu-box:18300"
    assert ServerConfig(public_url="https://10.0.0.5:8300").public_url == "https://10.0.0.5:8300"
    assert RunPlan(public_url="http://h:1").rollout.public_url == "http://h:1"
    for bad in ("gpu-box:18300", "ftp://h:1", "http://:1", "http://h:1/?x=1", "http://a b:1"):
        with pytest.raises(ValueError, match="public URL"):
            check_public_url(bad)
    with pytest.raises(ValueError, match="public URL"):
        RunPlan(public_url="tcp://h:1")


def test_sessions_advertise_the_public_url_for_every_dialect() -> None:
    assert base_urls_for("http://gpu-box:18300") == {
        "openai": "http://gpu-box:18300/v1",
        "anthropic": "http://gpu-box:18300",
        "google": "http://gpu-box:18300",
    }
    assert proxy_root("http://gpu-box:18300/v1") == "http://gpu-box:18300"


async def test_server_advertises_its_public_url_in_new_sessions(tmp_path: Path) -> None:
    from tapdeck.app.host import LocalServer
    from tapdeck.proxy.sessions.spec import SessionSpec
    from tapdeck.proxy.upstream.tiers import EngineSpec

    with models_only_engine() as engine:  # an address that settles; no model call is made
        server = LocalServer(
            ServerConfig(port=0, data_dir=tmp_path, engine_url=engine, public_url="http://gpu-box:18300")
        ).start()
        try:
            info = await server.service.open_session(SessionSpec(engine=EngineSpec(url=engine)))
            assert info.base_urls == base_urls_for("http://gpu-box:18300")
        finally:
            server.stop()


@pytest.fixture
async def sandbox(tmp_path: Path):
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True)
    trial_paths = TrialPaths(tmp_path / "trial")
    trial_paths.mkdir()
    (tmp_path / "hostdirs").mkdir()
    env = HostSandbox(
        environment_dir=env_dir,
        environment_name="t",
        session_id="t__env",
        trial_paths=trial_paths,
        task_env_config=TaskEnvironmentConfig(workdir="/app"),
        logger=logging.getLogger("test"),
        base_dir=str(tmp_path / "hostdirs"),
    )
    await env.start(force_build=False)
    yield env
    await env.stop(delete=True)


async def test_reachable_proxy_passes_the_check_from_inside_the_host_sandbox(
    sandbox: HostSandbox, tmp_path: Path
) -> None:
    with models_only_engine() as engine:

        class Engine:  # local_server_on only reads these two; the name must be one it lists
            base_url, served_name = engine, vllm_fixture("models")["models"]["response"]["data"][0]["id"]

        with local_server_on(Engine(), tmp_path / "data") as local:
            await check_proxy_reachable(sandbox, f"{local.url}/v1")


async def test_unreachable_public_url_is_a_clear_error_naming_it(sandbox: HostSandbox) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(ProxyUnreachableError) as caught:
        await check_proxy_reachable(sandbox, url)
    message = str(caught.value)
    assert f"{url}/health" in message and "--public-url" in message
