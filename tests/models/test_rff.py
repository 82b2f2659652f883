"""Random-Fourier-feature net with LogitNormal input scales (Coker's notes "LogitNormal
model"): the exact conditional of beta, the collapsed ELBO against the Trace ELBO,
gradients, the LogitNormal's KL and mean, feature selection, and the three objectives on
sine."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from bnn_zoo import data, predict, zoo
from bnn_zoo._core.elbo import (
    Algorithm1ELBO,
    CollapsedELBO,
    ExpectedLikelihoodELBO,
    MeanFieldELBO,
)
from bnn_zoo._core.step import SVIStep
from bnn_zoo.guides._logitnormal import LogitNormalGuide, plot_relevance
from bnn_zoo.methods._logitnormal import OBJECTIVES
from bnn_zoo.models._rff import (
    LogitNormal,
    RandomFeatureRegression,
    _jittered_cholesky,
    feature_posterior,
    gram,
)

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[2]


def problem(n: int = 30, d: int = 3, k: int = 12, noise: float = 0.3):
    """A small float64 model, guide (scales spread out) and data."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = torch.sin(x[:, 0]) + noise * torch.randn(n, generator=gen, dtype=torch.float64)
    model = RandomFeatureRegression(d, k, noise_scale=noise).double()
    guide = LogitNormalGuide(model, init_scale=0.5).double()
    with torch.no_grad():
        guide.loc.copy_(torch.linspace(-1.0, 1.0, d, dtype=torch.float64))
    return model, guide, x, y


def test_full_conditional_is_the_bayesian_linear_regression_posterior():
    """Mean, covariance and evidence against the textbook forms (N x N evidence), float64."""
    model, _, x, y = problem()
    s = torch.tensor([[0.2, 0.7, 0.5], [0.9, 0.1, 0.4]], dtype=torch.float64)
    post = model.conditional(x, y, s)
    sigma, sigma_beta = 0.3, model.beta_scale.item()
    for i in range(2):
        phi = model.features(x, s[i])
        eye = torch.eye(12, dtype=x.dtype)
        cov = torch.linalg.inv(phi.T @ phi / sigma**2 + eye / sigma_beta**2)
        mean = cov @ phi.T @ y / sigma**2
        marginal = torch.distributions.MultivariateNormal(
            torch.zeros_like(y), sigma_beta**2 * phi @ phi.T + sigma**2 * torch.eye(30).double())
        torch.testing.assert_close(post.loc[i], mean, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(post.scale_tril[i] @ post.scale_tril[i].T, cov,
                                   rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(post.log_evidence[i], marginal.log_prob(y), rtol=1e-6, atol=1e-6)
    assert torch.equal(post.scale_tril, post.scale_tril.tril())


def test_feature_posterior_gradients_match_finite_differences():
    gen = torch.Generator().manual_seed(0)
    phi = torch.randn(8, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(8, generator=gen, dtype=torch.float64)
    noise = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda p, s: tuple(feature_posterior(p, y, s, 0.7)), (phi, noise))


def test_feature_posterior_adds_jitter_where_float32_cannot_factorise():
    """Nearly collinear features with a tiny noise: cond(A) ~ 1e11 fails in float32; the
    fallback warns once (RuntimeWarning only, also under gradient) and stays finite."""
    gen = torch.Generator().manual_seed(0)
    phi = (1 + 1e-4 * torch.randn(1000, 3, generator=gen)).requires_grad_()
    y = torch.randn(1000, generator=gen)
    with pytest.warns(RuntimeWarning, match="added jitter") as record:
        post = feature_posterior(phi, y, 1e-4, 1.0)
    assert [w.category for w in record] == [RuntimeWarning]
    post.log_evidence.backward()
    assert all(torch.isfinite(t).all() for t in (*post, phi.grad))


@pytest.mark.parametrize("defect, relative", [(5e-7, 1e-6), (5e-5, 1e-4), (5e-4, 1e-3)])
def test_jitter_escalates_to_the_first_that_factorises(defect, relative):
    """[[1, 1 + d], [1 + d, 1]] has eigenvalue -d: the first jitter j > d (of the mean
    diagonal, 1) is the one used, and the warning names it."""
    matrix = torch.tensor([[1.0, 1.0 + defect], [1.0 + defect, 1.0]], dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match=f"\\({relative:g} of the mean diagonal\\)"):
        chol = _jittered_cholesky(matrix)
    eye = torch.eye(2, dtype=torch.float64)
    torch.testing.assert_close(chol @ chol.mT, matrix + relative * eye)


def test_jitter_gives_up_with_a_clear_error():
    matrix = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ValueError, match="not positive definite in torch.float32 even with a "
                                         "jitter of 0.001 of its mean diagonal; use float64"):
        _jittered_cholesky(matrix)


def test_gram_equals_the_product_in_value_and_first_and_second_derivatives():
    """``gram``'s one-product backward ``Phi (G + G^T)`` against finite differences, batched."""
    phi = torch.randn(3, 7, 4, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(gram(phi), phi.mT @ phi, rtol=0, atol=0)
    assert torch.autograd.gradcheck(gram, (phi,))
    assert torch.autograd.gradgradcheck(gram, (phi,))


def test_collapsed_elbo_equals_trace_elbo_with_exact_conditional():
    """Per sample of s, the Algorithm-3 integrand log p(y|beta,s) + log p(beta) - log q(beta|s)
    equals log p(y|s) whatever beta is drawn: same values and gradients as CollapsedELBO."""
    model, guide, x, y = problem()
    params = list(guide.parameters())
    losses, grads = [], []
    for elbo in (MeanFieldELBO, CollapsedELBO):
        torch.manual_seed(7)
        loss = elbo(num_particles=16, vectorize_particles=True,
                    max_plate_nesting=1).differentiable_loss(model, guide, x, y)
        losses.append(loss)
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-9, atol=1e-8)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-7, atol=1e-8)
    # The average over many s is the collapsed ELBO's expectation; it is not trivially
    # constant: different seeds give different estimates.
    torch.manual_seed(8)
    other = CollapsedELBO(num_particles=16).differentiable_loss(model, guide, x, y)
    assert (other - losses[1]).abs() > 1e-3


def test_collapsed_elbo_is_evidence_minus_closed_form_kl():
    model, guide, x, y = problem()
    torch.manual_seed(1)
    loss = CollapsedELBO(num_particles=5).differentiable_loss(model, guide, x, y)
    torch.manual_seed(1)
    s = guide.scale_distribution().rsample((5,))
    kl = torch.distributions.kl_divergence(guide.scale_distribution(), model.scale_prior())
    torch.testing.assert_close(loss, kl - model.conditional(x, y, s).log_evidence.mean())


def expected_log_likelihood(model, x, y, s):
    """``E_{beta ~ p(beta | X, y, s)}[log p(y | X, beta, s)]`` in closed form (Gaussian
    ``beta`` with mean ``m``, covariance ``C``): ``sum_n log N(y_n; phi_n' m, sigma^2)
    - tr(Phi C Phi') / (2 sigma^2)``."""
    post = model.conditional(x, y, s)
    phi = model.features(x, s)
    sigma = model.observation_scale()
    fitted = (phi @ post.loc.unsqueeze(-1)).squeeze(-1)
    spread = (phi @ post.scale_tril).pow(2).sum((-2, -1))
    return dist.Normal(fitted, sigma).log_prob(y).sum(-1) - spread / (2 * sigma**2)


def test_literal_algorithm_3_is_the_collapsed_elbo_plus_the_conditional_kl():
    """Without log p(beta) - log q(beta|s), Algorithm 3's expectation is the collapsed ELBO
    plus E_q(s)[KL(p(beta|X,y,s) || p(beta))]: exactly per s (closed form, float64), and the
    Monte Carlo estimate of ExpectedLikelihoodELBO against it (4 standard errors). The gap
    is far beyond the Monte Carlo error: "Algorithm 3 equals the collapsed ELBO" holds for
    the ELBO (test above), not for Coker's literal objective."""
    model, guide, x, y = problem()
    guide.condition_on(x, y)
    q, prior = guide.scale_distribution(), model.scale_prior()
    with torch.no_grad():
        s = q.sample((20000,))
        post = model.conditional(x, y, s)
        beta_prior = dist.MultivariateNormal(torch.zeros(12, dtype=x.dtype),
                                             model.beta_scale**2 * torch.eye(12, dtype=x.dtype))
        kl_post = torch.distributions.kl_divergence(post.distribution(), beta_prior)
        torch.testing.assert_close(expected_log_likelihood(model, x, y, s[:50]),
                                   post.log_evidence[:50] + kl_post[:50], rtol=1e-10, atol=1e-8)
        target = post.log_evidence + kl_post  # E_beta log p(y | beta, s), per s
        kl_s = torch.distributions.kl_divergence(q, prior)
        expected_loss = kl_s - target.mean()
        expected_se = target.std() / math.sqrt(target.numel())
        collapsed_loss = kl_s - post.log_evidence.mean()

        elbo = ExpectedLikelihoodELBO(num_particles=200, vectorize_particles=True,
                                      max_plate_nesting=1)
        estimates = torch.stack([elbo.differentiable_loss(model, guide, x, y)
                                 for _ in range(50)])
    se = (estimates.var() / estimates.numel() + expected_se**2).sqrt()
    assert (estimates.mean() - expected_loss).abs() < 4 * se, (estimates.mean(), expected_loss)
    assert collapsed_loss - estimates.mean() > 20 * se  # the literal objective is not it
    assert kl_post.mean() > 1.0  # nats: the extra term is not small either


def test_literal_algorithm_3_overfits_where_the_features_interpolate():
    """K = 100 features on N = 100 points of ten inputs (two relevant, noise 0.1): the
    literal objective rewards fitting the training data twice and drives the learned noise
    towards 0 (test log-likelihood collapses); the collapsed ELBO keeps the noise near the
    truth and switches the irrelevant inputs off. (The README's numbers.)"""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(600, 10, generator=gen)
    y = torch.sin(2 * x[:, 0]) + 0.5 * x[:, 1] ** 2 + 0.1 * torch.randn(600, generator=gen)
    out = {}
    for objective in ("alg3_literal", "collapsed"):
        fitted = zoo.get("rff_logitnormal").fit(
            x[:100], y[:100], steps=150, seed=0, method_options={"objective": objective})
        noise = float(fitted.model.observation_scale().detach()) * fitted.y_scaler.std.item()
        out[objective] = (noise, fitted.evaluate(x[100:], y[100:], num_samples=50)["ll"],
                          fitted.guide.relevance()[0])
    (noise_lit, ll_lit, _), (noise_col, ll_col, relevance) = out["alg3_literal"], out["collapsed"]
    assert noise_lit < 0.01 and 0.05 < noise_col < 0.2, out
    assert ll_col > ll_lit + 10, out
    assert relevance[:2].min() > relevance[2:].max(), relevance


def test_algorithm1_value_is_cokers_formula_by_hand():
    """Algorithm1ELBO's loss on a tiny fixed problem (float64, fixed parameters and seed)
    equals minus Coker's line 11 computed here from scratch: s_i = logistic(mu + sigma e),
    beta_i = m + chol(C) e' from the textbook conditional, then the average of
    log N(y; Phi(x; s_k) beta_i, sigma^2 I) over s_k = logistic(mu + sigma e_k), minus the
    KL of the underlying Normals."""
    n, d, k, p, sigma = 6, 2, 4, 3, 0.5  # constants exact in the float32 buffers
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = torch.randn(n, generator=gen, dtype=torch.float64)
    model = RandomFeatureRegression(d, k, noise_scale=sigma, prior_loc=0.25,
                                    prior_scale=1.5).double()
    guide = LogitNormalGuide(model).double()
    loc = torch.tensor([-0.7, 0.4], dtype=torch.float64)
    scale = torch.tensor([0.6, 0.2], dtype=torch.float64)
    guide.loc, guide.scale = loc, scale  # PyroModule stores the unconstrained values
    torch.testing.assert_close(guide.scale, scale)
    elbo = Algorithm1ELBO(num_particles=p, vectorize_particles=True, max_plate_nesting=1)
    pyro.set_rng_seed(11)
    loss = elbo.differentiable_loss(model, guide, x, y)

    pyro.set_rng_seed(11)
    e_i, e_beta, e_k = (torch.randn(d, dtype=torch.float64),
                        torch.randn(k, dtype=torch.float64),
                        torch.randn(p, d, dtype=torch.float64))
    w, b = model.frequencies.double(), model.phases.double()

    def features(s):
        return math.sqrt(2) * torch.cos(x @ torch.diag(s) @ w + b)

    phi = features(torch.sigmoid(loc + scale * e_i))
    sigma_beta2 = 1.0 / k  # prior_variance / K
    cov = torch.linalg.inv(phi.T @ phi / sigma**2 + torch.eye(k, dtype=torch.float64)
                           / sigma_beta2)
    beta = cov @ phi.T @ y / sigma**2 + torch.linalg.cholesky(cov) @ e_beta
    torch.testing.assert_close(elbo.beta, beta, rtol=1e-10, atol=1e-12)
    log_lik = [(-0.5 * math.log(2 * math.pi * sigma**2)
                - (y - features(torch.sigmoid(loc + scale * e)) @ beta) ** 2 / (2 * sigma**2)
                ).sum() for e in e_k]
    mu0, s0 = 0.25, 1.5
    kl = (torch.log(s0 / scale) + (scale**2 + (loc - mu0) ** 2) / (2 * s0**2) - 0.5).sum()
    literal_elbo = sum(log_lik) / p - kl
    torch.testing.assert_close(loss, -literal_elbo, rtol=1e-12, atol=1e-10)


def test_logit_normal_kl_and_mean_against_monte_carlo():
    p = LogitNormal(torch.tensor([0.3, -1.0], dtype=torch.float64),
                    torch.tensor([0.8, 1.5], dtype=torch.float64))
    q = LogitNormal(torch.tensor([0.0, 0.5], dtype=torch.float64),
                    torch.tensor([1.0, 0.6], dtype=torch.float64))
    torch.manual_seed(0)
    s = p.sample((200000,))
    log_ratio = p.log_prob(s) - q.log_prob(s)
    se = log_ratio.std(0) / math.sqrt(s.shape[0])
    kl = torch.distributions.kl_divergence(p, q)
    assert ((log_ratio.mean(0) - kl).abs() < 4 * se).all(), (log_ratio.mean(0), kl, se)
    assert ((s.mean(0) - p.mean).abs() < 4 * s.std(0) / math.sqrt(s.shape[0])).all()
    median = p.icdf(0.5)
    torch.testing.assert_close(median, torch.sigmoid(p.loc))
    assert (s.max() < 1) and (s.min() > 0)


@pytest.mark.parametrize("mass", [0.5, 0.9])
def test_relevance_is_the_mean_and_central_interval_of_q(mass):
    """``relevance(mass)`` gives E_q[s_d] and the bounds with q-mass (1 - mass)/2 and
    (1 + mass)/2 below them: against sigmoid(loc +- z scale), z the standard normal's
    (1 + mass)/2 quantile from scipy, and against the fractions of 100000 draws of q
    below each bound and the draws' mean (5 Monte Carlo standard errors)."""
    from scipy.stats import norm

    model = RandomFeatureRegression(3, 4).double()
    guide = LogitNormalGuide(model).double()
    loc = torch.tensor([-2.0, 0.3, 1.5], dtype=torch.float64)
    scale = torch.tensor([0.4, 1.0, 2.5], dtype=torch.float64)
    with torch.no_grad():
        guide.loc.copy_(loc)
    guide.scale = scale
    mean, lo, hi = guide.relevance(mass)
    z = norm.ppf((1 + mass) / 2)
    torch.testing.assert_close(lo, torch.sigmoid(loc - z * scale))
    torch.testing.assert_close(hi, torch.sigmoid(loc + z * scale))

    n = 100_000
    s = torch.sigmoid(loc + scale * torch.randn(n, 3, dtype=torch.float64))
    for bound, level in ((lo, (1 - mass) / 2), (hi, (1 + mass) / 2)):
        below = (s < bound).double().mean(0)
        assert ((below - level).abs() < 5 * math.sqrt(level * (1 - level) / n)).all(), \
            (below, level)
    assert ((s.mean(0) - mean).abs() < 5 * s.std(0) / math.sqrt(n)).all(), (s.mean(0), mean)


def test_algorithm1_holds_beta_for_inner_steps():
    model, guide, x, y = problem()
    elbo = Algorithm1ELBO.with_inner_steps(3)(num_particles=2, vectorize_particles=True)
    seen = []
    for _ in range(7):
        elbo.differentiable_loss(model, guide, x, y)
        seen.append(elbo.beta.clone())
    changed = [not torch.equal(a, b) for a, b in zip(seen, seen[1:])]
    assert changed == [False, False, True, False, False, True]
    assert elbo.inner_steps == 3 and Algorithm1ELBO.inner_steps == 10


def test_predictive_is_algorithm_2():
    """With q(s) nearly a point mass, the predictive mean is Phi(x*; s) E[beta | X, y, s]."""
    model, _, x, y = problem()
    narrow = LogitNormalGuide(model, init_loc=0.4, init_scale=1e-6).double()
    with pytest.raises(RuntimeError, match="training data"):
        predict(model, narrow, x, num_samples=2)
    narrow.condition_on(x, y)
    x_new = torch.linspace(-2, 2, 7, dtype=torch.float64)[:, None].expand(7, 3)
    pred = predict(model, narrow, x_new, num_samples=4000)
    s = torch.sigmoid(torch.full((3,), 0.4, dtype=torch.float64))
    post = model.conditional(x, y, s)
    phi_new = model.features(x_new, s)
    expected = phi_new @ post.loc
    sd = (phi_new @ post.scale_tril).norm(dim=-1)
    assert ((pred.mean - expected).abs() < 4 * sd / math.sqrt(4000)).all()
    torch.testing.assert_close(pred.loc.var(0), sd**2, rtol=0.15, atol=1e-6)


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="num_features"):
        RandomFeatureRegression(2, 0)
    with pytest.raises(ValueError, match="bandwidth"):
        RandomFeatureRegression(2, 5, bandwidth=-1.0)
    model = RandomFeatureRegression(2, 5)
    with pytest.raises(TypeError, match="model"):
        LogitNormalGuide(object())
    with pytest.raises(ValueError, match="init_loc"):
        LogitNormalGuide(RandomFeatureRegression(2, 5), init_loc=float("nan"))
    with pytest.raises(ValueError, match="x of shape"):
        model(torch.randn(4, 3))
    entry = zoo.get("rff_logitnormal")
    x, y = torch.randn(20, 2), torch.randn(20)
    with pytest.raises(ValueError, match="objective"):
        entry.fit(x, y, method_options={"objective": "alg2"}, steps=1)
    with pytest.raises(ValueError, match="batch_size"):
        entry.fit(x, y, method_options={"objective": "collapsed"}, steps=1,
                  batch_size=5)
    with pytest.raises(ValueError, match="inner_steps"):
        entry.fit(x, y, method_options={"objective": "alg1", "inner_steps": 0}, steps=1)

    def no_beta(x, y=None):
        pyro.sample("s", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match="conditional_site"):
        ExpectedLikelihoodELBO().differentiable_loss(no_beta, no_beta, x, y)


def test_learns_the_relevant_inputs():
    """Ten inputs, y depends on x_1 and x_2 only (noise 0.1, N = 500)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(500, 10, generator=gen)
    y = torch.sin(2 * x[:, 0]) + 0.5 * x[:, 1] ** 2 + 0.1 * torch.randn(500, generator=gen)
    fitted = zoo.get("rff_logitnormal").fit(x, y, steps=250,
                                            method_options={"objective": "collapsed"},
                                            model_options={"num_features": 50})
    mean, lo, hi = fitted.guide.relevance()
    assert mean[:2].min() > mean[2:].max(), mean
    assert (mean[2:] < 0.2).all(), mean
    assert ((lo <= mean) & (mean <= hi)).all()
    fig = plot_relevance(fitted.guide)
    assert len(fig.axes[0].patches) == 10


def test_objectives_agree_on_sine():
    """Algorithms 1 and 3 (ELBO and literal) and the collapsed ELBO: on 1000 points of one
    input, test log-likelihoods within 0.1 nats per point of each other, and near the
    noise's own (0.88 nats)."""
    d = data.load("sine")
    lls = {}
    for objective in OBJECTIVES:
        fitted = zoo.get("rff_logitnormal").fit(d.x_train, d.y_train, steps=250, seed=0,
                                                method_options={"objective": objective},
                                                model_options={"num_features": 50})
        lls[objective] = fitted.evaluate(d.x_test, d.y_test, num_samples=100)["ll"]
    assert max(lls.values()) - min(lls.values()) < 0.1, lls
    noise_ll = -0.5 * math.log(2 * math.pi * d.noise_scale**2) - 0.5
    assert min(lls.values()) > noise_ll - 0.2, lls


def test_svi_step_with_minibatches_for_algorithm_3():
    """Algorithm 3 accepts minibatches: the likelihood is rescaled, beta's conditional
    uses every point."""
    model, guide, x, y = problem()
    step = SVIStep(model, guide, x, y, lr=1e-2, batch_size=10, num_particles=2,
                   elbo=MeanFieldELBO)
    assert all(math.isfinite(step()) for _ in range(3))
    assert guide.x_train.shape[0] == x.shape[0]
    trace = poutine.trace(model).get_trace(x, y)
    assert {"s", "beta", "f", "obs"} <= set(trace.nodes)


def test_collapsed_fit_on_yacht(uci_data):
    """A short collapsed fit on UCI yacht beats a Gaussian fitted to the training targets."""
    d = data.load("uci/yacht", 0)
    fitted = zoo.get("rff_logitnormal").fit(d.x_train, d.y_train, steps=150,
                                            method_options={"objective": "collapsed"})
    baseline = torch.distributions.Normal(d.y_train.mean(), d.y_train.std()).log_prob(d.y_test)
    assert fitted.evaluate(d.x_test, d.y_test, num_samples=50)["ll"] > baseline.mean() + 1.0


def test_benchmark_script_runs(tmp_path):
    out = tmp_path / "rff"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rff.py"), "--datasets", "sine",
                    "--splits", "1", "--steps", "20", "--num-features", "20",
                    "--variance-samples", "4", "--num-samples", "20", "--out", str(out)],
                   check=True, capture_output=True, env={**os.environ, "MPLBACKEND": "Agg"})
    table = (out / "rff.md").read_text()
    assert "alg3" in table and "collapsed" in table
    header, *lines = (out / "rff.csv").read_text().splitlines()
    rows = [dict(zip(header.split(","), line.split(","))) for line in lines]
    assert [r["objective"] for r in rows] == list(OBJECTIVES)
    assert all(math.isfinite(float(r[k])) for r in rows
               for k in ("ll", "rmse", "fit_seconds", "elbo_var", "grad_var"))
    assert (out / "rff.png").stat().st_size > 0
