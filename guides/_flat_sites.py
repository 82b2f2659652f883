"""A model's weight sites as one flat vector ``theta``: the tensors of the sites ``(name,
shape)``, in their order, each flattened row-major and concatenated (the vector a Laplace
layout, [`bnn_zoo.methods.laplace._layouts`][], and the SWAG Gaussian, [`bnn_zoo.guides._swag`][],
are over)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["Sites", "flatten_sites", "unflatten_sites"]

#: ``(name, shape)`` of every weight site, in the order of the flat vector ``theta``.
Sites = Sequence[tuple[str, tuple[int, ...]]]


def flatten_sites(sites: Sites, tensors: Mapping[str, Tensor]) -> Tensor:
    """Concatenate the site tensors ``{name: (*S, *shape)}`` into ``theta`` (*S, P), in the
    order of ``sites``."""
    parts = []
    for name, shape in sites:
        value = tensors[name]
        parts.append(value.reshape(*value.shape[:value.dim() - len(shape)], -1))
    return torch.cat(parts, -1)


def unflatten_sites(sites: Sites, theta: Tensor) -> dict[str, Tensor]:
    """Split ``theta`` (*S, P) into ``{name: (*S, *shape)}`` over ``sites``: views by one
    ``split``, whose backward is one concatenation (slices would each scatter into a zero
    ``P``)."""
    parts = theta.split([math.prod(shape) for _, shape in sites], -1)
    return {name: part.reshape((*theta.shape[:-1], *shape))
            for (name, shape), part in zip(sites, parts)}
