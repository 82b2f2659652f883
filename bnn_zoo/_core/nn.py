"""Functional MLP building blocks with weights as whole tensors, and the layers of wrapped
torch modules that effect handlers may evaluate differently.

A network is a list of ``(weight, bias)`` pairs with shapes ``(*S, d_in, d_out)``
and ``(*S, d_out)``. Any leading sample shape ``S`` is allowed, so one forward
pass evaluates many posterior samples at once::

    h_0 = x                                 # (N, d_0) or (*S, N, d_0)
    h_l = act(h_{l-1} @ W_l + b_l)          # (*S, N, d_l)
    f   = h_{L-1} @ W_L + b_L               # (*S, N, d_L), no activation

Two effectful operations let a handler change how a layer is evaluated without the model
knowing: `affine` (the zoo's own MLP layers) and `noisy_layer` (a layer of a
``torch.nn.Module`` wrapped by [`BayesianModule`][bnn_zoo.models.BayesianModule]). The estimators
that answer them live here: local reparameterisation (Kingma, Salimans & Welling 2015)
and flipout (Wen et al. 2018).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from pyro.poutine.runtime import effectful
from torch import Tensor, nn

from bnn_zoo._core.checks import check_choice, check_positive_int

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "gelu": torch.nn.functional.gelu,
    "identity": lambda h: h,
}


_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)  # erf'(z) = 2 / sqrt(pi) exp(-z^2)

#: The backward pass of each activation of `ACTIVATIONS`: ``(g, z, h) -> g * act'(z)``
#: for the upstream gradient ``g`` and ``h = act(z)``, by the kernels torch's autograd runs
#: (``threshold_backward`` and the like: one pass and one new tensor, which on a large
#: minibatch costs more than the arithmetic), for gradients written out by hand
#: (`bnn_zoo.methods.laplace._curvature.energy_and_gradient`).
ACTIVATION_BACKWARD: dict[Callable[[Tensor], Tensor],
                          Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    ACTIVATIONS["relu"]: lambda g, z, h: torch.ops.aten.threshold_backward(g, h, 0),
    ACTIVATIONS["tanh"]: lambda g, z, h: torch.ops.aten.tanh_backward(g, h),
    ACTIVATIONS["sigmoid"]: lambda g, z, h: torch.ops.aten.sigmoid_backward(g, h),
    ACTIVATIONS["erf"]: lambda g, z, h: (torch.exp(z.square().neg_())
                                         .mul_(_TWO_OVER_SQRT_PI).mul_(g)),
    ACTIVATIONS["gelu"]: lambda g, z, h: torch.ops.aten.gelu_backward(g, z),
    ACTIVATIONS["identity"]: lambda g, z, h: g,
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
    """``h @ W + b``, the bias added inside the matrix product (one pass over the output
    fewer than ``matmul`` then ``+``) wherever a BLAS kernel takes it: ``addmm`` for one
    weight sample, ``baddbmm`` for a stack of them on a stack of inputs of the same length
    (replicas), ``matmul`` (which broadcasts) otherwise.

    A stack of single-output layers (R replicas of a regression net's last layer) is a
    product and a sum over the inputs instead: the CPU's batched matrix product makes one
    BLAS call per replica, and for a matrix-vector product (and the outer products of its
    backward pass) the overhead of those calls outweighs their arithmetic, which the
    elementwise product and sum do in a few passes.
    """
    if h.dim() == 2 and weight.dim() == 2 and bias.dim() == 1:
        return torch.addmm(bias, h, weight)
    if h.dim() == weight.dim() == 3 and bias.dim() == 2 and h.shape[0] == weight.shape[0]:
        if weight.shape[-1] == 1:
            return (h * weight.mT).sum(-1, keepdim=True) + bias.unsqueeze(-2)
        return torch.baddbmm(bias.unsqueeze(-2), h, weight)
    return torch.matmul(h, weight) + bias.unsqueeze(-2)


@effectful(type="affine")
def affine(h: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``h @ W + b`` for weights with any leading sample dims.

    An effectful operation (message type ``"affine"``): an effect handler may compute
    it differently, e.g.
    [`local_reparameterization`][bnn_zoo.handlers.local_reparameterization] samples the
    pre-activations from the guide's Gaussian moments of ``W`` and ``b``. Without a handler it is
    the plain affine map.
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
    return torch.addcmul(mean, var.sqrt(), torch.randn_like(mean))


def rademacher_like(t: Tensor) -> Tensor:
    """Independent random signs ``+-1`` (probability 1/2 each) of the shape, device and dtype
    of ``t``. Under ``vmap(randomness="different")`` each sample draws its own. (Drawn "like"
    a tensor rather than from a shape, which ``torch.jit`` tracing under ``vmap`` cannot
    read.)"""
    return torch.randint_like(t.detach(), 2) * 2 - 1


def flipout_affine(h: Tensor, weight: tuple[Tensor, Tensor], bias: tuple[Tensor, Tensor]
                   ) -> Tensor:
    """Flipout (Wen et al. 2018) for ``h @ W + b`` with ``W = M + dW``, ``b = m + db``:

    .. math::

        h M + m + \\big((h \\odot s_{in}) \\, dW + db\\big) \\odot s_{out},

    with random signs ``s_in`` like ``h`` and ``s_out`` like the output, fresh per data
    point. Each point thereby sees the weights ``M + dW * (s_in s_out^T)``, which have the
    distribution of ``W`` whenever ``dW`` is symmetric elementwise (any diagonal Gaussian),
    so every point's expected loss and gradient are those of weight sampling, while the
    perturbations of different points in a minibatch are decorrelated. ``weight`` and
    ``bias`` are ``(draw, mean)`` pairs.
    """
    (w, w_loc), (b, b_loc) = weight, bias
    mean = _affine(h, w_loc, b_loc)
    perturbation = _affine(h * rademacher_like(h), w - w_loc, b - b_loc)
    return mean + perturbation * rademacher_like(perturbation)


#: Torch layers whose sampled tensors a handler may replace (see `noisy_layer`).
NOISY_LAYER_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def layer_forward(layer: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``layer(x)`` with ``weight`` and ``bias`` in place of the layer's own tensors: the
    affine map of an ``nn.Linear``, or the convolution of an ``nn.Conv{1,2,3}d`` with the
    layer's stride, padding (and padding mode), dilation and groups."""
    if isinstance(layer, nn.Linear):
        return nn.functional.linear(x, weight, bias)
    return layer._conv_forward(x, weight, bias)  # the convolution its forward computes


def channel_signs(layer: nn.Module, t: Tensor) -> Tensor:
    """Random signs for the input or output ``t`` of ``layer``, one per example (first
    dimension) and channel (the last dimension of a ``Linear``'s input, dimension 1 of a
    convolution's), shared by the other positions of an example (a sequence's steps, an
    image's pixels), which all use the same weights."""
    first = slice(0, 1)
    if isinstance(layer, nn.Linear):  # (N, ..., C): one sign per N and C
        index = (slice(None), *[first] * (t.dim() - 2), slice(None)) if t.dim() >= 2 else ()
    else:  # (N, C, *spatial), or (C, *spatial) unbatched: one sign per N and C
        index = (..., *[first] * len(layer.kernel_size))
    return rademacher_like(t[index])


def local_reparameterization_noise(layer: nn.Module, x: Tensor,
                                   variance: Mapping[str, Tensor]) -> Tensor:
    """The noise ``sqrt(layer(x^2; S^2, s^2)) * eps``, ``eps ~ N(0, I)`` per data point and
    output unit, that local reparameterisation adds to ``layer(x; M, m)`` for
    ``W ~ N(M, S^2)``, ``b ~ N(m, s^2)``: each output unit then has the mean and variance
    it has under weight sampling. ``variance`` holds ``S^2`` (``"weight"``) and ``s^2``
    (``"bias"``, absent for a layer without bias). The variance is floored at the
    smallest normal number so that a unit whose inputs are all zero (a layer without bias)
    gets a zero gradient, not the infinite one of ``sqrt`` at 0. The floor is
    ``threshold(var, tiny, tiny)``: the values of ``var.clamp_min(tiny)`` (NaN included)
    with a fused backward (``clamp_min``'s backward is a separate ``where``, an extra pass
    over the variance); the gradient differs from ``clamp_min``'s only at ``var == tiny``
    exactly (and at NaN).

    .. warning:: The units of a convolution at different positions (and a ``Linear``
        applied to every step of a sequence) share their weights, so under weight sampling
        they are correlated; here they get independent noise. Each unit's marginal is
        exact, but the objective is not that of weight sampling (use flipout for that).
    """
    var = layer_forward(layer, x * x, variance["weight"], variance.get("bias"))
    tiny = torch.finfo(var.dtype).tiny
    std = nn.functional.threshold(var, tiny, tiny).sqrt()
    return std * torch.randn_like(std)


def flipout_noise(layer: nn.Module, x: Tensor, delta: Mapping[str, Tensor]) -> Tensor:
    """The perturbation ``layer(x * s_in; dW, db) * s_out`` that flipout adds to
    ``layer(x; M, m)`` (see `flipout_affine`), ``delta`` holding the weight sample's
    deviation from the mean, ``dW = W - M`` (``"weight"``) and ``db = b - m`` (``"bias"``,
    absent for a layer without bias). The signs (`channel_signs`) are drawn per
    example and channel, so each example sees the weights ``M + dW * (s_out s_in^T)``,
    a sample of ``W`` when ``dW`` is symmetric elementwise."""
    out = layer_forward(layer, x * channel_signs(layer, x), delta["weight"], delta.get("bias"))
    return out * channel_signs(layer, out)


@dataclass(frozen=True)
class NoisyLayer:
    """How a handler evaluates one layer of a wrapped torch module (see `noisy_layer`):
    the layer runs with the tensors ``mean`` (by the layer's parameter name, ``"weight"``
    and ``"bias"``) in place of its sampled ones, and ``noise(layer, x, inputs)`` is added to
    its output, ``x`` being the layer's input. Each tensor of ``mean`` and ``inputs`` has
    the shape of the layer's parameter of that name, after optional leading sample
    dimensions like those of the weight samples (or none, when shared by all samples)."""

    mean: dict[str, Tensor]
    inputs: dict[str, Tensor]
    noise: Callable[[nn.Module, Tensor, Mapping[str, Tensor]], Tensor]


@effectful(type="noisy_layer")
def noisy_layer(layer: nn.Module, params: Mapping[str, Tensor]) -> NoisyLayer | None:
    """How to evaluate ``layer`` of a wrapped torch module whose own parameters were sampled
    as ``params`` (by parameter name, e.g. ``"weight"``, ``"bias"``; leading sample dims
    allowed).

    An effectful operation (message type ``"noisy_layer"``): without a handler the answer
    is ``None``, and the layer runs with the sampled tensors; a handler such as
    [`local_reparameterization`][bnn_zoo.handlers.local_reparameterization] or
    [`flipout`][bnn_zoo.handlers.flipout] answers a `NoisyLayer`.
    """
    return None


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
    (*S, N, d_L) network outputs. Each layer is the effectful `affine`, so an
    effect handler such as
    [`local_reparameterization`][bnn_zoo.handlers.local_reparameterization] can change how it
    is evaluated.
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

