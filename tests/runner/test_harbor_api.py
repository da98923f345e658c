"""runner/harbor_api.py: every Harbor name it lists resolves, to what its type-checking imports say."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tapdeck.runner import harbor_api


def _type_checking_imports() -> dict[str, str]:
    """`name: module:attribute` of the imports under the module's `if TYPE_CHECKING:`."""
    tree = ast.parse(Path(harbor_api.__file__).read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    )
    return {
        alias.asname or alias.name: f"{node.module}:{alias.name}"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_every_name_is_listed_for_type_checkers_too() -> None:
    assert _type_checking_imports() == harbor_api.NAMES


@pytest.mark.parametrize("name", sorted(harbor_api.NAMES))
def test_every_name_resolves_to_harbors_object(name: str) -> None:
    module, attribute = harbor_api.NAMES[name].split(":")
    assert getattr(harbor_api, name) is getattr(importlib.import_module(module), attribute)


def test_a_name_it_does_not_list_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="Trail"):
        harbor_api.Trail  # noqa: B018


def test_importing_harbor_api_imports_no_harbor_and_sets_the_litellm_switch() -> None:
    code = (
        "import os, sys\n"
        "import tapdeck.runner.harbor_api as harbor_api\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'harbor'),"
        " os.environ.get('LITELLM_LOCAL_MODEL_COST_MAP'))\n"
        "harbor_api.TaskConfig\n"
        "print('harbor.models.task.config' in sys.modules, 'harbor.trial.trial' in sys.modules)\n"
    )
    env = {"PATH": "/usr/bin:/bin", **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[] True", "True False"]
