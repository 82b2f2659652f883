"""The Laplace approximation as an inference method (Bishop 2006, *Pattern Recognition and
Machine Learning*, 5.7; MacKay 1992, "A Practical Bayesian Framework for Backpropagation
Networks").

[`Laplace`][] finds the MAP by SVI ([`bnn_zoo._core.training.fit`][] with a
[`LaplaceGuide`][bnn_zoo.methods.laplace.LaplaceGuide] as point mass, under
[`MeanFieldELBO`][bnn_zoo.elbo.MeanFieldELBO], which for a point mass is ``log p(y | w) +
log p(w)`` in as few operations as it can), then chains the steps of a
[`LaplaceProblem`][bnn_zoo.methods.laplace.LaplaceProblem] around it: it refines the MAP
by full-batch L-BFGS, builds the curvature in the structure of its `curvature`
and, if its `evidence` asks, maximises the evidence in ``alpha`` and
``beta`` ([`bnn_zoo.methods.laplace._evidence`][]). With points held out
(`validation`), the MAP, the curvature and the evidence use the
others, and ``alpha`` is then scaled by the factor of a grid whose GLM predictive gives the
held-out points the highest likelihood ([`bnn_zoo.methods.laplace._validation`][]).

The fitted ``alpha`` and ``beta`` live in the returned posterior only: nothing is written
into the model that ``build_model`` returned. The posterior's Pyro pair is the
[`LinearizedModel`][bnn_zoo.methods.laplace.LinearizedModel] (``predictive="glm"``, the GLM
predictive of Immer et al. 2021, "Improving predictions of Bayesian neural nets via local
linearization") or the [`NonlinearModel`][bnn_zoo.methods.laplace.NonlinearModel] (``"mc"``), each
with the posterior's ``alpha`` and noise ``beta^-1/2``, and the guide sampling
``N(w_MAP, A^-1)``. [`LaplaceFit.state_dict`][bnn_zoo.methods.laplace.LaplaceFit.state_dict] holds
the posterior (MAP, ``alpha``, ``beta``, the blocks' tensors, the evidence history) and
[`Laplace.restore`][bnn_zoo.methods.laplace.Laplace.restore] rebuilds the fit from it and a fresh
model (for the network's layout and activation), without the training data.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

import pyro
import torch
from torch import Tensor

from bnn_zoo._core.batches import first_inputs
from bnn_zoo._core.checks import check_choice, check_positive
from bnn_zoo._core.elbo import MeanFieldELBO
from bnn_zoo._core.predictive import predict
from bnn_zoo._core.training import FitResult
from bnn_zoo.methods._base import Budget, Method, ModelFactory, Predictive
from bnn_zoo.methods._state import load_module_state, module_state, result_from_state, result_state
from bnn_zoo.methods.laplace._evidence import EvidenceSettings
from bnn_zoo.methods.laplace._guide import LaplaceGuide
from bnn_zoo.methods.laplace._layouts import layout_of
from bnn_zoo.methods.laplace._linearized import LinearizedModel, NonlinearModel
from bnn_zoo.methods.laplace._posterior import LaplacePosterior, Link
from bnn_zoo.methods.laplace._problem import CurvatureSettings, laplace_posterior
from bnn_zoo.methods.laplace._validation import ValidationSettings, tune_on_held_out

__all__ = ["Laplace", "LaplaceFit", "PredictiveKind", "check_budget", "predictive_model"]


def check_budget(budget: Budget) -> None:
    """Refuse, by name, the fields of ``budget`` that the Laplace method cannot honour: its
    MAP phase fits a point mass, whose ELBO is the log joint itself, so one particle and
    no KL weighting (``num_particles=1``, ``kl_weighting="uniform"``); and it trains on
    one process, since its refits and curvatures need the whole training set
    (``distributed=False``)."""
    budget.check_supported("Laplace", num_particles=1, kl_weighting="uniform",
                           distributed=False)


class PredictiveKind(StrEnum):
    """The predictive of a Laplace fit: the linearised network (``glm``: closed form in
    [`LaplaceFit.predict`][bnn_zoo.methods.laplace.LaplaceFit.predict], Immer et al. 2021) or
    weights sampled through the network
    (``mc``)."""

    GLM = "glm"
    MC = "mc"


@dataclass(frozen=True, init=False)
class Laplace(Method):
    """The Laplace approximation (Bishop 2006, PRML 5.7; MacKay 1992 for the evidence; the
    curvature structures and the GLM predictive as in Daxberger et al. 2021, "Laplace
    Redux: Effortless Bayesian Deep Learning") as a [`Method`][bnn_zoo.methods.Method].

    Its fields are the settings of its steps, each checked as a whole:

    curvature : the structure of ``H`` and its options
    ([`CurvatureSettings`][bnn_zoo.methods.laplace.CurvatureSettings]; default the full
    GGN). evidence : the MAP refits and the evidence tuning of ``alpha`` and ``beta``
        ([`EvidenceSettings`][bnn_zoo.methods.laplace.EvidenceSettings]; default refits, no
        tuning).
    validation : the points held out to choose ``alpha`` on a grid
        ([`ValidationSettings`][bnn_zoo.methods.laplace.ValidationSettings]; default
        none).
    prior_precision : ``None`` (default: the model's isotropic prior), one number, one
        per layer (a sequence of ``L``) or one per weight (a (P,) tensor; no evidence
        tuning then).
    prior_mean : the prior mean, a number (default 0) or a (P,) tensor.
    predictive : a [`PredictiveKind`][], ``"glm"`` (default) or ``"mc"``.
    link : how the GLM predictive averages the softmax over the Gaussian logits of a
        classifier ([`Link`][bnn_zoo.methods.laplace.Link]): ``"probit"`` (default) or
        ``"mc"`` (``num_samples`` draws).
    bias_scale : standard deviation of the guide's initial biases (default 1); the method
        builds its own guide and takes no ``guide_options``.
    replicas : declares that [`fit_many`][] trains the MAP phases of many fits as
        replicas in one pass (default ``True``; ``Entry.fit_many`` and ``benchmarks/uci.py``
        then batch the splits of a data set); ``False`` fits them one by one.

    Its text form (``method_options``, the command line;
    `keywords`) names the settings' own fields:
    ``Laplace(curvature="low_rank", rank=5, evidence="fixed_point", holdout="auto")`` is
    ``Laplace(curvature=CurvatureSettings("low_rank", rank=5),
    evidence=EvidenceSettings("fixed_point"), validation=ValidationSettings("auto"))``.
    """

    curvature: CurvatureSettings
    evidence: EvidenceSettings
    validation: ValidationSettings
    prior_precision: float | tuple[float, ...] | Tensor | None
    prior_mean: float | Tensor
    predictive: PredictiveKind
    link: Link
    bias_scale: float
    replicas: bool
    #: Fits from a loader's batches ([`bnn_zoo._core.batches`][]): the MAP by SVI, one
    #: batch per step; the refits, curvature and energies as sums over one pass.
    streams: ClassVar[bool] = True

    def __init__(self, curvature: CurvatureSettings | str = "ggn",
                 evidence: EvidenceSettings | str | None = None,
                 validation: ValidationSettings = ValidationSettings(), *,
                 prior_precision: float | tuple[float, ...] | Tensor | None = None,
                 prior_mean: float | Tensor = 0.0, predictive: str = "glm",
                 link: str = "probit", bias_scale: float = 1.0, replicas: bool = True,
                 **options: Any) -> None:
        """``curvature`` and ``evidence`` are settings, or the name they hold; ``options``
        are fields of the settings by name (``rank=5``, ``holdout="auto"``), which replace
        those of the settings given."""
        settings = {"curvature": _settings(CurvatureSettings, curvature, options),
                    "evidence": _settings(EvidenceSettings, evidence, options),
                    "validation": _settings(ValidationSettings, validation, options)}
        if options:
            raise TypeError(f"Laplace got unexpected keyword arguments {sorted(options)}.")
        values = {**settings, "prior_precision": prior_precision, "prior_mean": prior_mean,
                  "predictive": PredictiveKind(check_choice("predictive", predictive,
                                                            tuple(PredictiveKind))),
                  "link": Link(check_choice("link", link, tuple(Link))),
                  "bias_scale": bias_scale, "replicas": replicas}
        check_positive("bias_scale", bias_scale)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> LaplaceFit:
        """MAP by SVI under ``budget``, then the Laplace posterior of ``build_model()``: a
        [`BayesianMLP`][bnn_zoo.models.BayesianMLP] or a
        [`BayesianModule`][bnn_zoo.models.BayesianModule] (any torch module, inputs of any shape;
        ``kron`` needs its layers to be ``nn.Linear``,
        ``nn.Conv1d`` or ``nn.Conv2d``)."""
        check_budget(budget)
        x, y, held_out = self.validation.split(x, y, task, seed)
        model, guide = self._model_and_guide(build_model, first_inputs(x), task, seed)
        result = budget.run(model, guide, x, y, elbo=MeanFieldELBO, seed=seed,
                            progress=progress)
        return self._posterior(model, guide, x, y, result, held_out)

    def fit_many(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str,
                 seeds: Sequence[int], budget: Budget, progress: bool | None
                 ) -> list[LaplaceFit]:
        """R fits, fit ``r`` on ``x[r]`` (N, D), ``y[r]`` (N,) from ``seeds[r]``: the MAP
        phases of all R as replicas in one vectorised pass (`bnn_zoo._core.replicas`),
        then each replica's posterior (refits, curvature, evidence) as [`fit`][] builds it.

        Replica ``r``'s guide starts where [`fit`][] with ``seeds[r]`` starts it; every
        replica takes the minibatch order of ``seeds[0]``, so on full batches
        (``batch_size=None``) fit ``r`` is [`fit`][]'s up to round-off, and otherwise
        equal in distribution. A model without ``replicated`` (a user's
        [`BayesianModule`][bnn_zoo.models.BayesianModule]) is fitted one by one, each as [`fit`][]
        with its seed (after ``pyro.set_rng_seed(seed)``, as ``Entry.fit`` does)."""
        if not self.replicas:
            raise ValueError("This Laplace method declares replicas=False; fit one by one.")
        check_budget(budget)
        if not callable(getattr(build_model(), "replicated", None)):
            fits = []
            for r, seed in enumerate(seeds):
                pyro.set_rng_seed(seed)  # as Entry.fit before each single fit
                fits.append(self.fit(build_model, x[r], y[r], task=task, seed=seed,
                                     budget=budget, progress=progress))
            return fits
        splits = [self.validation.split(x[r], y[r], task, seed)
                  for r, seed in enumerate(seeds)]
        x = torch.stack([split[0] for split in splits])
        y = torch.stack([split[1] for split in splits])
        models, guides = [], []
        for r, seed in enumerate(seeds):
            pyro.set_rng_seed(seed)
            model, guide = self._model_and_guide(build_model, x[r], task, seed)
            models.append(model)
            guides.append(guide)
        results = budget.run_replicas(models, guides,
                                      lambda model: self.build_guide(model, x), x, y,
                                      elbo=MeanFieldELBO, seed=seeds[0], progress=progress)
        return [self._posterior(*pair, x[r], y[r], result, splits[r][2])
                for r, (pair, result) in enumerate(zip(zip(models, guides), results))]

    def _model_and_guide(self, build_model: ModelFactory, like: Tensor, task: str,
                         seed: int) -> tuple[Any, LaplaceGuide]:
        """The model of ``build_model`` (checked to be a ``task`` one) and its point-mass
        guide, whose initial means are drawn from ``seed``."""
        model = build_model()
        if model.task != task:
            raise ValueError(f"Expected a {task} model from build_model, but got a "
                             f"{model.task} one.")
        return model, self.build_guide(model, like,
                                       generator=torch.Generator().manual_seed(seed))

    def _posterior(self, model, guide: LaplaceGuide, x: Tensor, y: Tensor,
                   result: FitResult, held_out: tuple[Tensor, Tensor] | None) -> LaplaceFit:
        """The fit around the MAP ``guide`` holds: [`laplace_posterior`][], its ``alpha``
        scaled on the ``held_out`` points (if any), the guide set to sample it, and the
        predictive's Pyro model."""
        with torch.no_grad():
            theta = guide.theta()
        post = laplace_posterior(model, theta, x, y, curvature=self.curvature,
                                 evidence=self.evidence, alpha=self.prior_precision,
                                 prior_mean=self.prior_mean)
        if held_out is not None:
            post, _ = tune_on_held_out(post, *held_out, self.validation, self.link)
        guide.set_posterior(post)
        return LaplaceFit(post, predictive_model(post, self.predictive), guide,
                          self.predictive, result, self.link, model)

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor) -> LaplaceFit:
        """The fit of [`LaplaceFit.state_dict`][bnn_zoo.methods.laplace.LaplaceFit.state_dict]: a
        fresh model gives the network's layout and activation, the posterior is rebuilt from the
        saved blocks (nothing is recomputed), the guide is loaded and holds it, and the Pyro model
        of the saved ``predictive`` is built on it. The fresh model takes the saved state of the one
        the posterior was fitted to first (a network's deterministic tensors and running
        statistics, which its layout reads)."""
        model = build_model()
        if "source" in state:
            load_module_state(model, state["source"])
        post = LaplacePosterior.from_state(state["laplace"], layout_of(model))
        guide = self.build_guide(model, x)
        load_module_state(guide, state["guide"])
        guide.set_posterior(post)
        network = predictive_model(post, state["predictive"])
        load_module_state(network, state["model"])
        return LaplaceFit(post, network, guide, state["predictive"],
                          result_from_state(state["result"]), state["link"], model)

    def with_guide_options(self, options: Mapping[str, Any]) -> Laplace:
        """``self`` for no options, else a ``ValueError``: the method builds its own
        [`LaplaceGuide`][bnn_zoo.methods.laplace.LaplaceGuide], whose one option is
        ``bias_scale``."""
        if options:
            raise ValueError("The Laplace method builds its own LaplaceGuide and takes no "
                             f"guide_options: got {sorted(options)}; its bias_scale is a "
                             "field of the method, set through method_options.")
        return self

    def build_guide(self, model, like: Tensor, *,
                    generator: torch.Generator | None = None) -> LaplaceGuide:
        """The point-mass guide of ``model`` on the device and in the dtype of ``like``,
        its initial means drawn from ``generator``."""
        guide = LaplaceGuide(model, bias_scale=self.bias_scale, generator=generator)
        return guide.to(device=like.device, dtype=like.dtype)


def predictive_model(post: LaplacePosterior, predictive: str) -> LinearizedModel | NonlinearModel:
    """The Pyro model of ``predictive`` (``"glm"`` or ``"mc"``) on ``post``."""
    check_choice("predictive", predictive, tuple(PredictiveKind))
    return (LinearizedModel if predictive == "glm" else NonlinearModel)(post)


@dataclass
class LaplaceFit:
    """A fitted Laplace approximation: the [`Posterior`][bnn_zoo.methods.Posterior] of
    [`Laplace`][].

    ``model`` and ``guide`` are the Pyro pair of the predictive (``predictive="glm"``: the
    [`LinearizedModel`][bnn_zoo.methods.laplace.LinearizedModel], whose Monte Carlo
    predictive is the GLM predictive; ``"mc"``: the
    [`NonlinearModel`][bnn_zoo.methods.laplace.NonlinearModel]), and
    [`predict`][] gives the GLM predictive in closed form (classification: by ``link``),
    or the Monte Carlo one.

    ``source`` is the model the posterior was fitted to (saved with the fit: a network's
    deterministic tensors and running statistics). ``diagnostics``: ``beta`` (``beta_d``
    per output for D outputs), ``alpha_l`` (per layer; the layer's mean for a per-weight
    ``alpha``), ``log_evidence``, ``clipped`` (Hessian eigenvalues the projection set to
    zero), ``jitter`` (added to the dense precision's diagonal for its Cholesky),
    ``converged`` (bool: the evidence loop ended on a consistent (MAP, ``alpha``,
    ``beta``); ``True`` without evidence tuning) and ``evidence_iterations`` (the
    refits the evidence loop made). A non-finite value is warned about.
    """

    laplace: LaplacePosterior
    model: Callable
    guide: LaplaceGuide
    predictive: str
    result: FitResult | None = None
    link: str = "probit"
    source: Callable | None = field(default=None, repr=False)
    diagnostics: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        post = self.laplace
        with torch.no_grad():
            counts = post.layer_sums(torch.ones_like(post.theta))
            alpha = post.layer_sums(post.alpha_vector()) / counts
            beta = {f"beta_{d}": float(b) for d, b in enumerate(post.beta)} \
                if post.beta.dim() else {"beta": float(post.beta)}
            self.diagnostics = {
                **beta, "log_evidence": float(post.log_evidence()),
                "clipped": float(post.clipped), "jitter": post.jitter,
                "converged": post.converged is not False,
                "evidence_iterations": post.iterations,
                **{f"alpha_{i}": float(a) for i, a in enumerate(alpha)}}
        bad = [k for k, v in self.diagnostics.items() if not math.isfinite(v)]
        if bad:
            warnings.warn(f"The Laplace fit has non-finite {', '.join(bad)}.", RuntimeWarning,
                          stacklevel=2)

    def predict(self, x: Tensor, num_samples: int) -> Predictive:
        """The predictive at standardised ``x`` (N, D): the closed-form GLM predictive
        (classification: the probit approximation, or ``num_samples`` draws of the logits
        with ``link="mc"``) or ``num_samples`` weight samples through the network."""
        if self.predictive == "glm":
            return self.laplace.glm_predictive(x, self.link, num_samples)
        return predict(self.model, self.guide, x, num_samples=num_samples)

    def state_dict(self) -> dict:
        """The posterior's state
        ([`state_dict`][bnn_zoo.methods.laplace.LaplacePosterior.state_dict]), the
        predictive's name and link, the MAP fit's result and the state dicts of the Pyro pair,
        for [`Laplace.restore`][bnn_zoo.methods.laplace.Laplace.restore]."""
        return {"laplace": self.laplace.state_dict(), "predictive": str(self.predictive),
                "link": str(self.link), "result": result_state(self.result),
                "guide": module_state(self.guide), "model": module_state(self.model),
                "source": module_state(self.source)}


Settings = TypeVar("Settings", CurvatureSettings, EvidenceSettings, ValidationSettings)


def _settings(kind: type[Settings], given: Any, options: dict[str, Any]) -> Settings:
    """``given`` as a ``kind``, with the ``options`` that are its fields in place (taken out
    of ``options``): ``given`` is a ``kind``, or the value of its first field."""
    names = [f.name for f in fields(kind)]
    own = {name: options.pop(name) for name in names if name in options}
    if isinstance(given, kind):
        return replace(given, **own) if own else given
    return kind(**{names[0]: given}, **own)
