"""A fitted posterior's state as tensors and plain data, and back.

``Posterior.state_dict`` ([`Posterior`][bnn_zoo.methods.Posterior]) is built from these, so
that a saved fit loads with ``torch.load(weights_only=True)``: the ``state_dict`` of its
modules (`module_state`, `load_module_state`) and its training record
(`result_state`, `result_from_state`).
"""

from __future__ import annotations

from collections.abc import Callable

import pyro
import torch
from torch import Tensor, nn

from bnn_zoo._core.training import FitResult

__all__ = ["load_module_state", "module_state", "result_from_state", "result_state"]


def module_state(obj: Callable) -> dict[str, Tensor]:
    """The ``state_dict`` of a model or guide (empty for a plain function)."""
    return obj.state_dict() if isinstance(obj, nn.Module) else {}


def _assign_buffers(module: torch.nn.Module, state: dict[str, Tensor]) -> None:
    """Set every buffer of ``module`` named in ``state`` to the stored tensor, whatever its
    current value (``None``, or data of another shape)."""
    for key, value in state.items():
        owner_name, _, name = key.rpartition(".")
        try:
            owner = module.get_submodule(owner_name)
        except AttributeError:  # a submodule built lazily, on the first call
            continue
        if name in owner._buffers:
            owner._buffers[name] = value


def load_module_state(module: torch.nn.Module, state: dict[str, Tensor], *,
                      initialise: Callable[[], object] | None = None) -> None:
    """``module.load_state_dict(state)`` for modules whose state ``load_state_dict`` alone
    cannot restore: buffers registered as ``None`` or holding data of another size (such
    as a guide's conditioning data) are set from ``state``, before and after
    ``initialise`` (called without gradients, in a private Pyro parameter store, so that
    lazily built parameters exist); then the state is loaded."""
    _assign_buffers(module, state)
    if initialise is not None:
        with torch.no_grad(), pyro.get_param_store().scope():
            initialise()
        _assign_buffers(module, state)
    module.load_state_dict(state)


def result_state(result: FitResult | None) -> dict | None:
    """A [`FitResult`][] as plain data (its parameter snapshot left out)."""
    if result is None:
        return None
    return {"losses": list(result.losses), "seconds": result.seconds, "steps": result.steps}


def result_from_state(state: dict | None) -> FitResult | None:
    """Inverse of `result_state`."""
    return None if state is None else FitResult(**state)
