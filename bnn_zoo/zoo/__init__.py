"""The zoo: a registry of model/guide pairs that all fit, predict and evaluate alike.

``names()`` lists the entries, ``get(name)`` returns an :class:`Entry`. Entries live
in the modules of this package (one per method), each calling :func:`register`;
they are imported on first use. This is the one place in ``bnn_zoo`` that names
models and guides: the CLI and the benchmarks reach them only through it.
"""

from __future__ import annotations

import importlib
import pkgutil

from bnn_zoo.zoo._entry import Budget, Entry, Fitted, UnsupportedProblem

__all__ = ["Budget", "Entry", "Fitted", "UnsupportedProblem", "get", "names", "register"]

_REGISTRY: dict[str, Entry] = {}
_LOADED = False


def register(entry: Entry) -> Entry:
    """Add ``entry`` to the registry (its name must be new)."""
    if entry.name in _REGISTRY:
        raise ValueError(f"A zoo entry named {entry.name!r} is already registered.")
    _REGISTRY[entry.name] = entry
    return entry


def _load() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for info in pkgutil.iter_modules(__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{__name__}.{info.name}")


def names(task: str | None = None) -> list[str]:
    """Names of the registered entries, optionally only those supporting ``task``."""
    _load()
    return sorted(n for n, e in _REGISTRY.items() if task is None or task in e.tasks)


def get(name: str) -> Entry:
    """The entry called ``name``."""
    _load()
    if name not in _REGISTRY:
        raise ValueError(f"Unknown zoo entry {name!r}; expected one of: {', '.join(names())}.")
    return _REGISTRY[name]
