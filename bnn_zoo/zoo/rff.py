"""Zoo entry ``rff_logitnormal``: random-Fourier-feature net with LogitNormal input
scales (seed 000), trained by one of three objectives.

``objective`` (a fit option) picks the training schedule, see
:mod:`bnn_zoo.guides.logitnormal`:

* ``"alg3"`` (default): seed Algorithm 3, a fresh ``beta`` from its full
  conditional per sample of ``s``, ``num_particles`` = the seed's ``n_est``;
* ``"alg1"``: seed Algorithm 1, ``beta`` drawn once and held for ``inner_steps``
  (the seed's ``n_grad``, default 10) steps;
* ``"collapsed"``: ``beta`` integrated out.

The fitted guide exposes the learned input relevances,
``fitted.guide.relevance()`` (``E_q[s_d]`` and a 90% interval), and
:func:`bnn_zoo.guides.logitnormal.plot_relevance` draws them. Training runs on the
full batch: the full conditional of ``beta`` needs every training point anyway.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pyro.infer
from torch import Tensor

from bnn_zoo.core.checks import check_choice
from bnn_zoo.core.elbo import Algorithm1ELBO, CollapsedELBO, MeanFieldELBO
from bnn_zoo.guides.logitnormal import LogitNormalGuide
from bnn_zoo.models.rff import RandomFeatureRegression
from bnn_zoo.zoo import register
from bnn_zoo.zoo._entry import Budget, Entry, Fitted, svi_fitter

__all__ = ["OBJECTIVES", "objective_elbo", "rff_fitter", "rff_model"]

OBJECTIVES = ("alg3", "alg1", "collapsed")


def rff_model(in_dim: int, out_dim: int = 1, *, task: str = "regression",
              num_features: int = 100, bandwidth: float = 3.0, prior_loc: float = 0.0,
              prior_scale: float = 1.0, prior_variance: float = 1.0,
              noise_scale: float | None = None, feature_seed: int = 0) -> RandomFeatureRegression:
    """:class:`~bnn_zoo.models.rff.RandomFeatureRegression` with K = 100 features,
    ``W ~ N(0, 3^2)``, ``s_d ~ LogitNormal(0, 1)``, ``Var f = 1`` a priori, learned noise."""
    check_choice("task", task, ("regression",))
    if out_dim != 1:
        raise ValueError(f"Expected out_dim == 1 for regression, but got {out_dim}.")
    return RandomFeatureRegression(in_dim, num_features, bandwidth=bandwidth, prior_loc=prior_loc,
                                   prior_scale=prior_scale, prior_variance=prior_variance,
                                   noise_scale=noise_scale, feature_seed=feature_seed)


def objective_elbo(objective: str = "alg3", inner_steps: int = 10) -> type[pyro.infer.ELBO]:
    """The ELBO class of ``objective`` (one of :data:`OBJECTIVES`)."""
    check_choice("objective", objective, OBJECTIVES)
    if objective == "alg1":
        return Algorithm1ELBO.with_inner_steps(inner_steps)
    return CollapsedELBO if objective == "collapsed" else MeanFieldELBO


def rff_fitter(entry: Entry, x: Tensor, y: Tensor, *, task: str, out_dim: int, seed: int,
               budget: Budget, progress: bool | None, options: dict[str, Any]) -> Fitted:
    """:func:`~bnn_zoo.zoo._entry.svi_fitter` with the ELBO of ``options["objective"]``
    (and ``inner_steps`` for ``"alg1"``); the random features are drawn from ``seed``
    unless ``feature_seed`` is given."""
    options = {"feature_seed": seed, **options}
    elbo = objective_elbo(options.pop("objective", "alg3"), options.pop("inner_steps", 10))
    return svi_fitter(replace(entry, elbo=elbo), x, y, task=task, out_dim=out_dim,
                      seed=seed, budget=budget, progress=progress, options=options)


register(Entry(
    name="rff_logitnormal",
    description="random Fourier features with LogitNormal input scales, exact Gaussian "
                "conditional of the output weights (objective: alg3, alg1, collapsed)",
    tasks=("regression",),
    seed="000_3eeb858293040f6c.txt",
    model=rff_model,
    guide=LogitNormalGuide,
    budget=Budget(steps=1000, lr=5e-2, batch_size=None, num_particles=4),
    fitter=rff_fitter,
))
