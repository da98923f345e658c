"""`tapdeck serve` writes one access line per model call on stderr, refused calls included, and
never a key."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import httpx
import pytest

from tests.support.fake_vllm import models_only_engine
from tests.support.tapdeck_process import serve_process, wait_health


@pytest.mark.medium
def test_serve_logs_one_line_per_call_with_keys_redacted(tmp_path: Path, port_factory) -> None:
    port = port_factory()
    url = f"http://127.0.0.1:{port}"
    engine = contextlib.ExitStack()  # the engine answers while serve settles it, then is gone
    proc = serve_process(port, tmp_path / "data", engine.enter_context(models_only_engine()))
    try:
        with engine:
            wait_health(url, proc)
        admin_key = (tmp_path / "data" / "admin.key").read_text().strip()
        info = httpx.post(
            f"{url}/admin/sessions", json={}, timeout=60, headers={"Authorization": f"Bearer {admin_key}"}
        ).json()
        key = info["api_key"]
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        assert (
            httpx.post(
                f"{url}/v1/chat/completions",
                json=body,
                timeout=60,
                headers={"Authorization": f"Bearer {key}"},
            ).status_code
            == 502
        )
        assert (
            httpx.post(
                f"{url}/v1/messages?beta=true",
                json={},
                timeout=60,
                headers={"x-api-key": "sk-ant-not-a-session"},
            ).status_code
            == 401
        )
        assert (
            httpx.post(
                f"{url}/v1beta/models/g:generateContent?key={key}", content=b"{", timeout=60
            ).status_code
            == 400
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    lines = [
        line.split("tapdeck.access: ", 1)[1]
        for line in err.decode().splitlines()
        if "tapdeck.access: " in line
    ]
    short = info["id"][:8]
    assert [line.rsplit(" ", 1)[0] for line in lines] == [  # less the latency
        f"call 502 chat /v1/chat/completions session={short} turn=- finish=- error=unreachable stream",
        "call 401 anthropic /v1/messages session=- turn=- finish=- error=authentication_error json",
        f"call 400 google /v1beta/models/g:generateContent session={short} turn=- finish=- "
        "error=invalid_request_error json",
    ]
    assert key not in err.decode() and admin_key not in err.decode() and "sk-ant-not" not in err.decode()
