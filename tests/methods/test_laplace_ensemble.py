"""The ``laplace_ensemble`` entry (Eschenhagen et al. 2021): M Laplace fits from the seeds
``M * seed + m`` and the equal-weight mixture of their GLM predictives."""

from __future__ import annotations

import math

import pyro
import torch

from bnn_zoo import data, zoo
from bnn_zoo.methods.laplace import Laplace

#: Full batches make the replica MAP phases deterministic, so members equal single fits up
#: to round-off.
BUDGET = {"steps": 150, "batch_size": None, "jit": False}


def sine(n_train: int = 40, n_test: int = 15):
    d = data.load("sine")
    x, y = d.x_train.double(), d.y_train.double()
    return x[:n_train], y[:n_train], x[n_train:n_train + n_test], y[n_train:n_train + n_test]


def test_members_are_the_laplace_fits_of_their_seeds_and_the_predictive_their_mixture():
    x, y, x_test, y_test = sine()
    # Without the L-BFGS refits the evidence loop tunes alpha and beta at the MAP phase's
    # end point, a deterministic computation. (With them, on 40 points and a weak evidence-
    # optimal prior, alpha ~ 0.14, each refit drifts along near-flat directions that
    # round-off picks: outputs then agree only to ~1e-3.)
    members, seed = 3, 2
    member = Laplace(curvature="ggn", evidence="fixed_point", refine=False)
    fitted = zoo.get("laplace_ensemble").fit(
        x, y, seed=seed, method_options={"members": members, "member": member}, **BUDGET)
    singles = []
    for m in range(members):
        pyro.clear_param_store()
        singles.append(zoo.get("laplace").fit(x, y, seed=members * seed + m,
                                              method_options={"refine": False}, **BUDGET))
    for fit, single in zip(fitted.posterior.members, singles):
        torch.testing.assert_close(fit.laplace.theta, single.posterior.laplace.theta)
        assert math.isclose(fit.diagnostics["beta"], single.posterior.diagnostics["beta"],
                            rel_tol=1e-9)
        assert fit.diagnostics["evidence_iterations"] == \
            single.posterior.diagnostics["evidence_iterations"]
    log_probs = torch.stack([s.predict(x_test).log_prob(y_test) for s in singles])
    expected = log_probs.logsumexp(0) - math.log(members)
    torch.testing.assert_close(fitted.predict(x_test).log_prob(y_test), expected)


def test_the_mixture_is_wider_than_its_members_where_they_disagree():
    """Between and beyond the training inputs the members' means differ, and the mixture's
    variance is their mean variance plus the variance of their means."""
    x, y, _, _ = sine()
    fitted = zoo.get("laplace_ensemble").fit(x, y, seed=0, **BUDGET)
    grid = torch.linspace(-6.0, 6.0, 50, dtype=torch.float64)[:, None]
    mixture = fitted.predict(grid)
    loc, scale = mixture.loc, mixture.scale  # (members, N) one component each
    expected = (scale ** 2).mean(0) + loc.var(0, unbiased=False)
    torch.testing.assert_close(mixture.variance, expected)
    assert bool((loc.var(0) > 0).all())


def test_the_members_take_the_laplace_entrys_method():
    """Each member is a ``laplace`` fit: its curvature, evidence, held-out factor and
    refits, not a Laplace of other settings."""
    assert zoo.get("laplace_ensemble").method.member == zoo.get("laplace").method
