"""Wire dialects: each translates its requests to chat-completions and replies back.

Registry: `DIALECTS` (first match wins) and `detect(path)`. A dialect module defines one
module-level instance named `DIALECT`; registering it is adding its module name to
`DIALECT_MODULES`.

The modules are imported on first use, not when this package is imported: dialect modules import
the engine client, which imports `dialects.base`, and an eager import here would close that cycle.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from tapdeck.proxy.dialects.base import Dialect

DIALECT_MODULES: tuple[str, ...] = ("chat", "responses", "anthropic", "google")
"""In detection order."""


@cache
def _registry() -> tuple[Dialect, ...]:
    return tuple(importlib.import_module(f"{__name__}.{name}").DIALECT for name in DIALECT_MODULES)


def detect(path: str) -> Dialect | None:
    """The dialect a model-call path belongs to (case-insensitive), or None."""
    for dialect in _registry():
        if dialect.matches(path):
            return dialect
    return None


def __getattr__(name: str) -> Any:
    if name == "DIALECTS":
        return list(_registry())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
