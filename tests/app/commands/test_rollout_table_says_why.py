"""`tapdeck rollout`'s table names each failure's kind; under it, one line per distinct error says
why, after the task(s) it ended, so a refused setting or a sandbox that would not start is read
without opening results.jsonl."""

from __future__ import annotations

import pytest

from tapdeck.app.commands.run_table import ERROR_LINE_CHARS, print_run_table
from tapdeck.schema.runs import RolloutResult, RunDetail, RunPlan

DOES_NOT_FIT = "setting context_tokens: 99999 is more than the engine's context of 32768 tokens"
NO_DOCKER = "RuntimeError during sandbox: Cannot connect to the Docker daemon at unix:///var/run/docker.sock."


def _run(*rollouts: tuple[str, str | None, str | None]) -> RunDetail:
    """An ended run of (task, error kind, error) rollouts; no error kind = ok."""
    results = [
        RolloutResult(
            rollout_id=f"run-1.g{i:03d}r00",
            run_id="run-1",
            task=task,
            group=i,
            ok=kind is None,
            error_kind=kind,
            error=error,
            phase="done" if kind is None else "failed",
            finished_at=1.0,
        )
        for i, (task, kind, error) in enumerate(rollouts)
    ]
    return RunDetail(id="run-1", state="finished", plan=RunPlan(), created_at=0.0, rollouts=results)


def _printed(
    doc: RunDetail, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    monkeypatch.setenv("COLUMNS", "80")
    print_run_table(doc)
    return capsys.readouterr().out.splitlines()


def _reasons(lines: list[str], rollouts: int) -> list[str]:
    """The lines between the table (a header and a row per rollout) and the run's summary."""
    assert lines[0].startswith("task ")
    end = next(i for i, line in enumerate(lines) if line.startswith("run run-1 "))
    return lines[1 + rollouts : end]


def test_the_table_is_followed_by_each_failed_rollouts_reason_naming_its_task(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = _printed(
        _run(("hello-file", "settings_do_not_fit", DOES_NOT_FIT), ("fix-perms", None, None)),
        capsys,
        monkeypatch,
    )
    assert "settings_do_not_fit" in lines[1]
    # The ok rollout has no reason to give.
    assert _reasons(lines, 2) == [f"hello-file: {DOES_NOT_FIT}"]


def test_one_error_of_several_tasks_is_said_once_naming_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = _printed(
        _run(
            *[(f"task-{i}", "sandbox_failed", NO_DOCKER) for i in range(5)],
            ("task-5", "timeout", "the rollout exceeded its 300 s limit"),
        ),
        capsys,
        monkeypatch,
    )
    assert _reasons(lines, 6) == [
        f"task-0, task-1, task-2 and 2 more: {NO_DOCKER}",
        "task-5: the rollout exceeded its 300 s limit",
    ]


def test_a_long_error_keeps_its_first_line_cut_to_two_terminal_rows(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    long = "RuntimeError: " + "x" * 400 + "\nTraceback (most recent call last):"
    [said] = _reasons(_printed(_run(("hello-file", "internal", long)), capsys, monkeypatch), 1)
    assert len(said) == ERROR_LINE_CHARS == 160 and said.endswith("x…")
