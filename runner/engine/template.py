"""Chat prompt rendering with the model's own template (`tokenizer.chat_template` in the GGUF).

The template is rendered with jinja2 the way Hugging Face tokenizers do (sandboxed, `trim_blocks`,
`lstrip_blocks`, `raise_exception`, `tojson`). SmolLM2's ChatML template knows nothing of tools, so
tool traffic is first rewritten into plain messages, Hermes style (see `proxy/upstream/toolcalls.py`):

* `tools` → appended to the system prompt as a `<tools>` block, one JSON tool schema per line, plus
  how to call them. Without a system message a system message holding only that block is added
  (the template's default system prompt is then not inserted).
* assistant `tool_calls` → `<tool_call>` blocks after the assistant's content.
* `tool` messages → a `user` turn whose content is `<tool_response>\\n...\\n</tool_response>`.

Content given as a list of parts keeps its text parts joined by newlines.
"""

from __future__ import annotations

import json
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tapdeck.proxy.upstream.toolcalls import render_tool_calls

TOOLS_PREAMBLE = (
    "# Tools\n\n"
    "You can call functions to help with the user's request. Their signatures are listed inside "
    "<tools></tools> tags:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a function, answer with one block per call, each holding a JSON object with the "
    "function name and its arguments:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <arguments-object>}}\n</tool_call>'
)


class TemplateError(ValueError):
    """The messages could not be rendered (bad role/content, or the template raised)."""


def _raise(message: str) -> None:
    raise TemplateError(message)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise TemplateError(f"content part of type {kind!r} is not supported by this text-only model")
        return "\n".join(parts)
    raise TemplateError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def tools_block(tools: list[dict[str, Any]]) -> str:
    """The system-prompt section that lists the tools."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return TOOLS_PREAMBLE.format(tools=lines)


def plain_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[dict[str, str]]:
    """Rewrite chat messages (with tool traffic) into `{role, content}` strings for the template."""
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise TemplateError(f"messages[{i}] must be an object with a string `role`")
        role = m["role"]
        text = _text(m.get("content"))
        if role == "developer":
            role = "system"
        if role == "assistant" and m.get("tool_calls"):
            text = render_tool_calls(text, m["tool_calls"])
        elif role == "tool":
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        out.append({"role": role, "content": text})
    if tools:
        block = tools_block(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


class ChatTemplate:
    """A compiled chat template."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        self._bos_token, self._eos_token = bos_token, eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the model's chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """The prompt text for `messages` (ending with the assistant header when asked)."""
        try:
            return self._template.render(
                messages=plain_messages(messages, tools),
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
                **extra,
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc


def turn_end_ids(template: ChatTemplate | None, model: Any) -> list[int]:
    """The control token the template closes an assistant turn with (`<|im_end|>` in ChatML,
    `<end_of_turn>` in Gemma's), found by rendering one; empty when it closes with none."""
    if template is None:
        return []
    marker = "tapdeck-turn-end-probe"
    try:
        text = template.render(
            [{"role": "user", "content": "u"}, {"role": "assistant", "content": marker}],
            add_generation_prompt=False,
        )
    except TemplateError:
        return []
    after = model.tokenize(text[text.rindex(marker) + len(marker) :]) if marker in text else []
    return after[:1] if after and model.special[after[0]] else []
