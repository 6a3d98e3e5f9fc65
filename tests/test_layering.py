"""Imports go one way: utils/ at the bottom, models/ and data/ above it (siblings that do not import each other),
engine/ (the training and evaluation flows) above them, entry scripts, scripts/ and benchmarks/ on top; and no
module reaches back to itself through others, inside a package or across packages (function-level imports count:
an import deferred to call time is still a circle)."""

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


# what engine/ may take from data/: the registry and the options, the data roots and the frame sources; never a
# particular dataset's module (a dataset is built by name through data.select_dataset)
ENGINE_DATA_MODULES = {"data.select_dataset", "data.dataset_options", "data.data_roots", "data.frame_sources"}


def test_engine_builds_datasets_through_the_registry_only():
    graph = _module_graph(ROOT)
    offenders = sorted(f"{m} imports {d}" for m, deps in graph.items() if m.startswith("engine.")
                       for d in deps if d.startswith("data.") and d not in ENGINE_DATA_MODULES)
    assert not offenders, "engine/ imports a dataset module:\n" + "\n".join(offenders)


def _module_graph(root: str, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """``{module: the project modules it imports}`` (``from a.b import c`` counts ``a.b``, and ``a.b.c`` when that is a
    module; imports inside functions included)."""
    files = {}
    for package in packages:
        for folder, _, names in os.walk(os.path.join(root, package)):
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    module = os.path.relpath(path, root)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                    files[module] = path
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), filename=path)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                deps.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[module] = {d for d in deps if d in files and d != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted: every import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for d in sorted(graph[m]):
            if d not in index:
                visit(d)
                low[m] = min(low[m], low[d])
            elif d in stack:
                low[m] = min(low[m], index[d])
        if low[m] == index[m]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == m:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return found


def test_no_import_circle_inside_or_between_packages():
    circles = _circles(_module_graph(ROOT))
    assert not circles, "import circles (each group reaches back to itself):\n" + "\n".join(
        " <-> ".join(group) for group in circles)


def test_the_circle_check_sees_one_inside_a_package_through_a_deferred_import(tmp_path):
    pkg = tmp_path / "data"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "registry.py").write_text("from data.item import Item\n")
    (pkg / "item.py").write_text("def build():\n    from data.registry import specs\n")
    (pkg / "alone.py").write_text("import data.item\n")
    assert _circles(_module_graph(str(tmp_path), ("data",))) == [["data.item", "data.registry"]]


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
