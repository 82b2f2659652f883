"""Laplace fits as replicas (``Laplace.fit_many``, issue 16): the MAP phases of R fits in
one vectorised pass equal R separate MAP phases, the posteriors built on them predict as
``fit``'s do, a user's network falls back to one by one, and the posterior's full-batch
refit reaches the optimum."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from torch import nn

from bnn_zoo import zoo
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods.laplace import Laplace, LaplaceGuide
from bnn_zoo.methods.laplace._curvature import ParameterLayout
from bnn_zoo.methods.laplace._problem import refine_map
from bnn_zoo.models import BayesianMLP, BayesianModule
from bnn_zoo.models._likelihood import Gaussian

D = torch.float64
SMALL = {"model_options": {"hidden": (8,)}, "steps": 60, "batch_size": None, "jit": False}


def regression_sets(replicas: int, n: int = 40, d: int = 2):
    """R data sets with different slopes and noise levels, so that a replica fitted to
    another's data would show."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(replicas, n, d, generator=g, dtype=D)
    slope = torch.arange(1, replicas + 1, dtype=D)[:, None]
    y = torch.sin(slope * x[..., 0]) + 0.1 * slope * torch.randn(replicas, n, generator=g,
                                                                 dtype=D)
    return x, y


def test_batched_map_phase_equals_separate_fits_on_a_full_batch_in_float64():
    # A MAP on full batches is deterministic: each replica starts where fit with its seed
    # starts, so the trajectories agree up to round-off. Without refits or evidence the
    # posterior's MAP is the MAP phase's end point.
    x, y = regression_sets(3)
    entry = zoo.get("laplace")
    options = {**SMALL, "method_options": {"refine": False, "evidence": None}}
    assert zoo.batches_replicas(entry, **options)
    many = entry.fit_many(x, y, seeds=[4, 5, 6], **options)
    for r, fitted in enumerate(many):
        alone = entry.fit(x[r], y[r], seed=4 + r, **options)
        torch.testing.assert_close(fitted.posterior.laplace.theta,
                                   alone.posterior.laplace.theta, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(torch.tensor(fitted.result.losses),
                                   torch.tensor(alone.result.losses), rtol=1e-10, atol=1e-10)
        # beta is the MAP phase's learned noise, one per replica in the batched model
        torch.testing.assert_close(fitted.posterior.laplace.beta, alone.posterior.laplace.beta,
                                   rtol=1e-10, atol=0)


def test_fit_many_predicts_like_fit():
    # The default method (refits, GGN, evidence fixed point) on the replicas' MAPs: the same
    # deterministic computation as fit's from MAPs equal up to round-off. A smooth (tanh)
    # net, so that each refit converges to the one optimum near its start rather than
    # stopping where a ReLU net's line search, which round-off can steer, happens to stop.
    x, y = regression_sets(2)
    entry = zoo.get("laplace")
    options = {**SMALL, "model_options": {"hidden": (8,), "activation": "tanh"}}
    many = entry.fit_many(x, y, seeds=[0, 1], **options)
    x_new = torch.linspace(-2, 2, 9, dtype=D)[:, None].expand(9, 2)
    for r, fitted in enumerate(many):
        alone = entry.fit(x[r], y[r], seed=r, **options)
        got, want = fitted.predict(x_new, num_samples=1), alone.predict(x_new, num_samples=1)
        # The evidence loop stops within tol = 1e-4 (in log space) of the fixed point, and
        # round-off in MAPs equal up to round-off can make two runs stop on either side of
        # it (replica 1: beta 9.7731 and 9.7720): alpha, beta and so outputs of order one
        # agree to 2 tol, not to round-off.
        tol = 2 * entry.method.evidence.tol
        torch.testing.assert_close(got.mean, want.mean, rtol=tol, atol=tol)
        torch.testing.assert_close(got.stddev, want.stddev, rtol=tol, atol=tol)
        assert fitted.diagnostics["evidence_iterations"] == \
            alone.diagnostics["evidence_iterations"]
        assert fitted.diagnostics["converged"] is True


def test_fit_many_fits_a_users_network_one_by_one():
    x, y = regression_sets(2)

    def build():
        torch.manual_seed(0)
        return BayesianModule(nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 1)),
                              noise_scale=0.3).double()

    method = Laplace(evidence="fixed_point")
    budget = Budget(steps=30, batch_size=None, jit=False)
    many = method.fit_many(build, x, y, task="regression", seeds=[2, 3], budget=budget,
                           progress=False)
    for r, fitted in enumerate(many):
        pyro.set_rng_seed(2 + r)
        alone = method.fit(build, x[r], y[r], task="regression", seed=2 + r, budget=budget,
                           progress=False)
        torch.testing.assert_close(fitted.laplace.theta, alone.laplace.theta)
        torch.testing.assert_close(fitted.laplace.alpha, alone.laplace.alpha)


def test_fit_many_refuses_what_it_cannot_batch():
    x, y = regression_sets(2)
    build = lambda: BayesianMLP(2, 1, (4,)).double()  # noqa: E731
    with pytest.raises(ValueError, match="replicas=False"):
        Laplace(replicas=False).fit_many(build, x, y, task="regression", seeds=[0, 1],
                                         budget=Budget(steps=1), progress=False)
    with pytest.raises(ValueError, match="distributed=False"):
        Laplace().fit_many(build, x, y, task="regression", seeds=[0, 1],
                           budget=Budget(steps=1, distributed=True), progress=False)


def test_replicated_guide_holds_a_point_mass_per_replica_in_the_replica_plate():
    model = BayesianMLP(2, 1, (4,)).double().replicated(3)
    guide = LaplaceGuide(model).double()
    x, _ = regression_sets(3)
    trace = pyro.poutine.trace(guide).get_trace(x)
    site = trace.nodes["layers.0.weight"]
    assert site["fn"].batch_shape == (3, 1) and site["value"].shape == (3, 1, 2, 4)
    assert any(f.name == "replicas" and f.size == 3 for f in site["cond_indep_stack"])
    assert guide.theta().shape == (3, 1, ParameterLayout.from_model(model).num_parameters)
    with pytest.raises(ValueError, match="single-fit guide"):
        guide.set_posterior(None)


@pytest.mark.parametrize("n", [20, 2000])
def test_refit_reaches_the_optimum_in_float64(n):
    """From a random start, the refit's objective ``beta E_D + alpha/2 ||w||^2`` has a
    gradient below ``1e-7`` of its starting one (a smooth tanh net, where L-BFGS converges
    superlinearly), whatever the number of points; the stopping rules read the mean
    objective, so ``n = 2000`` stops as tightly as ``n = 20``."""
    g = torch.Generator().manual_seed(7)
    model = BayesianMLP(3, 1, (4, 3), activation="tanh", noise_scale=0.3).double()
    layout = ParameterLayout.from_model(model)
    x = torch.randn(n, 3, generator=g, dtype=D)
    y = torch.tanh(x @ torch.tensor([1.0, -2.0, 0.5], dtype=D)) + 0.3 * torch.randn(
        n, generator=g, dtype=D)
    theta = 0.5 * torch.randn(layout.num_parameters, generator=g, dtype=D)
    alpha = torch.full_like(theta, 2.0)
    beta = torch.tensor(1 / 0.3**2, dtype=D)

    def gradient(t):
        t = t.clone().requires_grad_()
        loss = beta * Gaussian().negative_log_likelihood(layout.output(t, x), y) \
            + 0.5 * (alpha * t**2).sum()
        return torch.autograd.grad(loss, t)[0]

    start = float(gradient(theta).abs().max())
    refit = refine_map(theta, x, y, layout, Gaussian(), alpha, beta)
    assert float(gradient(refit).abs().max()) < 1e-7 * start
    assert math.isfinite(start) and start > 1
