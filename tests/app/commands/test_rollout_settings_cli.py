"""The rollout settings on the command line: defaults in `tapdeck rollout --help` and `tapdeck info`,
bad values refused with the field named (exit 2), against a real server whose engine serves the
recorded vLLM bodies (`max_model_len` 2048)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.schema.rollout_health import DEFAULT_MIN_LOSS_MASK_FRACTION
from tests.support.local_server import local_server_on

WIDE = {"COLUMNS": "200", "TERMINAL_WIDTH": "200"}


@pytest.fixture
def recorded_engine() -> Iterator[Any]:
    """A loopback engine answering with the recorded vLLM bodies."""
    from tests.support.fake_vllm import FakeVllm

    with FakeVllm() as up:
        yield up


def test_rollout_help_shows_every_setting_and_its_default() -> None:
    result = CliRunner().invoke(app, ["rollout", "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for flag in (
        "--agent-timeout",
        "--max-turns",
        "--max-output-tokens",
        "--context-tokens",
        "--temperature",
        "--top-p",
        "--top-k",
        "--min-p",
        "--harness-kwargs",
        "--timeout",
        "--min-loss-mask-fraction",
    ):
        assert flag in text
    for default in (
        "default: the task's agent.timeout_sec in task.toml",
        "(default 3)",
        "on a served model none of tapdeck's, the harness's own request",
        "default 300",
        "default: the engine's max_model_len",
        "lean on the embedded engine",
        f"(default {DEFAULT_MIN_LOSS_MASK_FRACTION:g}; one call or no trainable token is degenerate too)",
    ):
        assert default in text, default
    # Each harness's own values on the embedded engine, from the one table.
    from tapdeck.runner.rollout_settings import harness_defaults

    unwrapped = text.replace("- ", "-")  # a name wrapped at its hyphen
    for row in harness_defaults():
        assert f"{row.harness} {row.agent_timeout_s:g} s" in unwrapped
        assert f"{row.harness} {row.output_tokens}" in unwrapped
    refused = CliRunner().invoke(app, ["rollout", "--min-loss-mask-fraction", "1.5"], env=WIDE)
    assert refused.exit_code == 2 and "--min-loss-mask-fraction" in refused.output


def test_harness_kwargs_that_are_not_a_json_object_are_refused_before_anything_runs() -> None:
    result = CliRunner().invoke(
        app, ["rollout", "--harness-kwargs", "[1]", "--server", "http://127.0.0.1:9"], env=WIDE
    )
    assert result.exit_code == 2 and "--harness-kwargs" in result.output
    assert "must be a JSON object" in result.output


def test_sandbox_kwargs_that_are_not_a_json_object_are_refused_before_anything_runs() -> None:
    result = CliRunner().invoke(
        app, ["rollout", "--sandbox-kwargs", "host", "--server", "http://127.0.0.1:9"], env=WIDE
    )
    assert result.exit_code == 2 and "--sandbox-kwargs" in result.output and "not JSON" in result.output


def test_a_docker_network_that_is_no_choice_is_refused_by_the_server_naming_the_choices(
    recorded_engine: Any, tmp_path: Path
) -> None:
    with local_server_on(recorded_engine, tmp_path) as server:
        argv = ["rollout", "--server", server.url, "--admin-key", server.admin_key, "--sandbox", "docker"]
        result = CliRunner().invoke(app, [*argv, "--sandbox-kwargs", '{"network": "public"}'], env=WIDE)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "network must be one of auto, none, host, bridge, not 'public'" in text, text
    assert not list(tmp_path.glob("runs/*"))


def test_a_bad_setting_is_refused_by_the_server_with_the_field_named(
    recorded_engine: Any, tmp_path: Path
) -> None:
    with local_server_on(recorded_engine, tmp_path) as server:
        result = CliRunner().invoke(
            app,
            [
                "rollout",
                "--server",
                server.url,
                "--admin-key",
                server.admin_key,
                "--max-turns",
                "0",
                "--top-p",
                "3",
            ],
            env=WIDE,
        )
    assert result.exit_code == 2, result.output
    assert "settings.max_turns: Input should be greater than or equal to 1" in result.output
    assert "settings.top_p: Input should be less than or equal to 1" in result.output
    assert not list(tmp_path.glob("runs/*"))  # refused before a run directory was written


def test_info_shows_the_engines_context_and_the_settings_defaults(recorded_engine: Any) -> None:
    result = CliRunner().invoke(app, ["info", "--no-probe", "--engine", recorded_engine.base_url], env=WIDE)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if recorded_engine.base_url in line)
    assert "2048" in row  # vLLM's max_model_len
    assert "Rollout settings (defaults)" in result.output
    assert "served model: none of tapdeck's (the harness's own request" in result.output
    assert "the task's [agent].timeout_sec" in result.output
    # The per-harness table: codex's lean tools, its output limit and its least agent timeout.
    from tapdeck.runner.rollout_settings import harness_defaults

    codex = next(r for r in harness_defaults() if r.harness == "codex")
    line = [line for line in result.output.splitlines() if "│codex" in line][-1]
    assert "lean" in line and "fatal" in line and f"{codex.output_tokens}" in line
    assert f"≥ {codex.agent_timeout_s:g} s" in line
