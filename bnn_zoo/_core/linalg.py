"""Decompositions of symmetric matrices built from data that never stop a fit.

A curvature built from a few data points is singular, often with many exactly repeated
(zero) eigenvalues: a ReLU unit that no training point activates gives a zero row and
column. LAPACK's divide-and-conquer eigensolver (``syevd``, behind
``torch.linalg.eigh``) can fail to converge on such a matrix in float32, or return NaN
without an error. The functions here retry where a decomposition fails, in float64 and
then with an escalating diagonal shift ``j I``, and say what they used:

* `symmetric_eigh`: ``A = V diag(lambda) V^T``. A shift changes no eigenvector
  and moves every eigenvalue by ``j``, which is subtracted back, so its only cost is the
  rounding of ``j``, at most `JITTER_MAX` times the mean ``|A_ii|``.
* `cholesky_with_jitter`: ``A + j I = L L^T`` for the smallest ``j`` of the same
  ladder (here the jitter stays in the factor).
* `thin_svd`: ``B = Q diag(s) R^T``, retried in float64.

A matrix with a non-finite entry is no curvature: it raises a ``ValueError`` naming it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = ["JITTER_MAX", "cholesky_with_jitter", "symmetric_eigh", "thin_svd"]

#: The largest jitter, relative to the mean ``|diagonal|`` of the matrix.
JITTER_MAX = 1e-6


def _jitters(matrix: Tensor, max_relative: float) -> list[float]:
    """``10^-12, 10^-11, ..., max_relative`` times the mean ``|diagonal|`` of ``matrix``
    (1 where that is 0)."""
    scale = float(matrix.detach().diagonal(dim1=-2, dim2=-1).abs().mean()) or 1.0
    ladder, exponent = [], -12
    while 10.0**exponent <= max_relative * (1 + 1e-9):
        ladder.append(10.0**exponent * scale)
        exponent += 1
    return ladder


def _check_finite(what: str, matrix: Tensor) -> None:
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError(f"Expected {what} to be finite, but it has "
                         f"{int((~torch.isfinite(matrix)).sum())} non-finite entries of "
                         f"{matrix.numel()}: the fit it was built from diverged.")


def _attempts(matrix: Tensor) -> Iterator[tuple[Tensor, float]]:
    """What `symmetric_eigh` decomposes, lazily: ``matrix``, then (unless it is
    already) the matrix in float64, then ``A + j I`` in float64 with ``j`` of the ladder."""
    yield matrix, 0.0
    wide = matrix.double()
    if wide is not matrix:
        yield wide, 0.0
    eye = torch.eye(matrix.shape[-1], dtype=wide.dtype, device=wide.device)
    for shift in _jitters(wide, JITTER_MAX):
        yield wide + shift * eye, shift


def symmetric_eigh(matrix: Tensor, what: str = "the matrix", vectors: bool = True
                   ) -> tuple[Tensor, Tensor | None, float]:
    """Eigenvalues (ascending) and, with ``vectors``, eigenvectors of the symmetric
    ``matrix`` (..., p, p) (its lower triangle is read), in its dtype, and the shift used.

    Tries ``torch.linalg.eigh`` (``eigvalsh`` without ``vectors``) in the matrix's dtype,
    then in float64, then in float64 on ``A + j I`` for each ``j`` of the jitter ladder
    (eigenvalues returned less ``j``); an attempt fails by an error or by a non-finite
    result. Returns ``(lambda, V, j)``, ``V`` ``None`` without ``vectors``; ``j`` is 0
    unless a shift was needed. Raises a ``ValueError`` naming
    ``what`` for a non-finite matrix, and ``torch.linalg.LinAlgError`` only where every
    shift fails.
    """
    _check_finite(what, matrix)
    decompose = torch.linalg.eigh if vectors else torch.linalg.eigvalsh
    for source, shift in _attempts(matrix):
        try:
            out = decompose(source)
        except torch.linalg.LinAlgError:
            continue
        evals, evecs = out if vectors else (out, None)
        # syevd can also return NaN without an error (seen in float32): that is a failure.
        if bool(torch.isfinite(evals).all()) and (evecs is None
                                                  or bool(torch.isfinite(evecs).all())):
            evals = (evals - shift).to(matrix.dtype)
            return evals, None if evecs is None else evecs.to(matrix.dtype), shift
    raise torch.linalg.LinAlgError(
        f"Cannot eigendecompose {what} ({tuple(matrix.shape)}): it failed in "
        f"{matrix.dtype}, in float64 and with a diagonal shift up to {JITTER_MAX:g} times its "
        "mean |diagonal|.")


def thin_svd(matrix: Tensor, what: str = "the matrix") -> tuple[Tensor, Tensor]:
    """``Q`` (..., m, k) and ``s`` (..., k) of the thin SVD ``B = Q diag(s) R^T`` of
    ``matrix`` (..., m, n), ``k = min(m, n)``, in its dtype: retried in float64 where
    LAPACK's ``gesdd`` fails (an error or a non-finite result) in the matrix's dtype."""
    _check_finite(what, matrix)
    for source in (matrix, matrix.double()):
        try:
            q, s, _ = torch.linalg.svd(source, full_matrices=False)
        except torch.linalg.LinAlgError:
            continue
        if bool(torch.isfinite(q).all()) and bool(torch.isfinite(s).all()):
            return q.to(matrix.dtype), s.to(matrix.dtype)
    raise torch.linalg.LinAlgError(f"Cannot decompose {what} ({tuple(matrix.shape)}) by an "
                                   f"SVD in {matrix.dtype} or float64.")


def cholesky_with_jitter(matrix: Tensor, max_relative: float = JITTER_MAX
                         ) -> tuple[Tensor | None, float]:
    """The Cholesky factor of ``matrix + j I`` (..., p, p) for the smallest ``j`` that works
    among ``0`` and ``10^-12, 10^-11, ..., max_relative`` times the mean of its ``|diagonal|``.

    Returns ``(L, j)``, or ``(None, j_max)`` when even the largest jitter fails.
    """
    chol, info = torch.linalg.cholesky_ex(matrix)
    if not bool(info.any()):
        return chol, 0.0
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    jitter = 0.0
    for jitter in _jitters(matrix, max_relative):
        chol, info = torch.linalg.cholesky_ex(matrix + jitter * eye)
        if not bool(info.any()):
            return chol, jitter
    return None, jitter
