"""Installed, everything lives under `tapdeck`: nothing generic lands at the top of site-packages."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel, and setuptools' whole output while building it (`-v` shows the backend's)."""
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-v",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (built,) = out.glob("tapdeck-*.whl")
    return built, done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(build: tuple[Path, str]) -> Path:
    return build[0]


@pytest.mark.medium
def test_the_package_configuration_triggers_no_setuptools_warnings(build: tuple[Path, str]) -> None:
    # e.g. "SetuptoolsDeprecationWarning: `project.license` as a TOML table is deprecated", or
    # "_Warning: Package 'tapdeck.runner.sample_dataset' is absent from the `packages` configuration"
    warnings = [line.strip() for line in build[1].splitlines() if re.search(r"\w*Warning: ", line)]
    assert warnings == []


def test_wheel_installs_everything_under_the_tapdeck_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"tapdeck"}
    for module in (
        "tapdeck/proxy/capture/graph.py",
        "tapdeck/proxy/dialects/anthropic.py",
        "tapdeck/runner/sandboxes/host.py",
        "tapdeck/app/tui.py",
        "tapdeck/app/cli.py",
    ):
        assert module in names, f"{module} missing from the wheel"


def test_wheel_ships_the_sample_dataset_and_stylesheets(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("tapdeck/runner/sample_dataset/") and n.endswith("task.toml") for n in names)
    assert any(n.startswith("tapdeck/themes/") and n.endswith(".tcss") for n in names)


@pytest.mark.medium
def test_wheel_imports_in_a_fresh_target(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import tapdeck.proxy.capture.graph, tapdeck.app.cli;"
        "print(tapdeck.proxy.capture.graph.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code, str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(target))


def test_package_is_namespaced_under_tapdeck() -> None:
    import tapdeck.app
    import tapdeck.proxy
    import tapdeck.runner

    for sub in (tapdeck.app, tapdeck.proxy, tapdeck.runner):
        assert sub.__name__.startswith("tapdeck.")
    assert tapdeck.__version__
