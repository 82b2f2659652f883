"""Weight priors for the MLP models.

A prior is a small object whose ``distribution(shape, like)`` returns the prior
of one whole weight tensor as a Pyro distribution with ``event_dim = len(shape)``
(so a guide's site for the same tensor agrees on ``event_dim``), with constants
created on the device and dtype of ``like``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.distributions.torch_distribution import TorchDistribution
from torch import Tensor

from bnn_zoo._core.checks import check_positive

__all__ = ["GaussianPrior", "ScaleMixtureNormal", "ScaleMixturePrior", "SitePriors",
           "TorchFanInPrior", "prior_of_site"]


@dataclass(frozen=True)
class GaussianPrior:
    """Isotropic Gaussian prior ``w ~ N(0, scale^2 I)`` (precision ``alpha = scale^-2``).

    With ``fan_in=True`` the scale of a weight matrix is ``scale / sqrt(d_in)``
    (Neal 1996), so the prior on the network output does not grow with the width.
    """

    scale: float = 1.0
    fan_in: bool = False

    def __post_init__(self) -> None:
        check_positive("scale", self.scale)

    @classmethod
    def from_precision(cls, alpha: float, fan_in: bool = False) -> GaussianPrior:
        """The prior with precision ``alpha`` (Bishop's notation): ``scale = alpha^-1/2``."""
        return cls(scale=check_positive("alpha", alpha) ** -0.5, fan_in=fan_in)

    def scale_for(self, shape: tuple[int, ...]) -> float:
        """Prior standard deviation of a tensor of ``shape`` (``(d_in, d_out)`` or ``(d_out,)``)."""
        if self.fan_in and len(shape) == 2:
            return self.scale / math.sqrt(shape[0])
        return self.scale

    def distribution(self, shape: tuple[int, ...], like: Tensor) -> dist.TorchDistribution:
        zero = torch.zeros((), dtype=like.dtype, device=like.device)
        return dist.Normal(zero, self.scale_for(shape)).expand(shape).to_event(len(shape))


class TorchFanInPrior(GaussianPrior):
    """[`GaussianPrior`][] with ``fan_in=True`` for tensors in torch's layout.

    A torch weight is ``(d_out, d_in, *kernel)`` (``Linear``, ``Conv1d/2d/3d``), so its
    fan-in is ``prod(shape[1:])`` (``d_in`` times the kernel size), and the prior scale is
    ``scale / sqrt(fan_in)`` (Neal 1996); tensors of one dimension (biases) keep ``scale``.
    [`BayesianModule`][bnn_zoo.models.BayesianModule] uses it in place of
    ``GaussianPrior(fan_in=True)``, whose ``scale_for`` reads the zoo's own ``(d_in, d_out)``
    layout.
    """

    def scale_for(self, shape: tuple[int, ...]) -> float:
        if self.fan_in and len(shape) >= 2:
            return self.scale / math.sqrt(math.prod(shape[1:]))
        return self.scale


class ScaleMixtureNormal(TorchDistribution):
    r"""Elementwise scale mixture of two zero-mean Gaussians (Blundell et al. 2015, eq. 7):

    .. math:: p(w) = \pi N(w; 0, \sigma_1^2) + (1 - \pi) N(w; 0, \sigma_2^2)

    evaluated with a log-sum-exp so that tiny ``sigma2`` does not underflow.
    """

    arg_constraints = {
        "pi": constraints.unit_interval,
        "sigma1": constraints.positive,
        "sigma2": constraints.positive,
    }
    support = constraints.real
    has_rsample = False

    def __init__(self, pi: Tensor, sigma1: Tensor, sigma2: Tensor,
                 validate_args: bool | None = None) -> None:
        self.pi, self.sigma1, self.sigma2 = torch.broadcast_tensors(pi, sigma1, sigma2)
        super().__init__(self.pi.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):  # noqa: D102
        shape = torch.Size(batch_shape)
        return ScaleMixtureNormal(self.pi.expand(shape), self.sigma1.expand(shape),
                                  self.sigma2.expand(shape), validate_args=False)

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        log_n1 = dist.Normal(0.0, self.sigma1).log_prob(value)
        log_n2 = dist.Normal(0.0, self.sigma2).log_prob(value)
        return torch.logaddexp(torch.log(self.pi) + log_n1, torch.log1p(-self.pi) + log_n2)

    def sample(self, sample_shape=torch.Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            first = torch.rand(shape, dtype=self.pi.dtype, device=self.pi.device) < self.pi
            scale = torch.where(first, self.sigma1.expand(shape), self.sigma2.expand(shape))
            return scale * torch.randn_like(scale)

    @property
    def mean(self) -> Tensor:
        return torch.zeros_like(self.pi)

    @property
    def variance(self) -> Tensor:
        return self.pi * self.sigma1**2 + (1 - self.pi) * self.sigma2**2


@dataclass(frozen=True)
class ScaleMixturePrior:
    """The Bayes-by-Backprop scale-mixture prior ``pi N(0, s1^2) + (1-pi) N(0, s2^2)``.

    Defaults follow the paper's grid (``pi=1/2``, ``-log s1 = 0``, ``-log s2 = 6``).
    """

    pi: float = 0.5
    sigma1: float = 1.0
    sigma2: float = math.exp(-6.0)

    def __post_init__(self) -> None:
        if not isinstance(self.pi, (int, float)) or not 0.0 < self.pi < 1.0:
            raise ValueError(f"Expected 0 < pi < 1, but got {self.pi!r}.")
        check_positive("sigma1", self.sigma1)
        check_positive("sigma2", self.sigma2)

    def distribution(self, shape: tuple[int, ...], like: Tensor) -> dist.TorchDistribution:
        def const(v: float) -> Tensor:
            return torch.tensor(v, dtype=like.dtype, device=like.device)

        base = ScaleMixtureNormal(const(self.pi), const(self.sigma1), const(self.sigma2))
        return base.expand(shape).to_event(len(shape))


@dataclass(frozen=True)
class SitePriors:
    """A prior per weight tensor, by sample-site name: the ``prior`` of a model whose
    tensors have different priors (layer-wise priors,
    [`BayesianModule`][bnn_zoo.models.BayesianModule] with a mapping or a function of the name).

    ``priors`` is the ``(site name, prior)`` of every site, in the model's order. Its
    `distribution` needs the site's name: [`prior_of_site`][] gives the prior of one.
    """

    priors: tuple[tuple[str, GaussianPrior | ScaleMixturePrior], ...]

    def for_site(self, name: str) -> GaussianPrior | ScaleMixturePrior:
        """The prior of the site ``name``."""
        for site, prior in self.priors:
            if site == name:
                return prior
        raise KeyError(f"No prior for the site {name!r}; the sites are "
                       f"{[site for site, _ in self.priors]}.")

    def distribution(self, shape: tuple[int, ...], like: Tensor) -> dist.TorchDistribution:
        raise TypeError("SitePriors holds a prior per site: take the site's prior with "
                        "prior_of_site(prior, name).distribution(shape, like).")


def prior_of_site(prior: object, name: str) -> object:
    """The prior of the site ``name`` under a model's ``prior``: ``prior`` itself for one
    prior shared by every site, the site's own for [`SitePriors`][]."""
    return prior.for_site(name) if isinstance(prior, SitePriors) else prior
