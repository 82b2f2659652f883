"""SWAG (Maddox et al. 2019): the stored moments are those of the collected iterates, the
guide's draws have the SWAG covariance within Monte Carlo error, and MultiSWAG predicts the
equal mixture of its members."""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro import poutine

from bnn_zoo import data, zoo
from bnn_zoo._core.elbo import MeanFieldELBO
from bnn_zoo.guides._swag import SWAGGuide
from bnn_zoo.methods import _swag as swag_module
from bnn_zoo.methods._svi import SVI
from bnn_zoo.methods._swag import SWAG, SWAGMoments
from bnn_zoo.zoo._defaults import map_guide


def direct_moments(iterates: torch.Tensor, rank: int):
    """Mean, diagonal variance and deviation matrix of the iterates (T, P), computed from
    all of them at once: column ``i`` of D is ``theta_i - mean(theta_1..theta_i)``."""
    mean = iterates.mean(0)
    variance = (iterates * iterates).mean(0) - mean * mean
    t = iterates.shape[0]
    deviations = torch.stack([iterates[i] - iterates[:i + 1].mean(0)
                              for i in range(t - rank, t)], dim=1)
    return mean, variance, deviations


def test_running_moments_equal_those_of_the_iterates():
    iterates = torch.randn(9, 5, dtype=torch.float64) * 2 + 1
    moments = SWAGMoments(rank=4)
    for theta in iterates:
        moments.update(theta)
    for got, expected in zip((moments.mean, moments.variance, moments.deviations),
                             direct_moments(iterates, 4)):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_a_fit_stores_the_moments_of_the_iterates_it_collects(monkeypatch):
    collected = []
    flat_point = swag_module._flat_point

    def spy(*args):
        collected.append(flat_point(*args))
        return collected[-1]

    monkeypatch.setattr(swag_module, "_flat_point", spy)
    d = data.load("sine")
    x, y = d.x_train[:40].double(), d.y_train[:40].double()
    fitted = zoo.get("swag").fit(x, y, steps=20, method_options={"rank": 3, "snapshots": 6},
                                 batch_size=16)
    guide = fitted.guide
    assert len(collected) == 6 and isinstance(guide, SWAGGuide)
    iterates = torch.stack(collected)
    assert bool((iterates[1:] != iterates[:-1]).any(1).all())  # every snapshot moved
    for got, expected in zip((guide.mean, guide.variance, guide.deviations),
                             direct_moments(iterates, 3)):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert fitted.result.steps == 20 + 6 * 3  # an epoch of 40 points in batches of 16


def test_draws_have_the_swag_covariance_within_monte_carlo_error():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(4, generator=g, dtype=torch.float64)
    variance = torch.rand(4, generator=g, dtype=torch.float64) + 0.1
    deviations = torch.randn(4, 3, generator=g, dtype=torch.float64)
    guide = SWAGGuide([("a", (2,)), ("b", (2, 1))], mean, variance, deviations)
    draws = 20000
    with pyro.plate("samples", draws, dim=-1):
        trace = poutine.trace(guide).get_trace(None)
    theta = torch.cat([trace.nodes["a"]["value"], trace.nodes["b"]["value"].squeeze(-1)], -1)
    cov = 0.5 * (torch.diag(variance) + deviations @ deviations.T / 2)
    sd = cov.diagonal().sqrt()
    assert bool(((theta.mean(0) - mean).abs() < 5 * sd / draws**0.5).all())
    # the standard error of a Gaussian sample covariance: sqrt((C_ii C_jj + C_ij^2) / S)
    error = ((sd[:, None] * sd[None, :]) ** 2 + cov**2).div(draws).sqrt()
    assert bool(((theta.T.cov() - cov).abs() < 5 * error).all()), (theta.T.cov(), cov)


def test_bad_rank_is_named():
    start = SVI(map_guide, elbo=MeanFieldELBO)
    with pytest.raises(ValueError, match="rank"):
        SWAG(start=start, rank=1)
    with pytest.raises(ValueError, match="rank"):
        SWAG(start=start, rank=5, snapshots=4)


def test_multiswag_predicts_the_equal_mixture_of_its_members():
    d = data.load("two_moons")
    x, y = d.x_train[:30].double(), d.y_train[:30]
    entry = zoo.get("multiswag")
    fitted = entry.fit(x, y, **entry.tiny)
    members = fitted.posterior.members
    assert len(members) == 2
    xs = fitted.x_scaler.transform(d.x_test[:5].double())
    pyro.set_rng_seed(1)
    pred = fitted.posterior.predict(xs, num_samples=10)
    pyro.set_rng_seed(1)
    each = [m.predict(xs, 2).mean for m in members]
    assert pred.probs.shape[0] == 4
    torch.testing.assert_close(pred.mean, sum(each) / 2)
