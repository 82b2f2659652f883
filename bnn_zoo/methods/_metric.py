"""The mass matrix of Hamiltonian Monte Carlo's kinetic energy, for the chains of
[`chees_hmc`][bnn_zoo.methods._chees.chees_hmc]: diagonal (one per group of chains) or dense,
estimated from warmup draws as Stan does (Stan Reference Manual, "HMC algorithm
parameters")."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Metric"]


@dataclass
class Metric:
    """The inverse mass matrix ``Sigma = L L^T`` of the kinetic energy ``p^T Sigma p / 2``:
    ``factor`` the scales ``(P,)`` of a diagonal one (or (C, P), one row per chain, for
    chains in groups) or, with ``dense``, the lower Cholesky factor ``L`` (P, P) of a dense
    one. Momenta are rows (C, P): ``p ~ N(0, Sigma^-1)``, velocity ``Sigma p``, whitened
    position ``q = L^-1 theta`` and velocity ``L^T p``."""

    factor: Tensor
    dense: bool = False

    @classmethod
    def unit(cls, like: Tensor) -> Metric:
        return cls(torch.ones(like.shape[-1], dtype=like.dtype, device=like.device))

    @classmethod
    def estimate(cls, window: Tensor, *, dense: bool, groups: int = 1) -> Metric:
        """The covariance (or variances) of a window of draws (W, C, P) of all chains
        pooled, regularised as Stan does, ``n/(n+5) S + 1e-3 * 5/(n+5) I`` over ``n``
        draws. Pooled over the chains, as ChEES-HMC's metric is: ChEES measures the chains'
        jumps against their spread, in the coordinates this metric whitens. With ``groups``
        G > 1 (diagonal only), the C chains are G groups of C/G consecutive ones, each
        sampling a posterior of its own: each group's variances pool its own chains, and
        ``factor`` is (C, P), each chain with its group's scales."""
        if groups > 1 and dense:
            raise ValueError("Expected a diagonal metric for chains in groups, but got "
                             "dense=True.")
        draws, chains, size = window.shape
        by_group = window.reshape(draws, groups, chains // groups, size).transpose(0, 1)
        n = draws * (chains // groups)
        centred = (by_group - by_group.mean((1, 2), keepdim=True)).reshape(groups, n, size)
        shrink, floor = n / (n + 5.0), 1e-3 * 5.0 / (n + 5.0)
        if not dense:
            scales = (shrink * centred.square().sum(1) / (n - 1) + floor).sqrt()
            return cls(scales[0] if groups == 1
                       else scales.repeat_interleave(chains // groups, 0))
        cov = shrink * centred[0].T @ centred[0] / (n - 1)
        cov.diagonal().add_(floor)
        return cls(torch.linalg.cholesky(cov), dense=True)

    def momentum(self, z: Tensor) -> Tensor:
        """``p = L^-T z`` of standard normal rows ``z``: a draw of ``N(0, Sigma^-1)``."""
        if not self.dense:
            return z / self.factor
        return torch.linalg.solve_triangular(self.factor, z, upper=False, left=False)

    def velocity(self, p: Tensor) -> Tensor:
        """``Sigma p``."""
        if not self.dense:
            return self.factor.square() * p
        return (p @ self.factor) @ self.factor.T

    def kinetic(self, p: Tensor) -> Tensor:
        """``p^T Sigma p / 2`` of every chain."""
        return 0.5 * (p * self.velocity(p)).sum(1)

    def whiten(self, theta: Tensor) -> Tensor:
        """``q = L^-1 theta``."""
        if not self.dense:
            return theta / self.factor
        return torch.linalg.solve_triangular(self.factor.T, theta, upper=True, left=False)

    def whitened_velocity(self, p: Tensor) -> Tensor:
        """``dq/dt = L^T p``."""
        return self.factor * p if not self.dense else p @ self.factor
