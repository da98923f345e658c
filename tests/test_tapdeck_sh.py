"""`./tapdeck.sh test` (the README's and CI's test command) readies Docker for the container tests
before pytest when it runs as root, and otherwise says in one line why they cannot run.

tapdeck.sh runs in a scratch copy of the repo whose set-up, container script, venv python and `id`
are stand-ins that record what ran, in order.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


PYTEST = "python -m pytest -n 3 --dist worksteal"
"""pytest as tapdeck.sh runs it: on 3 workers unless TAPDECK_TEST_WORKERS says otherwise."""


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "tapdeck.sh", repo / "tapdeck.sh")
    ran = 'echo "$(basename "$0") $*" >>"$RAN"\n'
    _executable(repo / "scripts" / "setup.sh", f"#!/bin/sh\n{ran}")
    _executable(repo / "scripts" / "container-sandbox.sh", f'#!/bin/sh\n{ran}exit "${{READY_RC:-0}}"\n')
    _executable(repo / ".venv" / "bin" / "python", f"#!/bin/sh\n{ran}")
    _executable(tmp_path / "bin" / "id", '#!/bin/sh\necho "$FAKE_UID"\n')
    return repo


def _test_command(repo: Path, *args: str, uid: int = 0, **env: str) -> tuple[list[str], str]:
    """What ran, in order, and what tapdeck.sh said on stderr."""
    ran = repo.parent / "ran.txt"
    ran.unlink(missing_ok=True)
    full_env = {k: v for k, v in os.environ.items() if k != "TAPDECK_NO_CONTAINER_TESTS"}
    full_env |= {
        "RAN": str(ran),
        "FAKE_UID": str(uid),
        "PATH": f"{repo.parent / 'bin'}{os.pathsep}{os.environ['PATH']}",
        **env,
    }
    done = subprocess.run(
        ["bash", str(repo / "tapdeck.sh"), "test", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=30,
        check=True,
    )
    return [line.strip() for line in ran.read_text().splitlines()], done.stderr


def test_as_root_docker_is_readied_after_set_up_and_before_pytest(repo: Path) -> None:
    ran, said = _test_command(repo)
    assert ran == ["setup.sh", "container-sandbox.sh", f"{PYTEST}"], ran
    assert said == ""
    # Arguments go to pytest; the backend is readied for them too.
    ran, _ = _test_command(repo, "tests/runner", "-x")
    assert ran == ["setup.sh", "container-sandbox.sh", f"{PYTEST} tests/runner -x"], ran


def test_a_backend_that_cannot_be_readied_is_said_and_the_suite_still_runs(repo: Path) -> None:
    ran, said = _test_command(repo, READY_RC="1")
    assert ran == ["setup.sh", "container-sandbox.sh", f"{PYTEST}"], ran
    assert said.strip() == "container tests: the backend is not ready (above); they will fail saying why"


def test_without_root_nothing_is_readied_and_one_line_says_why(repo: Path) -> None:
    ran, said = _test_command(repo, uid=1000)
    assert ran == ["setup.sh", f"{PYTEST}"], ran
    assert len(said.splitlines()) == 1 and "readying Docker needs root" in said
    assert "TAPDECK_NO_CONTAINER_TESTS=1" in said


def test_the_fast_tier_and_the_opt_out_ready_nothing(repo: Path) -> None:
    ran, said = _test_command(repo, "--fast")
    assert ran == ["setup.sh", f"{PYTEST} -m not slow and not medium"], ran
    assert said == ""
    ran, said = _test_command(repo, TAPDECK_NO_CONTAINER_TESTS="1")
    assert ran == ["setup.sh", f"{PYTEST}"], ran
    assert said.strip() == "container tests: skipped (TAPDECK_NO_CONTAINER_TESTS is set)"


def test_the_workers_can_be_set_and_zero_is_one_process(repo: Path) -> None:
    ran, _ = _test_command(repo, "--fast", TAPDECK_TEST_WORKERS="0")
    assert ran == ["setup.sh", "python -m pytest -n 0 --dist worksteal -m not slow and not medium"], ran
