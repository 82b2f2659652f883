"""Laplace for regression with D outputs (a noise precision per output) and for the
heteroscedastic model, in float64: against closed-form Bayesian linear regression per
output (Bishop 2006, PRML 3.3 and 3.5), against a stationary point of the evidence, against
``J^T Fisher J`` by autograd, and the entries end to end."""

from __future__ import annotations

import math
from dataclasses import replace

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from bnn_zoo import zoo
from bnn_zoo.evaluation._metrics import regression_metrics
from bnn_zoo.methods.laplace._curvature import (
    energy_and_gradient,
    ggn,
    kron_ggn,
)
from bnn_zoo.methods.laplace._evidence import EvidenceSettings, fixed_point_update
from bnn_zoo.methods.laplace._layouts import layout_of
from bnn_zoo.methods.laplace._problem import CurvatureSettings, laplace_posterior
from bnn_zoo.models import BayesianMLP
from bnn_zoo.models._likelihood import Heteroscedastic, heteroscedastic_scale
from bnn_zoo.models._priors import GaussianPrior

ALPHA, BETA = 2.0, torch.tensor([4.0, 0.5, 9.0])
HETERO = Heteroscedastic()


def linear_problem(n: int = 25, d_in: int = 3):
    """A linear model (no hidden layer) with D = 3 outputs, its data and design [x, 1]."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, d_in, generator=gen, dtype=torch.float64)
    y = x @ torch.randn(d_in, 3, generator=gen, dtype=torch.float64) \
        + 0.3 * torch.randn(n, 3, generator=gen, dtype=torch.float64)
    model = BayesianMLP(d_in, 3, (), prior=GaussianPrior(ALPHA**-0.5),
                        noise_scale=1.0).double()
    return model, x, y, torch.cat([x, torch.ones(n, 1, dtype=x.dtype)], 1)


def closed_form(design, y, beta):
    """Per output ``d``: ``A_d = alpha I + beta_d X^T X``, the mean ``beta_d A_d^-1 X^T y_d``
    and ``log N(y_d; 0, X X^T / alpha + I / beta_d)`` (PRML 3.53-3.54, 3.86)."""
    eye = torch.eye(design.shape[1], dtype=design.dtype)
    precisions = [ALPHA * eye + b * design.T @ design for b in beta]
    means = [b * torch.linalg.solve(a, design.T @ y[:, d])
             for d, (a, b) in enumerate(zip(precisions, beta))]
    evidence = sum(dist.MultivariateNormal(
        torch.zeros(len(y), dtype=y.dtype),
        design @ design.T / ALPHA + torch.eye(len(y), dtype=y.dtype) / b).log_prob(y[:, d])
        for d, b in enumerate(beta))
    return precisions, means, evidence


@pytest.mark.parametrize("curvature", ["ggn", "hessian", "kron", "last_layer"])
def test_linear_model_is_bayesian_linear_regression_per_output(curvature):
    model, x, y, design = linear_problem()
    post = laplace_posterior(model, torch.zeros(12, dtype=torch.float64), x, y,
                             curvature=CurvatureSettings(curvature), alpha=ALPHA,
                             beta=BETA.double())
    precisions, means, evidence = closed_form(design, y, BETA.double())
    theta, cov = post.theta.reshape(4, 3), post.covariance().reshape(4, 3, 4, 3)
    for d in range(3):
        torch.testing.assert_close(theta[:, d], means[d])
        torch.testing.assert_close(cov[:, d, :, d], torch.linalg.inv(precisions[d]))
        for other in set(range(3)) - {d}:  # outputs independent a posteriori
            assert float(cov[:, d, :, other].abs().max()) < 1e-12
    torch.testing.assert_close(post.log_evidence(), evidence)
    x_new = torch.randn(4, 3, dtype=torch.float64)
    pred = post.glm_predictive(x_new)
    new = torch.cat([x_new, torch.ones(4, 1, dtype=x.dtype)], 1)
    for d in range(3):
        variance = 1 / BETA[d] + (new @ torch.linalg.inv(precisions[d]) * new).sum(-1)
        torch.testing.assert_close(pred.loc[0, :, d], new @ means[d])
        torch.testing.assert_close(pred.scale[0, :, d] ** 2, variance.double())


def test_multi_output_log_likelihood_sums_the_outputs():
    model, x, y, _ = linear_problem()
    theta = torch.randn(12, dtype=torch.float64)
    values = layout_of(model).unflatten(theta)
    trace = poutine.trace(poutine.condition(model, data=values)).get_trace(x, y)
    f = layout_of(model).output(theta, x)
    expected = dist.Normal(f, 1.0).log_prob(y).sum()
    torch.testing.assert_close(trace.nodes["obs"]["fn"].log_prob(y).sum(), expected)
    pred = laplace_posterior(model, theta, x, y, alpha=ALPHA,
                             evidence=EvidenceSettings(refine=False)).glm_predictive(x)
    out = regression_metrics(pred, y)
    manual = dist.Normal(pred.loc[0], pred.scale[0]).log_prob(y).sum(-1).mean()
    assert out["ll"] == pytest.approx(float(manual))
    assert out["rmse"] == pytest.approx(float(((pred.loc[0] - y) ** 2).mean().sqrt()))


def small_net_posterior(curvature: str):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 2, generator=gen, dtype=torch.float64)
    y = torch.stack([x[:, 0].sin(), 0.1 * x[:, 1]], 1) \
        + 0.2 * torch.randn(40, 2, generator=gen, dtype=torch.float64)
    model = BayesianMLP(2, 2, (6,), activation="tanh").double()
    theta = 0.5 * torch.randn(layout_of(model).num_parameters, generator=gen,
                              dtype=torch.float64)
    return laplace_posterior(model, theta, x, y, curvature=CurvatureSettings(curvature),
                             evidence=EvidenceSettings(refine=False), alpha=1.0,
                             beta=torch.tensor([1.0, 1.0], dtype=torch.float64))


@pytest.mark.parametrize("curvature", ["ggn", "diag", "kron", "last_layer"])
def test_fixed_point_of_each_beta_is_a_stationary_point_of_the_evidence(curvature):
    post = small_net_posterior(curvature)
    for _ in range(200):  # MacKay's update of beta alone, alpha fixed
        post = replace(post, beta=fixed_point_update(post, per_layer=False)[1])
    log_beta = post.beta.log().requires_grad_()
    grad, = torch.autograd.grad(post.log_evidence(beta=log_beta.exp()), log_beta)
    assert float(grad.abs().max()) < 1e-8
    assert not torch.allclose(post.beta[0], post.beta[1])  # one precision per output
    gamma = post.output_effective_parameters()
    torch.testing.assert_close(gamma.sum(), post.effective_parameters(per_layer=False))


def hetero_problem():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(12, 2, generator=gen, dtype=torch.float64)
    y = x[:, 0] + 0.3 * torch.randn(12, generator=gen, dtype=torch.float64)
    model = BayesianMLP(2, 1, (4,), activation="tanh", noise="heteroscedastic").double()
    layout = layout_of(model)
    theta = 0.7 * torch.randn(layout.num_parameters, generator=gen, dtype=torch.float64)
    return model, layout, theta, x, y


def test_heteroscedastic_ggn_is_jacobian_fisher_jacobian():
    model, layout, theta, x, y = hetero_problem()
    f = layout.output(theta, x)
    jac = torch.func.jacrev(lambda t: layout.output(t, x))(theta)  # (N, 2, P)
    sigma = heteroscedastic_scale(f[:, 1])
    fisher = torch.stack([1 / sigma**2, 2 * torch.sigmoid(f[:, 1]) ** 2 / sigma**2], -1)
    expected = torch.einsum("nkp,nk,nkq->pq", jac, fisher, jac)
    torch.testing.assert_close(ggn(theta, x, y, layout, HETERO), expected)
    # The Fisher is the expected Hessian of the negative log-likelihood in (mu, s).
    eps = torch.randn(200000, 1, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    draws = f[:, 0] + sigma * eps
    hess = torch.func.vmap(torch.func.jacrev(torch.func.jacrev(
        lambda g, t: HETERO.negative_log_likelihood(g[None], t[None]))),
        in_dims=(None, 0))
    mean = torch.stack([hess(f[n], draws[:, n]).mean(0) for n in range(3)])
    torch.testing.assert_close(mean.diagonal(dim1=-2, dim2=-1), fisher[:3], atol=2e-2,
                               rtol=2e-2)
    q, g = kron_ggn(theta, x, y, layout, HETERO)[-1]
    assert g.shape == (2, 2)  # the output-side factor of the two heads


def test_heteroscedastic_energy_is_the_models_negative_log_likelihood():
    model, layout, theta, x, y = hetero_problem()
    trace = poutine.trace(poutine.condition(model, data=layout.unflatten(theta))).get_trace(x, y)
    nll = -trace.nodes["obs"]["fn"].log_prob(y).sum()
    f = layout.output(theta, x)
    energy = HETERO.negative_log_likelihood(f, y)
    torch.testing.assert_close(energy + 0.5 * len(y) * math.log(2 * math.pi), nll)
    g = f.detach().requires_grad_()
    auto, = torch.autograd.grad(HETERO.negative_log_likelihood(g, y), g)
    torch.testing.assert_close(HETERO.output_gradient(f, y), auto)
    grad = energy_and_gradient(theta, x, y, layout, HETERO)[1]
    auto = torch.func.grad(lambda t: HETERO.negative_log_likelihood(
        layout.output(t, x), y))(theta)
    torch.testing.assert_close(grad, auto)


def test_heteroscedastic_posterior_evidence_and_predictive():
    model, layout, theta, x, y = hetero_problem()
    post = laplace_posterior(model, theta, x, y, alpha=1.0,
                             evidence=EvidenceSettings(refine=False))
    assert float(post.beta) == 1.0
    f = layout.output(theta, x)
    energy = HETERO.negative_log_likelihood(f, y)
    a = post.alpha_vector()
    precision = torch.diag(a) + ggn(theta, x, y, layout, HETERO)
    expected = -energy - 0.5 * (a * theta**2).sum() + 0.5 * a.log().sum() \
        - 0.5 * torch.logdet(precision) - 0.5 * len(y) * math.log(2 * math.pi)
    torch.testing.assert_close(post.log_evidence(), expected)
    pred = post.glm_predictive(x)
    jac = torch.func.jacrev(lambda t: layout.output(t, x))(theta)[:, 0]
    variance = heteroscedastic_scale(f[:, 1]) ** 2 \
        + (jac @ torch.linalg.inv(precision) * jac).sum(-1)
    torch.testing.assert_close(pred.loc[0], f[:, 0])
    torch.testing.assert_close(pred.scale[0] ** 2, variance)


def two_output_data():
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(60, 1, generator=gen, dtype=torch.float64) * 6 - 3
    noise = torch.randn(60, 2, generator=gen, dtype=torch.float64)
    return x, torch.cat([x.sin() + 0.05 * noise[:, :1], 10 * x.cos() + 3 + 5 * noise[:, 1:]], 1)


@pytest.mark.parametrize("name", ["laplace", "laplace_kron", "laplace_diag"])
@pytest.mark.parametrize("problem", ["outputs", "heteroscedastic"])
def test_entries_fit_predict_evaluate_save_and_load(name, problem, tmp_path):
    x, y = two_output_data()
    options = {}
    if problem == "heteroscedastic":
        y, options = y[:, 1] * (1 + x[:, 0].abs()), {"noise": "heteroscedastic"}
    entry = zoo.get(name)
    pyro.set_rng_seed(0)
    fitted = entry.fit(x[:45], y[:45], model_options=options, steps=300, batch_size=None)
    pred = fitted.predict(x[45:])
    assert pred.mean.shape == y[45:].shape
    metrics = fitted.evaluate(x[45:], y[45:])
    assert math.isfinite(metrics["ll"]) and metrics["rmse"] < float(y.std())
    if problem == "outputs":
        betas = [fitted.diagnostics[f"beta_{d}"] for d in range(2)]
        assert betas[0] > betas[1]  # the first output is the less noisy, standardised
    fitted.save(tmp_path / "fit.pt")
    loaded = zoo.load(tmp_path / "fit.pt")
    torch.testing.assert_close(loaded.predict(x[45:]).mean, pred.mean)
    torch.testing.assert_close(loaded.predict(x[45:]).stddev, pred.stddev)
