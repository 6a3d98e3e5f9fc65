"""Imports go one way: utils/ at the bottom, models/ and data/ above it (siblings that do not import each other),
engine/ (the training and evaluation flows) above them, entry scripts, scripts/ and benchmarks/ on top."""

from __future__ import annotations

import ast
import os

from tests.support.helpers import ROOT

PACKAGES = ("utils", "models", "data", "engine")
ALLOWED = {
    "utils": {"utils"},
    "models": {"utils", "models"},
    "data": {"utils", "data"},
    "engine": {"utils", "models", "data", "engine"},
}


def _project_imports(path: str) -> list[tuple[int, str]]:
    """``(line, top-level package)`` of every import of a project package in a file, nested ones included."""
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in PACKAGES or top.startswith("main_"):
                found.append((node.lineno, top))
    return found


def test_imports_go_one_way():
    offenders = []
    for package, allowed in ALLOWED.items():
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    for line, top in _project_imports(path):
                        if top not in allowed:
                            offenders.append(f"{os.path.relpath(path, ROOT)}:{line} imports {top}")
    assert not offenders, "imports against the layering:\n" + "\n".join(offenders)


def test_the_check_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from models.network_vrt import VRT\n    import engine.train\n")
    assert _project_imports(str(bad)) == [(2, "models"), (3, "engine")]


def test_tests_keep_support_code_apart():
    """``tests/`` holds test modules only; helpers, fixture builders and process entry points live in
    ``tests/support/`` (nothing there is collected, nothing in ``tests/`` is imported by another test module)."""
    here = os.path.join(ROOT, "tests")
    stray = [name for name in os.listdir(here) if name.endswith(".py")
             and not (name.startswith("test_") or name in ("__init__.py", "conftest.py"))]
    assert not stray, f"support code outside tests/support/: {stray}"
    for name in os.listdir(here):
        if name.startswith("test_") and name.endswith(".py"):
            tree = ast.parse(open(os.path.join(here, name), encoding="utf-8").read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests.test_"):
                    raise AssertionError(f"tests/{name}:{node.lineno} imports another test module "
                                         f"({node.module}); move what both need to tests/support/")
