"""The prior precision of every Laplace structure tuned (MacKay 1992; Daxberger et al. 2021):
each structure's evidence and effective number of parameters against a brute-force dense
computation from its own definition (float64), the fixed point and the gradient update at a
stationary point of that evidence (the exact Hessian projected onto the PSD cone where
tuning makes its precision indefinite), and the held-out grid against its scores recomputed by
hand."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from bnn_zoo import data, zoo
from bnn_zoo._core.lbfgs import minimize_lbfgs
from bnn_zoo._core.nn import mlp_forward
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods.laplace import Laplace
from bnn_zoo.methods.laplace import _evidence as laplace_evidence
from bnn_zoo.methods.laplace._curvature import ParameterLayout
from bnn_zoo.methods.laplace._evidence import EvidenceSettings
from bnn_zoo.methods.laplace._problem import (
    CurvatureSettings,
    LaplaceProblem,
    laplace_posterior,
    refine_map,
)
from bnn_zoo.methods.laplace._validation import (
    GRID,
    ValidationSettings,
    held_out_log_likelihood,
    tune_on_held_out,
)
from bnn_zoo.models import BayesianMLP
from bnn_zoo.models._likelihood import Categorical, Gaussian

D = torch.float64
STRUCTURES = ("hessian", "ggn", "kron", "kron_separate", "diag", "low_rank", "last_layer",
              "subnetwork")
SUBNETWORK = (0, 4, 9, 17, 22, 30, 34)
RANK = 6


def problem(task: str, n: int = 16):
    """A 3-4-3-K tanh MLP at a MAP under ``alpha = 1``, ``beta = 1`` of data from a random
    teacher of the same shape (so that every layer's weights are pinned by the data; the
    exact Hessian's negative eigenvalues are small there)."""
    g = torch.Generator().manual_seed(11)
    out = 1 if task == "regression" else 3
    model = BayesianMLP(3, out, (4, 3), activation="tanh", task=task,
                        noise_scale=1.0 if task == "regression" else None).double()
    layout = ParameterLayout.from_model(model)
    teacher = 1.5 * torch.randn(layout.num_parameters, generator=g, dtype=D)
    x = torch.randn(n, 3, generator=g, dtype=D)
    f = outputs(model, layout, teacher, x)
    y = f[:, 0] + 0.1 * torch.randn(n, generator=g, dtype=D) if task == "regression" \
        else f.argmax(-1)
    likelihood = Gaussian() if task == "regression" else Categorical()
    theta = refine_map(teacher, x, y, layout, likelihood, torch.ones_like(teacher),
                       torch.tensor(1.0, dtype=D))
    return model, layout, theta, x, y


def outputs(model, layout, theta, x):
    return mlp_forward(x, layout.network(theta), model.act)


def energy(model, layout, theta, x, y) -> torch.Tensor:
    """``E_D``: half the squared error, or the cross-entropy, summed."""
    f = outputs(model, layout, theta, x)
    if model.task == "regression":
        return 0.5 * ((y - f[:, 0]) ** 2).sum()
    return torch.nn.functional.cross_entropy(f, y, reduction="sum")


def output_hessians(model, f):
    """(N, K, K) the Hessian of each point's negative log-likelihood in the outputs."""
    if model.task == "regression":
        return torch.ones(f.shape[0], 1, 1, dtype=D)
    p = torch.softmax(f, -1)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def dense_ggn(model, layout, theta, x):
    jac = torch.autograd.functional.jacobian(lambda t: outputs(model, layout, t, x), theta)
    lam = output_hessians(model, outputs(model, layout, theta, x))
    return torch.einsum("nkp,nkl,nlq->pq", jac, lam, jac), jac


def kron_reference(model, layout, theta, x, separate: bool):
    """Per layer ``Q = 1/N sum_n a_n a_n^T`` (``a_n`` the layer's input with a one) and
    ``G = sum_n J_n^T Lambda_n J_n`` (``J_n`` the outputs' Jacobian in the layer's
    pre-activations: its bias columns), as a block-diagonal matrix; ``separate``: the
    weights' ``Q`` without the bias row and the bias block ``G`` apart."""
    _, jac = dense_ggn(model, layout, theta, x)
    lam = output_hessians(model, outputs(model, layout, theta, x))
    out = torch.zeros(len(theta), len(theta), dtype=D)
    h = x
    for (w, b), index in zip(layout.network(theta), layout.layer_slices):
        a = torch.cat([h, torch.ones(len(x), 1, dtype=D)], 1)
        jz = jac[:, :, index.stop - b.shape[-1]:index.stop]
        q = a.T @ a / len(x)
        g = torch.einsum("nko,nkl,nlr->or", jz, lam, jz)
        if separate:
            w_stop = index.stop - b.shape[-1]
            weights = slice(index.start, w_stop)
            out[weights, weights] = torch.kron(q[:-1, :-1].contiguous(), g.contiguous())
            out[w_stop:index.stop, w_stop:index.stop] = g
        else:
            out[index, index] = torch.kron(q, g.contiguous())
        h = model.act(h @ w + b)
    return out


def reference_curvature(structure: str, model, layout, theta, x, y, clipped: bool = False):
    """``(H, covered)``: the structure's curvature as a dense (P, P) matrix, from its
    definition (the exact Hessian projected onto the PSD cone if ``clipped``), and the (P,)
    mask of the weights it covers."""
    covered = torch.ones(len(theta), dtype=torch.bool)
    ggn, _ = dense_ggn(model, layout, theta, x)
    if structure == "hessian":
        h = torch.autograd.functional.hessian(lambda t: energy(model, layout, t, x, y), theta)
        if clipped:
            evals, evecs = torch.linalg.eigh(h)
            h = (evecs * evals.clamp_min(0)) @ evecs.T
    elif structure == "ggn":
        h = ggn
    elif structure in ("kron", "kron_separate"):
        h = kron_reference(model, layout, theta, x, structure == "kron_separate")
    elif structure == "diag":
        h = torch.diag(ggn.diag())
    elif structure == "low_rank":
        evals, evecs = torch.linalg.eigh(ggn)
        h = (evecs[:, -RANK:] * evals[-RANK:].clamp_min(0)) @ evecs[:, -RANK:].T
    else:
        index = (torch.tensor(SUBNETWORK) if structure == "subnetwork"
                 else torch.arange(len(theta))[layout.layer_slices[-1]])
        covered = torch.zeros(len(theta), dtype=torch.bool)
        covered[index] = True
        h = torch.where(covered[:, None] & covered[None, :], ggn, 0)
    return h, covered


def brute_force_evidence(structure, model, layout, theta, x, y, alpha_layers, beta,
                         clipped: bool = False):
    """PRML 5.175 over the covered weights, with ``log |A|`` of the dense
    ``A = diag(alpha) + beta H``, and ``gamma_l = sum_{i in l} (1 - alpha_i [A^-1]_ii)``."""
    h, covered = reference_curvature(structure, model, layout, theta, x, y, clipped)
    alpha = alpha_layers[layout.layer_index(theta)]
    a = alpha[covered]
    precision = torch.diag(a) + beta * h[covered][:, covered]
    value = (-0.5 * (a * theta[covered] ** 2).sum() + 0.5 * torch.log(a).sum()
             - 0.5 * torch.linalg.slogdet(precision)[1] - beta * energy(model, layout, theta, x, y))
    if model.task == "regression":
        value = value + 0.5 * len(y) * (torch.log(beta) - math.log(2 * math.pi))
    gamma = torch.zeros(len(theta), dtype=D)
    gamma[covered] = 1 - a * torch.linalg.inv(precision).diag()
    layers = torch.zeros(layout.num_layers, dtype=D).index_add_(0, layout.layer_index(theta),
                                                                gamma)
    return value, layers


def posterior(structure, model, theta, x, y, **evidence):
    return laplace_posterior(
        model, theta, x, y, alpha=3.0,
        curvature=CurvatureSettings(structure, rank=RANK, subnetwork=SUBNETWORK,
                                    indefinite="clip"),
        evidence=EvidenceSettings(refine=False, **evidence))


@pytest.mark.parametrize("task", ["regression", "classification"])
@pytest.mark.parametrize("structure", STRUCTURES)
def test_evidence_and_effective_parameters_equal_a_dense_computation(structure, task):
    model, layout, theta, x, y = problem(task)
    post = posterior(structure, model, theta, x, y)
    beta = torch.tensor(1.7 if task == "regression" else 1.0, dtype=D)
    for alpha in ([3.0] * 3, [2.5, 4.0, 6.0]):
        alpha = torch.tensor(alpha, dtype=D)
        expected, gamma = brute_force_evidence(structure, model, layout, theta, x, y, alpha, beta)
        torch.testing.assert_close(post.log_evidence(alpha, beta), expected)
        tuned = post.__class__(**{**vars(post), "alpha": alpha, "beta": beta})
        torch.testing.assert_close(tuned.effective_parameters(), gamma)


@pytest.mark.parametrize("task", ["regression", "classification"])
@pytest.mark.parametrize("structure", STRUCTURES)
@pytest.mark.parametrize("per_layer", [False, True], ids=["shared", "per_layer"])
def test_fixed_point_and_gradient_reach_a_stationary_point_of_the_dense_evidence(
        structure, task, per_layer):
    """At the MAP and curvature held fixed (no refits), MacKay's fixed point ends where the
    brute-force evidence has zero derivative in ``log alpha`` (along the shared direction,
    or per covered layer) and in ``log beta``; the gradient update ends at the same evidence
    (where the evidence is flat in a layer's ``alpha``, not always at the same ``alpha``)."""
    model, layout, theta, x, y = problem(task)
    regression = task == "regression"
    ends = []
    for method in ("fixed_point", "gradient"):
        post = posterior(structure, model, theta, x, y, evidence=method, iterations=500,
                         tol=1e-11, per_layer_alpha=per_layer)
        assert post.converged
        log_alpha = post.alpha.log().clone().requires_grad_()
        log_beta = post.beta.log().clone().requires_grad_()
        value, _ = brute_force_evidence(structure, model, layout, theta, x, y, log_alpha.exp(),
                                        log_beta.exp(), clipped=post.clipped > 0)
        d_alpha, d_beta = torch.autograd.grad(value, [log_alpha, log_beta], allow_unused=True)
        covered = post.covered_layers
        d_alpha = d_alpha[covered] if per_layer else d_alpha[covered].sum()
        torch.testing.assert_close(d_alpha, torch.zeros_like(d_alpha), atol=1e-6, rtol=0)
        if regression:
            assert float(d_beta) == pytest.approx(0, abs=1e-6)
        ends.append(float(value.detach()))
    assert ends[0] == pytest.approx(ends[1], abs=1e-9)


def test_the_gradient_update_reads_an_overflowing_trial_point_as_no_decrease(monkeypatch):
    # A line search may try log-precisions so large that exp gives 0 or inf; the evidence
    # is then undefined (the precision is not finite), and the objective must say "no
    # decrease" (inf) instead of failing inside a factorisation.
    model, layout, theta, x, y = problem("regression")
    seen = []

    def far_trial_first(fun, start, **options):
        seen.append(fun(start + 1e4 * torch.tensor([1.0, -1.0], dtype=D)))
        return minimize_lbfgs(fun, start, **options)

    monkeypatch.setattr(laplace_evidence, "minimize_lbfgs", far_trial_first)
    post = posterior("ggn", model, theta, x, y, evidence="gradient")
    assert seen  # one far trial per update of the evidence loop
    assert all(float(f) == math.inf and not grad.any() for f, grad in seen)
    assert bool(torch.isfinite(post.alpha).all()) and bool(torch.isfinite(post.beta).all())


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_held_out_grid_keeps_the_factors_with_the_best_held_out_likelihood(task):
    """The chosen factors are the argmax of the held-out log-likelihood recomputed here
    from the closed-form GLM predictive of each candidate (dense covariance), and the
    posterior takes them; a classifier's ``beta`` stays 1."""
    model, layout, theta, x, y = problem(task, n=20)
    x_fit, y_fit, x_val, y_val = x[:14], y[:14], x[14:], y[14:]
    post = posterior("ggn", model, theta, x_fit, y_fit)
    settings = ValidationSettings(holdout=0.3, grid=(0.01, 0.3, 1.0, 10.0, 300.0),
                                  beta_grid=(0.1, 1.0, 5.0))
    tuned, scores = tune_on_held_out(post, x_val, y_val, settings)
    f = outputs(model, layout, theta, x_val)
    _, jac = dense_ggn(model, layout, theta, x_val)
    expected = {}
    for factor in settings.grid:
        for beta_factor in (settings.beta_grid if task == "regression" else (1.0,)):
            alpha, beta = 3.0 * factor, post.beta * beta_factor
            cov = torch.linalg.inv(alpha * torch.eye(len(theta), dtype=D)
                                   + beta * dense_ggn(model, layout, theta, x_fit)[0])
            var = torch.einsum("nkp,pq,nkq->nk", jac, cov, jac)
            if task == "regression":
                ll = torch.distributions.Normal(f[:, 0], (var[:, 0] + 1 / beta).sqrt())
                ll = ll.log_prob(y_val)
            else:
                probs = torch.softmax(f * (1 + math.pi / 8 * var).rsqrt(), -1)
                ll = probs[torch.arange(len(y_val)), y_val].log()
            expected[(factor, beta_factor)] = float(ll.mean())
    assert {(a, b): v for a, b, v in scores} == pytest.approx(expected, rel=1e-10)
    best = max(expected, key=expected.get)
    torch.testing.assert_close(tuned.alpha, post.alpha * best[0])
    torch.testing.assert_close(tuned.beta, post.beta * best[1])
    assert held_out_log_likelihood(tuned, x_val, y_val) == pytest.approx(expected[best])


def test_holdout_fits_the_map_on_the_rest_and_auto_holds_out_a_classifiers_points():
    d = data.load("two_moons")
    x, y = d.x_train[:100], d.y_train[:100]
    budget = Budget(steps=5, batch_size=None, jit=False)
    cases = ((0.2, "classification", 80), ("auto", "classification", 90),
             ("auto", "regression", 100))
    for holdout, task, fitted_points in cases:
        method = Laplace(holdout=holdout, refine=False)
        classes = 2 if task == "classification" else 1
        targets = y if task == "classification" else y.to(x.dtype)
        fit = method.fit(partial(BayesianMLP, 2, classes, (4,), task=task), x, targets,
                         task=task, seed=0, budget=budget, progress=False)
        assert fit.laplace.num_outputs == fitted_points
    assert ValidationSettings(holdout="auto").fraction("regression") == 0.0


@pytest.mark.parametrize("name", ["laplace", "laplace_full", "laplace_ggn", "laplace_diag",
                                  "laplace_kron", "laplace_last_layer"])
def test_every_laplace_entry_tunes_its_prior_precision(name):
    method = zoo.get(name).method
    assert method.evidence.evidence == "fixed_point"
    assert method.validation.fraction("classification") > 0
    assert method.evidence.for_task("classification").refine is False


@pytest.mark.parametrize("task, refits", [("regression", True), ("classification", False)])
def test_auto_refine_refits_a_regressions_map_and_not_a_classifiers(task, refits):
    """``refine="auto"`` builds the posterior of ``refine=True`` for a regression and of
    ``refine=False`` (post hoc, at the MAP given) for a classifier."""
    model, _, theta, x, y = problem(task)
    start = theta + 0.05  # off the MAP, so that a refit moves it

    def fit(refine):
        return laplace_posterior(model, start, x, y, alpha=3.0, evidence=EvidenceSettings(
            "fixed_point", refine=refine, iterations=3))

    auto, same, other = fit("auto"), fit(refits), fit(not refits)
    torch.testing.assert_close(auto.theta, same.theta, rtol=0, atol=0)
    torch.testing.assert_close(auto.alpha, same.alpha, rtol=0, atol=0)
    assert (auto.theta - other.theta).abs().max() > 1e-3
    assert torch.equal(auto.theta, start) is not refits


@pytest.mark.parametrize("field, value, match", [
    ("holdout", 1.0, "holdout"), ("holdout", "some", "holdout"), ("holdout", True, "holdout"),
    ("grid", (), "grid"), ("grid", (1.0, -2.0), "grid"), ("beta_grid", (math.inf,), "beta_grid"),
    ("refine", "sometimes", "refine"),
])
def test_bad_validation_settings_are_refused_by_name(field, value, match):
    with pytest.raises((ValueError, TypeError), match=match):
        Laplace(**{field: value})
    assert len(GRID) == 25 and GRID[0] == pytest.approx(1e-3) and GRID[-1] == pytest.approx(1e3)


def test_a_problem_without_refits_keeps_its_curvature_through_the_evidence_loop(monkeypatch):
    """The problem owns ``refine``: built with ``refine=False``, the evidence loop never
    rebuilds the curvature, whatever ``EvidenceSettings.refine`` says."""
    model, _, theta, x, y = problem("regression")
    steps = LaplaceProblem.of(model, x, y, curvature=CurvatureSettings("kron"), refine=False)
    post = steps.fit(theta, alpha=3.0)
    rebuilt = []
    monkeypatch.setattr(LaplaceProblem, "posterior",
                        lambda self, *args: rebuilt.append(args) or post)
    tuned = steps.maximize_evidence(post, EvidenceSettings("fixed_point", refine=True,
                                                           iterations=3))
    assert not rebuilt
    assert torch.equal(tuned.theta, theta)


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_the_steps_a_user_calls_are_those_laplace_posterior_chains(task):
    """``LaplaceProblem.of(...).fit`` then ``maximize_evidence`` give ``laplace_posterior``'s
    posterior bit for bit; a prior precision per weight is refused by the evidence step."""
    model, layout, theta, x, y = problem(task)
    curvature, evidence = CurvatureSettings("kron"), EvidenceSettings("fixed_point",
                                                                      iterations=3)
    whole = laplace_posterior(model, theta + 0.05, x, y, curvature=curvature,
                              evidence=evidence, alpha=3.0)
    steps = LaplaceProblem.of(model, x, y, curvature=curvature)
    post = steps.maximize_evidence(steps.fit(theta + 0.05, alpha=3.0), evidence)
    for name in ("theta", "alpha", "beta", "energy"):
        assert torch.equal(getattr(post, name), getattr(whole, name)), name
    assert post.history == whole.history
    per_weight = steps.fit(theta, alpha=torch.full((layout.num_parameters,), 3.0, dtype=D))
    with pytest.raises(ValueError, match="one per weight"):
        steps.maximize_evidence(per_weight, evidence)
