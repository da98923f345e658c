"""`tapdeck info` reports the embedded engine another tapdeck process runs (announced in the engine
registry), probed, instead of "not started" with no tier."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app


def test_info_reports_the_running_embedded_engine_with_its_tier(
    embedded_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tapdeck.runner.engine.registry import REGISTRY_ENV, Announcement

    # Announced as a server announces the engine it starts (this process owns the test engine).
    monkeypatch.setenv(REGISTRY_ENV, str(tmp_path / "registry"))
    (tmp_path / "registry").mkdir()
    (tmp_path / "registry" / "embedded.json").write_text(
        Announcement(
            pid=os.getpid(),
            base_url=embedded_engine.base_url,
            served_name=embedded_engine.served_name,
            model_path=str(embedded_engine.core.model.path.resolve()),
            n_ctx=embedded_engine.core.model.n_ctx,
            started_at=time.time(),
        ).model_dump_json()
    )

    result = CliRunner().invoke(app, ["info", "--json"])
    assert result.exit_code == 0, result.output
    engines = json.loads(result.output)["engines"]
    [row] = [e for e in engines if e["name"] == "embedded"]
    assert row["url"] == embedded_engine.base_url and row["tier"] == "tokens"
    assert row["why"].startswith(f"running (process {os.getpid()}, shared by every tapdeck here)")
    assert "not started" not in row["why"]


def test_info_without_a_running_engine_says_it_is_not_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("llama_cpp", reason="the embedded engine needs llama-cpp-python")
    from tapdeck.runner.engine.registry import REGISTRY_ENV

    monkeypatch.setenv(REGISTRY_ENV, str(tmp_path / "registry"))
    result = CliRunner().invoke(app, ["info", "--json", "--no-probe"])
    assert result.exit_code == 0, result.output
    [row] = [e for e in json.loads(result.output)["engines"] if e["name"] == "embedded"]
    assert row["tier"] is None and "not started" in row["why"]
