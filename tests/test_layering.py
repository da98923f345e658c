"""The layering rule of DESIGN.md, checked in fresh interpreters so lazy imports are caught too."""

from __future__ import annotations

import ast
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

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
                         env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{layer} pulled in {out.stdout.strip()}"


def test_package_is_namespaced_under_tapdeck() -> None:
    import tapdeck.app
    import tapdeck.proxy
    import tapdeck.runner

    for sub in (tapdeck.app, tapdeck.proxy, tapdeck.runner):
        assert sub.__name__.startswith("tapdeck.")
    assert tapdeck.__version__


def test_harbor_is_imported_by_one_module_alone() -> None:
    """Production code reaches Harbor through runner/harbor_api.py, which imports it lazily and
    sets litellm's cost-map switch first; nothing else names a Harbor package in an import."""
    root = Path(__file__).resolve().parents[1]
    importers = []
    for folder in ("app", "proxy", "runner", "schema", "themes"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                         else [])
                if any(n == "harbor" or n.startswith("harbor.") for n in names):
                    importers.append(str(path.relative_to(root)))
    assert sorted(set(importers)) == ["runner/harbor_api.py"]


def test_importing_harbor_api_imports_no_harbor_and_sets_the_litellm_switch() -> None:
    code = ("import os, sys\n"
            "import tapdeck.runner.harbor_api as harbor_api\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'harbor'),"
            " os.environ.get('LITELLM_LOCAL_MODEL_COST_MAP'))\n"
            "harbor_api.TaskConfig\n"
            "print('harbor.models.task.config' in sys.modules, 'harbor.trial.trial' in sys.modules)\n")
    env = {"PATH": "/usr/bin:/bin", **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[] True", "True False"]
