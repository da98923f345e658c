"""Token-in continuation on the recorded vLLM break cases: the prompt the proxy builds from stored
ids keeps the token prefix where vLLM's text path broke it (a `length` cut, a reply that
re-tokenises, special tokens inside a reply), and equals the text path where that one held.

The template pieces come from the recorded text-path prompt of the next call, split at the message
boundary where the template closed the held reply (`<|im_end|>` then a newline), which is what
`/tokenize` with and without the new messages returns for these ChatML templates; on the embedded
engine (tests/runner/engine/test_token_in_capture.py) they come from the engine's own `/tokenize`.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from tapdeck.proxy.capture.graph import RolloutGraph
from tapdeck.proxy.upstream.client import parse_capture
from tapdeck.proxy.upstream.token_in import (
    BoundaryError,
    assistant_close,
    completion_as_chat,
    continuation_ids,
    difference,
)
from tapdeck.proxy.upstream.toolcalls import TOOL_PARSERS
from tests.support.recorded_turns import turn_from_fixture
from tests.support.same_shape import assert_same_shape
from tests.support.vllm_recordings import vllm_fixture

IM_END = 2
NEWLINE = {"smollm2": 198, "tiny": 201}
CASES = [  # (held call, next call, text-path diverges at, why)
    ("chat_multiturn_1", "chat_multiturn_2", None, "stop"),
    ("chat_multiturn_2", "chat_multiturn_3", None, "stop"),
    ("chat_multiturn_trunc_1", "chat_multiturn_trunc_2", None, "length cut"),
    ("chat_multiturn_retok_1", "chat_multiturn_retok_2", 52, "re-tokenised reply"),
    ("tiny/chat_multiturn_1", "tiny/chat_multiturn_2", 66, "special token in reply"),
    ("tiny/chat_multiturn_2", "tiny/chat_multiturn_3", 133, "special token in reply"),
    ("tiny/chat_multiturn_indist_2", "tiny/chat_multiturn_indist_3", 71, "special token in reply"),
]


def _pieces(held: str, nxt: str) -> tuple[list[int], list[int], list[int], list[int], str, list[int]]:
    a, b = vllm_fixture(held)["response"], vllm_fixture(nxt)["response"]
    prompt, sampled = a["prompt_token_ids"], a["choices"][0]["token_ids"]
    full = b["prompt_token_ids"]
    close = [IM_END, NEWLINE["tiny" if held.startswith("tiny/") else "smollm2"]]
    end = full.index(IM_END, len(prompt))  # the template's close of the held reply
    return prompt, sampled, full[: end + 2], full, a["choices"][0]["finish_reason"], close


@pytest.mark.parametrize(("held", "nxt", "text_break", "why"), CASES)
def test_token_in_prompt_extends_the_held_ids_where_text_broke(held, nxt, text_break, why):
    prompt, sampled, held_render, full, finish, close = _pieces(held, nxt)
    ids = continuation_ids(prompt + sampled, sampled, finish, close, held_render, full)
    assert ids[: len(prompt) + len(sampled)] == prompt + sampled
    assert ids[len(ids) - (len(full) - len(held_render)) :] == full[len(held_render) :]
    diff = difference(full, ids)
    if text_break is None:
        assert diff == {"same": True, "text_len": len(full), "ids_len": len(ids)}, why
    else:
        assert not diff["same"] and diff["diverge_at"] == text_break, why
        assert diff["text_window"] != diff["ids_window"]


def test_length_cut_gets_the_close_the_model_never_sampled():
    prompt, sampled, held_render, full, finish, close = _pieces(
        "chat_multiturn_trunc_1", "chat_multiturn_trunc_2"
    )
    assert finish == "length" and sampled[-1] != IM_END
    ids = continuation_ids(prompt + sampled, sampled, finish, close, held_render, full)
    assert ids[len(prompt) + len(sampled) :][:2] == close


def test_sampled_end_token_is_not_doubled():
    prompt, sampled, held_render, full, finish, close = _pieces("chat_multiturn_1", "chat_multiturn_2")
    assert finish == "stop" and sampled[-1] == IM_END
    ids = continuation_ids(prompt + sampled, sampled, finish, close, held_render, full)
    assert ids[len(prompt) + len(sampled)] == close[1]


def test_other_end_token_the_model_sampled_is_kept_before_the_close():
    """`<|endoftext|>` (0) sampled where the template closes with `<|im_end|>`: the trainer sees
    the 0 the model sampled, then the close the template writes."""
    prompt, sampled, held_render, full, _, close = _pieces("chat_multiturn_1", "chat_multiturn_2")
    other = [*sampled[:-1], 0]
    ids = continuation_ids(prompt + other, other, "stop", close, held_render, full)
    assert ids[len(prompt) + len(other) - 1 :][:3] == [0, *close]


def test_breaks_per_transition_off_and_on():
    """Figure (b): recorded vLLM cases, text mode vs token-in, as rollout-graph breaks."""
    off = on = 0
    for held, nxt, _, _ in CASES:
        a, b = turn_from_fixture(held, 0), turn_from_fixture(nxt, 1)
        g = RolloutGraph()
        g.add(a)
        g.add(b)
        off += g.stats().breaks
        prompt, sampled, held_render, full, finish, close = _pieces(held, nxt)
        ids = continuation_ids(prompt + sampled, sampled, finish, close, held_render, full)
        g = RolloutGraph()
        g.add(a)
        link = g.add(
            turn_from_fixture(nxt, 1).__class__(
                **{**b.__dict__, "prompt_ids": np.asarray(ids, dtype=np.int32)}
            )
        )
        assert (link.parent, link.kind) == (0, "prefix"), (held, link)
        on += g.stats().breaks
    assert (off, on) == (4, 0)


def test_boundary_that_is_not_a_prefix_is_refused():
    prompt, sampled, held_render, full, finish, close = _pieces("chat_multiturn_1", "chat_multiturn_2")
    edited = list(full)
    edited[5] += 1  # the template re-rendered an earlier message
    with pytest.raises(BoundaryError):
        continuation_ids(prompt + sampled, sampled, finish, close, held_render, edited)
    with pytest.raises(BoundaryError):
        continuation_ids(prompt + sampled, sampled, finish, [IM_END, 7], held_render, full)
    with pytest.raises(BoundaryError):
        assistant_close([1, 2, 3], [1, 2, 3])


def test_completion_reply_reads_as_the_chat_capture():
    recorded = vllm_fixture("completions_ids")["response"]
    chat = completion_as_chat(recorded, top_k=0)
    cap = parse_capture(chat)
    choice = recorded["choices"][0]
    assert cap.prompt_ids.tolist() == choice["prompt_token_ids"]
    assert cap.sampled_ids.tolist() == choice["token_ids"]
    assert cap.logprobs.tolist() == choice["logprobs"]["token_logprobs"]
    assert cap.token_texts == choice["logprobs"]["tokens"]
    assert chat["choices"][0]["message"]["content"] == choice["text"]
    assert chat["choices"][0]["finish_reason"] == "length"
    # Shaped as the chat route answers (vLLM 0.32's recorded chat body), key for key.
    assert_same_shape(chat, vllm_fixture("chat_basic")["response"])


def test_token_in_replies_with_tools_read_as_vllms_hermes_chat_replies():
    """vLLM 0.32's chat route with `--tool-call-parser hermes` (recorded): a reply with a call has
    `content` null, `tool_calls` with `chatcmpl-tool-<16 hex>` ids and `finish_reason` tool_calls;
    a reply without one has no `tool_calls` key. A recorded token-id completion carrying the text
    the model sampled in the recorded call (its tokens' bytes, less the end token) reads back the
    same through token-in's parser."""
    hermes = TOOL_PARSERS["hermes"]
    completion = vllm_fixture("tokenin_stop_turn2_ids")["response"]
    plain = completion_as_chat(completion, top_k=0, parser=hermes)["choices"][0]
    vllm_plain = vllm_fixture("chat_tools_no_call")["response"]["choices"][0]
    assert list(plain["message"]) == list(vllm_plain["message"])
    assert plain["finish_reason"] == completion["choices"][0]["finish_reason"]

    vllm_call = vllm_fixture("chat_tools_call")["response"]["choices"][0]
    entries = vllm_call["logprobs"]["content"]
    sampled = b"".join(bytes(e["bytes"]) for e in entries[:-1]).decode()
    with_call = copy.deepcopy(completion)
    with_call["choices"][0]["text"] = sampled
    ours = completion_as_chat(with_call, top_k=0, parser=hermes)["choices"][0]
    assert list(ours["message"]) == list(vllm_call["message"])
    assert ours["message"]["content"] == vllm_call["message"]["content"] is None
    assert [(c["type"], c["function"]) for c in ours["message"]["tool_calls"]] == [
        (c["type"], c["function"]) for c in vllm_call["message"]["tool_calls"]
    ]
    ids = [c["id"] for c in ours["message"]["tool_calls"] + vllm_call["message"]["tool_calls"]]
    assert all(re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", i) for i in ids)
    assert ours["finish_reason"] == vllm_call["finish_reason"] == "tool_calls"
