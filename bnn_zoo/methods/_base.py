"""The protocol every inference method of the zoo follows (layer 3).

A method fits on standardised data and returns a [`Posterior`][] that predicts. SVI is
one method among others (Laplace, NUTS, ensembles, exact GP evidence); the zoo's entries
([`bnn_zoo.zoo`][]) declare which method they run and never call each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyro
import pyro.infer
from torch import Tensor, nn

from bnn_zoo._core.checks import (
    check_bool,
    check_choice,
    check_positive,
    check_positive_int,
)
from bnn_zoo._core.lr_schedule import LR_SCHEDULES
from bnn_zoo._core.predictive import CategoricalPredictive, GaussianMixturePredictive
from bnn_zoo._core.replicas import REPLICA_CHECK_EVERY, fit_single_pairs
from bnn_zoo._core.step import KL_WEIGHTINGS
from bnn_zoo._core.training import FitResult, fit

__all__ = ["Budget", "Method", "ModelFactory", "Posterior", "Predictive",
           "UnsupportedProblem"]

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
    process group (see `bnn_zoo._core.distributed`); ``batch_size`` is then per
    process. ``check_every`` is the number of steps between read-backs of the losses to the host
    (the NaN guard's checks; see [`bnn_zoo._core.training.fit`][]); ``None``: the
    runner's default ([`check_interval`][]).

    A method trains under the budget whole: [`run`][] (one fit) and
    [`run_replicas`][] (many fits in one pass) turn it into a run of the SVI runner, and a
    method that cannot honour a field refuses it by name with [`check_supported`][]
    before it trains. Held-out points are the zoo entry's (``Entry.fit(...,
    validation=...)``): a method fits every point it is given.
    """

    steps: int = 3000
    lr: float = 1e-2
    lr_schedule: str = "constant"
    batch_size: int | None = 256
    num_particles: int = 1
    kl_weighting: str = "uniform"
    jit: bool = False
    distributed: bool = False
    check_every: int | None = None

    def __post_init__(self) -> None:
        """Check every field (``dataclasses.replace`` runs this again), so a wrong type or
        range is refused here, naming the field, instead of being coerced or failing deep
        inside a method: ``steps``, ``num_particles`` ints >= 1, ``lr`` a finite number
        > 0, ``lr_schedule`` one of `LR_SCHEDULES`,
        ``batch_size`` ``None`` or an int >= 1, ``kl_weighting`` one of
        `KL_WEIGHTINGS`, ``jit`` and ``distributed`` bools
        (not 0/1), ``check_every`` ``None`` or an int >= 1."""
        check_positive_int("steps", self.steps)
        check_positive("lr", self.lr)
        check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_positive_int("batch_size", self.batch_size, allow_none=True)
        check_positive_int("num_particles", self.num_particles)
        check_choice("kl_weighting", self.kl_weighting, KL_WEIGHTINGS)
        check_bool("jit", self.jit)
        check_bool("distributed", self.distributed)
        check_positive_int("check_every", self.check_every, allow_none=True)

    def check_supported(self, method: str, **supported: object) -> None:
        """Refuse the fields ``method`` cannot honour: ``supported`` maps a field name to
        the one value ``method`` trains with; a ``ValueError`` names ``method``, the first
        field that holds another value, and the value expected."""
        for name, value in supported.items():
            if name not in self.__dataclass_fields__:
                raise TypeError(f"Budget has no field {name!r}.")
            actual = getattr(self, name)
            if actual != value:
                raise ValueError(f"{method} does not support {name}={actual!r}; expected "
                                 f"{name}={value!r}.")

    def check_interval(self, *, replicas: bool = False) -> int:
        """Steps between the NaN guard's read-backs: ``check_every``, or where it is
        ``None`` every step for a single fit (a NaN leaves exactly the last finite
        parameters) and every `REPLICA_CHECK_EVERY` steps for
        replicas (whose steps then never wait for the host)."""
        if self.check_every is not None:
            return self.check_every
        return REPLICA_CHECK_EVERY if replicas else 1

    def _svi_options(self) -> dict[str, Any]:
        """The fields that every SVI run takes as they are."""
        return {"steps": self.steps, "lr": self.lr, "lr_schedule": self.lr_schedule,
                "batch_size": self.batch_size, "num_particles": self.num_particles,
                "kl_weighting": self.kl_weighting, "jit": self.jit}

    def run(self, model: Callable, guide: Callable, x: Tensor, y: Tensor, *,
            elbo: type[pyro.infer.ELBO], seed: int, progress: bool | None) -> FitResult:
        """Train ``guide`` to ``model`` on ``x``, ``y`` by maximising ``elbo`` under this
        budget ([`bnn_zoo._core.training.fit`][] with ``steps``, ``lr``,
        ``batch_size``, ``num_particles``, ``kl_weighting``, ``jit``, ``distributed`` and
        [`check_interval`][]), seeded by ``seed``."""
        return fit(model, guide, x, y, elbo=elbo, seed=seed, progress=progress,
                   distributed=self.distributed, check_every=self.check_interval(),
                   **self._svi_options())

    def run_replicas(self, models: Sequence[nn.Module], guides: Sequence[nn.Module],
                     build_guide: Callable[[nn.Module], nn.Module], x: Tensor, y: Tensor, *,
                     elbo: type[pyro.infer.ELBO], seed: int, progress: bool | None
                     ) -> list[FitResult]:
        """Train the R single-fit pairs ``(models[r], guides[r])`` on ``x[r]``, ``y[r]`` as
        the replicas of one pass under this budget
        (`bnn_zoo._core.replicas.fit_single_pairs`, whose batched guide is
        ``build_guide(batched_model)``, with the fields [`run`][] passes and
        [`check_interval`][] for replicas), every replica taking the minibatch order of
        ``seed``. Replicas train on one process: ``distributed=True`` is refused."""
        self.check_supported("Training as replicas", distributed=False)
        return fit_single_pairs(models, guides, build_guide, x, y, elbo=elbo, seed=seed,
                                progress=progress,
                                check_every=self.check_interval(replicas=True),
                                **self._svi_options())


@runtime_checkable
class Posterior(Protocol):
    """A fitted posterior on standardised data.

    ``model`` and ``guide`` are a Pyro pair whose ``pyro.infer.Predictive(model,
    guide=guide, ...)`` samples this posterior's predictive (``guide`` is ``None`` for a
    model without latent sites, such as an exact GP); [`predict`][] gives the same
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
        """Everything `Method.restore` needs, as tensors and plain Python data
        (loadable with ``torch.load(weights_only=True)``)."""
        ...


class Method(Protocol):
    """An inference method: ``fit`` builds what it needs from ``build_model`` and fits it to
    standardised ``x`` (N, D), ``y`` (N,) under ``budget``, seeded by ``seed``;
    ``restore`` rebuilds the posterior of a ``Posterior.state_dict()`` (``x``, ``y``: a few
    standardised inputs and targets of the fit's shape, dtype and device, on which lazily
    built guides are run once to create their parameters).
    ``with_guide_options`` passes the keyword options of an SVI guide factory down to
    where the method builds its guides (a ``ValueError`` where it builds none).

    What a caller may ask of a method is declared here: ``guide``, ``streams``,
    ``replicas`` and ``fit_many``. A method class that subclasses ``Method`` takes its
    defaults, those of a method without the capability: no guide factory of its own, no
    loader, one fit at a time.
    """

    #: The SVI guide factory ``guide(model, **guide_options)`` the method trains, or
    #: ``None`` where it trains none of its own (NUTS, an exact GP).
    guide: Callable[..., Callable] | None = None
    #: Whether [`fit`][] takes a loader's batches (``x`` a
    #: [`Batches`][bnn_zoo._core.batches.Batches], ``y`` ``None``) instead of tensors.
    streams: bool = False
    #: Whether [`fit_many`][] trains many fits as replicas in one vectorised pass.
    replicas: bool = False

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> Posterior:
        ...

    def fit_many(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str,
                 seeds: Sequence[int], budget: Budget, progress: bool | None
                 ) -> list[Posterior]:
        """R fits as replicas in one pass, fit ``r`` on ``x[r]``, ``y[r]`` from ``seeds[r]``
        (where `replicas`; a ``ValueError`` otherwise: fit one by one)."""
        raise ValueError(f"{type(self).__name__} does not train fits as replicas "
                         "(replicas=False); fit one by one.")

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor) -> Posterior:
        ...

    def with_guide_options(self, options: dict) -> Method:
        ...
