"""Stochastic variational inference as a method: one guide, trained by
[`bnn_zoo._core.training.fit`][] (Hoffman et al. 2013; Ranganath et al. 2014) under the
entry's budget ([`Budget.run`][bnn_zoo.methods.Budget.run]).

``SVI(guide, elbo)`` builds the model, builds ``guide(model, **guide_options)`` on the
data's device and dtype, and maximises the ELBO under the entry's [`Budget`][]. The
posterior is the trained pair: ``pyro.infer.Predictive(model, guide=guide)`` samples its
predictive, and [`bnn_zoo._core.predictive.predict`][] gives it as a distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import pyro
import pyro.infer
import torch
from torch import Tensor, nn

from bnn_zoo._core.batches import first_inputs
from bnn_zoo._core.predictive import predict
from bnn_zoo._core.training import FitResult
from bnn_zoo.methods._base import Budget, ModelFactory, Predictive
from bnn_zoo.methods._options import as_factory, check_keywords
from bnn_zoo.methods._state import (
    load_module_state,
    module_state,
    result_from_state,
    result_state,
)

__all__ = ["SVI", "SVIPosterior"]


def _initialise(guide: nn.Module, x: Tensor, y: Tensor) -> None:
    """Run ``guide`` once, without gradients and in a private parameter store, so that its
    lazily built parameters exist (Pyro's autoguides build them on the first call)."""
    with torch.no_grad(), pyro.get_param_store().scope():
        guide(x, y)


@dataclass
class SVIPosterior:
    """A model and its trained guide, in standardised units."""

    model: Callable
    guide: Callable
    result: FitResult | None
    diagnostics: dict[str, float] = field(default_factory=dict)

    def predict(self, x: Tensor, num_samples: int) -> Predictive:
        """[`bnn_zoo._core.predictive.predict`][] of the pair at standardised ``x``."""
        return predict(self.model, self.guide, x, num_samples=num_samples)

    def state_dict(self) -> dict:
        return {"model": module_state(self.model), "guide": module_state(self.guide),
                "result": result_state(self.result)}


@dataclass(frozen=True)
class SVI:
    """Fit ``guide(model, **guide_options)`` to the model by maximising ``elbo``.

    Parameters
    ----------
    guide : the guide factory, called as ``guide(model, **guide_options)``.
    elbo : a ``pyro.infer.ELBO`` subclass (``Trace_ELBO`` by default).
    guide_options : keyword options of the guide factory; ``entry.fit(...,
        guide_options={...})`` adds to them through [`with_guide_options`][].
    replicas : declares that [`fit_many`][] trains many fits as replicas in one
        vectorised pass (`bnn_zoo._core.replicas`): the built model has
        ``replicated(R)`` (as [`BayesianMLP`][bnn_zoo.models.BayesianMLP]) and the guide follows
        its replica plate with parameters per replica (the zoo's Bayes-by-Backprop and
        mean-field guides, Pyro's ``AutoDelta`` and ``AutoNormal``; not a guide that joins
        all weights in one vector, such as ``AutoLowRankMultivariateNormal``).

    Every field of the budget is honoured ([`Budget.run`][bnn_zoo.methods.Budget.run]); fits as
    replicas ([`fit_many`][]) refuse ``distributed=True``.
    """

    guide: Callable[..., Callable]
    elbo: type[pyro.infer.ELBO] = pyro.infer.Trace_ELBO
    guide_options: Mapping[str, Any] = field(default_factory=dict)
    replicas: bool = False
    #: Fits from a loader's batches ([`bnn_zoo._core.batches`][]), one per step.
    streams: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not callable(self.guide):
            raise TypeError(f"Expected guide to be a guide factory, but got {self.guide!r}.")
        if not (isinstance(self.elbo, type) and issubclass(self.elbo, pyro.infer.ELBO)):
            raise TypeError(f"Expected elbo to be a pyro.infer.ELBO subclass, got {self.elbo!r}.")
        check_keywords("guide_options", self.guide_options, as_factory(self.guide).options)

    def with_guide_options(self, options: Mapping[str, Any]) -> SVI:
        """This method with ``options`` added to the guide factory's options."""
        return replace(self, guide_options={**self.guide_options, **options})

    def build_guide(self, model: Callable, like: Tensor) -> Callable:
        """The guide of ``model``, on the device and in the dtype of ``like``."""
        guide = self.guide(model, **self.guide_options)
        if isinstance(guide, nn.Module):
            guide = guide.to(device=like.device, dtype=like.dtype)
        return guide

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> SVIPosterior:
        """Build model and guide and train them under ``budget``
        ([`Budget.run`][bnn_zoo.methods.Budget.run])."""
        model = build_model()
        return self._train(model, self.build_guide(model, first_inputs(x)), x, y, seed=seed,
                           budget=budget, progress=progress)

    def _train(self, model: Callable, guide: Callable, x: Tensor, y: Tensor, *, seed: int,
               budget: Budget, progress: bool | None) -> SVIPosterior:
        result = budget.run(model, guide, x, y, elbo=self.elbo, seed=seed, progress=progress)
        return SVIPosterior(model, guide, result)

    def fit_many(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str,
                 seeds: Sequence[int], budget: Budget, progress: bool | None
                 ) -> list[SVIPosterior]:
        """R fits as replicas in one pass (needs ``replicas=True``): replica ``r`` fits
        ``x[r]`` (N, D), ``y[r]`` (N,) from the initial values that [`fit`][] with
        ``seeds[r]`` would start from; all replicas take the minibatch order of
        ``seeds[0]``. Returns each replica's posterior as a single-fit pair, as [`fit`][]
        returns it. A model without ``replicated`` (a user's network,
        [`BayesianModule`][bnn_zoo.models.BayesianModule]) trains its fits one after the other, each
        as [`fit`][] with its seed would. ``budget.distributed`` is not supported (a
        ``ValueError``)."""
        if not self.replicas:
            raise ValueError("This SVI method does not declare replicas=True; fit one by one.")
        budget.check_supported("SVI.fit_many", distributed=False)
        models, guides = [], []
        for r, seed in enumerate(seeds):
            # The seeding of Entry.fit and then fit: the guide is built (Bayes by Backprop
            # draws its means) and its lazy parameters created (autoguides) from the seed.
            pyro.set_rng_seed(seed)
            models.append(build_model())
            guides.append(self.build_guide(models[-1], x[r]))
            pyro.set_rng_seed(seed)
            _initialise(guides[-1], x[r], y[r])
        if not callable(getattr(models[0], "replicated", None)):
            return [self._train(m, g, x[r], y[r], seed=seed, budget=budget, progress=progress)
                    for r, (m, g, seed) in enumerate(zip(models, guides, seeds))]
        def batched_guide(model: nn.Module) -> Callable:
            guide = self.build_guide(model, x)
            _initialise(guide, x, y)
            return guide

        results = budget.run_replicas(models, guides, batched_guide, x, y, elbo=self.elbo,
                                      seed=seeds[0], progress=progress)
        return [SVIPosterior(*pair) for pair in zip(models, guides, results)]

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor) -> SVIPosterior:
        """The posterior of `SVIPosterior.state_dict`: a fresh model and guide, the
        guide run once on ``x`` to create its lazily built parameters, then both loaded."""
        model = build_model()
        load_module_state(model, state["model"])
        guide = self.build_guide(model, x)
        if isinstance(guide, nn.Module):
            load_module_state(guide, state["guide"], initialise=lambda: guide(x, y))
        return SVIPosterior(model, guide, result_from_state(state["result"]))
