"""ChEES-HMC with vectorised chains (bnn_zoo.methods._hmc): the chains' potential against a
closed form and Pyro's own, the sampler against the exact posterior of Bayesian linear
regression and against Pyro's NUTS, and its adaptation schedule."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import pyro
import pytest
import torch
from pyro.infer.autoguide.initialization import init_to_value
from pyro.infer.mcmc.util import initialize_model

from bnn_zoo import zoo
from bnn_zoo.methods import HMC, SVI, Budget
from bnn_zoo.methods._chees import (
    _Direction,
    _leapfrog,
    chees_hmc,
    mass_windows,
    van_der_corput,
)
from bnn_zoo.methods._hmc import (
    ChainPotential,
    HeldOutNoise,
    MapNoise,
    SampledNoise,
    draw_chunks,
    full_batch_map,
)
from bnn_zoo.methods._metric import Metric
from bnn_zoo.methods._nuts import bulk_ess, output_draws
from bnn_zoo.models._mlp import BayesianMLP
from bnn_zoo.models._priors import GaussianPrior
from bnn_zoo.zoo import UnsupportedProblem
from bnn_zoo.zoo._defaults import map_guide

NOISE = 0.25  # exact in float32, as the model stores it before .double()


def linear_problem(n: int = 40, d: int = 3, seed: int = 0):
    """Data of a linear model, the network without hidden layers under N(0, 1) priors and
    fixed noise (Bayesian linear regression), and its exact posterior of ``[w, b]``:
    precision ``I + X^T X / s^2``, mean ``cov X^T y / s^2`` (Bishop 2006, eq. 3.53-3.54)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = x @ torch.linspace(-1, 1, d, dtype=torch.float64) + NOISE * torch.randn(
        n, generator=g, dtype=torch.float64)
    model = BayesianMLP(d, 1, hidden=(), noise_scale=NOISE, prior=GaussianPrior()).double()
    features = torch.cat([x, torch.ones(n, 1, dtype=torch.float64)], 1)
    precision = torch.eye(d + 1, dtype=torch.float64) + features.T @ features / NOISE**2
    cov = torch.linalg.inv(precision)
    return x, y, model, cov @ features.T @ y / NOISE**2, precision, cov


def gaussian_potential(precision: torch.Tensor):
    """The potential of zero-mean Gaussians, ``U = theta^T P theta / 2``, and its gradient
    ``P theta``: each chain's precision ``P`` (C, D, D), or one (D, D) for every chain."""

    def potential(theta):
        gradient = (precision @ theta[..., None])[..., 0]
        return 0.5 * (theta * gradient).sum(1), gradient

    return potential


def assert_exact_moments(chains: torch.Tensor, mean: torch.Tensor, variance: torch.Tensor):
    """Every coordinate's mean and variance over the draws ``chains`` (C, S, P) of a
    Gaussian within Monte Carlo error: the mean's standard error is sd / sqrt(ESS), the
    variance's relative one sqrt(2 / ESS_2), ESS_2 the bulk ESS of the squared deviations:
    HMC's long trajectories make the draws antithetic (ESS above the number of draws) and
    their squares not (ESS_2 about a third of it on the linear problem). 4.5 standard
    errors over a few coordinates x 2 statistics keep a false alarm below 1e-4."""
    draws = chains.reshape(-1, chains.shape[-1])
    error = (draws.mean(0) - mean).abs() / (variance / bulk_ess(chains)).sqrt()
    assert bool((error < 4.5).all()), error
    relative = draws.var(0) / variance - 1
    squares_ess = bulk_ess((chains - mean).square())
    assert bool((relative.abs() < 4.5 * (2 / squares_ess).sqrt()).all()), (relative, squares_ess)


def test_chain_potential_is_the_closed_form_energy_of_each_chain_and_its_gradient():
    x, y, model, mean, precision, _ = linear_problem()
    potential = ChainPotential(model, x, y, chains=5, jit=False)
    assert [name for name, _ in potential.sites] == ["layers.0.weight", "layers.0.bias"]
    theta = torch.randn(5, 4, dtype=torch.float64)
    energy, grad = potential(theta)
    # U = (theta - m)^T A (theta - m) / 2 + const, the const the same for every chain
    quadratic = 0.5 * ((theta - mean) @ precision * (theta - mean)).sum(1)
    torch.testing.assert_close(energy - quadratic, (energy - quadratic)[:1].expand(5))
    torch.testing.assert_close(grad, (theta - mean) @ precision)
    jitted = ChainPotential(model, x, y, chains=5, jit=True)
    for got, want in zip(jitted(theta), (energy, grad)):
        torch.testing.assert_close(got, want)


def test_chain_potential_matches_pyros_potential_of_a_hidden_layer_net_chain_by_chain():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 2, generator=g, dtype=torch.float64)
    y = torch.sin(x.sum(1))
    model = BayesianMLP(2, 1, (4,), noise_scale=0.2).double()
    potential = ChainPotential(model, x, y, chains=3, jit=False)
    _, pyro_potential, _, _ = initialize_model(model, model_args=(x, y))
    theta = 0.5 * torch.randn(3, potential.dim, generator=g, dtype=torch.float64)
    energy, _ = potential(theta)
    values = potential.unflatten(theta)
    for chain in range(3):
        torch.testing.assert_close(energy[chain],
                                   pyro_potential({k: v[chain, 0] for k, v in values.items()}))


def test_chain_potential_of_a_sampled_noise_is_pyros_in_the_unconstrained_space():
    """With ``noise_prior`` the noise scale is a positive latent site: the chains move its
    logarithm, and their potential, Jacobian included, is Pyro's ``initialize_model``
    potential chain by chain; ``flatten`` inverts ``values``."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(25, 2, generator=g, dtype=torch.float64)
    y = torch.sin(x.sum(1))
    model = BayesianMLP(2, 1, (3,), noise_prior=0.5).double()
    potential = ChainPotential(model, x, y, chains=3, jit=False)
    assert potential.sites[-1] == ("sigma", ()) and list(potential.transforms) == ["sigma"]
    _, pyro_potential, _, _ = initialize_model(model, model_args=(x, y))
    theta = 0.5 * torch.randn(3, potential.dim, generator=g, dtype=torch.float64)
    energy, _ = potential(theta)
    coordinates = potential.coordinates(theta)
    for chain in range(3):
        torch.testing.assert_close(
            energy[chain], pyro_potential({k: v[chain] for k, v in coordinates.items()}))
    values = potential.values(theta)
    torch.testing.assert_close(values["sigma"], theta[:, -1].exp())
    torch.testing.assert_close(potential.flatten(values), theta)
    with pytest.raises(ValueError, match="noise_prior only for regression"):
        BayesianMLP(2, 1, (3,), noise_prior=0.5, noise_scale=0.1)


def test_hmc_samples_the_noise_under_its_hyperprior():
    """``SampledNoise``: every draw has its own positive ``sigma`` (a site that Pyro's
    ``Predictive`` replays), the chains start at the joint MAP, and a model without a learned
    noise is refused by name."""
    x, y, _, _, _, _ = linear_problem(n=60)
    def build(**options):
        return BayesianMLP(3, 1, hidden=(), prior=GaussianPrior(), **options).double()
    method = HMC(start=SVI(map_guide), warmup=40, samples=30, chains=4,
                 noise=SampledNoise(scale=1.0))
    posterior = method.fit(build, x, y, task="regression", seed=0,
                           budget=Budget(steps=50, lr=3e-2, batch_size=None), progress=False)
    draws = pyro.infer.Predictive(posterior.model, guide=posterior.guide,
                                  num_samples=20)(x[:5])
    assert draws["sigma"].shape[0] == 20 and bool((draws["sigma"] > 0).all())
    assert draws["obs"].shape == (20, 5)
    assert posterior.diagnostics["noise_prior"] == 1.0
    with pytest.raises(ValueError, match="SampledNoise needs a learned"):
        SampledNoise().start(build, build(noise_scale=0.3), {}, x, y, seed=0, max_iter=5)


def test_chain_potential_refuses_a_model_without_replicas_by_name():
    with pytest.raises(TypeError, match="replicated"):
        ChainPotential(lambda x, y: None, torch.zeros(2, 1), torch.zeros(2), chains=2)


@pytest.mark.parametrize("dense", [False, True], ids=["diagonal", "dense"])
def test_hmc_samples_the_exact_posterior_of_bayesian_linear_regression(dense):
    x, y, model, mean, _, cov = linear_problem()
    potential = ChainPotential(model, x, y, chains=8)
    run = chees_hmc(potential, torch.zeros(8, 4, dtype=torch.float64), warmup=300,
                    samples=400, dense=dense, progress=False,
                    generator=torch.Generator().manual_seed(0))
    assert_exact_moments(run.draws, mean, cov.diagonal())
    assert int(run.divergences.sum()) == 0
    assert 0.6 < run.acceptance < 1.0
    chains = list(draw_chunks(run, potential))
    assert len(chains) == 8 and chains[0]["layers.0.weight"].shape == (400, 3, 1)


def two_linear_problems():
    """Two data sets of one size in groups: the second's inputs scaled by 3, its targets by 2
    and its noise 0.5, so each group's posterior has scales of its own. Returns ``x`` (2, N,
    D), ``y`` (2, N), the noise (2,), the model and each group's exact mean and covariance."""
    (xa, ya, model, *_), (xb, yb, *_) = linear_problem(seed=0), linear_problem(seed=5)
    x, y = torch.stack([xa, 3 * xb]), torch.stack([ya, 2 * yb])
    noise = torch.tensor([NOISE, 0.5], dtype=torch.float64)
    exact = []
    for g in range(2):
        features = torch.cat([x[g], torch.ones(len(x[g]), 1, dtype=torch.float64)], 1)
        precision = torch.eye(4, dtype=torch.float64) + features.T @ features / noise[g] ** 2
        cov = torch.linalg.inv(precision)
        exact.append((cov @ features.T @ y[g] / noise[g] ** 2, cov))
    return x, y, noise, model, exact


def test_chain_potential_in_groups_is_each_groups_own_potential():
    x, y, noise, model, _ = two_linear_problems()
    grouped = ChainPotential(model, x, y, chains=3, noise=noise, jit=False)
    theta = torch.randn(6, 4, dtype=torch.float64)
    energy, grad = grouped(theta)
    for g in range(2):
        alone = ChainPotential(BayesianMLP(3, 1, hidden=(), noise_scale=float(noise[g]),
                                           prior=GaussianPrior()).double(),
                               x[g], y[g], chains=3, jit=False)
        mine = slice(3 * g, 3 * g + 3)
        for got, want in zip((energy[mine], grad[mine]), alone(theta[mine])):
            torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="fixed noise scale"):
        ChainPotential(BayesianMLP(3, 1, hidden=()).double(), x, y, chains=3, noise=noise)


def test_chains_in_groups_sample_each_groups_exact_posterior():
    """Two posteriors of different scales sampled together (each group with its own step
    size, trajectory length and mass matrix): each group's draws have its own exact mean and
    variance within Monte Carlo error (4.5 standard errors, as for one group)."""
    x, y, noise, model, exact = two_linear_problems()
    potential = ChainPotential(model, x, y, chains=6, noise=noise)
    run = chees_hmc(potential, torch.zeros(12, 4, dtype=torch.float64), warmup=300,
                    samples=400, groups=2, progress=False,
                    generator=torch.Generator().manual_seed(0))
    for g, (mean, cov) in enumerate(exact):
        assert_exact_moments(run.draws[6 * g:6 * g + 6], mean, cov.diagonal())
    with pytest.raises(ValueError, match="multiple of groups"):
        chees_hmc(potential, torch.zeros(12, 4, dtype=torch.float64), warmup=2, samples=2,
                  groups=5)
    with pytest.raises(ValueError, match="diagonal metric"):
        chees_hmc(potential, torch.zeros(12, 4, dtype=torch.float64), warmup=40, samples=2,
                  groups=2, dense=True)


def test_snapers_direction_finds_each_groups_leading_principal_component():
    """Power iteration over the iterations' chains (8 a group, fresh draws each time) finds
    each group's leading eigenvector: covariances ``I + 30 u u^T`` for two different unit
    ``u``, whose second eigenvalue is 1; the error after 300 iterations of averaged power
    iteration is of the order of the noise in 2400 draws' covariance, well under 0.1 in
    angle. The chains start at one point: a first iteration without spread keeps the
    starting direction rather than losing it."""
    g = torch.Generator().manual_seed(0)
    units = torch.nn.functional.normalize(torch.randn(2, 10, generator=g, dtype=torch.float64),
                                          dim=1)
    roots = torch.eye(10, dtype=torch.float64) + (math.sqrt(31) - 1) * (
        units[:, :, None] * units[:, None, :])
    direction = _Direction.start(2, units)
    direction.update(torch.zeros(2, 8, 10, dtype=torch.float64))
    torch.testing.assert_close(direction.unit.norm(dim=1), torch.ones(2, dtype=torch.float64))
    for _ in range(300):
        draws = torch.randn(2, 8, 10, generator=g, dtype=torch.float64) @ roots
        direction.update(draws - draws.mean(1, keepdim=True))
    cosine = (direction.unit * units).sum(1).abs()
    assert bool((cosine > math.cos(0.1)).all()), cosine


def test_each_group_adapts_its_own_step_size_and_trajectory_length():
    """Two Gaussian groups sampled together: a standard normal, and one whose two
    coordinates correlate at 0.99, which a diagonal mass matrix cannot whiten. The second
    needs a step size near the square root of its smallest eigenvalue (0.01, so about 0.1)
    and the first near 1: each group's step size is its own, and each samples its own
    covariance within Monte Carlo error (4.5 standard errors of each variance)."""
    covariances = torch.stack([torch.eye(2, dtype=torch.float64),
                               torch.tensor([[1.0, 0.99], [0.99, 1.0]], dtype=torch.float64)])
    potential = gaussian_potential(torch.linalg.inv(covariances).repeat_interleave(6, 0))
    run = chees_hmc(potential, torch.zeros(12, 2, dtype=torch.float64), warmup=400,
                    samples=600, groups=2, progress=False,
                    generator=torch.Generator().manual_seed(0))
    assert run.step_size[0] > 4 * run.step_size[1]
    for g in range(2):
        assert_exact_moments(run.draws[6 * g:6 * g + 6], torch.zeros(2, dtype=torch.float64),
                             covariances[g].diagonal())


def test_leapfrog_moves_each_chain_its_own_number_of_steps():
    """Chains asking for 1, 4 and 9 steps in one pass end exactly where each would alone:
    a chain that has taken its steps stands still while the others go on."""
    scales = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)[:, None]

    def potential(theta):
        return 0.5 * (theta.square() / scales.square()).sum(1), theta / scales.square()

    g = torch.Generator().manual_seed(0)
    theta, p = (torch.randn(3, 2, generator=g, dtype=torch.float64) for _ in range(2))
    metric, step_size = Metric.unit(theta), torch.full((3, 1), 0.1, dtype=torch.float64)
    steps = [1, 4, 9]  # three groups of one chain
    together = _leapfrog(potential, theta, p, potential(theta)[1], step_size, metric, steps)
    for c, count in enumerate(steps):
        alone = _leapfrog(potential, theta, p, potential(theta)[1], step_size, metric,
                          [count] * 3)
        for got, want in zip(together, alone):
            assert torch.equal(got[c], want[c]), (c, got[c], want[c])


def test_a_group_adapts_the_trajectory_length_it_adapts_alone():
    """A Gaussian whose coordinates correlate at 0.9, sampled alone and beside three that
    correlate at 0.999 and ask for far longer trajectories: over 8 seeds its adapted
    ``log T`` is the same within 3 standard errors of the difference of the means. Were its
    chains to run the others' leapfrog steps, SNAPER's gradient would be measured past the
    time ``h_t T`` it asks for, and its ``T`` would shrink (by a factor of four here)."""
    covariances = [torch.tensor([[1.0, rho], [rho, 1.0]], dtype=torch.float64)
                   for rho in (0.9, 0.999)]

    def adapted(groups, seed):
        precisions = torch.stack([torch.linalg.inv(covariances[g]) for g in groups])
        run = chees_hmc(gaussian_potential(precisions.repeat_interleave(8, 0)),
                        torch.zeros(8 * len(groups), 2, dtype=torch.float64), warmup=400,
                        samples=1, groups=len(groups), progress=False,
                        generator=torch.Generator().manual_seed(seed))
        return math.log(run.trajectory_length[0])

    alone = torch.tensor([adapted([0], seed) for seed in range(8)])
    beside = torch.tensor([adapted([0, 1, 1, 1], seed) for seed in range(8)])
    se = (alone.var() / 8 + beside.var() / 8).sqrt()
    assert abs(float(beside.mean() - alone.mean())) < 3 * se, (alone.exp(), beside.exp())


def test_where_the_leapfrog_cap_binds_every_iteration_runs_it():
    """A Gaussian whose coordinates correlate at 0.999 asks for trajectories of about 100
    step sizes (107 measured with ``max_leapfrog=256``). Capped at 8 steps, the criterion
    averaged over the jitter only grows with ``T`` (a longer trajectory still helps), so
    ``T`` climbs past 8 step sizes and almost every iteration runs the cap's 8 steps; were
    ``T`` held within the cap, the steps would spread over 1..8 (a mean of 4.5)."""
    covariance = torch.tensor([[1.0, 0.999], [0.999, 1.0]], dtype=torch.float64)
    run = chees_hmc(gaussian_potential(torch.linalg.inv(covariance)),
                    torch.zeros(8, 2, dtype=torch.float64), warmup=400, samples=400,
                    max_leapfrog=8, progress=False, generator=torch.Generator().manual_seed(0))
    assert float(run.trajectory_length[0] / run.step_size[0]) > 8
    assert run.leapfrog_steps > 7.5, run.leapfrog_steps


def test_hmc_fits_splits_together_each_with_its_own_noise():
    """``fit_many`` gives each data set the MAP noise and the chains that its own ``fit``
    gives it (the same start from the same seed)."""
    x, y, _, _, _ = two_linear_problems()
    def build(**options):
        return BayesianMLP(3, 1, hidden=(), prior=GaussianPrior(), **options).double()
    method = HMC(start=SVI(map_guide), warmup=30, samples=20, chains=4, replicas=True)
    budget = Budget(steps=50, lr=3e-2, batch_size=None)
    fits = method.fit_many(build, x, y, task="regression", seeds=[0, 1], budget=budget,
                           progress=False)
    for r, seed in enumerate([0, 1]):
        alone = method.fit(build, x[r], y[r], task="regression", seed=seed, budget=budget,
                           progress=False)
        assert fits[r].diagnostics["noise_scale"] == alone.diagnostics["noise_scale"]
        assert fits[r].diagnostics["chains"] == 4
    assert fits[0].diagnostics["noise_scale"] != fits[1].diagnostics["noise_scale"]
    held_out = replace(method, noise=HeldOutNoise()).fit_many(
        build, x, y, task="regression", seeds=[0, 1], budget=budget, progress=False)
    for tuned, fitted in zip(held_out, fits):
        assert tuned.diagnostics["noise_scale"] != fitted.diagnostics["noise_scale"]
    with pytest.raises(ValueError, match="dense=False"):
        HMC(start=SVI(map_guide), replicas=True, dense=True)


def test_held_out_noise_is_the_held_out_rms_residual_and_the_start_the_mode_at_it():
    """``HeldOutNoise``: ``sigma`` is the root mean squared residual, on the held-out points,
    of the MAP of the others; the chains' start is then the closed-form posterior mode of
    Bayesian linear regression on all the points at that ``sigma``. A fixed noise is kept."""
    x, y, _, _, _, _ = linear_problem(n=100)
    def build(**options):
        return BayesianMLP(3, 1, hidden=(), prior=GaussianPrior(), **options).double()
    init = {"layers.0.weight": torch.zeros(3, 1, dtype=torch.float64),
            "layers.0.bias": torch.zeros(1, dtype=torch.float64)}
    noise = HeldOutNoise(fraction=0.2)
    values, options, _ = noise.start(build, build(), init, x, y, seed=3, max_iter=500)
    held = torch.randperm(100, generator=torch.Generator().manual_seed(3))[:20]
    kept = torch.randperm(100, generator=torch.Generator().manual_seed(3))[20:]
    fitted, _, _ = full_batch_map(build(), init, x[kept], y[kept], max_iter=500)
    residual = y[held] - (x[held] @ fitted["layers.0.weight"]).squeeze(-1) \
        - fitted["layers.0.bias"]
    sigma = options["noise_scale"]
    assert sigma == pytest.approx(float(residual.square().mean().sqrt()), rel=1e-4)
    features = torch.cat([x, torch.ones(100, 1, dtype=torch.float64)], 1)
    mode = torch.linalg.solve(torch.eye(4, dtype=torch.float64) + features.T @ features
                              / sigma**2, features.T @ y / sigma**2)
    got = torch.cat([values["layers.0.weight"].reshape(-1), values["layers.0.bias"]])
    torch.testing.assert_close(got, mode, atol=1e-6, rtol=0)
    fixed = build(noise_scale=0.3)  # no scale to tune: the start is MapNoise's
    got, options, _ = noise.start(build, fixed, init, x, y, seed=0, max_iter=500)
    expected, expected_options, _ = MapNoise().start(build, fixed, init, x, y, seed=0,
                                                     max_iter=500)
    assert options == expected_options == {}
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    with pytest.raises(ValueError, match="fraction"):
        HeldOutNoise(fraction=0.0)
    with pytest.raises(TypeError, match="MapNoise, HeldOutNoise or SampledNoise"):
        HMC(start=SVI(map_guide), noise="held_out")


def test_full_batch_map_of_a_linear_model_is_the_closed_form_posterior_mode():
    x, y, model, mean, _, _ = linear_problem()
    init = {"layers.0.weight": torch.zeros(3, 1, dtype=torch.float64),
            "layers.0.bias": torch.zeros(1, dtype=torch.float64)}
    values, noise, result = full_batch_map(model, init, x, y, max_iter=200)
    assert noise == {}  # the noise is fixed, so not estimated
    got = torch.cat([values["layers.0.weight"].reshape(-1), values["layers.0.bias"]])
    torch.testing.assert_close(got, mean, atol=1e-6, rtol=0)
    assert result.reason in ("gradient", "change")


def test_full_batch_map_estimates_a_learned_noise_jointly_with_the_weights():
    # With the weights at their MAP, the MAP noise of a flat-prior sigma is the root mean
    # squared residual (d/d sigma of N log sigma + RSS / (2 sigma^2) vanishes there).
    x, y, _, _, _, _ = linear_problem(n=200)
    model = BayesianMLP(3, 1, hidden=(), prior=GaussianPrior()).double()
    init = {"layers.0.weight": torch.zeros(3, 1, dtype=torch.float64),
            "layers.0.bias": torch.zeros(1, dtype=torch.float64)}
    values, noise, _ = full_batch_map(model, init, x, y, max_iter=500)
    residual = y - (x @ values["layers.0.weight"]).squeeze(-1) - values["layers.0.bias"]
    assert noise["noise_scale"] == pytest.approx(float(residual.square().mean().sqrt()),
                                                 rel=1e-4)


@pytest.mark.slow
def test_hmc_and_pyro_nuts_give_the_same_predictive_of_a_small_network():
    # A 2-4-1 tanh network on 20 points: both samplers start at the same point and must
    # agree on the predictive mean at 5 test inputs within 4.5 standard errors of their
    # difference, each from its own bulk ESS (2 NUTS chains, JIT-compiled: about a minute).
    g = torch.Generator().manual_seed(2)
    x = torch.randn(20, 2, generator=g, dtype=torch.float64)
    y = torch.tanh(x[:, 0] - x[:, 1]) + 0.2 * torch.randn(20, generator=g, dtype=torch.float64)
    x_test = torch.randn(5, 2, generator=g, dtype=torch.float64)
    model = BayesianMLP(2, 1, (4,), activation="tanh", noise_scale=0.2,
                        prior=GaussianPrior(fan_in=True)).double()
    potential = ChainPotential(model, x, y, chains=4)
    run = chees_hmc(potential, torch.zeros(4, potential.dim, dtype=torch.float64),
                    warmup=300, samples=700, progress=False,
                    generator=torch.Generator().manual_seed(3))
    ours = output_draws(list(draw_chunks(run, potential)), model, x_test)
    theirs = []
    start = {k: v[0, 0] for k, v in potential.unflatten(
        torch.zeros(1, potential.dim, dtype=torch.float64)).items()}
    for chain in range(2):
        pyro.set_rng_seed(chain)
        kernel = pyro.infer.NUTS(model, jit_compile=True, ignore_jit_warnings=True,
                                 max_tree_depth=6, init_strategy=init_to_value(values=start))
        mcmc = pyro.infer.MCMC(kernel, num_samples=700, warmup_steps=300,
                               disable_progbar=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*torch.jit.trace.* is deprecated",
                                    DeprecationWarning)
            mcmc.run(x, y)
        theirs.append(mcmc.get_samples())
    theirs = output_draws(theirs, model, x_test)
    error = (ours.flatten(0, 1).var(0) / bulk_ess(ours)
             + theirs.flatten(0, 1).var(0) / bulk_ess(theirs)).sqrt()
    gap = (ours.flatten(0, 1).mean(0) - theirs.flatten(0, 1).mean(0)).abs()
    assert bool((gap < 4.5 * error).all()), (gap, error)


def test_chees_hmc_refuses_bad_settings_by_name():
    x, y, model, _, _, _ = linear_problem()
    potential = ChainPotential(model, x, y, chains=2, jit=False)
    start = torch.zeros(2, 4, dtype=torch.float64)
    for name, value in [("warmup", 0), ("samples", -1), ("max_leapfrog", 0)]:
        with pytest.raises(ValueError, match=name):
            chees_hmc(potential, start, **{"warmup": 2, "samples": 2, name: value})
    with pytest.raises(ValueError, match="target_accept"):
        chees_hmc(potential, start, warmup=2, samples=2, target_accept=1.5)
    with pytest.raises(ValueError, match="finite potential"):
        chees_hmc(potential, torch.full((2, 4), math.nan, dtype=torch.float64), warmup=2,
                  samples=2)


def test_van_der_corput_mirrors_the_binary_digits():
    assert [van_der_corput(n) for n in range(1, 8)] == [0.5, 0.25, 0.75, 0.125, 0.625,
                                                        0.375, 0.875]


def test_mass_windows_are_stans_expanding_windows():
    # warmup 1000: 150 iterations of step size alone, windows of 25, 50 and 100, then the
    # rest (575: a window of 200 would leave less than the 400 of the next) up to
    # iteration 900, then 100 of step size alone.
    assert mass_windows(1000) == [174, 224, 324, 899]
    assert mass_windows(10) == []


def test_hmc_refuses_regression_targets_of_several_outputs_by_name():
    x = torch.linspace(-1, 1, 20)[:, None]
    with pytest.raises(UnsupportedProblem, match=r"targets of shape \(N,\), got \(20, 2\)"):
        zoo.get("hmc").fit(x, torch.cat([x, x.square()], 1), steps=2,
                           method_options={"warmup": 2, "samples": 2, "chains": 2})
