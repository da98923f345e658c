"""Token-in capture of calls with tools, on the embedded engine: the same conversation sent through
a session with the mode off (every call by text, tool calls parsed by the engine's chat route) and
one with it on (continued by ids on the completions route, tool calls parsed by the proxy with the
same parser) gives the harness the same replies, streamed or not, from the same prompt ids.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tapdeck.proxy.upstream.toolcalls import EMBEDDED_TOOL_PARSER
from tests.support.local_server import local_server_on

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL_ID = re.compile(r"chatcmpl-tool-[0-9a-f]{16}")


def _call(city: str, i: int) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
        ],
    }


def _fewshot() -> list[dict[str, Any]]:
    # The 135M model calls tools only by imitation: two calls in context, each followed by the
    # next question (after a tool result it imitates a `<tool_response>` instead).
    return [
        {"role": "system", "content": "You answer by calling tools."},
        {"role": "user", "content": "Weather in Rome?"},
        _call("Rome", 1),
        {"role": "user", "content": "Weather in Oslo?"},
        _call("Oslo", 2),
        {"role": "user", "content": "Weather in Paris?"},
    ]


def _normalised(body: str) -> str:
    """A reply with what differs on every call anyway (reply ids, tool-call ids, times) blanked."""
    body = CALL_ID.sub("chatcmpl-tool-X", body)
    body = re.sub(r'"id": ?"chatcmpl-[^"]*"', '"id": "X"', body)
    return re.sub(r'"created": ?\d+', '"created": 0', body)


def _conversation(url: str, admin: str, token_in: bool) -> tuple[str, list[str], list[dict]]:
    """Three calls with tools (the second streamed), each resending the last reply as the harness
    got it, then a new question (after the second, a tool result first)."""
    info = httpx.post(
        f"{url}/admin/sessions",
        json={"rollout_type": "train", "token_in": token_in},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=120,
    ).json()
    auth = {"Authorization": f"Bearer {info['api_key']}"}
    messages, bodies, replies = _fewshot(), [], []
    for k, city in enumerate(["Berlin", "Madrid", None]):
        stream = k == 1
        r = httpx.post(
            f"{url}/v1/chat/completions",
            headers=auth,
            timeout=300,
            json={
                "model": "smollm2",
                "messages": messages,
                "tools": TOOLS,
                "temperature": 0,
                "max_tokens": 40,
                "stream": stream,
            },
        )
        assert r.status_code == 200, r.text
        bodies.append(r.text)
        if stream:
            chunks = [json.loads(b[6:]) for b in r.text.split("\n\n") if b.startswith("data: {")]
            calls = [
                d["tool_calls"][0] for c in chunks for d in [c["choices"][0]["delta"]] if d.get("tool_calls")
            ]
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": calls[0]["id"],
                        "type": "function",
                        "function": {
                            "name": calls[0]["function"]["name"],
                            "arguments": calls[1]["function"]["arguments"],
                        },
                    }
                ],
            }
            replies.append({"message": message, "finish_reason": chunks[-1]["choices"][0]["finish_reason"]})
        else:
            choice = r.json()["choices"][0]
            replies.append(choice)
            message = choice["message"]
        if city is not None:
            result = (
                [{"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "rain"}]
                if k == 1
                else []
            )
            messages = [
                *messages,
                {k: message[k] for k in ("role", "content", "tool_calls")},
                *result,
                {"role": "user", "content": f"Weather in {city}?"},
            ]
    return info["id"], bodies, replies


def test_tool_calls_by_ids_reach_the_harness_as_by_text(embedded_engine, tmp_path):
    with local_server_on(
        embedded_engine, tmp_path / "data", engine_tool_parser=EMBEDDED_TOOL_PARSER
    ) as server:
        admin = {"Authorization": f"Bearer {server.admin_key}"}
        runs = {mode: _conversation(server.url, server.admin_key, mode) for mode in (False, True)}
        docs = {
            mode: httpx.get(f"{server.url}/admin/sessions/{sid}/rollout", headers=admin, timeout=120).json()
            for mode, (sid, _, _) in runs.items()
        }
        traces = {
            mode: httpx.get(f"{server.url}/admin/sessions/{sid}/trace", headers=admin, timeout=120).json()
            for mode, (sid, _, _) in runs.items()
        }

    # Both first calls answered with a tool call, the way the chat route reports one; the third
    # (after a tool result) imitates a tool response as plain text.
    for _, _, replies in runs.values():
        assert [r["finish_reason"] for r in replies] == ["tool_calls", "tool_calls", "stop"]
        assert all(CALL_ID.fullmatch(r["message"]["tool_calls"][0]["id"]) for r in replies[:2])
        assert replies[1]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        assert "tool_calls" not in replies[2]["message"]
        assert "<|im_end|>" not in replies[2]["message"]["content"]
    modes = [t["meta"]["capture_mode"] for t in docs[True]["turns"]]
    assert [m["mode"] for m in modes] == ["text", "ids", "ids"]
    assert [m.get("tool_parser") for m in modes[1:]] == ["hermes", "hermes"]
    # The tools block is in the ids exactly as the template renders it: the token-in prompt is the
    # prompt the chat route built from the same messages, id for id.
    assert all(m["same"] for m in modes[1:]), modes
    prompts = {mode: [row["prompt_token_ids"] for row in trace["turns"]] for mode, trace in traces.items()}
    assert prompts[True] == prompts[False]
    # What the harness received, streamed or not, is the same body on both paths.
    assert [_normalised(b) for b in runs[True][1]] == [_normalised(b) for b in runs[False][1]]
    assert (docs[True]["stats"]["breaks"], docs[True]["stats"]["fragmentation"]) == (0, 1.0)
