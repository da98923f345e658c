"""What the runner uses of the capture service, as a `typing.Protocol`.

The runner holds the server's `CaptureService` (proxy/service.py) or, on its own loop,
`runner_loop.ServiceOnItsLoop` wrapping it; rollouts open, annotate and close capture sessions on
it and read their findings and exports, batches publish progress on its event bus, and the routes
give recipes its public URL. Tests check that the real service has every member named here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # names for the annotations only: importing this module imports no store
    from tapdeck.proxy.http.events import EventBus
    from tapdeck.proxy.sessions.spec import SessionSpec
    from tapdeck.proxy.store.database import Store
    from tapdeck.schema.findings import Finding
    from tapdeck.schema.sessions import SessionInfo, SessionSummary


@runtime_checkable
class CaptureServiceProtocol(Protocol):
    """The capture service's members the runner calls (see the module's docstring for whom)."""

    public_url: str
    """Where recipes and sandboxes reach the server."""
    store: Store
    """The capture store, to check that a run's sessions are in it before exporting the run."""
    events: EventBus
    """The admin event bus: run and rollout progress."""

    async def open_session(self, spec: SessionSpec) -> SessionInfo: ...

    async def close_session(self, session_id: str) -> SessionSummary: ...

    def annotate(self, session_id: str, **metadata: Any) -> SessionSummary: ...

    def limit_output(self, session_id: str, tokens: int) -> None: ...

    def mark_auxiliary(self, session_id: str, seqs: Iterable[int], reason: str) -> None: ...

    def get(self, session_id: str) -> SessionSummary: ...

    def findings(self, session_id: str) -> list[Finding]: ...

    def rollout_document(self, session_id: str, *, lists: bool = True) -> dict[str, Any]: ...

    def training_trace(self, session_id: str, *, lists: bool = True) -> dict[str, Any]: ...


__all__ = ["CaptureServiceProtocol"]
