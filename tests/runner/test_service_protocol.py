"""The capture service has every member the runner uses of it (runner/service_protocol.py), with
the same signatures, and so has the runner loop's wrapper of it."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

from tapdeck.proxy.service import CaptureService
from tapdeck.proxy.store.database import Store
from tapdeck.runner.runner_loop import ServiceOnItsLoop
from tapdeck.runner.service_protocol import CaptureServiceProtocol

METHODS = [
    name
    for name, member in vars(CaptureServiceProtocol).items()
    if inspect.isfunction(member) and not name.startswith("_")
]
MEMBERS = [*CaptureServiceProtocol.__annotations__, *METHODS]


def test_the_capture_service_is_what_the_runner_takes_it_for(tmp_path: Path) -> None:
    service: CaptureServiceProtocol = CaptureService(
        Store(tmp_path / "capture.db"), default_engine=None, public_url="http://127.0.0.1:9"
    )
    assert isinstance(service, CaptureServiceProtocol)
    assert len(METHODS) >= 9
    for name in METHODS:
        # The service spells list[X] `builtins.list[X]`: it has a method named `list`.
        assert str(inspect.signature(getattr(CaptureService, name))).replace("builtins.", "") == str(
            inspect.signature(getattr(CaptureServiceProtocol, name))
        ), name
        assert inspect.iscoroutinefunction(getattr(CaptureService, name)) == inspect.iscoroutinefunction(
            getattr(CaptureServiceProtocol, name)
        ), name
    # The wrapper forwards through __getattr__, which isinstance does not look at (getattr_static).
    loop = asyncio.new_event_loop()
    on_its_loop: CaptureServiceProtocol = ServiceOnItsLoop(service, loop)
    assert all(hasattr(on_its_loop, name) for name in MEMBERS)
    loop.close()
