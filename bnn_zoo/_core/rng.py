"""Pyro's random state (torch, Python, numpy) as tensors and plain data, so that a checkpoint
holds it and loads with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import numpy as np
import pyro.util
import torch

__all__ = ["rng_state", "set_rng_state"]


def rng_state() -> dict:
    """Pyro's RNG state (torch, Python, numpy) as tensors and plain data."""
    state = pyro.util.get_rng_state()
    kind, keys, pos, has_gauss, cached = state["numpy"][:5]
    return {"torch": state["torch"], "random": state["random"],
            "numpy": (str(kind), torch.from_numpy(keys.astype(np.int64)), int(pos),
                      int(has_gauss), float(cached))}


def set_rng_state(state: dict) -> None:
    """Set Pyro's RNG state from [`rng_state`][]'s form."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    pyro.util.set_rng_state({"torch": state["torch"].cpu(), "random": state["random"],
                             "numpy": (kind, keys.cpu().numpy().astype(np.uint32), pos,
                                       has_gauss, cached)})
