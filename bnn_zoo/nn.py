"""Functional MLP building blocks with weights as whole tensors.

A network is a list of ``(weight, bias)`` pairs with shapes ``(*S, d_in, d_out)``
and ``(*S, d_out)``. Any leading sample shape ``S`` is allowed, so one forward
pass evaluates many posterior samples at once::

    h_0 = x                                 # (N, d_0) or (*S, N, d_0)
    h_l = act(h_{l-1} @ W_l + b_l)          # (*S, N, d_l)
    f   = h_{L-1} @ W_L + b_L               # (*S, N, d_L), no activation
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from bnn_zoo._checks import check_choice, check_positive_int

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "gelu": torch.nn.functional.gelu,
    "identity": lambda h: h,
}


def activation(name: str) -> Callable[[Tensor], Tensor]:
    """Look up an activation function by name (see ``ACTIVATIONS``)."""
    return ACTIVATIONS[check_choice("activation", name, sorted(ACTIVATIONS))]


def layer_sizes(in_dim: int, hidden: Sequence[int], out_dim: int) -> list[int]:
    """Return ``[in_dim, *hidden, out_dim]`` after checking each width is an int >= 1."""
    check_positive_int("in_dim", in_dim)
    check_positive_int("out_dim", out_dim)
    if isinstance(hidden, int) or not isinstance(hidden, Sequence):
        raise TypeError(f"Expected hidden to be a sequence of widths, but got {hidden!r}.")
    for width in hidden:
        check_positive_int("hidden width", width)
    return [in_dim, *hidden, out_dim]


def layer_names(num_layers: int) -> list[tuple[str, str]]:
    """Sample-site names ``("layers.{l}.weight", "layers.{l}.bias")`` of each layer."""
    return [(f"layers.{i}.weight", f"layers.{i}.bias") for i in range(num_layers)]


def mlp_forward(x: Tensor, params: Sequence[tuple[Tensor, Tensor]],
                act: Callable[[Tensor], Tensor] = torch.relu) -> Tensor:
    """Evaluate the MLP for every leading sample of its weights.

    Parameters
    ----------
    x : (N, d_0) or (*S, N, d_0) inputs.
    params : list of ``(W, b)`` with ``W`` of shape (*S, d_in, d_out) and ``b`` (*S, d_out).
    act : hidden-layer activation.

    Returns
    -------
    (*S, N, d_L) network outputs.
    """
    h = x
    last = len(params) - 1
    for i, (weight, bias) in enumerate(params):
        h = torch.matmul(h, weight) + bias.unsqueeze(-2)
        if i < last:
            h = act(h)
    return h


def tensor_options(module: torch.nn.Module) -> dict[str, torch.device | torch.dtype]:
    """``{"device": ..., "dtype": ...}`` of the first floating parameter or buffer of
    ``module`` (torch's defaults when it has none), so that tensors a guide builds from
    a model land on the model's device and dtype instead of the CPU."""
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_floating_point():
            return {"device": tensor.device, "dtype": tensor.dtype}
    return {"device": torch.get_default_device(), "dtype": torch.get_default_dtype()}


def init_mlp_params(sizes: Sequence[int], *, generator: torch.Generator | None = None,
                    dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> list[tuple[Tensor, Tensor]]:
    """He/LeCun-style initial weights ``W ~ N(0, 1/d_in)``, zero biases."""
    params = []
    for d_in, d_out in zip(sizes[:-1], sizes[1:]):
        weight = torch.randn(d_in, d_out, generator=generator, dtype=dtype, device=device)
        params.append((weight / d_in**0.5, torch.zeros(d_out, dtype=dtype, device=device)))
    return params
