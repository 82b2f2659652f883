"""The protocol every inference method of the zoo follows (layer 3).

A method fits on standardised data and returns a :class:`Posterior` that predicts. SVI is
one method among others (Laplace, NUTS, ensembles, exact GP evidence); the zoo's entries
(:mod:`bnn_zoo.zoo`) declare which method they run and never call each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

from bnn_zoo.core.predictive import CategoricalPredictive, GaussianMixturePredictive
from bnn_zoo.core.training import FitResult

__all__ = ["Budget", "Method", "ModelFactory", "Posterior", "Predictive"]

Predictive = GaussianMixturePredictive | CategoricalPredictive

#: Builds a fresh Pyro model (on the device and in the dtype of the data) each call.
ModelFactory = Callable[[], Callable]


@dataclass(frozen=True)
class Budget:
    """A training budget, fixed in one place per entry for every data set.

    ``distributed=True`` trains data-parallel on the initialised ``torch.distributed``
    process group (see :mod:`bnn_zoo.core.distributed`); ``batch_size`` is then per
    process. ``validation > 0`` (regression, entries with ``tunable_noise``) holds that
    fraction of the training points out of the fit and sets the predictive's noise scale to
    the one that maximises their log-likelihood (see :mod:`bnn_zoo.evaluation.noise_tuning`).
    """

    steps: int = 3000
    lr: float = 1e-2
    batch_size: int | None = 256
    num_particles: int = 1
    kl_weighting: str = "uniform"
    jit: bool = False
    distributed: bool = False
    validation: float = 0.0


@runtime_checkable
class Posterior(Protocol):
    """A fitted posterior on standardised data.

    ``model`` and ``guide`` are a Pyro pair whose ``pyro.infer.Predictive(model,
    guide=guide, ...)`` samples this posterior's predictive (``guide`` is ``None`` for a
    model without latent sites, such as an exact GP); :meth:`predict` gives the same
    predictive as a distribution, in closed form where the method has one.
    """

    model: Callable
    guide: Callable | None
    diagnostics: dict[str, float]
    result: FitResult | None

    def predict(self, x: Tensor, num_samples: int) -> Predictive:
        """The posterior predictive at standardised inputs ``x`` (N, D)."""
        ...


class Method(Protocol):
    """An inference method: ``fit`` builds what it needs from ``build_model`` and fits it to
    standardised ``x`` (N, D), ``y`` (N,) under ``budget``, seeded by ``seed``."""

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> Posterior:
        ...
