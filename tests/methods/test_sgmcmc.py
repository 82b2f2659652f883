"""SGLD and SGHMC (:mod:`bnn_zoo.methods._sgmcmc`) on Bayesian linear regression, whose
posterior is Gaussian in closed form: the draws' mean and covariance equal the exact ones
within Monte Carlo error (a tolerance of four standard errors, from the draws' effective
sample size), full batch and with minibatches; the cyclical schedule equals its formula;
bad settings are refused by name."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.ops.stats import effective_sample_size

from bnn_zoo.methods._nuts import PosteriorSamples
from bnn_zoo.methods._sgmcmc import (
    SGMCMC,
    cyclical_step_size,
    sghmc_step,
    sgld_step,
    sgmcmc_samples,
    step_plan,
)
from bnn_zoo.methods._svi import SVI
from bnn_zoo.zoo._defaults import map_guide

N, D, NOISE, PRIOR = 40, 2, 0.5, 0.3


def blr_problem() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -0.5], dtype=torch.float64)
    return x, y + NOISE * torch.randn(N, generator=g, dtype=torch.float64)


def blr_model(x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    """``w ~ N(0, PRIOR^2 I)``, ``y_n ~ N(x_n w, NOISE^2)``, the data indexed by the plate."""
    w = pyro.sample("w", dist.Normal(x.new_zeros(D), PRIOR).to_event(1))
    with pyro.plate("data", x.shape[0]) as i:
        return pyro.sample("obs", dist.Normal(x[i] @ w, NOISE),
                           obs=None if y is None else y[i])


def exact_posterior(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance of ``p(w | x, y)``: precision ``I / PRIOR^2 + X^T X / NOISE^2``."""
    precision = torch.eye(D, dtype=x.dtype) / PRIOR**2 + x.T @ x / NOISE**2
    cov = torch.linalg.inv(precision)
    return cov @ x.T @ y / NOISE**2, cov


def assert_matches(draws: torch.Tensor, mean: torch.Tensor,
                   cov: torch.Tensor | None = None) -> None:
    """Mean within 4 standard errors ``sqrt(var_i / ESS)`` (``var`` the draws' variance),
    covariance entries (where ``cov`` is given) within 4 ``sqrt((S_ii S_jj + S_ij^2) /
    ESS)`` (the standard error of a Gaussian sample covariance), ESS the smallest effective
    sample size of the coordinates."""
    ess = float(effective_sample_size(draws[None], chain_dim=0, sample_dim=1).min())
    assert ess > 20, ess  # enough for the standard errors to mean something
    error = (draws.mean(0) - mean).abs()
    assert bool((error < 4 * (draws.var(0) / ess).sqrt()).all()), (error, ess)
    if cov is not None:
        spread = 4 * ((cov.diagonal()[:, None] * cov.diagonal() + cov**2) / ess).sqrt()
        assert bool(((torch.cov(draws.T) - cov).abs() < spread).all()), (
            torch.cov(draws.T), cov, ess)


def least_squares(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """A start near the mode, as the zoo's entries start at a MAP fit: the adapted
    preconditioner is estimated there (far from a mode the empirical Fisher information
    overstates the curvature, and the burn-in would have to be longer)."""
    return {"w": torch.linalg.lstsq(x, y[:, None]).solution[:, 0]}


#: Short runs (the default suite) and long ones (slow), each at a step whose
#: discretisation bias on this posterior is a fraction of the run's tolerance; with
#: ``adapt=False`` the step is on ``U`` itself (curvature about 170 here), with the
#: adapted preconditioner it is about the step on ``U`` scaled to unit curvature.
SGHMC = {"rule": "sghmc", "step_size": 0.05, "friction": 0.1}
RUNS = [pytest.param({"rule": "sgld", "step_size": 0.3}, 200, id="sgld-short"),
        pytest.param(SGHMC, 200, id="sghmc-short"),
        pytest.param({"rule": "sgld", "step_size": 0.002, "adapt": False}, 200,
                     id="sgld-plain-short"),
        pytest.param({"rule": "sghmc", "step_size": 3e-4, "friction": 0.1, "adapt": False},
                     200, id="sghmc-plain-short"),
        pytest.param({"rule": "sgld", "step_size": 0.1}, 8000, id="sgld-long",
                     marks=pytest.mark.slow),
        pytest.param(SGHMC, 8000, id="sghmc-long", marks=pytest.mark.slow),
        pytest.param({"rule": "sgld", "step_size": 7e-4, "adapt": False}, 8000,
                     id="sgld-plain-long", marks=pytest.mark.slow),
        pytest.param({"rule": "sghmc", "step_size": 3e-4, "friction": 0.1, "adapt": False},
                     8000, id="sghmc-plain-long", marks=pytest.mark.slow)]


@pytest.mark.parametrize("settings, draws", RUNS)
def test_full_batch_draws_have_the_exact_mean_and_covariance(settings, draws):
    """The adapted samplers start near the mode; the plain ones where Pyro's
    ``init_to_uniform`` puts them, the burn-in dropping the way in."""
    x, y = blr_problem()
    init = least_squares(x, y) if settings.get("adapt", True) else None
    samples = sgmcmc_samples(blr_model, x, y, burn_in=200, draws=draws, thinning=3, seed=1,
                             init=init, **settings)
    assert samples["w"].shape == (draws, D) and samples["w"].dtype == torch.float64
    assert_matches(samples["w"], *exact_posterior(x, y))


@pytest.mark.parametrize("draws", [pytest.param(200, id="short"),
                                   pytest.param(8000, id="long", marks=pytest.mark.slow)])
def test_minibatch_draws_have_the_exact_mean(draws):
    """Each step's likelihood is that of 10 points scaled by N / B = 4: without the scaling
    the prior would pull the mean a fifth of the way to zero, far beyond the tolerance.
    (The minibatches' gradient noise, which the preconditioner counts in, takes a larger
    step to mix as fast; it widens the draws, not their mean, on a Gaussian posterior.)"""
    x, y = blr_problem()
    samples = sgmcmc_samples(blr_model, x, y, batch_size=10, burn_in=200, draws=draws,
                             thinning=3, seed=2, init=least_squares(x, y),
                             **{**SGHMC, "step_size": 0.15})
    assert_matches(samples["w"], exact_posterior(x, y)[0])


def test_draws_serve_the_predictive_through_pyro():
    x, y = blr_problem()
    samples = sgmcmc_samples(blr_model, x, y, burn_in=10, draws=8, thinning=1)
    predictive = pyro.infer.Predictive(blr_model, guide=PosteriorSamples(samples),
                                       num_samples=5)(x)
    assert predictive["obs"].shape == (5, N)


def test_the_update_rules_are_their_equations():
    theta, v, grad, z = (torch.tensor([0.5, -1.0]), torch.tensor([0.1, 0.2]),
                         torch.tensor([2.0, 4.0]), torch.tensor([1.0, -1.0]))
    p = torch.tensor([1.0, 0.25])
    torch.testing.assert_close(sgld_step(theta, grad, 0.01, z, p),
                               theta - 0.005 * p * grad + (0.01 * p).sqrt() * z)
    new_theta, new_v = sghmc_step(theta, v, grad, 0.01, 0.1, z, p)
    expected_v = 0.9 * v - 0.01 * p * grad + (2 * 0.1 * 0.01 * p).sqrt() * z
    torch.testing.assert_close(new_v, expected_v)
    torch.testing.assert_close(new_theta, theta + expected_v)


def test_the_cyclical_schedule_is_zhang_et_al_eq_1():
    total, cycles, eta = 50, 4, 0.2
    length = math.ceil(total / cycles)
    for k in range(1, total + 1):
        expected = eta / 2 * (math.cos(math.pi * ((k - 1) % length) / length) + 1)
        assert cyclical_step_size(k, total, cycles, eta) == pytest.approx(expected, abs=1e-15)
    assert cyclical_step_size(1, total, cycles, eta) == eta  # every cycle starts at eta_0
    assert cyclical_step_size(length + 1, total, cycles, eta) == eta


def test_the_plan_explores_then_samples_in_every_cycle():
    plan = list(step_plan(step_size=0.1, burn_in=3, draws=6, thinning=2, schedule="cyclical",
                          cycles=3, exploration=0.5))
    assert [burning for _, _, burning, _ in plan] == [True] * 3 + [False] * 24
    cycle = [(noisy, keep) for _, noisy, _, keep in plan[3:11]]
    # A cycle of 8 steps: 4 without noise, 4 sampling, every second kept.
    assert cycle == [(False, False)] * 4 + [(True, False), (True, True)] * 2
    assert sum(keep for *_, keep in plan) == 6
    assert [step for step, *_ in plan[3:11]] == pytest.approx(
        [cyclical_step_size(k, 24, 3, 0.1) for k in range(1, 9)])
    constant = list(step_plan(step_size=0.1, burn_in=2, draws=3, thinning=2,
                              schedule="constant", cycles=1, exploration=0.5))
    assert [keep for *_, keep in constant] == [False, False, False, True, False, True, False,
                                               True]


def test_the_cyclical_schedule_samples_the_posterior_mean():
    x, y = blr_problem()
    samples = sgmcmc_samples(blr_model, x, y, burn_in=200, draws=200, thinning=3, seed=3,
                             init=least_squares(x, y), schedule="cyclical", cycles=4,
                             exploration=0.25, **SGHMC)
    assert_matches(samples["w"], exact_posterior(x, y)[0])


@pytest.mark.parametrize("option, value, error", [
    ("rule", "hmc", ValueError), ("step_size", 0.0, ValueError),
    ("friction", 1.5, ValueError), ("burn_in", -1, ValueError), ("draws", 0, ValueError),
    ("thinning", 2.0, TypeError), ("schedule", "linear", ValueError),
    ("cycles", 3, ValueError), ("exploration", 1.0, ValueError), ("adapt", 1, TypeError),
    ("chains", 0, ValueError),
])
def test_bad_settings_are_refused_by_name(option, value, error):
    x, y = blr_problem()
    with pytest.raises(error, match=option):
        SGMCMC(SVI(map_guide), **{option: value})
    if option != "chains":
        with pytest.raises(error, match=option):
            sgmcmc_samples(blr_model, x, y, **{option: value})


def test_the_halves_estimate_the_empirical_fisher_diagonal_without_bias():
    """The starting ``V``, ``((g_A - g_B)/2)^2`` over random halvings of the data, averages to
    ``sum_n (g_n - g_bar)^2`` (the per-point gradients of Bayesian linear regression in
    closed form) at the mode, where the full gradient, and so its square, vanishes."""
    from bnn_zoo.methods._sgmcmc import _Potential
    x, y = blr_problem()
    w = exact_posterior(x, y)[0]
    potential = _Potential(blr_model, x, y, {"w": w})
    per_point = -((y - x @ w) / NOISE**2)[:, None] * x  # d/dw of -log p(y_n | x_n, w)
    fisher = ((per_point - per_point.mean(0)) ** 2).sum(0)
    g = torch.Generator().manual_seed(0)
    estimates = torch.stack([potential.fisher_diagonal({"w": w}, g)["w"] for _ in range(2000)])
    error = 4 * estimates.std(0) / math.sqrt(len(estimates))
    assert bool(((estimates.mean(0) - fisher).abs() < error).all())
    full = potential.grad({"w": w}, torch.arange(N))["w"]
    assert full.abs().max() < 1e-9 * fisher.max()  # the mode: the full gradient is 0


def test_the_prior_curvature_is_a_gaussian_priors_precision():
    from bnn_zoo.methods._sgmcmc import _Potential
    x, y = blr_problem()
    potential = _Potential(blr_model, x, y, None)
    curvature = potential.prior_curvature({"w": torch.tensor([0.3, -2.0], dtype=x.dtype)})
    assert torch.allclose(curvature["w"], torch.full((D,), PRIOR**-2, dtype=x.dtype))


def logistic_model(x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    """``w ~ N(0, 1)``, ``y_n ~ Bernoulli(sigmoid(w x_n))``, the data indexed by the plate."""
    w = pyro.sample("w", dist.Normal(x.new_zeros(()), 1.0))
    with pyro.plate("data", x.shape[0]) as i:
        return pyro.sample("obs", dist.Bernoulli(logits=w * x[i]),
                           obs=None if y is None else y[i])


def test_adapted_sgld_samples_a_separable_classifiers_posterior():
    """Separable data, a skewed posterior that the prior bounds: the draws' mean and
    variance equal the posterior's, computed by quadrature on a grid."""
    x = torch.cat([torch.linspace(-2, -0.1, 20), torch.linspace(0.1, 2, 20)]).double()
    y = (x > 0).double()
    grid = torch.linspace(-5, 25, 30001, dtype=torch.float64)
    log_post = (dist.Normal(0.0, 1.0).log_prob(grid)
                + dist.Bernoulli(logits=grid[:, None] * x).log_prob(y).sum(1))
    weights = torch.softmax(log_post, 0)
    mean = (weights * grid).sum()
    variance = (weights * (grid - mean) ** 2).sum()
    mode = grid[log_post.argmax()]
    samples = sgmcmc_samples(logistic_model, x, y, rule="sgld", step_size=0.1, burn_in=200,
                             draws=1000, thinning=3, seed=3, init={"w": mode})
    assert_matches(samples["w"][:, None], mean[None], variance[None, None])


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["sgld", "sghmc"])
def test_chains_on_a_small_classification_set_agree_and_predict(entry):
    """On wine (142 training points, fitted perfectly by the MAP) the gradients nearly
    vanish for many weights, and the step of the adapted preconditioner is bounded by the
    prior's curvature alone: without it the two chains drift apart (predictive R-hat in
    the thousands, test accuracy 0.44 for SGLD on this split)."""
    from bnn_zoo import zoo
    from bnn_zoo._core import data
    split = data.load("wine", 0)
    fitted = zoo.get(entry).fit(split.x_train, split.y_train, task="classification", seed=0,
                                progress=False)
    assert fitted.evaluate(split.x_test, split.y_test, 200)["accuracy"] > 0.9
    assert fitted.diagnostics_at(split.x_test)["r_hat_pred_max"] < 1.2
