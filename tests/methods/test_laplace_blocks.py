"""Each Laplace precision block's ``inverse_diagonal`` (what the per-layer evidence updates
and ``gamma`` read) against the diagonal of the dense inverse of the precision it stands
for, in float64.

The factors are not square and larger than 2 x 2 on purpose: the squared eigenvectors of
a 2 x 2 symmetric matrix form a symmetric matrix, so a transposition of them would go
unseen there; and since each row and column of squared orthogonal eigenvectors sums to
one, a transposed or reordered diagonal keeps its total, which only the per-weight
comparison below catches."""

import pytest
import torch

from bnn_zoo.methods.laplace import (
    STRUCTURES,
    CurvatureName,
    CurvatureSettings,
    DenseBlock,
    DiagBlock,
    KronBlock,
    LowRankBlock,
)
from bnn_zoo.methods.laplace._structures import OUTPUT_CURVATURES

D = torch.float64


def spd(n: int, seed: int) -> torch.Tensor:
    """A random symmetric positive definite (n, n) matrix with distinct eigenvalues."""
    g = torch.randn(2 * n, n, generator=torch.Generator().manual_seed(seed), dtype=D)
    return g.T @ g + 0.1 * torch.eye(n, dtype=D)


def assert_inverse_diagonal(block, alpha: torch.Tensor, beta: torch.Tensor,
                            precision: torch.Tensor) -> None:
    torch.testing.assert_close(block.inverse_diagonal(alpha, beta),
                               torch.linalg.inv(precision).diagonal(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", [(3, 4), (4, 3), (3, 5)])
def test_kron_inverse_diagonal_is_that_of_alpha_plus_beta_q_kron_g(shape):
    """``KronBlock`` on the row-major (a, o) weights: the diagonal of
    ``(alpha I + beta Q ⊗ G)^-1``."""
    a, o = shape
    q, g = spd(a, 1), spd(o, 2)
    block = KronBlock.from_factors(slice(0, a * o), q, g)
    alpha, beta = torch.full((a * o,), 0.7, dtype=D), torch.tensor(1.3, dtype=D)
    precision = 0.7 * torch.eye(a * o, dtype=D) + 1.3 * torch.kron(q, g)
    assert_inverse_diagonal(block, alpha, beta, precision)


def test_dense_inverse_diagonal_by_cholesky_and_by_eigenvectors():
    """``DenseBlock``: the first ``(alpha, beta)`` (and any per-weight ``alpha``) through the
    Cholesky factor, a later one with ``alpha`` one number through the eigenvectors of
    ``H``; both equal the diagonal of ``(diag(alpha) + beta H)^-1``."""
    hessian = spd(5, 3)
    block = DenseBlock.from_hessian(slice(0, 5), hessian)
    beta = torch.tensor(2.0, dtype=D)
    for alpha in (torch.linspace(0.5, 2.0, 5, dtype=D), torch.full((5,), 0.3, dtype=D),
                  torch.full((5,), 1.7, dtype=D)):
        assert_inverse_diagonal(block, alpha, beta, torch.diag(alpha) + beta * hessian)


def test_diag_inverse_diagonal():
    """``DiagBlock``: ``1 / (alpha + beta h)``."""
    h = torch.linspace(0.1, 3.0, 6, dtype=D)
    alpha, beta = torch.linspace(0.5, 2.0, 6, dtype=D), torch.tensor(1.5, dtype=D)
    assert_inverse_diagonal(DiagBlock(slice(0, 6), h), alpha, beta,
                            torch.diag(alpha + beta * h))


@pytest.mark.parametrize("rank", [1, 3])
def test_low_rank_inverse_diagonal(rank):
    """``LowRankBlock``: the diagonal of ``(diag(alpha) + beta U diag(lambda) U^T)^-1`` for
    the kept eigenpairs ``U``, ``lambda`` and a per-weight ``alpha``."""
    block = LowRankBlock.from_hessian(slice(0, 6), spd(6, 4), rank)
    alpha, beta = torch.linspace(0.5, 2.0, 6, dtype=D), torch.tensor(1.5, dtype=D)
    u, lam = block.eigenvectors, block.eigenvalues
    assert u.shape == (6, rank)
    assert_inverse_diagonal(block, alpha, beta, torch.diag(alpha) + beta * (u * lam) @ u.T)


def test_the_registry_names_each_structure_once_and_refuses_other_names():
    """Each name builds its class with the options; unknown names, the ambiguous
    ``"full"`` and a per-output ``kron_separate`` are refused by name."""
    assert tuple(CurvatureName) == ("hessian", "ggn", "diag", "kron", "kron_separate",
                                    "last_layer", "low_rank", "subnetwork")
    assert OUTPUT_CURVATURES == tuple(n for n in CurvatureName if n != "kron_separate")
    for name, cls in STRUCTURES.items():
        structure = CurvatureSettings(name, rank=3, subnetwork=[0, 2]).structure()
        assert type(structure) is cls and structure.name == name and structure.rank == 3
    with pytest.raises(ValueError, match="Unknown curvature 'kfac'; expected one of: hessian"):
        CurvatureSettings("kfac")
    with pytest.raises(ValueError, match="curvature='full' is ambiguous"):
        CurvatureSettings("full")
    with pytest.raises(ValueError, match="needs the subnetwork's weight indices"):
        CurvatureSettings("subnetwork")
    with pytest.raises(ValueError, match="Unknown indefinite 'skip'"):
        CurvatureSettings("hessian", indefinite="skip")
    x, y = torch.zeros(2, 1), torch.zeros(2, 2)
    with pytest.raises(ValueError, match=r"Unknown curvature \(for D outputs with a noise "
                       r"precision each\) 'kron_separate'"):
        CurvatureSettings("kron_separate").structure().output_blocks(torch.zeros(3), x, y, None)
