"""The package's layout, read from its source (no import): no import cycle within
``bnn_zoo`` (folders ``bnn_zoo/``, ``models/`` as ``bnn_zoo.models``, ``guides/`` as
``bnn_zoo.guides``), and no zoo entry module importing another, so that shared defaults
live in one place (:mod:`bnn_zoo.zoo._defaults`) and each entry module is its declaration.

An import counts wherever it stands (module level, inside a function, or under
``if TYPE_CHECKING:``, where a cycle hides rather than ends). ``from package import name``
is an edge to the submodule ``package.name`` where there is one, otherwise to the package
itself; importing a module does not count as importing its parent packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Package name -> folder, as ``pyproject.toml``'s ``package-dir`` maps them.
FOLDERS = {"bnn_zoo": ROOT / "bnn_zoo", "bnn_zoo.models": ROOT / "models",
           "bnn_zoo.guides": ROOT / "guides"}


def modules(folders: dict[str, Path]) -> dict[str, Path]:
    """Every module's dotted name -> its file (a package as its ``__init__.py``)."""
    found = {}
    for package, folder in folders.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (file ``path``) imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in known else base)
    return (found & known) - {name}


def import_graph(folders: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports."""
    found = modules(folders)
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle ``[a, b, ..., a]`` of ``graph``, or ``None`` if it has none."""
    state: dict[str, str] = {}  # "open" while on the depth-first path, then "done"
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for child in sorted(graph[node]):
            if state.get(child) == "open":
                return [*path[path.index(child):], child]
            if child not in state and (cycle := visit(child)) is not None:
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def entry_modules(graph: dict[str, set[str]], folders: dict[str, Path]) -> set[str]:
    """The modules of ``bnn_zoo.zoo`` that register an entry (call ``register``)."""
    found = modules(folders)
    return {name for name in graph if name.startswith("bnn_zoo.zoo.") and any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "register" for node in ast.walk(ast.parse(found[name].read_text())))}


def entries_importing_entries(folders: dict[str, Path]) -> dict[str, set[str]]:
    """Each entry module that imports other entry modules -> those modules."""
    graph = import_graph(folders)
    entries = entry_modules(graph, folders)
    return {name: graph[name] & entries for name in sorted(entries) if graph[name] & entries}


def test_the_package_has_no_import_cycle():
    graph = import_graph(FOLDERS)
    assert {"bnn_zoo.zoo._entry", "bnn_zoo.models._nngp", "bnn_zoo.guides._bbb"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_entry_module_imports_another():
    graph = import_graph(FOLDERS)
    assert {"bnn_zoo.zoo.bbb", "bnn_zoo.zoo.laplace", "bnn_zoo.zoo.reference"} <= entry_modules(
        graph, FOLDERS)
    assert entries_importing_entries(FOLDERS) == {}


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


@pytest.fixture
def fake_package(tmp_path):
    """A package ``bnn_zoo`` with a zoo of two entries and shared defaults, laid out well:
    the tests below break it one way each."""
    _write(tmp_path, {
        "__init__.py": "",
        "zoo/__init__.py": "from bnn_zoo.zoo._entry import Entry\n",
        "zoo/_entry.py": "from bnn_zoo.zoo import _replicas\n",
        "zoo/_replicas.py": "BATCH = 1\n",
        "zoo/_defaults.py": "BUDGET = 1\n",
        "zoo/a.py": "from bnn_zoo.zoo import register\nfrom bnn_zoo.zoo._defaults import BUDGET\n"
                    "register(BUDGET)\n",
        "zoo/b.py": "from bnn_zoo.zoo import register\nfrom ._defaults import BUDGET\n"
                    "register(BUDGET)\n",
    })
    return {"bnn_zoo": tmp_path}


def test_the_checks_pass_a_well_laid_out_package(fake_package):
    assert find_cycle(import_graph(fake_package)) is None
    assert entries_importing_entries(fake_package) == {}


def test_the_checks_find_a_cycle_and_an_entry_importing_an_entry(fake_package):
    folder = fake_package["bnn_zoo"]
    cycle = ["bnn_zoo.zoo._entry", "bnn_zoo.zoo._replicas", "bnn_zoo.zoo._entry"]
    (folder / "zoo/_replicas.py").write_text("def f():\n    from bnn_zoo.zoo._entry import E\n")
    assert find_cycle(import_graph(fake_package)) == cycle
    (folder / "zoo/_replicas.py").write_text("from typing import TYPE_CHECKING\n"
                                             "if TYPE_CHECKING:\n    from ._entry import E\n")
    assert find_cycle(import_graph(fake_package)) == cycle
    (folder / "zoo/b.py").write_text("from bnn_zoo.zoo import register\n"
                                     "from .a import BUDGET\nregister(BUDGET)\n")
    assert entries_importing_entries(fake_package) == {"bnn_zoo.zoo.b": {"bnn_zoo.zoo.a"}}
    (folder / "zoo/b.py").write_text("from bnn_zoo.zoo import a, register\nregister(a.BUDGET)\n")
    assert entries_importing_entries(fake_package) == {"bnn_zoo.zoo.b": {"bnn_zoo.zoo.a"}}
