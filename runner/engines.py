"""Engine choice → `EngineSpec`: "embedded" (the server's default engine) or the URL of a served model.

A URL is an OpenAI-compatible server: real vLLM gives the `tokens` tier (trainable), anything else is
probed by the proxy and may end at `logprobs` or `text` (eval only). The API key of a URL engine is
only ever handed to the proxy, never to a harness or a sandbox.
"""

from __future__ import annotations

import os

from tapdeck.proxy.upstream.address import EngineAddressError, normalize_address
from tapdeck.proxy.upstream.tiers import EngineSpec

EMBEDDED = "embedded"
API_KEY_ENV = "TAPDECK_ENGINE_API_KEY"
"""Environment variable the runner reads a URL engine's key from when none is passed explicitly."""


class EngineChoiceError(ValueError):
    """An engine choice that cannot be resolved (bad URL, no embedded engine running)."""


def normalize_engine_url(url: str) -> str:
    """`host:port` → `http://host:port`, trailing slash dropped; the path is left as given.

    Which base URL an address without a path means (`/v1` or the root) is settled by the proxy
    when a session opens, by asking the engine (tapdeck.proxy.upstream.address)."""
    try:
        return normalize_address(url)
    except EngineAddressError as exc:
        raise EngineChoiceError(f"{exc}, or --engine embedded") from None


def is_embedded(choice: str | None) -> bool:
    """True when the choice names the embedded engine (the default)."""
    return choice is None or choice.strip().lower() in ("", EMBEDDED, "default")


def resolve_engine(
    choice: str | None,
    *,
    model: str | None = None,
    api_key: str | None = None,
    default: EngineSpec | None = None,
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
) -> EngineSpec:
    """Resolve an engine choice to the spec a capture session names.

    `choice` None/"embedded" → `default` (the server's default engine, the embedded one unless the
    server was started with an engine URL). A URL → a spec for it, with `model` (None = the engine's
    only served model) and `api_key` (None → `$TAPDECK_ENGINE_API_KEY`, else no key).
    `tool_parser` / `reasoning_parser` name the engine's parsers (None: the default engine's own,
    none known for a URL).
    """
    parsers = {
        k: v
        for k, v in (("tool_call_parser", tool_parser), ("reasoning_parser", reasoning_parser))
        if v is not None
    }
    if is_embedded(choice):
        if default is None:
            raise EngineChoiceError(
                "no embedded engine is running on this server; start it with "
                "the engine extra installed, or pass --engine URL"
            )
        if model is None and api_key is None and not parsers:
            return default
        return default.model_copy(
            update={
                "model": model or default.model,
                "api_key": api_key if api_key is not None else default.api_key,
                **parsers,
            }
        )
    assert choice is not None
    key = api_key if api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    return EngineSpec(url=normalize_engine_url(choice), model=model, api_key=key, **parsers)
