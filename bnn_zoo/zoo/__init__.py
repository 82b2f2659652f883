"""The zoo: a registry of model/guide pairs that all fit, predict and evaluate alike.

``names()`` lists the entries, ``get(name)`` returns an [`Entry`][], ``load(path)``
reads back a [`Fitted`][] written by ``Fitted.save``; ``NETWORKS`` holds the bundled
networks an entry may take in place of its model (``entry.fit(..., net=NETWORKS["cnn"])``),
``NETWORK_CHOICES`` the one ``compare --net cnn`` fits on each data set.

Entries live in the public modules of this package, each a short declaration calling
[`register`][], imported on first use; what several entries share (the zoo's MLP, the
MAP guide, the family budgets) lives in `bnn_zoo.zoo._defaults`, and no entry module
imports another. `_entry` holds the declaration, `_fitted`
the fitted result and its file, `_preparation` the data preparation,
`_replicas` the training sets of many fits in one pass. This is the one
place in ``bnn_zoo`` that names models and guides: the CLI and the benchmarks reach them only
through it.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

import torch

from bnn_zoo._core.files import load_plain
from bnn_zoo.methods._base import Budget, UnsupportedProblem
from bnn_zoo.zoo._entry import TINY_BUDGET, Entry, batches_replicas
from bnn_zoo.zoo._fitted import FILE_FORMAT, Fitted
from bnn_zoo.zoo._networks import NETWORK_CHOICES, NETWORKS, NamedNetwork, Network

__all__ = ["NETWORKS", "NETWORK_CHOICES", "TINY_BUDGET", "Budget", "Entry", "Fitted",
           "NamedNetwork", "Network", "UnsupportedProblem", "batches_replicas", "get", "load",
           "names", "register"]

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


def names(task: str | None = None, *, accepts_net: bool = False) -> list[str]:
    """Names of the registered entries, optionally only those supporting ``task`` (and,
    with ``accepts_net=True``, only those that take a user's network)."""
    _load()
    return sorted(n for n, e in _REGISTRY.items() if (task is None or task in e.tasks)
                  and (e.accepts_net or not accepts_net))


def get(name: str) -> Entry:
    """The entry called ``name``."""
    _load()
    if name not in _REGISTRY:
        raise ValueError(f"Unknown zoo entry {name!r}; expected one of: {', '.join(names())}.")
    return _REGISTRY[name]


def load(path: str | os.PathLike, *, map_location: str | torch.device | None = None,
         net: Network | None = None) -> Fitted:
    """The [`Fitted`][] saved at ``path`` by ``Fitted.save``, rebuilt through its
    entry's factories. The file is read with ``torch.load(weights_only=True)``: it runs
    no pickled code. ``map_location`` as in ``torch.load`` (e.g. ``"cpu"``). A fit with
    ``net=`` holds no code of the network: ``net`` gives it again (a module or a factory,
    on the device and in the dtype of the saved fit), and its parameter names and shapes
    must be those saved."""
    state = load_plain(path, what="a saved fit", map_location=map_location)
    if not isinstance(state, dict) or state.get("format") != FILE_FORMAT:
        raise ValueError(f"{os.fspath(path)!r} is not a fitted zoo entry (expected format "
                         f"{FILE_FORMAT!r}).")
    try:
        return get(state["entry"]).restore(state, source=repr(os.fspath(path)), net=net)
    except (KeyError, TypeError, RuntimeError) as error:
        raise ValueError(f"Cannot rebuild the fitted zoo entry in {os.fspath(path)!r}: "
                         f"{error!r}") from error
