"""The engine's chat reply, checked once where it enters the proxy (the rule is in docs/capture.md).

Everything after the engine call reads the reply as vLLM writes it (tests/fixtures/vllm/): the
recorded turn, the dialects' replies and synthesised streams, the exports. `check_reply` makes
that true of any HTTP 200 an engine gives, by one rule per kind of field:

- **What the agent is answered with**: `choices[0]`, its `message` (the shape in
  proxy/capture/reply_shape.py, nesting at most MAX_REPLY_DEPTH deep) and its `finish_reason`. A
  field of the wrong type makes the call a 502 `bad_reply` naming the field and what it held, and
  no turn is recorded (as for a reply without choices): a repaired message would hand the agent,
  and record as sampled, something the model did not say.
- **Capture fields**: `prompt_token_ids`, `choices[0].token_ids`, `choices[0].logprobs`. One of
  the wrong shape is dropped from the reply and from the turn, with a FATAL finding naming it: the
  agent gets its answer, and the turn is kept as context but never trained on.
- **MoE routing**: `choices[0].routed_experts` not shaped as vLLM's is dropped from the reply and
  the turn with a WARN (`proxy/capture/routing.py`): routing is optional for training.
- **Bookkeeping**: `usage`, `created`, `model`, `object`, `system_fingerprint`,
  `choices[0].stop_reason`, `choices[0].index`, choices after the first, and any other field
  nesting past MAX_REPLY_DEPTH. One of the wrong type is dropped (usage counts read as 0) with one
  WARN naming everything dropped.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np

from tapdeck.proxy.capture.reply_shape import readable_message, shown
from tapdeck.proxy.http.limits import too_deep
from tapdeck.proxy.upstream.client import (
    Capture,
    EngineError,
    has_ids,
    parse_capture,
    zero_filled_usage,
)
from tapdeck.schema.findings import Finding

MAX_REPLY_DEPTH = 32
"""How deep a reply's fields may nest: vLLM's nest six deep, and orjson writes at most 255 (a
deeper one could be neither stored nor passed on)."""
USAGE_DETAILS = ("prompt_tokens_details", "completion_tokens_details")
_TEXT_OR_NULL = ("model", "object", "system_fingerprint")
_READ_TOP = frozenset({"choices", "usage", "prompt_token_ids", "created", "id", *_TEXT_OR_NULL})
_READ_CHOICE = frozenset(
    {"message", "finish_reason", "stop_reason", "index", "logprobs", "token_ids", "prompt_token_ids"}
)
_SCALARS = (str, int, float, bool, type(None))
_ENTRY_KEYS = {"token", "logprob", "bytes", "top_logprobs"}


class CheckedReply(NamedTuple):
    """An engine's reply as the proxy reads it."""

    reply: dict[str, Any]
    """The reply (changed in place): every field the proxy and the dialects read is of the type
    they assume."""
    capture: Capture
    """Its token ids and logprobs (`parse_capture`)."""
    findings: list[Finding]
    """What was dropped from it (FATAL: a capture field; WARN: bookkeeping), for its turn."""


def check_reply(reply: dict[str, Any], engine: str) -> CheckedReply:
    """`reply` checked and cleaned by the module's rule; EngineError(`bad_reply`, 502) for a reply
    the agent cannot be answered with. `engine` is the engine's URL as messages show it."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices:
        raise EngineError("bad_reply", 502, f"engine at {engine} answered HTTP 200 without choices", engine)
    choice = choices[0]
    if type(choice) is not dict:
        faults = [f"`choices[0]` is {shown(choice)}, not an object"]
    else:
        message, faults = readable_message(choice.get("message"))
        if not faults and too_deep(message, MAX_REPLY_DEPTH):
            faults.append(f"`choices[0].message` nests more than {MAX_REPLY_DEPTH} levels deep")
        finish = choice.get("finish_reason")
        if finish is not None and type(finish) is not str:
            faults.append(f"`choices[0].finish_reason` is {shown(finish)}, not a string or null")
    if faults:
        more = f" (and {len(faults) - 3} more)" if len(faults) > 3 else ""
        raise EngineError(
            "bad_reply",
            502,
            f"engine at {engine} answered HTTP 200 with a reply tapdeck "
            f"cannot pass on: {'; '.join(faults[:3])}{more}",
            engine,
        )

    dropped: list[str] = []
    if len(choices) > 1:
        reply["choices"] = [choice]
        dropped.append(f"{len(choices) - 1} choice(s) after the first (tapdeck asks for one)")
    _clean_bookkeeping(reply, choice, dropped)
    findings = _drop_bad_capture_fields(reply, choice)
    capture = parse_capture(reply)
    for finding in capture.findings:  # ids of the right type that are not ids (floats, > int32)
        if finding.code == "bad_prompt_ids":
            reply.pop("prompt_token_ids", None)
            choice.pop("prompt_token_ids", None)
        elif finding.code == "bad_sampled_ids":
            choice.pop("token_ids", None)
        elif finding.code == "bad_routed_experts":
            choice.pop("routed_experts", None)
    if dropped:
        findings.append(
            Finding.warn(
                "reply_cleaned",
                f"dropped from the engine's reply, which the agent got without them: {'; '.join(dropped)}",
            )
        )
    return CheckedReply(reply, capture, findings)


def _clean_bookkeeping(reply: dict[str, Any], choice: dict[str, Any], dropped: list[str]) -> None:
    reply["usage"] = zero_filled_usage(_usage(reply.get("usage"), dropped))
    created = reply.get("created")
    if created is not None and not (type(created) is int and created >= 0):
        dropped.append(f"`created` ({shown(created)})")
        reply["created"] = int(time.time())
    for key in _TEXT_OR_NULL:
        value = reply.get(key)
        if value is not None and type(value) is not str:
            dropped.append(f"`{key}` ({shown(value)})")
            del reply[key]
    stop = choice.get("stop_reason")  # vLLM: the stop string, or the stop token's id
    if stop is not None and type(stop) is not str and type(stop) is not int:
        dropped.append(f"`choices[0].stop_reason` ({shown(stop)})")
        choice["stop_reason"] = None
    index = choice.get("index")
    if index is not None and type(index) is not int:
        dropped.append(f"`choices[0].index` ({shown(index)})")
        choice["index"] = 0
    # Fields the proxy does not read are passed on as they are (the chat dialect answers with
    # them), unless they nest too deep to be written back. SGLang's per-choice prompt ids are read
    # only where the top level has none (parse_capture).
    read_choice = _READ_CHOICE
    if has_ids(reply.get("prompt_token_ids")):
        read_choice = _READ_CHOICE - {"prompt_token_ids"}
    for where, fields, read in (("", reply, _READ_TOP), ("choices[0].", choice, read_choice)):
        for key in [k for k, v in fields.items() if k not in read and too_deep(v, MAX_REPLY_DEPTH)]:
            dropped.append(f"`{where}{key}` (nested more than {MAX_REPLY_DEPTH} levels deep)")
            del fields[key]


def _usage(usage: Any, dropped: list[str]) -> dict[str, Any]:
    """Usage with only its integer counts from 0 to MAX_COUNT (null counts read as absent)."""
    if usage is None:
        return {}
    if type(usage) is not dict:
        dropped.append(f"`usage` ({shown(usage)})")
        return {}
    out: dict[str, Any] = {}
    for key, value in usage.items():
        if value is None:
            continue
        if key in USAGE_DETAILS and type(value) is dict:
            out[key] = {k: v for k, v in value.items() if _count(v)}
            dropped.extend(
                f"`usage.{key}.{k}` ({shown(v)})" for k, v in value.items() if v is not None and not _count(v)
            )
        elif key not in USAGE_DETAILS and _count(value):
            out[key] = value
        else:
            dropped.append(f"`usage.{key}` ({shown(value)})")
    return out


MAX_COUNT = 2**53 - 1
"""The largest usage count kept: the largest integer every JSON reader holds exactly (JavaScript
agents among them), and small enough that the dialects' sums of counts stay within the 64 bits
orjson writes."""


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_COUNT


def _drop_bad_capture_fields(reply: dict[str, Any], choice: dict[str, Any]) -> list[Finding]:
    """FATAL findings for capture fields that are not of their type, each dropped from the reply
    (ids that are a list of something else are `parse_capture`'s to report)."""
    out = []
    for where, fields, key, code in (
        ("", reply, "prompt_token_ids", "bad_prompt_ids"),
        ("choices[0].", choice, "prompt_token_ids", "bad_prompt_ids"),
        ("choices[0].", choice, "token_ids", "bad_sampled_ids"),
    ):
        ids = fields.get(key)
        if ids is not None and type(ids) is not list and not isinstance(ids, np.ndarray):
            del fields[key]
            out.append(
                Finding.fatal(
                    code,
                    f"`{where}{key}` is {shown(ids)}, not a list of token "
                    "ids: dropped, so the turn is context only",
                )
            )
    fault = _logprobs_fault(choice.get("logprobs"))
    if fault is not None:
        choice["logprobs"] = None
        out.append(
            Finding.fatal("bad_logprobs", f"{fault}: the logprobs are dropped, so the turn is context only")
        )
    return out


def _logprobs_fault(logprobs: Any) -> str | None:
    """What in `choices[0].logprobs` is not as vLLM writes it (None when all is): an object whose
    `content` is null or a list of entries (`_entry_fault`)."""
    if logprobs is None:
        return None
    if type(logprobs) is not dict:
        return f"`choices[0].logprobs` is {shown(logprobs)}, not an object"
    for key, value in logprobs.items():
        if key != "content" and not isinstance(value, _SCALARS):
            return f"`choices[0].logprobs.{key}` is {shown(value)}"
    content = logprobs.get("content")
    if content is None:
        return None
    if type(content) is not list:
        return f"`choices[0].logprobs.content` is {shown(content)}, not a list"
    for i, entry in enumerate(content):
        # Once per sampled token, so the entry vLLM writes (all four fields, of exactly these
        # types: then no other field can be there) is passed by a few exact type checks; any
        # other entry is looked at field by field.
        if type(entry) is dict and len(entry) == 4:
            token, raw, top = entry.get("token"), entry.get("bytes"), entry.get("top_logprobs")
            if (
                type(token) is str
                and type(entry.get("logprob")) is float
                and type(top) is list
                and _is_bytes(raw)
                and (not top or _alternatives_fit(top))
            ):
                continue
        if (fault := _entry_fault(entry, alternatives=True)) is not None:
            return f"`choices[0].logprobs.content[{i}]{fault}"
    return None


def _alternatives_fit(top: list[Any]) -> bool:
    """Whether a sampled token's alternatives are each exactly as vLLM writes them."""
    for alt in top:
        if not (
            type(alt) is dict
            and len(alt) == 3
            and type(alt.get("token")) is str
            and type(alt.get("logprob")) is float
            and _is_bytes(alt.get("bytes"))
        ):
            return False
    return True


def _entry_fault(entry: Any, *, alternatives: bool) -> str | None:
    """What in one logprob entry is not of its type: `token` a string, `logprob` a number or
    null, `bytes` a list of byte values or null (in a `token_id:N` entry, not null: they are its
    text), `top_logprobs` (of a sampled token) a list of such entries or null, anything else a plain
    value. The whole rule, for an entry the fast path of `_logprobs_fault` did not pass."""
    if type(entry) is not dict:
        return f"` is {shown(entry)}, not an object"
    token, logprob, raw = entry.get("token"), entry.get("logprob"), entry.get("bytes")
    if token is not None and type(token) is not str:
        return f".token` is {shown(token)}, not a string"
    if logprob is not None and type(logprob) is not float and type(logprob) is not int:
        return f".logprob` is {shown(logprob)}, not a number"
    if (raw is not None or (type(token) is str and token.startswith("token_id:"))) and not _is_bytes(raw):
        # Passed on to Responses callers, and the token's text where it is in `token_id:N` form.
        return f".bytes` is {shown(raw)}, not the byte values of the token's text"
    top = entry.get("top_logprobs")
    if top is not None and alternatives:
        if type(top) is not list:
            return f".top_logprobs` is {shown(top)}, not a list"
        for j, alt in enumerate(top):
            if (fault := _entry_fault(alt, alternatives=False)) is not None:
                return f".top_logprobs[{j}]{fault}"
    for key, value in entry.items():
        if (key not in _ENTRY_KEYS or (key == "top_logprobs" and not alternatives)) and not isinstance(
            value, _SCALARS
        ):
            return f".{key}` is {shown(value)}"
    return None


def _is_bytes(value: Any) -> bool:
    """Whether `value` is a list of byte values (ints 0-255), as vLLM writes a token's bytes."""
    if type(value) is not list:
        return False
    try:
        bytes(value)
    except (TypeError, ValueError):
        return False
    return True


__all__ = ["MAX_REPLY_DEPTH", "CheckedReply", "check_reply"]
