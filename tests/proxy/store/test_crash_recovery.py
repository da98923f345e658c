"""A real `kill -9` of a `tapdeck serve` process mid-rollout, then a restart on the same data dir:
every turn whose reply reached the client is stored, listed and exportable. The engine is a
loopback server answering with recorded vLLM bodies that holds the rollout's third call, so the
kill lands while that call is in flight."""

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

from tests.support.fake_vllm import FakeVllm, continues_a_conversation
from tests.support.tapdeck_process import TAPDECK, serve_process, wait_health

pytestmark = pytest.mark.slow


def test_kill_9_mid_rollout_loses_no_replied_turn(upstream: FakeVllm, tmp_path: Path, port_factory):
    data = tmp_path / "data"
    port = port_factory()
    url = f"http://127.0.0.1:{port}"
    proc = serve_process(port, data, upstream.base_url)
    try:
        wait_health(url, proc)
        admin = {"Authorization": f"Bearer {(data / 'admin.key').read_text().strip()}"}
        info = httpx.post(
            f"{url}/admin/sessions", json={"metadata": {"crash": True}}, timeout=60, headers=admin
        ).json()
        client = openai.OpenAI(
            base_url=info["base_urls"]["openai"], api_key=info["api_key"], max_retries=0, timeout=60
        )
        messages = [{"role": "user", "content": "Count to three."}]
        replied: list[tuple[str, str]] = []  # (reply id, text) of each reply the client got
        for _ in range(2):
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0)
            replied.append((reply.id, reply.choices[0].message.content))
            messages += [
                {"role": "assistant", "content": replied[-1][1]},
                {"role": "user", "content": "Go on."},
            ]

        # From here the engine holds every call that continues the conversation: the third call
        # reaches it through the proxy and gets no reply before the kill.
        upstream.hold = continues_a_conversation
        in_flight_error: list[BaseException] = []

        def third_call() -> None:
            try:
                reply = client.chat.completions.create(
                    model="m", messages=messages, max_tokens=64, temperature=0
                )
                replied.append((reply.id, reply.choices[0].message.content))
            except BaseException as exc:  # noqa: BLE001 - the server dies under it: the test reads it
                in_flight_error.append(exc)

        thread = threading.Thread(target=third_call)
        thread.start()
        deadline = time.monotonic() + 60
        while upstream.held < 1:
            assert thread.is_alive() and time.monotonic() < deadline, (
                f"the third call never reached the engine: {in_flight_error}"
            )
            time.sleep(0.02)
        activity = httpx.get(f"{url}/admin/sessions/{info['id']}/activity", headers=admin, timeout=60).json()
        assert [c["messages"] for c in activity["in_flight"]] == [len(messages)]
        assert activity["calls_started"] == 3 and activity["calls_ended"] == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        thread.join(60)
        assert not thread.is_alive()
        assert proc.returncode == -signal.SIGKILL
        upstream.hold = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The call in flight died with the server, unanswered.
    assert len(replied) == 2
    assert len(in_flight_error) == 1 and isinstance(in_flight_error[0], openai.APIConnectionError)

    # Restart on the same data dir (the held port must be free again, too).
    proc = serve_process(port, data, upstream.base_url)
    try:
        wait_health(url, proc)
        admin = {"Authorization": f"Bearer {(data / 'admin.key').read_text().strip()}"}
        sessions = httpx.get(f"{url}/admin/sessions", headers=admin, timeout=60).json()["sessions"]
        (old,) = [s for s in sessions if s["id"] == info["id"]]
        assert old["state"] == "interrupted"
        assert old["turns"] == len(replied)  # the replied turns, and not the unanswered one
        for seq, (reply_id, text) in enumerate(replied):
            turn = httpx.get(
                f"{url}/admin/sessions/{info['id']}/turns/{seq}", headers=admin, timeout=60
            ).json()
            assert turn["meta"]["reply_id"] == reply_id
            assert turn["response"]["content"] == text
            assert turn["sampled_ids"] and turn["logprobs"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    out = tmp_path / "export.jsonl"
    done = subprocess.run(
        [TAPDECK, "export", info["id"], "--format", "jsonl", "--out", str(out), "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(replied)
    assert all(r["session_id"] == info["id"] and r["prompt_token_ids"] for r in rows)
    assert [r["response"]["choices"][0]["message"]["content"] for r in rows] == [t for _, t in replied]
