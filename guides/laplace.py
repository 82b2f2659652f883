"""The Laplace approximation of a Bayesian MLP with evidence maximisation (seed 001, first half;
Bishop, PRML 5.7; MacKay 1992).

Model (seed 001): ``p(t | x, w) = N(t | y(x, w), beta^-1)`` (or a categorical likelihood
with ``beta = 1``), prior ``p(w | alpha) = N(w | 0, alpha^-1 I)``. With ``w_MAP`` a mode of
the log joint, the posterior is approximated by

.. math::  q(w) = N(w | w_MAP, A^{-1}),   A = \\alpha I + \\beta H,

where ``H`` is a curvature of the unit-precision negative log-likelihood ``E_D(w)``
(:mod:`bnn_zoo.guides.curvature`: the exact Hessian, the generalised Gauss-Newton,
its diagonal, its per-layer Kronecker factorisation, or the last layer's GGN).

Predictives:

* ``glm`` (the seed's linearised network): ``y(x, w) ~ y(x, w_MAP) + g^T (w - w_MAP)``,
  so ``p(t | x) = N(t | y(x, w_MAP), sigma^2(x))`` with
  ``sigma^2(x) = 1 / beta + g^T A^-1 g`` (PRML 5.173); for classification the
  probit approximation ``softmax(f_k / sqrt(1 + pi/8 g_k^T A^-1 g_k))`` (PRML 4.153,
  applied per class, MacKay 1992);
* ``mc``: weights sampled from ``q`` and pushed through the nonlinear network (what
  :func:`bnn_zoo.predict` does with :class:`LaplaceGuide`).

Evidence (the seed's formula, PRML 5.175, with ``W`` the number of weights)::

    log p(D | alpha, beta) = -beta E_D(w_MAP) - alpha/2 w_MAP^T w_MAP - 1/2 log|A|
                             + W/2 log alpha + N/2 log beta - N/2 log(2 pi)

and its maximisation by MacKay's fixed point (PRML 5.178-5.180), alternated with
MAP refits: with ``lambda_i`` the eigenvalues of ``beta H``,
``gamma = sum_i lambda_i / (alpha + lambda_i) = W - alpha tr(A^-1)``,
``alpha = gamma / w^T w``, ``1 / beta = 2 E_D / (N - gamma)``. With a prior
precision per layer, ``gamma_l = W_l - alpha_l tr_l(A^-1)`` and
``alpha_l = gamma_l / ||w_l||^2``. A gradient alternative maximises the same
evidence in ``log alpha, log beta`` by L-BFGS at the current ``w_MAP``.

The seed's ``A = alpha I + beta H`` with ``H = Hess(SSE)`` is read with the SSE
carrying the factor 1/2 of its ``E(w)``; for the ``last_layer`` structure the
evidence and ``W`` count the last layer's weights only, the others being fixed at
the MAP like hyperparameters.

Memory, ``P`` weights: ``full`` and ``ggn`` hold a dense ``P x P`` precision and its
Cholesky factor (refused above :data:`~bnn_zoo.guides.curvature.MAX_DENSE_BYTES`),
``kron`` two factors per layer, ``(d_in + 1)^2 + d_out^2``, ``diag`` ``P`` numbers,
``last_layer`` the last layer's size squared.

.. warning:: The exact Hessian at the MAP of a ReLU network is often indefinite
   (the MAP found by SVI is not an exact mode, and the Hessian has negative
   directions along the residuals). ``curvature="full"`` then raises
   :class:`NotPositiveDefiniteError` by default; ``indefinite="clip"`` instead
   projects ``H`` onto the positive semi-definite cone (negative eigenvalues set
   to zero, the nearest PSD matrix in Frobenius norm), and says how many it clipped
   in :attr:`LaplacePosterior.clipped`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import Tensor, nn

from bnn_zoo.core.checks import check_choice, check_data, check_positive, check_positive_int
from bnn_zoo.core.nn import mlp_forward
from bnn_zoo.core.predictive import CategoricalPredictive, GaussianMixturePredictive
from bnn_zoo.core.training import FitResult, fit
from bnn_zoo.guides.curvature import (
    CURVATURES,
    MAX_DENSE_BYTES,
    ParameterLayout,
    check_dense_fits,
    diagonal_ggn,
    full_hessian,
    ggn,
    jacobian,
    kron_ggn,
    last_layer_ggn,
    negative_log_likelihood,
)
from bnn_zoo.models.priors import GaussianPrior

__all__ = ["EVIDENCE_METHODS", "PREDICTIVES", "LaplaceGuide", "LaplacePosterior",
           "NotPositiveDefiniteError", "curvature_blocks", "fit_laplace", "laplace_posterior",
           "model_alpha", "refine_map"]

PREDICTIVES = ("glm", "mc")
EVIDENCE_METHODS = ("fixed_point", "gradient")
INDEFINITE = ("raise", "clip")


class NotPositiveDefiniteError(ValueError):
    """The Laplace precision ``alpha I + beta H`` is not positive definite."""


# --------------------------------------------------------------------------- structures
class DenseBlock:
    """Precision ``diag(alpha) + beta H`` on ``theta[index]`` with a dense (p, p) ``H``.

    Factorised in float64 whatever the data's dtype: with a small ``alpha`` the
    precision of a trained net is too ill-conditioned for a float32 Cholesky.
    Results come back in the dtype of ``H``.
    """

    def __init__(self, index: slice, hessian: Tensor, indefinite: str = "raise") -> None:
        self.index = index
        self.dtype = hessian.dtype
        hessian = hessian.double()
        self.clipped = 0
        if indefinite == "clip":
            evals, evecs = torch.linalg.eigh(hessian)
            self.clipped = int((evals < 0).sum())
            hessian = (evecs * evals.clamp_min(0)) @ evecs.T
        self.hessian = hessian

    def cholesky(self, alpha: Tensor, beta: Tensor) -> Tensor:
        precision = beta.double() * self.hessian + torch.diag_embed(alpha.double())
        chol, info = torch.linalg.cholesky_ex(precision)
        if int(info) != 0:
            smallest = float(torch.linalg.eigvalsh(precision)[0])
            raise NotPositiveDefiniteError(
                f"The Laplace precision alpha I + beta H is not positive definite (smallest "
                f"eigenvalue {smallest:.3g} in float64): the curvature is indefinite, as the "
                "exact Hessian at a ReLU net's MAP often is. Use curvature='ggn' (always "
                "positive semi-definite), refine the MAP, or pass indefinite='clip' to project "
                "H onto the positive semi-definite cone."
            )
        return chol

    def log_det(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return (2 * torch.log(torch.diagonal(self.cholesky(alpha, beta))).sum()).to(self.dtype)

    def inverse_diagonal(self, alpha: Tensor, beta: Tensor) -> Tensor:
        chol = self.cholesky(alpha, beta)
        eye = torch.eye(chol.shape[0], dtype=chol.dtype, device=chol.device)
        inv = torch.linalg.solve_triangular(chol, eye, upper=False)
        return (inv**2).sum(0).to(self.dtype)

    def quadratic(self, g: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        """(M,) ``g_m^T A^-1 g_m`` for rows ``g`` (M, p)."""
        chol = self.cholesky(alpha, beta)
        v = torch.linalg.solve_triangular(chol, g.T.double(), upper=False)
        return (v**2).sum(0).to(self.dtype)

    def offset(self, eps: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        """``L^-T eps`` (..., p), distributed as ``N(0, A^-1)`` for standard normal ``eps``."""
        chol = self.cholesky(alpha, beta)
        flat = eps.reshape(-1, eps.shape[-1]).T.double()
        out = torch.linalg.solve_triangular(chol.T, flat, upper=True).T
        return out.reshape(eps.shape).to(self.dtype)

    def covariance(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return torch.cholesky_inverse(self.cholesky(alpha, beta)).to(self.dtype)


class DiagBlock:
    """Precision ``alpha + beta h`` elementwise on ``theta[index]``."""

    clipped = 0

    def __init__(self, index: slice, diagonal: Tensor) -> None:
        self.index = index
        self.diagonal = diagonal

    def precision(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return alpha + beta * self.diagonal

    def log_det(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return torch.log(self.precision(alpha, beta)).sum()

    def inverse_diagonal(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return 1 / self.precision(alpha, beta)

    def quadratic(self, g: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        return (g**2 / self.precision(alpha, beta)).sum(-1)

    def offset(self, eps: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        return eps * self.precision(alpha, beta).rsqrt()

    def covariance(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return torch.diag_embed(self.inverse_diagonal(alpha, beta))


class KronBlock:
    """Precision ``alpha I + beta Q ⊗ G`` on one layer's ``[W; b]`` (row-major, (a, o)).

    With ``Q = U diag(q) U^T`` and ``G = V diag(g) V^T`` the precision is
    ``(U ⊗ V) diag(alpha + beta q_i g_j) (U ⊗ V)^T``, so every operation is two small
    matrix products. ``alpha`` must be one number on the layer.
    """

    clipped = 0

    def __init__(self, index: slice, q: Tensor, g: Tensor) -> None:
        self.index = index
        # Both factors are PSD by construction; clamping removes rounding below zero.
        self.q_evals, self.q_evecs = torch.linalg.eigh(q)
        self.g_evals, self.g_evecs = torch.linalg.eigh(g)
        self.q_evals = self.q_evals.clamp_min(0)
        self.g_evals = self.g_evals.clamp_min(0)

    def eigenvalues(self, alpha: Tensor, beta: Tensor) -> Tensor:
        """(a, o) eigenvalues of the precision."""
        return alpha[0] + beta * torch.outer(self.q_evals, self.g_evals)

    def log_det(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return torch.log(self.eigenvalues(alpha, beta)).sum()

    def inverse_diagonal(self, alpha: Tensor, beta: Tensor) -> Tensor:
        inv = 1 / self.eigenvalues(alpha, beta)
        return (self.q_evecs**2 @ inv @ (self.g_evecs**2).T).flatten()

    def quadratic(self, g: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        rot = self.q_evecs.T @ g.reshape(g.shape[0], *self.shape) @ self.g_evecs
        return (rot**2 / self.eigenvalues(alpha, beta)).sum((-2, -1))

    def offset(self, eps: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        e = eps.reshape(*eps.shape[:-1], *self.shape) * self.eigenvalues(alpha, beta).rsqrt()
        return (self.q_evecs @ e @ self.g_evecs.T).reshape(eps.shape)

    def covariance(self, alpha: Tensor, beta: Tensor) -> Tensor:
        basis = torch.kron(self.q_evecs, self.g_evecs)
        return (basis / self.eigenvalues(alpha, beta).flatten()) @ basis.T

    @property
    def shape(self) -> tuple[int, int]:
        return self.q_evals.shape[0], self.g_evals.shape[0]


Block = DenseBlock | DiagBlock | KronBlock


def curvature_blocks(curvature: str, theta: Tensor, x: Tensor, y: Tensor,
                     layout: ParameterLayout, act: Callable[[Tensor], Tensor], likelihood: str,
                     *, indefinite: str = "raise", max_bytes: int = MAX_DENSE_BYTES) -> list[Block]:
    """The posterior precision structure of ``curvature`` at ``theta`` (see the module doc)."""
    check_choice("curvature", curvature, CURVATURES)
    check_choice("indefinite", indefinite, INDEFINITE)
    everything = slice(0, layout.num_parameters)
    args = (theta, x, y, layout, act, likelihood)
    if curvature == "full":
        return [DenseBlock(everything, full_hessian(*args, max_bytes=max_bytes), indefinite)]
    # A GGN is positive semi-definite in exact arithmetic; clipping removes only the
    # round-off negatives that a float32 GGN times a large beta (e.g. naval) can show.
    if curvature == "ggn":
        return [DenseBlock(everything, ggn(*args, max_bytes=max_bytes), "clip")]
    if curvature == "diag":
        return [DiagBlock(everything, diagonal_ggn(*args))]
    if curvature == "kron":
        return [KronBlock(index, q, g)
                for index, (q, g) in zip(layout.layer_slices, kron_ggn(*args))]
    return [DenseBlock(layout.layer_slices[-1], last_layer_ggn(*args), "clip")]


# --------------------------------------------------------------------------- posterior
@dataclass
class LaplacePosterior:
    """``N(theta_map, A^-1)`` with ``A = diag(alpha_layer) + beta H`` in a given structure.

    Attributes
    ----------
    layout : where each weight tensor sits in ``theta`` (P,).
    theta : (P,) the MAP.
    blocks : the precision structure; weights outside every block stay at the MAP.
    alpha : (L,) prior precision of each layer (all equal unless fitted per layer).
    beta : noise precision (1 for classification).
    likelihood : ``"gaussian"`` or ``"categorical"``.
    energy : ``E_D(theta)``, the unit-precision negative log-likelihood at the MAP.
    num_outputs : ``N K``, the number of observed numbers (regression: ``N``).
    act : hidden activation of the network.
    history : ``(alpha, beta, log evidence)`` after each evidence iteration.
    """

    layout: ParameterLayout
    theta: Tensor
    blocks: list[Block]
    alpha: Tensor
    beta: Tensor
    likelihood: str
    energy: Tensor
    num_outputs: int
    act: Callable[[Tensor], Tensor] = field(repr=False)
    history: list[tuple[list[float], float, float]] = field(default_factory=list)

    @property
    def clipped(self) -> int:
        """Negative Hessian eigenvalues set to zero (``indefinite="clip"``)."""
        return sum(b.clipped for b in self.blocks)

    @property
    def covered_layers(self) -> list[int]:
        """Layers whose weights the Gaussian covers (all but ``last_layer``'s)."""
        starts = [b.index.start for b in self.blocks]
        stops = [b.index.stop for b in self.blocks]
        return [i for i, s in enumerate(self.layout.layer_slices)
                if any(a <= s.start and s.stop <= b for a, b in zip(starts, stops))]

    def alpha_vector(self, alpha: Tensor | None = None) -> Tensor:
        """(P,) prior precision of every weight."""
        alpha = self.alpha if alpha is None else alpha
        return alpha[self.layout.layer_index(self.theta)]

    def _layer_sums(self, values: Tensor) -> Tensor:
        out = values.new_zeros(self.layout.num_layers)
        return out.index_add_(0, self.layout.layer_index(values), values)

    def log_det(self, alpha: Tensor | None = None, beta: Tensor | None = None) -> Tensor:
        """``log |A|`` (covered weights)."""
        a = self.alpha_vector(alpha)
        b = self.beta if beta is None else beta
        return sum(block.log_det(a[block.index], b) for block in self.blocks)

    def log_evidence(self, alpha: Tensor | float | None = None,
                     beta: Tensor | float | None = None) -> Tensor:
        """The seed's Laplace evidence ``log p(D | alpha, beta)`` at this MAP and curvature.

        ``alpha`` a number or a per-layer (L,) tensor; default the fitted values.
        Differentiable in ``alpha`` and ``beta``.
        """
        alpha = self._as_alpha(alpha)
        beta = self.beta if beta is None else torch.as_tensor(beta, dtype=self.theta.dtype,
                                                              device=self.theta.device)
        covered = self.covered_layers
        sq = self._layer_sums(self.theta**2)[covered]
        counts = self._layer_sums(torch.ones_like(self.theta))[covered]
        a = alpha[covered]
        out = -0.5 * (a * sq).sum() + 0.5 * (counts * torch.log(a)).sum()
        out = out - 0.5 * self.log_det(alpha, beta)
        if self.likelihood == "gaussian":
            n = self.num_outputs
            return out - beta * self.energy + 0.5 * n * torch.log(beta) \
                - 0.5 * n * math.log(2 * math.pi)
        return out - self.energy

    def _as_alpha(self, alpha: Tensor | float | None) -> Tensor:
        if alpha is None:
            return self.alpha
        alpha = torch.as_tensor(alpha, dtype=self.theta.dtype, device=self.theta.device)
        return alpha.expand(self.layout.num_layers)

    def effective_parameters(self) -> Tensor:
        """(L,) ``gamma_l = W_l - alpha_l tr_l(A^-1)`` of each covered layer (0 elsewhere)."""
        a = self.alpha_vector()
        gamma = torch.zeros_like(self.theta)
        for block in self.blocks:
            ab = a[block.index]
            gamma[block.index] = 1 - ab * block.inverse_diagonal(ab, self.beta)
        return self._layer_sums(gamma)

    def offset(self, eps: Tensor) -> Tensor:
        """(..., P) a draw from ``N(0, A^-1)`` given standard normal ``eps`` (..., P)."""
        a = self.alpha_vector()
        out = torch.zeros_like(eps)
        for block in self.blocks:
            out[..., block.index] = block.offset(eps[..., block.index], a[block.index], self.beta)
        return out

    def covariance(self) -> Tensor:
        """(P, P) dense ``A^-1`` (zero rows for weights held at the MAP)."""
        p = self.layout.num_parameters
        check_dense_fits(p, self.theta.dtype, "covariance")
        a = self.alpha_vector()
        out = self.theta.new_zeros(p, p)
        for block in self.blocks:
            out[block.index, block.index] = block.covariance(a[block.index], self.beta)
        return out

    def function_variance(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Output ``f`` (N, K) at the MAP and the GLM variances ``g_k^T A^-1 g_k`` (N, K)."""
        f, g = jacobian(self.theta, x, self.layout, self.act)
        a = self.alpha_vector()
        rows = g.flatten(0, 1)
        var = sum(block.quadratic(rows[:, block.index], a[block.index], self.beta)
                  for block in self.blocks)
        return f, var.reshape(f.shape)

    def glm_predictive(self, x: Tensor) -> GaussianMixturePredictive | CategoricalPredictive:
        """The linearised predictive at ``x`` (N, D), as a one-component predictive.

        Regression: ``N(f(x), 1/beta + g^T A^-1 g)``; classification: the probit
        approximation ``softmax(f / sqrt(1 + pi/8 g_k^T A^-1 g_k))``.
        """
        x, _ = check_data(x)
        with torch.no_grad():
            f, var = self.function_variance(x)
        if self.likelihood == "gaussian":
            scale = (var + 1 / self.beta).sqrt()
            return GaussianMixturePredictive(f.T.detach(), scale.T.detach())
        probs = torch.softmax(f * (1 + math.pi / 8 * var).rsqrt(), -1)
        return CategoricalPredictive(probs.unsqueeze(0).detach())


# --------------------------------------------------------------------------- MAP and evidence
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


def _fixed_point(post: LaplacePosterior, per_layer: bool) -> tuple[Tensor, Tensor]:
    """MacKay's updates (PRML 5.178-5.180) of ``alpha`` (per layer or shared) and ``beta``."""
    covered = post.covered_layers
    gamma = post.effective_parameters()
    sq = post._layer_sums(post.theta**2)
    alpha = post.alpha.clone()
    if per_layer:
        alpha[covered] = gamma[covered] / sq[covered]
    else:
        alpha[covered] = gamma[covered].sum() / sq[covered].sum()
    beta = post.beta
    if post.likelihood == "gaussian":
        beta = (post.num_outputs - gamma.sum()) / (2 * post.energy)
    return alpha, beta


def _gradient_step(post: LaplacePosterior, per_layer: bool,
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
    """The Laplace posterior of ``model`` around ``theta`` (P,), optionally evidence-tuned.

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
                new_alpha, new_beta = _fixed_point(post, per_layer_alpha)
        else:
            new_alpha, new_beta = _gradient_step(post, per_layer_alpha)
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


# --------------------------------------------------------------------------- the guide
class LaplaceGuide(PyroModule):
    """A Pyro guide that is a point mass (MAP) until :meth:`laplace_approximation`, then
    the Gaussian ``N(w_MAP, A^-1)`` of the Laplace approximation.

    Fit the MAP like any guide (``bnn_zoo.fit(model, guide, x, y, ...)``), then call
    ``guide.laplace_approximation(x, y, curvature=...)``; from then on the guide
    samples weights jointly (an auxiliary standard normal site ``_laplace_eps``,
    transformed by the posterior's structure), so :func:`bnn_zoo.predict` gives the
    ``mc`` predictive and :meth:`LaplacePosterior.glm_predictive` the ``glm`` one.

    Initial means: weight matrices ``N(0, 1/d_in)`` and biases ``N(0, bias_scale^2)``.
    Random biases spread the kinks of a ReLU net over the inputs (with zero biases every
    kink starts at ``x = 0``), as the core's ``fan_in_init`` does with ``U(-1, 1)``; here
    their spread is a parameter, ``bias_scale``.
    """

    def __init__(self, model: nn.Module, *, bias_scale: float = 1.0,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        check_positive("bias_scale", bias_scale)
        self.layout = ParameterLayout.from_model(model)
        self.keys = {name: name.replace(".", "_") for name, _ in self.layout.sites}
        self.loc = nn.ParameterDict()
        for name, shape in self.layout.sites:
            scale = 1 / math.sqrt(shape[0]) if len(shape) == 2 else bias_scale
            self.loc[self.keys[name]] = nn.Parameter(torch.randn(shape, generator=generator)
                                                     * scale)
        self.posterior: LaplacePosterior | None = None

    def theta(self) -> Tensor:
        """(P,) the current means as one flat vector."""
        locs = self.loc
        return self.layout.flatten({name: locs[key] for name, key in self.keys.items()})

    def forward(self, x: Tensor, y: Tensor | None = None) -> dict[str, Tensor]:
        theta = self.theta()
        if self.posterior is not None:
            eps = pyro.sample("_laplace_eps",
                              dist.Normal(torch.zeros_like(theta), 1.0).to_event(1),
                              infer={"is_auxiliary": True})
            theta = theta + self.posterior.offset(eps)
        values = self.layout.unflatten(theta)
        return {name: pyro.sample(name, dist.Delta(values[name], event_dim=len(shape)))
                for name, shape in self.layout.sites}

    def laplace_approximation(self, model: nn.Module, x: Tensor, y: Tensor, *,
                              curvature: str = "ggn", evidence: str | None = None,
                              per_layer_alpha: bool = False, refine: bool = True,
                              iterations: int = 30, tol: float = 1e-4,
                              indefinite: str = "raise",
                              max_bytes: int = MAX_DENSE_BYTES) -> LaplacePosterior:
        """Build the Laplace posterior around the current MAP (see :func:`laplace_posterior`).

        The refined MAP is written back into the guide; evidence-tuned ``beta`` and
        ``alpha`` are written into the model (its noise scale ``beta^-1/2`` and, with one
        ``alpha``, its prior), so ``bnn_zoo.predict(model, guide, x)`` and the ELBO use them.
        """
        with torch.no_grad():
            theta = self.theta()
        post = laplace_posterior(model, theta, x, y, curvature=curvature, evidence=evidence,
                                 per_layer_alpha=per_layer_alpha, refine=refine,
                                 iterations=iterations, tol=tol, indefinite=indefinite,
                                 max_bytes=max_bytes)
        values = self.layout.unflatten(post.theta)
        with torch.no_grad():
            for name, key in self.keys.items():
                self.loc[key].copy_(values[name])
        if post.likelihood == "gaussian":
            sigma = post.beta.rsqrt()
            if model.learn_noise:
                model.noise_scale = sigma
            else:
                model.fixed_noise_scale.copy_(sigma)
        if bool((post.alpha == post.alpha[0]).all()):
            model.prior = replace(model.prior, scale=float(post.alpha[0]) ** -0.5)
        self.posterior = post
        return post


def fit_laplace(model: nn.Module, x: Tensor, y: Tensor, *, steps: int = 3000, lr: float = 1e-2,
                batch_size: int | None = None, seed: int | None = None,
                progress: bool | None = None, jit: bool = False, bias_scale: float = 1.0,
                curvature: str = "ggn", evidence: str | None = None,
                **options) -> tuple[LaplaceGuide, LaplacePosterior, FitResult]:
    """MAP by SVI (``bnn_zoo.fit`` with a :class:`LaplaceGuide` as point mass), then the
    Laplace approximation. ``options`` go to :meth:`LaplaceGuide.laplace_approximation`.

    Returns the guide (now sampling the posterior), the posterior and the SVI result.
    """
    x, y = check_data(x, y)
    check_choice("curvature", curvature, CURVATURES)  # before the SVI run, not after
    if evidence is not None:
        check_choice("evidence", evidence, EVIDENCE_METHODS)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    guide = LaplaceGuide(model, bias_scale=bias_scale, generator=generator)
    guide = guide.to(device=x.device, dtype=x.dtype)
    result = fit(model, guide, x, y, steps=steps, lr=lr, batch_size=batch_size, seed=seed,
                 progress=progress, jit=jit)
    post = guide.laplace_approximation(model, x, y, curvature=curvature, evidence=evidence,
                                       **options)
    return guide, post, result
