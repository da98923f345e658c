"""`tapdeck exec`'s refusals before any sandbox is reached: an id that is no rollout's, no server,
a server that does not answer. A real rollout's sandbox is driven in
tests/runner/test_rollout_sandbox.py."""

from __future__ import annotations

from typer.testing import CliRunner

from tapdeck.app.cli import app
from tapdeck.app.exit_codes import EXIT_COULD_NOT_RUN, EXIT_USAGE


def test_exec_refuses_an_id_that_is_no_rollouts_and_a_missing_server_as_bad_usage() -> None:
    not_rollout = CliRunner().invoke(app, ["exec", "run-1", "--server", "http://127.0.0.1:9", "--", "ls"])
    assert not_rollout.exit_code == EXIT_USAGE
    assert "'run-1' is not a rollout id" in not_rollout.stderr
    no_server = CliRunner().invoke(app, ["exec", "run-1.g000r00", "--", "ls"])
    assert no_server.exit_code == EXIT_USAGE
    assert "--server URL is needed" in no_server.stderr


def test_exec_on_a_server_that_does_not_answer_exits_1_saying_so() -> None:
    result = CliRunner().invoke(
        app, ["exec", "run-1.g000r00", "--server", "http://127.0.0.1:9", "--admin-key", "k", "--", "ls"]
    )
    assert result.exit_code == EXIT_COULD_NOT_RUN
    assert result.stderr.startswith("tapdeck exec: tapdeck server at http://127.0.0.1:9 is not reachable")
