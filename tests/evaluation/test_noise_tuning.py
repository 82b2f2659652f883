"""Observation noise tuned on held-out training data (bnn_zoo.evaluation._noise_tuning,
Entry.fit(..., validation=...))."""

from __future__ import annotations

import math

import pytest
import torch
from pyro import poutine

from bnn_zoo import zoo
from bnn_zoo._core.data import holdout
from bnn_zoo._harness import compare
from bnn_zoo.evaluation._noise_tuning import validated_noise_scale, with_noise_scale


def test_one_component_optimum_is_the_rms_residual():
    """For ``S = 1`` the mean log-likelihood ``-log sigma - r^2 / (2 sigma^2)`` peaks at the
    root-mean-square residual ``r``."""
    torch.manual_seed(0)
    loc = torch.randn(1, 50, dtype=torch.float64)
    y = loc[0] + 0.3 * torch.randn(50, dtype=torch.float64)
    rms = float((y - loc[0]).pow(2).mean().sqrt())
    assert validated_noise_scale(loc, y) == pytest.approx(rms, rel=1e-6)


def test_mixture_optimum_matches_a_fine_grid():
    """With spread-out components the optimum lies below the RMS residual of the mean; the
    golden-section result agrees with a dense grid on ``log sigma``."""
    torch.manual_seed(1)
    loc = torch.randn(20, 1, dtype=torch.float64) * 0.5 + torch.randn(1, 30, dtype=torch.float64)
    y = torch.randn(30, dtype=torch.float64)
    best = validated_noise_scale(loc, y)
    grid = torch.logspace(-3, 1, 4001, dtype=torch.float64)
    lls = torch.stack([(torch.distributions.Normal(loc, s).log_prob(y).logsumexp(0)
                        - math.log(20)).mean() for s in grid])
    # neighbouring grid points differ by a factor 10^(4/4000) = 1.0023
    assert best == pytest.approx(float(grid[lls.argmax()]), rel=3e-3)


def test_noise_search_stays_in_its_interval():
    loc = torch.zeros(3, 4)
    assert validated_noise_scale(loc, torch.zeros(4), lower=1e-3) == pytest.approx(1e-3)
    assert validated_noise_scale(loc, torch.full((4,), 1e4), upper=10.0) == pytest.approx(10.0)


def test_holdout_is_a_seeded_partition():
    x = torch.arange(20.0).reshape(10, 2)
    y = torch.arange(10.0)
    x_fit, y_fit, x_val, y_val = holdout(x, y, 0.3, seed=4)
    assert len(y_val) == 3 and len(y_fit) == 7
    assert sorted(torch.cat([y_fit, y_val]).tolist()) == y.tolist()
    torch.testing.assert_close(x_val[:, 1], 2 * y_val + 1)
    again = holdout(x, y, 0.3, seed=4)
    torch.testing.assert_close(again[3], y_val)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_holdout_rejects_a_fraction_outside_the_unit_interval(fraction):
    with pytest.raises(ValueError, match="validation fraction"):
        holdout(torch.zeros(5, 1), torch.zeros(5), fraction, seed=0)


def test_with_noise_scale_keeps_the_means():
    from bnn_zoo._core.predictive import GaussianMixturePredictive

    pred = with_noise_scale(GaussianMixturePredictive(torch.ones(2, 3), torch.ones(2, 3)), 0.5)
    torch.testing.assert_close(pred.loc, torch.ones(2, 3))
    torch.testing.assert_close(pred.scale, torch.full((2, 3), 0.5))


def test_entry_predicts_with_the_validated_noise():
    """``validation > 0``: the predictive's noise is the held-out optimum, reported in the
    diagnostics in standardised units and scaled back with ``y``."""
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 80).unsqueeze(-1)
    y = torch.sin(2 * x[:, 0]) + 0.2 * torch.randn(80)
    fitted = zoo.get("map").fit(x, y, steps=300, seed=0, validation=0.25)
    sigma = fitted.diagnostics["validated_noise_scale"]
    pred = fitted.predict(x, num_samples=2)
    torch.testing.assert_close(pred.scale, torch.full_like(pred.scale, sigma * float(y.std(
        unbiased=False))))
    learned = zoo.get("map").fit(x, y, steps=300, seed=0, validation=0.0)
    assert "validated_noise_scale" not in learned.diagnostics
    # the Pyro pair predicts with the same noise: the likelihood at obs has scale sigma
    xs = fitted.x_scaler.transform(x)
    guide_trace = poutine.trace(fitted.guide).get_trace(xs)
    trace = poutine.trace(poutine.replay(fitted.model, guide_trace)).get_trace(xs)
    torch.testing.assert_close(trace.nodes["obs"]["fn"].scale, torch.full((80,), sigma))


def test_classification_ignores_validation():
    x = torch.randn(30, 2)
    y = (x[:, 0] > 0).long()
    fitted = zoo.get("map").fit(x, y, steps=5, seed=0, validation=0.2)
    assert "validated_noise_scale" not in fitted.diagnostics


def test_entry_without_a_single_noise_scale_refuses_validation():
    x = torch.randn(20, 1)
    with pytest.raises(ValueError, match="no single noise scale"):
        zoo.get("laplace").fit(x, x[:, 0], steps=2, validation=0.1)


def test_uci_protocol_tunes_the_noise_of_tunable_entries_only():
    protocol_overrides = compare.protocol_overrides  # benchmarks/uci.py's, via data_overrides
    for_entry = protocol_overrides({"steps": 5}, 0.1)
    assert for_entry("bbb") == {"steps": 5, "validation": 0.1}
    assert for_entry("laplace") == {"steps": 5}
    assert protocol_overrides({}, 0.0)("mean_field") == {}
