"""Errors shaped like vLLM's: `{"error": {"message", "type", "param", "code"}}` with vLLM's statuses.

Request-validation failures use vLLM's "Bad Request" type and its rendering of pydantic errors
(`1 validation error:\\n  {...}` with the input summarised), invalid JSON included (400, not 422).
"""

from __future__ import annotations

from typing import Any


class EngineHTTPError(Exception):
    """An error to answer with a vLLM-shaped body."""

    def __init__(
        self, status: int, message: str, *, type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {
            "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}
        }


def bad_param(message: str, param: str, value: Any = None, *, with_value: bool = False) -> EngineHTTPError:
    """A 400 BadRequestError naming the parameter the way vLLM's messages do."""
    suffix = f"(parameter={param}, value={value})" if with_value else f"(parameter={param})"
    return EngineHTTPError(400, f"{message} {suffix}", param=param)


def model_not_found(requested: str, served: list[str]) -> EngineHTTPError:
    """404 for a model name the engine does not serve."""
    return EngineHTTPError(
        404,
        f"The model `{requested}` does not exist. Valid aliases: {', '.join(served)}.",
        type="NotFoundError",
        param="model",
    )


def context_exceeded(max_model_len: int, prompt_len: int) -> EngineHTTPError:
    """400 with the "maximum context length" wording clients (Harbor) map to context overflow."""
    return bad_param(
        f"This model's maximum context length is {max_model_len} tokens. However, "
        f"your prompt contains at least {prompt_len} input tokens, which exceeds this "
        "limit even without any output tokens. Please reduce the length of the input "
        "prompt.",
        "input_tokens",
        prompt_len,
        with_value=True,
    )


def _summarise(value: Any) -> Any:
    if isinstance(value, dict):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list):
        return f"<list of {len(value)} items>"
    return value


def validation_error(errors: list[dict[str, Any]]) -> EngineHTTPError:
    """vLLM's rendering of request-validation errors (pydantic `errors()` with loc from the body)."""
    rendered = []
    for e in errors:
        item: dict[str, Any] = {
            "type": e["type"],
            "loc": ".".join(str(p) for p in e["loc"]),
            "msg": e["msg"],
            "input": _summarise(e.get("input")),
        }
        if e.get("ctx"):
            item["ctx"] = {k: str(v) for k, v in e["ctx"].items()}
        rendered.append(item)
    count = len(rendered)
    lines = "\n".join(f"  {item!r}" for item in rendered)
    plural = "error" if count == 1 else "errors"
    return EngineHTTPError(
        400,
        f"{count} validation {plural}:\n{lines}",
        type="Bad Request",
        param=rendered[0]["loc"] if rendered else None,
    )


def invalid_json(pos: int, reason: str) -> EngineHTTPError:
    """400 for a body that is not JSON (vLLM reports pydantic's json_invalid, loc = body.<offset>)."""
    return validation_error(
        [
            {
                "type": "json_invalid",
                "loc": ("body", pos),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": reason},
            }
        ]
    )
