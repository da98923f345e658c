"""scripts/setup.sh stays quiet: a line per step, progress with the expected time during the long
build, pip's output in a log whose tail (and what to do) is shown only when a step fails.

The whole script runs in a scratch copy of the repo whose `.venv/bin/python` hands `-m pip` to a
stand-in that prints pip-like noise (and sleeps through the "build"), so neither the network nor a
llama.cpp build is needed; the steps' progress logic also runs on short real commands.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"
MAX_LINES = 15

FAKE_PYTHON = """#!/bin/bash
# Stands in for .venv/bin/python: `-m pip ...` prints pip-like noise; anything else is real Python.
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    for i in $(seq 1 300); do echo "Collecting something-$i (from pip's ordinary chatter)"; done
    echo "SetuptoolsDeprecationWarning: noise that belongs in the log" >&2
    case " $* " in *" wheel "*) sleep "${FAKE_BUILD_S:-0}";; esac
    case " $* " in *" $FAKE_PIP_FAIL_ON "*) echo "ERROR: No matching distribution (fake)" >&2; exit 1;; esac
    exit 0
fi
exec "$REAL_PYTHON" "$@"
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def scratch_repo(tmp_path: Path) -> Path:
    """A copy of the repo's set-up inputs with a stand-in venv python and C compiler."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SETUP, repo / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    (repo / ".venv" / "bin").mkdir(parents=True)
    _executable(repo / ".venv" / "bin" / "python", FAKE_PYTHON)
    (tmp_path / "bin").mkdir()
    _executable(tmp_path / "bin" / "cc", "#!/bin/sh\nexit 0\n")
    return repo


def _run_setup(repo: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {
        **os.environ,
        "REAL_PYTHON": sys.executable,
        "TAPDECK_SETUP_PROGRESS_S": "1",
        "TAPDECK_WHEEL_CACHE": str(repo.parent / "wheels"),
        "FAKE_PIP_FAIL_ON": "no-such-arg",
        "PATH": f"{repo.parent / 'bin'}{os.pathsep}{os.environ['PATH']}",
        **env,
    }
    return subprocess.run(
        ["bash", str(repo / "scripts" / "setup.sh")],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


@pytest.mark.medium
def test_a_first_set_up_prints_a_handful_of_lines_and_keeps_pips_output_in_the_log(
    scratch_repo: Path,
) -> None:
    out = _run_setup(scratch_repo, FAKE_BUILD_S="2.5")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = (out.stdout + out.stderr).splitlines()
    assert len(lines) <= MAX_LINES, lines
    text = "\n".join(lines)
    log = scratch_repo / ".venv" / "setup.log"
    assert str(log) in text
    assert "building llama-cpp-python 0.3.36 once, about 7-15 min on 2 cores" in text
    assert "still working: " in text and "elapsed (about 7-15 min on 2 cores)" in text
    assert "Collecting" not in text and "Warning" not in text
    assert "Collecting something-300" in log.read_text()
    assert lines[-1] == "setup: done"
    assert (scratch_repo / ".venv" / ".tapdeck-installed").is_file()
    again = _run_setup(scratch_repo)
    assert again.returncode == 0 and again.stdout + again.stderr == ""


def test_a_failed_step_shows_the_logs_tail_and_what_to_do(scratch_repo: Path) -> None:
    (scratch_repo.parent / "wheels").mkdir()
    (scratch_repo.parent / "wheels" / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").touch()
    out = _run_setup(scratch_repo, FAKE_PIP_FAIL_ON="--find-links")
    assert out.returncode == 1
    assert "building llama-cpp-python" not in out.stdout  # the cached wheel is reused
    err = out.stderr
    assert "FAILED while installing tapdeck and its dependencies" in err
    assert "ERROR: No matching distribution (fake)" in err
    assert "run ./scripts/setup.sh again" in err and str(scratch_repo / ".venv" / "setup.log") in err
    assert len(err.splitlines()) <= 30
    assert not (scratch_repo / ".venv" / ".tapdeck-installed").exists()


def _steps(script: str) -> subprocess.CompletedProcess[str]:
    """Run `script` after sourcing setup.sh (its functions only), logging to a temp file."""
    return subprocess.run(
        ["bash", "-c", f'source "{SETUP}"; SETUP_LOG="$(mktemp)"; PROGRESS_S=1; ' + script],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.medium
def test_a_long_step_reports_the_elapsed_and_the_expected_time_until_it_ends() -> None:
    out = _steps('long_step "building x" "about 2 s" sleep 2.5; echo after')
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "setup: building x, about 2 s"
    assert any(
        line.startswith("setup:   still working: ") and line.endswith(" elapsed (about 2 s)")
        for line in lines[1:-2]
    ), lines
    assert lines[-2].startswith("setup:   done in ") and lines[-1] == "after"


def test_a_failed_long_step_stops_the_script_with_its_own_output_only() -> None:
    out = _steps(
        'step "first" echo earlier-output; '
        'long_step "second" "soon" sh -c "echo its-output; exit 4"; echo not-reached'
    )
    assert out.returncode == 1
    assert "not-reached" not in out.stdout
    assert "FAILED while second" in out.stderr and "its-output" in out.stderr
    assert "earlier-output" not in out.stderr


def test_setup_on_the_venv_it_set_up_prints_nothing() -> None:
    stamp = ROOT / ".venv" / ".tapdeck-installed"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + SETUP.read_bytes()).hexdigest()
    if not stamp.is_file() or stamp.read_text().strip() != want:
        pytest.skip("this checkout's .venv was not set up by this setup.sh (run ./scripts/setup.sh)")
    out = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout + out.stderr == ""


@pytest.mark.parametrize("python", ["/nonexistent/python3.12", "false"])
def test_a_tapdeck_python_that_is_not_a_312_is_refused_not_ignored(scratch_repo: Path, python: str) -> None:
    result = _run_setup(scratch_repo, TAPDECK_PYTHON=python)
    assert result.returncode == 1
    assert f"TAPDECK_PYTHON={python} is not a Python 3.12 or newer" in result.stderr
    assert (scratch_repo / ".venv" / "bin" / "python").exists()  # nothing was touched
