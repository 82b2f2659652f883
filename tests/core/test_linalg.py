"""Decompositions of singular curvatures: every Laplace structure takes a random positive
semi-definite factor of any rank (0 to full, repeated eigenvalues, zero rows as a dead
ReLU unit leaves them), in float32 and float64, and reconstructs it.

Tolerance: an eigendecomposition or Cholesky factorisation is backward stable, with an
error of order ``n eps ||A||`` for an ``n x n`` matrix; the tests allow ``10 n eps`` on
factors scaled to ``||A||_2 <= 1`` and on the covariance of ``I + A`` (condition number
at most 2). The jitter a decomposition reports is at most ``JITTER_MAX`` times the mean
``|diagonal|``.
"""

import pytest
import torch

from bnn_zoo._core.linalg import JITTER_MAX, cholesky_with_jitter, symmetric_eigh, thin_svd
from bnn_zoo.methods.laplace import DenseBlock, DiagBlock, KronBlock, LowRankBlock

DTYPES = (torch.float32, torch.float64)


def tolerance(n: int, dtype: torch.dtype) -> float:
    return 10 * n * torch.finfo(dtype).eps


def psd(n: int, rank: int, seed: int, repeated: bool = False, zero_rows: float = 0.0,
        dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A random (n, n) positive semi-definite matrix of the given ``rank``, spectral norm
    1 (0 for rank 0): eigenvalues spread over four decades, or only 1 and 0.5
    (``repeated``); a ``zero_rows`` share of its rows and columns set to zero."""
    g = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    if repeated:
        evals = torch.where(torch.arange(rank) % 2 == 0, 1.0, 0.5).double()
    else:
        evals = torch.logspace(0, -4, rank, dtype=torch.float64)
    m = (basis[:, :rank] * evals) @ basis[:, :rank].T
    dead = torch.rand(n, generator=g, dtype=torch.float64) < zero_rows
    m[dead] = 0
    m[:, dead] = 0
    norm = torch.linalg.matrix_norm(m, ord=2)
    return (m / norm if norm > 0 else m).to(dtype)


def relu_factor(n: int, points: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """A K-FAC input factor ``1/N sum_n a_n a_n^T`` of ReLU features of ``points`` inputs,
    half of the units dead (zero rows): the shape of factor on which float32 ``syevd``
    fails to converge for some seeds."""
    g = torch.Generator().manual_seed(seed)
    h = torch.relu(torch.randn(points, 3, generator=g, dtype=torch.float64)
                   @ torch.randn(3, n, generator=g, dtype=torch.float64)
                   + torch.randn(n, generator=g, dtype=torch.float64))
    h[:, torch.rand(n, generator=g, dtype=torch.float64) < 0.5] = 0
    q = h.T @ h / points
    return (q / torch.linalg.matrix_norm(q, ord=2)).to(dtype)


#: Each distinct matrix once: spectra and dead rows only where the rank leaves room.
CASES = [(n, rank, repeated, zero_rows)
         for n in (6, 40) for rank in sorted({0, 1, n // 2, n})
         for repeated in ((False, True) if rank > 1 else (False,))
         for zero_rows in ((0.0, 0.5) if rank > 0 else (0.0,))]


def assert_reconstructs(matrix: torch.Tensor, evals, evecs, jitter: float) -> None:
    n, dtype = matrix.shape[-1], matrix.dtype
    assert evals.dtype == evecs.dtype == dtype
    eye = torch.eye(n, dtype=torch.float64)
    v = evecs.double()
    torch.testing.assert_close(v.T @ v, eye, rtol=0, atol=tolerance(n, dtype))
    torch.testing.assert_close((v * evals.double()) @ v.T, matrix.double(), rtol=0,
                               atol=tolerance(n, dtype))
    assert 0 <= jitter <= JITTER_MAX * float(matrix.diagonal().abs().mean()) + 1e-300


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, rank, repeated, zero_rows", CASES)
def test_symmetric_eigh_reconstructs_rank_deficient_factors(n, rank, repeated, zero_rows,
                                                            dtype):
    matrix = psd(n, rank, seed=n + rank, repeated=repeated, zero_rows=zero_rows, dtype=dtype)
    assert_reconstructs(matrix, *symmetric_eigh(matrix))
    evals, evecs, _ = symmetric_eigh(matrix, vectors=False)
    assert evecs is None
    torch.testing.assert_close(evals.double(), torch.linalg.eigvalsh(matrix.double()), rtol=0,
                               atol=tolerance(n, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_symmetric_eigh_takes_kfac_factors_of_dead_relu_units(dtype):
    """Eighty K-FAC factors of 301 units: on this CPU's LAPACK, float32 ``eigh`` fails to
    converge on some of them (a few of the forty seeds at each size); the monkeypatched
    test above makes the fallback certain on any LAPACK."""
    for seed in range(40):
        for points in (40, 160):
            matrix = relu_factor(301, points, seed, dtype)
            assert_reconstructs(matrix, *symmetric_eigh(matrix))


def test_symmetric_eigh_shifts_when_lapack_fails(monkeypatch):
    """Where ``eigh`` fails in the matrix's dtype and in float64, it is retried on
    ``A + j I`` with an escalating ``j``; ``j`` is reported and subtracted back."""
    eigh = torch.linalg.eigh
    calls = []

    def failing(matrix):
        calls.append(float(matrix.diagonal().min()))
        if len(calls) < 4:
            raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")
        return eigh(matrix)

    monkeypatch.setattr(torch.linalg, "eigh", failing)
    matrix = psd(40, 20, seed=3, zero_rows=0.5, dtype=torch.float32)
    evals, evecs, jitter = symmetric_eigh(matrix)
    scale = float(matrix.diagonal().abs().mean())
    assert len(calls) == 4
    assert calls[1] < calls[2] < calls[3]  # float64 unshifted, then escalating shifts
    assert jitter == pytest.approx(1e-11 * scale, rel=1e-6, abs=0)  # scale read in float32
    assert_reconstructs(matrix, evals, evecs, jitter)


def test_a_dense_blocks_spectral_shortcut_reports_the_shift_it_needed(monkeypatch):
    """The evidence loop's second ``(alpha, beta)`` takes the eigenvalues of ``H``; where
    they needed a shift, the block's ``jitter`` reports it, as a Kronecker factor's does."""
    matrix = psd(30, 10, seed=4, dtype=torch.float64)
    block = DenseBlock.from_hessian(slice(0, 30), matrix)
    alpha, beta = torch.ones(30, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    block.log_det(alpha, beta)  # the first pair: a Cholesky
    assert block.jitter == 0.0
    eigvalsh = torch.linalg.eigvalsh
    calls = []

    def failing(source):
        calls.append(1)
        if len(calls) < 2:
            raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")
        return eigvalsh(source)

    monkeypatch.setattr(torch.linalg, "eigvalsh", failing)
    block.log_det(2 * alpha, beta)
    assert len(calls) == 2
    assert block.jitter == pytest.approx(1e-12 * float(matrix.diagonal().abs().mean()),
                                         rel=1e-9, abs=0)


def test_symmetric_eigh_names_a_non_finite_matrix():
    matrix = torch.eye(3)
    matrix[1, 1] = float("nan")
    with pytest.raises(ValueError, match="a Kronecker factor.*non-finite"):
        symmetric_eigh(matrix, "a Kronecker factor")


@pytest.mark.parametrize("dtype", DTYPES)
def test_thin_svd_and_cholesky_take_singular_matrices(dtype):
    for rank in (0, 1, 20, 40):
        matrix = psd(40, rank, seed=rank, zero_rows=0.5, dtype=dtype)
        q, s = thin_svd(matrix)
        torch.testing.assert_close(q.double().T @ q.double(), torch.eye(40, dtype=torch.float64),
                                   rtol=0, atol=tolerance(40, dtype))
        torch.testing.assert_close((q * s).double() @ q.double().T, matrix.double(), rtol=0,
                                   atol=tolerance(40, dtype))
        chol, jitter = cholesky_with_jitter(matrix + torch.eye(40, dtype=dtype))
        assert jitter == 0.0
        torch.testing.assert_close(chol.double() @ chol.double().T,
                                   (matrix + torch.eye(40, dtype=dtype)).double(), rtol=0,
                                   atol=tolerance(40, dtype))
        # Singular (half its rows zero): the ladder's smallest working jitter, within bounds.
        chol, jitter = cholesky_with_jitter(matrix)
        scale = float(matrix.diagonal().abs().mean()) or 1.0
        assert 0 < jitter <= JITTER_MAX * scale * (1 + 1e-6)
        torch.testing.assert_close(chol.double() @ chol.double().T,
                                   matrix.double() + jitter * torch.eye(40, dtype=torch.float64),
                                   rtol=0, atol=tolerance(40, dtype))


def structures(factor: torch.Tensor, second: torch.Tensor) -> dict:
    """Every Laplace structure built from ``factor`` (n, n): dense (``hessian``, ``ggn``,
    ``last_layer``, ``subnetwork``), diagonal, low-rank at full rank, and Kronecker with
    ``second`` (k, k), with the dense curvature each stands for."""
    n, k = factor.shape[0], second.shape[0]
    return {
        "dense": (DenseBlock.from_hessian(slice(0, n), factor), factor),
        "diag": (DiagBlock(slice(0, n), factor.diagonal()), torch.diag(factor.diagonal())),
        "low_rank": (LowRankBlock.from_hessian(slice(0, n), factor, rank=n), factor),
        "kron": (KronBlock.from_factors(slice(0, n * k), factor, second),
                 torch.kron(factor, second)),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, rank, repeated, zero_rows", CASES)
def test_every_structure_takes_a_rank_deficient_curvature(n, rank, repeated, zero_rows,
                                                          dtype):
    """``covariance(1, 1)`` of each structure is ``(I + H)^-1`` of the curvature ``H`` it
    stands for, and its draws' offsets are finite."""
    factor = psd(n, rank, seed=2 * n + rank, repeated=repeated, zero_rows=zero_rows,
                 dtype=dtype)
    second = psd(3, 2, seed=rank, repeated=repeated, dtype=dtype)
    for name, (block, curvature) in structures(factor, second).items():
        p = curvature.shape[0]
        alpha, beta = torch.ones(p, dtype=dtype), torch.tensor(1.0, dtype=dtype)
        exact = torch.linalg.inv(torch.eye(p, dtype=torch.float64) + curvature.double())
        torch.testing.assert_close(block.covariance(alpha, beta).double(), exact, rtol=0,
                                   atol=tolerance(p, dtype), msg=lambda m, s=name: f"{s}: {m}")
        assert 0 <= block.jitter <= JITTER_MAX * max(float(factor.diagonal().abs().mean()), 1)
        eps = torch.randn(5, p, dtype=dtype)
        assert bool(torch.isfinite(block.offset(eps, alpha, beta)).all()), name


@pytest.mark.parametrize("dtype", DTYPES)
def test_kron_block_takes_kfac_factors_of_dead_relu_units(dtype):
    """The factors on which float32 ``eigh`` fails (above) make a Kronecker block whose
    log-determinant is that of the dense precision."""
    for seed in (2, 21):
        q = relu_factor(301, 40, seed, dtype)
        g = psd(2, 1, seed=seed, dtype=dtype)
        block = KronBlock.from_factors(slice(0, 602), q, g)
        alpha, beta = torch.ones(602, dtype=dtype), torch.tensor(1.0, dtype=dtype)
        exact = torch.logdet(torch.eye(602, dtype=torch.float64)
                             + torch.kron(q.double(), g.double()))
        torch.testing.assert_close(block.log_det(alpha, beta).double(), exact, rtol=0,
                                   atol=tolerance(602, dtype))
