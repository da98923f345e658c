"""The layering rule of DESIGN.md, checked in fresh interpreters so lazy imports are caught too."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

from tests.support.session_env import base_env

FORBIDDEN = {
    "tapdeck.proxy": ("tapdeck.runner", "tapdeck.app", "tapdeck.themes", "textual", "harbor"),
    "tapdeck.runner": ("tapdeck.app", "tapdeck.themes", "textual"),
    # The contract between server and clients sits below every layer: pydantic and itself only.
    "tapdeck.schema": ("tapdeck.proxy", "tapdeck.runner", "tapdeck.app", "tapdeck.themes", "textual",
                       "harbor", "fastapi", "httpx"),
}


def _modules(package: str) -> list[str]:
    mod = __import__(package, fromlist=["__path__"])
    names = [package]
    for info in pkgutil.walk_packages(mod.__path__, prefix=f"{package}."):
        names.append(info.name)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer: str) -> None:
    modules = _modules(layer)
    assert len(modules) > 1, f"{layer} has no modules to check"
    code = (
        "import importlib, sys, json\n"
        f"forbidden = {FORBIDDEN[layer]!r}\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "hits = sorted(m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in forbidden))\n"
        "print(json.dumps(hits))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=base_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{layer} pulled in {out.stdout.strip()}"


def test_package_is_namespaced_under_tapdeck() -> None:
    import tapdeck.app
    import tapdeck.proxy
    import tapdeck.runner

    for sub in (tapdeck.app, tapdeck.proxy, tapdeck.runner):
        assert sub.__name__.startswith("tapdeck.")
    assert tapdeck.__version__
