"""The Rollout screen's search over turn text (app/views/turn_search.py), without an app."""

from __future__ import annotations

from tapdeck.app.views.turn_search import find_turns, search_line, turn_text, turn_texts
from tapdeck.schema.sessions import RolloutTurn

SYSTEM = {"role": "system", "content": "You are a shell agent."}
ASK = {"role": "user", "content": "Create hello.txt"}
REPLY = {"role": "assistant", "content": "echo Hello > hello.txt"}
THEN = {"role": "user", "content": "Now run pytest"}


def _turn(seq: int, messages: list[dict], reply: dict) -> RolloutTurn:
    return RolloutTurn.model_validate(
        {
            "seq": seq,
            "parent": seq - 1 if seq else None,
            "link_kind": "root" if seq == 0 else "prefix",
            "capture_mode": "ids",
            "prompt_len": 1,
            "sampled_len": 1,
            "finish_reason": "stop",
            "created_at": 0.0,
            "findings": [],
            "role": "agent",
            "discarded": False,
            "trainable": True,
            "request": {"messages": messages},
            "response": reply,
            "sampling": None,
            "meta": {},
        }
    )


TURNS = [
    _turn(0, [SYSTEM, ASK], REPLY),
    _turn(1, [SYSTEM, ASK, REPLY, THEN], {"role": "assistant", "content": "pytest -q"}),
]


def test_a_turns_text_is_its_prompt_after_the_last_reply_and_its_own_reply():
    assert turn_text({"messages": [SYSTEM, ASK]}, REPLY) == (
        "system: You are a shell agent.\nuser: Create hello.txt\nassistant: echo Hello > hello.txt"
    )
    assert turn_text({"messages": [SYSTEM, ASK, REPLY, THEN]}, None) == "user: Now run pytest"
    assert turn_text(None, None) == ""


def test_a_search_finds_the_turns_holding_every_word_not_each_later_prompt():
    texts = turn_texts(TURNS)
    assert find_turns(texts, "hello") == [0]  # turn 1's prompt holds it too, from turn 0
    assert find_turns(texts, "PYTEST") == [1]
    assert find_turns(texts, "echo pytest") == []
    assert find_turns(texts, "shell") == [0]
    assert find_turns(texts, "  ") == []


def test_the_search_line_says_which_found_turn_is_shown():
    assert search_line("", [], None) == ""
    assert search_line("x", [], None) == "/ x: no turn holds it"
    assert search_line("x", [2, 5], None) == "/ x: 2 turns"
    assert search_line("x", [2, 5], 5) == "/ x: turn 2 of 2 (#5)"
    assert search_line("x", [5], 3) == "/ x: 1 turn"
