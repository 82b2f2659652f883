"""Laplace precision blocks that hold their curvature entry by entry: dense (p, p)
([`DenseBlock`][]) and diagonal (p,) ([`DiagBlock`][]), with the jittered Cholesky
factorisation the dense one uses (`bnn_zoo._core.linalg`; Bishop 2006, *Pattern
Recognition and Machine Learning*, 5.7; MacKay 1992, "Bayesian Interpolation", for the
evidence in the eigenvalues of the curvature)."""

from __future__ import annotations

from enum import StrEnum

import torch
from torch import Tensor

from bnn_zoo._core.checks import check_choice
from bnn_zoo._core.linalg import cholesky_with_jitter, symmetric_eigh
from bnn_zoo.methods.laplace._block_base import TraceFromDiagonal, index_from, index_state

__all__ = ["DenseBlock", "DiagBlock", "Indefinite", "NotPositiveDefiniteError"]


class Indefinite(StrEnum):
    """What a dense precision with an indefinite curvature does where no jitter makes it
    positive definite: raise a [`NotPositiveDefiniteError`][], or project the curvature
    onto the positive semi-definite cone once (``clip``)."""

    RAISE = "raise"
    CLIP = "clip"


class NotPositiveDefiniteError(ValueError):
    """The Laplace precision ``alpha I + beta H`` is not positive definite."""


def _tracked(alpha: Tensor, beta: Tensor) -> bool:
    """Whether a gradient is being taken through ``alpha`` or ``beta``."""
    return torch.is_grad_enabled() and (alpha.requires_grad or beta.requires_grad)


class DenseBlock(TraceFromDiagonal):
    """Precision ``diag(alpha) + beta H`` on ``theta[index]`` with a dense (p, p) ``H``.

    Factorised in float64 whatever the data's dtype: with a small ``alpha`` the
    precision of a trained net is too ill-conditioned for a float32 Cholesky.
    Results come back in the dtype of ``H``.

    The factorisation is a Cholesky, with a jitter ``j I`` escalated from ``10^-12`` to
    ``10^-6`` times the precision's mean diagonal where the plain one fails
    (`cholesky_with_jitter`); the last jitter used (or the shift the eigendecomposition of
    the spectral shortcut needed, `symmetric_eigh`) is ``jitter``. Only where no jitter
    helps is ``H`` eigendecomposed: with ``indefinite="clip"`` it is projected onto the
    positive semi-definite cone once (negative eigenvalues set to zero, the nearest PSD
    matrix in Frobenius norm; their number is ``clipped``), otherwise
    [`NotPositiveDefiniteError`][] is raised.

    Spectral shortcut (MacKay 1992; PRML 5.177-5.178, which write the evidence in the
    eigenvalues ``lambda_i`` of ``beta H``): once a second ``(alpha, beta)`` is asked
    for with ``alpha`` one number ``a`` on the block (the evidence loop), the eigenvalues
    ``lambda_i`` of ``H`` are computed once and `log_det` and [`alpha_trace`][]
    answer from them, ``log |A| = sum_i log(a + beta lambda_i)`` and ``tr(a A^-1) = sum_i
    a / (a + beta lambda_i)``, in ``O(p)`` instead of a new ``O(p^3)`` factorisation per
    ``(alpha, beta)``. The eigenvectors ``V`` (``H = V diag(lambda) V^T``) are computed
    only when `inverse_diagonal` needs them, ``[A^-1]_jj = sum_i V_ji^2 / (a + beta
    lambda_i)`` (per-layer ``gamma``), since the eigenvalues alone cost a fraction of a
    full eigendecomposition. Where some
    ``a + beta lambda_i`` is not positive they fall back to the Cholesky. Draws, whitening
    and the covariance always use the Cholesky factor. Memory: the eigenvectors, once
    computed, one more ``p x p``.
    """

    kind = "dense"

    def __init__(self, index: slice | Tensor, hessian: Tensor, dtype: torch.dtype,
                 indefinite: str = "raise", clipped: int = 0, jitter: float = 0.0) -> None:
        """``hessian`` (p, p) the float64 curvature as used (already projected, if it was),
        ``dtype`` the dtype of results, ``indefinite`` what to do when no jitter makes the
        precision positive definite, ``clipped`` the eigenvalues a projection removed,
        ``jitter`` the last jitter used."""
        self.index = index
        self.hessian = hessian
        self.dtype = dtype
        self.indefinite = Indefinite(check_choice("indefinite", indefinite,
                                                  tuple(Indefinite)))
        self.clipped = clipped
        self.jitter = jitter
        #: ``(alpha, beta, L, jitter)`` of the last factorisation (see [`cholesky`][]).
        self._factor: tuple[Tensor, Tensor, Tensor, float] | None = None
        #: ``lambda`` and ``V`` of ``H``, each once the spectral shortcut needs it (see
        #: `_spectrum`).
        self._eigenvalues: Tensor | None = None
        #: The shift the eigendecomposition of ``H`` needed (`symmetric_eigh`), 0 mostly.
        self._eigen_shift = 0.0
        self._eigenvectors: Tensor | None = None

    @classmethod
    def from_hessian(cls, index: slice | Tensor, hessian: Tensor, indefinite: str = "raise"
                     ) -> DenseBlock:
        """The block of a curvature ``hessian`` (p, p), held in float64."""
        return cls(index, hessian.double(), hessian.dtype, indefinite)

    def state_dict(self) -> dict:
        return {**index_state(self.kind, self.index), "hessian": self.hessian,
                "dtype": str(self.dtype).removeprefix("torch."),
                "indefinite": self.indefinite.value, "clipped": self.clipped,
                "jitter": self.jitter}

    @classmethod
    def from_state(cls, state: dict) -> DenseBlock:
        return cls(index_from(state), state["hessian"], getattr(torch, state["dtype"]),
                   state["indefinite"], state["clipped"], state["jitter"])

    def cholesky(self, alpha: Tensor, beta: Tensor) -> Tensor:
        """The lower Cholesky factor of ``diag(alpha) + beta H`` (+ jitter), float64.

        The last factor is kept and returned again for equal ``alpha`` and ``beta`` (the
        evidence loop and the predictive ask for it several times), unless a gradient is
        being taken through it."""
        tracked = _tracked(alpha, beta)
        if not tracked and self._factorised(alpha, beta):
            self.jitter = self._factor[3]
            return self._factor[2]
        precision = beta.double() * self.hessian + torch.diag_embed(alpha.double())
        chol, self.jitter = cholesky_with_jitter(precision)
        if chol is not None:
            if not tracked:
                self._factor = (alpha.detach().clone(), beta.detach().clone(), chol,
                                self.jitter)
            return chol
        if self.indefinite == "clip" and not self.clipped:
            evals, evecs, self._eigen_shift = symmetric_eigh(self.hessian,
                                                             "the Laplace curvature")
            self.clipped = max(int((evals < 0).sum()), 1)
            self._eigenvalues, self._eigenvectors = evals.clamp_min(0), evecs
            self.hessian = (evecs * self._eigenvalues) @ evecs.T
            self._factor = None
            return self.cholesky(alpha, beta)
        if not bool(torch.isfinite(precision).all()):
            raise NotPositiveDefiniteError(
                f"The Laplace precision alpha I + beta H is not finite (alpha in "
                f"[{float(alpha.min()):.3g}, {float(alpha.max()):.3g}], beta "
                f"{float(beta.max()):.3g}): expected finite prior and noise precisions.")
        smallest = float(symmetric_eigh(precision.detach(), "the Laplace precision",
                                        vectors=False)[0][0])
        raise NotPositiveDefiniteError(
            f"The Laplace precision alpha I + beta H is not positive definite (smallest "
            f"eigenvalue {smallest:.3g} in float64, and a jitter up to {self.jitter:.3g} did "
            "not help): the curvature is indefinite, as the exact Hessian at a ReLU net's MAP "
            "often is. Use curvature='ggn' (always positive semi-definite), refine the MAP, or "
            "pass indefinite='clip' to project H onto the positive semi-definite cone."
        )

    def _factorised(self, alpha: Tensor, beta: Tensor) -> bool:
        """Whether the kept Cholesky factor is that of ``alpha`` and ``beta``."""
        return self._factor is not None and all(
            torch.equal(a, b) for a, b in zip(self._factor[:2], (alpha, beta)))

    def _spectrum(self, alpha: Tensor, beta: Tensor, vectors: bool = False
                  ) -> tuple[Tensor, Tensor | None] | None:
        """``(a + beta lambda, V)`` in float64 for ``alpha`` equal to ``a`` throughout (``V``
        ``None`` unless ``vectors`` asks for it or it was computed before), or
        ``None`` (use the Cholesky): for another ``alpha``, for the first ``(alpha, beta)``
        asked of this block (one Cholesky is cheaper than an eigendecomposition; a second
        pair means the evidence loop), for the pair last factorised (its factor is kept,
        so ``log |A|`` agrees with the draws to the last bit), where some eigenvalue of
        the precision is not positive, and where a gradient is being taken (equal values
        may be distinct parameters, one per layer, each with its own derivative)."""
        if (_tracked(alpha, beta) or not bool((alpha == alpha[0]).all())
                or self._factor is None or self._factorised(alpha, beta)):
            return None
        if vectors and self._eigenvectors is None:
            self._eigenvalues, self._eigenvectors, self._eigen_shift = symmetric_eigh(
                self.hessian, "the Laplace curvature")
        elif self._eigenvalues is None:
            self._eigenvalues, _, self._eigen_shift = symmetric_eigh(
                self.hessian, "the Laplace curvature", vectors=False)
        precision = alpha[0].double() + beta.double() * self._eigenvalues
        if not bool((precision > 0).all()):
            return None
        self.jitter = self._eigen_shift
        return precision, self._eigenvectors

    def log_det(self, alpha: Tensor, beta: Tensor) -> Tensor:
        spectrum = self._spectrum(alpha, beta)
        if spectrum is not None:
            return torch.log(spectrum[0]).sum().to(self.dtype)
        return (2 * torch.log(torch.diagonal(self.cholesky(alpha, beta))).sum()).to(self.dtype)

    def inverse_diagonal(self, alpha: Tensor, beta: Tensor) -> Tensor:
        spectrum = self._spectrum(alpha, beta, vectors=True)
        if spectrum is not None:
            precision, evecs = spectrum
            return (evecs**2 @ precision.reciprocal()).to(self.dtype)
        chol = self.cholesky(alpha, beta)
        eye = torch.eye(chol.shape[0], dtype=chol.dtype, device=chol.device)
        inv = torch.linalg.solve_triangular(chol, eye, upper=False)
        return (inv**2).sum(0).to(self.dtype)

    def alpha_trace(self, alpha: Tensor, beta: Tensor) -> Tensor:
        """``tr(diag(alpha) A^-1)``: from the eigenvalues alone where the spectral shortcut
        applies, else from `inverse_diagonal`."""
        spectrum = self._spectrum(alpha, beta)
        if spectrum is not None:
            return (alpha[0].double() / spectrum[0]).sum().to(self.dtype)
        return super().alpha_trace(alpha, beta)

    def whiten(self, g: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        """(M, p) rows ``u_m = L^-1 g_m`` for rows ``g`` (M, p): ``u_m^T u_k = g_m^T A^-1 g_k``."""
        chol = self.cholesky(alpha, beta)
        return torch.linalg.solve_triangular(chol, g.T.double(), upper=False).T.to(self.dtype)

    def offset(self, eps: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        """``L^-T eps`` (..., p), distributed as ``N(0, A^-1)`` for standard normal ``eps``."""
        chol = self.cholesky(alpha, beta)
        flat = eps.reshape(-1, eps.shape[-1]).T.double()
        out = torch.linalg.solve_triangular(chol.T, flat, upper=True).T
        return out.reshape(eps.shape).to(self.dtype)

    def covariance(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return torch.cholesky_inverse(self.cholesky(alpha, beta)).to(self.dtype)


class DiagBlock(TraceFromDiagonal):
    """Precision ``alpha + beta h`` elementwise on ``theta[index]``."""

    kind = "diag"
    clipped = 0
    jitter = 0.0

    def __init__(self, index: slice, diagonal: Tensor) -> None:
        self.index = index
        self.diagonal = diagonal

    def state_dict(self) -> dict:
        return {**index_state(self.kind, self.index), "diagonal": self.diagonal}

    @classmethod
    def from_state(cls, state: dict) -> DiagBlock:
        return cls(index_from(state), state["diagonal"])

    def precision(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return alpha + beta * self.diagonal

    def log_det(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return torch.log(self.precision(alpha, beta)).sum()

    def inverse_diagonal(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return 1 / self.precision(alpha, beta)

    def whiten(self, g: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        return g * self.precision(alpha, beta).rsqrt()

    def offset(self, eps: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        return eps * self.precision(alpha, beta).rsqrt()

    def covariance(self, alpha: Tensor, beta: Tensor) -> Tensor:
        return torch.diag_embed(self.inverse_diagonal(alpha, beta))
