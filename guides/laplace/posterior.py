"""The Laplace posterior of a Bayesian MLP and its closed-form GLM predictive (seed 001,
first half; Bishop, PRML 5.7; MacKay 1992).

Model (seed 001): ``p(t | x, w) = N(t | y(x, w), beta^-1)`` (or a categorical likelihood
with ``beta = 1``), prior ``p(w | alpha) = N(w | 0, alpha^-1 I)``. With ``w_MAP`` a mode of
the log joint, the posterior is approximated by

.. math::  q(w) = N(w | w_MAP, A^{-1}),   A = \\alpha I + \\beta H,

where ``H`` is a curvature of the unit-precision negative log-likelihood ``E_D(w)``
(:mod:`bnn_zoo.guides.curvature`) held in the structures of
:mod:`bnn_zoo.guides.laplace.blocks`.

GLM predictive (the seed's linearised network):
``y(x, w) ~ y(x, w_MAP) + g^T (w - w_MAP)``, so
``p(t | x) = N(t | y(x, w_MAP), sigma^2(x))`` with ``sigma^2(x) = 1 / beta + g^T A^-1 g``
(PRML 5.173); for classification the probit approximation
``softmax(f_k / sqrt(1 + pi/8 g_k^T A^-1 g_k))`` (PRML 4.153, applied per class, MacKay
1992). The same predictive as a Pyro model whose weights the guide samples is
:class:`~bnn_zoo.guides.laplace.linearized.LinearizedModel`.

Evidence (the seed's formula, PRML 5.175, with ``W`` the number of weights)::

    log p(D | alpha, beta) = -beta E_D(w_MAP) - alpha/2 w_MAP^T w_MAP - 1/2 log|A|
                             + W/2 log alpha + N/2 log beta - N/2 log(2 pi)

The seed's ``A = alpha I + beta H`` with ``H = Hess(SSE)`` is read with the SSE
carrying the factor 1/2 of its ``E(w)``; for the ``last_layer`` structure the
evidence and ``W`` count the last layer's weights only, the others being fixed at
the MAP like hyperparameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from bnn_zoo.core.checks import check_data
from bnn_zoo.core.predictive import CategoricalPredictive, GaussianMixturePredictive
from bnn_zoo.guides.curvature import ParameterLayout, check_dense_fits, jacobian
from bnn_zoo.guides.laplace.blocks import Block, block_from_state

__all__ = ["LaplacePosterior"]


@dataclass
class LaplacePosterior:
    """``N(theta_map, A^-1)`` with ``A = diag(alpha_layer) + beta H`` in a given structure.

    Attributes
    ----------
    layout : where each weight tensor sits in ``theta`` (P,).
    theta : (P,) the MAP.
    blocks : the precision structure; weights outside every block stay at the MAP.
    alpha : (L,) prior precision of each layer (all equal unless fitted per layer).
    beta : noise precision (1 for classification).
    likelihood : ``"gaussian"`` or ``"categorical"``.
    energy : ``E_D(theta)``, the unit-precision negative log-likelihood at the MAP.
    num_outputs : ``N K``, the number of observed numbers (regression: ``N``).
    act : hidden activation of the network.
    history : ``(alpha, beta, log evidence)`` after each evidence iteration.
    """

    layout: ParameterLayout
    theta: Tensor
    blocks: list[Block]
    alpha: Tensor
    beta: Tensor
    likelihood: str
    energy: Tensor
    num_outputs: int
    act: Callable[[Tensor], Tensor] = field(repr=False)
    history: list[tuple[list[float], float, float]] = field(default_factory=list)

    def state_dict(self) -> dict:
        """Everything but ``layout`` and ``act`` (the model's), as tensors and plain data:
        :meth:`from_state` rebuilds this posterior from it without the training data."""
        return {"theta": self.theta, "alpha": self.alpha, "beta": self.beta,
                "likelihood": self.likelihood, "energy": self.energy,
                "num_outputs": self.num_outputs,
                "blocks": [block.state_dict() for block in self.blocks],
                "history": [(list(a), b, e) for a, b, e in self.history]}

    @classmethod
    def from_state(cls, state: dict, layout: ParameterLayout,
                   act: Callable[[Tensor], Tensor]) -> LaplacePosterior:
        """The posterior of :meth:`state_dict` on the network ``layout`` with activation
        ``act`` (both from the model the posterior was fitted to)."""
        theta = state["theta"]
        if theta.shape != (layout.num_parameters,):
            raise ValueError(f"Expected a saved MAP of shape ({layout.num_parameters},) for "
                             f"the network {layout.sizes}, but got {tuple(theta.shape)}.")
        blocks = [block_from_state(block) for block in state["blocks"]]
        history = [(list(a), b, e) for a, b, e in state["history"]]
        return cls(layout, theta, blocks, state["alpha"], state["beta"], state["likelihood"],
                   state["energy"], state["num_outputs"], act, history)

    @property
    def clipped(self) -> int:
        """Negative Hessian eigenvalues set to zero (``indefinite="clip"``)."""
        return sum(b.clipped for b in self.blocks)

    @property
    def covered_layers(self) -> list[int]:
        """Layers whose weights the Gaussian covers (all but ``last_layer``'s)."""
        starts = [b.index.start for b in self.blocks]
        stops = [b.index.stop for b in self.blocks]
        return [i for i, s in enumerate(self.layout.layer_slices)
                if any(a <= s.start and s.stop <= b for a, b in zip(starts, stops))]

    def alpha_vector(self, alpha: Tensor | None = None) -> Tensor:
        """(P,) prior precision of every weight."""
        alpha = self.alpha if alpha is None else alpha
        return alpha[self.layout.layer_index(self.theta)]

    def layer_sums(self, values: Tensor) -> Tensor:
        """(L,) the sum of ``values`` (P,) over each layer's weights."""
        out = values.new_zeros(self.layout.num_layers)
        return out.index_add_(0, self.layout.layer_index(values), values)

    def log_det(self, alpha: Tensor | None = None, beta: Tensor | None = None) -> Tensor:
        """``log |A|`` (covered weights)."""
        a = self.alpha_vector(alpha)
        b = self.beta if beta is None else beta
        return sum(block.log_det(a[block.index], b) for block in self.blocks)

    def log_evidence(self, alpha: Tensor | float | None = None,
                     beta: Tensor | float | None = None) -> Tensor:
        """The seed's Laplace evidence ``log p(D | alpha, beta)`` at this MAP and curvature.

        ``alpha`` a number or a per-layer (L,) tensor; default the fitted values.
        Differentiable in ``alpha`` and ``beta``.
        """
        alpha = self._as_alpha(alpha)
        beta = self.beta if beta is None else torch.as_tensor(beta, dtype=self.theta.dtype,
                                                              device=self.theta.device)
        covered = self.covered_layers
        sq = self.layer_sums(self.theta**2)[covered]
        counts = self.layer_sums(torch.ones_like(self.theta))[covered]
        a = alpha[covered]
        out = -0.5 * (a * sq).sum() + 0.5 * (counts * torch.log(a)).sum()
        out = out - 0.5 * self.log_det(alpha, beta)
        if self.likelihood == "gaussian":
            n = self.num_outputs
            return out - beta * self.energy + 0.5 * n * torch.log(beta) \
                - 0.5 * n * math.log(2 * math.pi)
        return out - self.energy

    def _as_alpha(self, alpha: Tensor | float | None) -> Tensor:
        if alpha is None:
            return self.alpha
        alpha = torch.as_tensor(alpha, dtype=self.theta.dtype, device=self.theta.device)
        return alpha.expand(self.layout.num_layers)

    def effective_parameters(self) -> Tensor:
        """(L,) ``gamma_l = W_l - alpha_l tr_l(A^-1)`` of each covered layer (0 elsewhere)."""
        a = self.alpha_vector()
        gamma = torch.zeros_like(self.theta)
        for block in self.blocks:
            ab = a[block.index]
            gamma[block.index] = 1 - ab * block.inverse_diagonal(ab, self.beta)
        return self.layer_sums(gamma)

    def offset(self, eps: Tensor) -> Tensor:
        """(..., P) a draw from ``N(0, A^-1)`` given standard normal ``eps`` (..., P)."""
        a = self.alpha_vector()
        out = torch.zeros_like(eps)
        for block in self.blocks:
            out[..., block.index] = block.offset(eps[..., block.index], a[block.index], self.beta)
        return out

    def covariance(self) -> Tensor:
        """(P, P) dense ``A^-1`` (zero rows for weights held at the MAP)."""
        p = self.layout.num_parameters
        check_dense_fits(p, self.theta.dtype, "covariance")
        a = self.alpha_vector()
        out = self.theta.new_zeros(p, p)
        for block in self.blocks:
            out[block.index, block.index] = block.covariance(a[block.index], self.beta)
        return out

    def function_variance(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Output ``f`` (N, K) at the MAP and the GLM variances ``g_k^T A^-1 g_k`` (N, K)."""
        f, g = jacobian(self.theta, x, self.layout, self.act)
        a = self.alpha_vector()
        rows = g.flatten(0, 1)
        var = sum(block.quadratic(rows[:, block.index], a[block.index], self.beta)
                  for block in self.blocks)
        return f, var.reshape(f.shape)

    def glm_predictive(self, x: Tensor) -> GaussianMixturePredictive | CategoricalPredictive:
        """The linearised predictive at ``x`` (N, D), as a one-component predictive.

        Regression: ``N(f(x), 1/beta + g^T A^-1 g)``; classification: the probit
        approximation ``softmax(f / sqrt(1 + pi/8 g_k^T A^-1 g_k))``.
        """
        x, _ = check_data(x)
        with torch.no_grad():
            f, var = self.function_variance(x)
        if self.likelihood == "gaussian":
            scale = (var + 1 / self.beta).sqrt()
            return GaussianMixturePredictive(f.T.detach(), scale.T.detach())
        probs = torch.softmax(f * (1 + math.pi / 8 * var).rsqrt(), -1)
        return CategoricalPredictive(probs.unsqueeze(0).detach())

