"""Structures of the Laplace precision ``A = diag(alpha) + beta H`` (seed 001; Bishop, PRML 5.7).

Each block holds the curvature ``H`` of one slice of the flat weights ``theta`` in one
structure and answers, for given prior precisions ``alpha`` (one per weight of the slice)
and noise precision ``beta``, what the posterior needs: ``log |A|``, the diagonal of
``A^-1``, quadratic forms ``g^T A^-1 g``, draws ``A^-1/2 eps`` and the dense ``A^-1``.

A block is built from a curvature (``DenseBlock.from_hessian``, ``KronBlock.from_factors``)
once, at fit time. ``block.state_dict()`` gives what it holds as tensors and plain data
(its ``kind``, its slice as ``start``, ``stop``, and the tensors its constructor takes);
:func:`block_from_state` rebuilds exactly that block, without any data.

A block's ``index`` is a slice of ``theta``, or for ``subnetwork`` an int64 tensor of
positions. Memory for ``p`` weights: :class:`DenseBlock` ``p^2`` (``hessian``, ``ggn``,
``last_layer``, ``subnetwork``; ``kron_separate``'s bias blocks), :class:`LowRankBlock`
``p k`` (``low_rank``), :class:`DiagBlock` ``p`` (``diag``),
:class:`KronBlock` ``(d_in + 1)^2 + d_out^2`` (``kron``, one per layer; ``kron_separate``
one of ``d_in^2 + d_out^2`` per layer's weight matrix).

.. warning:: The exact Hessian at the MAP of a ReLU network is often indefinite
   (the MAP found by SVI is not an exact mode, and the Hessian has negative
   directions along the residuals). Where ``alpha I + beta H`` is then not positive
   definite, even with jitter, ``curvature="hessian"`` raises
   :class:`NotPositiveDefiniteError` by default; ``indefinite="clip"`` instead
   projects ``H`` onto the positive semi-definite cone and counts the clipped
   eigenvalues in the block's ``clipped``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bnn_zoo.core.checks import check_choice, check_positive_int
from bnn_zoo.guides.curvature import (
    MAX_DENSE_BYTES,
    Activation,
    check_curvature,
    diagonal_ggn,
    full_hessian,
    ggn,
    kron_ggn,
    last_layer_ggn,
    subnetwork_ggn,
    subnetwork_indices,
)
from bnn_zoo.guides.layouts import Layout

__all__ = ["INDEFINITE", "JITTER_MAX", "Block", "DenseBlock", "DiagBlock", "KronBlock",
           "LowRankBlock", "NotPositiveDefiniteError", "block_from_state", "cholesky_with_jitter",
           "curvature_blocks"]

INDEFINITE = ("raise", "clip")
JITTER_MAX = 1e-6


class NotPositiveDefiniteError(ValueError):
    """The Laplace precision ``alpha I + beta H`` is not positive definite."""


def _index_state(block: Block) -> dict:
    if isinstance(block.index, slice):
        return {"kind": block.kind, "start": block.index.start, "stop": block.index.stop}
    return {"kind": block.kind, "indices": block.index}


def _index_from(state: dict) -> slice | Tensor:
    if "indices" in state:
        return state["indices"]
    return slice(state["start"], state["stop"])


def cholesky_with_jitter(matrix: Tensor, max_relative: float = JITTER_MAX
                         ) -> tuple[Tensor | None, float]:
    """The Cholesky factor of ``matrix + j I`` (..., p, p) for the smallest ``j`` that works
    among ``0`` and ``10^-12, 10^-11, ..., max_relative`` times the mean of its ``|diagonal|``.

    Returns ``(L, j)``, or ``(None, j_max)`` when even the largest jitter fails.
    """
    chol, info = torch.linalg.cholesky_ex(matrix)
    if not bool(info.any()):
        return chol, 0.0
    scale = float(matrix.detach().diagonal(dim1=-2, dim2=-1).abs().mean()) or 1.0
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    exponent = -12
    while 10.0**exponent <= max_relative * (1 + 1e-9):
        jitter = 10.0**exponent * scale
        chol, info = torch.linalg.cholesky_ex(matrix + jitter * eye)
        if not bool(info.any()):
            return chol, jitter
        exponent += 1
    return None, max_relative * scale


def _tracked(alpha: Tensor, beta: Tensor) -> bool:
    """Whether a gradient is being taken through ``alpha`` or ``beta``."""
    return torch.is_grad_enabled() and (alpha.requires_grad or beta.requires_grad)


class _TraceFromDiagonal:
    """``alpha_trace`` of a block from its ``inverse_diagonal``."""

    def alpha_trace(self, alpha: Tensor, beta: Tensor) -> Tensor:
        """``tr(diag(alpha) A^-1) = sum_i alpha_i [A^-1]_ii``: the block's weights less its
        effective number of parameters ``gamma`` (PRML 5.179)."""
        return (alpha * self.inverse_diagonal(alpha, beta)).sum()


class DenseBlock(_TraceFromDiagonal):
    """Precision ``diag(alpha) + beta H`` on ``theta[index]`` with a dense (p, p) ``H``.

    Factorised in float64 whatever the data's dtype: with a small ``alpha`` the
    precision of a trained net is too ill-conditioned for a float32 Cholesky.
    Results come back in the dtype of ``H``.

    The factorisation is a Cholesky, with a jitter ``j I`` escalated from ``10^-12`` to
    ``10^-6`` times the precision's mean diagonal where the plain one fails
    (:func:`cholesky_with_jitter`); the last jitter used is ``jitter``. Only where no
    jitter helps is ``H`` eigendecomposed: with ``indefinite="clip"`` it is projected
    onto the positive semi-definite cone once (negative eigenvalues set to zero, the
    nearest PSD matrix in Frobenius norm; their number is ``clipped``), otherwise
    :class:`NotPositiveDefiniteError` is raised.

    Spectral shortcut (MacKay 1992; PRML 5.177-5.178, which write the evidence in the
    eigenvalues ``lambda_i`` of ``beta H``): once a second ``(alpha, beta)`` is asked
    for with ``alpha`` one number ``a`` on the block (the evidence loop), the eigenvalues
    ``lambda_i`` of ``H`` are computed once and :meth:`log_det` and :meth:`alpha_trace`
    answer from them, ``log |A| = sum_i log(a + beta lambda_i)`` and ``tr(a A^-1) = sum_i
    a / (a + beta lambda_i)``, in ``O(p)`` instead of a new ``O(p^3)`` factorisation per
    ``(alpha, beta)``. The eigenvectors ``V`` (``H = V diag(lambda) V^T``) are computed
    only when :meth:`inverse_diagonal` needs them, ``[A^-1]_jj = sum_i V_ji^2 / (a + beta
    lambda_i)`` (per-layer ``gamma``): eigenvalues alone cost a fifth of a full
    eigendecomposition at ``p = 3760`` (3.0 against 16 s, float64, one thread). Where some
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
        check_choice("indefinite", indefinite, INDEFINITE)
        self.index = index
        self.hessian = hessian
        self.dtype = dtype
        self.indefinite = indefinite
        self.clipped = clipped
        self.jitter = jitter
        #: ``(alpha, beta, L, jitter)`` of the last factorisation (see :meth:`cholesky`).
        self._factor: tuple[Tensor, Tensor, Tensor, float] | None = None
        #: ``lambda`` and ``V`` of ``H``, each once the spectral shortcut needs it (see
        #: :meth:`_spectrum`).
        self._eigenvalues: Tensor | None = None
        self._eigenvectors: Tensor | None = None

    @classmethod
    def from_hessian(cls, index: slice | Tensor, hessian: Tensor, indefinite: str = "raise"
                     ) -> DenseBlock:
        """The block of a curvature ``hessian`` (p, p), held in float64."""
        return cls(index, hessian.double(), hessian.dtype, indefinite)

    def state_dict(self) -> dict:
        return {**_index_state(self), "hessian": self.hessian,
                "dtype": str(self.dtype).removeprefix("torch."), "indefinite": self.indefinite,
                "clipped": self.clipped, "jitter": self.jitter}

    @classmethod
    def from_state(cls, state: dict) -> DenseBlock:
        return cls(_index_from(state), state["hessian"], getattr(torch, state["dtype"]),
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
            evals, evecs = torch.linalg.eigh(self.hessian)
            self.clipped = max(int((evals < 0).sum()), 1)
            self._eigenvalues, self._eigenvectors = evals.clamp_min(0), evecs
            self.hessian = (evecs * self._eigenvalues) @ evecs.T
            self._factor = None
            return self.cholesky(alpha, beta)
        smallest = float(torch.linalg.eigvalsh(precision.detach())[0])
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
            self._eigenvalues, self._eigenvectors = torch.linalg.eigh(self.hessian)
        elif self._eigenvalues is None:
            self._eigenvalues = torch.linalg.eigvalsh(self.hessian)
        precision = alpha[0].double() + beta.double() * self._eigenvalues
        if not bool((precision > 0).all()):
            return None
        self.jitter = 0.0
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
        applies, else from :meth:`inverse_diagonal`."""
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


class DiagBlock(_TraceFromDiagonal):
    """Precision ``alpha + beta h`` elementwise on ``theta[index]``."""

    kind = "diag"
    clipped = 0
    jitter = 0.0

    def __init__(self, index: slice, diagonal: Tensor) -> None:
        self.index = index
        self.diagonal = diagonal

    def state_dict(self) -> dict:
        return {**_index_state(self), "diagonal": self.diagonal}

    @classmethod
    def from_state(cls, state: dict) -> DiagBlock:
        return cls(_index_from(state), state["diagonal"])

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


class KronBlock(_TraceFromDiagonal):
    """Precision ``alpha I + beta Q ⊗ G`` on one layer's ``[W; b]`` (row-major, (a, o)):
    ``index`` its slice of ``theta`` (an MLP's layer) or the positions of its entries in
    that order (a torch layer, whose weight is stored ``(o, a)``).

    With ``Q = U diag(q) U^T`` and ``G = V diag(g) V^T`` the precision is
    ``(U ⊗ V) diag(alpha + beta q_i g_j) (U ⊗ V)^T``, so every operation is two small
    matrix products. ``alpha`` must be one number on the layer.
    """

    kind = "kron"
    clipped = 0
    jitter = 0.0

    def __init__(self, index: slice | Tensor, q_evals: Tensor, q_evecs: Tensor, g_evals: Tensor,
                 g_evecs: Tensor) -> None:
        """The eigen-decompositions ``Q = U diag(q) U^T`` (a,), (a, a) and
        ``G = V diag(g) V^T`` (o,), (o, o), eigenvalues non-negative."""
        self.index = index
        self.q_evals, self.q_evecs = q_evals, q_evecs
        self.g_evals, self.g_evecs = g_evals, g_evecs

    @classmethod
    def from_factors(cls, index: slice | Tensor, q: Tensor, g: Tensor) -> KronBlock:
        """The block of the Kronecker factors ``Q`` (a, a) and ``G`` (o, o)."""
        q_evals, q_evecs = torch.linalg.eigh(q)
        g_evals, g_evecs = torch.linalg.eigh(g)
        # Both factors are PSD by construction; clamping removes rounding below zero.
        return cls(index, q_evals.clamp_min(0), q_evecs, g_evals.clamp_min(0), g_evecs)

    def state_dict(self) -> dict:
        return {**_index_state(self), "q_evals": self.q_evals, "q_evecs": self.q_evecs,
                "g_evals": self.g_evals, "g_evecs": self.g_evecs}

    @classmethod
    def from_state(cls, state: dict) -> KronBlock:
        return cls(_index_from(state), state["q_evals"], state["q_evecs"], state["g_evals"],
                   state["g_evecs"])

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


class LowRankBlock(_TraceFromDiagonal):
    """Precision ``D + beta U diag(lambda) U^T`` on ``theta[index]``, ``D = diag(alpha)``,
    with the top ``k`` eigenpairs ``U`` (p, k), ``lambda`` (k,) of a curvature (laplace-torch's
    low-rank Laplace; Daxberger et al. 2021).

    With the thin SVD ``D^-1/2 U (beta diag(lambda))^1/2 = Q S R^T`` (``Q`` (p, k)) the
    precision is ``D^1/2 (I + Q S^2 Q^T) D^1/2``, so ``log |A| = sum log alpha_i +
    sum log(1 + s_j^2)``, ``A^-1 = D^-1/2 (I + Q ((1 + S^2)^-1 - 1) Q^T) D^-1/2`` and
    ``A^-1/2 = D^-1/2 (I + Q ((1 + S^2)^-1/2 - 1) Q^T)``: memory ``p k``, no ``p x p``
    matrix but the dense :meth:`covariance`.
    """

    kind = "low_rank"
    clipped = 0
    jitter = 0.0

    def __init__(self, index: slice, eigenvectors: Tensor, eigenvalues: Tensor) -> None:
        self.index = index
        self.eigenvectors = eigenvectors
        self.eigenvalues = eigenvalues

    @classmethod
    def from_hessian(cls, index: slice, hessian: Tensor, rank: int) -> LowRankBlock:
        """The block of the ``rank`` largest positive eigenpairs of ``hessian`` (p, p)."""
        check_positive_int("rank", rank)
        evals, evecs = torch.linalg.eigh(hessian)
        top = evals.argsort(descending=True)[:rank]
        top = top[evals[top] > 0]
        return cls(index, evecs[:, top], evals[top])

    def state_dict(self) -> dict:
        return {**_index_state(self), "eigenvectors": self.eigenvectors,
                "eigenvalues": self.eigenvalues}

    @classmethod
    def from_state(cls, state: dict) -> LowRankBlock:
        return cls(_index_from(state), state["eigenvectors"], state["eigenvalues"])

    def _factors(self, alpha: Tensor, beta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``alpha`` (p,), ``Q`` (p, k) and the shrinkage ``(1 + s^2)^-1/2`` (k,)."""
        b = self.eigenvectors * (beta * self.eigenvalues).sqrt() / alpha.sqrt().unsqueeze(-1)
        q, s, _ = torch.linalg.svd(b, full_matrices=False)
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


Block = DenseBlock | DiagBlock | KronBlock | LowRankBlock
_KINDS = {cls.kind: cls for cls in (DenseBlock, DiagBlock, KronBlock, LowRankBlock)}


def block_from_state(state: dict) -> Block:
    """The block whose ``state_dict()`` is ``state``, dispatched on its ``kind``."""
    kind = state.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"Expected a block state of kind {', '.join(_KINDS)}, "
                         f"but got {kind!r}.")
    return _KINDS[kind].from_state(state)


def _split_bias(index: slice | Tensor, d_out: int) -> tuple[slice | Tensor, slice | Tensor]:
    """A Kronecker index of ``[W^T; b]`` in row-major ``(D + 1, d_out)`` order split into
    that of ``W^T`` (the first ``D d_out``) and that of ``b`` (the last ``d_out``)."""
    if isinstance(index, slice):
        return slice(index.start, index.stop - d_out), slice(index.stop - d_out, index.stop)
    return index[:-d_out], index[-d_out:]


def curvature_blocks(curvature: str, theta: Tensor, x: Tensor, y: Tensor,
                     layout: Layout, act: Activation, likelihood: str,
                     *, indefinite: str = "raise", max_bytes: int = MAX_DENSE_BYTES,
                     rank: int = 10, subnetwork: Tensor | None = None) -> list[Block]:
    """The blocks of ``curvature`` (one of :data:`~bnn_zoo.guides.curvature.CURVATURES`) at
    ``theta`` (P,) on data ``x`` (N, D), ``y`` (N,); ``rank`` is the number of
    eigenpairs ``low_rank`` keeps, ``subnetwork`` the weights ``subnetwork`` covers."""
    check_curvature(curvature)
    check_choice("indefinite", indefinite, INDEFINITE)
    everything = slice(0, layout.num_parameters)
    args = (theta, x, y, layout, act, likelihood)
    if curvature == "hessian":
        return [DenseBlock.from_hessian(everything, full_hessian(*args, max_bytes=max_bytes),
                                        indefinite)]
    # A GGN is positive semi-definite in exact arithmetic; where even jitter does not
    # absorb the round-off negatives of a float32 GGN times a large beta (e.g. naval),
    # the projection removes them.
    if curvature == "ggn":
        return [DenseBlock.from_hessian(everything, ggn(*args, max_bytes=max_bytes), "clip")]
    if curvature == "diag":
        return [DiagBlock(everything, diagonal_ggn(*args))]
    if curvature == "kron":
        return [KronBlock.from_factors(index, q, g)
                for (index, _), (q, g) in zip(layout.kron_indices(theta), kron_ggn(*args))]
    if curvature == "kron_separate":
        blocks: list[Block] = []
        for (index, bias), (q, g) in zip(layout.kron_indices(theta), kron_ggn(*args)):
            if not bias:
                blocks.append(KronBlock.from_factors(index, q, g))
                continue
            weights, biases = _split_bias(index, g.shape[0])
            blocks.append(KronBlock.from_factors(weights, q[:-1, :-1], g))
            blocks.append(DenseBlock.from_hessian(biases, g, "clip"))
        return blocks
    if curvature == "low_rank":
        return [LowRankBlock.from_hessian(everything, ggn(*args, max_bytes=max_bytes), rank)]
    if curvature == "subnetwork":
        if subnetwork is None:
            raise ValueError("curvature='subnetwork' needs the subnetwork's weight indices; "
                             "expected subnetwork=[...], but got None.")
        index = subnetwork_indices(subnetwork, layout.num_parameters).to(theta.device)
        return [DenseBlock.from_hessian(index, subnetwork_ggn(*args, indices=index), "clip")]
    return [DenseBlock.from_hessian(layout.layer_slices[-1], last_layer_ggn(*args), "clip")]
