"""The ``fullrank`` pair: a full-covariance Gaussian guide is exact for Bayesian linear
regression, so SVI must reach the closed-form posterior, mean and covariance."""

from __future__ import annotations

import math

import torch
from pyro import poutine

from bnn_zoo import data, fit, zoo
from bnn_zoo.guides import MultivariateNormal
from bnn_zoo.models import BayesianMLP, GaussianPrior


def blr_problem(n: int = 40, d: int = 2):
    """``y = x w + b + N(0, sigma^2)``, prior ``N(0, s^2)``: the exact posterior of
    ``(w, b)`` is ``N(m, S)`` with ``S^-1 = Phi^T Phi / sigma^2 + I / s^2``."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    sigma, s = 0.5, 1.0
    y = x @ torch.tensor([1.0, -0.5], dtype=torch.float64) + 0.3 + sigma * torch.randn(
        n, generator=gen, dtype=torch.float64)
    model = BayesianMLP(d, 1, (), noise_scale=sigma, prior=GaussianPrior(s)).double()
    phi = torch.cat([x, torch.ones(n, 1, dtype=torch.float64)], 1)  # weights, then bias
    precision = phi.T @ phi / sigma**2 + torch.eye(d + 1, dtype=torch.float64) / s**2
    covariance = torch.linalg.inv(precision)
    return model, x, y, covariance @ phi.T @ y / sigma**2, covariance


def test_full_rank_guide_reaches_the_exact_posterior_of_linear_regression():
    """After the large steps, snapshots of the small-step phase scatter around the optimum
    with the Monte Carlo noise of the gradients: their mean must lie within 4 of their
    standard deviations of the exact mean and covariance (in posterior-sd units), and
    within 0.15 of them (the optimum is really reached, not only noisily)."""
    model, x, y, mean, covariance = blr_problem()
    guide = MultivariateNormal(model, init_scale=0.1)
    fit(model, guide, x, y, steps=1500, lr=0.03, num_particles=8, seed=0, jit=True)
    sd = covariance.diagonal().sqrt()
    snapshots = []
    for _ in range(8):
        fit(model, guide, x, y, steps=60, lr=0.003, num_particles=8, seed=len(snapshots) + 1,
            jit=True)
        with torch.no_grad():
            q = guide.get_posterior()
            snapshots.append(torch.cat([q.loc / sd, (q.covariance_matrix / sd / sd[:, None])
                                        .flatten()]))
    got = torch.stack(snapshots)
    exact = torch.cat([mean / sd, (covariance / sd / sd[:, None]).flatten()])
    error = (got.mean(0) - exact).abs()
    assert (error <= 4 * got.std(0) + 1e-9).all(), (error, got.std(0))
    assert error.max() < 0.15
    # The posterior correlation of the weights is far from zero: a mean-field guide
    # could not have matched it.
    assert (covariance / sd / sd[:, None] - torch.eye(3, dtype=torch.float64)).abs().max() > 0.1


def test_entry_declares_the_pair():
    entry = zoo.get("fullrank")
    model = entry.model(3, 1, task="regression")
    assert isinstance(entry.guide(model), MultivariateNormal)


def test_fullrank_trains_on_two_moons_in_float32():
    """The guide scores its own draw with the cached noise: with Pyro's triangular solve the
    float32 ELBO estimate ran off to 1e20 through round-off within 150 steps here."""
    dataset = data.load("two_moons")
    fitted = zoo.get("fullrank").fit(dataset.x_train, dataset.y_train, steps=400)
    assert all(math.isfinite(v) and v > 0 for v in fitted.result.losses)
    assert fitted.evaluate(dataset.x_test, dataset.y_test)["accuracy"] > 0.8


def test_fullrank_log_density_of_its_draw_is_the_base_density_minus_the_log_determinant():
    model, x, y, *_ = blr_problem()
    guide = MultivariateNormal(model)
    trace = poutine.trace(guide).get_trace(x, y)
    (site,) = [s for s in trace.nodes.values() if s["type"] == "sample"
               and s["infer"].get("is_auxiliary")]
    scale_tril = guide.scale[..., None] * guide.scale_tril
    z = torch.linalg.solve_triangular(scale_tril, (site["value"] - guide.loc)[:, None],
                                      upper=False)[:, 0]
    expected = (torch.distributions.Normal(0.0, 1.0).log_prob(z).sum()
                - scale_tril.diagonal().log().sum())
    torch.testing.assert_close(site["fn"].log_prob(site["value"]), expected)


def test_fullrank_factor_is_unit_lower_triangular_whatever_the_stored_matrix_holds():
    """The stored matrix is unconstrained; ``scale_tril`` reads it as Pyro's
    ``unit_lower_cholesky`` constraint would (``x.tril(-1) + I``), so an optimiser that
    touches the upper triangle or the diagonal (weight decay) cannot change the guide."""
    model, x, y, *_ = blr_problem()
    guide = MultivariateNormal(model)
    guide(x, y)
    with torch.no_grad():
        guide.scale_tril_unconstrained.copy_(torch.randn(3, 3, dtype=torch.float64))
        raw = guide.scale_tril_unconstrained.clone()
    expected = raw.tril(-1) + torch.eye(3, dtype=torch.float64)
    torch.testing.assert_close(guide.scale_tril, expected, rtol=0, atol=0)
    torch.testing.assert_close(guide.get_posterior().scale_tril,
                               guide.scale[..., None] * expected)


def test_fullrank_density_of_any_point_is_the_multivariate_normal_density():
    """A point the guide did not draw is scored through the affine map's inverse (a
    unit-triangular solve): the density must be ``N(w; mu, L L^T)``."""
    model, x, y, *_ = blr_problem()
    guide = MultivariateNormal(model, init_scale=0.3)
    guide(x, y)
    with torch.no_grad():
        guide.scale_tril_unconstrained.copy_(torch.randn(3, 3, dtype=torch.float64))
    trace = poutine.trace(guide).get_trace(x, y)
    (site,) = [s for s in trace.nodes.values() if s["type"] == "sample"
               and s["infer"].get("is_auxiliary")]
    points = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(site["fn"].log_prob(points),
                               guide.get_posterior().log_prob(points))
