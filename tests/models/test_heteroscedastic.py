"""The heteroscedastic Gaussian likelihood of BayesianMLP and the ``deep_ensemble`` entry
(Lakshminarayanan et al. 2017): each point's noise ``sigma(x) = softplus(s(x)) + 1e-3``."""

from __future__ import annotations

import pyro
import pyro.poutine as poutine
import pytest
import torch
import torch.nn.functional as F

from bnn_zoo import zoo
from bnn_zoo._core.nn import mlp_forward
from bnn_zoo._core.predictive import predict
from bnn_zoo.models import BayesianMLP
from bnn_zoo.models._likelihood import MIN_SCALE


def test_log_likelihood_is_the_gaussian_with_each_points_scale():
    torch.set_default_dtype(torch.float64)
    try:
        model = BayesianMLP(3, 1, (4,), noise="heteroscedastic")
        x, y = torch.randn(7, 3), torch.randn(7)
        trace = poutine.trace(model).get_trace(x, y)
        params = [(trace.nodes[f"layers.{i}.weight"]["value"],
                   trace.nodes[f"layers.{i}.bias"]["value"]) for i in range(2)]
        out = mlp_forward(x, params, model.act)
        assert out.shape == (7, 2)
        sigma = F.softplus(out[:, 1]) + MIN_SCALE
        expected = torch.distributions.Normal(out[:, 0], sigma).log_prob(y).sum()
        torch.testing.assert_close(trace.nodes["obs"]["fn"].log_prob(y).sum(), expected)
        torch.testing.assert_close(trace.nodes["noise_scale"]["value"], sigma)
        assert trace.nodes["f"]["value"].shape == (7, 1)
    finally:
        torch.set_default_dtype(torch.float32)


def test_bad_heteroscedastic_options_are_refused():
    with pytest.raises(ValueError, match="noise"):
        BayesianMLP(3, 1, noise="per_point")
    with pytest.raises(ValueError, match="heteroscedastic"):
        BayesianMLP(3, 2, task="classification", noise="heteroscedastic")
    with pytest.raises(ValueError, match="heteroscedastic"):
        BayesianMLP(3, 1, noise_scale=0.1, noise="heteroscedastic")
    with pytest.raises(ValueError, match="heteroscedastic"):
        BayesianMLP(3, 1, noise="heteroscedastic").observation_scale()
    x, y = torch.randn(20, 2), torch.randn(20)
    with pytest.raises(ValueError, match="validation"):
        zoo.get("map").fit(x, y, validation=0.1, model_options={"noise": "heteroscedastic"})
    with pytest.raises(ValueError, match="validation"):
        zoo.get("deep_ensemble").fit(x, y, validation=0.1)


def test_deep_ensemble_learns_noise_that_grows_with_the_input():
    # y = x + sigma(x) eps with sigma(x) = 0.1 + 0.4 (x + 1), from 0.1 at x = -1 to 0.9 at
    # x = 1. A scale estimated from n points has a relative standard error 1/sqrt(2n); a
    # window of +-0.1 around a test input holds ~40 of the 400 points (11%), so the learned
    # scale should be within 30% (under 3 standard errors) of the truth at each input,
    # while one shared scale (0.5) would be off by a factor 2 at x = -0.8 and x = 0.8.
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(400, 1, generator=generator) * 2 - 1
    truth = lambda t: 0.1 + 0.4 * (t + 1)  # noqa: E731
    y = x[:, 0] + truth(x[:, 0]) * torch.randn(400, generator=generator)
    fitted = zoo.get("deep_ensemble").fit(x, y, steps=1500)
    inputs = torch.tensor([-0.8, 0.0, 0.8])
    std = fitted.predict(inputs[:, None]).stddev
    torch.testing.assert_close(std, truth(inputs), rtol=0.3, atol=0.0)


def test_heteroscedastic_model_is_a_pyro_model():
    # Plain Pyro SVI and Predictive on the model with an autoguide, as the README shows.
    model = BayesianMLP(1, 1, (8,), noise="heteroscedastic")
    guide = pyro.infer.autoguide.AutoNormal(model, init_scale=0.01)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), pyro.infer.Trace_ELBO())
    x, y = torch.randn(30, 1), torch.randn(30)
    losses = [svi.step(x, y) for _ in range(5)]
    assert all(torch.isfinite(torch.tensor(losses)))
    samples = pyro.infer.Predictive(model, guide=guide, num_samples=4)(x)
    assert samples["noise_scale"].shape == (4, 30) and bool((samples["noise_scale"] > 0).all())
    assert predict(model, guide, x, num_samples=4).scale.shape == (4, 30)
