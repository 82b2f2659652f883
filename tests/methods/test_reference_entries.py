"""The reference entries of the comparison: ``nuts`` against the closed-form posterior
of Bayesian linear regression, ``ensemble`` as a mixture of its members, and the
``lowrank`` and ``iaf`` autoguides."""

from __future__ import annotations

import math

import pyro
import pytest
import torch

from bnn_zoo import data, zoo
from bnn_zoo._core.predictive import GaussianMixturePredictive
from bnn_zoo.methods._ensemble import mixture
from bnn_zoo.methods._nuts import PosteriorSamples


def linear_data(n: int = 20):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 1, generator=g, dtype=torch.float64)
    y = 0.5 * x[:, 0] + 0.3 + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    return x, y


def test_nuts_matches_closed_form_linear_regression_posterior():
    """A linear "net" (no hidden layer) with prior N(0, I) and the noise NUTS fixed from
    its MAP start: the posterior predictive is Gaussian with

        A = I + Phi^T Phi / sigma^2,  mu = A^-1 Phi^T y / sigma^2,
        mean(x*) = phi*^T mu,  var(x*) = sigma^2 + phi*^T A^-1 phi*

    in standardised units. NUTS must match it within 5 Monte Carlo standard errors
    (computed from its own effective sample size), and converge (R-hat < 1.1)."""
    x, y = linear_data()
    fitted = zoo.get("nuts").fit(x, y, steps=300, model_options={"hidden": ()},
                                 method_options={"warmup": 200, "samples": 300, "chains": 2,
                                                 "max_tree_depth": 4})
    diag = fitted.diagnostics
    assert diag["r_hat_max"] < 1.1 and diag["r_hat_f_max"] < 1.1
    assert diag["ess_min"] > 50 and diag["ess_f_min"] > 50
    sigma = diag["noise_scale"]
    xs, ys = fitted.x_scaler.transform(x), fitted.y_scaler.transform(y)
    phi = torch.cat([xs, torch.ones_like(xs)], 1)
    precision = torch.eye(2, dtype=x.dtype) + phi.T @ phi / sigma**2
    cov = torch.linalg.inv(precision)
    mu = cov @ phi.T @ ys / sigma**2
    x_test = torch.linspace(-2, 2, 5, dtype=x.dtype).unsqueeze(-1)
    phi_t = torch.cat([fitted.x_scaler.transform(x_test), torch.ones_like(x_test)], 1)
    var_f = ((phi_t @ cov) * phi_t).sum(-1)
    y_std = float(fitted.y_scaler.std)
    mean = (phi_t @ mu) * y_std + fitted.y_scaler.mean
    std = (sigma**2 + var_f).sqrt() * y_std
    pred = fitted.predict(x_test, num_samples=600)
    ess = diag["ess_min"]
    tol_mean = 5 * var_f.sqrt() * y_std / math.sqrt(ess)
    # Var of a sample variance: ~ 2 var_f^2 / ess; through std = sqrt(.) halves it.
    tol_std = 5 * var_f * math.sqrt(2 / ess) / (2 * (sigma**2 + var_f).sqrt()) * y_std
    assert torch.all((pred.mean - mean).abs() < tol_mean), (pred.mean, mean, tol_mean)
    assert torch.all((pred.stddev - std).abs() < tol_std + 1e-3), (pred.stddev, std)


def test_posterior_samples_spreads_draws_evenly():
    samples = {"w": torch.arange(10.0).reshape(10, 1)}
    guide = PosteriorSamples(samples).draws(4)
    import pyro
    from pyro import poutine

    with pyro.plate("_predictive_samples", 4, dim=-2):
        trace = poutine.trace(guide).get_trace(torch.zeros(3, 1))
    assert trace.nodes["w"]["value"].reshape(-1).tolist() == [0.0, 3.0, 6.0, 9.0]


def test_nuts_options_are_checked():
    x, y = linear_data()
    with pytest.raises(ValueError, match="budget option 'no_such_option'"):
        zoo.get("nuts").fit(x, y, no_such_option=1)
    with pytest.raises(ValueError, match="method_options 'hidden'.*max_tree_depth"):
        zoo.get("nuts").fit(x, y, method_options={"hidden": (3,)})
    with pytest.raises(ValueError, match="warmup"):
        zoo.get("nuts").fit(x, y, method_options={"warmup": 0})
    with pytest.raises(zoo.UnsupportedProblem, match="max_points"):
        zoo.get("nuts").fit(x, y, method_options={"max_points": 5})


def test_ensemble_is_the_equal_mixture_of_its_members():
    a = GaussianMixturePredictive(torch.zeros(1, 3), torch.ones(1, 3))
    b = GaussianMixturePredictive(torch.full((1, 3), 2.0), torch.ones(1, 3))
    both = mixture([a, b])
    assert torch.allclose(both.mean, torch.ones(3))
    assert torch.allclose(both.variance, torch.full((3,), 2.0))  # 1 + var{0, 2}
    y = torch.tensor([0.0, 1.0, 2.0])
    expected = torch.logsumexp(torch.stack([a.log_prob(y), b.log_prob(y)]), 0) - math.log(2)
    assert torch.allclose(both.log_prob(y), expected)

    d = data.load("sine")
    fitted = zoo.get("ensemble").fit(d.x_train, d.y_train, steps=20, method_options={"members": 3})
    pred = fitted.predict(d.x_test, num_samples=50)
    assert pred.loc.shape == (3, d.x_test.shape[0])
    assert not torch.allclose(pred.loc[0], pred.loc[1])  # members differ by their seed
    assert fitted.result.steps == 60


@pytest.mark.parametrize("name", ["lowrank", "iaf"])
def test_structured_guides_fit_and_start_narrow(name):
    d = data.load("sine")
    fitted = zoo.get(name).fit(d.x_train, d.y_train, steps=30)
    out = fitted.evaluate(d.x_test, d.y_test, num_samples=50)
    assert all(math.isfinite(v) for v in out.values())
    # a fresh guide's weight samples spread like its initial scale, far below the prior's 1
    model = zoo.get(name).model(1, 1)
    guide = zoo.get(name).guide(model)
    with torch.no_grad():
        draws = torch.stack([guide(d.x_train[:5])["layers.0.weight"] for _ in range(200)])
    assert float(draws.std(0).max()) < 0.3


def test_elementwise_affine_inverse_and_log_det_match_autograd():
    from bnn_zoo.guides._flow import ElementwiseAffine

    t = ElementwiseAffine(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), 0.3)
    with torch.no_grad():
        t.log_scale.copy_(torch.tensor([0.1, -0.7, 0.4], dtype=torch.float64))
    x = torch.randn(3, dtype=torch.float64)
    y = t(x)
    torch.testing.assert_close(t.inv(y.detach().clone()), x)
    jac = torch.autograd.functional.jacobian(lambda v: t(v), x)
    torch.testing.assert_close(t.log_abs_det_jacobian(x, y), torch.logdet(jac))


@pytest.mark.parametrize("like", [torch.zeros((), dtype=torch.float64),
                                  torch.zeros((), device="meta")], ids=["float64", "meta"])
def test_iaf_flow_follows_the_device_and_dtype_of_the_model(like):
    """Model and guide moved to the data's device and dtype before the first call (as a fit
    builds them): every parameter and buffer of the flow, built on that call, follows.
    The ``meta`` device stands in for a GPU (it cannot be validated, hence validation off)."""
    model = zoo.get("iaf").model(1, 1).to(like)
    guide = zoo.get("iaf").guide(model).to(like)
    x = torch.zeros(5, 1, dtype=like.dtype, device=like.device)
    with pyro.validation_enabled(False):
        draw = guide(x)["layers.0.weight"]
    tensors = dict(guide.named_parameters()) | dict(guide.named_buffers())
    assert any(name.startswith("transform.0.") for name in tensors)
    for name, t in tensors.items():
        assert t.device == like.device, name
        assert not t.is_floating_point() or t.dtype == like.dtype, name
    assert draw.device == like.device and draw.dtype == like.dtype


def test_iaf_starts_around_the_fan_in_point():
    """The shifted flow's initial mean is the guide's packed init values, its spread ~0.01."""
    pyro.set_rng_seed(3)
    d = data.load("sine")
    model = zoo.get("iaf").model(1, 1)
    guide = zoo.get("iaf").guide(model)
    with torch.no_grad():
        draws = torch.stack([guide(d.x_train[:5])["layers.1.weight"] for _ in range(400)])
    init = guide._init_loc()
    start = guide.transform.parts[-1].loc
    torch.testing.assert_close(start, init)
    spread = float(draws.std(0).mean())
    assert 0.003 < spread < 0.03
