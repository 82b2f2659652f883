"""Replicas: R independent fits in one vectorised pass (bnn_zoo._core.replicas,
Entry.fit_many) equal R separate fits, each on its own data only."""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam

from bnn_zoo import zoo
from bnn_zoo._core.elbo import LocalReparameterizationELBO
from bnn_zoo._core.predictive import predict
from bnn_zoo._core.replicas import (
    ReplicaSVIStep,
    fit_replicas,
    predict_replicas,
    split_replicas,
    weight_replicas,
)
from bnn_zoo._core.step import TrainingDiverged
from bnn_zoo._harness import compare
from bnn_zoo.guides._bbb import BayesByBackpropGuide
from bnn_zoo.methods._svi import SVI
from bnn_zoo.models._mlp import BayesianMLP
from bnn_zoo.zoo._defaults import map_guide

SMALL = {"model_options": {"hidden": (8,)}, "steps": 40, "jit": False}


def regression_sets(replicas: int, n: int = 48, d: int = 3, dtype=torch.float64):
    """R data sets of very different scales and slopes, so a replica fitted to another's
    data would show in its metrics."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(replicas, n, d, generator=g, dtype=dtype)
    scale = 10.0 ** torch.arange(replicas, dtype=dtype)  # 1, 10, 100, ...
    y = scale[:, None] * (torch.sin(2 * x[..., 0]) + 0.1 * torch.randn(replicas, n, generator=g,
                                                                       dtype=dtype))
    return x, y


def guide_state(fitted) -> dict[str, torch.Tensor]:
    return {**fitted.guide.state_dict(), **fitted.model.state_dict()}


@pytest.mark.parametrize("batch_size,seeds,validation,lr_schedule", [
    (None, [5, 6, 7], 0.0, "constant"), (16, [3, 3, 3], 0.0, "cosine"),
    (None, [1, 2, 3], 0.25, "constant")])
def test_batched_map_equals_separate_fits_in_float64(batch_size, seeds, validation,
                                                     lr_schedule):
    # MAP has no noise: under the same initial values (each replica starts where entry.fit
    # with its seed starts) and the same minibatches (seeds equal when minibatching, as
    # every replica takes the order of seeds[0]) the trajectories agree up to round-off;
    # with validation > 0 each holds out the rows entry.fit holds out and tunes its noise.
    x, y = regression_sets(3)
    entry = zoo.get("map")
    options = {**SMALL, "batch_size": batch_size, "validation": validation,
               "lr_schedule": lr_schedule}
    many = entry.fit_many(x, y, seeds=seeds, **options)
    for r, fitted in enumerate(many):
        alone = entry.fit(x[r], y[r], seed=seeds[r], **options)
        batched, single = guide_state(fitted), guide_state(alone)
        assert batched.keys() == single.keys()
        for name in single:
            assert batched[name].shape == single[name].shape
            torch.testing.assert_close(batched[name], single[name], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(torch.tensor(fitted.result.losses),
                                   torch.tensor(alone.result.losses), rtol=1e-10, atol=1e-10)
        pyro.set_rng_seed(0)
        got = fitted.evaluate(x[r], y[r])
        pyro.set_rng_seed(0)
        want = alone.evaluate(x[r], y[r])
        assert got["rmse"] == pytest.approx(want["rmse"], rel=1e-9)
        # The tuned noise scale (validation > 0) is a golden-section maximum: where the
        # objective is flat, round-off of 1e-16 decides comparisons over an interval of
        # about sqrt(eps) = 1.5e-8 in log sigma, and the training LL moves with sigma.
        assert got["ll"] == pytest.approx(want["ll"], rel=1e-7, abs=1e-9)


def test_bbb_replicas_reach_each_replicas_closed_form_mean_field_optimum():
    # Bayesian linear regression (no hidden layer, fixed noise sigma): the posterior over
    # (W, b) is Gaussian with precision L = I + X~^T X~ / sigma^2 (X~ = [X, 1], prior
    # N(0, I)), and the mean-field optimum has the exact posterior mean and variances
    # 1 / diag(L). Three replicas with different data and slopes are trained in one pass,
    # at lr 3e-2, 1e-3 and last 1e-4. Near the optimum Adam is SGD with step lr / g, g the
    # gradient noise scale (about 3.5 here: sqrt(N E[x^2] Var f) / sigma^2 with the local
    # reparameterisation's Var f ~ 3 * 1/800), on a quadratic of curvature h ~ N / sigma^2
    # = 800, so the last iterate jitters with sd ~ sqrt(lr g / (2 h)) ~ 5e-4 about the
    # optimum: the tolerance, 10% of each posterior sd (~0.0037), is 7 such sds; the
    # scales, of relative jitter below 1%, get 5%.
    torch.manual_seed(0)
    replicas, n, d, sigma = 3, 200, 2, 0.5
    x = torch.randn(replicas, n, d, dtype=torch.float64)
    slopes = torch.tensor([[1.0, -2.0], [0.5, 3.0], [-4.0, 0.0]], dtype=torch.float64)
    y = (x * slopes[:, None, :]).sum(-1) + sigma * torch.randn(replicas, n, dtype=torch.float64)
    model = BayesianMLP(d, 1, (), noise_scale=sigma).double().replicated(replicas)
    guide = BayesByBackpropGuide(model, init_scale=0.1).double()
    for lr, steps in ((3e-2, 1500), (1e-3, 1000), (1e-4, 500)):
        fit_replicas(model, guide, x, y, steps=steps, lr=lr, elbo=LocalReparameterizationELBO,
                     seed=0, progress=False)
    q = guide.distributions()
    for r in range(replicas):
        design = torch.cat([x[r], torch.ones(n, 1, dtype=torch.float64)], 1)
        precision = torch.eye(d + 1, dtype=torch.float64) + design.T @ design / sigma**2
        mean = torch.linalg.solve(precision, design.T @ y[r] / sigma**2)
        post_sd = torch.linalg.inv(precision).diagonal().sqrt()
        mf_sd = precision.diagonal().rsqrt()
        loc = torch.cat([q["layers.0.weight"].loc[r, 0, :, 0], q["layers.0.bias"].loc[r, 0]])
        scale = torch.cat([q["layers.0.weight"].scale[r, 0, :, 0],
                           q["layers.0.bias"].scale[r, 0]])
        assert ((loc - mean).abs() < 0.1 * post_sd).all(), (r, loc, mean)
        assert ((scale / mf_sd - 1).abs() < 0.05).all(), (r, scale, mf_sd)


def test_batched_bbb_matches_separate_bbb_in_distribution():
    # Same data, 8 seeds: batched and separate fits draw different noise, so they agree in
    # distribution only. The mean over seeds of the final training RMSE differs between the
    # two runs by at most 4 standard errors of the difference (a 1-in-15000 false alarm for
    # Gaussian means), the standard errors from the spread over seeds.
    x, y = regression_sets(1)
    x, y = x[0], y[0]
    entry = zoo.get("bbb")
    seeds = list(range(8))
    options = {"model_options": {"hidden": (16,)}, "steps": 300, "jit": False}
    many = entry.fit_many(x, y, seeds=seeds, **options)
    alone = [entry.fit(x, y, seed=s, **options) for s in seeds]
    a = torch.tensor([f.evaluate(x, y)["rmse"] for f in many])
    b = torch.tensor([f.evaluate(x, y)["rmse"] for f in alone])
    se = (a.var() / len(a) + b.var() / len(b)).sqrt()
    assert (a.mean() - b.mean()).abs() < 4 * se + 1e-3, (a, b)


def test_a_replica_never_sees_another_replicas_data():
    # Replica 0's loss (all other replicas weighted 0) has a zero gradient with respect to
    # every other replica's inputs and targets, and a nonzero one for its own.
    replicas = 3
    x, y = regression_sets(replicas, n=10)
    x.requires_grad_(True)
    y.requires_grad_(True)
    model = BayesianMLP(3, 1, (4,)).double().replicated(replicas)
    guide = BayesByBackpropGuide(model).double()
    only_first = torch.tensor([[1.0], [0.0], [0.0]], dtype=torch.float64)
    with weight_replicas(only_first):
        loss = LocalReparameterizationELBO().differentiable_loss(model, guide, x, y)
    gx, gy = torch.autograd.grad(loss, (x, y))
    assert gx[0].abs().sum() > 0 and gy[0].abs().sum() > 0
    assert (gx[1:] == 0).all() and (gy[1:] == 0).all()


def test_replica_losses_sum_to_the_batch_loss():
    # A step returns the R losses read from the replica weights' gradient (each replica's
    # own loss: test_batched_map_equals_separate_fits_in_float64 compares them with single
    # fits); they sum to the batch's loss at the same parameters (MAP: no noise).
    x, y = regression_sets(3, n=12)
    model = BayesianMLP(3, 1, (4,)).double().replicated(3)
    guide = map_guide(model)
    step = ReplicaSVIStep(model, guide, x, y, lr=1e-3)
    with pyro.get_param_store().scope(step.param_state):
        total = pyro.infer.Trace_ELBO(max_plate_nesting=2).differentiable_loss(model, guide, x, y)
    losses = step.advance()
    assert losses.shape == (3,)
    torch.testing.assert_close(losses.sum(), total.detach(), rtol=1e-12, atol=1e-9)


def test_nan_guard_names_the_replica_and_restores_its_last_checked_values():
    x, y = regression_sets(3, n=20)
    y[1] = 1e200  # replica 1's squared error overflows to inf; the others stay finite
    model = BayesianMLP(3, 1, (4,)).double().replicated(3)
    guide = BayesByBackpropGuide(model).double()
    start = {k: v.clone() for k, v in guide.state_dict().items()}
    with pytest.raises(TrainingDiverged, match=r"Replica 1 of 3.*restored to step 0"):
        fit_replicas(model, guide, x, y, steps=10, elbo=LocalReparameterizationELBO,
                     progress=False, check_every=5)
    for name, value in guide.state_dict().items():
        assert torch.equal(value, start[name])


def test_fitted_from_fit_many_saves_and_loads_like_one_from_fit(tmp_path):
    x, y = regression_sets(2)
    many = zoo.get("bbb").fit_many(list(x), list(y), seeds=[0, 1], **SMALL)
    for r, fitted in enumerate(many):
        assert fitted.entry == "bbb" and fitted.in_dim == 3 and len(fitted.result.losses) == 40
        fitted.save(tmp_path / f"{r}.pt")
        loaded = zoo.load(tmp_path / f"{r}.pt")
        pyro.set_rng_seed(0)
        got = loaded.predict(x[r], num_samples=5)
        pyro.set_rng_seed(0)
        want = fitted.predict(x[r], num_samples=5)
        torch.testing.assert_close(got.loc, want.loc)
        # standardised with its own statistics: the predictive mean is in its data's units
        assert fitted.y_scaler.std.item() == pytest.approx(y[r].std(unbiased=False).item())


def test_fit_many_classification_and_one_set_with_many_seeds():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
    many = zoo.get("bbb").fit_many(x, y, seeds=[0, 1, 2], **SMALL)
    assert len(many) == 3 and all(f.task == "classification" and f.out_dim == 3 for f in many)
    assert many[0].predict(x, num_samples=4).probs.shape == (4, 40, 3)
    first = [p.detach() for p in many[0].guide.parameters()]
    second = [p.detach() for p in many[1].guide.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(first, second))  # own seeds, own fits


def test_ensemble_members_as_replicas_equal_members_one_by_one():
    # Full-batch MAP members: batched and sequential members agree up to round-off.
    x, y = regression_sets(1)
    options = {"model_options": {"hidden": (8,)}, "steps": 30, "jit": False, "batch_size": None,
               "method_options": {"members": 3}}
    entry = zoo.get("ensemble")
    batched = entry.fit(x[0], y[0], seed=2, **options)
    options["method_options"] = {"members": 3, "member": SVI(map_guide)}
    one_by_one = entry.fit(x[0], y[0], seed=2, **options)
    for a, b in zip(batched.posterior.members, one_by_one.posterior.members):
        for (name, p), q in zip(a.guide.state_dict().items(), b.guide.state_dict().values()):
            torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)


def test_fit_many_falls_back_to_one_by_one_where_the_method_cannot_batch():
    x, y = regression_sets(2, dtype=torch.float32)
    entry = zoo.get("lowrank")
    options = {"model_options": {"hidden": (4,)}, "steps": 5, "jit": False}
    assert not zoo.batches_replicas(entry, **options)
    assert zoo.batches_replicas(zoo.get("map"), **options)
    many = entry.fit_many(x, y, seeds=[0, 1], **options)
    for r, fitted in enumerate(many):
        alone = entry.fit(x[r], y[r], seed=r, **options)
        assert fitted.result.losses == alone.result.losses


@pytest.mark.parametrize("xs,ys,seeds,error,match", [
    ([torch.randn(10, 2), torch.randn(12, 2)], [torch.randn(10), torch.randn(12)], [0, 1],
     ValueError, "equal size"),
    ([torch.randn(10, 2)] * 2, [torch.randn(10)] * 2, [0, 1, 2], ValueError,
     "one seed per training set"),
    (torch.randn(10, 2), torch.randn(10), [], TypeError, "non-empty sequence"),
    (torch.randn(10, 2), torch.randn(10), 3, TypeError, "seeds"),
    (torch.randn(10, 2), torch.randn(10), [0, -1], ValueError, r"seeds\[1\]"),
])
def test_fit_many_rejects_bad_input(xs, ys, seeds, error, match):
    with pytest.raises(error, match=match):
        zoo.get("map").fit_many(xs, ys, seeds=seeds, steps=1)


def test_fit_replicas_rejects_unbatched_data_and_shared_parameters():
    model = BayesianMLP(2, 1, (4,)).replicated(2)
    guide = BayesByBackpropGuide(model)
    with pytest.raises(ValueError, match=r"x.*3"):
        fit_replicas(model, guide, torch.randn(10, 2), torch.randn(10), steps=1)
    with pytest.raises(ValueError, match=r"y of shape \(R, N\)"):
        fit_replicas(model, guide, torch.randn(2, 10, 2), torch.randn(2, 9), steps=1)
    model.noise_scale = PyroParam(torch.tensor(0.5), constraint=constraints.positive)
    with pytest.raises(ValueError, match=r"noise_scale_unconstrained \(\) would be shared"):
        fit_replicas(model, guide, torch.randn(2, 10, 2), torch.randn(2, 10), steps=1)


def test_comparison_fits_the_splits_of_a_data_set_as_replicas(tmp_path, capsys):
    # sine's splits have equal sizes; full-batch MAP, so the splits fitted together match
    # those fitted one by one up to float32 round-off.
    kwargs = dict(splits=3, out=tmp_path, num_samples=10,
                  overrides={"steps": 5, "jit": False, "batch_size": None,
                             "model_options": {"hidden": (4,)}})
    together = compare.run_comparison(["sine"], ["map", "lowrank"], **kwargs)
    assert [(r["entry"], r["split"], r["status"]) for r in together] == [
        ("map", 0, "ok"), ("map", 1, "ok"), ("map", 2, "ok"),
        ("lowrank", 0, "ok"), ("lowrank", 1, "ok"), ("lowrank", 2, "ok")]
    groups = [r["settings"]["overrides"].get("replicas") for r in together]
    assert groups == [[0, 1, 2]] * 3 + [None] * 3  # the group of splits fitted together
    apart = compare.run_comparison(["sine"], ["map"], replicas="off", **kwargs)
    for a, b in zip(together, apart):
        assert a["seed"] == b["seed"] == a["split"]
        assert a["metrics"]["rmse"] == pytest.approx(b["metrics"]["rmse"], rel=1e-4)
    assert len(list((tmp_path / "runs" / "map").glob("*.json"))) == 6  # separate cache keys
    capsys.readouterr()
    compare.run_comparison(["sine"], ["map"], **kwargs)
    assert capsys.readouterr().out.count("[cached]") == 3
    with pytest.raises(ValueError, match="'lowrank'.*cannot batch"):
        compare.run_comparison(["sine"], ["lowrank"], replicas="on", **kwargs)


def test_predict_replicas_equals_each_split_out_single_fit():
    # MAP replicas trained in one pass, split into single-fit pairs: the batched
    # predictive of replica r is that of its single pair (point weights: no noise).
    x, y = regression_sets(3, n=15)
    model = BayesianMLP(3, 1, (4,)).double().replicated(3)
    guide = map_guide(model)
    fit_replicas(model, guide, x, y, steps=20, lr=1e-2, progress=False)
    singles = [BayesianMLP(3, 1, (4,)).double() for _ in range(3)]
    single_guides = [map_guide(m) for m in singles]
    for g, xr, yr in zip(single_guides, x, y):
        with torch.no_grad(), pyro.get_param_store().scope():
            g(xr, yr)  # AutoDelta builds its parameters on the first call
    split_replicas(model, singles)
    split_replicas(guide, single_guides)
    batched = predict_replicas(model, guide, x, num_samples=2)
    for r in range(3):
        alone = predict(singles[r], single_guides[r], x[r], num_samples=2)
        torch.testing.assert_close(batched[r].loc, alone.loc, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(batched[r].scale, alone.scale)


def test_replicated_pair_works_with_plain_pyro_svi_and_predictive():
    x, y = regression_sets(2, n=10)
    model = BayesianMLP(3, 1, (4,)).double().replicated(2)
    guide = BayesByBackpropGuide(model).double()
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}),
                         pyro.infer.Trace_ELBO(max_plate_nesting=2))
    assert all(torch.isfinite(torch.tensor(svi.step(x, y))) for _ in range(3))
    samples = pyro.infer.Predictive(model, guide=guide, num_samples=4)(x)
    assert samples["obs"].shape == (4, 2, 10)
    assert samples["layers.0.weight"].shape == (4, 2, 1, 3, 4)
