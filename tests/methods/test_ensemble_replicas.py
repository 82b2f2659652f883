"""Ensemble.fit_many: R ensembles of M members trained as R x M replicas in one pass equal
R separate ensemble fits, each on its own data only (bnn_zoo.methods._ensemble)."""

from __future__ import annotations

import pyro
import pytest
import torch

from bnn_zoo import zoo
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._ensemble import Ensemble
from bnn_zoo.methods._svi import SVI
from bnn_zoo.models._mlp import BayesianMLP
from bnn_zoo.zoo._defaults import map_guide

# Full batches: MAP members are deterministic, so batched and separate fits follow the same
# trajectory and agree up to float64 round-off (1e-8 leaves ample room for 40 Adam steps).
FULL_BATCH = {"model_options": {"hidden": (8,)}, "steps": 40, "jit": False,
              "batch_size": None, "method_options": {"members": 3}}


def regression_sets(replicas: int, n: int = 40, d: int = 3):
    """R float64 data sets of scales 1, 10, 100, ..., so that a member fitted to another
    set's data would show in its weights and metrics."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(replicas, n, d, generator=g, dtype=torch.float64)
    scale = 10.0 ** torch.arange(replicas, dtype=torch.float64)
    noise = 0.1 * torch.randn(replicas, n, generator=g, dtype=torch.float64)
    return x, scale[:, None] * (torch.sin(2 * x[..., 0]) + noise)


def member_state(member) -> dict[str, torch.Tensor]:
    return {**member.guide.state_dict(), **member.model.state_dict()}


def inner(posterior):
    """The ensemble posterior under a noise-tuning wrapper, if any."""
    return getattr(posterior, "inner", posterior)


def test_the_ensemble_entry_batches_its_fits():
    ensemble = zoo.get("ensemble")
    assert ensemble.method.replicas
    assert zoo.batches_replicas(ensemble, **FULL_BATCH)
    assert not zoo.batches_replicas(ensemble, method_options={"member": SVI(map_guide)})
    assert not Ensemble(member=SVI(map_guide)).replicas
    with pytest.raises(ValueError, match="replicas=True"):
        Ensemble(member=SVI(map_guide)).fit_many(
            lambda: BayesianMLP(1, 1, (2,)), torch.zeros(1, 4, 1), torch.zeros(1, 4),
            task="regression", seeds=[0], budget=Budget(steps=1), progress=False)


@pytest.mark.parametrize("validation", [0.0, 0.25])
def test_fit_many_equals_separate_ensemble_fits_member_by_member(validation):
    # With validation > 0 every fit holds out the rows entry.fit holds out, and its noise is
    # tuned on them as in entry.fit (tune_noise on the ensemble posterior).
    x, y = regression_sets(3)
    seeds = [4, 0, 9]
    entry = zoo.get("ensemble")
    options = {**FULL_BATCH, "validation": validation}
    many = entry.fit_many(x, y, seeds=seeds, **options)
    assert len(many) == 3
    for r, fitted in enumerate(many):
        alone = entry.fit(x[r], y[r], seed=seeds[r], **options)
        batched, single = inner(fitted.posterior).members, inner(alone.posterior).members
        assert len(batched) == len(single) == 3
        for a, b in zip(batched, single):
            got, want = member_state(a), member_state(b)
            assert got.keys() == want.keys()
            for name in want:
                torch.testing.assert_close(got[name], want[name], rtol=1e-8, atol=1e-10,
                                           msg=name)
        torch.testing.assert_close(torch.tensor(fitted.result.losses),
                                   torch.tensor(alone.result.losses), rtol=1e-8, atol=1e-8)
        assert fitted.result.steps == alone.result.steps == 3 * 40
        if validation:
            assert fitted.diagnostics["validated_noise_scale"] == pytest.approx(
                alone.diagnostics["validated_noise_scale"], rel=1e-6)
        else:
            assert "validated_noise_scale" not in fitted.diagnostics
        pyro.set_rng_seed(0)
        got = fitted.evaluate(x[r], y[r], num_samples=3)
        pyro.set_rng_seed(0)
        want = alone.evaluate(x[r], y[r], num_samples=3)
        for metric in ("rmse", "ll", "coverage_90"):
            assert got[metric] == pytest.approx(want[metric], rel=1e-7, abs=1e-9), metric
        # and in the units of its own data set (scales 1, 10, 100)
        assert fitted.predict(x[r], num_samples=3).loc.shape == (3, x.shape[1])
        assert got["rmse"] < y[r].std().item()  # better than the mean, in its own units


def test_replica_pass_never_mixes_the_data_of_different_fits():
    # Changing the data of fit 1 leaves the members of fits 0 and 2 bit for bit (full batch:
    # no data-dependent minibatch order), and changes every member of fit 1.
    x, y = regression_sets(3)
    method = Ensemble(member=SVI(map_guide, replicas=True), members=2)
    budget = Budget(steps=15, lr=3e-2, batch_size=None, jit=False)

    def fits(targets):
        def build_model(**overrides):
            return BayesianMLP(3, 1, (4,), **overrides).double()

        return method.fit_many(build_model, x, targets, task="regression", seeds=[1, 2, 3],
                               budget=budget, progress=False)

    before = fits(y)
    changed = y.clone()
    changed[1] = -3.0 * changed[1] + 1.0
    after = fits(changed)
    for r in range(3):
        for a, b in zip(before[r].members, after[r].members):
            got, want = member_state(a), member_state(b)
            equal = all(torch.equal(got[k], want[k]) for k in want)
            assert equal == (r != 1), (r, "members changed" if r != 1 else "unchanged")
