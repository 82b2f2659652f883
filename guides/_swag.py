"""The SWAG posterior as a guide (Maddox et al. 2019, "A Simple Baseline for Bayesian
Uncertainty in Deep Learning").

SWAG fits a Gaussian to the iterates of SGD around a mode: every weight of the model
flattened into one vector ``theta`` (the model's ``sites`` in order, each tensor flattened),

.. math::

    q(\\theta) = \\mathcal{N}\\Big(\\theta_\\mathrm{SWA},\\;
        \\tfrac{1}{2}\\big(\\Sigma_\\mathrm{diag} + \\tfrac{D D^\\top}{K - 1}\\big)\\Big),

with ``theta_SWA`` the mean of the iterates, ``Sigma_diag`` their diagonal variance and
``D`` (P, K) the deviations of the last ``K`` iterates (Sec. 3, Algorithm 1; the moments
are gathered by [`bnn_zoo.methods._swag.SWAGMoments`][]). [`SWAGGuide`][] draws
``theta`` as the paper does,

.. math::

    \\theta = \\theta_\\mathrm{SWA} + \\tfrac{1}{\\sqrt 2} \\Sigma_\\mathrm{diag}^{1/2} z_1
        + \\tfrac{1}{\\sqrt{2 (K - 1)}} D z_2, \\qquad z_1 \\sim \\mathcal{N}(0, I_P),\\;
        z_2 \\sim \\mathcal{N}(0, I_K),

(the distribution of Pyro's ``LowRankMultivariateNormal(theta_SWA, D / sqrt(2 (K - 1)),
Sigma_diag / 2)``, drawn without its capacitance matrix, which a variance of zero would make
singular), ``z_1`` and ``z_2`` at auxiliary sites ``swag.diagonal`` and ``swag.low_rank``,
and gives each weight site the point mass of its slice of ``theta``. So
``pyro.infer.Predictive(model, guide=guide)`` samples the SWAG predictive
``p(y | x) ~ 1/S sum_s p(y | x, theta_s)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyro
import pyro.distributions as dist
from pyro.nn import PyroModule
from torch import Tensor

from bnn_zoo.guides._flat_sites import unflatten_sites

__all__ = ["SWAGGuide"]


class SWAGGuide(PyroModule):
    """The SWAG Gaussian over the weight sites ``sites`` (``(name, shape)`` in the order
    ``theta`` holds them, as a zoo model's ``sites``): ``mean`` (P,) ``theta_SWA``,
    ``variance`` (P,) ``Sigma_diag`` and ``deviations`` (P, K) ``D``, with ``K >= 2``; held
    as buffers (they move with ``.to()`` and are saved in ``state_dict``)."""

    def __init__(self, sites: Sequence[tuple[str, tuple[int, ...]]], mean: Tensor,
                 variance: Tensor, deviations: Tensor) -> None:
        super().__init__()
        self.sites = [(name, tuple(shape)) for name, shape in sites]
        size = sum(math.prod(shape) for _, shape in self.sites)
        if mean.shape != (size,) or variance.shape != (size,) or deviations.dim() != 2 \
                or deviations.shape[0] != size or deviations.shape[1] < 2:
            raise ValueError(f"Expected mean and variance of shape ({size},) and deviations "
                             f"({size}, K) with K >= 2 for the sites' {size} weights, but got "
                             f"{tuple(mean.shape)}, {tuple(variance.shape)} and "
                             f"{tuple(deviations.shape)}.")
        self.register_buffer("mean", mean)
        self.register_buffer("variance", variance)
        self.register_buffer("deviations", deviations)

    @property
    def rank(self) -> int:
        """``K``, the number of deviation columns."""
        return self.deviations.shape[1]

    def sample_theta(self) -> Tensor:
        """A draw of ``theta`` (*S, P) from the auxiliary sites (see the module doc)."""
        size, rank = self.deviations.shape
        standard = self.mean.new_zeros(())
        z1 = pyro.sample("swag.diagonal", dist.Normal(standard, 1.0).expand([size]).to_event(1),
                         infer={"is_auxiliary": True})
        z2 = pyro.sample("swag.low_rank", dist.Normal(standard, 1.0).expand([rank]).to_event(1),
                         infer={"is_auxiliary": True})
        return (self.mean + (self.variance / 2).sqrt() * z1
                + (z2 @ self.deviations.mT) / math.sqrt(2 * (rank - 1)))

    def forward(self, x: Tensor, y: Tensor | None = None) -> dict[str, Tensor]:
        values = unflatten_sites(self.sites, self.sample_theta())
        return {name: pyro.sample(name, dist.Delta(values[name], event_dim=len(shape)))
                for name, shape in self.sites}
