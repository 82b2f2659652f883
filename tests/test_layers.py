"""The package's layers (see ``bnn_zoo/__init__.py``): each imports only the
layers before it, so a model never depends on the objective that trains it and the core never
on the zoo."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The layer of each top-level part of ``bnn_zoo``, in order; models and guides share one,
#: and the public faces of the core (``bnn_zoo.data``, ``elbo``, ``handlers``,
#: ``distributed``) sit in its layer.
LAYERS = {"_core": 1, "data": 1, "elbo": 1, "handlers": 1, "distributed": 1, "models": 2,
          "guides": 2, "methods": 3, "evaluation": 4, "zoo": 5, "_harness": 6, "results": 6}
FOLDERS = {"_core": "bnn_zoo/_core", "data": "bnn_zoo/data.py", "elbo": "bnn_zoo/elbo.py",
           "handlers": "bnn_zoo/handlers.py", "distributed": "bnn_zoo/distributed.py",
           "models": "models", "guides": "guides", "methods": "bnn_zoo/methods",
           "evaluation": "bnn_zoo/evaluation", "zoo": "bnn_zoo/zoo", "_harness": "bnn_zoo/_harness",
           "results": "bnn_zoo/results.py"}


def imported_parts(path: Path) -> set[str]:
    """The parts of ``bnn_zoo`` (``core``, ``models``, ...) that the module at ``path`` imports."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            pieces = name.split(".")
            if pieces[0] == "bnn_zoo" and len(pieces) > 1 and pieces[1] in LAYERS:
                parts.add(pieces[1])
    return parts


MODULES = [(part, path) for part, folder in FOLDERS.items()
           for path in ([ROOT / folder] if folder.endswith(".py")
                        else sorted((ROOT / folder).rglob("*.py")))]


@pytest.mark.parametrize("part, path", MODULES,
                         ids=[str(p.relative_to(ROOT)) for _, p in MODULES])
def test_module_imports_only_earlier_layers(part: str, path: Path):
    later = {other for other in imported_parts(path) if LAYERS[other] > LAYERS[part]}
    assert not later, f"{path.relative_to(ROOT)} (layer {part}) imports later layers {later}"


def test_every_layer_has_modules():
    assert {part for part, _ in MODULES} == set(LAYERS)


def test_every_module_is_in_a_layer():
    """All but the package's entry points (its ``__init__``, which gathers the layers'
    public names, and ``__main__``) belong to a layer, so their imports are checked."""
    layered = {path for _, path in MODULES}
    top = {ROOT / "bnn_zoo" / "__init__.py", ROOT / "bnn_zoo" / "__main__.py"}
    every = {path for folder in ("bnn_zoo", "models", "guides")
             for path in (ROOT / folder).rglob("*.py")}
    assert sorted(map(str, every - layered - top)) == []
