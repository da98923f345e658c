"""JSON mode (structured output) per call role.

Agents ask for structured output only on side calls: gemini-cli's model router and loop detection
(`responseJsonSchema`), title or classification calls (`response_format`, `text.format`). The rule:
**a call that asks for structured output is an auxiliary call** — recorded with role `auxiliary`,
never trained on — so it may be constrained: it is sent to the engine with its `response_format`
(vLLM honours it with guided decoding) even in a training session, where an agent turn's format
would be refused (a constrained turn's logprobs are not the policy's). A trained agent turn is
never constrained.

An engine that ignores the format (the embedded engine does) can answer prose, and an agent
waiting for JSON then retries for minutes (gemini-cli: ~2 minutes on its router call). So the
agent gets JSON either way: the engine's reply when it parses (or the first JSON object inside
it), else the smallest value the schema accepts, with a finding. The capture keeps what the engine
really sampled.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from tapdeck.schema.findings import Finding

JSON_TYPES = ("json_object", "json_schema")


def json_format(chat: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The call's structured-output `response_format`, or None for free text."""
    fmt = chat.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") in JSON_TYPES:
        return fmt
    return None


def schema_of(fmt: Mapping[str, Any]) -> Mapping[str, Any]:
    """The JSON schema of a `json_schema` format (`{}` for `json_object`)."""
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    return schema if isinstance(schema, Mapping) else {}


def minimal_instance(schema: Any) -> Any:
    """The smallest value `schema` accepts: required properties only, "" / 0 / false / [] / the
    first enum value. Schema type names may be upper-case (Google's)."""
    if not isinstance(schema, Mapping):
        return {}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return minimal_instance(schema[key][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if str(k).lower() != "null"), "null")
    kind = str(kind or "object").lower()
    if kind == "object":
        declared, listed = schema.get("properties"), schema.get("required")
        properties: Mapping[str, Any] = declared if isinstance(declared, Mapping) else {}
        required: list[Any] = listed if isinstance(listed, list) else list(properties)
        return {name: minimal_instance(properties.get(name, {})) for name in required}
    return {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "null": None}.get(
        kind, {}
    )


def _first_json(text: str) -> Any:
    """The reply as JSON, or the first JSON object or array inside it (small models wrap JSON in
    prose or code fences); raises ValueError when there is none."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    for start, char in enumerate(text):
        if char in "{[":
            try:
                return decoder.raw_decode(text, start)[0]
            except ValueError:
                continue
    raise ValueError("no JSON value in the reply")


def _fits(value: Any, schema: Mapping[str, Any]) -> bool:
    """A shallow check: an object schema's value is an object holding its required properties."""
    kind = str(schema.get("type") or "").lower()
    if kind == "object" or (not kind and "properties" in schema):
        listed = schema.get("required")
        required: list[Any] = listed if isinstance(listed, list) else []
        return isinstance(value, dict) and all(name in value for name in required)
    return True


def answer_as_json(reply: dict[str, Any], fmt: Mapping[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    """The reply the agent gets for a structured-output call, and what changed as findings.

    A reply with tool calls, or whose text already is JSON that fits, goes back unchanged."""
    choice = (reply.get("choices") or [{}])[0] or {}
    message = choice.get("message") or {}
    if message.get("tool_calls"):
        return reply, []
    text = message.get("content") or ""
    schema = schema_of(fmt)
    try:
        value = _first_json(text)
        fits = _fits(value, schema)
    except ValueError:
        value, fits = None, False
    if fits and json.dumps(value, ensure_ascii=False) == text.strip():
        return reply, []
    if fits:
        answer = json.dumps(value, ensure_ascii=False)
        finding = Finding.info(
            "json_extracted", "the engine wrapped its JSON answer in other text; the agent got the JSON alone"
        )
    else:
        answer = json.dumps(minimal_instance(schema), ensure_ascii=False)
        finding = Finding.warn(
            "json_mode_unmet",
            f"the engine ignored the requested {fmt.get('type')} format (its reply "
            f"is not JSON that fits); the agent got the smallest value the schema "
            f"accepts, {answer}; the capture keeps the engine's text",
        )
    fixed = copy.deepcopy(reply)
    fixed_choice = fixed["choices"][0]
    fixed_choice["message"] = {**(fixed_choice.get("message") or {}), "content": answer}
    if fixed_choice.get("finish_reason") == "length":
        fixed_choice["finish_reason"] = "stop"
    return fixed, [finding]


__all__ = ["answer_as_json", "json_format", "minimal_instance", "schema_of"]
