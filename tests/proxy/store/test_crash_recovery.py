"""A real `kill -9` of a `tapdeck serve` process mid-rollout, then a restart on the same data dir:
every turn whose reply reached the client is stored, listed and exportable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

from tests.support.tapdeck_process import TAPDECK, serve_process, wait_health


def test_kill_9_mid_rollout_loses_no_replied_turn(embedded_engine, tmp_path: Path, port_factory):
    data = tmp_path / "data"
    port = port_factory()
    url = f"http://127.0.0.1:{port}"
    proc = serve_process(port, data, embedded_engine.base_url)
    try:
        wait_health(url, proc)
        admin_key = (data / "admin.key").read_text().strip()
        info = httpx.post(f"{url}/admin/sessions", json={"metadata": {"crash": True}}, timeout=60,
                          headers={"Authorization": f"Bearer {admin_key}"}).json()
        client = openai.OpenAI(base_url=info["base_urls"]["openai"], api_key=info["api_key"],
                               max_retries=0, timeout=60)
        messages = [{"role": "user", "content": "Count to three."}]
        replied: list[str] = []
        for _ in range(2):
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=8,
                                                   temperature=0)
            replied.append(reply.choices[0].message.content)
            messages += [{"role": "assistant", "content": replied[-1]},
                         {"role": "user", "content": "Go on."}]

        in_flight_error: list[BaseException] = []

        def third_call() -> None:
            try:
                reply = client.chat.completions.create(model="m", messages=messages, max_tokens=64,
                                                       temperature=0)
                replied.append(reply.choices[0].message.content)
            except BaseException as exc:  # the server dies under it
                in_flight_error.append(exc)

        thread = threading.Thread(target=third_call)
        thread.start()
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        thread.join(60)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # Restart on the same data dir (the held port must be free again, too).
    proc = serve_process(port, data, embedded_engine.base_url)
    try:
        wait_health(url, proc)
        admin_key = (data / "admin.key").read_text().strip()
        admin = {"Authorization": f"Bearer {admin_key}"}
        sessions = httpx.get(f"{url}/admin/sessions", headers=admin, timeout=60).json()["sessions"]
        (old,) = [s for s in sessions if s["id"] == info["id"]]
        assert old["state"] == "interrupted"
        assert old["turns"] >= len(replied)
        for seq, text in enumerate(replied):
            turn = httpx.get(f"{url}/admin/sessions/{info['id']}/turns/{seq}", headers=admin,
                             timeout=60).json()
            assert turn["response"]["content"] == text
            assert turn["sampled_ids"] and turn["logprobs"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    out = tmp_path / "export.jsonl"
    done = subprocess.run([TAPDECK, "export", info["id"], "--format", "jsonl", "--out", str(out),
                           "--data-dir", str(data)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) >= len(replied)
    assert all(r["session_id"] == info["id"] and r["prompt_token_ids"] for r in rows)
    assert [r["response"]["choices"][0]["message"]["content"] for r in rows[:len(replied)]] == replied
