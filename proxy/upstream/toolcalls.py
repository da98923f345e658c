"""Tool-call parsers: how an engine's chat route turns sampled text into tool calls, shared by the
embedded engine (its chat route) and the proxy's token-in mode (which samples on the completions
route and must hand the harness the same tool calls the chat route would have).

An engine names its parser the way vLLM does (`--tool-call-parser hermes`); `TOOL_PARSERS` holds
the ones tapdeck implements. Only `hermes` so far, the format the embedded engine speaks:

Hermes-style tool calls: the text format the engine renders into prompts and parses out of replies.

A tool call in an assistant turn is written, one block per call, as::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Blocks are separated by a single newline and follow the assistant's free text verbatim. Parsing a
reply (like vLLM's `hermes` tool parser): when it holds a `<tool_call>` tag, the content is the text
before the first tag (None when empty) and each block's JSON gives `function.name` and
`function.arguments` (the arguments object re-serialised as a JSON string with `json.dumps`, non-ASCII
kept). An unclosed last block is read to the end of the text. Any block that is not valid JSON with a
`name` and `arguments` makes the whole reply plain content, as vLLM does.

`render_tool_calls` is the inverse: a reply written in the canonical layout above (json.dumps
separators, `\\n` around the JSON, `\\n` between blocks, nothing after the last block) renders back
to exactly the text the model produced, so the token-prefix property across turns holds. A reply in
any other layout (extra spaces, other key order) re-renders differently: that is a re-tokenisation
the capture graph records, not something the engine can hide.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

START, END = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into free text and tool calls (OpenAI wire dicts)."""

    content: str | None
    tool_calls: list[dict[str, Any]]


def new_call_id() -> str:
    """An id shaped like vLLM 0.32's (`chatcmpl-tool-<16 hex>`, as recorded)."""
    return f"chatcmpl-tool-{secrets.token_hex(8)}"


def parse_tool_calls(text: str) -> ParsedReply:
    """Split a model reply into content and tool calls; no valid block → all content."""
    if START not in text:
        return ParsedReply(text, [])
    calls: list[dict[str, Any]] = []
    for closed, tail in _BLOCK.findall(text):
        try:
            obj = json.loads(closed or tail)
            name, args = obj["name"], obj["arguments"]
        except (ValueError, KeyError, TypeError, AttributeError):
            return ParsedReply(text, [])
        if not isinstance(name, str):
            return ParsedReply(text, [])
        calls.append(
            {
                "id": new_call_id(),
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
        )
    if not calls:
        return ParsedReply(text, [])
    content = text[: text.find(START)]
    return ParsedReply(content or None, calls)


def render_tool_call(name: str, arguments: str | dict[str, Any] | None) -> str:
    """One `<tool_call>` block; `arguments` (a JSON string as on the wire) is inserted verbatim."""
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    args = arguments if arguments and arguments.strip() else "{}"
    return f'{START}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {args}}}\n{END}'


def render_tool_calls(content: str | None, tool_calls: list[dict[str, Any]]) -> str:
    """An assistant turn's text: its content followed by its tool-call blocks."""
    blocks = [render_tool_call(c["function"]["name"], c["function"].get("arguments")) for c in tool_calls]
    return (content or "") + "\n".join(blocks)


@dataclass(frozen=True)
class ToolParser:
    """A named parser as an engine's chat route applies it to a reply when tools are offered."""

    name: str
    parse: Callable[[str], ParsedReply]
    keeps_special_tokens: bool
    """vLLM's `adjust_request`: while parsing, the reply is decoded with `skip_special_tokens`
    false (the call tags are special tokens in some vocabularies)."""


TOOL_PARSERS = {"hermes": ToolParser("hermes", parse_tool_calls, keeps_special_tokens=True)}
"""Parsers by the name an engine's `--tool-call-parser` gives them."""
EMBEDDED_TOOL_PARSER = "hermes"
"""The parser the embedded engine's chat route applies."""


def parses_tools(body: Mapping[str, Any]) -> bool:
    """Whether a chat route with a tool parser parses this request's reply: tools are offered and
    `tool_choice` is not "none" (vLLM's rule, also for its `adjust_request`)."""
    return bool(body.get("tools")) and body.get("tool_choice") != "none"
