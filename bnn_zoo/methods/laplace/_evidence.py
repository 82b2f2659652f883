"""Evidence maximisation for the Laplace approximation: its settings, the updates of the
prior precision ``alpha`` and the noise precision ``beta``, and the loop that alternates
them with MAP refits (MacKay 1992, "A Practical Bayesian Framework for Backpropagation
Networks"; Bishop 2006, *Pattern Recognition and Machine Learning*, 5.7.2).

With ``lambda_i`` the eigenvalues of ``beta H`` at the MAP, the number of well-determined
parameters is ``gamma = sum_i lambda_i / (alpha + lambda_i) = W - alpha tr(A^-1)``, and
the evidence is stationary where ``alpha = gamma / ||w - m||^2`` and
``1 / beta = 2 E_D / (N - gamma)`` (PRML 5.178-5.180, with the prior mean ``m``). With a
prior precision per layer, ``gamma_l = W_l - alpha_l tr_l(A^-1)`` and
``alpha_l = gamma_l / ||w_l - m_l||^2``. `fixed_point_update` gives these targets;
`gradient_update` (also where a fixed-point target is not positive, or the fixed
point cycles) maximises the evidence
([`log_evidence`][bnn_zoo.methods.laplace.LaplacePosterior.log_evidence]) in ``log alpha`` and
``log beta`` by L-BFGS at the current MAP.

The loop ([`maximize_evidence`][]) ends on a consistent (MAP, ``alpha``, ``beta``): it
stops when the evidence-optimal hyperparameters for the current, refitted MAP are within
``tol`` of the current ones, so its last step is that test after a refit. Between refits
it settles the hyperparameters at the fixed MAP and curvature: the refits and the
curvatures are the cost, the updates on a fixed curvature are cheap, and settling first
takes fewer refits than one update per refit. Each update is a damped, bounded step in
log space ([`bounded_step`][]), so ``alpha`` and ``beta`` stay finite even where the
fixed point sends ``alpha`` to infinity (a handful of data points).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

import torch
from torch import Tensor

from bnn_zoo._core.checks import check_bool, check_choice, check_positive, check_positive_int
from bnn_zoo._core.lbfgs import minimize_lbfgs
from bnn_zoo.methods._options import OptionGroup
from bnn_zoo.methods.laplace._posterior import LaplacePosterior

__all__ = ["AUTO_REFINE", "DAMPING", "HYPER_BOUNDS", "MAX_LOG_STEP", "EvidenceMethod",
           "EvidenceSettings",
           "bounded_step", "checked", "evidence_step", "fixed_point_update", "gradient_update",
           "maximize_evidence"]



class EvidenceMethod(StrEnum):
    """How the evidence is maximised in ``alpha`` and ``beta``: MacKay's fixed-point updates
    (`fixed_point_update`) or L-BFGS on it (`gradient_update`)."""

    FIXED_POINT = "fixed_point"
    GRADIENT = "gradient"


#: ``refine="auto"``: whether the MAP of a task is refitted under the tuned ``alpha`` and
#: ``beta``. A regression's is: its noise ``beta`` is learned with the weights, and the MAP
#: of the model's own prior fits the noise of the training points. A classifier's is not
#: (post hoc, as Daxberger et al. 2021 tune it): refits under the evidence's ``alpha``, which
#: a diagonal or Kronecker curvature overstates, make its MAP underconfident.
AUTO_REFINE = {"regression": True, "classification": False}
HYPER_BOUNDS = (1e-6, 1e6)
MAX_LOG_STEP = math.log(10)
DAMPING = 0.5

#: ``(theta, alpha, beta) ->`` the posterior at ``theta`` refitted for ``alpha`` and
#: ``beta``, with a new curvature.
Refit = Callable[[Tensor, Tensor, Tensor], LaplacePosterior]


@dataclass(frozen=True)
class EvidenceSettings(OptionGroup):
    """How the Laplace posterior's MAP, ``alpha`` and ``beta`` are settled around the MAP
    that training found.

    Attributes
    ----------
    evidence : ``None`` (``alpha`` and ``beta`` stay as given), ``"fixed_point"``
        (MacKay's updates, `fixed_point_update`) or ``"gradient"``
        (`gradient_update`).
    per_layer_alpha : one prior precision per layer instead of one shared.
    refine : refit the MAP by full-batch L-BFGS before each curvature, the first
        included (`refine_map`); ``"auto"``:
        `AUTO_REFINE` of the task ([`for_task`][]).
    iterations : at most ``iterations`` refits, and as many updates at each MAP.
    tol : converged when the evidence-optimal ``alpha`` and ``beta`` for the current MAP
        are within ``tol`` of the current ones in log space.
    bounds : ``(low, high)``, the range ``alpha`` and ``beta`` are kept in.
    max_log_step : the largest move of ``log alpha`` or ``log beta`` in one update.
    damping : the fraction of the log distance to the target one update moves, in
        ``(0, 1]``.
    """

    evidence: EvidenceMethod | None = None
    per_layer_alpha: bool = False
    refine: bool | str = True
    iterations: int = 30
    tol: float = 1e-4
    bounds: tuple[float, float] = HYPER_BOUNDS
    max_log_step: float = MAX_LOG_STEP
    damping: float = DAMPING

    def __post_init__(self) -> None:
        if self.evidence is not None:
            object.__setattr__(self, "evidence", EvidenceMethod(
                check_choice("evidence", self.evidence, tuple(EvidenceMethod))))
        check_bool("per_layer_alpha", self.per_layer_alpha)
        if isinstance(self.refine, str):
            check_choice("refine", self.refine, ("auto",))
        else:
            check_bool("refine", self.refine)
        check_positive_int("iterations", self.iterations)
        check_positive("tol", self.tol)
        check_positive("max_log_step", self.max_log_step)
        check_positive("damping", self.damping)
        if self.damping > 1:
            raise ValueError(f"Expected 0 < damping <= 1, but got {self.damping}.")
        bounds = self.bounds
        if len(bounds) != 2 or not 0 < bounds[0] < bounds[1] < math.inf:
            raise ValueError(f"Expected bounds (low, high) with 0 < low < high < inf, but got "
                             f"{bounds}.")

    def for_task(self, task: str) -> EvidenceSettings:
        """These settings with ``refine="auto"`` made `AUTO_REFINE` of ``task``."""
        return replace(self, refine=AUTO_REFINE[task]) if self.refine == "auto" else self


def fixed_point_update(post: LaplacePosterior, per_layer: bool) -> tuple[Tensor, Tensor]:
    """MacKay's updates (PRML 5.178-5.180) of ``alpha`` (per layer or shared) and ``beta``:
    ``alpha_l = gamma_l / ||w_l - m_l||^2``, ``beta = (N - gamma) / (2 E_D)``; with a
    noise precision per output (``beta`` (D,)), ``beta_d = (N - gamma_d) / (2 E_d)``, where
    ``gamma_d = beta_d tr(A^-1 H_d)`` is the share of the effective parameters attributed
    to output ``d`` (the evidence's derivative in ``beta_d``, ``-E_d + N / (2 beta_d) -
    tr(A^-1 H_d) / 2``, is zero there): the likelihood's
    `noise_update`, which keeps a fixed noise
    (classification, heteroscedastic regression) at ``beta = 1``.
    Unbounded: the targets may be infinite or not positive (see [`bounded_step`][]).
    Sums run over the covered weights of each layer."""
    covered = post.covered_layers
    gamma = post.effective_parameters(per_layer)
    sq = post.layer_sums(post.covered * (post.theta - post.prior_mean) ** 2)
    alpha = post.alpha.clone()
    if per_layer:
        alpha[covered] = gamma[covered] / sq[covered]
    else:
        alpha[covered] = gamma / sq[covered].sum()
    return alpha, post.likelihood.noise_update(post, gamma)


def gradient_update(post: LaplacePosterior, per_layer: bool,
                    max_iter: int = 100) -> tuple[Tensor, Tensor]:
    """Maximise the evidence
    ([`log_evidence`][bnn_zoo.methods.laplace.LaplacePosterior.log_evidence]) in
    ``log alpha``, ``log beta`` by L-BFGS (`minimize_lbfgs`, as the refits); ``log beta`` is
    (D,) with a noise precision per output, and absent where ``beta`` stays 1 (classification,
    heteroscedastic regression). A trial point whose ``alpha`` or ``beta`` over- or
    underflows (0 or infinite) has objective ``inf``: the line search steps back from it."""
    covered = post.covered_layers
    log_alpha = torch.log(post.alpha[covered] if per_layer else post.alpha[covered[:1]])
    tuned = post.likelihood.tunes_noise
    start = torch.cat([log_alpha, torch.log(post.beta).reshape(-1)]) if tuned else log_alpha
    k = log_alpha.numel()

    def hyperparameters(x: Tensor) -> tuple[Tensor, Tensor]:
        alpha = post.alpha.clone()
        alpha[covered] = x[:k].exp().expand(len(covered))
        return alpha, x[k:].exp().reshape(post.beta.shape) if tuned else post.beta

    def objective_and_gradient(x: Tensor) -> tuple[Tensor, Tensor]:
        x = x.detach().requires_grad_()
        alpha, beta = hyperparameters(x)
        if not all(bool((torch.isfinite(h) & (h > 0)).all()) for h in (alpha, beta)):
            # A trial step of the line search so far out that exp over- or underflows: no
            # evidence there, which the line search reads as no decrease and steps back.
            return torch.tensor(math.inf, dtype=x.dtype), torch.zeros_like(x)
        loss = -post.log_evidence(alpha, beta)
        return loss.detach(), torch.autograd.grad(loss, x)[0]

    return hyperparameters(minimize_lbfgs(objective_and_gradient, start.detach(),
                                          max_iter=max_iter, tolerance_grad=1e-10,
                                          tolerance_change=1e-12).x)


def bounded_step(current: Tensor, target: Tensor, bounds: tuple[float, float],
                 max_log_step: float, damping: float = 1.0) -> tuple[Tensor, Tensor]:
    """A checked, damped step of positive hyperparameters ``current`` towards ``target``, in
    log space: ``log new = log current + damping (log target - log current)``.

    A target that is not positive is read as the lower bound: the evidence's derivative
    in ``beta`` is ``-E_D + (N - gamma) / (2 beta)`` and in ``alpha_l`` is
    ``(gamma_l - alpha_l ||w_l - m_l||^2) / (2 alpha_l)``, both negative where the target
    ``(N - gamma) / (2 E_D)`` or ``gamma_l / ||w_l - m_l||^2`` is not positive (a curvature
    structure whose ``gamma`` exceeds ``N``, as a diagonal or Kronecker-factored one of a
    network with more weights than data points can). An infinite target (``E_D = 0`` or
    ``w_l = m_l``: the evidence grows without bound) is read as the upper bound; a NaN
    target as no move. The target is clipped to ``bounds`` and the step
    ``log new - log current`` to ``[-max_log_step, max_log_step]``. A damping below 1
    turns the period-two oscillation of a fixed point whose map has slope near -1 (the
    noise update on a handful of points, ``beta = (N - gamma) / (2 E_D)`` with both
    nearly zero) into convergence. Returns the new values
    and the distances ``|log target - log current|`` (the clipped target), elementwise.
    """
    low, high = (math.log(b) for b in bounds)
    log_current = torch.log(current)
    log_target = torch.where(target > 0, torch.log(target.clamp_min(torch.finfo(
        target.dtype).tiny)), torch.full_like(target, low))
    log_target = torch.where(torch.isnan(target), log_current, log_target).clamp(low, high)
    distance = (log_target - log_current).abs()
    step = (damping * (log_target - log_current)).clamp(-max_log_step, max_log_step)
    return torch.exp((log_current + step).clamp(low, high)), distance


def evidence_step(post: LaplacePosterior, settings: EvidenceSettings
                  ) -> tuple[Tensor, Tensor, float]:
    """The damped, bounded step ([`bounded_step`][]) from ``post``'s ``alpha`` and
    ``beta`` towards the evidence-optimal ones at its MAP and curvature, and the largest
    log distance to those (``beta``'s for a Gaussian likelihood only; a categorical one
    keeps ``beta = 1``).

    ``"fixed_point"`` takes MacKay's targets where they exist, and the gradient update's
    where one is not positive (no fixed point on that side: ``gamma > N`` for ``beta``,
    which a diagonal or Kronecker-factored curvature of a network with more weights than
    data points can give, where the fixed-point map jumps across the optimum)."""
    exists = False
    if settings.evidence == "fixed_point":
        with torch.no_grad():
            target_alpha, target_beta = fixed_point_update(post, settings.per_layer_alpha)
        exists = bool((target_alpha > 0).all()) and bool((target_beta > 0).all())
    if not exists:
        target_alpha, target_beta = gradient_update(post, settings.per_layer_alpha)
    step = (settings.bounds, settings.max_log_step, settings.damping)
    new_alpha, alpha_distance = bounded_step(post.alpha, target_alpha, *step)
    new_beta, beta_distance = bounded_step(post.beta, target_beta, *step)
    distance = float(alpha_distance.max())
    if not post.likelihood.tunes_noise:
        return new_alpha, post.beta, distance
    return new_alpha, new_beta, max(distance, float(beta_distance.max()))


def checked(post: LaplacePosterior) -> LaplacePosterior:
    """``post``, its ``log |A|`` computed: a precision that is not positive definite
    raises [`NotPositiveDefiniteError`][bnn_zoo.methods.laplace.NotPositiveDefiniteError]
    where it is built."""
    with torch.no_grad():
        post.log_det()
    return post


def _settle(post: LaplacePosterior, alpha: Tensor, beta: Tensor,
            settings: EvidenceSettings) -> tuple[LaplacePosterior, EvidenceSettings]:
    """The posterior at ``post``'s MAP and curvature (the blocks, which do not depend on
    ``alpha`` and ``beta``) after steps from ``alpha``, ``beta`` until one is below
    ``tol`` or after ``iterations``. Fixed-point steps that have not settled by then (a
    fixed-point map steeper than the damping can tame cycles) are followed by gradient
    steps from where they ended. Returns the posterior and the settings of the steps that
    ended (``evidence="gradient"`` after that fall-back)."""
    for _ in range(settings.iterations):
        post = checked(replace(post, alpha=alpha, beta=beta))
        alpha, beta, distance = evidence_step(post, settings)
        if distance < settings.tol:
            return post, settings
    if settings.evidence == "fixed_point":
        return _settle(post, post.alpha, post.beta, replace(settings, evidence="gradient"))
    return post, settings


def _record(post: LaplacePosterior) -> tuple[list[float], float, float]:
    """``(alpha, beta, log evidence)`` of ``post``, for its ``history``."""
    with torch.no_grad():
        return post.alpha.tolist(), post.beta.tolist(), float(post.log_evidence())


def maximize_evidence(post: LaplacePosterior, settings: EvidenceSettings,
                      refit: Refit) -> LaplacePosterior:
    """The evidence loop from ``post`` (see the module docstring), ``settings.evidence``
    not ``None``: each iteration computes the evidence-optimal ``alpha``, ``beta`` for the
    current MAP; if they are within ``tol`` of the current ones, the loop has converged and
    stops on that consistent (MAP, ``alpha``, ``beta``). Otherwise it settles them at this
    MAP and curvature, then (``refine``) refits the MAP and the curvature once for the
    settled values by ``refit``. At most ``iterations`` refits.

    The result's ``converged`` and ``iterations`` (the refits made) say how it ended; its
    ``history`` holds ``(alpha, beta, log evidence)`` of every refitted (MAP, ``alpha``,
    ``beta``) it went through, ``post`` first."""
    if settings.evidence is None:
        raise ValueError("Expected settings.evidence 'fixed_point' or 'gradient' for the "
                         "evidence loop, but got None.")
    history = [_record(post)]
    converged, refits = False, 0
    while refits < settings.iterations:
        alpha, beta, distance = evidence_step(post, settings)
        if distance < settings.tol:
            converged = True
            break
        # A fixed point that cycled is gradient-tuned from then on: near such an optimum
        # the fixed-point targets magnify the optimum's round-off above ``tol``.
        post, settings = _settle(post, alpha, beta, settings)
        if settings.refine:
            post = refit(post.theta, post.alpha, post.beta)
        history.append(_record(post))
        refits += 1
    post.history, post.converged, post.iterations = history, converged, refits
    return post
