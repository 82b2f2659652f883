r"""Unnormalised log densities as Pyro models.

The mixture notes (on fitting an unnormalised posterior by a mixture of diagonal
Gaussians) fit an unnormalised posterior :math:`p_D(\theta) = L(D, \theta) p(\theta)`
known only up to its normaliser :math:`Z`. [`UnnormalisedModel`][] turns any
log density ``log_density(theta)`` (vectorised over leading dims) into a Pyro
model with one latent site ``theta`` under a flat prior and a
``pyro.factor("log_density", ...)``, so any guide and ELBO apply::

    model = UnnormalisedModel(lambda t: -0.5 * (t**2).sum(-1), dim=2)

The flat prior is a masked ``N(0, I)``: it contributes nothing to the joint and
is there so that Pyro's initialisation can draw a starting point.

Targets with a known normaliser (so that :math:`\mathrm{KL}(q \| p / Z) =
\log Z - \mathrm{ELBO}` can be reported): [`two_component`][], [`banana`][],
[`ring`][]. Without one: [`bnn_posterior`][], the weight posterior of a
small regression MLP, multimodal through its weight-space symmetries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import Tensor, nn

from bnn_zoo._core.checks import check_choice, check_data, check_positive, check_positive_int
from bnn_zoo._core.nn import activation as activation_fn
from bnn_zoo._core.nn import layer_sizes, mlp_forward

__all__ = ["TARGETS", "MLPLogPosterior", "UnnormalisedModel", "banana", "bnn_posterior",
           "ring", "target", "two_component"]


class UnnormalisedModel(PyroModule):
    """Pyro model ``model(x=None, y=None)`` of an unnormalised density over ``theta`` (D,).

    Parameters
    ----------
    log_density : maps ``theta`` of shape (..., D) to (...) log densities, up to a constant.
    dim : ``D``.
    log_normalizer : ``log Z`` if known, else ``None``.
    site : name of the latent site.

    ``x`` and ``y`` are accepted (and ignored) so the model has the zoo's signature;
    a data-dependent density closes over its data (see [`bnn_posterior`][]).
    The dtype and device of ``theta`` follow the model's buffers (``.double()``, ``.to()``).
    """

    def __init__(self, log_density: Callable[[Tensor], Tensor], dim: int, *,
                 log_normalizer: float | None = None, site: str = "theta") -> None:
        super().__init__()
        if not callable(log_density):
            raise TypeError(f"Expected log_density to be callable, but got {log_density!r}.")
        self.dim = check_positive_int("dim", dim)
        self.log_density = log_density
        self.log_normalizer = log_normalizer
        self.site = site
        self.register_buffer("origin", torch.zeros(dim))

    def forward(self, x: Tensor | None = None, y: Tensor | None = None) -> Tensor:
        flat = dist.Normal(self.origin, 1.0).to_event(1).mask(False)
        theta = pyro.sample(self.site, flat)
        pyro.factor("log_density", self.log_density(theta))
        return theta


def two_component(dim: int = 2, separation: float = 4.0, scale: float = 0.5) -> UnnormalisedModel:
    r""":math:`p(\theta) \propto e^{-|\theta - m|^2 / 2s^2} + e^{-|\theta + m|^2 / 2s^2}`,
    ``m = (separation / 2, 0, ..., 0)``: two equal, well separated modes;
    :math:`Z = 2 (2\pi s^2)^{D/2}`."""
    check_positive_int("dim", dim)
    check_positive("separation", separation)
    check_positive("scale", scale)

    def log_density(theta: Tensor) -> Tensor:
        shift = torch.zeros(dim, dtype=theta.dtype, device=theta.device)
        shift[0] = separation / 2
        sq = torch.stack([((theta - shift) ** 2).sum(-1), ((theta + shift) ** 2).sum(-1)], -1)
        return torch.logsumexp(-0.5 * sq / scale**2, -1)

    log_z = math.log(2.0) + 0.5 * dim * math.log(2 * math.pi * scale**2)
    return UnnormalisedModel(log_density, dim, log_normalizer=log_z)


def banana(curvature: float = 0.5, width: float = 1.5, thickness: float = 0.4) -> UnnormalisedModel:
    r"""A 2-D banana (a Rosenbrock-like curved ridge):
    :math:`\log p = -\theta_1^2 / 2a^2 - (\theta_2 - c(\theta_1^2 - a^2))^2 / 2t^2`.
    The shear has unit Jacobian, so :math:`Z = 2\pi a t`."""
    for name, value in (("curvature", curvature), ("width", width), ("thickness", thickness)):
        check_positive(name, value)

    def log_density(theta: Tensor) -> Tensor:
        t1, t2 = theta[..., 0], theta[..., 1]
        ridge = t2 - curvature * (t1**2 - width**2)
        return -0.5 * t1**2 / width**2 - 0.5 * ridge**2 / thickness**2

    log_z = math.log(2 * math.pi * width * thickness)
    return UnnormalisedModel(log_density, 2, log_normalizer=log_z)


def ring(radius: float = 2.0, thickness: float = 0.3) -> UnnormalisedModel:
    r"""A 2-D ring, :math:`\log p = -(|\theta| - r)^2 / 2t^2`, with
    :math:`Z = 2\pi\{t^2 e^{-r^2/2t^2} + r t \sqrt{2\pi}\,\Phi(r/t)\}`."""
    check_positive("radius", radius)
    check_positive("thickness", thickness)

    def log_density(theta: Tensor) -> Tensor:
        return -0.5 * (theta.norm(dim=-1) - radius) ** 2 / thickness**2

    phi = 0.5 * (1 + math.erf(radius / thickness / math.sqrt(2)))
    z = 2 * math.pi * (thickness**2 * math.exp(-0.5 * radius**2 / thickness**2)
                       + radius * thickness * math.sqrt(2 * math.pi) * phi)
    return UnnormalisedModel(log_density, 2, log_normalizer=math.log(z))


class MLPLogPosterior(nn.Module):
    r"""Unnormalised log posterior of a regression MLP's weights (flattened to ``theta``):

    .. math:: \log p(\theta | D) + \log Z = \sum_n \log N(y_n; f_\theta(x_n), \sigma^2)
              + \sum_j \log N(\theta_j; 0, s^2).

    ``theta`` (..., D) holds each layer's weight (row-major ``d_in x d_out``) then bias;
    the data are buffers, so ``.to(device)`` moves them.
    """

    def __init__(self, x: Tensor, y: Tensor, hidden: Sequence[int] = (10,), *,
                 activation: str = "tanh", noise_scale: float = 0.1,
                 prior_scale: float = 1.0) -> None:
        super().__init__()
        x, y = check_data(x, y)
        if y.dim() != 1 or not y.is_floating_point():
            raise ValueError(f"Expected y to be a float vector (N,), but got {tuple(y.shape)}.")
        self.sizes = layer_sizes(x.shape[1], tuple(hidden), 1)
        self.act = activation_fn(activation)
        self.noise_scale = check_positive("noise_scale", noise_scale)
        self.prior_scale = check_positive("prior_scale", prior_scale)
        self.register_buffer("x", x)
        self.register_buffer("y", y)
        self.dim = sum(d_in * d_out + d_out for d_in, d_out in zip(self.sizes[:-1], self.sizes[1:]))

    def unflatten(self, theta: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Split ``theta`` (..., D) into ``(W, b)`` per layer with leading shape (...)."""
        lead, params, pos = theta.shape[:-1], [], 0
        for d_in, d_out in zip(self.sizes[:-1], self.sizes[1:]):
            weight = theta[..., pos:pos + d_in * d_out].reshape(*lead, d_in, d_out)
            pos += d_in * d_out
            params.append((weight, theta[..., pos:pos + d_out]))
            pos += d_out
        return params

    def forward(self, theta: Tensor) -> Tensor:
        f = mlp_forward(self.x, self.unflatten(theta), self.act).squeeze(-1)  # (..., N)
        log_lik = dist.Normal(f, self.noise_scale).log_prob(self.y).sum(-1)
        return log_lik + dist.Normal(0.0, self.prior_scale).log_prob(theta).sum(-1)


def bnn_posterior(x: Tensor, y: Tensor, hidden: Sequence[int] = (10,), *,
                  activation: str = "tanh", noise_scale: float = 0.1,
                  prior_scale: float = 1.0) -> UnnormalisedModel:
    """The weight posterior of an MLP regression on ``(x, y)`` as an unnormalised target
    (``log Z`` unknown). See `MLPLogPosterior`."""
    log_post = MLPLogPosterior(x, y, hidden, activation=activation, noise_scale=noise_scale,
                               prior_scale=prior_scale)
    return UnnormalisedModel(log_post, log_post.dim).to(dtype=x.dtype, device=x.device)


TARGETS: dict[str, Callable[..., UnnormalisedModel]] = {
    "two_component": two_component, "banana": banana, "ring": ring}


def target(name: str, **options) -> UnnormalisedModel:
    """The toy target called ``name`` (see ``TARGETS``) with its options."""
    return TARGETS[check_choice("target", name, sorted(TARGETS))](**options)
