"""runner/harbor_api.py: every Harbor name it lists resolves, to what its type-checking imports say."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tapdeck.runner import harbor_api


def _type_checking_imports() -> dict[str, str]:
    """`name: module:attribute` of the imports under the module's `if TYPE_CHECKING:`."""
    tree = ast.parse(Path(harbor_api.__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    return {alias.asname or alias.name: f"{node.module}:{alias.name}"
            for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}


def test_every_name_is_listed_for_type_checkers_too() -> None:
    assert _type_checking_imports() == harbor_api.NAMES


@pytest.mark.parametrize("name", sorted(harbor_api.NAMES))
def test_every_name_resolves_to_harbors_object(name: str) -> None:
    module, attribute = harbor_api.NAMES[name].split(":")
    assert getattr(harbor_api, name) is getattr(importlib.import_module(module), attribute)


def test_a_name_it_does_not_list_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="Trail"):
        harbor_api.Trail  # noqa: B018
