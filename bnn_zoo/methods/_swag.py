"""SWAG (Maddox et al. 2019, "A Simple Baseline for Bayesian Uncertainty in Deep Learning")
as a method: a Gaussian fitted to the iterates of stochastic optimisation around a MAP fit.

1. ``start`` (an [`SVI`][bnn_zoo.methods.SVI] with a point-mass guide, the zoo's MAP
   guide by default) fits the MAP under the entry's budget;
2. the optimisation goes on from there at the constant learning rate ``lr`` (the zoo's
   Adam, as every SVI fit of the zoo runs; the paper's SGD is one choice of the optimiser
   whose iterates wander around the mode), with the observation noise and any other model
   parameter fixed at the MAP fit's values; every ``every`` steps (one epoch by default)
   the point estimate ``theta_i`` (every weight, flattened) is collected, ``snapshots``
   times;
3. [`SWAGMoments`][] keeps their running mean ``theta_SWA``, diagonal variance
   ``Sigma_diag = mean(theta^2) - theta_SWA^2`` and the deviation ``theta_i - theta_SWA(i)``
   of each of the last ``K = rank`` iterates from the running mean after it (the columns
   of ``D``; Algorithm 1), and the posterior is
   ``N(theta_SWA, 1/2 (Sigma_diag + D D^T / (K - 1)))``
   ([`SWAGGuide`][bnn_zoo.guides.SWAGGuide], whose draws the predictive averages).

The posterior is a Pyro pair: the model and the SWAG guide
(``pyro.infer.Predictive(model, guide=guide)``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyro
import torch
from torch import Tensor

from bnn_zoo._core.checks import check_positive, check_positive_int
from bnn_zoo._core.step import SVIStep
from bnn_zoo._core.training import FitResult
from bnn_zoo.guides._flat_sites import flatten_sites
from bnn_zoo.guides._swag import SWAGGuide
from bnn_zoo.methods._base import Budget, Method, ModelFactory
from bnn_zoo.methods._state import load_module_state, result_from_state
from bnn_zoo.methods._svi import SVI, SVIPosterior

__all__ = ["SWAG", "SWAGMoments"]


class SWAGMoments:
    """The running moments of SWAG's iterates (Maddox et al. 2019, Algorithm 1).

    After ``n`` calls of [`update`][] with ``theta_1 .. theta_n`` (each (P,)): ``mean`` the
    average ``theta_SWA``, ``variance`` ``mean(theta^2) - theta_SWA^2`` (floored at zero
    against round-off), and ``deviations`` (P, min(n, rank)) the columns
    ``theta_i - mean(theta_1 .. theta_i)`` of the last ``rank`` iterates, oldest first.
    """

    def __init__(self, rank: int) -> None:
        self.rank = check_positive_int("rank", rank)
        self.count = 0
        self.mean: Tensor | None = None
        self.square: Tensor | None = None
        self._deviations: list[Tensor] = []

    def update(self, theta: Tensor) -> None:
        """Add the iterate ``theta`` (P,)."""
        theta = theta.detach()
        self.count += 1
        if self.mean is None:
            self.mean, self.square = theta.clone(), theta * theta
        else:
            self.mean = self.mean + (theta - self.mean) / self.count
            self.square = self.square + (theta * theta - self.square) / self.count
        self._deviations = [*self._deviations, theta - self.mean][-self.rank:]

    @property
    def variance(self) -> Tensor:
        return (self.square - self.mean * self.mean).clamp_min(0.0)

    @property
    def deviations(self) -> Tensor:
        return torch.stack(self._deviations, dim=1)


def _flat_point(guide: Callable, sites: list[tuple[str, tuple[int, ...]]], x: Tensor,
                y: Tensor) -> Tensor:
    """The point estimate of ``guide`` (its ``median``) flattened in the order of ``sites``,
    read in a private parameter store (the guide's own parameters)."""
    with torch.no_grad(), pyro.get_param_store().scope():
        point = guide.median(x, y)
    return flatten_sites(sites, point)


@dataclass(frozen=True)
class SWAG(Method):
    """SWAG after the MAP fit of ``start``; see the module doc.

    ``rank`` is ``K`` (at least 2, at most ``snapshots``), ``snapshots`` the number of
    iterates collected, ``every`` the steps between them (``None``: one epoch of the
    budget's minibatches), ``lr`` the constant learning rate after the MAP fit. The
    budget's ``batch_size``, ``num_particles`` and ``jit`` hold for both phases; the SWAG
    phase adds ``snapshots * every`` steps to the budget's ``steps``.
    """

    start: SVI
    rank: int = 20
    snapshots: int = 40
    every: int | None = None
    lr: float = 1e-2

    def __post_init__(self) -> None:
        check_positive_int("snapshots", self.snapshots)
        check_positive_int("every", self.every, allow_none=True)
        check_positive("lr", self.lr)
        if check_positive_int("rank", self.rank) < 2 or self.rank > self.snapshots:
            raise ValueError(f"Expected 2 <= rank <= snapshots ({self.snapshots}), but got "
                             f"rank={self.rank}.")

    @property
    def guide(self) -> Callable[..., Callable]:
        """The guide factory of the MAP start."""
        return self.start.guide

    def with_guide_options(self, options: Mapping[str, Any]) -> SWAG:
        return replace(self, start=self.start.with_guide_options(options))

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> SVIPosterior:
        """The MAP fit of ``start`` under ``budget``, then the SWAG phase from it."""
        budget.check_supported("SWAG", distributed=False)
        start = self.start.fit(build_model, x, y, task=task, seed=seed, budget=budget,
                               progress=progress)
        return self.collect(start, x, y, seed=seed, budget=budget)

    def collect(self, start: SVIPosterior, x: Tensor, y: Tensor, *, seed: int,
                budget: Budget) -> SVIPosterior:
        """The SWAG posterior from the MAP fit ``start`` (steps 2 and 3 of the module doc);
        its result holds the losses of both phases."""
        model, sites = start.model, start.model.sites
        fixed = [p for p in model.parameters() if p.requires_grad]
        began = time.perf_counter()
        try:
            for p in fixed:
                p.requires_grad_(False)
            step = SVIStep(model, start.guide, x, y, lr=self.lr, batch_size=budget.batch_size,
                           num_particles=budget.num_particles, elbo=self.start.elbo,
                           seed=seed, jit=budget.jit)
            every = self.every or step.num_batches
            moments, losses = SWAGMoments(self.rank), []
            for _ in range(self.snapshots):
                losses += [step() for _ in range(every)]
                moments.update(_flat_point(start.guide, sites, x, y))
        finally:
            for p in fixed:
                p.requires_grad_(True)
        guide = SWAGGuide(sites, moments.mean, moments.variance, moments.deviations)
        result = FitResult(losses=start.result.losses + losses,
                           seconds=start.result.seconds + time.perf_counter() - began,
                           steps=start.result.steps + len(losses))
        return SVIPosterior(model, guide, result, {"swag_rank": float(guide.rank)})

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor) -> SVIPosterior:
        """The posterior of `SVIPosterior.state_dict`: a fresh model, and the SWAG
        guide of its sites with the saved moments."""
        model = build_model()
        load_module_state(model, state["model"])
        saved = state["guide"]
        guide = SWAGGuide(model.sites, saved["mean"], saved["variance"], saved["deviations"])
        return SVIPosterior(model, guide, result_from_state(state["result"]),
                            {"swag_rank": float(guide.rank)})
