"""Laplace precision blocks of a Gaussian likelihood on D outputs with a noise precision
per output, ``beta`` (D,) (Bishop 2006, *Pattern Recognition and Machine Learning*, 5.7,
with PRML 3.5's evidence read per output).

The GGN of ``E = 1/2 sum_{n,d} beta_d (f_nd - t_nd)^2`` is ``sum_n J_n^T diag(beta) J_n =
sum_d beta_d H_d`` with ``H_d = sum_n J_{n,d}^T J_{n,d}`` the curvature of output ``d``
alone (`GaussianPrecision` with ``beta = e_d``), and the
precision is

.. math::  A(\\alpha, \\beta) = \\mathrm{diag}(\\alpha) + \\sum_d \\beta_d H_d.

An `OutputBlock` holds the D parts ``H_d`` in one structure (dense (D, p, p) for
``hessian``, ``ggn``, ``last_layer``, ``subnetwork`` and ``low_rank``; diagonal (D, p) for
``diag``; for ``kron`` the shared input factor ``Q`` and D output factors ``G_d`` (D, o,
o), so that the output-side factor ``G = sum_d beta_d G_d`` has ``beta`` folded in) and,
for each ``beta`` asked of it, builds the single-precision block of ``sum_d beta_d H_d``
(`dense_blocks`, `factored_blocks`)
with unit noise precision, kept for the next call with the same ``beta``. Every answer is
differentiable in ``beta``: ``d log|A| / d beta_d = tr(A^-1 H_d)``, so output ``d``'s
effective number of parameters ``gamma_d = beta_d tr(A^-1 H_d)`` is ``beta_d`` times that
derivative (`output_effective_parameters`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from bnn_zoo._core.checks import check_choice
from bnn_zoo.methods.laplace._block_base import index_from, index_state
from bnn_zoo.methods.laplace._dense import DenseBlock, DiagBlock, Indefinite
from bnn_zoo.methods.laplace._factored import KronBlock, LowRankBlock

__all__ = ["OutputBlock", "output_effective_parameters"]

#: How each inner structure builds its block from the summed curvature ``h``.
_BUILD: dict[str, Callable[[OutputBlock, Tensor], object]] = {
    "dense": lambda out, h: DenseBlock.from_hessian(out.index, h, out.indefinite),
    "diag": lambda out, h: DiagBlock(out.index, h),
    "kron": lambda out, h: KronBlock.from_factors(out.index, out.q, h),
    "low_rank": lambda out, h: LowRankBlock.from_hessian(out.index, h, out.rank),
}


class OutputBlock:
    """Precision ``diag(alpha) + sum_d beta_d H_d`` on ``theta[index]`` from the D parts
    ``parts`` of one structure ``inner`` (``"dense"``, ``"diag"``, ``"kron"`` with the
    input factor ``q``, or ``"low_rank"`` keeping ``rank`` eigenpairs); ``indefinite`` as
    for [`DenseBlock`][bnn_zoo.methods.laplace.DenseBlock]."""

    kind = "outputs"

    def __init__(self, index: slice | Tensor, inner: str, parts: Tensor, *,
                 q: Tensor | None = None, rank: int = 10, indefinite: str = "clip") -> None:
        self.index = index
        self.inner = check_choice("inner", inner, tuple(_BUILD))
        self.parts, self.q, self.rank = parts, q, rank
        self.indefinite = Indefinite(check_choice("indefinite", indefinite, tuple(Indefinite)))
        self._last: tuple[Tensor, object] | None = None

    def state_dict(self) -> dict:
        return {**index_state(self.kind, self.index), "inner": self.inner, "parts": self.parts,
                "q": self.q, "rank": self.rank, "indefinite": self.indefinite.value}

    @classmethod
    def from_state(cls, state: dict) -> OutputBlock:
        return cls(index_from(state), state["inner"], state["parts"], q=state["q"],
                   rank=state["rank"], indefinite=state["indefinite"])

    def block(self, beta: Tensor) -> DenseBlock | DiagBlock | KronBlock | LowRankBlock:
        """The single-precision block of ``sum_d beta_d H_d`` for ``beta`` (D,), to be asked
        with unit noise precision; kept for the next ``beta`` of equal values unless a
        gradient is being taken through it."""
        tracked = torch.is_grad_enabled() and beta.requires_grad
        if not tracked and self._last is not None and torch.equal(self._last[0], beta):
            return self._last[1]
        summed = torch.tensordot(beta.to(self.parts.dtype), self.parts, 1)
        out = _BUILD[self.inner](self, summed)
        if not tracked:
            self._last = (beta.detach().clone(), out)
        return out

    @property
    def clipped(self) -> int:
        return 0 if self._last is None else self._last[1].clipped

    @property
    def jitter(self) -> float:
        return 0.0 if self._last is None else self._last[1].jitter

    def _ask(self, method: str, value: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        inner = self.block(beta)
        return getattr(inner, method)(value, alpha, beta.new_ones(()))

    def log_det(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return self.block(beta).log_det(alpha, beta.new_ones(()))

    def inverse_diagonal(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return self.block(beta).inverse_diagonal(alpha, beta.new_ones(()))

    def alpha_trace(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return self.block(beta).alpha_trace(alpha, beta.new_ones(()))

    def whiten(self, g: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        return self._ask("whiten", g, alpha, beta)

    def offset(self, eps: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        return self._ask("offset", eps, alpha, beta)

    def covariance(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return self.block(beta).covariance(alpha, beta.new_ones(()))


def output_effective_parameters(blocks: list, alpha: Tensor, beta: Tensor) -> Tensor:
    """(D,) ``gamma_d = beta_d tr(A^-1 H_d) = beta_d d log|A| / d beta_d`` summed over
    ``blocks`` (`OutputBlock`), ``alpha`` (P,) the prior precision of every
    weight: output ``d``'s share of the effective number of parameters, ``sum_d gamma_d
    = sum_i (1 - alpha_i [A^-1]_ii)``."""
    with torch.enable_grad():
        b = beta.detach().requires_grad_()
        log_det = sum(block.log_det(alpha[block.index].detach(), b) for block in blocks)
        return b.detach() * torch.autograd.grad(log_det, b)[0]
