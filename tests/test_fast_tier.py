"""The fast tier (`./tapdeck.sh test --fast`: every test not marked `slow` or `medium`) reaches every
module of tapdeck.

A module counts as reached when a fast test's file, a `tests/support` helper it imports or a
conftest.py above it imports the module, directly or through the modules those import (lazy
imports inside functions included: import-linter's graph, grimp, sees them too; the CLI's command
modules, which app/cli.py imports by name, as imported by it; a package when one of its modules is).
That is the import graph, not line coverage: it keeps a module from being left to the slow tiers
alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

from tapdeck.app.cli import COMMAND_MODULES

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
LAYERS = ("app", "proxy", "runner", "schema", "themes")
TIER_MARKS = ("slow", "medium")


def _marked(decorators: list[ast.expr]) -> bool:
    """Whether one of the decorators (or a `pytestmark` value) is a mark the fast tier leaves out."""
    return any(f"mark.{mark}" in ast.unparse(d) for d in decorators for mark in TIER_MARKS)


def _has_fast_test(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            if _marked([node.value]):
                return False
    tests = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    ]
    return any(not _marked(t.decorator_list) for t in tests)


def _imports(path: Path, seen: set[Path]) -> set[str]:
    """The tapdeck modules `path` imports, with those of the tests/support helpers it imports."""
    if path in seen:
        return set()
    seen.add(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        for name in names:
            if name.startswith("tapdeck"):
                found.add(name)
                if isinstance(node, ast.ImportFrom):  # `from tapdeck.x import module`
                    found.update(f"{name}.{a.name}" for a in node.names)
            elif name.startswith("tests.support"):
                helper = ROOT / (name.replace(".", "/") + ".py")
                if helper.exists():
                    found |= _imports(helper, seen)
    return found


def _fast_files() -> list[Path]:
    return [
        p
        for p in sorted(TESTS.rglob("test_*.py"))
        if "support" not in p.parts and _has_fast_test(ast.parse(p.read_text(encoding="utf-8")))
    ]


def test_the_fast_tier_reaches_every_module() -> None:
    graph = grimp.build_graph("tapdeck")
    for name in COMMAND_MODULES:
        graph.add_import(importer="tapdeck.app.cli", imported=f"tapdeck.app.commands.{name}")
    modules = {m for m in graph.modules if m.split(".")[1:2] and m.split(".")[1] in LAYERS}
    seeds: set[str] = set()
    files = _fast_files()
    assert len(files) > 50, files  # the tier is most of the suite's files, not a handful
    for path in files:
        seen: set[Path] = set()
        seeds |= _imports(path, seen)
        for folder in path.relative_to(TESTS).parents:
            conftest = TESTS / folder / "conftest.py"
            if conftest.exists():
                seeds |= _imports(conftest, seen)
    reached = set()
    for seed in seeds & graph.modules:
        reached |= {seed, *graph.find_upstream_modules(seed)}
    reached |= {m.rsplit(".", depth)[0] for m in reached for depth in range(1, m.count("."))}
    assert sorted(modules - reached) == []


def test_a_module_no_fast_test_reaches_is_named(tmp_path: Path) -> None:
    """The check above can fail: a test file whose every test is marked gives no seed."""
    marked = tmp_path / "test_x.py"
    marked.write_text(
        "import pytest\nfrom tapdeck.proxy import errors\n\n\n@pytest.mark.medium\ndef test_a():\n    pass\n"
    )
    assert not _has_fast_test(ast.parse(marked.read_text()))
    module_marked = tmp_path / "test_y.py"
    module_marked.write_text("import pytest\n\npytestmark = pytest.mark.slow\n\n\ndef test_a():\n    pass\n")
    assert not _has_fast_test(ast.parse(module_marked.read_text()))
    plain = tmp_path / "test_z.py"
    plain.write_text("from tapdeck.proxy import errors\n\n\ndef test_a():\n    pass\n")
    assert _has_fast_test(ast.parse(plain.read_text()))
    assert "tapdeck.proxy.errors" in _imports(plain, set())
