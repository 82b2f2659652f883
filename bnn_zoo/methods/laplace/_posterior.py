"""The Laplace posterior of a Bayesian MLP or torch module and its closed-form GLM
predictive (Bishop 2006, PRML 5.7; MacKay 1992, "A Practical Bayesian Framework for
Backpropagation Networks").

Model (PRML 5.7.1): ``p(t | x, w) = N(t | y(x, w), beta^-1)`` (or a categorical
likelihood with ``beta = 1``), prior ``p(w | alpha) = N(w | 0, alpha^-1 I)``, generalised
here to ``N(w | m, diag(alpha)^-1)`` with a prior mean ``m`` (P,) and a prior precision
per layer or per weight. With ``w_MAP`` a mode of the log joint, the posterior is approximated by

.. math::  q(w) = N(w | w_MAP, A^{-1}),   A = diag(\alpha) + \beta H,

where ``H`` is a curvature of the unit-precision negative log-likelihood ``E_D(w)``
(`bnn_zoo.methods.laplace._curvature`) held in the structures of
`bnn_zoo.methods.laplace._structures`.

GLM predictive (the linearised network, PRML 5.7.1):
``y(x, w) ~ y(x, w_MAP) + g^T (w - w_MAP)``, so
``p(t | x) = N(t | y(x, w_MAP), sigma^2(x))`` with ``sigma^2(x) = 1 / beta + g^T A^-1 g``
(PRML 5.173). For classification the logits are ``N(f, J A^-1 J^T)`` and the class
probabilities ``E[softmax(logits)]`` are either the probit approximation
``softmax(f_k / sqrt(1 + pi/8 g_k^T A^-1 g_k))`` (``link="probit"``; PRML 4.153, applied
per class, MacKay 1992) or a Monte Carlo average over the Gaussian logits
(``link="mc"``). The same predictive as a Pyro model whose weights the guide samples is
[`LinearizedModel`][bnn_zoo.methods.laplace.LinearizedModel].

Evidence (PRML 5.175, with ``W`` the number of weights; with
``alpha`` a vector, ``alpha/2 ||w||^2`` reads ``1/2 sum_i alpha_i (w_i - m_i)^2`` and
``W/2 log alpha`` reads ``1/2 sum_i log alpha_i``)::

    log p(D | alpha, beta) = -beta E_D(w_MAP) - alpha/2 w_MAP^T w_MAP - 1/2 log|A|
                             + W/2 log alpha + N/2 log beta - N/2 log(2 pi)

PRML's ``A = alpha I + beta H`` with ``H = Hess(SSE)`` is read with the SSE
carrying the factor 1/2 of its ``E(w)``; for the ``last_layer`` structure the
evidence and ``W`` count the last layer's weights only, the others being fixed at
the MAP like hyperparameters.

Regression with D outputs (targets (N, D)) has a noise precision per output, ``beta``
(D,), and ``E_D`` is (D,), ``E_d = 1/2 sum_n (y_nd - f_nd)^2``: the precision is ``A =
diag(alpha) + sum_d beta_d H_d`` with ``H_d`` output ``d``'s curvature
(`output_blocks`), so ``sum_d beta_d H_d = sum_n J_n^T
diag(beta) J_n``, and the evidence reads ``-sum_d beta_d E_d + N/2 sum_d log beta_d - N
D/2 log(2 pi)`` in place of ``-beta E_D + N/2 log beta - N/2 log(2 pi)``. The GLM
predictive is ``N(f, diag(1/beta) + J A^-1 J^T)``, of which the metrics need each
output's marginal ``N(f_d, 1/beta_d + g_d^T A^-1 g_d)``.

Heteroscedastic regression (`Heteroscedastic`: the
network's outputs are the mean ``mu`` and the raw scale ``s`` of ``sigma = softplus(s) +
MIN_SCALE``) has ``beta = 1`` (the noise is the network's), ``H`` the GGN with the Fisher
of ``N(mu, sigma^2)`` in ``(mu, s)``, ``E_D = sum_n (y_n - mu_n)^2 / (2 sigma_n^2) + log
sigma_n`` and the evidence ``-E_D - alpha/2 ||w||^2 - 1/2 log|A| + W/2 log alpha - N/2
log(2 pi)``. Its GLM predictive linearises the mean head and plugs in the scale head at
the MAP: ``N(mu(x), sigma(x)^2 + g_mu^T A^-1 g_mu)``, with ``sigma(x)`` at the MAP rather
than averaged over the posterior (the Pyro model
[`LinearizedModel`][bnn_zoo.methods.laplace.LinearizedModel] samples both heads linearised).

Each of these is one `Likelihood` object, which gives
the posterior its evidence's data terms and its GLM predictive.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from enum import StrEnum

import torch
from torch import Tensor

from bnn_zoo._core.checks import check_choice, check_data, check_positive_int
from bnn_zoo._core.predictive import CategoricalPredictive, GaussianMixturePredictive
from bnn_zoo.methods.laplace._curvature import check_dense_fits
from bnn_zoo.methods.laplace._layouts import Layout
from bnn_zoo.methods.laplace._outputs import output_effective_parameters
from bnn_zoo.methods.laplace._structures import Block, block_from_state
from bnn_zoo.models._likelihood import Likelihood, laplace_likelihood

__all__ = ["LaplacePosterior", "Link"]


class Link(StrEnum):
    """How the GLM predictive averages the softmax over a classifier's Gaussian logits:
    the probit approximation (MacKay 1992) or Monte Carlo draws of the logits."""

    PROBIT = "probit"
    MC = "mc"


@dataclass
class LaplacePosterior:
    """``N(theta_map, A^-1)`` with ``A = diag(alpha) + beta H`` in a given structure; the
    evidence, its fixed point and the Pyro models count the weights the blocks cover
    ([`covered`][]) only, the others being held at the MAP.

    Attributes
    ----------
    layout : where each weight tensor sits in ``theta`` (P,), and the network as a function
        of it (`bnn_zoo.methods.laplace._layouts`: an MLP's or any torch module's).
    theta : (P,) the MAP.
    blocks : the precision structure; weights outside every block stay at the MAP.
    alpha : prior precision, (L,) one per layer (all equal unless fitted per layer) or
        (P,) one per weight.
    beta : noise precision (1 for classification and heteroscedastic regression), or (D,)
        one per output for regression on targets (N, D) (then ``blocks`` are
        `OutputBlock` s).
    likelihood : the likelihood of the outputs (`bnn_zoo.models._likelihood`).
    energy : ``E_D(theta)``, the unit-precision negative log-likelihood at the MAP ((D,),
        one per output, with ``beta`` (D,)).
    num_outputs : ``N K``, the number of observed numbers (regression: ``N``, or ``N D``
        for D outputs).
    prior_mean : (P,) prior mean ``m`` (zeros by default).
    history : ``(alpha, beta, log evidence)`` after each refit of the evidence loop.
    converged : whether the evidence loop converged (``None`` without evidence tuning).
    iterations : the refits the evidence loop made (0 without evidence tuning).
    """

    layout: Layout
    theta: Tensor
    blocks: list[Block]
    alpha: Tensor
    beta: Tensor
    likelihood: Likelihood
    energy: Tensor
    num_outputs: int
    prior_mean: Tensor | None = None
    history: list[tuple[list[float], float | list[float], float]] = field(
        default_factory=list)
    converged: bool | None = None
    iterations: int = 0

    def __post_init__(self) -> None:
        p, layers = self.layout.num_parameters, self.layout.num_layers
        if self.alpha.shape not in ((layers,), (p,)):
            raise ValueError(f"Expected alpha of shape ({layers},) (per layer) or ({p},) (per "
                             f"weight), but got {tuple(self.alpha.shape)}.")
        if self.prior_mean is None:
            self.prior_mean = torch.zeros_like(self.theta)
        if self.prior_mean.shape != (p,):
            raise ValueError(f"Expected prior_mean of shape ({p},), but got "
                             f"{tuple(self.prior_mean.shape)}.")

    def state_dict(self) -> dict:
        """Everything but ``layout`` (the model's), as tensors and plain data:
        [`from_state`][] rebuilds this posterior from it without the training data."""
        return {"theta": self.theta, "alpha": self.alpha, "beta": self.beta,
                "likelihood": self.likelihood.name, "energy": self.energy,
                "num_outputs": self.num_outputs, "prior_mean": self.prior_mean,
                "blocks": [block.state_dict() for block in self.blocks],
                "history": [(list(a), b, e) for a, b, e in self.history],
                "converged": self.converged, "iterations": self.iterations}

    @classmethod
    def from_state(cls, state: dict, layout: Layout) -> LaplacePosterior:
        """The posterior of [`state_dict`][] on the network ``layout`` (the model's the
        posterior was fitted to)."""
        theta = state["theta"]
        if theta.shape != (layout.num_parameters,):
            raise ValueError(f"Expected a saved MAP of shape ({layout.num_parameters},) for "
                             f"the network {layout.description}, but got {tuple(theta.shape)}.")
        blocks = [block_from_state(block) for block in state["blocks"]]
        history = [(list(a), b, e) for a, b, e in state["history"]]  # b: a list for D outputs
        likelihood = laplace_likelihood(state["likelihood"], tuple(state["beta"].shape))
        return cls(layout, theta, blocks, state["alpha"], state["beta"], likelihood,
                   state["energy"], state["num_outputs"], state["prior_mean"], history,
                   state["converged"], state["iterations"])

    @property
    def clipped(self) -> int:
        """Negative Hessian eigenvalues set to zero (``indefinite="clip"``)."""
        return sum(b.clipped for b in self.blocks)

    @property
    def jitter(self) -> float:
        """The largest jitter the dense blocks' last Cholesky factorisations added."""
        return max(b.jitter for b in self.blocks)

    @property
    def covered(self) -> Tensor:
        """(P,) bool: the weights the Gaussian covers (all but ``last_layer``'s others)."""
        mask = torch.zeros_like(self.theta, dtype=torch.bool)
        for block in self.blocks:
            mask[block.index] = True
        return mask

    @property
    def covered_layers(self) -> list[int]:
        """Layers with weights the Gaussian covers (all of them, or for ``subnetwork`` some)."""
        mask = self.covered
        return [i for i, s in enumerate(self.layout.layer_slices) if bool(mask[s].any())]

    def alpha_vector(self, alpha: Tensor | None = None) -> Tensor:
        """(P,) prior precision of every weight."""
        alpha = self.alpha if alpha is None else alpha
        if alpha.shape == self.theta.shape:
            return alpha
        return alpha[self.layout.layer_index(self.theta)]

    def layer_sums(self, values: Tensor) -> Tensor:
        """(L,) the sum of ``values`` (P,) over each layer's weights."""
        out = values.new_zeros(self.layout.num_layers)
        return out.index_add_(0, self.layout.layer_index(values), values)

    def log_det(self, alpha: Tensor | None = None, beta: Tensor | None = None) -> Tensor:
        """``log |A|`` (covered weights)."""
        a = self.alpha_vector(alpha)
        b = self.beta if beta is None else beta
        return sum(block.log_det(a[block.index], b) for block in self.blocks)

    def log_evidence(self, alpha: Tensor | float | None = None,
                     beta: Tensor | float | None = None) -> Tensor:
        """The Laplace evidence ``log p(D | alpha, beta)`` (PRML 5.175) at this MAP and curvature.

        ``alpha`` a number, a per-layer (L,) or a per-weight (P,) tensor; default the
        fitted values. Differentiable in ``alpha`` and ``beta``.
        """
        alpha = self._as_alpha(alpha)
        beta = self.beta if beta is None else torch.as_tensor(beta, dtype=self.theta.dtype,
                                                              device=self.theta.device)
        mask = self.covered
        a = self.alpha_vector(alpha)[mask]
        sq = (self.theta - self.prior_mean)[mask] ** 2
        out = -0.5 * (a * sq).sum() + 0.5 * torch.log(a).sum()
        out = out - 0.5 * self.log_det(alpha, beta)
        return self.likelihood.add_data_terms(out, self.energy, beta, self.num_outputs)

    def _as_alpha(self, alpha: Tensor | float | None) -> Tensor:
        if alpha is None:
            return self.alpha
        alpha = torch.as_tensor(alpha, dtype=self.theta.dtype, device=self.theta.device)
        return alpha if alpha.dim() else alpha.expand(self.layout.num_layers)

    def effective_parameters(self, per_layer: bool = True) -> Tensor:
        """(L,) ``gamma_l = sum_{i in l} (1 - alpha_i [A^-1]_ii)`` of each covered layer
        (0 elsewhere); with one ``alpha_l`` per layer, ``W_l - alpha_l tr_l(A^-1)``.
        ``per_layer=False``: their sum, ``gamma = sum_blocks (p_b - tr(diag(alpha_b)
        A_b^-1))``, which a dense block with one ``alpha`` takes from the eigenvalues of
        its curvature alone (`DenseBlock.alpha_trace`)."""
        a = self.alpha_vector()
        if not per_layer:
            return sum(a[block.index].numel() - block.alpha_trace(a[block.index], self.beta)
                       for block in self.blocks)
        gamma = torch.zeros_like(self.theta)
        for block in self.blocks:
            ab = a[block.index]
            gamma[block.index] = 1 - ab * block.inverse_diagonal(ab, self.beta)
        return self.layer_sums(gamma)

    def output_effective_parameters(self) -> Tensor:
        """(D,) ``gamma_d = beta_d tr(A^-1 H_d)`` of a posterior with ``beta`` (D,): output
        ``d``'s share of the effective number of parameters (their sum is
        [`effective_parameters`][] summed)."""
        return output_effective_parameters(self.blocks, self.alpha_vector(), self.beta)

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
            rows = block.index if isinstance(block.index, slice) else block.index[:, None]
            out[rows, block.index] = block.covariance(a[block.index], self.beta)
        return out

    def function_covariance(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Output ``f`` (N, K) at the MAP and the GLM covariances ``J_n A^-1 J_n^T`` (N, K, K),
        from the whitened Jacobian rows of each block."""
        f, g = self.layout.jacobian(self.theta, x)
        a = self.alpha_vector()
        parts = [block.whiten(g.flatten(0, 1)[:, block.index], a[block.index], self.beta)
                 for block in self.blocks]
        u = torch.cat(parts, -1).reshape(*f.shape, -1)
        return f, u @ u.transpose(-1, -2)

    def function_variance(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Output ``f`` (N, K) at the MAP and the GLM variances ``g_k^T A^-1 g_k`` (N, K)."""
        f, cov = self.function_covariance(x)
        return f, cov.diagonal(dim1=-2, dim2=-1)

    def glm_predictive(self, x: Tensor, link: str = "probit", num_samples: int = 1000,
                       generator: torch.Generator | None = None
                       ) -> GaussianMixturePredictive | CategoricalPredictive:
        """The linearised predictive at ``x`` (N, D) (a module's inputs (N, ...)), as a
        one-component predictive.

        The likelihood's (`glm_predictive`):
        regression ``N(f(x), 1/beta + g^T A^-1 g)`` (``link`` unused); classification
        ``E[softmax(l)]`` over the logits ``l ~ N(f, J A^-1 J^T)`` by the probit
        approximation (``link="probit"``) or ``num_samples`` draws of the logits
        (``link="mc"``, from ``generator``).
        """
        x, _ = check_data(x, any_shape=True)
        self.layout.check_input(x)
        check_choice("link", link, tuple(Link))
        check_positive_int("num_samples", num_samples)
        with torch.no_grad():
            f, cov = self.function_covariance(x)
            var = cov.diagonal(dim1=-2, dim2=-1)
            if not (bool(torch.isfinite(f).all()) and bool(torch.isfinite(var).all())):
                warnings.warn("The Laplace GLM predictive has non-finite means or variances.",
                              RuntimeWarning, stacklevel=2)
            return self.likelihood.glm_predictive(f, cov, self.beta, link, num_samples,
                                                  generator)
