"""The Laplace posterior of a model around a MAP: the MAP refit, the curvature in the
chosen structure, and the evidence-tuned ``alpha`` and ``beta`` (Bishop 2006, *Pattern
Recognition and Machine Learning*, 5.7; MacKay 1992, "A Practical Bayesian Framework
for Backpropagation Networks").

[`laplace_posterior`][] builds ``N(w_MAP, A^-1)`` with ``A = diag(alpha) + beta H``:
it refits the MAP by full-batch L-BFGS (`refine_map`), computes the curvature ``H``
in the structure [`CurvatureSettings`][] chooses (`bnn_zoo.methods.laplace._curvature`,
`bnn_zoo.methods.laplace._structures`) and, as
[`EvidenceSettings`][bnn_zoo.methods.laplace.EvidenceSettings] asks, maximises the evidence
in ``alpha`` and ``beta``
(`maximize_evidence`). It chains the steps of
a [`LaplaceProblem`][], which a user can call one by one. The model is read, never written: the
fitted ``alpha`` and ``beta`` live in the returned posterior only.

Memory, ``P`` weights: ``hessian`` and ``ggn`` hold a dense ``P x P`` precision and its
Cholesky factor (refused above ``max_bytes``), ``kron`` two factors per layer,
``(d_in + 1)^2 + d_out^2`` (``kron_separate`` ``d_in^2 + 2 d_out^2``), ``diag`` ``P``
numbers, ``last_layer`` the last layer's size squared.

Regression on targets (N, D) fits a noise precision per output, ``beta`` (D,), with each
output's curvature held apart (`output_blocks`; all
structures but ``kron_separate``); a heteroscedastic model (``noise="heteroscedastic"``)
has ``beta = 1`` and the Fisher GGN of its two heads (`bnn_zoo.methods.laplace._curvature`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from bnn_zoo._core.batches import Batches, first_inputs, num_targets, summed
from bnn_zoo._core.checks import check_data, check_positive, check_positive_int
from bnn_zoo._core.lbfgs import minimize_lbfgs
from bnn_zoo.methods._options import OptionGroup
from bnn_zoo.methods.laplace._curvature import MAX_DENSE_BYTES, energy_and_gradient
from bnn_zoo.methods.laplace._dense import Indefinite
from bnn_zoo.methods.laplace._evidence import EvidenceSettings, checked, maximize_evidence
from bnn_zoo.methods.laplace._layouts import Layout, layout_of
from bnn_zoo.methods.laplace._posterior import LaplacePosterior
from bnn_zoo.methods.laplace._structures import (
    STRUCTURES,
    Block,
    CurvatureName,
    Structure,
    check_curvature,
)
from bnn_zoo.models._likelihood import (
    Categorical,
    Gaussian,
    GaussianOutputs,
    Heteroscedastic,
    Likelihood,
)
from bnn_zoo.models._priors import GaussianPrior

__all__ = ["CurvatureSettings", "LaplaceProblem", "laplace_posterior", "model_alpha",
           "model_likelihood",
           "refine_map"]


@dataclass(frozen=True)
class CurvatureSettings(OptionGroup):
    """The structure of the Laplace precision's curvature ``H``.

    Attributes
    ----------
    curvature : a `CurvatureName`: ``"hessian"``
        (exact), ``"ggn"`` (full GGN), ``"diag"``, ``"kron"`` (joint weight-and-bias
        factors), ``"kron_separate"`` (laplace-torch's separate weight and bias factors),
        ``"last_layer"``, ``"low_rank"`` or ``"subnetwork"``.
    rank : the GGN eigenpairs ``"low_rank"`` keeps.
    subnetwork : the positions in the flat weights that ``"subnetwork"`` covers (the
        others stay at the MAP); required for it.
    indefinite : ``"raise"`` or ``"clip"``: what to do where the precision with an
        indefinite exact Hessian (``"hessian"``) is not positive definite even with
        jitter.
    max_bytes : the largest dense ``P x P`` matrix allowed.
    """

    curvature: CurvatureName = CurvatureName.GGN
    rank: int = 10
    subnetwork: Sequence[int] | Tensor | None = None
    indefinite: Indefinite = Indefinite.RAISE
    max_bytes: int = MAX_DENSE_BYTES

    def __post_init__(self) -> None:
        # Built once, here, where it checks every option; held beside the fields.
        structure = STRUCTURES[check_curvature(self.curvature)](
            indefinite=self.indefinite, max_bytes=self.max_bytes, rank=self.rank,
            subnetwork=self.subnetwork)
        object.__setattr__(self, "curvature", CurvatureName(structure.name))
        object.__setattr__(self, "indefinite", structure.indefinite)
        object.__setattr__(self, "_structure", structure)

    def structure(self) -> Structure:
        """The structure `curvature` names (in `STRUCTURES`), with these options."""
        return self._structure

    def blocks(self, theta: Tensor, x: Tensor, y: Tensor, layout: Layout,
               likelihood: Likelihood) -> list[Block]:
        """The precision blocks of this curvature at ``theta`` (P,) on ``x`` (N, D), ``y``
        ([`blocks`][bnn_zoo.methods.laplace.Structure.blocks]; for a likelihood with a curvature
        per output, [`output_blocks`][bnn_zoo.methods.laplace.Structure.output_blocks])."""
        if likelihood.per_output:
            return self._structure.output_blocks(theta, x, y, layout)
        return self._structure.blocks(theta, x, y, layout, likelihood)


def refine_map(theta: Tensor, x: Tensor | Batches, y: Tensor | None, layout: Layout,
               likelihood: Likelihood, alpha: Tensor, beta: Tensor,
               *, prior_mean: Tensor | None = None, max_iter: int = 500,
               rtol: float | None = None) -> Tensor:
    """Minimise ``beta E_D(theta) + 1/2 sum_i alpha_i (theta_i - m_i)^2`` from ``theta`` by
    full-batch L-BFGS (`minimize_lbfgs`: 50 pairs in compact form,
    strong Wolfe line search); ``alpha`` and the prior mean ``m`` are (P,) (``m`` zero by
    default); the likelihood folds in the noise precision its energy carries
    (`fold_noise`: one per output, ``beta``
    (D,), so that ``beta E_D`` reads ``sum_d beta_d E_d``). Returns the new (P,) MAP.

    L-BFGS minimises that objective divided by ``n``, the number of observed numbers (the
    mean per observation: about ``(n - gamma) / (2 n) <= 1/2`` at the evidence optimum, so
    of order one whatever ``n`` and ``beta``), which makes its stopping rules scale-free:
    it stops when the largest gradient component is below ``sqrt(eps)`` (``eps`` the
    machine epsilon of the data's dtype), when an iteration lowers the objective, or moves
    every weight, by less than ``rtol`` times the starting objective, or after
    ``max_iter`` iterations.

    ``x`` may be a loader's `Batches` (``y`` ``None``): the
    objective and its gradient are then sums over one pass, batch by batch.

    ``rtol`` defaults to ``1e-6`` in single (or lower) precision and to ``eps`` in double.
    A ReLU network's MAP from SVI is far from converged, and full-batch L-BFGS keeps
    lowering the objective for a long time; in single precision a relative tolerance
    stops it once the decrease no longer changes the posterior (absolute tolerances near
    round-off are never met), while a looser one stops the refits so early that the
    evidence loop needs many more of them. In double precision the refit runs to the
    optimum.
    """
    check_positive_int("max_iter", max_iter)
    eps = torch.finfo(theta.dtype).eps
    if rtol is None:
        rtol = 1e-6 if torch.finfo(theta.dtype).bits <= 32 else eps
    check_positive("rtol", rtol)
    mean = torch.zeros_like(theta) if prior_mean is None else prior_mean
    count = num_targets(x, y)
    likelihood, beta = likelihood.fold_noise(beta)

    def objective_and_gradient(t: Tensor) -> tuple[Tensor, Tensor]:
        """The objective over ``n`` and its gradient: the data term's by
        `energy_and_gradient`, the prior's
        ``alpha (t - m) / n`` by hand."""
        energy, gradient = summed(
            lambda xb, yb: energy_and_gradient(t, xb, yb, layout, likelihood), x, y)
        scaled = alpha * (t - mean)
        objective = energy * (beta / count) + scaled.dot(t - mean) * (0.5 / count)
        return objective, gradient.mul_(beta / count).add_(scaled, alpha=1 / count)

    start = abs(float(objective_and_gradient(theta)[0]))
    return minimize_lbfgs(objective_and_gradient, theta, history=50, max_iter=max_iter,
                          tolerance_grad=math.sqrt(eps),
                          tolerance_change=max(eps, rtol * start)).x


def model_likelihood(model, targets: Tensor) -> Likelihood:
    """The likelihood (`bnn_zoo.models._likelihood`) of ``model`` on ``targets``:
    ``Categorical`` for a classifier, ``Heteroscedastic`` for a regression model whose
    network gives each point its own noise scale (``noise="heteroscedastic"``; targets
    (N,)), ``GaussianOutputs`` for targets (N, D), ``Gaussian`` otherwise."""
    if model.task != "regression":
        return Categorical()
    if getattr(model, "heteroscedastic", False):
        if targets.dim() != 1:
            raise ValueError(f"Expected y of shape (N,) for a heteroscedastic model, but got "
                             f"{tuple(targets.shape)}.")
        return Heteroscedastic()
    return GaussianOutputs(targets.shape[1]) if targets.dim() == 2 else Gaussian()


def model_alpha(model) -> float | Tensor:
    """The prior precision ``alpha = scale^-2`` of a model with an isotropic Gaussian prior;
    a model that gives its own (``prior_precision()``: one number, one per layer or one per
    weight, e.g. a [`BayesianModule`][bnn_zoo.models.BayesianModule] with priors per layer) gives
    it."""
    if callable(getattr(model, "prior_precision", None)):
        return model.prior_precision()
    prior = getattr(model, "prior", None)
    if not isinstance(prior, GaussianPrior) or prior.fan_in:
        raise ValueError("The Laplace approximation needs the isotropic prior "
                         f"GaussianPrior(scale, fan_in=False), but the model has {prior!r}.")
    return prior.scale**-2


def _prior_precision(model, alpha: Tensor | float | None, layout: Layout,
                     like: dict) -> Tensor:
    """``alpha`` checked, as (L,) one per layer or (P,) one per weight; ``None``: the
    model's prior precision."""
    p, layers = layout.num_parameters, layout.num_layers
    alpha = torch.as_tensor(model_alpha(model) if alpha is None else alpha, **like)
    if alpha.numel() not in (1, layers, p) or alpha.dim() > 1 or bool((alpha <= 0).any()):
        raise ValueError(f"Expected alpha > 0, one number, one per layer ({layers}) or one per "
                         f"weight ({p}), but got shape {tuple(alpha.shape)}, minimum "
                         f"{float(alpha.min()):.3g}.")
    return (alpha if alpha.numel() == p else alpha.expand(layers)).clone()


def _prior_mean(prior_mean: Tensor | float, p: int, like: dict) -> Tensor:
    """``prior_mean`` checked, as (P,)."""
    mean = torch.as_tensor(prior_mean, **like)
    if mean.dim() > 1 or mean.numel() not in (1, p):
        raise ValueError(f"Expected prior_mean as a number or of shape ({p},), but got shape "
                         f"{tuple(mean.shape)}.")
    return mean.expand(p).clone()


def _noise_precision(model, beta: Tensor | float | None, likelihood: Likelihood,
                     like: dict) -> Tensor:
    """``beta`` checked, a number or (D,) for Gaussian targets (N, D); ``None``: the model's
    noise precision (1 for a classifier and a heteroscedastic model)."""
    if beta is None:
        beta = likelihood.model_noise_precision(model)
    beta = torch.as_tensor(beta, **like).clone()
    shape = likelihood.noise_shape()
    if beta.numel() == 1 or beta.shape == shape:
        beta = beta.reshape(()).expand(shape).clone() if beta.numel() == 1 else beta
    else:
        raise ValueError(f"Expected beta as a number or one per output {shape}, but got shape "
                         f"{tuple(beta.shape)}.")
    if not likelihood.tunes_noise and float(beta) != 1.0:
        raise ValueError(f"Expected beta == 1 for a {likelihood.name} likelihood (classification, "
                         f"or the network's own noise), but got {float(beta)}.")
    if not bool((beta > 0).all()) or not bool(torch.isfinite(beta).all()):
        raise ValueError(f"Expected beta > 0, but got {beta.tolist()}.")
    return beta


@dataclass(frozen=True, eq=False)
class LaplaceProblem:
    """A network and its training data: what every Laplace posterior of them shares, all
    but the MAP, ``alpha`` and ``beta``. Its methods are the steps of a Laplace fit, as
    laplace-torch's (Daxberger et al. 2021, "Laplace Redux -- Effortless Bayesian Deep
    Learning"): [`fit`][] the curvature at a MAP, tune the prior precision by
    [`maximize_evidence`][] (or on held-out points,
    [`tune_on_held_out`][bnn_zoo.methods.laplace.tune_on_held_out]), then predict
    ([`glm_predictive`][bnn_zoo.methods.laplace.LaplacePosterior.glm_predictive]).

    Build it with [`of`][]; ``refine`` refits the MAP by full-batch L-BFGS
    (`refine_map`) before each curvature.
    """

    model: Any
    layout: Layout
    likelihood: Likelihood
    x: Tensor | Batches
    y: Tensor | None
    prior_mean: Tensor
    curvature: CurvatureSettings
    refine: bool

    @classmethod
    def of(cls, model, x: Tensor | Batches, y: Tensor | None, *,
           curvature: CurvatureSettings | None = None, refine: bool = True,
           prior_mean: Tensor | float = 0.0) -> LaplaceProblem:
        """The problem of ``model`` (a [`BayesianMLP`][bnn_zoo.models.BayesianMLP] or
        [`BayesianModule`][bnn_zoo.models.BayesianModule], read, never written) on ``x`` (N, D) (a
        module's inputs of any shape (N, ...)), ``y`` (N,) or (N, D), or a loader's
        `Batches` (``y`` ``None``); ``curvature`` chooses the
        structure of ``H`` (default: the full GGN); ``prior_mean`` is a number or (P,)."""
        curvature = CurvatureSettings() if curvature is None else curvature
        if not isinstance(curvature, CurvatureSettings):
            raise TypeError(f"Expected curvature to be a CurvatureSettings, but got "
                            f"{curvature!r}.")
        if not isinstance(x, Batches):
            x, y = check_data(x, y, any_shape=True)
        layout = layout_of(model)
        layout.check_input(first_inputs(x))
        targets = y if y is not None else x.first[1]  # a loader's: its first batch's
        likelihood = model_likelihood(model, targets)
        if y is None and likelihood.per_output:
            raise ValueError("Laplace on targets (N, D) holds one curvature per output, summed "
                             "over tensors in memory: expected x and y as tensors, not a "
                             "loader.")
        like = dict(dtype=first_inputs(x).dtype, device=first_inputs(x).device)
        mean = _prior_mean(prior_mean, layout.num_parameters, like)
        return cls(model, layout, likelihood, x, y, mean, curvature, refine)

    def fit(self, theta: Tensor, *, alpha: Tensor | float | None = None,
            beta: Tensor | float | None = None) -> LaplacePosterior:
        """The posterior around ``theta`` (P,), refitted (`refine`), with the
        curvature there. ``alpha`` defaults to the precision of the model's isotropic
        Gaussian prior; it may be one number, one per layer (L,) or one per weight (P,).
        ``beta`` defaults to the model's noise precision (1 for a classifier)."""
        p = self.layout.num_parameters
        if theta.shape != (p,):
            raise ValueError(f"Expected theta of shape ({p},), but got {tuple(theta.shape)}.")
        like = dict(dtype=self.prior_mean.dtype, device=self.prior_mean.device)
        alpha = _prior_precision(self.model, alpha, self.layout, like)
        beta = _noise_precision(self.model, beta, self.likelihood, like)
        return self.posterior(theta.detach().to(**like), alpha, beta)

    def posterior(self, theta: Tensor, alpha: Tensor, beta: Tensor) -> LaplacePosterior:
        """The posterior for ``alpha`` (L,) or (P,), ``beta`` at ``theta`` refitted
        (`refine`), with a new curvature."""
        layout, likelihood, x, y = self.layout, self.likelihood, self.x, self.y
        if self.refine:
            per_weight = alpha if alpha.numel() == layout.num_parameters \
                else alpha[layout.layer_index(theta)]
            theta = refine_map(theta, x, y, layout, likelihood, per_weight, beta,
                               prior_mean=self.prior_mean)
        blocks = self.curvature.blocks(theta, x, y, layout, likelihood)
        with torch.no_grad():

            def energies(xb: Tensor, yb: Tensor) -> tuple[Tensor]:
                return (likelihood.energy(layout.output(theta, xb), yb),)

            energy, = summed(energies, x, y)
        return checked(LaplacePosterior(layout, theta, blocks, alpha, beta, likelihood, energy,
                                        likelihood.num_observed(x, y), self.prior_mean))

    def maximize_evidence(self, post: LaplacePosterior,
                          settings: EvidenceSettings) -> LaplacePosterior:
        """``post`` with ``alpha`` (shared or per layer) and ``beta`` that maximise the
        evidence by ``settings`` (`maximize_evidence`), the MAP refitted and the curvature
        recomputed between updates where this problem's `refine` asks (the problem owns
        it: ``settings.refine`` is the default `laplace_posterior` builds it with)."""
        if post.alpha.numel() == self.layout.num_parameters != self.layout.num_layers:
            raise ValueError("Evidence tuning fits alpha shared or per layer; expected alpha "
                             "as one number or one per layer with evidence, but got one per "
                             "weight.")
        return maximize_evidence(post, replace(settings, refine=self.refine), self.posterior)


def laplace_posterior(model, theta: Tensor, x: Tensor, y: Tensor, *,
                      curvature: CurvatureSettings | None = None,
                      evidence: EvidenceSettings | None = None,
                      alpha: Tensor | float | None = None, beta: Tensor | float | None = None,
                      prior_mean: Tensor | float = 0.0) -> LaplacePosterior:
    """The Laplace posterior of ``model`` (a [`BayesianMLP`][bnn_zoo.models.BayesianMLP] or
    [`BayesianModule`][bnn_zoo.models.BayesianModule]) around ``theta`` (P,) on data ``x`` (N, D)
    (a module's inputs of any shape (N, ...)), ``y`` (N,). ``model`` is read, never written.
    It chains the steps of [`LaplaceProblem`][]:
    [`fit`][bnn_zoo.methods.laplace.LaplaceProblem.fit], then
    [`maximize_evidence`][bnn_zoo.methods.laplace.LaplaceProblem.maximize_evidence] where
    ``evidence`` asks.

    ``curvature`` chooses the structure of ``H`` (default ``CurvatureSettings()``: the
    full GGN); ``evidence`` whether the MAP is refitted and how ``alpha`` and ``beta`` are
    tuned (default ``EvidenceSettings()``: refitted, not tuned; ``refine="auto"`` as the
    model's task asks; see
    `maximize_evidence`). ``alpha`` defaults
    to the precision of the model's isotropic Gaussian prior; it may be one number, one per layer
    (L,) or one per weight (P,; not with evidence tuning). ``prior_mean`` is a number or (P,).
    ``beta`` defaults to the model's noise precision (1 for a classifier).
    """
    evidence = EvidenceSettings() if evidence is None else evidence
    if not isinstance(evidence, EvidenceSettings):
        raise TypeError(f"Expected evidence to be a EvidenceSettings, but got {evidence!r}.")
    problem = LaplaceProblem.of(model, x, y, curvature=curvature,
                                refine=evidence.for_task(model.task).refine,
                                prior_mean=prior_mean)
    post = problem.fit(theta, alpha=alpha, beta=beta)
    if evidence.evidence is None:
        return post
    return problem.maximize_evidence(post, evidence)
