"""The protocol every inference method of the zoo follows (layer 3).

A method fits on standardised data and returns a :class:`Posterior` that predicts. SVI is
one method among others (Laplace, NUTS, ensembles, exact GP evidence); the zoo's entries
(:mod:`bnn_zoo.zoo`) declare which method they run and never call each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pyro
import torch
from torch import Tensor

from bnn_zoo.core.checks import (
    check_bool,
    check_choice,
    check_fraction,
    check_positive,
    check_positive_int,
)
from bnn_zoo.core.predictive import CategoricalPredictive, GaussianMixturePredictive
from bnn_zoo.core.step import KL_WEIGHTINGS
from bnn_zoo.core.training import FitResult

__all__ = ["Budget", "Method", "ModelFactory", "Posterior", "Predictive", "UnsupportedProblem",
           "load_module_state"]

Predictive = GaussianMixturePredictive | CategoricalPredictive

#: Builds a fresh Pyro model (on the device and in the dtype of the data) each call;
#: keyword arguments replace the entry's model options for that model (NUTS fixes the
#: noise scale of its MAP start with ``build_model(noise_scale=...)``).
ModelFactory = Callable[..., Callable]


class UnsupportedProblem(ValueError):
    """A method or entry cannot handle this problem (task, data size, ...); benchmarks and
    the CLI skip it and report the message as the reason."""


@dataclass(frozen=True)
class Budget:
    """A training budget, fixed in one place per entry for every data set.

    ``distributed=True`` trains data-parallel on the initialised ``torch.distributed``
    process group (see :mod:`bnn_zoo.core.distributed`); ``batch_size`` is then per
    process. ``validation > 0`` (regression, entries with ``tunable_noise``) holds that
    fraction of the training points out of the fit and sets the predictive's noise scale to
    the one that maximises their log-likelihood (see :mod:`bnn_zoo.evaluation.noise_tuning`).
    ``check_every`` is the number of steps between read-backs of the losses to the host
    (the NaN guard's checks; see :func:`bnn_zoo.core.training.fit`); ``None``: the
    runner's default, every step for a single fit, every 100 steps for replicas
    (:func:`bnn_zoo.core.replicas.fit_replicas`).
    """

    steps: int = 3000
    lr: float = 1e-2
    batch_size: int | None = 256
    num_particles: int = 1
    kl_weighting: str = "uniform"
    jit: bool = False
    distributed: bool = False
    validation: float = 0.0
    check_every: int | None = None

    def __post_init__(self) -> None:
        """Check every field (``dataclasses.replace`` runs this again), so a wrong type or
        range is refused here, naming the field, instead of being coerced or failing deep
        inside a method: ``steps``, ``num_particles`` ints >= 1, ``lr`` a finite number
        > 0, ``batch_size`` ``None`` or an int >= 1, ``kl_weighting`` one of
        :data:`~bnn_zoo.core.step.KL_WEIGHTINGS`, ``jit`` and ``distributed`` bools
        (not 0/1), ``validation`` a number in [0, 1), ``check_every`` ``None`` or an int
        >= 1."""
        check_positive_int("steps", self.steps)
        check_positive("lr", self.lr)
        check_positive_int("batch_size", self.batch_size, allow_none=True)
        check_positive_int("num_particles", self.num_particles)
        check_choice("kl_weighting", self.kl_weighting, KL_WEIGHTINGS)
        check_bool("jit", self.jit)
        check_bool("distributed", self.distributed)
        check_fraction("validation", self.validation)
        check_positive_int("check_every", self.check_every, allow_none=True)


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

    def state_dict(self) -> dict:
        """Everything :meth:`Method.restore` needs, as tensors and plain Python data
        (loadable with ``torch.load(weights_only=True)``)."""
        ...


class Method(Protocol):
    """An inference method: ``fit`` builds what it needs from ``build_model`` and fits it to
    standardised ``x`` (N, D), ``y`` (N,) under ``budget``, seeded by ``seed``;
    ``restore`` rebuilds the posterior of a ``Posterior.state_dict()`` (``x``, ``y``: a few
    standardised inputs and targets of the fit's shape, dtype and device, on which lazily
    built guides are run once to create their parameters).
    ``with_guide_options`` passes the keyword options of an SVI guide factory down to
    where the method builds its guides (a ``ValueError`` where it builds none)."""

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> Posterior:
        ...

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor) -> Posterior:
        ...

    def with_guide_options(self, options: dict) -> Method:
        ...


def _assign_buffers(module: torch.nn.Module, state: dict[str, Tensor]) -> None:
    """Set every buffer of ``module`` named in ``state`` to the stored tensor, whatever its
    current value (``None``, or data of another shape)."""
    for key, value in state.items():
        owner_name, _, name = key.rpartition(".")
        try:
            owner = module.get_submodule(owner_name)
        except AttributeError:  # a submodule built lazily, on the first call
            continue
        if name in owner._buffers:
            owner._buffers[name] = value


def load_module_state(module: torch.nn.Module, state: dict[str, Tensor], *,
                      initialise: Callable[[], object] | None = None) -> None:
    """``module.load_state_dict(state)`` for modules whose state ``load_state_dict`` alone
    cannot restore: buffers registered as ``None`` or holding data of another size (such
    as a guide's conditioning data) are set from ``state``, before and after
    ``initialise`` (called without gradients, in a private Pyro parameter store, so that
    lazily built parameters exist); then the state is loaded."""
    _assign_buffers(module, state)
    if initialise is not None:
        with torch.no_grad(), pyro.get_param_store().scope():
            initialise()
        _assign_buffers(module, state)
    module.load_state_dict(state)
