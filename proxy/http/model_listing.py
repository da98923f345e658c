"""The models routes: a session serves one model, described in the shape the asking SDK reads.

- OpenAI, `GET /v1/models` and `/v1/models/{id}`: `{"object": "list", "data": [model]}`, a model
  being `{"id", "object": "model", "created", "owned_by"}`;
- Anthropic, on the same paths (its SDKs send `anthropic-version`): a page `{"data", "has_more",
  "first_id", "last_id"}`, a model being `{"type": "model", "id", "display_name", "created_at"}`;
- Google, `GET /v1beta/models` and `/v1beta/models/{model}`: `{"models": [model]}`, a model being
  `{"name": "models/{id}", "displayName", "supportedGenerationMethods"}`.

A model id the session does not serve is a 404 in the asker's error envelope, naming the one it does.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from tapdeck.proxy.dialects.base import Dialect
from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.http.call_reply import CallReply
from tapdeck.proxy.http.error_reply import render_error

OWNER = "tapdeck"
GOOGLE_METHODS = ["generateContent", "streamGenerateContent", "countTokens"]
"""The Google methods tapdeck answers for a session's model."""


class ServedModel(BaseModel):
    """The one model a session serves."""

    id: str
    """The engine's served name, as calls' replies report it."""
    created: float
    """When the session was opened (epoch seconds)."""


def _openai(model: ServedModel) -> dict[str, Any]:
    return {"id": model.id, "object": "model", "created": int(model.created), "owned_by": OWNER}


def _anthropic(model: ServedModel) -> dict[str, Any]:
    created = datetime.fromtimestamp(model.created, UTC).isoformat(timespec="seconds")
    return {
        "type": "model",
        "id": model.id,
        "display_name": model.id,
        "created_at": created.replace("+00:00", "Z"),
    }


def _google(model: ServedModel) -> dict[str, Any]:
    return {
        "name": f"models/{model.id}",
        "displayName": model.id,
        "supportedGenerationMethods": GOOGLE_METHODS,
    }


def _entry(dialect: Dialect, model: ServedModel) -> dict[str, Any]:
    if dialect.name == "anthropic":
        return _anthropic(model)
    if dialect.name == "google":
        return _google(model)
    return _openai(model)


def listing(dialect: Dialect, model: ServedModel) -> CallReply:
    """The models list, holding the session's model, in `dialect`'s SDK's shape."""
    entry = _entry(dialect, model)
    if dialect.name == "anthropic":
        body = {"data": [entry], "has_more": False, "first_id": model.id, "last_id": model.id}
    elif dialect.name == "google":
        body = {"models": [entry]}
    else:
        body = {"object": "list", "data": [entry]}
    return CallReply(body=body)


def lookup(dialect: Dialect, model: ServedModel, asked: str) -> CallReply:
    """The model `asked` for in `dialect`'s SDK's shape, or a 404 in its envelope naming the
    session's model."""
    if asked != model.id:
        return render_error(
            dialect,
            ProxyError(404, f"model {asked!r} is not served here: this session's model is {model.id!r}"),
        )
    return CallReply(body=_entry(dialect, model))


__all__ = ["ServedModel", "listing", "lookup"]
