"""Mean-field Gaussian VI for classification (the notes "ELBO diagonal Gaussian"): the
closed-form KL of eq. (1) against torch and Monte Carlo, TraceMeanField vs Trace ELBO, the
Monte Carlo predictive of section 2 against quadrature, the classification metrics by hand,
and the fits."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch
from matplotlib.figure import Figure
from pyro import poutine
from torch.distributions import Normal, kl_divergence

from bnn_zoo import data, predict, zoo
from bnn_zoo._core.predictive import CategoricalPredictive
from bnn_zoo._harness.figures import reliability_diagram
from bnn_zoo.evaluation._metrics import (
    auroc,
    classification_metrics,
    expected_calibration_error,
    reliability_bins,
    shifted_inputs,
)
from bnn_zoo.guides import MeanFieldGuide
from bnn_zoo.guides._bbb import deep_getattr
from bnn_zoo.guides._mean_field import diagonal_gaussian_kl
from bnn_zoo.models import BayesianMLP, GaussianPrior, ScaleMixturePrior

F64 = torch.float64
ROOT = Path(__file__).resolve().parents[2]


def random_gaussians(shape=(3, 4), seed=0):
    gen = torch.Generator().manual_seed(seed)
    loc_q = torch.randn(shape, generator=gen, dtype=F64)
    scale_q = torch.rand(shape, generator=gen, dtype=F64) + 0.2
    loc_p = torch.randn(shape[-1:], generator=gen, dtype=F64)  # broadcasts over rows
    scale_p = torch.rand(shape[-1:], generator=gen, dtype=F64) + 0.5
    return loc_q, scale_q, loc_p, scale_p


def test_kl_matches_torch():
    loc_q, scale_q, loc_p, scale_p = random_gaussians()
    expected = kl_divergence(Normal(loc_q, scale_q), Normal(loc_p, scale_p)).sum()
    torch.testing.assert_close(diagonal_gaussian_kl(loc_q, scale_q, loc_p, scale_p), expected)
    # Eq. (2): the N(0, I) prior, given as numbers.
    eq2 = 0.5 * (-torch.log(scale_q**2) - 1 + scale_q**2 + loc_q**2).sum()
    torch.testing.assert_close(diagonal_gaussian_kl(loc_q, scale_q, 0.0, 1.0), eq2)
    # KL(q || q) = 0, and many tiny terms do not cancel badly (the -n is per term).
    big = torch.full((100_000,), 0.3, dtype=F64)
    assert diagonal_gaussian_kl(big, big, big, big).item() == 0.0


def test_kl_matches_monte_carlo():
    """E_q[log q(w) - log p(w)] over 100000 draws, within 4 standard errors."""
    loc_q, scale_q, loc_p, scale_p = random_gaussians(seed=1)
    q, p = Normal(loc_q, scale_q), Normal(loc_p, scale_p)
    w = q.sample((100_000,))
    per_draw = (q.log_prob(w) - p.log_prob(w)).sum((-2, -1))
    se = per_draw.std() / math.sqrt(per_draw.numel())
    closed = diagonal_gaussian_kl(loc_q, scale_q, loc_p, scale_p)
    assert (per_draw.mean() - closed).abs() < 4 * se, (per_draw.mean(), closed, se)
    # The notes' "- n" inside the sum would be off by n^2 / 2 - n / 2 = 66 nats here.
    n = loc_q.numel()
    assert 0.5 * (n * n - n) > 100 * se


def test_kl_rejects_bad_input():
    loc, scale = torch.zeros(3), torch.ones(3)
    with pytest.raises(ValueError, match="scale_q"):
        diagonal_gaussian_kl(loc, torch.tensor([1.0, 0.0, 1.0]), 0.0, 1.0)
    with pytest.raises(ValueError, match="scale_p"):
        diagonal_gaussian_kl(loc, scale, 0.0, -1.0)
    with pytest.raises(ValueError, match="broadcast"):
        diagonal_gaussian_kl(loc, scale, torch.zeros(4), 1.0)
    with pytest.raises(ValueError, match="loc_q"):
        diagonal_gaussian_kl(torch.tensor([0.0, math.nan, 0.0]), scale, 0.0, 1.0)
    with pytest.raises(TypeError, match="loc_q"):
        diagonal_gaussian_kl(torch.zeros(3, dtype=torch.int64), scale, 0.0, 1.0)


def small_problem(prior=None, scale=0.3):
    """A 2-4-3 classifier in float64 with a wide, randomised guide and 20 points."""
    gen = torch.Generator().manual_seed(2)
    model = BayesianMLP(2, 3, (4,), task="classification",
                        prior=prior or GaussianPrior(0.7)).double()
    guide = MeanFieldGuide(model, init_scale=scale, generator=gen).double()
    with torch.no_grad():
        for loc in guide.loc.parameters():
            loc.add_(0.3 * torch.randn(loc.shape, generator=gen, dtype=F64))
    x = torch.randn(20, 2, generator=gen, dtype=F64)
    y = torch.randint(3, (20,), generator=gen)
    return model, guide, x, y


def test_guide_kl_is_the_kl_term_of_trace_mean_field_elbo():
    """On one weight sample, TraceMeanField_ELBO's loss is -log p(y | w) + eq. (1), exactly."""
    model, guide, x, y = small_problem()
    pyro.set_rng_seed(3)
    loss = pyro.infer.TraceMeanField_ELBO().differentiable_loss(model, guide, x, y)
    pyro.set_rng_seed(3)
    guide_trace = poutine.trace(guide).get_trace(x, y)
    model_trace = poutine.trace(poutine.replay(model, guide_trace)).get_trace(x, y)
    log_lik = model_trace.nodes["obs"]["fn"].log_prob(y).sum()
    torch.testing.assert_close(loss + log_lik, guide.kl_divergence())
    expected = sum(kl_divergence(q, Normal(0.0, 0.7)).sum()
                   for q in guide.distributions().values())
    torch.testing.assert_close(guide.kl_divergence(), expected)


def test_guide_kl_needs_a_gaussian_prior():
    model, guide, _, _ = small_problem(prior=ScaleMixturePrior())
    with pytest.raises(TypeError, match="Gaussian prior"):
        guide.kl_divergence()
    with pytest.raises(TypeError, match="sites"):
        MeanFieldGuide(torch.nn.Linear(2, 3))


def test_trace_mean_field_and_trace_elbo_agree_in_expectation():
    """Same guide state: 30 independent 500-particle estimates of each loss agree within
    4 standard errors, and the closed-form KL has the smaller variance."""
    model, guide, x, y = small_problem()
    estimates = {}
    for elbo_cls in (pyro.infer.Trace_ELBO, pyro.infer.TraceMeanField_ELBO):
        elbo = elbo_cls(num_particles=500, vectorize_particles=True, max_plate_nesting=1)
        with torch.no_grad():
            estimates[elbo_cls] = torch.tensor([elbo.loss(model, guide, x, y)
                                                for _ in range(30)], dtype=F64)
    mc, closed = estimates[pyro.infer.Trace_ELBO], estimates[pyro.infer.TraceMeanField_ELBO]
    se = (mc.var() / mc.numel() + closed.var() / closed.numel()).sqrt()
    assert (mc.mean() - closed.mean()).abs() < 4 * se, (mc.mean(), closed.mean(), se)
    assert closed.std() < mc.std()


def gauss_hermite_sigmoid_mean(mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """E[sigmoid(Z)] for Z ~ N(mean, var), by 80-point Gauss-Hermite quadrature."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    z = mean[:, None] + np.sqrt(var)[:, None] * nodes
    return (weights / weights.sum() * (1 / (1 + np.exp(-z)))).sum(1)


def test_predictive_averages_probabilities_over_samples():
    """The notes' section 2, on a linear two-class model: the logit difference is Gaussian
    under q, so p(y=1 | x) = E[sigmoid(Z)] is known by quadrature. The Monte Carlo predictive
    matches it within 4 standard errors and differs from the probabilities of the mean
    weights (a point estimate)."""
    model = BayesianMLP(1, 2, (), task="classification").double()
    guide = MeanFieldGuide(model, init_scale=0.8).double()
    with torch.no_grad():
        deep_getattr(guide.loc, "layers.0.weight").copy_(torch.tensor([[-0.5, 1.5]]))
        deep_getattr(guide.loc, "layers.0.bias").copy_(torch.tensor([0.2, -0.3]))
    x = torch.tensor([[-2.0], [0.0], [0.5], [3.0]], dtype=F64)
    pred = predict(model, guide, x, num_samples=20_000)
    assert isinstance(pred, CategoricalPredictive) and pred.probs.shape == (20_000, 4, 2)
    q = guide.distributions()
    w, b = q["layers.0.weight"], q["layers.0.bias"]
    mean = (x[:, 0] * (w.loc[0, 1] - w.loc[0, 0]) + b.loc[1] - b.loc[0]).detach()
    var = (x[:, 0] ** 2 * (w.scale[0] ** 2).sum() + (b.scale**2).sum()).detach()
    exact = torch.from_numpy(gauss_hermite_sigmoid_mean(mean.numpy(), var.numpy()))
    se = pred.probs[..., 1].std(0) / math.sqrt(20_000)
    assert ((pred.mean[:, 1] - exact).abs() < 4 * se).all(), (pred.mean[:, 1], exact, se)
    point = torch.sigmoid(mean)
    assert ((point - exact).abs()[[0, 3]] > 20 * se[[0, 3]]).all()


def naive_ece(probs: torch.Tensor, y: torch.Tensor, num_bins: int) -> float:
    """ECE by a loop over bins ``(b/B, (b+1)/B]`` and points: the reference for the metric."""
    total = 0.0
    conf, pred = probs.max(-1)
    for b in range(num_bins):
        lo, hi = b / num_bins, (b + 1) / num_bins
        members = [i for i in range(len(y)) if lo < conf[i].item() <= hi]
        if members:
            acc = sum(pred[i].item() == y[i].item() for i in members) / len(members)
            avg = sum(conf[i].item() for i in members) / len(members)
            total += len(members) / len(y) * abs(acc - avg)
    return total


def test_classification_metrics_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.25, 0.75], [0.62, 0.38], [0.3, 0.7]], dtype=F64)
    y = torch.tensor([0, 1, 1, 0])
    got = classification_metrics(CategoricalPredictive(probs[None]), y)
    assert got["accuracy"] == pytest.approx(0.5)
    assert got["nll"] == pytest.approx(-(math.log(0.9) + math.log(0.75) + math.log(0.38)
                                         + math.log(0.3)) / 4)
    assert got["brier"] == pytest.approx((0.02 + 0.125 + 2 * 0.62**2 + 2 * 0.7**2) / 4)
    entropy = [-(a * math.log(a) + b * math.log(b)) for a, b in probs.tolist()]
    assert got["entropy"] == pytest.approx(sum(entropy) / 4)
    # 15 bins: each point alone in its bin, so ECE is the mean |correct - confidence|.
    assert got["ece"] == pytest.approx((0.1 + 0.25 + 0.62 + 0.7) / 4)
    # 4 bins: 0.75, 0.62 and 0.7 share (0.5, 0.75] (right edge included), 0.9 is alone.
    bins = reliability_bins(probs, y, 4)
    torch.testing.assert_close(bins["count"], torch.tensor([0.0, 0, 3, 1], dtype=F64))
    gap = abs(1 / 3 - (0.75 + 0.62 + 0.7) / 3)
    assert expected_calibration_error(probs, y, 4) == pytest.approx(0.75 * gap + 0.25 * 0.1)
    # Random predictions: the vectorised ECE equals the loop over bins and points.
    gen = torch.Generator().manual_seed(4)
    probs = torch.distributions.Dirichlet(torch.ones(5, dtype=F64)).sample((300,))
    y = torch.randint(5, (300,), generator=gen)
    for num_bins in (4, 15):
        assert expected_calibration_error(probs, y, num_bins) == pytest.approx(
            naive_ece(probs, y, num_bins))


def naive_auroc(negative, positive):
    """P(s+ > s-) + P(s+ = s-) / 2 over every pair."""
    pairs = [(p > n) + 0.5 * (p == n) for n in negative.tolist() for p in positive.tolist()]
    return sum(pairs) / len(pairs)


def test_auroc_is_the_pairwise_probability_with_ties_halved():
    assert auroc(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])) == 1.0
    assert auroc(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])) == 0.0
    gen = torch.Generator().manual_seed(0)
    # Rounded scores: many ties, which the rank formula must average as the pairs do.
    negative = torch.randint(6, (40,), generator=gen).to(F64)
    positive = torch.randint(8, (25,), generator=gen).to(F64)
    assert auroc(negative, positive) == pytest.approx(naive_auroc(negative, positive))
    with pytest.raises(ValueError, match="positive"):
        auroc(negative, torch.zeros(0, dtype=F64))
    with pytest.raises(ValueError, match="negative"):
        auroc(negative[:, None], positive)


def test_shifted_inputs_add_scaled_noise_reproducibly():
    x = torch.zeros(4000, 2, dtype=F64)
    scale = torch.tensor([1.0, 3.0], dtype=F64)
    shifted = shifted_inputs(x, scale, intensity=2.0, seed=1)
    torch.testing.assert_close(shifted, shifted_inputs(x, scale, intensity=2.0, seed=1))
    # Standard deviation 2 * scale per column; the sample sd has relative s.e. 1/sqrt(2N) ~ 1.1%.
    torch.testing.assert_close(shifted.std(0), 2.0 * scale, rtol=0.05, atol=0.0)
    with pytest.raises(ValueError, match="scale"):
        shifted_inputs(x, scale[:1])
    with pytest.raises(ValueError, match="intensity"):
        shifted_inputs(x, scale, intensity=0.0)


def test_reliability_diagram():
    probs = torch.tensor([[0.9, 0.1], [0.25, 0.75], [0.62, 0.38], [0.3, 0.7]])
    y = torch.tensor([0, 1, 1, 0])
    fig = reliability_diagram(probs, y, num_bins=4, title="toy")
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert len(ax.patches) == 2 * 2  # accuracy and gap bars of the two non-empty bins
    assert ax.get_title() == "toy\nECE 0.292"
    with pytest.raises(ValueError, match="y"):
        reliability_diagram(probs, y[:3])
    with pytest.raises(TypeError, match="y"):
        reliability_diagram(probs, y.float())


def test_classification_data_sets_load():
    for name, in_dim, classes in (("wine", 13, 3), ("digits", 64, 10),
                                  ("breast_cancer", 30, 2), ("two_moons", 2, 2)):
        d = data.load(name)
        assert d.task == "classification" and d.num_classes == classes and d.in_dim == in_dim
        assert d.y_train.dtype == torch.int64 and set(d.y_test.tolist()) == set(range(classes))


def test_mean_field_clf_entry():
    entry = zoo.get("mean_field_clf")
    assert entry.tasks == ("classification",) and "mean_field_clf" in zoo.names("classification")
    assert entry.notes.startswith('"ELBO diagonal Gaussian"')
    assert entry.source.startswith("Graves 2011")
    assert entry.method.elbo is pyro.infer.TraceMeanField_ELBO
    d = data.load("wine")
    fitted = entry.fit(d.x_train, d.y_train, steps=3,
                       model_options={"prior_scale": 0.5, "hidden": (8,)})
    assert isinstance(fitted.guide, MeanFieldGuide) and fitted.model.prior.scale == 0.5
    with pytest.raises(ValueError, match="prior_scale"):
        entry.fit(d.x_train, d.y_train, steps=3, model_options={"prior_scale": 0.0})
    with pytest.raises(ValueError, match="classification"):
        entry.fit(d.x_train, d.y_train.double())


def far_from(x: torch.Tensor, radius: float, num: int = 64) -> torch.Tensor:
    """``num`` points on a circle of ``radius`` around the mean of 2-D inputs ``x``."""
    angle = torch.linspace(0, 2 * math.pi, num + 1, dtype=x.dtype)[:-1]
    return x.mean(0) + radius * torch.stack([angle.cos(), angle.sin()], 1)


def test_two_moons_uncertainty_grows_away_from_the_data():
    """Accuracy >= 0.95, and the mean predictive entropy on a circle of radius 10 around
    the data (the moons span about 3 x 1.5) exceeds the entropy at the test points by 20%
    (seed 0: 0.146 against 0.102 nats; over seeds 0-3 the ratio is 1.0-1.7). The
    MAP point estimate of the same net, as a control, fails that: its ReLU logits grow
    linearly away from the data and it becomes more confident there."""
    d = data.load("two_moons")
    far = far_from(d.x_train, 10.0)
    fitted = zoo.get("mean_field_clf").fit(d.x_train, d.y_train, seed=0)
    assert fitted.evaluate(d.x_test, d.y_test)["accuracy"] >= 0.95
    near_entropy = fitted.predict(d.x_test).entropy.mean()
    assert fitted.predict(far).entropy.mean() > 1.2 * near_entropy
    point = zoo.get("map").fit(d.x_train, d.y_train, seed=0, steps=1000, batch_size=None)
    assert point.predict(far).entropy.mean() < point.predict(d.x_test).entropy.mean()


def test_breast_cancer_accuracy_and_calibration():
    d = data.load("breast_cancer")
    metrics = zoo.get("mean_field_clf").fit(d.x_train, d.y_train, seed=0).evaluate(
        d.x_test, d.y_test)
    assert metrics["accuracy"] >= 0.95, metrics
    assert metrics["ece"] <= 0.05, metrics


def test_classification_benchmark_script(tmp_path, benchmark_script):
    script = benchmark_script("classification.py")
    rows = script["main"](["--steps", "3", "--datasets", "wine", "--entries", "map",
                           "mean_field_clf", "--num-samples", "5", "--out", str(tmp_path)])
    assert len(rows) == 2
    with open(tmp_path / "classification.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["entry"] for r in table] == ["map", "mean_field_clf"]
    for r in table:
        assert all(math.isfinite(float(r[k])) for k in ("accuracy", "nll", "ece", "fit_seconds"))
        assert 0.0 <= float(r["auroc_shift"]) <= 1.0
    assert "| wine | mean_field_clf |" in (tmp_path / "classification.md").read_text()
    assert (tmp_path / "reliability.png").stat().st_size > 0
    # A fresh checkout: the JSON (with the reliability bins) without the cache. Restored
    # from it, a cached-only run fits nothing and writes the same table.
    table = (tmp_path / "classification.md").read_text()
    shutil.rmtree(tmp_path / "runs")
    again = script["main"](["--steps", "3", "--datasets", "wine", "--entries", "map",
                            "mean_field_clf", "--num-samples", "5", "--out", str(tmp_path),
                            "--cached-only"])
    assert [r["runs"] for r in again] == [1, 1]
    assert (tmp_path / "classification.md").read_text() == table
    kept = json.loads((tmp_path / "classification.json").read_text())["runs"]
    assert all(set(r["reliability"]) >= {"confidence", "accuracy", "count"} for r in kept)
