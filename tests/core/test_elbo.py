"""The mean-field ELBO's own closed-form Gaussian KL and its loss against torch's
``kl_divergence`` and Pyro's ``TraceMeanField_ELBO``, in float64: the same values and
gradients up to rounding (``MeanFieldELBO`` computes the same objective with fewer tensor
operations; see :mod:`bnn_zoo._core.elbo.mean_field`)."""

from __future__ import annotations

import contextlib
import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoDelta, init_to_sample
from torch.distributions import Normal, kl_divergence

from bnn_zoo._core.elbo import (
    LocalReparameterizationELBO,
    MeanFieldELBO,
    gaussian_kl,
    gaussian_log_density,
    mean_field,
)
from bnn_zoo._core.elbo.mean_field import _summed_gaussian_kl
from bnn_zoo._core.handlers import scale_global_sites, subsample_data
from bnn_zoo._core.nn import affine
from bnn_zoo.guides import BayesByBackpropGuide
from bnn_zoo.models import BayesianMLP, BayesianModule, GaussianPrior, ScaleMixturePrior

F64 = {"dtype": torch.float64}
# float64 rounding of sums of a few hundred O(1) terms
TOL = {"rtol": 1e-12, "atol": 1e-10}


@pytest.mark.parametrize("p_shape, expand", [
    ((), True),            # the zoo's priors: N(0, s).expand(shape), an expanded scalar
    ((4, 3), False),       # a prior with a mean and scale per weight
    ((1, 3), True),        # expanded along one dimension only
    ((2, 1, 1), True),     # a prior with batch dimensions the guide lacks (broadcast up)
])
def test_gaussian_kl_is_torchs_kl_divergence(p_shape, expand):
    q_loc, q_scale = torch.randn(4, 3, **F64), torch.rand(4, 3, **F64) + 0.05
    p_loc, p_scale = torch.randn(p_shape, **F64), torch.rand(p_shape, **F64) + 0.5
    if expand:
        shape = torch.broadcast_shapes(p_shape, (4, 3))
        p_loc, p_scale = p_loc.expand(shape), p_scale.expand(shape)
    expected = kl_divergence(Normal(q_loc, q_scale), Normal(p_loc, p_scale))
    kl = gaussian_kl(q_loc, q_scale, p_loc, p_scale)
    assert kl.shape == expected.shape
    torch.testing.assert_close(kl, expected, **TOL)


@pytest.mark.parametrize("p_shape, expand", [((), True), ((4, 3), False), ((1, 3), True),
                                            ((2, 1, 1), True), ((), False)])
@pytest.mark.parametrize("q_scale_shape", [(4, 3), (1, 3)])
def test_summed_gaussian_kl_is_the_sum_of_torchs_with_its_gradient(p_shape, expand,
                                                                     q_scale_shape):
    """The summed KL (closed-form gradient for a prior of one loc and scale, the elementwise
    form otherwise) is the sum of torch's elementwise KL, and so are its gradient in every
    argument and that gradient's own gradient."""
    q_loc = torch.randn(4, 3, **F64, requires_grad=True)
    q_scale = (torch.rand(q_scale_shape, **F64) + 0.05).requires_grad_()
    p_loc = torch.randn(p_shape, **F64, requires_grad=True)
    p_scale = (torch.rand(p_shape, **F64) + 0.5).requires_grad_()
    inputs = [q_loc, q_scale, p_loc, p_scale]
    if expand:
        shape = torch.broadcast_shapes(p_shape, (4, 3))
        p_loc, p_scale = p_loc.expand(shape), p_scale.expand(shape)
    expected = kl_divergence(Normal(q_loc, q_scale), Normal(p_loc, p_scale)).sum()
    kl = _summed_gaussian_kl(q_loc, q_scale, p_loc, p_scale)
    assert kl.shape == ()
    torch.testing.assert_close(kl, expected, **TOL)
    grads = torch.autograd.grad(kl, inputs, create_graph=True)
    wanted = torch.autograd.grad(expected, inputs, create_graph=True)
    for grad, want in zip(grads, wanted):
        torch.testing.assert_close(grad, want, **TOL)
    # the gradient's own gradient (a Hessian-vector product) is torch's too
    vectors = [torch.randn_like(t) for t in inputs]
    for second, want in zip(
            torch.autograd.grad(sum((g * v).sum() for g, v in zip(grads, vectors)), inputs),
            torch.autograd.grad(sum((g * v).sum() for g, v in zip(wanted, vectors)), inputs)):
        torch.testing.assert_close(second, want, **TOL)


def test_gaussian_kl_is_zero_at_the_prior_and_grows_with_the_mean_gap():
    loc, scale = torch.randn(5, **F64), torch.rand(5, **F64) + 0.1
    torch.testing.assert_close(gaussian_kl(loc, scale, loc, scale), torch.zeros(5, **F64),
                               rtol=0, atol=1e-15)
    # KL(N(m, s^2) || N(0, s^2)) = m^2 / (2 s^2)
    torch.testing.assert_close(gaussian_kl(loc, scale, torch.zeros(5, **F64), scale),
                               loc**2 / (2 * scale**2), **TOL)


def mlp_pair(prior=None, replicas=None):
    model = BayesianMLP(3, 1, (6,), prior=prior, noise_scale=None).double()
    if replicas is not None:
        model = model.replicated(replicas)
    guide = BayesByBackpropGuide(model, init_scale=0.2).double()
    with torch.no_grad():
        for rho in guide.rho.parameters():
            rho.uniform_(-3.0, 0.0)
    return model, guide


def loss_and_grads(elbo, model, guide, x, y, seed=3, handlers=()):
    """The loss on the noise of ``seed`` and its gradient in every parameter, by name."""
    pyro.set_rng_seed(seed)
    with poutine.trace(param_only=True) as params, contextlib.ExitStack() as stack:
        for handler in handlers:
            stack.enter_context(handler)
        loss = elbo.differentiable_loss(model, guide, x, y)
    names = sorted(params.trace.nodes)
    tensors = [params.trace.nodes[name]["value"].unconstrained() for name in names]
    return loss.detach(), dict(zip(names, torch.autograd.grad(loss, tensors)))


def assert_elbos_agree(reference, model, guide, x, y, *, case: str = "full",
                       min_params: int = 1, **kwargs) -> None:
    """``MeanFieldELBO(**kwargs)`` and ``reference(**kwargs)`` give the same loss and the same
    gradient in every parameter on the same noise (under the zoo's minibatch and KL-weight
    handlers when ``case`` is ``"minibatch_kl_weight"``)."""
    handlers = ()
    if case == "minibatch_kl_weight":
        handlers = (subsample_data(torch.tensor([1, 4, 7, 8])), scale_global_sites(0.3))
    ours = loss_and_grads(MeanFieldELBO(**kwargs), model, guide, x, y, handlers=handlers)
    theirs = loss_and_grads(reference(**kwargs), model, guide, x, y, handlers=handlers)
    torch.testing.assert_close(ours[0], theirs[0], **TOL)
    assert ours[1].keys() == theirs[1].keys() and len(ours[1]) >= min_params
    for name, grad in ours[1].items():
        torch.testing.assert_close(grad, theirs[1][name], **TOL)


@pytest.mark.parametrize("summed", [False, True], ids=["elementwise_kl", "summed_kl"])
@pytest.mark.parametrize("case", ["full", "minibatch_kl_weight", "particles", "replicas",
                                  "fan_in_prior"])
def test_mean_field_elbo_is_pyros_trace_mean_field_elbo(case, summed, monkeypatch):
    """The loss and every gradient equal ``TraceMeanField_ELBO``'s on the same noise, with
    the zoo's minibatch and KL-weight handlers (float scales), vectorised particles, and
    replicas (a batch dimension on every site); with every site's KL elementwise, and with
    every site's summed in closed form (as a wide net's large sites are)."""
    monkeypatch.setattr(mean_field, "SUMMED_KL_ELEMENTS", 1 if summed else 1 << 62)
    prior = GaussianPrior(0.7, fan_in=True) if case == "fan_in_prior" else GaussianPrior(1.3)
    replicas = 2 if case == "replicas" else None
    model, guide = mlp_pair(prior, replicas)
    lead = () if replicas is None else (replicas,)
    x, y = torch.randn(*lead, 10, 3, **F64), torch.randn(*lead, 10, **F64)
    particles = 3 if case == "particles" else 1
    assert_elbos_agree(pyro.infer.TraceMeanField_ELBO, model, guide, x, y, case=case,
                       min_params=8, num_particles=particles,
                       vectorize_particles=particles > 1,
                       max_plate_nesting=1 if replicas is None else 2)


def test_tensor_site_scales_weight_each_batch_element_after_the_event_sum():
    """A latent site with batch dimensions under a tensor scale: the KL of each batch
    element (summed over the event dims) is weighted by its own scale, as in Pyro."""
    loc = torch.randn(3, 4, **F64, requires_grad=True)
    scale = torch.rand(3, 4, **F64) + 0.1
    weights = torch.tensor([0.5, 1.0, 2.0], **F64)

    def model():
        with pyro.plate("groups", 3), poutine.scale(scale=weights):
            pyro.sample("w", dist.Normal(torch.zeros((), **F64), 2.0).expand([3, 4]).to_event(1))

    def guide():
        with pyro.plate("groups", 3), poutine.scale(scale=weights):
            pyro.sample("w", dist.Normal(loc, scale).to_event(1))

    ours = MeanFieldELBO().differentiable_loss(model, guide)
    pyros = pyro.infer.TraceMeanField_ELBO().differentiable_loss(model, guide)
    expected = (kl_divergence(Normal(loc, scale), Normal(0.0, 2.0)).sum(-1) * weights).sum()
    torch.testing.assert_close(ours, expected, **TOL)
    torch.testing.assert_close(pyros, expected, **TOL)


def test_scale_mixture_prior_keeps_the_monte_carlo_kl():
    """Without a closed form (the scale-mixture prior) the term is ``log p(w) - log q(w)``
    at the guide's draw, as before: equal to ``Trace_ELBO`` on the same noise."""
    model, guide = mlp_pair(ScaleMixturePrior())
    x, y = torch.randn(10, 3, **F64), torch.randn(10, **F64)
    assert_elbos_agree(pyro.infer.Trace_ELBO, model, guide, x, y, min_params=8)


def test_local_reparameterization_loss_keeps_the_closed_form_kl():
    """Under local reparameterisation the KL terms are those of the plain objective: the
    loss less the (scaled) negative log-likelihood at the network output is the KL."""
    class Recording(LocalReparameterizationELBO):
        def _loss_particle(self, model_trace, guide_trace):
            self.model_trace = model_trace
            return super()._loss_particle(model_trace, guide_trace)

    model, guide = mlp_pair(GaussianPrior(1.3))
    x, y = torch.randn(10, 3, **F64), torch.randn(10, **F64)
    elbo = Recording()
    loss = elbo.differentiable_loss(model, guide, x, y)
    prior = Normal(torch.tensor(0.0, **F64), torch.tensor(1.3, **F64))
    expected_kl = sum(kl_divergence(q, prior).sum()
                      for q in guide.distributions().values())
    obs = elbo.model_trace.nodes["obs"]
    torch.testing.assert_close(loss + obs["fn"].log_prob(obs["value"]).sum(), expected_kl,
                               **TOL)


@pytest.mark.parametrize("out", [4, 1])
@pytest.mark.parametrize("h_lead, w_lead, b_lead", [
    ((), (), ()), ((2,), (2,), (2,)), ((), (2,), (2,)), ((3, 2), (2,), (2,)), ((), (), (2,)),
    ((1,), (2,), (2,)), ((2,), (1,), (1,)), ((2,), (2,), (1,))])
def test_affine_is_matmul_plus_bias(h_lead, w_lead, b_lead, out):
    """The affine layer (``addmm`` for one weight sample, ``baddbmm`` for a stack, a product
    and a sum for a stack of single-output layers, ``matmul`` broadcasting otherwise), in
    value and in gradient."""
    h = torch.randn(*h_lead, 5, 3, **F64, requires_grad=True)
    w = torch.randn(*w_lead, 3, out, **F64, requires_grad=True)
    b = torch.randn(*b_lead, out, **F64, requires_grad=True)
    ours, expected = affine(h, w, b), h @ w + b.unsqueeze(-2)
    torch.testing.assert_close(ours, expected, **TOL)
    cotangent = torch.randn_like(expected)
    for got, want in zip(torch.autograd.grad(ours, (h, w, b), cotangent),
                         torch.autograd.grad(expected, (h, w, b), cotangent)):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("p_shape, expand", [((), True), ((4, 3), False), ((1, 3), True),
                                             ((2, 1, 1), True)])
def test_gaussian_log_density_is_torchs_log_prob(p_shape, expand):
    value = torch.randn(4, 3, **F64)
    loc, scale = torch.randn(p_shape, **F64), torch.rand(p_shape, **F64) + 0.5
    if expand:
        shape = torch.broadcast_shapes(p_shape, (4, 3))
        loc, scale = loc.expand(shape), scale.expand(shape)
    expected = Normal(loc, scale).log_prob(value)
    log_p = gaussian_log_density(value, loc, scale)
    assert log_p.shape == expected.shape
    torch.testing.assert_close(log_p, expected, **TOL)


def test_gaussian_log_density_keeps_the_shape_a_prior_is_expanded_to():
    """A value of fewer elements than the prior's expanded shape: the density is repeated
    over that shape, as torch's is (cutting the expansion must not cut the result)."""
    value = torch.randn(3, **F64)
    loc, scale = torch.zeros((), **F64).expand(4, 3), torch.ones((), **F64).expand(4, 3)
    log_p = gaussian_log_density(value, loc, scale)
    assert log_p.shape == (4, 3)
    torch.testing.assert_close(log_p, Normal(loc, scale).log_prob(value), **TOL)


@pytest.mark.parametrize("case", ["full", "minibatch_kl_weight", "replicas", "scale_mixture"])
def test_point_mass_guide_loss_is_trace_elbos(case):
    """A point-mass guide (``AutoDelta``; the Laplace MAP phase's ``Delta`` sites): the loss
    is ``-log p(y | w) - log p(w)``; loss and every gradient equal ``Trace_ELBO``'s, under
    the minibatch and KL-weight handlers, with replicas and with a prior without closed
    form."""
    prior = ScaleMixturePrior() if case == "scale_mixture" else GaussianPrior(1.3)
    replicas = 2 if case == "replicas" else None
    model, _ = mlp_pair(prior, replicas)
    lead = () if replicas is None else (replicas,)
    x, y = torch.randn(*lead, 10, 3, **F64), torch.randn(*lead, 10, **F64)
    guide = AutoDelta(model, init_loc_fn=init_to_sample)
    assert_elbos_agree(pyro.infer.Trace_ELBO, model, guide, x, y, case=case, min_params=4,
                       max_plate_nesting=1 if replicas is None else 2)


def test_point_mass_log_density_counts_as_log_q():
    """A ``Delta`` with its own ``log_density`` has that log density at its value: the loss
    subtracts it, as ``Trace_ELBO``'s does, in value and gradient."""
    model, _ = mlp_pair()
    x, y = torch.randn(10, 3, **F64), torch.randn(10, **F64)
    values = {name: torch.randn(shape, **F64, requires_grad=True) for name, shape in model.sites}
    weight = torch.tensor(0.7, **F64, requires_grad=True)

    def guide(x, y):
        return {name: pyro.sample(name, dist.Delta(value, log_density=weight * value.sum(),
                                                   event_dim=value.dim()))
                for name, value in values.items()}

    leaves = [*values.values(), weight]
    losses = [elbo.differentiable_loss(model, guide, x, y)
              for elbo in (MeanFieldELBO(), pyro.infer.Trace_ELBO())]
    torch.testing.assert_close(losses[0], losses[1], **TOL)
    for got, want in zip(*(torch.autograd.grad(loss, leaves) for loss in losses)):
        torch.testing.assert_close(got, want, **TOL)


def test_local_reparameterization_skips_the_draws_it_does_not_use():
    """After its first loss the ELBO no longer draws the weights (the layers take the
    moments, the KL is closed form): their guide values are NaN placeholders, and the loss
    is the closed form of the objective on the local noise alone, which a hand-written
    local reparameterisation reproduces from the same random stream."""
    model, guide = mlp_pair(GaussianPrior(1.3))
    model.noise_scale = torch.nn.Parameter(torch.tensor(0.8, **F64))  # a fixed value
    x, y = torch.randn(10, 3, **F64), torch.randn(10, **F64)
    elbo = LocalReparameterizationELBO()
    elbo.differentiable_loss(model, guide, x, y)
    assert elbo._unused[2] == {name for name, _ in model.sites}
    pyro.set_rng_seed(11)
    loss = elbo.differentiable_loss(model, guide, x, y)
    assert all(t.isnan().all() for t in elbo._placeholders.values())
    assert len(elbo._placeholders) == 4

    pyro.set_rng_seed(11)
    q = guide.distributions()
    h = x
    for layer in range(2):
        w, b = q[f"layers.{layer}.weight"], q[f"layers.{layer}.bias"]
        mean, var = h @ w.loc + b.loc, h**2 @ w.scale**2 + b.scale**2
        h = mean + var.sqrt() * torch.randn_like(mean)
        h = torch.relu(h) if layer == 0 else h.squeeze(-1)
    nll = -Normal(h, 0.8).log_prob(y).sum()
    prior = Normal(torch.tensor(0.0, **F64), torch.tensor(1.3, **F64))
    kl = sum(kl_divergence(p, prior).sum() for p in q.values())
    torch.testing.assert_close(loss, nll + kl, **TOL)


def test_local_reparameterization_draws_what_other_layers_or_the_kl_use():
    """A weight that a layer outside the handler reads (a LayerNorm's), and every weight
    under a prior without a closed-form KL, is still drawn."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 1))
    model = BayesianModule(net.double(), noise_scale=1.0)
    guide = BayesByBackpropGuide(model)
    x, y = torch.randn(10, 3, **F64), torch.randn(10, **F64)
    elbo = LocalReparameterizationELBO()
    for _ in range(2):
        assert torch.isfinite(elbo.differentiable_loss(model, guide, x, y))
    assert elbo._unused[2] == {"0.weight", "0.bias", "2.weight", "2.bias"}

    model, guide = mlp_pair(ScaleMixturePrior())
    elbo.differentiable_loss(model, guide, x, y)
    assert elbo._unused[2] == set()


def test_skipped_draws_with_vectorised_particles_and_plain_pyro_svi():
    """With vectorised particles the placeholders take the particles' shape, and Pyro's own
    ``SVI`` trains the pair through the ELBO (first step finds the unused draws, later
    steps skip them) to a finite loss that falls."""
    model, guide = mlp_pair(GaussianPrior(1.0))
    x = torch.randn(30, 3, **F64)
    y = x.sum(-1) + 0.1 * torch.randn(30, **F64)
    elbo = LocalReparameterizationELBO(num_particles=4, vectorize_particles=True,
                                       max_plate_nesting=1)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), elbo)
    losses = [svi.step(x, y) for _ in range(60)]
    assert elbo._unused[2] == {name for name, _ in model.sites}
    assert all(t.shape[0] == 4 for t in elbo._placeholders.values())
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-10:]) < sum(losses[:10])
