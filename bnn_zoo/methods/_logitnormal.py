"""SVI of the LogitNormal random-feature pair (Coker's notes "LogitNormal model")
under one of its four objectives.

``objective`` picks the training schedule (see [`bnn_zoo.guides._logitnormal`][]):

* ``"alg3"`` (default): Coker's Algorithm 3 as an ELBO, a fresh ``beta`` from its full
  conditional per sample of ``s`` (``MeanFieldELBO``: the likelihood plus
  ``log p(beta) - log q(beta | s)``, minus ``KL(q(s) || p(s))``), ``num_particles`` = Coker's
  ``n_est``; in value and gradient the collapsed ELBO;
* ``"alg3_literal"``: Coker's Algorithm 3 as written, the likelihood minus ``KL(q(s) || p(s))``
  alone (``ExpectedLikelihoodELBO``): not a bound, and not the collapsed ELBO;
* ``"alg1"``: Coker's Algorithm 1, ``beta`` drawn once and held for ``inner_steps`` (Coker's
  ``n_grad``, default 10) steps;
* ``"collapsed"``: ``beta`` integrated out (full batch only).

The random features are drawn from the fit's seed unless ``feature_seed`` is given (the
model's ``feature_seed`` option is set by the method, so that ``entry.fit(seed=s)`` draws
new features for each seed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyro.infer
from torch import Tensor

from bnn_zoo._core.checks import check_choice, check_positive_int
from bnn_zoo._core.elbo import (
    Algorithm1ELBO,
    CollapsedELBO,
    ExpectedLikelihoodELBO,
    MeanFieldELBO,
)
from bnn_zoo.guides._logitnormal import LogitNormalGuide
from bnn_zoo.methods._base import Budget, ModelFactory
from bnn_zoo.methods._options import Factory
from bnn_zoo.methods._svi import SVI, SVIPosterior

__all__ = ["OBJECTIVES", "LogitNormalSVI", "objective_elbo"]

OBJECTIVES = ("alg3", "alg3_literal", "alg1", "collapsed")


def objective_elbo(objective: str = "alg3", inner_steps: int = 10) -> type[pyro.infer.ELBO]:
    """The ELBO class of ``objective`` (one of `OBJECTIVES`)."""
    check_choice("objective", objective, OBJECTIVES)
    if objective == "alg1":
        return Algorithm1ELBO.with_inner_steps(inner_steps)
    return {"alg3": MeanFieldELBO, "alg3_literal": ExpectedLikelihoodELBO,
            "collapsed": CollapsedELBO}[objective]


@dataclass(frozen=True)
class LogitNormalSVI(SVI):
    """[`SVI`][bnn_zoo.methods.SVI] of [`LogitNormalGuide`][] with the ELBO of
    ``objective`` (module doc); ``elbo`` is derived from it, not set."""

    guide: Callable[..., Callable] = Factory(LogitNormalGuide, ("init_loc", "init_scale"))
    objective: str = "alg3"
    inner_steps: int = 10
    feature_seed: int | None = None

    def __post_init__(self) -> None:
        check_positive_int("inner_steps", self.inner_steps)
        # The ELBO follows from the objective (frozen dataclass: set once, here).
        object.__setattr__(self, "elbo", objective_elbo(self.objective, self.inner_steps))
        super().__post_init__()

    def _features(self, build_model: ModelFactory, seed: int) -> ModelFactory:
        feature_seed = seed if self.feature_seed is None else self.feature_seed
        return lambda **overrides: build_model(**{"feature_seed": feature_seed, **overrides})

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> SVIPosterior:
        return super().fit(self._features(build_model, seed), x, y, task=task, seed=seed,
                           budget=budget, progress=progress)
