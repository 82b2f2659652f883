"""Laplace precision blocks that hold their curvature factored: one layer's Kronecker
factors ([`KronBlock`][]; Martens & Grosse 2015, "Optimizing Neural Networks with
Kronecker-factored Approximate Curvature"; Ritter, Botev & Barber 2018, "A Scalable
Laplace Approximation for Neural Networks") and the top eigenpairs of a curvature
([`LowRankBlock`][]; Daxberger et al. 2021, "Laplace Redux: Effortless Bayesian Deep
Learning")."""

from __future__ import annotations

import torch
from torch import Tensor

from bnn_zoo._core.checks import check_positive_int
from bnn_zoo._core.linalg import symmetric_eigh, thin_svd
from bnn_zoo.methods.laplace._block_base import TraceFromDiagonal, index_from, index_state

__all__ = ["KronBlock", "LowRankBlock"]


class KronBlock(TraceFromDiagonal):
    """Precision ``alpha I + beta Q ⊗ G`` on one layer's ``[W; b]`` (row-major, (a, o)):
    ``index`` its slice of ``theta`` (an MLP's layer) or the positions of its entries in
    that order (a torch layer, whose weight is stored ``(o, a)``).

    With ``Q = U diag(q) U^T`` and ``G = V diag(g) V^T`` the precision is
    ``(U ⊗ V) diag(alpha + beta q_i g_j) (U ⊗ V)^T``, so every operation is two small
    matrix products. ``alpha`` must be one number on the layer.
    """

    kind = "kron"
    clipped = 0

    def __init__(self, index: slice | Tensor, q_evals: Tensor, q_evecs: Tensor, g_evals: Tensor,
                 g_evecs: Tensor, jitter: float = 0.0) -> None:
        """The eigen-decompositions ``Q = U diag(q) U^T`` (a,), (a, a) and
        ``G = V diag(g) V^T`` (o,), (o, o), eigenvalues non-negative; ``jitter`` the
        largest diagonal shift their decomposition needed (see
        `symmetric_eigh`)."""
        self.index = index
        self.q_evals, self.q_evecs = q_evals, q_evecs
        self.g_evals, self.g_evecs = g_evals, g_evecs
        self.jitter = jitter

    @classmethod
    def from_factors(cls, index: slice | Tensor, q: Tensor, g: Tensor) -> KronBlock:
        """The block of the Kronecker factors ``Q`` (a, a) and ``G`` (o, o), positive
        semi-definite and often singular (a unit no point activates is a zero row of ``Q``)."""
        q_evals, q_evecs, q_shift = symmetric_eigh(q, "a Kronecker factor of the inputs")
        g_evals, g_evecs, g_shift = symmetric_eigh(g, "a Kronecker factor of the outputs")
        # Both factors are PSD by construction; clamping removes rounding below zero.
        return cls(index, q_evals.clamp_min(0), q_evecs, g_evals.clamp_min(0), g_evecs,
                   max(q_shift, g_shift))

    def state_dict(self) -> dict:
        return {**index_state(self.kind, self.index), "q_evals": self.q_evals,
                "q_evecs": self.q_evecs, "g_evals": self.g_evals, "g_evecs": self.g_evecs,
                "jitter": self.jitter}

    @classmethod
    def from_state(cls, state: dict) -> KronBlock:
        return cls(index_from(state), state["q_evals"], state["q_evecs"], state["g_evals"],
                   state["g_evecs"], state.get("jitter", 0.0))

    def eigenvalues(self, alpha: Tensor, beta: Tensor) -> Tensor:
        """(a, o) eigenvalues of the precision; ``alpha`` must be one number on the block."""
        if alpha.numel() > 1 and bool((alpha != alpha[0]).any()):
            raise ValueError("Expected one prior precision alpha on each Kronecker-factored "
                             "layer (curvature='kron' or 'kron_separate'), but got several "
                             "values in one layer; use a per-layer alpha or curvature='diag' "
                             "or 'ggn'.")
        return alpha[0] + beta * torch.outer(self.q_evals, self.g_evals)

    def log_det(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return torch.log(self.eigenvalues(alpha, beta)).sum()

    def inverse_diagonal(self, alpha: Tensor, beta: Tensor) -> Tensor:
        """(a o,) ``[A^-1]_(i,j) = sum_(k,l) U_ik^2 V_jl^2 / (alpha + beta q_k g_l)``: the
        (a, o) matrix ``(U * U) D (V * V)^T``, ``D_kl = 1 / (alpha + beta q_k g_l)``,
        flattened row-major."""
        inv = 1 / self.eigenvalues(alpha, beta)
        return (self.q_evecs**2 @ inv @ (self.g_evecs**2).T).flatten()

    def whiten(self, g: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        rot = self.q_evecs.T @ g.reshape(g.shape[0], *self.shape) @ self.g_evecs
        return (rot * self.eigenvalues(alpha, beta).rsqrt()).flatten(-2)

    def offset(self, eps: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        e = eps.reshape(*eps.shape[:-1], *self.shape) * self.eigenvalues(alpha, beta).rsqrt()
        return (self.q_evecs @ e @ self.g_evecs.T).reshape(eps.shape)

    def covariance(self, alpha: Tensor, beta: Tensor) -> Tensor:
        basis = torch.kron(self.q_evecs, self.g_evecs)
        return (basis / self.eigenvalues(alpha, beta).flatten()) @ basis.T

    @property
    def shape(self) -> tuple[int, int]:
        return self.q_evals.shape[0], self.g_evals.shape[0]


class LowRankBlock(TraceFromDiagonal):
    """Precision ``D + beta U diag(lambda) U^T`` on ``theta[index]``, ``D = diag(alpha)``,
    with the top ``k`` eigenpairs ``U`` (p, k), ``lambda`` (k,) of a curvature (laplace-torch's
    low-rank Laplace; Daxberger et al. 2021).

    With the thin SVD ``D^-1/2 U (beta diag(lambda))^1/2 = Q S R^T`` (``Q`` (p, k)) the
    precision is ``D^1/2 (I + Q S^2 Q^T) D^1/2``, so ``log |A| = sum log alpha_i +
    sum log(1 + s_j^2)``, ``A^-1 = D^-1/2 (I + Q ((1 + S^2)^-1 - 1) Q^T) D^-1/2`` and
    ``A^-1/2 = D^-1/2 (I + Q ((1 + S^2)^-1/2 - 1) Q^T)``: memory ``p k``, no ``p x p``
    matrix but the dense `covariance`.
    """

    kind = "low_rank"
    clipped = 0

    def __init__(self, index: slice, eigenvectors: Tensor, eigenvalues: Tensor,
                 jitter: float = 0.0) -> None:
        """``jitter``: the diagonal shift the curvature's decomposition needed (see
        `symmetric_eigh`)."""
        self.index = index
        self.eigenvectors = eigenvectors
        self.eigenvalues = eigenvalues
        self.jitter = jitter

    @classmethod
    def from_hessian(cls, index: slice, hessian: Tensor, rank: int) -> LowRankBlock:
        """The block of the ``rank`` largest positive eigenpairs of ``hessian`` (p, p)."""
        check_positive_int("rank", rank)
        evals, evecs, shift = symmetric_eigh(hessian, "the Laplace curvature")
        top = evals.argsort(descending=True)[:rank]
        top = top[evals[top] > 0]
        return cls(index, evecs[:, top], evals[top], shift)

    def state_dict(self) -> dict:
        return {**index_state(self.kind, self.index), "eigenvectors": self.eigenvectors,
                "eigenvalues": self.eigenvalues, "jitter": self.jitter}

    @classmethod
    def from_state(cls, state: dict) -> LowRankBlock:
        return cls(index_from(state), state["eigenvectors"], state["eigenvalues"],
                   state.get("jitter", 0.0))

    def _factors(self, alpha: Tensor, beta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``alpha`` (p,), ``Q`` (p, k) and the shrinkage ``(1 + s^2)^-1/2`` (k,)."""
        b = self.eigenvectors * (beta * self.eigenvalues).sqrt() / alpha.sqrt().unsqueeze(-1)
        q, s = thin_svd(b, "the low-rank Laplace factor")
        return alpha, q, (1 + s**2).rsqrt()

    def log_det(self, alpha: Tensor, beta: Tensor) -> Tensor:
        _, _, shrink = self._factors(alpha, beta)
        return torch.log(alpha).sum() - 2 * torch.log(shrink).sum()

    def inverse_diagonal(self, alpha: Tensor, beta: Tensor) -> Tensor:
        alpha, q, shrink = self._factors(alpha, beta)
        return (1 + (q**2 * (shrink**2 - 1)).sum(-1)) / alpha

    def whiten(self, g: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        alpha, q, shrink = self._factors(alpha, beta)
        scaled = g * alpha.rsqrt()
        return scaled + ((scaled @ q) * (shrink - 1)) @ q.T

    def offset(self, eps: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        alpha, q, shrink = self._factors(alpha, beta)
        return (eps + ((eps @ q) * (shrink - 1)) @ q.T) * alpha.rsqrt()

    def covariance(self, alpha: Tensor, beta: Tensor) -> Tensor:
        alpha, q, shrink = self._factors(alpha, beta)
        inner = torch.eye(q.shape[0], dtype=q.dtype, device=q.device) \
            + (q * (shrink**2 - 1)) @ q.T
        scale = alpha.rsqrt()
        return scale.unsqueeze(-1) * inner * scale
