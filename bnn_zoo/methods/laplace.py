"""The Laplace approximation as an inference method: MAP, curvature, evidence (seed 001,
first half; Bishop, PRML 5.7; MacKay 1992).

:class:`Laplace` finds the MAP by SVI (:func:`bnn_zoo.core.training.fit` with a
:class:`~bnn_zoo.guides.laplace.LaplaceGuide` as point mass), refines it by full-batch
L-BFGS (:func:`refine_map`), builds the curvature in the requested structure
(:mod:`bnn_zoo.guides.curvature`, :mod:`bnn_zoo.guides.laplace.blocks`) and, if asked,
maximises the evidence in ``alpha`` and ``beta`` (:func:`laplace_posterior`).

Evidence maximisation by MacKay's fixed point (PRML 5.178-5.180), alternated with MAP
refits: with ``lambda_i`` the eigenvalues of ``beta H``,
``gamma = sum_i lambda_i / (alpha + lambda_i) = W - alpha tr(A^-1)``,
``alpha = gamma / w^T w``, ``1 / beta = 2 E_D / (N - gamma)``. With a prior
precision per layer, ``gamma_l = W_l - alpha_l tr_l(A^-1)`` and
``alpha_l = gamma_l / ||w_l||^2``. A gradient alternative maximises the same
evidence (:meth:`~bnn_zoo.guides.laplace.LaplacePosterior.log_evidence`) in
``log alpha, log beta`` by L-BFGS at the current ``w_MAP``.

The fitted ``alpha`` and ``beta`` live in the returned posterior only: nothing is written
into the model that ``build_model`` returned. The posterior's Pyro pair is the
:class:`~bnn_zoo.guides.laplace.LinearizedModel` (``predictive="glm"``) or the
:class:`~bnn_zoo.guides.laplace.NonlinearModel` (``"mc"``), each with the posterior's
``alpha`` and noise ``beta^-1/2``, and the guide sampling ``N(w_MAP, A^-1)``.
:meth:`LaplaceFit.state_dict` holds the posterior (MAP, ``alpha``, ``beta``, the blocks'
tensors, the evidence history) and :meth:`Laplace.restore` rebuilds the fit from it and a
fresh model (for the network's layout and activation), without the training data.

Memory, ``P`` weights: ``full`` and ``ggn`` hold a dense ``P x P`` precision and its
Cholesky factor (refused above ``max_bytes``), ``kron`` two factors per layer,
``(d_in + 1)^2 + d_out^2``, ``diag`` ``P`` numbers, ``last_layer`` the last layer's size
squared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from bnn_zoo.core.checks import check_choice, check_data, check_positive, check_positive_int
from bnn_zoo.core.nn import mlp_forward
from bnn_zoo.core.predictive import predict
from bnn_zoo.core.training import FitResult, fit
from bnn_zoo.guides.curvature import (
    CURVATURES,
    MAX_DENSE_BYTES,
    ParameterLayout,
    negative_log_likelihood,
)
from bnn_zoo.guides.laplace import (
    INDEFINITE,
    Block,
    LaplaceGuide,
    LaplacePosterior,
    LinearizedModel,
    NonlinearModel,
    curvature_blocks,
)
from bnn_zoo.methods.base import Budget, ModelFactory, Predictive, load_module_state
from bnn_zoo.methods.svi import module_state, result_from_state, result_state
from bnn_zoo.models.priors import GaussianPrior

__all__ = ["EVIDENCE_METHODS", "PREDICTIVES", "Laplace", "LaplaceFit", "fixed_point_update",
           "gradient_update", "laplace_posterior", "model_alpha", "predictive_model",
           "refine_map"]

PREDICTIVES = ("glm", "mc")
EVIDENCE_METHODS = ("fixed_point", "gradient")


def _likelihood(model) -> str:
    return "gaussian" if model.task == "regression" else "categorical"


def _energy(theta: Tensor, x: Tensor, y: Tensor, layout: ParameterLayout, act, likelihood: str):
    return negative_log_likelihood(mlp_forward(x, layout.network(theta), act), y, likelihood)


def refine_map(theta: Tensor, x: Tensor, y: Tensor, layout: ParameterLayout,
               act: Callable[[Tensor], Tensor], likelihood: str, alpha: Tensor, beta: Tensor,
               *, max_iter: int = 500) -> Tensor:
    """Minimise ``beta E_D(theta) + 1/2 sum_i alpha_i theta_i^2`` from ``theta`` by full-batch
    L-BFGS (strong Wolfe line search); ``alpha`` is (P,). Returns the new (P,) MAP."""
    check_positive_int("max_iter", max_iter)
    theta = theta.detach().clone().requires_grad_()
    optimizer = torch.optim.LBFGS([theta], lr=1, max_iter=max_iter, history_size=50,
                                  tolerance_grad=1e-12, tolerance_change=1e-14,
                                  line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = beta * _energy(theta, x, y, layout, act, likelihood) + 0.5 * (alpha * theta**2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return theta.detach()


def fixed_point_update(post: LaplacePosterior, per_layer: bool) -> tuple[Tensor, Tensor]:
    """MacKay's updates (PRML 5.178-5.180) of ``alpha`` (per layer or shared) and ``beta``."""
    covered = post.covered_layers
    gamma = post.effective_parameters()
    sq = post.layer_sums(post.theta**2)
    alpha = post.alpha.clone()
    if per_layer:
        alpha[covered] = gamma[covered] / sq[covered]
    else:
        alpha[covered] = gamma[covered].sum() / sq[covered].sum()
    beta = post.beta
    if post.likelihood == "gaussian":
        beta = (post.num_outputs - gamma.sum()) / (2 * post.energy)
    return alpha, beta


def gradient_update(post: LaplacePosterior, per_layer: bool,
                    max_iter: int = 100) -> tuple[Tensor, Tensor]:
    """Maximise :meth:`LaplacePosterior.log_evidence` in ``log alpha``, ``log beta`` by L-BFGS."""
    covered = post.covered_layers
    log_alpha = torch.log(post.alpha[covered] if per_layer else post.alpha[covered[:1]])
    log_alpha = log_alpha.detach().clone().requires_grad_()
    log_beta = torch.log(post.beta).detach().clone().requires_grad_()
    regression = post.likelihood == "gaussian"
    params = [log_alpha, log_beta] if regression else [log_alpha]
    optimizer = torch.optim.LBFGS(params, lr=1, max_iter=max_iter, tolerance_grad=1e-10,
                                  tolerance_change=1e-12, line_search_fn="strong_wolfe")

    def alpha_of(la: Tensor) -> Tensor:
        alpha = post.alpha.clone()
        alpha[covered] = la.exp().expand(len(covered))
        return alpha

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = -post.log_evidence(alpha_of(log_alpha), log_beta.exp())
        loss.backward()
        return loss

    optimizer.step(closure)
    return alpha_of(log_alpha).detach(), log_beta.exp().detach()


def laplace_posterior(model, theta: Tensor, x: Tensor, y: Tensor, *, curvature: str = "ggn",
                      alpha: Tensor | float | None = None, beta: Tensor | float | None = None,
                      evidence: str | None = None, per_layer_alpha: bool = False,
                      refine: bool = True, iterations: int = 30, tol: float = 1e-4,
                      indefinite: str = "raise",
                      max_bytes: int = MAX_DENSE_BYTES) -> LaplacePosterior:
    """The Laplace posterior of ``model`` (a :class:`~bnn_zoo.models.BayesianMLP` with an
    isotropic Gaussian prior) around ``theta`` (P,) on data ``x`` (N, D), ``y`` (N,),
    optionally evidence-tuned. ``model`` is read, never written.

    ``alpha``, ``beta`` default to the model's prior precision and its noise
    precision. ``evidence`` (``"fixed_point"``, ``"gradient"`` or ``None``) alternates
    hyperparameter updates with MAP refits (``refine``, full-batch L-BFGS) until
    ``alpha`` and ``beta`` change by less than ``tol`` relatively, at most
    ``iterations`` times.
    """
    x, y = check_data(x, y)
    layout = ParameterLayout.from_model(model)
    if theta.shape != (layout.num_parameters,):
        raise ValueError(f"Expected theta of shape ({layout.num_parameters},), "
                         f"but got {tuple(theta.shape)}.")
    check_choice("curvature", curvature, CURVATURES)
    if evidence is not None:
        check_choice("evidence", evidence, EVIDENCE_METHODS)
    check_positive_int("iterations", iterations)
    check_positive("tol", tol)
    likelihood = _likelihood(model)
    like = dict(dtype=x.dtype, device=x.device)
    alpha = torch.as_tensor(model_alpha(model) if alpha is None else alpha, **like)
    if alpha.numel() not in (1, layout.num_layers) or bool((alpha <= 0).any()):
        raise ValueError(f"Expected alpha > 0, one number or one per layer "
                         f"({layout.num_layers}), but got {alpha.tolist()}.")
    alpha = alpha.expand(layout.num_layers).clone()
    if beta is None:
        beta = model.observation_scale().detach() ** -2 if likelihood == "gaussian" else 1.0
    beta = torch.as_tensor(beta, **like).clone()
    if likelihood == "categorical" and float(beta) != 1.0:
        raise ValueError(f"Expected beta == 1 for a categorical likelihood, but got {float(beta)}.")
    check_positive("beta", float(beta))
    theta = theta.detach().to(**like)
    act = model.act
    num_outputs = y.numel() if likelihood == "gaussian" else y.shape[0]
    history: list[tuple[list[float], float, float]] = []

    def build(theta: Tensor, alpha: Tensor, beta: Tensor,
              blocks: list[Block] | None = None) -> LaplacePosterior:
        if refine:
            theta = refine_map(theta, x, y, layout, act, likelihood,
                               alpha[layout.layer_index(theta)], beta)
        if refine or blocks is None:  # without refits the MAP, hence H, stays put
            blocks = curvature_blocks(curvature, theta, x, y, layout, act, likelihood,
                                      indefinite=indefinite, max_bytes=max_bytes)
        with torch.no_grad():
            energy = _energy(theta, x, y, layout, act, likelihood)
        post = LaplacePosterior(layout, theta, blocks, alpha, beta, likelihood, energy,
                                num_outputs, act, history)
        with torch.no_grad():
            post.log_det()  # fails now, with NotPositiveDefiniteError, if A is not PD
        return post

    post = build(theta, alpha, beta)
    for _ in range(iterations if evidence is not None else 0):
        with torch.no_grad():
            history.append((post.alpha.tolist(), float(post.beta), float(post.log_evidence())))
        if evidence == "fixed_point":
            with torch.no_grad():
                new_alpha, new_beta = fixed_point_update(post, per_layer_alpha)
        else:
            new_alpha, new_beta = gradient_update(post, per_layer_alpha)
        change = max(float(((new_alpha - post.alpha).abs() / post.alpha).max()),
                     float((new_beta - post.beta).abs() / post.beta))
        post = build(post.theta, new_alpha, new_beta, post.blocks)
        if change < tol:
            break
    if evidence is not None:
        with torch.no_grad():
            history.append((post.alpha.tolist(), float(post.beta), float(post.log_evidence())))
    return post


def model_alpha(model) -> float:
    """The prior precision ``alpha = scale^-2`` of a model with an isotropic Gaussian prior."""
    prior = getattr(model, "prior", None)
    if not isinstance(prior, GaussianPrior) or prior.fan_in:
        raise ValueError("The Laplace approximation needs the isotropic prior "
                         f"GaussianPrior(scale, fan_in=False), but the model has {prior!r}.")
    return prior.scale**-2



@dataclass(frozen=True)
class Laplace:
    """The Laplace approximation (seed 001) as a :class:`~bnn_zoo.methods.base.Method`.

    Parameters
    ----------
    curvature : ``"full"``, ``"ggn"`` (default), ``"diag"``, ``"kron"`` or ``"last_layer"``
        (see :mod:`bnn_zoo.guides.curvature`).
    evidence : ``None`` (default: ``alpha`` from the model's prior, ``beta`` from its
        noise at the MAP), ``"fixed_point"`` (MacKay) or ``"gradient"`` (L-BFGS).
    per_layer_alpha : one prior precision per layer instead of one shared.
    predictive : ``"glm"`` (default; the linearised network, closed form in
        :meth:`LaplaceFit.predict`) or ``"mc"`` (weights sampled through the network).
    indefinite : ``"raise"`` (default) or ``"clip"``: what to do with an indefinite
        exact Hessian (``curvature="full"``).
    refine : refit the MAP by full-batch L-BFGS before each curvature (default ``True``).
    iterations, tol : at most ``iterations`` evidence updates (default 30), stopping when
        ``alpha`` and ``beta`` change by less than ``tol`` relatively (default ``1e-4``).
    bias_scale : standard deviation of the guide's initial biases (default 1); the method
        builds its own guide and takes no ``guide_options``.
    max_bytes : the largest dense ``P x P`` matrix allowed (default 2 GiB).
    """

    curvature: str = "ggn"
    evidence: str | None = None
    per_layer_alpha: bool = False
    predictive: str = "glm"
    indefinite: str = "raise"
    refine: bool = True
    iterations: int = 30
    tol: float = 1e-4
    bias_scale: float = 1.0
    max_bytes: int = MAX_DENSE_BYTES

    def __post_init__(self) -> None:
        check_choice("curvature", self.curvature, CURVATURES)
        if self.evidence is not None:
            check_choice("evidence", self.evidence, EVIDENCE_METHODS)
        check_choice("predictive", self.predictive, PREDICTIVES)
        check_choice("indefinite", self.indefinite, INDEFINITE)
        check_positive_int("iterations", self.iterations)
        check_positive("tol", self.tol)
        check_positive("bias_scale", self.bias_scale)
        check_positive_int("max_bytes", self.max_bytes)

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> LaplaceFit:
        """MAP by SVI under ``budget``, then the Laplace posterior of ``build_model()``."""
        x, y = check_data(x, y)
        if budget.distributed:
            raise ValueError("The Laplace method does not train data-parallel; expected "
                             "distributed=False.")
        model = build_model()
        if model.task != task:
            raise ValueError(f"Expected a {task} model from build_model, but got a "
                             f"{model.task} one.")
        guide = self.build_guide(model, x, generator=torch.Generator().manual_seed(seed))
        result = fit(model, guide, x, y, steps=budget.steps, lr=budget.lr,
                     batch_size=budget.batch_size, seed=seed, progress=progress, jit=budget.jit)
        with torch.no_grad():
            theta = guide.theta()
        post = laplace_posterior(model, theta, x, y, curvature=self.curvature,
                                 evidence=self.evidence, per_layer_alpha=self.per_layer_alpha,
                                 refine=self.refine, iterations=self.iterations, tol=self.tol,
                                 indefinite=self.indefinite, max_bytes=self.max_bytes)
        guide.set_posterior(post)
        return LaplaceFit(post, predictive_model(post, self.predictive), guide,
                          self.predictive, result)

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor) -> LaplaceFit:
        """The fit of :meth:`LaplaceFit.state_dict`: a fresh model gives the network's
        layout and activation, the posterior is rebuilt from the saved blocks (nothing is
        recomputed), the guide is loaded and holds it, and the Pyro model of the saved
        ``predictive`` is built on it."""
        model = build_model()
        post = LaplacePosterior.from_state(state["laplace"], ParameterLayout.from_model(model),
                                           model.act)
        guide = self.build_guide(model, x)
        load_module_state(guide, state["guide"])
        guide.set_posterior(post)
        network = predictive_model(post, state["predictive"])
        load_module_state(network, state["model"])
        return LaplaceFit(post, network, guide, state["predictive"],
                          result_from_state(state["result"]))

    def with_guide_options(self, options: Mapping[str, Any]) -> Laplace:
        """``self`` for no options, else a ``ValueError``: the method builds its own
        :class:`~bnn_zoo.guides.laplace.LaplaceGuide`, whose one option is ``bias_scale``."""
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
    check_choice("predictive", predictive, PREDICTIVES)
    return (LinearizedModel if predictive == "glm" else NonlinearModel)(post)


@dataclass
class LaplaceFit:
    """A fitted Laplace approximation: the :class:`~bnn_zoo.methods.base.Posterior` of
    :class:`Laplace`.

    ``model`` and ``guide`` are the Pyro pair of the predictive (``predictive="glm"``: the
    :class:`~bnn_zoo.guides.laplace.LinearizedModel`, whose Monte Carlo predictive is the
    GLM predictive; ``"mc"``: the :class:`~bnn_zoo.guides.laplace.NonlinearModel`), and
    :meth:`predict` gives the GLM predictive in closed form, or the Monte Carlo one.
    """

    laplace: LaplacePosterior
    model: Callable
    guide: LaplaceGuide
    predictive: str
    result: FitResult | None = None
    diagnostics: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        post = self.laplace
        with torch.no_grad():
            self.diagnostics = {"beta": float(post.beta), "log_evidence":
                                float(post.log_evidence()), "clipped": float(post.clipped),
                                **{f"alpha_{i}": float(a) for i, a in enumerate(post.alpha)}}

    def predict(self, x: Tensor, num_samples: int) -> Predictive:
        """The predictive at standardised ``x`` (N, D): the closed-form GLM predictive
        (``num_samples`` unused) or ``num_samples`` weight samples through the network."""
        if self.predictive == "glm":
            return self.laplace.glm_predictive(x)
        return predict(self.model, self.guide, x, num_samples=num_samples)

    def state_dict(self) -> dict:
        """The posterior (:meth:`LaplacePosterior.state_dict`), the predictive's name, the
        MAP fit's result and the state dicts of the Pyro pair, for :meth:`Laplace.restore`."""
        return {"laplace": self.laplace.state_dict(), "predictive": self.predictive,
                "result": result_state(self.result), "guide": module_state(self.guide),
                "model": module_state(self.model)}
