"""The likelihood objects the Laplace approximation reads: each one's gradient and output
Hessian against autograd, and the saved names they are rebuilt from."""

from __future__ import annotations

import pytest
import torch

from bnn_zoo.models._likelihood import (
    LIKELIHOODS,
    Categorical,
    Gaussian,
    GaussianOutputs,
    GaussianPrecision,
    Heteroscedastic,
    laplace_likelihood,
)

D = torch.float64


def problem(likelihood):
    """Outputs (5, 3) and targets of ``likelihood``'s kind."""
    g = torch.Generator().manual_seed(0)
    f = torch.randn(5, 3, generator=g, dtype=D)
    y = torch.randint(0, 3, (5,), generator=g) if isinstance(likelihood, Categorical) \
        else torch.randn(5, 3, generator=g, dtype=D)
    return f, y


@pytest.mark.parametrize("likelihood", [Gaussian(), Categorical(),
                                        GaussianPrecision(torch.tensor([4.0, 0.5, 9.0], dtype=D))],
                         ids=["gaussian", "categorical", "precision"])
def test_gradient_and_hessian_root_match_autograd(likelihood):
    """``output_gradient`` is ``dE/df`` and ``R_n^T R_n`` the Hessian of ``E`` in ``f_n``
    (exact for these three; the heteroscedastic one is the Fisher, tested with its model)."""
    f, y = problem(likelihood)
    auto = torch.func.grad(lambda g: likelihood.negative_log_likelihood(g, y))(f)
    torch.testing.assert_close(likelihood.output_gradient(f, y), auto)
    hessian = torch.stack([torch.func.jacrev(torch.func.jacrev(
        lambda g, n=n: likelihood.negative_log_likelihood(g[None], y[n:n + 1])))(f[n])
        for n in range(f.shape[0])])
    r = likelihood.hessian_root(f)
    torch.testing.assert_close(r.mT @ r, hessian)


def test_saved_names_rebuild_the_likelihoods():
    assert [laplace_likelihood(name).name for name in LIKELIHOODS] == list(LIKELIHOODS)
    assert isinstance(laplace_likelihood("heteroscedastic"), Heteroscedastic)
    outputs = laplace_likelihood("gaussian", (3,))
    assert isinstance(outputs, GaussianOutputs) and outputs.noise_shape() == (3,)
    with pytest.raises(ValueError, match="Unknown likelihood 'poisson'"):
        laplace_likelihood("poisson")
