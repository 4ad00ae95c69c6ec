"""The tests' own layout: test modules share set-ups through fixtures (conftest.py files) and
the support modules of tests/support, never by importing one another or a conftest by name
(which pytest loads under one module name, ``conftest``, whichever was loaded last); every
module's basename is unique (rootdir-relative imports: a second ``test_x.py`` would shadow the
first); no ``__init__.py`` in the unit tests' folders."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from packaging_support import ROOT

TESTS = ROOT / "tests"


def _test_modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def _imported(path: Path) -> set[str]:
    """The top-level module names ``path`` imports, anywhere in it (also inside functions)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_test_tree_holds_test_modules() -> None:
    assert len(_test_modules()) > 100  # the glob finds them: the checks below check something


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    tests = {p.stem for p in _test_modules()}
    offenders = {
        str(p.relative_to(ROOT)): sorted(n for n in _imported(p) if n == "conftest" or n in tests)
        for p in _test_modules()
    }
    assert {k: v for k, v in offenders.items() if v} == {}, "use a fixture or tests/support"


def test_module_basenames_are_unique() -> None:
    names = Counter(
        p.name for p in TESTS.rglob("*.py") if p.name not in ("conftest.py", "__init__.py")
    )
    assert [name for name, n in names.items() if n > 1] == []


def test_the_unit_folders_are_not_packages() -> None:
    assert sorted((TESTS / "unit").rglob("__init__.py")) == []
