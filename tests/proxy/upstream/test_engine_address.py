"""Engine addresses: `HOST:PORT`, `http://HOST:PORT` and `…/v1` (trailing slash or not) settle on one
base URL wherever an engine is named (`serve`/`tui`/`rollout --engine`, session bodies); an address
where nothing answers is refused in one line naming every URL tried.

Against a loopback upstream serving the recorded vLLM bodies (tests/fixtures/vllm), a server that
lists models at its root, and (slow) the embedded engine.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tapdeck.app.host import LocalServer
from tapdeck.proxy.config import ServerConfig
from tapdeck.proxy.upstream.address import (
    EngineAddressError,
    candidate_base_urls,
    settle,
    settle_blocking,
)
from tapdeck.runner.engine.model import DEFAULT_N_CTX
from tapdeck.runner.engine.wire import FINGERPRINT
from tests.support.fake_vllm import models_only_engine

CHAT = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def address_forms(base_url: str) -> list[str]:
    """Every way an operator writes the engine whose base URL is `http://HOST:PORT/v1`."""
    host_port = base_url.removeprefix("http://").removesuffix("/v1")
    return [
        host_port,
        f"http://{host_port}",
        f"http://{host_port}/",
        f"http://{host_port}/v1",
        f"http://{host_port}/v1/",
    ]


def test_an_address_without_a_path_is_asked_at_v1_then_at_the_root() -> None:
    assert candidate_base_urls("gpu-box:8000") == ["http://gpu-box:8000/v1", "http://gpu-box:8000"]
    assert candidate_base_urls("https://gpu-box/") == ["https://gpu-box/v1", "https://gpu-box"]
    assert candidate_base_urls("http://gpu-box:8000/v1/") == ["http://gpu-box:8000/v1"]
    assert candidate_base_urls(" HTTPS://api.example.com/openai/v1 ") == ["https://api.example.com/openai/v1"]


@pytest.mark.parametrize(
    "address", ["ftp://gpu-box/v1", "gpu-box:port", "http://", "", "http://:8000", "http://[::1:8000/v1"]
)
def test_an_address_that_is_not_an_http_url_is_a_400(address: str) -> None:
    with pytest.raises(EngineAddressError) as err:
        candidate_base_urls(address)
    assert err.value.status == 400 and "HOST:PORT" in str(err.value)


@pytest.mark.parametrize(
    ("address", "port"),
    [
        ("gpu-box:99999", "99999"),
        ("127.0.0.1:0", "0"),
        ("http://gpu-box:65536/v1", "65536"),
        ("http://[::1]:0", "0"),
    ],
)
def test_an_address_whose_port_is_out_of_range_says_so(address: str, port: str) -> None:
    with pytest.raises(EngineAddressError) as err:
        candidate_base_urls(address)
    assert err.value.status == 400
    assert str(err.value) == f"engine address {address!r}: port {port} is out of range (1-65535)"


def test_every_address_form_settles_on_the_recorded_engines_v1_base_url(upstream) -> None:
    for address in address_forms(upstream.base_url):
        assert settle_blocking(address).base_url == upstream.base_url, address
        settled = asyncio.run(settle(address))
        assert settled.base_url == upstream.base_url and settled.model_ids() == ["smollm2"]


def test_an_engine_listing_models_at_its_root_settles_on_the_root() -> None:
    with models_only_engine(base_path="") as root:
        assert settle_blocking(root.removeprefix("http://")).base_url == root
        assert settle_blocking(f"{root}/").base_url == root


def test_a_wrong_address_is_one_line_naming_every_url_tried(dead_engine_url: str) -> None:
    bare = dead_engine_url.removesuffix("/v1")
    with pytest.raises(EngineAddressError) as err:
        settle_blocking(bare.removeprefix("http://"))
    message = str(err.value)
    assert err.value.status == 502 and "\n" not in message
    assert f"GET {bare}/v1/models" in message and f"GET {bare}/models" in message
    with pytest.raises(EngineAddressError, match=f"tried GET {dead_engine_url}/models"):
        asyncio.run(settle(dead_engine_url))


def test_an_address_that_answers_without_a_model_listing_is_refused_with_its_answer(upstream) -> None:
    wrong_path = f"{upstream.url}/v2"
    with pytest.raises(EngineAddressError) as err:
        settle_blocking(wrong_path)
    assert f"GET {wrong_path}/models (HTTP 404)" in str(err.value)


@pytest.mark.medium
def test_serve_takes_every_address_form_as_its_default_engine(upstream, make_server, admin_for) -> None:
    for address in address_forms(upstream.base_url):
        server = make_server(address)
        assert server.engine_url == upstream.base_url, address
    reply = admin_for(server).post("/admin/sessions", json={})
    assert reply.status_code == 200, reply.text
    assert reply.json()["engine"]["url"] == upstream.base_url
    assert reply.json()["tier"] == "tokens"


@pytest.mark.medium
def test_session_bodies_take_every_address_form_and_say_where_they_settled(
    upstream, make_server, admin_for
) -> None:
    server = make_server(upstream.base_url)
    admin = admin_for(server)
    for address in address_forms(upstream.base_url):
        reply = admin.post("/admin/sessions", json={"engine": {"url": address}})
        assert reply.status_code == 200, reply.text
        info = reply.json()
        assert info["engine"]["url"] == upstream.base_url and info["tier"] == "tokens", address
        client = openai.OpenAI(base_url=info["base_urls"]["openai"], api_key=info["api_key"], max_retries=0)
        answer = client.chat.completions.create(**CHAT)
        assert answer.choices[0].message.content, address
        assert admin.get(f"/admin/sessions/{info['id']}").json()["turns"] == 1


def test_a_session_naming_a_wrong_address_is_refused_naming_the_urls_tried(
    upstream, make_server, admin_for, dead_engine_url: str
) -> None:
    admin = admin_for(make_server(upstream.base_url))
    bare = dead_engine_url.removesuffix("/v1")
    reply = admin.post("/admin/sessions", json={"engine": {"url": bare}})
    assert reply.status_code == 502
    detail = reply.json()["detail"]
    assert f"GET {bare}/v1/models" in detail and f"GET {bare}/models" in detail
    assert admin.get("/admin/sessions").json()["sessions"] == []


def test_a_server_naming_a_wrong_address_does_not_start_and_frees_its_port(
    tmp_path: Path, dead_engine_url: str, port_factory
) -> None:
    port = port_factory()
    # No time to wait for it (a server that waits is in tests/app/test_engine_wait.py).
    config = ServerConfig(port=port, data_dir=tmp_path, engine_url=dead_engine_url, engine_wait_s=0)
    server = LocalServer(config)
    with pytest.raises(EngineAddressError, match=f"tried GET {dead_engine_url}/models"):
        server.start()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.medium
@pytest.mark.parametrize(
    "command", [["serve", "--port", "0"], ["tui"], ["rollout", "--harness", "terminus-2"]]
)
def test_commands_refuse_a_wrong_engine_address_in_one_line(
    command: list[str], tmp_path: Path, dead_engine_url: str
) -> None:
    bare = dead_engine_url.removesuffix("/v1").removeprefix("http://")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tapdeck.app.cli import main; main()",
            *command,
            "--engine",
            bare,
            "--engine-wait",  # none: an engine not up yet is awaited (tests/app/test_engine_wait.py)
            "0",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    [line] = [line for line in out.stderr.splitlines() if "tried GET" in line]
    assert f"GET http://{bare}/v1/models" in line and f"GET http://{bare}/models" in line


@pytest.mark.slow
def test_the_embedded_engine_is_reached_by_every_address_form(embedded_engine, tmp_path: Path) -> None:
    base = embedded_engine.base_url
    forms = address_forms(base)
    for address in forms:
        assert settle_blocking(address).base_url == base, address
    with LocalServer(ServerConfig(port=0, data_dir=tmp_path, engine_url=forms[0])) as server:
        assert server.engine_url == base
        headers = {"Authorization": f"Bearer {server.admin_key}"}
        for address in forms[1:3]:
            reply = httpx.post(
                f"{server.url}/admin/sessions",
                json={"engine": {"url": address}},
                headers=headers,
                timeout=120,
            )
            assert reply.status_code == 200, reply.text
            # The session also records the context the engine reports (its `max_model_len`), and
            # what its replies name it.
            assert reply.json()["engine"] == {
                "url": base,
                "model": "smollm2",
                "max_model_len": DEFAULT_N_CTX,
                "system_fingerprint": FINGERPRINT,
            }
            assert reply.json()["tier"] == "tokens"
