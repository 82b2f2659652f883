"""Infinite-width limit and unit-level priors (the second half of Arbel's lecture notes
"Bayesian NN under a Laplace approximation"): the NNGP kernels against wide nets and random
features, the GP posterior against a hand solve, the Gaussian limit (excess kurtosis ~ 1/H)
and the sub-Weibull(l/2) tails of the units."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pyro.distributions as dist
import pytest
import torch

from bnn_zoo import data, zoo
from bnn_zoo._harness.prior_diagnostics import (
    excess_kurtosis,
    fan_in_prior_outputs,
    log_moment_norms,
    preactivations,
    prior_predictive,
    relu_chain_log_norms,
    tail_parameter_from_moments,
    tail_parameter_from_survival,
    tail_table,
)
from bnn_zoo.models import BayesianMLP, GaussianPrior
from bnn_zoo.models._nngp import GaussianEvidence, NNGPRegression
from bnn_zoo.models._nngp_kernel import NNGPKernel, expected_product

ROOT = Path(__file__).resolve().parents[2]
F64 = torch.float64


def wide_net(width: int, activation: str, in_dim: int = 2) -> BayesianMLP:
    """The one-hidden-layer net whose prior is the NNGP kernel with every variance 1."""
    return BayesianMLP(in_dim, 1, (width,), activation=activation, noise_scale=1.0,
                       prior=GaussianPrior(1.0, fan_in=True)).double()


@pytest.mark.parametrize("activation", ["relu", "erf"])
def test_kernel_matches_covariance_of_wide_net(activation):
    """Empirical E[f(x) f(x')] of an H = 4096 net under its prior (mean 0 exactly) against
    the closed-form kernel, within 4 Monte Carlo standard errors, for every pair."""
    x = torch.tensor([[0.5, -1.0], [1.5, 0.3], [-2.0, -0.4]], dtype=F64)
    net = wide_net(4096, activation)
    f = torch.cat([prior_predictive(net, x, 500).squeeze(-1) for _ in range(4)])  # (S, 3)
    products = f.unsqueeze(-1) * f.unsqueeze(-2)  # (S, 3, 3)
    empirical = products.mean(0)
    stderr = products.std(0) / math.sqrt(f.shape[0])
    kernel = NNGPKernel(2, activation).double()(x).detach()
    assert ((empirical - kernel).abs() < 4 * stderr).all(), (empirical, kernel, stderr)


@pytest.mark.parametrize("activation", ["relu", "erf", "identity"])
def test_closed_form_matches_monte_carlo_kernel(activation):
    """Closed form against the random-feature kernel, within 4 standard errors of the
    feature average (computed from the features themselves)."""
    x = torch.randn(5, 3, dtype=F64)
    exact = NNGPKernel(3, activation, weight_variance=2.0, bias_variance=0.5,
                       output_variance=1.5, output_bias_variance=0.2).double()
    mc = NNGPKernel(3, activation, weight_variance=2.0, bias_variance=0.5, output_variance=1.5,
                    output_bias_variance=0.2, num_features=200_000).double()
    assert exact.closed_form and not mc.closed_form
    with torch.no_grad():
        feats = mc.features(x) * math.sqrt(mc.num_features)  # (N, S) unit values
        per_feature = 1.5 * feats.unsqueeze(1) * feats.unsqueeze(0)  # (N, N, S)
        stderr = per_feature.std(-1) / math.sqrt(mc.num_features)
        assert ((exact(x) - mc(x)).abs() < 4 * stderr + 1e-12).all()


@pytest.mark.parametrize("activation", ["relu", "erf", "identity", "tanh"])
def test_kernel_is_positive_semidefinite_and_diag_consistent(activation):
    x = torch.randn(40, 2, dtype=F64)
    kernel = NNGPKernel(2, activation, output_bias_variance=0.1).double()
    with torch.no_grad():
        k = kernel(x)
        eig = torch.linalg.eigvalsh(k)
        torch.testing.assert_close(k, k.T)
        assert eig.min() > -1e-10 * eig.max()
        torch.testing.assert_close(kernel(x, diag=True), k.diagonal())


def test_relu_kernel_special_values():
    """K(x, x) = s_c + s_v Sigma(x, x) / 2; orthogonal inputs without bias give s_v k / (2 pi)."""
    kernel = NNGPKernel(2, "relu", weight_variance=2.0, bias_variance=1e-8 * 1.5,
                        output_variance=3.0, output_bias_variance=0.5).double()
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64)
    with torch.no_grad():
        k = kernel(x)
    # The bias variance (the smallest allowed) moves K by about 1e-8.
    torch.testing.assert_close(k.diagonal(), torch.full((2,), 0.5 + 3.0 * 1.0 / 2, dtype=F64),
                               rtol=0, atol=1e-7)
    torch.testing.assert_close(k[0, 1], torch.tensor(0.5 + 3.0 * 1.0 / (2 * math.pi), dtype=F64),
                               rtol=0, atol=1e-7)


def test_posterior_and_evidence_match_hand_solve():
    x = torch.randn(12, 2, dtype=F64)
    y = torch.sin(x[:, 0]) + 0.1 * torch.randn(12, dtype=F64)
    xs = torch.randn(4, 2, dtype=F64)
    model = NNGPRegression(2, noise_scale=0.2, jitter=1e-14).double()
    pred = model.posterior(x, y, xs)
    with torch.no_grad():
        c = model.kernel(x) + 0.04 * torch.eye(12, dtype=F64)
        ks, kss = model.kernel(x, xs), model.kernel(xs)
        mean = ks.T @ torch.linalg.solve(c, y)
        var = (kss - ks.T @ torch.linalg.solve(c, ks)).diagonal() + 0.04
        evidence = (-0.5 * y @ torch.linalg.solve(c, y) - 0.5 * torch.logdet(c)
                    - 6 * math.log(2 * math.pi))
    torch.testing.assert_close(pred.loc, mean.unsqueeze(0))
    torch.testing.assert_close(pred.scale, var.sqrt().unsqueeze(0))
    log_ev = model.log_evidence(x, y)
    torch.testing.assert_close(log_ev.detach(), evidence)
    grads = torch.autograd.grad(log_ev, list(model.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)


def test_gaussian_evidence_matches_the_multivariate_normal_in_value_and_gradient():
    """The closed-form gradient (Rasmussen & Williams eq. 5.9) of GaussianEvidence against
    autograd through Pyro's MultivariateNormal, batched, and against finite differences."""
    root = torch.randn(3, 6, 6, dtype=F64)
    covariance = (root @ root.mT + torch.eye(6, dtype=F64)).requires_grad_()
    y = torch.randn(3, 6, dtype=F64, requires_grad=True)
    ours = GaussianEvidence(covariance, torch.linalg.cholesky(covariance)).log_prob(y)
    plain = dist.MultivariateNormal(torch.zeros(6, dtype=F64), covariance).log_prob(y)
    torch.testing.assert_close(ours, plain)
    weights = torch.tensor([0.3, -1.0, 2.0], dtype=F64)
    for got, want in zip(torch.autograd.grad((ours * weights).sum(), (covariance, y)),
                         torch.autograd.grad((plain * weights).sum(), (covariance, y))):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(
        lambda a, v: GaussianEvidence((a + a.mT) / 2, torch.linalg.cholesky((a + a.mT) / 2))
        .log_prob(v), (covariance.detach().clone().requires_grad_(), y))
    # One covariance for a batch of values, as Pyro's plates expand it.
    batched = GaussianEvidence(covariance[0], torch.linalg.cholesky(covariance[0])).expand([3])
    torch.testing.assert_close(batched.log_prob(y), dist.MultivariateNormal(
        torch.zeros(6, dtype=F64), covariance[0]).log_prob(y))


def test_kernel_plugs_into_pyro_gp_regression():
    """The kernel is a pyro.contrib.gp kernel: Pyro's GPRegression gives the same posterior."""
    import pyro.contrib.gp as gp

    x = torch.randn(10, 2, dtype=F64)
    y = torch.cos(x.sum(-1))
    xs = torch.randn(3, 2, dtype=F64)
    ours = NNGPRegression(2, activation="erf", noise_scale=0.3, jitter=1e-14).double()
    pyros = gp.models.GPRegression(x, y, ours.kernel, noise=torch.tensor(0.09, dtype=F64),
                                   jitter=1e-14)
    with torch.no_grad():
        mean, var = pyros(xs, full_cov=False, noiseless=False)
    pred = ours.posterior(x, y, xs)
    torch.testing.assert_close(pred.loc[0], mean)
    torch.testing.assert_close(pred.scale[0] ** 2, var)


def relu_excess_kurtosis(width: int, s2: float) -> float:
    """Exact excess kurtosis of f = c + sum_m v_m relu(g_m), g_m ~ N(0, s2), v_m ~ N(0, 1/H),
    c ~ N(0, 1): 3 (E phi^4 - (E phi^2)^2) / (H (1 + E phi^2)^2), E phi^2 = s2 / 2,
    E phi^4 = 3 s2^2 / 2."""
    m2, m4 = s2 / 2, 1.5 * s2**2
    return 3 * (m4 - m2**2) / (width * (1 + m2) ** 2)


def test_excess_kurtosis_shrinks_as_one_over_width():
    """The output approaches its Gaussian limit: the excess kurtosis matches the exact
    3 (E phi^4 - E^2 phi^2) / (H (s_c + E phi^2)^2) within 4 batch-means standard errors
    at H = 1, 10, 100, 1000, and falls with H."""
    x = torch.tensor([[1.0, -0.5]], dtype=F64)
    s2 = 1.0 + float((x**2).sum()) / 2
    estimates = []
    for width in (1, 10, 100, 1000):
        f = prior_predictive(wide_net(width, "relu"), x, 8000).reshape(20, 400)
        batches = excess_kurtosis(f.T)  # 20 batch estimates
        kurt, stderr = float(batches.mean()), float(batches.std() / math.sqrt(20))
        assert abs(kurt - relu_excess_kurtosis(width, s2)) < 4 * stderr + 0.02, (width, kurt)
        estimates.append(kurt)
    assert estimates[0] > estimates[1] > estimates[2]
    assert abs(estimates[3]) < estimates[1]


def relu_chain(depth: int, num_samples: int) -> list[torch.Tensor]:
    """Units of a width-1 ReLU net without biases, standard normal weights, input 1."""
    params = [(torch.randn(num_samples, 1, 1, dtype=F64), torch.zeros(num_samples, 1, dtype=F64))
              for _ in range(depth)]
    units = preactivations(torch.ones(1, 1, dtype=F64), params)
    return [u.reshape(-1) for u in units]


def test_width_one_tail_parameters_match_exact_moments_and_approach_l_over_2():
    orders = (1, 2, 3, 4)
    units = relu_chain(3, 400_000)
    for depth, u in enumerate(units, start=1):
        sampled = tail_parameter_from_moments(log_moment_norms(u, orders), orders)
        exact = tail_parameter_from_moments(relu_chain_log_norms(depth, orders), orders)
        assert abs(float(sampled) - float(exact)) < 0.1, (depth, sampled, exact)
        # The exact slope at orders (k, 2k) approaches l/2 monotonically...
        gaps = [abs(float(tail_parameter_from_moments(relu_chain_log_norms(depth, (k, 2 * k)),
                                                      (k, 2 * k))) - depth / 2)
                for k in (1, 4, 16, 64, 256)]
        assert all(a > b for a, b in zip(gaps, gaps[1:])) and gaps[-1] < 0.01
        # ...and so does the sampled one between low and moderate orders.
        low, high = ((tail_parameter_from_moments(log_moment_norms(u, o), o) - depth / 2).abs()
                     for o in ((1, 2), (4, 8)))
        assert high < low


def test_log_moment_norms_of_a_gaussian():
    u = torch.randn(200_000, dtype=F64)
    exact = relu_chain_log_norms(1, (1, 2, 4))  # ||Z||_k: sqrt(2/pi), 1, 3^(1/4)
    torch.testing.assert_close(exact, torch.tensor([0.5 * math.log(2 / math.pi), 0.0,
                                                    0.25 * math.log(3)], dtype=F64))
    assert (log_moment_norms(u, (1, 2, 4)) - exact).abs().max() < 0.01


@pytest.mark.parametrize("theta", [0.5, 1.0, 1.5])
def test_tail_estimators_on_exact_weibull_tails(theta):
    """X = E^theta with E ~ Exp(1) has P(X > t) = exp(-t^(1/theta)) exactly, so the
    log-survival slope is 1/theta at every t, and E X^k = Gamma(1 + k theta)."""
    x = torch.empty(200_000, dtype=F64).exponential_() ** theta
    assert abs(float(tail_parameter_from_survival(x)) - theta) < 0.05 * theta
    orders = (1, 2, 3)
    exact = torch.tensor([math.lgamma(1 + k * theta) / k for k in orders], dtype=F64)
    assert (log_moment_norms(x, orders) - exact).abs().max() < 0.02


def test_tail_parameter_increases_with_depth():
    net = BayesianMLP(1, 1, (2, 2), prior=GaussianPrior(1.0, fan_in=True), noise_scale=1.0)
    rows = tail_table(net.double(), torch.ones(1, 1, dtype=F64), 100_000)
    assert [r["layer"] for r in rows] == [1, 2, 3]
    for key in ("theta_moments", "theta_survival"):
        values = [r[key] for r in rows]
        assert values[0] < values[1] < values[2], (key, values)
    assert abs(rows[0]["excess_kurtosis"]) < 0.1  # layer 1 is Gaussian


def test_nngp_entry_fits_sine_in_original_units():
    ds = data.load("sine")
    x, y = ds.x_train[:80], 3.0 + 2.0 * ds.y_train[:80]
    fitted = zoo.get("nngp").fit(x, y, steps=40, lr=0.1)
    assert fitted.result.losses[-1] < fitted.result.losses[0]
    out = fitted.evaluate(ds.x_test[:200], 3.0 + 2.0 * ds.y_test[:200])
    assert out["rmse"] < 0.5 and out["ll"] > -1.0 and 0.7 < out["coverage_90"] <= 1.0
    assert "nngp-erf" in zoo.names("regression")


def test_bad_input():
    with pytest.raises(ValueError, match="activation"):
        NNGPKernel(2, "softsign")
    with pytest.raises(ValueError, match="num_features"):
        NNGPKernel(2, "relu", num_features=0)
    with pytest.raises(ValueError, match="weight_variance"):
        NNGPKernel(2, "relu", weight_variance=-1.0)
    with pytest.raises(ValueError, match="columns"):
        NNGPKernel(2)(torch.zeros(3, 2), torch.zeros(3, 5))
    x, y = torch.randn(10, 1), torch.randn(10)
    with pytest.raises(ValueError, match="batch_size"):
        zoo.get("nngp").fit(x, y, batch_size=5)
    with pytest.raises(ValueError, match="regression"):
        zoo.get("nngp").fit(x, torch.arange(10) % 2)
    with pytest.raises(ValueError, match="orders"):
        log_moment_norms(y, (0, 1))
    with pytest.raises(ValueError, match="site"):
        prior_predictive(wide_net(3, "relu", in_dim=1), x.double(), 2, site="nope")


@pytest.mark.slow
def test_nngp_on_concrete(uci_data):
    ds = data.load("uci/concrete")
    out = zoo.get("nngp").fit(ds.x_train, ds.y_train).evaluate(ds.x_test, ds.y_test)
    # Split 0 gives -3.03 (rmse 5.13); the finite nets of the benchmark average -3.25 (bbb).
    assert out["ll"] > -3.15 and out["rmse"] < 5.6


def test_priors_command_writes_tables_and_figures(tmp_path):
    from bnn_zoo._harness.cli import main

    main(["priors", "--widths", "1", "10", "--depth", "3", "--samples", "2000",
                     "--out", str(tmp_path)])
    for name in ("priors.md", "priors.json", "output_vs_gaussian.png", "tail_parameters.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "theta" in (tmp_path / "priors.md").read_text()


def test_benchmark_script_runs_with_tiny_flags(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "nngp.py"), "--out", str(tmp_path),
                    "--widths", "1", "16", "--samples", "200", "--datasets", "sine",
                    "--entries", "nngp", "map", "--steps", "5", "--train-size", "60"],
                   check=True, capture_output=True, text=True)
    table = (tmp_path / "nngp.md").read_text()
    assert "sine" in table and any(ch.isdigit() for ch in table)
    for name in ("nngp.json", "covariance.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_entry_declines_data_too_large_for_an_exact_gp():
    from bnn_zoo.zoo import UnsupportedProblem
    from bnn_zoo.zoo.nngp import MAX_TRAINING_POINTS

    n = MAX_TRAINING_POINTS + 1
    x = torch.linspace(-1, 1, n).unsqueeze(-1)
    with pytest.raises(UnsupportedProblem, match="O\\(N\\^3\\)"):
        zoo.get("nngp").fit(x, x.squeeze(-1), steps=1)


X3 = torch.tensor([[0.5, -1.0], [1.5, 0.3], [-2.0, -0.4]], dtype=F64)


def product_moments(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empirical E[f(x) f(x')] (the prior mean is 0) and its Monte Carlo standard error,
    from (S, N) samples."""
    products = f.unsqueeze(-1) * f.unsqueeze(-2)
    return products.mean(0), products.std(0) / math.sqrt(f.shape[0])


@pytest.mark.parametrize("activation", ["relu", "erf", "identity", "tanh"])
def test_depth_one_is_the_one_layer_kernel(activation):
    """depth=1 (the default) is today's one-layer kernel exactly: the closed form
    s_c + s_v E[phi(u) phi(u')] under Sigma^(1), or the one-layer random features."""
    options = dict(weight_variance=2.0, bias_variance=0.5, output_variance=1.5,
                   output_bias_variance=0.2)
    kernel = NNGPKernel(2, activation, depth=1, **options).double()
    assert torch.equal(kernel(X3).detach(), NNGPKernel(2, activation, **options).double()(X3)
                       .detach())
    with torch.no_grad():
        s_w, s_b = kernel.weight_variance, kernel.bias_variance
        s_v, s_c = kernel.output_variance, kernel.output_bias_variance
        if kernel.closed_form:
            k = s_b + s_w * (X3**2).sum(-1) / 2
            product = expected_product(activation, k.unsqueeze(-1), s_b + s_w * (X3 @ X3.T) / 2,
                                       k.unsqueeze(-2))
        else:
            gen = torch.Generator().manual_seed(kernel.seed)
            noise = torch.randn(3, kernel.num_features, generator=gen, dtype=F64)
            h = torch.tanh((s_w / 2).sqrt() * (X3 @ noise[:-1]) + s_b.sqrt() * noise[-1])
            product = h @ h.T / kernel.num_features
        assert torch.equal(kernel(X3), s_c + s_v * product)


def test_layerwise_sampler_matches_the_zoo_net_at_finite_width():
    """fan_in_prior_outputs draws what the zoo's MLP draws, also where the width (3) is far
    from the limit: second and fourth moments within 4 combined standard errors."""
    x = X3[:2]
    net = BayesianMLP(2, 1, (3, 3), noise_scale=1.0, prior=GaussianPrior(1.0, fan_in=True))
    zoo_f = prior_predictive(net.double(), x, 40_000).squeeze(-1)
    ours = fan_in_prior_outputs(x, 3, 2, "relu", 40_000)
    for moment in (lambda f: f.unsqueeze(-1) * f.unsqueeze(-2), lambda f: f**4):
        a, b = moment(zoo_f), moment(ours)
        stderr = (a.var(0) / a.shape[0] + b.var(0) / b.shape[0]).sqrt()
        assert ((a.mean(0) - b.mean(0)).abs() < 4 * stderr).all()
    assert float(excess_kurtosis(ours[:, 0])) > 0.5  # far from Gaussian: the test has power


@pytest.mark.parametrize("activation", ["relu", "erf"])
@pytest.mark.parametrize("depth", [2, 3])
def test_deep_kernel_matches_covariance_of_wide_deep_nets(activation, depth):
    """Empirical E[f(x) f(x')] of 10 000 nets with ``depth`` hidden layers of width 1000
    against the deep kernel, within 4 Monte Carlo standard errors for every pair (the
    finite-width bias, O(1/H), is far below); the kernel of one layer less is rejected."""
    f = fan_in_prior_outputs(X3, 1000, depth, activation, 10_000)
    empirical, stderr = product_moments(f)
    with torch.no_grad():
        kernel = NNGPKernel(2, activation, depth=depth).double()(X3)
        shallower = NNGPKernel(2, activation, depth=depth - 1).double()(X3)
        torch.testing.assert_close(NNGPKernel(2, activation, depth=depth).double()(X3, diag=True),
                                   kernel.diagonal())
    assert ((empirical - kernel).abs() < 4 * stderr).all(), (empirical, kernel, stderr)
    assert ((empirical - shallower).abs() > 4 * stderr).any()


def test_deep_monte_carlo_kernel_matches_wide_deep_nets():
    """The random-feature kernel extended by layer, for tanh (no closed form) at depth 2:
    its mean over 8 feature seeds against the wide nets' covariance, and for relu against
    the closed form, within 4 standard errors (the seeds' spread and the nets' error)."""
    def seed_mean(activation: str) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            ks = torch.stack([NNGPKernel(2, activation, depth=2, num_features=2048,
                                         seed=seed).double()(X3) for seed in range(8)])
        return ks.mean(0), ks.std(0) / math.sqrt(8)

    mc, mc_stderr = seed_mean("tanh")
    empirical, stderr = product_moments(fan_in_prior_outputs(X3, 1000, 2, "tanh", 10_000))
    assert ((mc - empirical).abs() < 4 * (mc_stderr**2 + stderr**2).sqrt()).all()
    mc, mc_stderr = seed_mean("relu")
    with torch.no_grad():
        exact = NNGPKernel(2, "relu", depth=2).double()(X3)
    assert ((mc - exact).abs() < 4 * mc_stderr).all()


def test_deep_kernel_is_positive_semidefinite_and_differentiable():
    x = torch.randn(30, 2, dtype=F64)
    for activation in ("relu", "erf", "tanh"):
        kernel = NNGPKernel(2, activation, depth=3, num_features=None if activation != "tanh"
                            else 512).double()
        k = kernel(x)
        eig = torch.linalg.eigvalsh(k.detach())
        assert eig.min() > -1e-10 * eig.max()
        grads = torch.autograd.grad(k.sum(), list(kernel.parameters()))
        assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_nngp_entry_takes_the_depth():
    ds = data.load("sine")
    fitted = zoo.get("nngp").fit(ds.x_train[:60], ds.y_train[:60], steps=20, lr=0.1,
                                 model_options={"depth": 3})
    assert fitted.model.gp.kernel.depth == 3
    out = fitted.evaluate(ds.x_test[:100], ds.y_test[:100])
    assert out["rmse"] < 0.5 and math.isfinite(out["ll"])


def test_priors_command_takes_the_nngp_depth(tmp_path):
    from bnn_zoo._harness.cli import main

    main(["priors", "--widths", "50", "--nngp-depth", "2", "--depth", "2", "--samples", "2000",
          "--out", str(tmp_path)])
    assert "2 hidden relu layer" in (tmp_path / "priors.md").read_text()


@pytest.mark.parametrize("activation, depth, features", [
    ("relu", 1, None), ("erf", 2, None), ("tanh", 1, 256), ("relu", 2, 256)])
def test_a_relevance_per_input_is_the_kernel_of_the_inputs_scaled(activation, depth, features):
    """With ``ard`` the input weights of input h have variance r_h sigma_w^2 / D, which is
    the kernel without ARD at inputs scaled by sqrt(r_h) (closed form and Monte Carlo, one
    and two hidden layers); at r = 1 it is the kernel without ARD."""
    gen = torch.Generator().manual_seed(0)
    x, z = torch.randn(5, 3, generator=gen, dtype=F64), torch.randn(4, 3, generator=gen, dtype=F64)
    plain = NNGPKernel(3, activation, depth=depth, num_features=features).double()
    ard = NNGPKernel(3, activation, depth=depth, num_features=features, ard=True).double()
    torch.testing.assert_close(ard(x, z), plain(x, z))  # r = 1 up to the constraint's rounding
    relevance = torch.tensor([0.1, 4.0, 1e-3], dtype=F64)
    ard.input_relevance = relevance
    torch.testing.assert_close(ard(x, z), plain(x * relevance.sqrt(), z * relevance.sqrt()))
    torch.testing.assert_close(ard(x, diag=True), plain(x * relevance.sqrt(), diag=True))


def test_type_two_maximum_likelihood_shrinks_the_relevance_of_an_unused_input():
    """y depends on the first of three inputs only: the evidence drives the relevances of
    the other two far below the first's, and `hyperparameters` reports them; one input has
    no relevance of its own (it would repeat the weight variance)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(120, 3, generator=gen)
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(120, generator=gen)
    fitted = zoo.get("nngp").fit(x, y, seed=0, progress=False, model_options={"ard": True})
    relevance = fitted.model.gp.hyperparameters()["input_relevance"]
    assert len(relevance) == 3
    assert max(relevance[1:]) < 0.1 * relevance[0], relevance
    one = zoo.get("nngp").fit(x[:, :1], y, steps=5, seed=0, progress=False)
    assert "input_relevance" not in one.model.gp.hyperparameters()
