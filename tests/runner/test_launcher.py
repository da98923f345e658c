"""The launcher against real subprocesses: streamed output, recorded states, process-group stop."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tapdeck.runner.recipes import Recipe
from tapdeck.runner.training import TrainingRun, list_runs, load_run, strip_ansi
from tests.support.processes import process_gone

SCRIPT = r"""
import os, signal, subprocess, sys, time
mode = sys.argv[1]
print("\x1b[1m\x1b[38;5;208mhello\x1b[0m from recipe", flush=True)
print("TRACKIO_DIR=" + os.environ["TRACKIO_DIR"], flush=True)
sys.stdout.write("progress 10%\rprogress 100%\n"); sys.stdout.flush()
print("to stderr", file=sys.stderr, flush=True)
if mode == "fail":
    sys.exit(3)
if mode == "hang":
    # Ignore SIGTERM here and in a child that shares the process group: only SIGKILL of the group ends both.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    print(f"child {child.pid}", flush=True)
    time.sleep(600)
if mode == "escape":
    # A child in a session of its own keeps the recipe's output open after the group is killed.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             start_new_session=True)
    print(f"child {child.pid}", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def fake_recipe(tmp_path: Path) -> tuple[Recipe, dict[str, str]]:
    """A recipe module on a private PYTHONPATH (launched exactly like the real ones, `python -m`)."""
    pkg = tmp_path / "recipes_src"
    pkg.mkdir()
    (pkg / "fake_recipe.py").write_text(SCRIPT)
    recipe = Recipe(name="fake", module="fake_recipe", summary="test", where="here", updates_weights=False)
    return recipe, {"PYTHONPATH": str(pkg)}


def test_launcher_streams_stripped_lines_and_records_a_finished_run(tmp_path: Path, fake_recipe) -> None:
    recipe, env = fake_recipe
    lines: list[str] = []
    job = TrainingRun(
        recipe, ["ok"], data_dir=tmp_path / "data", run_id="t-1", extra_env=env, on_line=lines.append
    ).start()
    assert job.wait() == 0
    trackio_dir = tmp_path / "data" / "train" / "t-1" / "trackio"
    assert lines == ["hello from recipe", f"TRACKIO_DIR={trackio_dir}", "progress 100%", "to stderr"]
    record = json.loads((tmp_path / "data" / "train" / "t-1" / "run.json").read_text())
    assert record["state"] == "finished" and record["exit_code"] == 0
    assert record["argv"][1:] == ["-u", "-m", "fake_recipe", "ok"]
    assert record["env"]["TRACKIO_DIR"] == str(trackio_dir) and trackio_dir.is_dir()
    assert job.log_path.read_text().splitlines() == lines
    assert [r.run_id for r in list_runs(tmp_path / "data")] == ["t-1"]


def test_failed_run_records_its_exit_code(tmp_path: Path, fake_recipe) -> None:
    recipe, env = fake_recipe
    job = TrainingRun(recipe, ["fail"], data_dir=tmp_path, run_id="t-fail", extra_env=env).start()
    assert job.wait() == 3
    record = load_run(tmp_path, "t-fail")
    assert (record.state, record.exit_code) == ("failed", 3)
    assert record.finished_at is not None and record.pid == job.pid


def test_a_run_whose_log_cannot_be_written_still_ends_recorded(tmp_path: Path, fake_recipe) -> None:
    # A full disk or a broken log must not leave wait() and stop() hanging on a dead reader.
    recipe, env = fake_recipe
    (tmp_path / "train" / "t-nolog" / "train.log").mkdir(parents=True)
    job = TrainingRun(recipe, ["fail"], data_dir=tmp_path, run_id="t-nolog", extra_env=env).start()
    assert job.wait(60) == 3
    record = load_run(tmp_path, "t-nolog")
    assert (record.state, record.exit_code) == ("failed", 3)
    assert "its output could not be logged" in record.error


def test_stop_kills_the_whole_process_group(tmp_path: Path, fake_recipe) -> None:
    recipe, env = fake_recipe
    child: list[int] = []
    job = TrainingRun(
        recipe,
        ["hang"],
        data_dir=tmp_path,
        run_id="t-stop",
        extra_env=env,
        on_line=lambda line: child.append(int(line.split()[1])) if line.startswith("child ") else None,
    )
    job.start()
    while not child:  # the recipe reports its child before it waits
        assert job._finished.is_set() is False, job.log_path.read_text()
        time.sleep(0.05)
    assert not process_gone(child[0]) and os.getpgid(child[0]) == job.pid
    code = job.stop(grace_s=0.5)
    assert code == -9  # SIGTERM was ignored: SIGKILL ended it
    record = load_run(tmp_path, "t-stop")
    assert (record.state, record.exit_code) == ("stopped", -9)
    for _ in range(600):  # SIGKILL lands asynchronously: a bound for a loaded machine
        if process_gone(child[0]):
            break
        time.sleep(0.05)
    assert process_gone(child[0]), "the recipe's child survived stop()"


def test_a_run_id_cannot_be_reused(tmp_path: Path, fake_recipe) -> None:
    recipe, env = fake_recipe
    TrainingRun(recipe, ["ok"], data_dir=tmp_path, run_id="t-same", extra_env=env).start().wait()
    with pytest.raises(FileExistsError):
        TrainingRun(recipe, ["ok"], data_dir=tmp_path, run_id="t-same", extra_env=env).start()


def test_strip_ansi_keeps_text_only() -> None:
    assert strip_ansi("\x1b[1m\x1b[38;5;208mtrackio show\x1b[0m\n") == "trackio show"
    assert strip_ansi("\x1b]8;;http://x\x07link\x1b]8;;\x07") == "link"
    assert strip_ansi("a\rb\r\n") == "b"


def test_launcher_does_not_import_trackio_or_torch() -> None:
    import subprocess

    code = (
        "import sys, tapdeck.runner.training, tapdeck.runner.trackio_reader, tapdeck.runner.recipes, "
        "tapdeck.runner.recipes.data_check, tapdeck.runner.recipes.grpo_trl\n"
        "print(sorted(m for m in ('trackio', 'torch', 'trl', 'textual') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_stop_records_the_run_when_an_escaped_child_keeps_its_output_open(
    tmp_path: Path, fake_recipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tapdeck.runner import training

    monkeypatch.setattr(training, "STOP_DRAIN_S", 0.5)
    recipe, env = fake_recipe
    child: list[int] = []
    job = TrainingRun(
        recipe,
        ["escape"],
        data_dir=tmp_path,
        run_id="t-escape",
        extra_env=env,
        on_line=lambda line: child.append(int(line.split()[1])) if line.startswith("child ") else None,
    )
    job.start()
    try:
        while not child:
            assert not job._finished.is_set(), job.log_path.read_text()
            time.sleep(0.05)
        assert job.stop(grace_s=0.5) == -15
        record = load_run(tmp_path, "t-escape")
        assert (record.state, record.exit_code) == ("stopped", -15)
        assert "left its group" in record.error
        assert job.wait(0) == -15
    finally:
        os.kill(child[0], 9)
    job._reader.join(30)  # the pump, once the output closes, keeps the verdict stop() recorded
    assert load_run(tmp_path, "t-escape").state == "stopped"
