"""`--engine-model` naming a model the engine does not serve is refused up front (exit 2), naming
the models it does serve: `serve` and a local `rollout` when they settle the engine, a server when
a run plan names the model. Accepted, every call would fail later as a text-tier 502."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.exit_codes import EXIT_USAGE
from tests.support.fake_vllm import models_only_engine
from tests.support.local_server import local_server_on

REFUSAL = "does not serve model 'nosuch'; it serves smollm2 (--engine-model)"


def _runs(data_dir: Path) -> list[Path]:
    runs = data_dir / "runs"
    return list(runs.iterdir()) if runs.is_dir() else []


def test_rollout_refuses_an_engine_model_the_engine_does_not_serve(tmp_path: Path) -> None:
    with models_only_engine() as engine:
        result = CliRunner().invoke(
            app, ["rollout", "--engine", engine, "--engine-model", "nosuch", "--data-dir", str(tmp_path)]
        )
    assert result.exit_code == EXIT_USAGE, result.output
    assert f"the engine at {engine}/v1 {REFUSAL}" in " ".join(result.output.split())
    assert not _runs(tmp_path)


def test_a_server_refuses_a_plan_naming_a_model_its_engine_does_not_serve(tmp_path: Path) -> None:
    with models_only_engine() as url:
        engine = SimpleNamespace(base_url=f"{url}/v1", served_name="smollm2")
        with local_server_on(engine, tmp_path) as server:
            result = CliRunner().invoke(
                app,
                [
                    "rollout",
                    "--server",
                    server.url,
                    "--admin-key",
                    server.admin_key,
                    "--engine-model",
                    "nosuch",
                ],
            )
    assert result.exit_code == EXIT_USAGE, result.output
    assert REFUSAL in " ".join(result.output.split())
    assert not _runs(tmp_path)


@pytest.mark.medium
def test_serve_refuses_an_engine_model_the_engine_does_not_serve(tmp_path: Path) -> None:
    tapdeck = Path(sys.executable).parent / "tapdeck"
    with models_only_engine() as engine:
        done = subprocess.run(
            [
                str(tapdeck),
                "serve",
                "--port",
                "0",
                "--engine",
                engine,
                "--engine-model",
                "nosuch",
                "--data-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 2, done.stderr
    assert f"tapdeck serve: the engine at {engine}/v1 {REFUSAL}" in done.stderr
