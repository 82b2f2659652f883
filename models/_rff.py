"""Random-Fourier-feature regression with LogitNormal input scales (Coker's notes
"LogitNormal model").

The network of the notes, eqs. (1)-(8)::

    Phi(X; s) = sqrt(2) cos(X S W + b)          # (N, K), S = diag(s_1..s_D)
    f(X; s, beta) = Phi(X; s) beta              # (N,)
    beta_k ~ N(0, sigma_beta^2),  k = 1..K
    s_d ~ LogitNormal(mu_s, sigma_s^2),  d = 1..D   (s_d = sigmoid(z_d), z_d ~ N(mu_s, sigma_s^2))
    y_n ~ N(f(x_n; s, beta), sigma^2)

``W`` (D, K) and ``b`` (K,) are random but fixed: drawn once from a seeded
generator, ``W_dk ~ N(0, bandwidth^2)`` and ``b_k ~ U(0, 2 pi)``, and kept as
buffers so a saved model predicts the same. The notes' eq. (2) drops the phase ``b``
that eq. (4) has; we keep it (without it the features are all even functions of
``x``). Because ``s_d < 1``, ``bandwidth`` is the largest frequency a feature
can have along an input; ``s_d -> 0`` switches input ``d`` off, so ``E_q[s_d]``
is a learned relevance of input ``d``.

Prior scale of ``beta``: with ``b ~ U(0, 2 pi)``, ``E[2 cos^2(.)] = 1`` so
``Var f(x) = K sigma_beta^2``. The default ``sigma_beta^2 = prior_variance / K``
(``prior_variance = 1``) therefore keeps the prior on ``f`` fixed as ``K`` grows
(and makes ``f`` tend to a GP with a stationary kernel as ``K -> inf``).

Sample sites: ``"s"`` (D,), ``"beta"`` (K,), deterministic ``"f"``, likelihood
``"obs"`` inside ``pyro.plate("data", N)``.

Given ``s`` the model is a Bayesian linear regression on the features, so
[`feature_posterior`][] gives the exact full conditional ``p(beta | X, y, s)``
and the evidence ``log p(y | X, s)`` with one Cholesky factor of a K x K matrix.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from torch import Tensor
from torch.distributions import register_kl
from torch.distributions.transforms import SigmoidTransform

from bnn_zoo._core.checks import check_positive, check_positive_int
from bnn_zoo.models._mlp import drop_plate_dim
from bnn_zoo.models._noise import ObservationNoise

__all__ = ["JITTERS", "FeaturePosterior", "LogitNormal", "RandomFeatureRegression",
           "feature_posterior", "gram"]


class LogitNormal(dist.TransformedDistribution):
    """``s = sigmoid(z)``, ``z ~ N(loc, scale^2)``: a distribution on (0, 1).

    Its KL divergence is that of the underlying Normals (the sigmoid is a
    bijection, and KL is invariant under a bijection), registered with
    ``torch.distributions.kl_divergence``. [`mean`][] has no closed form and is
    computed by Gauss-Hermite quadrature; quantiles are ``sigmoid`` of the Normal's.
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, loc: Tensor | float, scale: Tensor | float,
                 validate_args: bool | None = None) -> None:
        base = dist.Normal(loc, scale, validate_args=validate_args)
        super().__init__(base, [SigmoidTransform(cache_size=1)], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None) -> LogitNormal:
        new = self._get_checked_instance(LogitNormal, _instance)
        return super().expand(batch_shape, _instance=new)

    @property
    def loc(self) -> Tensor:
        return self.base_dist.loc

    @property
    def scale(self) -> Tensor:
        return self.base_dist.scale

    @property
    def mean(self) -> Tensor:
        """``E[sigmoid(z)]`` by 64-point Gauss-Hermite quadrature (absolute error, float64:
        1e-16 for ``scale <= 1``, 1e-7 at ``scale = 3``, 1e-5 at ``scale = 5``)."""
        nodes, weights = _hermite_rule(64, self.loc)
        z = self.loc.unsqueeze(-1) + self.scale.unsqueeze(-1) * nodes
        return (torch.sigmoid(z) * weights).sum(-1)

    def icdf(self, q: Tensor | float) -> Tensor:
        q = torch.as_tensor(q, dtype=self.loc.dtype, device=self.loc.device)
        return torch.sigmoid(self.base_dist.icdf(q))


def _hermite_rule(n: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """Nodes and weights of ``E[g(z)], z ~ N(0, 1)`` (probabilists' Gauss-Hermite)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(n)
    weights = weights / math.sqrt(2 * math.pi)
    return (torch.as_tensor(nodes, dtype=like.dtype, device=like.device),
            torch.as_tensor(weights, dtype=like.dtype, device=like.device))


@register_kl(LogitNormal, LogitNormal)
def _kl_logit_normal(p: LogitNormal, q: LogitNormal) -> Tensor:
    return torch.distributions.kl_divergence(p.base_dist, q.base_dist)


class _Gram(torch.autograd.Function):
    """``Phi^T Phi`` with the backward ``dL/dPhi = Phi (G + G^T)``, ``G = dL/d(Phi^T Phi)``: one
    (N, K) x (K, K) product, where autograd of ``phi.mT @ phi`` takes two (one per operand).
    The backward is made of differentiable operations, so higher derivatives work."""

    @staticmethod
    def forward(phi: Tensor) -> Tensor:
        return phi.mT @ phi

    @staticmethod
    def setup_context(ctx, inputs: tuple[Tensor], output: Tensor) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (phi,) = ctx.saved_tensors
        return phi @ (grad + grad.mT)


def gram(phi: Tensor) -> Tensor:
    """``phi.mT @ phi`` (..., K, K) of features ``phi`` (..., N, K), differentiated with one
    (N, K) x (K, K) product instead of two (`_Gram`): the N K^2 products dominate a
    step of the random-feature pair."""
    return _Gram.apply(phi)


class FeaturePosterior(NamedTuple):
    """Bayesian linear regression ``y = Phi beta + N(0, sigma^2)``, ``beta ~ N(0, sigma_beta^2 I)``.

    ``loc`` (..., K) and ``scale_tril`` (..., K, K) of ``p(beta | y, Phi)``, and the
    evidence ``log_evidence = log N(y; 0, sigma_beta^2 Phi Phi^T + sigma^2 I)`` (...,).
    """

    loc: Tensor
    scale_tril: Tensor
    log_evidence: Tensor

    def distribution(self) -> dist.MultivariateNormal:
        return dist.MultivariateNormal(self.loc, scale_tril=self.scale_tril)


#: Relative jitters (times the mean diagonal of the precision) that [`feature_posterior`][]
#: tries in turn where the precision's Cholesky factorisation fails in floating point.
JITTERS = (1e-6, 1e-5, 1e-4, 1e-3)


def _jittered_cholesky(matrix: Tensor) -> Tensor:
    """The Cholesky factor of ``matrix + j mean(diag) I`` for the first ``j`` of
    `JITTERS` that works (a ``RuntimeWarning`` names it), else ``ValueError``."""
    mean_diagonal = matrix.diagonal(dim1=-2, dim2=-1).mean(-1)[..., None, None]
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    for relative in JITTERS:
        jitter = relative * mean_diagonal
        chol, info = torch.linalg.cholesky_ex(matrix + jitter * eye)
        if not bool((info > 0).any()):
            warnings.warn(f"feature_posterior: Cholesky failed in {matrix.dtype}; added jitter "
                          f"{float(jitter.detach().max()):.3g} ({relative:g} of the mean "
                          "diagonal) to the diagonal (use float64).", RuntimeWarning,
                          stacklevel=3)
            return chol
    raise ValueError(f"feature_posterior: the precision Phi^T Phi / sigma^2 + I / sigma_beta^2 "
                     f"is not positive definite in {matrix.dtype} even with a jitter of "
                     f"{JITTERS[-1]:g} of its mean diagonal; use float64.")


def feature_posterior(phi: Tensor, y: Tensor, noise_scale: Tensor | float,
                      prior_scale: Tensor | float) -> FeaturePosterior:
    """Exact posterior and evidence of Bayesian linear regression on features ``phi``.

    With precision ``A = Phi^T Phi / sigma^2 + I / sigma_beta^2`` (K x K) and
    ``r = Phi^T y / sigma^2``, the posterior is ``N(A^-1 r, A^-1)`` and, by the matrix
    determinant and Woodbury identities (never forming the N x N covariance),

    .. math::

        \\log p(y) = -\\tfrac{N}{2}\\log 2\\pi\\sigma^2 - K \\log\\sigma_\\beta
                     - \\tfrac12 \\log|A| - \\tfrac12 (y^T y / \\sigma^2 - r^T A^{-1} r).

    The lower-triangular factor of ``A^-1`` comes from the Cholesky factor ``L`` of
    ``A`` with rows and columns reversed (``J A J = L L^T`` gives
    ``A^-1 = (J L^-T J)(J L^-T J)^T``, as torch does for a precision matrix).
    ``A``'s eigenvalues are at least ``1 / sigma_beta^2``, so it is positive definite
    and no jitter is added; only if the factorisation still fails in floating point
    (float32 with ``cond(A)`` beyond ~1e7, as where the learned noise is tiny) is
    ``j mean(diag A)`` added to the diagonal, ``j`` the first of `JITTERS` that
    works, with a ``RuntimeWarning``; where none does, ``ValueError``.

    Parameters
    ----------
    phi : (..., N, K) features; leading dims are batch dims (e.g. samples of ``s``).
    y : (N,) targets.
    noise_scale, prior_scale : ``sigma`` and ``sigma_beta``.
    """
    n, k = phi.shape[-2:]
    noise_var = torch.as_tensor(noise_scale, dtype=phi.dtype, device=phi.device) ** 2
    prior_var = torch.as_tensor(prior_scale, dtype=phi.dtype, device=phi.device) ** 2
    eye = torch.eye(k, dtype=phi.dtype, device=phi.device)
    precision = gram(phi) / noise_var + eye / prior_var
    r = (phi.mT @ y.unsqueeze(-1)).squeeze(-1) / noise_var
    flipped = precision.flip((-2, -1))
    chol, info = torch.linalg.cholesky_ex(flipped)
    if bool((info > 0).any()):
        chol = _jittered_cholesky(flipped)
    inv_t = torch.linalg.solve_triangular(chol.mT, eye.expand_as(chol), upper=True)
    scale_tril = inv_t.flip((-2, -1))
    loc = (scale_tril @ (scale_tril.mT @ r.unsqueeze(-1))).squeeze(-1)
    log_det = 2 * torch.log(chol.diagonal(dim1=-2, dim2=-1)).sum(-1)
    quad = (y * y).sum() / noise_var - (r * loc).sum(-1)
    log_evidence = (-0.5 * n * torch.log(2 * math.pi * noise_var) - 0.5 * k * torch.log(prior_var)
                    - 0.5 * log_det - 0.5 * quad)
    return FeaturePosterior(loc, scale_tril, log_evidence)


class RandomFeatureRegression(ObservationNoise, pyro.nn.PyroModule):
    """Random-Fourier-feature regression with LogitNormal input scales (Coker's notes).

    Parameters
    ----------
    in_dim : number of inputs ``D``.
    num_features : number of random features ``K`` (default 100).
    bandwidth : standard deviation of the fixed frequencies ``W``; the largest
        frequency scale an input can reach, since ``s_d < 1`` (inputs standardised).
    prior_loc, prior_scale : ``mu_s`` and ``sigma_s`` of the LogitNormal prior on ``s_d``.
    prior_variance : prior variance of ``f(x)``; ``sigma_beta^2 = prior_variance / K``.
    noise_scale : a float fixes ``sigma``; ``None`` (default) learns it as a point
        estimate (type-II maximum likelihood), started at ``init_noise_scale``.
    feature_seed : seed of the generator that draws ``W`` and ``b``.
    """

    def __init__(self, in_dim: int, num_features: int = 100, *, bandwidth: float = 3.0,
                 prior_loc: float = 0.0, prior_scale: float = 1.0, prior_variance: float = 1.0,
                 noise_scale: float | None = None, init_noise_scale: float = 0.5,
                 feature_seed: int = 0) -> None:
        super().__init__()
        self.in_dim = check_positive_int("in_dim", in_dim)
        self.num_features = check_positive_int("num_features", num_features)
        check_positive("bandwidth", bandwidth)
        if not isinstance(prior_loc, (int, float)) or not math.isfinite(prior_loc):
            raise ValueError(f"Expected prior_loc to be a finite number, but got {prior_loc!r}.")
        check_positive("prior_scale", prior_scale)
        check_positive("prior_variance", prior_variance)
        if not isinstance(feature_seed, int):
            raise TypeError(f"Expected feature_seed to be an int, but got {feature_seed!r}.")
        gen = torch.Generator().manual_seed(feature_seed)
        self.register_buffer("frequencies",
                             bandwidth * torch.randn(in_dim, num_features, generator=gen))
        self.register_buffer("phases", 2 * math.pi * torch.rand(num_features, generator=gen))
        self.register_buffer("scale_prior_loc", torch.tensor(float(prior_loc)))
        self.register_buffer("scale_prior_scale", torch.tensor(float(prior_scale)))
        self.register_buffer("beta_scale", torch.tensor(math.sqrt(prior_variance / num_features)))
        self.init_noise(noise_scale, init_noise_scale)


    def scale_prior(self) -> LogitNormal:
        """``p(s)``: ``LogitNormal(mu_s, sigma_s^2)`` per input, event shape (D,)."""
        return LogitNormal(self.scale_prior_loc, self.scale_prior_scale).expand(
            [self.in_dim]).to_event(1)

    def beta_prior(self) -> dist.Independent:
        """``p(beta)``: ``N(0, sigma_beta^2 I_K)``."""
        return dist.Normal(torch.zeros_like(self.phases), self.beta_scale).expand(
            [self.num_features]).to_event(1)

    def features(self, x: Tensor, s: Tensor) -> Tensor:
        """``Phi(x; s) = sqrt(2) cos(x diag(s) W + b)``: (N, D) and (..., D) -> (..., N, K)."""
        z = (x * s.unsqueeze(-2)) @ self.frequencies.to(x.dtype) + self.phases.to(x.dtype)
        return math.sqrt(2.0) * torch.cos(z)

    def conditional(self, x: Tensor, y: Tensor, s: Tensor) -> FeaturePosterior:
        """The full conditional ``p(beta | x, y, s)`` and evidence ``log p(y | x, s)``."""
        return feature_posterior(self.features(x, s), y, self.observation_scale().to(x.dtype),
                                 self.beta_scale.to(x.dtype))

    def check_input(self, x: Tensor) -> None:
        if x.dim() != 2 or x.shape[-1] != self.in_dim:
            raise ValueError(f"Expected x of shape (N, {self.in_dim}), but got {tuple(x.shape)}.")

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        self.check_input(x)
        s = drop_plate_dim(pyro.sample("s", self.scale_prior()), 1)
        beta = drop_plate_dim(pyro.sample("beta", self.beta_prior()), 1)
        with pyro.plate("data", x.shape[0]) as idx:
            if idx.shape[0] != x.shape[0]:
                x = x.index_select(0, idx)
                y = None if y is None else y.index_select(0, idx)
            f = pyro.deterministic("f", (self.features(x, s) @ beta.unsqueeze(-1)).squeeze(-1))
            pyro.sample("obs", dist.Normal(f, self.observation_scale().to(f.dtype)), obs=y)
        return f

