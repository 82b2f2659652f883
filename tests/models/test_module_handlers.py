"""Local reparameterisation and flipout on the layers of a BayesianModule:
closed-form moments by Monte Carlo, flipout's unbiasedness and lower gradient variance,
layers the handlers leave alone, plain Pyro SVI, a digits CNN fit, and bad input.

Monte Carlo tolerances: a mean of ``n`` draws of variance ``v`` is within ``4.5 sqrt(v/n)``
of its expectation, and the sample variance of ``n`` Gaussian draws within
``4.5 v sqrt(2/n)`` (``Var(s^2) = 2 v^2 / n``), except with probability about 1e-5 per
entry; the seeds are fixed (conftest), so each test is deterministic."""

from __future__ import annotations

import contextlib
import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.optim import Adam
from sklearn.datasets import load_digits
from torch import nn
from torch.func import functional_call

import bnn_zoo
from bnn_zoo._core.elbo import FlipoutELBO, LocalReparameterizationELBO, MeanFieldELBO
from bnn_zoo._core.handlers import flipout, local_reparameterization
from bnn_zoo._core.nn import flipout_affine, local_reparameterization_noise
from bnn_zoo._core.step import SVIStep
from bnn_zoo.guides import BayesByBackpropGuide
from bnn_zoo.models import BayesianModule, digits_cnn

F = nn.functional
Z = 4.5  # standard errors allowed by the Monte Carlo checks (see the module docstring)


def digits(n: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    data = load_digits()
    x = torch.as_tensor(data.data[start:start + n], dtype=torch.float32) / 16.0
    return x, torch.as_tensor(data.target[start:start + n], dtype=torch.long)


def gaussian_guide(moments: dict[str, tuple[torch.Tensor, torch.Tensor]]):
    """A guide drawing each site from ``N(loc, scale)``, one tensor per site."""
    def guide(x, y=None):
        for name, (loc, scale) in moments.items():
            pyro.sample(name, dist.Normal(loc, scale).to_event(loc.dim()))
    return guide


def outputs(handler, model: BayesianModule, moments: dict, x: torch.Tensor,
            samples: int | None = None) -> torch.Tensor:
    """The network outputs ``f`` of ``model`` at ``x`` under ``handler(moments)``, with the
    weights drawn from the Gaussians ``moments``: ``samples`` draws at once in a plate (the
    vectorised path, (samples, N, K)), or one draw (N, K)."""
    guide = gaussian_guide(moments)
    def plate():
        return pyro.plate("samples", samples, dim=-2) if samples else contextlib.nullcontext()

    with plate():
        guide_trace = poutine.trace(guide).get_trace(x)
    with plate(), handler(moments):
        return poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x) \
            .nodes["f"]["value"]


def random_moments(model: BayesianModule) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {name: (torch.randn(shape, dtype=torch.float64),
                   0.2 + 0.5 * torch.rand(shape, dtype=torch.float64))
            for name, shape in model.sites}


# Each layer with its own reference evaluation ``layer(x; weight, bias)`` by torch.functional.
LAYERS = {
    "linear": (lambda: nn.Linear(5, 3), (5,),
               lambda x, w, b: F.linear(x, w, b)),
    "conv": (lambda: nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, padding=1, dilation=2,
                                             groups=2), nn.Flatten()), (2, 6, 6),
             lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2)
             .flatten(1)),
    "conv_circular_no_bias": (
        lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular",
                                        bias=False), nn.Flatten()), (2, 4, 4),
        lambda x, w, b: F.conv2d(F.pad(x, (1, 1, 1, 1), mode="circular"), w, b).flatten(1)),
}


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("handler, path", [(local_reparameterization, "samples"),
                                           (local_reparameterization, "points"),
                                           (flipout, "samples")],
                         ids=["lrt-samples", "lrt-points", "flipout-samples"])
def test_layer_outputs_have_the_closed_form_moments(layer, handler, path):
    """Each output unit of ``layer(x; W, b)``, ``W ~ N(M, S^2)``, ``b ~ N(m, s^2)``, has mean
    ``layer(x; M, m)`` and variance ``layer(x^2; S^2, s^2)``, under either handler. ``samples``:
    many weight samples at once (vmap), where the outputs of two data points must also be
    uncorrelated (one shared weight draw would correlate them), and the covariance of one
    point's output units is that of weight sampling under flipout (``J diag(S^2) J^T``, ``J``
    the Jacobian of the output in the weights: the units of a convolution share weights)
    and diagonal under local reparameterisation (fresh noise per unit); ``points``: one
    weight sample and one input repeated, where local reparameterisation's fresh noise per
    data point alone must give the whole variance."""
    make_net, in_shape, reference = LAYERS[layer]
    model = BayesianModule(make_net().double(), task="classification")
    moments = random_moments(model)
    (w_loc, w_scale), (b_loc, b_scale) = [moments[name] for name, _ in model.sites] \
        + [(None, None)] * (2 - len(model.sites))  # a layer without bias has no bias site
    n = 20000
    if path == "samples":
        x = torch.randn(3, *in_shape, dtype=torch.float64)
        f = outputs(handler, model, moments, x, samples=n)
        assert f.shape[:2] == (n, 3)
        draws = f
    else:
        x = torch.randn(1, *in_shape, dtype=torch.float64)
        draws = outputs(handler, model, moments, x.expand(n, *in_shape)).unsqueeze(1)
    mean = reference(x, w_loc, b_loc)
    var = reference(x**2, w_scale**2, None if b_scale is None else b_scale**2)
    assert ((draws.mean(0) - mean).abs() < Z * (var / n).sqrt()).all()
    assert ((draws.var(0) - var).abs() < Z * var * math.sqrt(2 / n)).all()
    if path == "samples":
        # Correlation of two points' outputs: about N(0, 1/n) when they are independent.
        a, b = draws[:, 0] - draws[:, 0].mean(0), draws[:, 1] - draws[:, 1].mean(0)
        corr = (a * b).mean(0) / (a.std(0) * b.std(0))
        assert (corr.abs() < Z / math.sqrt(n)).all()
        if handler is flipout:
            cov = weight_sampling_covariance(reference, x[:1], moments, model.sites)
        else:
            cov = torch.diag(var[0])
        # A Gaussian sample covariance has standard error sqrt((C_uu C_vv + C_uv^2) / n).
        se = ((var[0, :, None] * var[0, None, :] + cov**2) / n).sqrt()
        assert ((a.T @ a / n - cov).abs() < Z * se).all()


def weight_sampling_covariance(reference, x: torch.Tensor, moments: dict, sites: list
                               ) -> torch.Tensor:
    """Covariance (K, K) of the outputs ``reference(x; W, b)`` of one input ``x`` (1, ...) for
    independent Gaussian weights: ``sum_t J_t diag(S_t^2) J_t^T`` over the tensors ``t``,
    ``J_t`` the Jacobian of the (linear) output in tensor ``t``."""
    locs = [moments[name][0] for name, _ in sites]
    jacobians = torch.autograd.functional.jacobian(
        lambda *p: reference(x, *p, *[None] * (2 - len(p)))[0], tuple(locs))
    cov = 0
    for jac, (name, _) in zip(jacobians, sites):
        jac = jac.reshape(jac.shape[0], -1)
        cov = cov + jac * moments[name][1].reshape(1, -1) ** 2 @ jac.T
    return cov


def image_net() -> nn.Sequential:
    """A CNN on digits: Conv2d(1, 4, 3) -> ReLU -> Conv2d(4, 4, 3, padding=1) -> ReLU ->
    flatten -> Linear."""
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 4, 3), nn.ReLU(),
                         nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 36, 10))


def gradient_draws(elbo_class, model, guide, x, y, repeats: int) -> tuple[torch.Tensor, ...]:
    """``repeats`` independent estimates of the negative ELBO and of its gradient with respect
    to every guide parameter (flattened)."""
    params = list(guide.parameters())
    elbo = elbo_class(max_plate_nesting=1)
    losses, grads = [], []
    for _ in range(repeats):
        loss = elbo.differentiable_loss(model, guide, x, y)
        grads.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]))
        losses.append(loss.detach())
    return torch.stack(losses), torch.stack(grads)


@pytest.fixture
def cnn_posterior():
    """The CNN, its BBB guide with a wide posterior (scale 0.3, so that weight noise dominates
    the gradient noise) at the net's own initial weights, and a minibatch of 64 digits."""
    torch.manual_seed(0)
    with pyro.settings.context(module_local_params=True):
        model = BayesianModule(image_net().double(), task="classification")
        guide = BayesByBackpropGuide(model, init_scale=0.3)
        x, y = digits(64)
        yield model, guide, x.double(), y


def test_flipout_is_unbiased(cnn_posterior):
    """Flipout's loss and gradient estimates have the expectation of weight sampling's: the
    difference of the two Monte Carlo means of the loss and of a fixed random projection of
    the gradient lies within Z standard errors of the difference."""
    model, guide, x, y = cnn_posterior
    plain_loss, plain_grad = gradient_draws(MeanFieldELBO, model, guide, x, y, 300)
    flip_loss, flip_grad = gradient_draws(FlipoutELBO, model, guide, x, y, 300)
    direction = torch.randn(plain_grad.shape[1], dtype=torch.float64)
    for plain, flip in ((plain_loss, flip_loss), (plain_grad @ direction, flip_grad @ direction)):
        se = (plain.var() / len(plain) + flip.var() / len(flip)).sqrt()
        assert abs(plain.mean() - flip.mean()) < Z * se


def total_variance(draws: torch.Tensor) -> tuple[float, float]:
    """Trace of the covariance of the rows of ``draws`` (K, D) and its standard error: the
    mean of the K squared distances to the mean (times K / (K - 1)), whose standard error is
    their standard deviation over sqrt(K)."""
    k = draws.shape[0]
    sq = ((draws - draws.mean(0)) ** 2).sum(1)
    return (sq.mean() * k / (k - 1)).item(), (sq.std() / math.sqrt(k)).item()


def test_flipout_lowers_the_gradient_variance_on_a_minibatch(cnn_posterior):
    """On a conv net with a minibatch of 64, flipout's gradient estimates (with respect to the
    guide's means and scales) vary less than weight sampling's: the total variances differ by
    more than Z standard errors of their difference."""
    model, guide, x, y = cnn_posterior
    plain, plain_se = total_variance(gradient_draws(MeanFieldELBO, model, guide, x, y, 200)[1])
    flip, flip_se = total_variance(gradient_draws(FlipoutELBO, model, guide, x, y, 200)[1])
    assert plain - flip > Z * math.hypot(plain_se, flip_se)


@pytest.mark.parametrize("handler", [local_reparameterization, flipout])
def test_other_layers_keep_their_sampled_weights(handler):
    """Only a Linear/Conv layer whose weight and bias both have moments is evaluated by the
    estimator; a LayerNorm (which also has a weight and a bias) and a Linear whose bias has
    no moments use the sampled tensors, as a run without the handler does (and the net is
    left without hooks)."""
    torch.set_default_dtype(torch.float64)
    try:
        net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.LayerNorm(4), nn.Linear(4, 2))
        model = BayesianModule(net, task="classification")
        x = torch.randn(6, 3)
        draws = {name: torch.randn(shape) for name, shape in model.sites}
        # Layer 0 at its mean with no spread (and, for flipout, drawn at its mean), so the
        # estimator's output is layer(x; mean) exactly; every other site's moments differ
        # from its draw, which the layer must use.
        mean0 = {"0.weight": torch.randn(4, 3), "0.bias": torch.randn(4)}
        if handler is flipout:
            draws.update(mean0)
        moments = {name: (draws[name] + 1.0, torch.ones_like(draws[name]))
                   for name in ("2.weight", "2.bias", "3.weight")}
        moments.update({name: (loc, torch.zeros_like(loc)) for name, loc in mean0.items()})
        deltas = poutine.trace(lambda: {k: pyro.sample(k, dist.Delta(v, event_dim=v.dim()))
                                        for k, v in draws.items()}).get_trace()
        with handler(moments):
            f = poutine.trace(poutine.replay(model, trace=deltas)).get_trace(x).nodes["f"]
        plain = poutine.trace(poutine.replay(model, trace=deltas)).get_trace(x).nodes["f"]
    finally:
        torch.set_default_dtype(torch.float32)
    torch.testing.assert_close(f["value"], functional_call(net, {**draws, **mean0}, (x,)))
    torch.testing.assert_close(plain["value"], functional_call(net, draws, (x,)))
    assert all(not m._forward_hooks for m in net.modules())


def test_layer_without_bias_has_finite_gradients_at_zero_input():
    """A unit whose inputs are all zero has variance 0 without a bias; local
    reparameterisation floors it, so the gradient is finite (sqrt's is infinite at 0)."""
    model = BayesianModule(nn.Sequential(nn.Linear(3, 2, bias=False)), task="classification")
    loc = torch.randn(2, 3, requires_grad=True)
    scale = torch.rand(2, 3, requires_grad=True)
    f = outputs(local_reparameterization, model, {"0.weight": (loc, scale)}, torch.zeros(4, 3))
    grads = torch.autograd.grad(f.sum(), [loc, scale])
    assert all(torch.isfinite(g).all() for g in grads)


def test_variance_floor_has_the_values_of_clamp_min():
    """The floor of local_reparameterization_noise (``threshold``, for its cheaper backward)
    gives ``clamp_min``'s values, NaN and values below or at the floor included, and its
    gradient wherever the variance is not exactly the floor."""
    tiny = torch.finfo(torch.float32).tiny
    layer, x = nn.Linear(1, 1, bias=False), torch.ones(1, 1)  # the variance is S^2 * 1^2
    for value in [math.nan, 0.0, tiny / 2, tiny, 2 * tiny, 1e-3, 2.0, math.inf]:
        var = torch.tensor([[value]], requires_grad=True)
        torch.manual_seed(0)
        noise = local_reparameterization_noise(layer, x, {"weight": var})
        torch.manual_seed(0)
        expected = var.clamp_min(tiny).sqrt() * torch.randn(1, 1)
        torch.testing.assert_close(noise, expected, rtol=0, atol=0, equal_nan=True)
        if value == value and value != tiny:  # at NaN and at the floor the gradients differ
            grads = [torch.autograd.grad(t.sum(), var)[0] for t in (noise, expected)]
            torch.testing.assert_close(*grads, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("particles", [1, 3])
@pytest.mark.parametrize("elbo_class, handler", [(LocalReparameterizationELBO,
                                                  local_reparameterization),
                                                 (FlipoutELBO, flipout)],
                         ids=["lrt", "flipout"])
def test_plain_pyro_svi_with_the_handlers(elbo_class, handler, particles):
    """Pyro's SVI trains the CNN with the zoo's ELBO (which installs the handler), and with
    Pyro's own Trace_ELBO on a model run under the handler by hand; Predictive then works."""
    x, y = digits(32)
    with pyro.settings.context(module_local_params=True):
        model = BayesianModule(digits_cnn(3), task="classification")
        guide = BayesByBackpropGuide(model)

        def model_under_handler(x, y=None):
            moments = {name: (q.loc, q.scale) for name, q in guide.distributions().items()}
            with handler(moments):
                return model(x, y)

        losses = []
        for pair, elbo in ((model, elbo_class), (model_under_handler, Trace_ELBO)):
            svi = SVI(pair, guide, Adam({"lr": 1e-2}),
                      elbo(num_particles=particles, vectorize_particles=particles > 1,
                           max_plate_nesting=1))
            losses += [svi.step(x, y) for _ in range(4)]
        out = Predictive(model, guide=guide, num_samples=5, parallel=True,
                         return_sites=["f"])(x)
    assert all(math.isfinite(v) for v in losses)
    assert out["f"].shape == (5, 32, 10)


@pytest.mark.parametrize("elbo", [LocalReparameterizationELBO, FlipoutELBO])
def test_bbb_fit_of_the_digits_cnn(elbo):
    """Sanity: Bayes by Backprop on the digits CNN with either estimator fits 300 digits and
    predicts 200 held-out ones well above chance (1/10)."""
    x, y = digits(300)
    x_test, y_test = digits(200, start=1000)
    model = BayesianModule(digits_cnn(4), task="classification")
    guide = BayesByBackpropGuide(model)
    result = bnn_zoo.fit(model, guide, x, y, steps=80, lr=2e-2, batch_size=50, elbo=elbo,
                         seed=0)
    assert all(math.isfinite(v) for v in result.losses)
    assert (bnn_zoo.predict(model, guide, x, num_samples=8).mean.argmax(-1) == y) \
        .float().mean() > 0.9
    assert (bnn_zoo.predict(model, guide, x_test, num_samples=8).mean.argmax(-1) == y_test) \
        .float().mean() > 0.7


@pytest.mark.parametrize("particles", [1, 3])
@pytest.mark.parametrize("elbo", [MeanFieldELBO, LocalReparameterizationELBO, FlipoutELBO])
def test_jit_loss_equals_eager_loss(elbo, particles):
    """``SVIStep(..., jit=True)`` traces the module's loss, with the handlers' hooks and noise
    and with vmap over particles: the same losses as the eager step under the same seeds."""
    x, y = digits(60)
    losses = []
    for jit in (False, True):
        pyro.set_rng_seed(0)
        model = BayesianModule(digits_cnn(3), task="classification")
        guide = BayesByBackpropGuide(model, init_scale=0.1)
        step = SVIStep(model, guide, x, y, lr=0.01, batch_size=20, num_particles=particles,
                       seed=0, elbo=elbo, jit=jit)
        pyro.set_rng_seed(1)
        losses.append([step() for _ in range(4)])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_flipout_affine_has_the_moments_of_weight_sampling():
    """Flipout on the zoo's affine layer ``h @ W + b``: each output has mean ``h @ M + m`` and
    variance ``h^2 @ S^2 + s^2``, and different points' outputs are uncorrelated."""
    h = torch.randn(3, 4, dtype=torch.float64)
    (w_loc, w_scale), (b_loc, b_scale) = [(torch.randn(shape, dtype=torch.float64),
                                           0.2 + torch.rand(shape, dtype=torch.float64))
                                          for shape in ((4, 2), (2,))]
    n = 20000
    w = w_loc + w_scale * torch.randn(n, 4, 2, dtype=torch.float64)
    b = b_loc + b_scale * torch.randn(n, 2, dtype=torch.float64)
    draws = flipout_affine(h, (w, w_loc), (b, b_loc))
    mean, var = h @ w_loc + b_loc, h**2 @ w_scale**2 + b_scale**2
    assert ((draws.mean(0) - mean).abs() < Z * (var / n).sqrt()).all()
    assert ((draws.var(0) - var).abs() < Z * var * math.sqrt(2 / n)).all()
    a, c = draws[:, 0] - mean[0], draws[:, 1] - mean[1]
    assert (((a * c).mean(0) / (var[0] * var[1]).sqrt()).abs() < Z / math.sqrt(n)).all()


@pytest.mark.parametrize("moments, error, match", [
    ([("0.weight", (torch.zeros(2, 3), torch.ones(2, 3)))], TypeError, "mapping"),
    ({"0.weight": torch.zeros(2, 3)}, TypeError, r"moments\['0.weight'\]"),
    ({"0.weight": (torch.zeros(2, 3), 1.0)}, TypeError, "pair of tensors"),
    ({"0.weight": (torch.zeros(3, 2), torch.ones(3, 2))}, ValueError,
     r"site '0.weight' to broadcast to the shape \(2, 3\)"),
])
@pytest.mark.parametrize("handler", [local_reparameterization, flipout])
def test_bad_moments_are_refused_naming_the_site(handler, moments, error, match):
    model = BayesianModule(nn.Sequential(nn.Linear(3, 2)), task="classification")
    with pytest.raises(error, match=match):
        with handler(moments):
            model(torch.randn(4, 3))


def test_cnn_benchmark_runs_and_writes_its_ratios(tmp_path, benchmark_script):
    """``benchmarks/cnn.py`` with tiny flags: one row per estimator with positive times and
    the zoo-to-hand-written ratio, written as Markdown, CSV and JSON."""
    script = benchmark_script("cnn.py")
    rows = script["main"](["--repeats", "1", "--inner", "1", "--batch", "32", "--channels", "2",
                           "--out", str(tmp_path)])["rows"]
    assert [r["estimator"] for r in rows] == ["sample", "lrt", "flipout"]
    for row in rows:
        assert row["zoo_vs_hand"] == pytest.approx(row["zoo_bbb_ms"] / row["torch_bbb_ms"])
        assert all(row[k] > 0 for k in ("torch_map_ms", "torch_bbb_ms", "zoo_bbb_ms"))
    assert {p.name for p in tmp_path.iterdir()} >= {"cnn.md", "cnn.csv", "cnn.json"}
