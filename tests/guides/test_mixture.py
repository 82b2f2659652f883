"""Mixture-of-diagonal-Gaussians guide (after the notes on fitting an unnormalised posterior
by a mixture of diagonal Gaussians): its log density against a direct sum, the notes'
partial derivatives, unbiased ELBO estimators, K=1 as a diagonal Gaussian, both modes of a
two-component target, the float32 pathwise overflow, targets and the entry, and K = 1, 2, 4
against NUTS on a small BNN posterior (predictive W2 distance and ELBO)."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoDiagonalNormal

from bnn_zoo import data, fit, zoo
from bnn_zoo._core.elbo import MixtureELBO, elbo_estimate
from bnn_zoo.guides._mixture import DiagonalNormalMixture, MixtureGuide, component_log_densities
from bnn_zoo.models._targets import UnnormalisedModel, banana, bnn_posterior, ring, target
from bnn_zoo.models._targets import two_component as two_component_target

ROOT = Path(__file__).resolve().parents[2]
NO_DATA = (torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64))


def random_mixture(k: int = 3, d: int = 2, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(k, generator=gen, dtype=torch.float64)
    w = torch.rand(k, d, generator=gen, dtype=torch.float64) + 0.5
    b = torch.randn(k, d, generator=gen, dtype=torch.float64)
    return a, w, b


def test_log_prob_equals_direct_sum():
    """log q by log-sum-exp equals log of the notes' sum_i a_i^2 prod_j N(theta_j, w, b),
    normalised by sum a^2, computed naively in float64; and the mean is -b/w, not b/w."""
    a, w, b = random_mixture()
    theta = torch.randn(5, 2, dtype=torch.float64)
    direct = torch.zeros(5, dtype=torch.float64)
    for i in range(3):
        term = a[i] ** 2 / (a**2).sum()
        for j in range(2):
            term = term * torch.sqrt(w[i, j] ** 2 / (2 * math.pi)) * torch.exp(
                -0.5 * (w[i, j] * theta[:, j] + b[i, j]) ** 2)
        direct += term
    q = DiagonalNormalMixture(a, w, b)
    torch.testing.assert_close(q.log_prob(theta), direct.log())
    pyro_q = dist.MixtureOfDiagNormals(-b / w, 1 / w, torch.log(a**2))
    torch.testing.assert_close(q.log_prob(theta), pyro_q.log_prob(theta))
    samples = q.sample((40000,))
    se = q.variance.sqrt() / math.sqrt(40000)
    assert ((samples.mean(0) - (q.weights @ (-b / w))).abs() < 4 * se).all()
    torch.testing.assert_close(q.mean, q.weights @ (-b / w))


def test_mean_and_variance_are_the_mixtures_moments():
    """On components far from zero with unequal weights: ``mean`` is sum_i pi_i mu_i and
    ``variance`` the law of total variance, sum_i pi_i (sigma_i^2 + (mu_i - mean)^2), each
    written out here; and both match the moments of the mixture's own samples within 5
    Monte Carlo standard errors (the between-component term is most of the variance)."""
    locs = torch.tensor([[6.0, -4.0], [-3.0, 9.0], [11.0, 2.0]], dtype=torch.float64)
    scales = torch.tensor([[0.5, 2.0], [1.5, 0.3], [1.0, 1.0]], dtype=torch.float64)
    a = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    q = DiagonalNormalMixture(a, 1 / scales, -locs / scales)  # component means -b/w
    pi = a**2 / (a**2).sum()
    mean = sum(pi[i] * locs[i] for i in range(3))
    variance = sum(pi[i] * (scales[i] ** 2 + (locs[i] - mean) ** 2) for i in range(3))
    torch.testing.assert_close(q.mean, mean)
    torch.testing.assert_close(q.variance, variance)

    n = 200_000
    samples = q.sample((n,))
    centred = samples - samples.mean(0)
    sample_variance = centred.pow(2).mean(0)
    mean_se = (sample_variance / n).sqrt()
    variance_se = ((centred.pow(4).mean(0) - sample_variance**2) / n).sqrt()
    assert ((samples.mean(0) - q.mean).abs() < 5 * mean_se).all(), (samples.mean(0), q.mean)
    assert ((sample_variance - q.variance).abs() < 5 * variance_se).all(), \
        (sample_variance, q.variance)
    # the check has power: leaving out the spread of the means changes the variance by more
    within = pi @ scales**2
    assert ((variance - within).abs() > 50 * variance_se).all()


def test_notes_partial_derivatives_match_autograd():
    """The notes' section 4: d beta_i / d b_jk = -delta_ik (theta_j w_jk + b_jk) as written;
    d beta_i / d w_jk = delta_ik {-(theta_j w_jk + b_jk) theta_j + 1/w_jk} (the notes have
    -1/w); with normalised weights d beta_i / d a_k = 2 delta_ik / a_k - 2 a_k / sum a^2."""
    a, w, b = (t.requires_grad_() for t in random_mixture())
    theta = torch.randn(2, dtype=torch.float64)
    beta = component_log_densities(theta, a, w, b)
    z = theta * w + b  # (K, D)
    for i in range(3):
        ga, gw, gb = torch.autograd.grad(beta[i], (a, w, b), retain_graph=True)
        delta = torch.zeros(3, 1, dtype=torch.float64)
        delta[i] = 1.0
        torch.testing.assert_close(gb, -delta * z)
        torch.testing.assert_close(gw, delta * (-z * theta + 1 / w))
        notes_gw = -delta * (z * theta + 1 / w)
        assert not torch.allclose(gw, notes_gw)
        torch.testing.assert_close(ga, 2 * delta.squeeze(1) / a - 2 * a / (a**2).sum())


def gaussian_target(dtype=torch.float64):
    mean = torch.tensor([0.5, -1.0], dtype=dtype)
    precision = torch.tensor([[2.0, 0.8], [0.8, 1.0]], dtype=dtype)

    def log_density(theta):
        diff = theta - mean
        return -0.5 * ((diff @ precision) * diff).sum(-1)

    return UnnormalisedModel(log_density, 2).to(dtype), mean, precision


def closed_form_elbo(loc, scale, mean, precision):
    """E_q[log p~] + H[q] for q = N(loc, diag scale^2) and log p~ = -(t-m)' P (t-m) / 2."""
    diff = loc - mean
    expected = -0.5 * (diff @ precision @ diff + (precision.diagonal() * scale**2).sum())
    entropy = torch.log(scale).sum() + 0.5 * loc.numel() * (1 + math.log(2 * math.pi))
    return expected + entropy


def grad_draws(model, guide, particles: int, repeats: int) -> torch.Tensor:
    """(repeats, n_params) gradients of -ELBO, each from ``particles`` vectorised particles."""
    elbo = MixtureELBO(num_particles=particles, max_plate_nesting=1)
    params = [guide.a_unconstrained, guide.w_unconstrained, guide.loc_unconstrained]
    out = []
    for _ in range(repeats):
        loss = elbo.differentiable_loss(model, guide, *NO_DATA)
        out.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    return torch.stack(out)


@pytest.mark.parametrize("estimator", ["score", "pathwise", "enumerate"])
def test_k1_is_the_diagonal_gaussian_guide(estimator):
    """K=1: the density is AutoDiagonalNormal's at the same loc/scale, and the ELBO and its
    gradient agree with the closed form for a Gaussian target (4 standard errors)."""
    model, mean, precision = gaussian_target()
    guide = MixtureGuide(model, 1, estimator=estimator, init_scale=0.7)
    guide(*NO_DATA)
    q = guide.mixture()
    normal = AutoDiagonalNormal(model, init_scale=0.7)
    normal(*NO_DATA)
    with torch.no_grad():
        normal.loc.copy_(q.locs[0])
    theta = torch.randn(7, 2, dtype=torch.float64)
    torch.testing.assert_close(q.log_prob(theta), normal.get_posterior().log_prob(theta))

    draws = grad_draws(model, guide, particles=64, repeats=40)
    loc, scale = q.locs[0].detach().requires_grad_(), q.scales[0].detach()
    w = guide.w_unconstrained.detach().requires_grad_()
    exact = -closed_form_elbo(loc, torch.exp(-w[0]), mean, precision)
    g_w, g_loc = torch.autograd.grad(exact, (w, loc))
    expected = torch.cat([torch.zeros(1, dtype=torch.float64), g_w.reshape(-1), g_loc])
    se = draws.std(0) / math.sqrt(draws.shape[0])
    assert ((draws.mean(0) - expected).abs() <= 4 * se + 1e-12).all(), (draws.mean(0), expected)
    assert expected.abs().max() > 10 * se.max()  # the check has power
    values = torch.tensor([-MixtureELBO(num_particles=256, max_plate_nesting=1).loss(
        model, guide, *NO_DATA) for _ in range(20)])
    closed = closed_form_elbo(q.locs[0], scale, mean, precision).item()
    assert abs(values.mean().item() - closed) < 4 * values.std().item() / math.sqrt(20)


def overlapping_state(estimator: str, baseline: bool = False) -> tuple:
    """A K=2 guide on the two-component target with overlapping, unequal components,
    so that every parameter, the weights included, has a sizeable gradient."""
    model = two_component_target(separation=2.0, scale=0.7).double()
    guide = MixtureGuide(model, 2, estimator=estimator, baseline=baseline)
    guide(*NO_DATA)
    with torch.no_grad():
        guide.a_unconstrained.copy_(torch.tensor([1.0, 0.6]))
        guide.w_unconstrained.copy_(torch.log(torch.tensor([[1.5, 1.0], [0.8, 1.2]])))
        guide.loc_unconstrained.copy_(torch.tensor([[-0.4, 0.2], [0.9, -0.3]]))
    return model, guide


def test_gradient_estimators_agree_in_expectation():
    """score (seed, with its -1 term), score with a running-mean baseline, and pathwise
    average to the enumerated gradient within 4 combined standard errors; the baseline and
    the enumeration reduce the variance of the notes' estimator."""
    results = {}
    for name, estimator, baseline in [("enumerate", "enumerate", False),
                                      ("score", "score", False),
                                      ("score_baseline", "score", True),
                                      ("pathwise", "pathwise", False)]:
        model, guide = overlapping_state(estimator, baseline)
        draws = grad_draws(model, guide, particles=128, repeats=30)
        results[name] = (draws.mean(0), draws.var(0) / draws.shape[0])
    ref_mean, ref_var = results["enumerate"]
    assert (ref_mean.abs() > 10 * ref_var.sqrt()).sum() >= 6  # gradients far from zero
    for name, (mean, var) in results.items():
        assert ((mean - ref_mean).abs() <= 4 * (var + ref_var).sqrt()).all(), name
    assert results["score_baseline"][1].sum() < results["score"][1].sum()
    assert ref_var.sum() < results["score"][1].sum()


def test_score_baseline_tracks_the_elbo():
    model, guide = overlapping_state("score", baseline=True)
    elbo = MixtureELBO(num_particles=32, max_plate_nesting=1)
    for _ in range(30):
        elbo.differentiable_loss(model, guide, *NO_DATA)
    value = -MixtureELBO(num_particles=4096, max_plate_nesting=1).loss(model, guide, *NO_DATA)
    assert abs(guide.current_baseline().item() - value) < 0.3
    assert int(guide.baseline_steps) == 30


def kl_to(model, guide, particles: int = 20000) -> float:
    loss = MixtureELBO(num_particles=particles, max_plate_nesting=1).loss(model, guide, *NO_DATA)
    return model.log_normalizer + loss


def test_two_modes_are_recovered_where_one_gaussian_cannot():
    """Well separated modes (8 standard deviations apart): K=2 puts 0.3-0.7 of the mass
    on each and reaches KL < 0.05; K=1 is stuck near KL = log 2."""
    out = {}
    for k in (1, 2):
        pyro.set_rng_seed(0)
        pyro.clear_param_store()  # kl_to runs Pyro's ELBO, which shares parameters by name
        model = two_component_target().double()
        guide = MixtureGuide(model, k, estimator="enumerate", init_scale=0.3)
        fit(model, guide, *NO_DATA, steps=400, lr=0.05, num_particles=8, elbo=MixtureELBO,
            seed=0)
        out[k] = (kl_to(model, guide), guide)
    kl, guide = out[2]
    q = guide.mixture()
    assert ((q.weights > 0.3) & (q.weights < 0.7)).all(), q.weights
    assert sorted(q.locs[:, 0].tolist()) == pytest.approx([-2.0, 2.0], abs=0.2)
    assert kl < 0.05
    assert guide.effective_components() > 1.9
    assert out[1][0] > 0.6


def test_pyro_mixture_defects_that_the_pathwise_estimator_avoids():
    """Why "pathwise" does not use pyro's MixtureOfDiagNormals: (1) its implicit gradient
    computes exp(log q) unscaled and turns NaN in float32 for 31 coordinates at scale 0.01
    (the NaN of the earlier attempt on the BNN); (2) its gradient for the weights is biased
    beyond linear functions: for E[theta_1^3] it is far from the enumerated value, where
    ours (component drawn, then reparameterised; weights by the Rao-Blackwellised score)
    agrees within 4 standard errors."""
    a = torch.ones(2, requires_grad=True)
    w = torch.full((2, 31), 100.0, requires_grad=True)
    b = torch.randn(2, 31).mul(100.0).requires_grad_()
    z = dist.MixtureOfDiagNormals(-b / w, 1 / w, torch.log(a**2)).expand((8,)).rsample()
    assert not all(torch.isfinite(g).all() for g in torch.autograd.grad(z.sum(), (a, w, b)))
    q = DiagonalNormalMixture(a, w, b, reparameterized=True)
    z = q.rsample((8, 1))
    assert z.shape == (8, 1, 31) and all(
        torch.isfinite(g).all() for g in torch.autograd.grad(z.sum(), (w, b)))

    locs = torch.tensor([[-0.4, 0.2], [0.9, -0.3]], dtype=torch.float64)
    a = torch.tensor([1.0, 0.6], dtype=torch.float64, requires_grad=True)
    w = torch.full((2, 2), 1.25, dtype=torch.float64)
    q = DiagonalNormalMixture(a, w, -locs * w, reparameterized=True)
    n = 200000
    eps = torch.randn(n, 2, 2, dtype=torch.float64)
    per_component = ((locs + eps / w)[..., 0] ** 3).mean(0)
    exact = torch.autograd.grad((q.weights * per_component).sum(), a)[0]
    draws = []
    for _ in range(20):
        z = q.rsample((n // 20,))
        f = z[:, 0] ** 3
        score = q.log_prob(z.detach()) * f.detach()
        draws.append(torch.autograd.grad((f + score - score.detach()).mean(), a)[0])
    draws = torch.stack(draws)
    se = draws.std(0) / math.sqrt(20)
    assert ((draws.mean(0) - exact).abs() < 4 * se).all(), (draws.mean(0), exact, se)
    logits = torch.log(q.weights.detach()).requires_grad_()
    zp = dist.MixtureOfDiagNormals(locs, 1 / w, logits).rsample((n,))
    pyro_grad = torch.autograd.grad((zp[:, 0] ** 3).mean(), logits)[0]
    exact_logits = q.weights.detach() * (per_component - q.weights.detach() @ per_component)
    assert (pyro_grad - exact_logits).abs().max() > 0.1


def test_bnn_posterior_target_trains_with_every_estimator():
    d = data.load("sine")
    model = bnn_posterior(d.x_train[:50], d.y_train[:50], hidden=(10,))
    assert model.dim == 31
    x0, y0 = torch.zeros(1, 1), torch.zeros(1)
    for estimator in ("score", "pathwise", "enumerate"):
        guide = MixtureGuide(model, 2, estimator=estimator, init_scale=0.01, init_spread=0.5)
        result = fit(model, guide, x0, y0, steps=30, lr=0.02, num_particles=4,
                     elbo=MixtureELBO, seed=0)
        assert all(math.isfinite(v) for v in result.losses)
        assert min(result.losses[-10:]) < result.losses[0]


def test_known_normalisers_by_quadrature():
    g1 = torch.linspace(-10, 10, 1001, dtype=torch.float64)
    g2 = torch.linspace(-10, 40, 2501, dtype=torch.float64)  # the banana's arms reach up
    t1, t2 = torch.meshgrid(g1, g2, indexing="ij")
    theta = torch.stack([t1, t2], -1)
    cell = (g1[1] - g1[0]) * (g2[1] - g2[0])
    for model in (two_component_target(), banana(), ring(), target("ring", radius=1.0)):
        log_z = torch.logsumexp(model.log_density(theta).reshape(-1), 0) + torch.log(cell)
        assert log_z.item() == pytest.approx(model.log_normalizer, abs=1e-3)


def test_one_dimensional_target_with_score_and_pathwise():
    for estimator in ("score", "pathwise"):
        model = two_component_target(dim=1).double()
        guide = MixtureGuide(model, 2, estimator=estimator, baseline=True, init_scale=0.3)
        fit(model, guide, *NO_DATA, steps=300, lr=0.05, num_particles=8, elbo=MixtureELBO,
            seed=0)
        locs = sorted(guide.mixture().locs[:, 0].tolist())
        assert locs == pytest.approx([-2.0, 2.0], abs=0.3), estimator


def test_bad_input_is_rejected():
    model = two_component_target()
    with pytest.raises(ValueError, match="num_components"):
        MixtureGuide(model, 0)
    with pytest.raises(ValueError, match="estimator"):
        MixtureGuide(model, 2, estimator="reinforce")
    with pytest.raises(ValueError, match="baseline"):
        MixtureGuide(model, 2, estimator="enumerate", baseline=True)
    with pytest.raises(ValueError, match="init_scale"):
        MixtureGuide(model, 2, init_scale=-1.0)
    with pytest.raises(ValueError, match="init_spread"):
        MixtureGuide(model, 2, init_spread=float("nan"))
    with pytest.raises(RuntimeError, match="call it"):
        MixtureGuide(model, 2).mixture()
    with pytest.raises(TypeError, match="MixtureGuide"):
        MixtureELBO().differentiable_loss(model, AutoDiagonalNormal(model))
    with pytest.raises(ValueError, match="target"):
        target("donut")
    with pytest.raises(TypeError, match="log_density"):
        UnnormalisedModel(3.0, 2)
    with pytest.raises(ValueError, match="D"):
        DiagonalNormalMixture(torch.ones(2), torch.ones(3, 2), torch.ones(3, 2))


def test_zoo_entry_fits_and_predicts():
    d = data.load("sine")
    entry = zoo.get("mixture")
    assert entry.notes.startswith("Unsigned notes on fitting")
    assert entry.source.startswith("Jaakkola & Jordan 1998")
    fitted = entry.fit(d.x_train, d.y_train, steps=60, lr=0.03, model_options={"hidden": (10,)},
                       guide_options={"num_components": 3, "estimator": "pathwise"})
    assert fitted.result.losses[-1] < fitted.result.losses[0]
    assert 1.0 <= fitted.guide.effective_components() <= 3.0
    metrics = fitted.evaluate(d.x_test, d.y_test, num_samples=50)
    assert math.isfinite(metrics["ll"]) and metrics["rmse"] < 1.0
    pyro.set_rng_seed(0)
    two_moons = data.load("two_moons")
    fitted = entry.fit(two_moons.x_train, two_moons.y_train, steps=10,
                       model_options={"hidden": (10,)}, guide_options={"estimator": "score"})
    assert 0.0 <= fitted.evaluate(two_moons.x_test, two_moons.y_test)["accuracy"] <= 1.0


def test_benchmark_script_runs_with_tiny_flags(tmp_path):
    """A row per (target, estimator, K) with KL = log Z - ELBO, the effective number of
    components in [1, K] and a positive time; the side-by-side table holds the same KLs;
    the gradient variances are positive."""
    out = tmp_path / "mixture"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mixture.py"), "--steps", "5",
                    "--components", "1", "2", "--targets", "two_component",
                    "--eval-particles", "64", "--grad-repeats", "3", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    rows = read_csv(out / "mixture.csv")
    estimators = ["score", "score_baseline", "pathwise", "enumerate"]
    assert [(r["target"], r["estimator"], r["K"]) for r in rows] == [
        ("two_component", e, k) for e in estimators for k in ("1", "2")]
    log_z = two_component_target().log_normalizer
    for r in rows:
        assert r["status"] == "ok"
        assert float(r["kl"]) == pytest.approx(log_z - float(r["elbo"]))
        assert float(r["elbo_se"]) > 0 and float(r["seconds"]) > 0
        assert 1 - 1e-6 <= float(r["effective_components"]) <= int(r["K"]) + 1e-6
    side_by_side = read_csv(out / "mixture_by_estimator.csv")
    assert [(r["measure"], r["K"]) for r in side_by_side] == [("KL", "1"), ("KL", "2")]
    for wide in side_by_side:
        for e in estimators:
            (long,) = [r for r in rows if r["estimator"] == e and r["K"] == wide["K"]]
            assert float(wide[e]) == pytest.approx(float(long["kl"]))
    (variance,) = read_csv(out / "mixture_grad_variance.csv")
    assert variance["K"] == "2" and all(float(variance[e]) > 0 for e in estimators)
    header = "| target | measure | K | score | score_baseline | pathwise | enumerate |"
    assert header in (out / "mixture_by_estimator.md").read_text()
    assert (out / "mixture.png").stat().st_size > 0


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_benchmark_evaluates_each_guide_with_its_own_parameters(monkeypatch):
    """After one MixtureGuide has been evaluated in Pyro's global store, the benchmark's
    ELBO estimate of a second one (K = 2) uses the second's own trained parameters: the
    same value as in an empty store."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from mixture import NO_DATA, make_guide

    model = two_component_target()
    first, second = (make_guide(model, "enumerate", k, bnn=False) for k in (1, 2))
    for guide in (first, second):
        fit(model, guide, *NO_DATA, steps=20, lr=0.03, num_particles=4, elbo=MixtureELBO,
            seed=0, progress=False)
    pyro.set_rng_seed(1)
    alone = elbo_estimate(model, second, *NO_DATA, particles=64)
    with pyro.poutine.block():
        MixtureELBO(num_particles=4).loss(model, first, *NO_DATA)  # fills the global store
    assert "MixtureGuide.a" in pyro.get_param_store()
    pyro.set_rng_seed(1)
    assert elbo_estimate(model, second, *NO_DATA, particles=64) == alone


def test_a_dead_component_keeps_finite_log_densities_and_gradients():
    """A component whose weight parameter ``a`` has underflowed to 0 (as after ~2000 Adam
    steps on sine) gives log-weight ``2 log(tiny)``, not ``-inf``, and no NaN gradient."""
    a = torch.tensor([1.0, 0.0], requires_grad=True)
    w = torch.ones(2, 3, requires_grad=True)
    b = torch.zeros(2, 3, requires_grad=True)
    beta = component_log_densities(torch.zeros(4, 3), a, w, b)
    assert torch.isfinite(beta).all()
    torch.logsumexp(beta, -1).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (a, w, b))


# --- The mixture guide against NUTS on a small BNN posterior ------------------------------

@pytest.fixture
def mixture_nuts(monkeypatch, benchmark_script) -> dict:
    """The functions of ``benchmarks/mixture_nuts.py``, whose table these tests check."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return benchmark_script("mixture_nuts.py")


def test_mixture_against_nuts_on_a_small_bnn_fast(tmp_path, mixture_nuts):
    """``benchmarks/mixture_nuts.py`` on a short run: 1-5-1 tanh net on 20 points of
    ``gap``, NUTS with 60 + 60 draws (tree depth 4) as the reference; K=1 fitted 100 steps,
    then K=1 and K=2 (split from it) 100 more. Both predictives are finite and near NUTS's
    (W2 well below the targets' scale, 0.7), and K=2's ELBO is not worse than K=1's beyond 4
    Monte Carlo standard errors.

    Not asserted, because it is not true here: that K=2's *predictive* is no further from
    NUTS than K=1's; the second component changes where the optimisation goes (it is not
    Monte Carlo noise), and the ELBO it gains does not move the predictive towards NUTS
    (see the slow test)."""
    rows = mixture_nuts["main"](
        ["--data", "gap", "--components", "2", "--steps", "100", "--warmup", "60",
         "--samples", "60", "--depth", "4", "--out", str(tmp_path)])
    assert [(r["data"], r["K"]) for r in rows] == [("gap", 1), ("gap", 2)]
    assert all(math.isfinite(r["w2"]) and 0 < r["w2"] < 0.3 for r in rows), rows
    k1, k2 = rows
    assert k2["elbo"] >= k1["elbo"] - 4 * math.hypot(k1["elbo_se"], k2["elbo_se"]), rows
    assert k1["w2_diff_se"] is None and k2["w2_diff_se"] > 0
    assert "| gap | 2 |" in (tmp_path / "mixture_nuts.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sine", "gap"])
def test_mixture_against_nuts_on_a_small_bnn(name, mixture_nuts):
    """What ``benchmarks/results/mixture_nuts`` shows, on its settings: 1-5-1 tanh net on 20
    points, NUTS (150 warmup + 200 draws, tree depth 6) as the reference; K=1 fitted 600
    steps, then K = 1, 2, 4 (split from it) 600 more. More components raise the ELBO (K=4
    above K=1 by more than 4 standard errors, no K below K=1 beyond them), but do not bring
    the predictive closer to NUTS: no K's W2 distance is below K=1's by more than 4 Monte
    Carlo standard errors of the difference."""
    rows = mixture_nuts["compare_components"](
        name, (1, 2, 4), warmup=150, samples=200, depth=6, steps=600)
    by_k = {r["K"]: r for r in rows}
    assert all(math.isfinite(r["w2"]) for r in rows), rows
    for k in (2, 4):
        assert by_k[k]["w2"] >= by_k[1]["w2"] - 4 * by_k[k]["w2_diff_se"], rows
        assert by_k[k]["elbo"] >= by_k[1]["elbo"] - 4 * math.hypot(
            by_k[k]["elbo_se"], by_k[1]["elbo_se"]), rows
    assert by_k[4]["elbo"] > by_k[1]["elbo"] + 4 * math.hypot(by_k[4]["elbo_se"],
                                                              by_k[1]["elbo_se"]), rows
