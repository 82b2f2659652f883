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
from pyro.poutine.runtime import effectful
from torch import Tensor

from bnn_zoo.core.checks import check_choice, check_positive_int

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


def _affine(h: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return torch.matmul(h, weight) + bias.unsqueeze(-2)


@effectful(type="affine")
def affine(h: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``h @ W + b`` for weights with any leading sample dims.

    An effectful operation (message type ``"affine"``): an effect handler may compute
    it differently, e.g. :class:`~bnn_zoo.core.handlers.local_reparameterization`
    samples the pre-activations from the guide's Gaussian moments of ``W`` and ``b``.
    Without a handler it is the plain affine map.
    """
    return _affine(h, weight, bias)


def local_reparameterized_affine(h: Tensor, weight: tuple[Tensor, Tensor],
                                 bias: tuple[Tensor, Tensor]) -> Tensor:
    """A sample of ``h @ W + b`` for ``W ~ N(M, S^2)``, ``b ~ N(m, s^2)`` independent.

    The local reparameterisation trick (Kingma, Salimans & Welling 2015): each
    pre-activation is Gaussian with mean ``h @ M + m`` and variance
    ``h^2 @ S^2 + s^2``, so it is drawn directly, with fresh noise per data
    point, instead of drawing one ``W`` shared by the minibatch. Each point's
    expected log-likelihood is unchanged and its gradient estimate has lower
    variance. ``weight`` and ``bias`` are ``(loc, scale)`` pairs.
    """
    (w_loc, w_scale), (b_loc, b_scale) = weight, bias
    mean = _affine(h, w_loc, b_loc)
    var = _affine(h**2, w_scale**2, b_scale**2)
    return mean + var.sqrt() * torch.randn_like(mean)


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
    (*S, N, d_L) network outputs. Each layer is the effectful :func:`affine`, so an
    effect handler such as :class:`~bnn_zoo.core.handlers.local_reparameterization`
    can change how it is evaluated.
    """
    h = x
    last = len(params) - 1
    for i, (weight, bias) in enumerate(params):
        h = affine(h, weight, bias)
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

