"""The prior precision of a Laplace posterior chosen on held-out data: the grid search that
laplace-torch offers beside the marginal likelihood (Daxberger et al. 2021, "Laplace Redux --
Effortless Bayesian Deep Learning", section 2; Ritter et al. 2018, "A Scalable Laplace
Approximation for Neural Networks", who tune their prior on a validation set too).

The MAP and the curvature come from the points that are not held out; the held-out points
``(x_v, y_v)`` score each candidate ``c alpha`` (``c`` from a grid of factors, ``alpha`` the
prior precision the posterior has, per layer or shared, from the prior or from the evidence)
by their mean log-likelihood under the GLM predictive; for regression each candidate pairs
``c alpha`` with ``b beta``, ``b`` from a grid of its own:

.. math::  (\\hat c, \\hat b) = \\arg\\max_{c, b} \\frac{1}{V} \\sum_v
           \\log p(y_v \\mid x_v, c\\,\\alpha, b\\,\\beta),

and the posterior keeps ``c_hat alpha`` and ``b_hat beta``. Scaling all precisions by one
factor keeps the ratios between layers that the evidence found. Unlike the evidence, the
held-out likelihood scores the predictive itself: a classifier's calibration, and a
regression's noise where the training points' residuals understate it (a MAP that fits its
training noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from bnn_zoo._core.batches import is_loader
from bnn_zoo._core.checks import check_choice, check_fraction
from bnn_zoo._core.data import holdout
from bnn_zoo.methods._options import OptionGroup
from bnn_zoo.methods.laplace._posterior import LaplacePosterior

__all__ = ["AUTO_HOLDOUT", "BETA_GRID", "GRID", "ValidationSettings", "held_out_log_likelihood",
           "tune_on_held_out"]

#: The factors of ``alpha`` tried: 25 log-spaced from 1e-3 to 1e3 (four per decade).
GRID = tuple(10.0 ** (k / 4) for k in range(-12, 13))
#: The factors of a regression's ``beta`` tried: 13 log-spaced from 1e-2 to 1e2.
BETA_GRID = tuple(10.0 ** (k / 3) for k in range(-6, 7))
#: ``holdout="auto"``: the fraction held out of a classifier's points (a regression's keeps
#: all of them, its ``alpha`` and ``beta`` from the evidence alone).
AUTO_HOLDOUT = {"classification": 0.1, "regression": 0.0}


@dataclass(frozen=True)
class ValidationSettings(OptionGroup):
    """Whether and how ``alpha`` is chosen on held-out points.

    Attributes
    ----------
    holdout : the fraction of the training points held out (``0``: none, no grid), or
        ``"auto"``: `AUTO_HOLDOUT` of the task.
    grid : the factors of ``alpha`` tried, positive.
    beta_grid : the factors of a regression's ``beta`` tried, positive.
    """

    holdout: float | str = 0.0
    grid: tuple[float, ...] = GRID
    beta_grid: tuple[float, ...] = BETA_GRID

    def __post_init__(self) -> None:
        if isinstance(self.holdout, str):
            check_choice("holdout", self.holdout, ("auto",))
        else:
            check_fraction("holdout", self.holdout)
        for name in ("grid", "beta_grid"):
            grid = getattr(self, name)
            if (not isinstance(grid, (tuple, list)) or not grid
                    or not all(isinstance(c, (int, float)) and not isinstance(c, bool)
                               and 0 < c < math.inf for c in grid)):
                raise ValueError(f"Expected {name} as a non-empty sequence of positive finite "
                                 f"factors, but got {grid!r}.")

    def fraction(self, task: str) -> float:
        """The fraction held out of a ``task`` fit."""
        return AUTO_HOLDOUT[task] if self.holdout == "auto" else float(self.holdout)

    def split(self, x: Tensor, y: Tensor, task: str, seed: int
              ) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
        """``(x_fit, y_fit, held_out)``: the points the posterior is fitted to and the held-out
        ``(x_v, y_v)`` (``None`` when nothing is held out), a random fraction drawn from
        ``seed``. A loader's batches are not split: ``"auto"`` holds nothing out of them,
        and a fraction is refused."""
        if is_loader(x):  # a loader, or its Batches
            if self.holdout == "auto" or self.holdout == 0:
                return x, y, None
            raise ValueError(f"holdout={self.holdout} holds out points of tensors in memory; "
                             "expected holdout=0 or 'auto' (none) with a loader, or tensors.")
        fraction = self.fraction(task)
        if fraction == 0:
            return x, y, None
        x_fit, y_fit, x_val, y_val = holdout(x, y, fraction, seed=seed)
        return x_fit, y_fit, (x_val, y_val)


def held_out_log_likelihood(post: LaplacePosterior, x: Tensor, y: Tensor,
                            link: str = "probit") -> float:
    """The mean log-likelihood of ``y`` at ``x`` under ``post``'s GLM predictive
    (classification: by ``link``, the Monte Carlo one from a fixed generator); ``-inf``
    where it is not finite."""
    generator = torch.Generator(device=x.device).manual_seed(0)
    pred = post.glm_predictive(x, link, generator=generator)
    value = float(pred.log_prob(y).mean())
    return value if math.isfinite(value) else -math.inf


def tune_on_held_out(post: LaplacePosterior, x: Tensor, y: Tensor,
                     settings: ValidationSettings, link: str = "probit"
                     ) -> tuple[LaplacePosterior, list[tuple[float, float, float]]]:
    """``post`` with ``alpha`` (and a regression's ``beta``) scaled by the factors of
    ``settings.grid`` (and ``settings.beta_grid``) whose GLM predictive gives the held-out
    ``(x, y)`` the highest mean log-likelihood (the first of equals), and the
    ``(alpha factor, beta factor, log-likelihood)`` of every pair tried. The blocks of the
    returned posterior keep no factorisation of the candidates."""
    beta_grid = settings.beta_grid if post.likelihood.tunes_noise else (1.0,)
    scores = []
    for factor in settings.grid:
        for beta_factor in beta_grid:
            candidate = replace(post, alpha=post.alpha * factor, beta=post.beta * beta_factor)
            scores.append((float(factor), float(beta_factor),
                           held_out_log_likelihood(candidate, x, y, link)))
    best = max(range(len(scores)), key=lambda i: (scores[i][2], -i))
    factor, beta_factor, _ = scores[best]
    tuned = replace(post, alpha=post.alpha * factor, beta=post.beta * beta_factor)
    # Rebuilt from its state: blocks without the factors the grid kept, as a loaded fit's.
    return LaplacePosterior.from_state(tuned.state_dict(), tuned.layout), scores
