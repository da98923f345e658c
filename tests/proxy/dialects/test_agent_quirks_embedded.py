"""Agent request shapes against the embedded engine (SmolLM2-135M, its real ChatML template).

claude-code's `role: "system"` messages inside `messages` and a chat agent's late developer message
are rendered where the agent put them: SmolLM2's template renders a system turn anywhere, so the
conversation keeps extending its own token prefix and stays one chain. gemini-cli's router call
gets JSON back although the embedded engine does not constrain decoding.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tapdeck.proxy.upstream.tiers import EngineSpec
from tests.support.agent_recordings import gemini_router, recording
from tests.support.capture_server import CaptureServer, capture_server
from tests.support.findings import rendered

pytestmark = pytest.mark.slow

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def proxy(embedded_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureServer]:
    engine = EngineSpec(url=embedded_engine.base_url, model=embedded_engine.served_name)
    with capture_server(engine, tmp_path_factory.mktemp("capture"), keepalive_s=10.0) as server:
        yield server


def assert_one_chain(proxy: CaptureServer, session_id: str, turns: int) -> None:
    summary = proxy.summary(session_id)
    assert (summary["turns"], summary["roots"], summary["breaks"]) == (turns, 1, 0), summary
    assert [proxy.turn(session_id, s)["parent"] for s in range(turns)] == [None, *range(turns - 1)]
    assert not [f for f in rendered(summary["findings"]) if "prefix_break" in f or "system_folded" in f]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_claude_code_system_reminders_leave_one_chain(proxy: CaptureServer, stream: bool) -> None:
    info = proxy.open_session()
    client = anthropic.Anthropic(
        api_key=info["api_key"], base_url=info["base_urls"]["anthropic"], max_retries=0
    )
    body = copy.deepcopy(recording("claude_code")["calls"][0])
    messages = body["messages"]
    for turn in range(3):
        kwargs = dict(
            model=body["model"],
            max_tokens=MAX_TOKENS,
            system=body["system"],
            messages=messages,
            tools=body["tools"],
            extra_body={"temperature": 0},
        )
        if stream:
            with client.beta.messages.stream(**kwargs) as events:
                message = events.get_final_message()
        else:
            message = client.beta.messages.create(**kwargs)
        messages = [
            *messages,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
        ]
        calls = [b for b in message.content if b.type == "tool_use"]
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": c.id, "content": "(no output)"} for c in calls
                ]
                or "Continue.",
            }
        )
        # claude-code's reminder, inside `messages`, every few turns
        messages.append({"role": "system", "content": f"<system-reminder>turn {turn}</system-reminder>"})
    assert_one_chain(proxy, info["id"], 3)
    request = proxy.turn(info["id"], 2)["request"]["messages"]
    assert [m["content"] for m in request if m["role"] == "system"][-2:] == [
        "<system-reminder>turn 0</system-reminder>",
        "<system-reminder>turn 1</system-reminder>",
    ]


def test_chat_developer_message_after_the_first_turn_leaves_one_chain(proxy: CaptureServer) -> None:
    info = proxy.open_session()
    client = openai.OpenAI(api_key=info["api_key"], base_url=info["base_urls"]["openai"], max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "developer", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
    ]
    for turn in range(3):
        reply = client.chat.completions.create(
            model="m", messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "developer", "content": f"Reminder {turn}: stay terse."},
            {"role": "user", "content": "Another."},
        ]
    assert_one_chain(proxy, info["id"], 3)


def test_gemini_router_gets_json_from_the_embedded_engine(proxy: CaptureServer) -> None:
    # The router asks for no output limit; capped as a rollout's session caps it (the runner sets
    # `max_output_tokens`), or the 135M model fills its whole context first (~6 min here).
    info = proxy.open_session(max_output_tokens=64)
    value = json.loads(gemini_router(info).text)
    assert isinstance(value, dict) and {"complexity_reasoning", "complexity_score"} <= set(value)
    assert proxy.turn(info["id"], 0)["meta"]["call_role"] == "auxiliary"
