"""The Laplace approximation on any torch module (issue 19): every curvature of a
:class:`~bnn_zoo.models.BayesianModule` against a dense GGN built from per-point autograd
Jacobians, the Kronecker factors of Linear and Conv2d layers against patches cut by hand,
the posterior of a module around an MLP against the zoo's own MLP, the exact Bayesian
linear regression of a single ``nn.Linear``, clear errors for layers K-FAC cannot factor,
and the whole method (MAP, curvature, evidence, GLM predictive, save and restore) on a
small CNN on digits."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
from sklearn.datasets import load_digits
from test_laplace import closed_form  # Bayesian linear regression in closed form
from torch import nn
from torch.func import functional_call

from bnn_zoo import predict, zoo
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods.laplace import Laplace
from bnn_zoo.methods.laplace._curvature import (
    diagonal_ggn,
    full_hessian,
    ggn,
    kron_ggn,
    last_layer_ggn,
)
from bnn_zoo.methods.laplace._evidence import EvidenceSettings
from bnn_zoo.methods.laplace._layouts import ModuleLayout, layout_of
from bnn_zoo.methods.laplace._problem import CurvatureSettings, laplace_posterior
from bnn_zoo.models import BayesianMLP, BayesianModule, GaussianPrior, digits_cnn
from bnn_zoo.models._likelihood import Categorical, Gaussian

D = torch.float64
LIK = {"regression": Gaussian(), "classification": Categorical()}


# --------------------------------------------------------------------------- references
def tiny_cnn(out: int) -> nn.Sequential:
    """Conv2d(1, 2, 2) on 4x4 images (9 output pixels), then a Linear layer."""
    return nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 2, 2), nn.Tanh(),
                         nn.Flatten(), nn.Linear(18, out))


def layer_norm_net(out: int) -> nn.Sequential:
    """A layer K-FAC cannot factor (LayerNorm's elementwise scale and shift)."""
    return nn.Sequential(nn.Linear(16, 5), nn.LayerNorm(5), nn.ReLU(), nn.Linear(5, out))


def problem(make_net, task: str, n: int = 6):
    g = torch.Generator().manual_seed(4)
    out = 1 if task == "regression" else 3
    torch.manual_seed(4)
    net = make_net(out).double()
    model = BayesianModule(net, task=task, noise_scale=1.0 if task == "regression" else None)
    layout = layout_of(model)
    theta = torch.randn(layout.num_parameters, generator=g, dtype=D)
    x = torch.randn(n, 16, generator=g, dtype=D)
    y = torch.randn(n, generator=g, dtype=D) if out == 1 else torch.randint(0, 3, (n,),
                                                                           generator=g)
    return net, layout, theta, x, y


def params_of(net: nn.Module, theta: torch.Tensor) -> dict[str, torch.Tensor]:
    """``theta`` cut into the net's parameters in ``named_parameters`` order."""
    out, start = {}, 0
    for name, p in net.named_parameters():
        out[name] = theta[start:start + p.numel()].view(p.shape)
        start += p.numel()
    return out


def naive_jacobian(net, theta, x):
    """(N, K, P) one autograd backward pass per data point and output."""
    rows = []
    for n in range(x.shape[0]):
        t = theta.clone().requires_grad_()
        f = functional_call(net, params_of(net, t), (x[n:n + 1],))[0]
        rows.append(torch.stack([torch.autograd.grad(f[k], t, retain_graph=True)[0]
                                 for k in range(f.shape[0])]))
    return torch.stack(rows)


def loss_hessians(f, likelihood):
    """(N, K, K) the Hessian of the negative log-likelihood in the outputs ``f``."""
    if isinstance(likelihood, Gaussian):
        return torch.eye(f.shape[1], dtype=f.dtype).expand(f.shape[0], -1, -1)
    p = torch.softmax(f, -1)
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def naive_ggn(net, theta, x, likelihood):
    """``sum_n J_n^T Lambda_n J_n`` from the explicit per-point Jacobians."""
    jac = naive_jacobian(net, theta, x)
    f = functional_call(net, params_of(net, theta), (x,))
    return torch.einsum("nkp,nkl,nlq->pq", jac, loss_hessians(f, likelihood), jac)


def kron_block(layout, theta, x, y, likelihood):
    """Per layer ``(Q ⊗ G, index)``: the K-FAC block and its positions in ``theta``."""
    factors = kron_ggn(theta, x, y, layout, likelihood)
    return [(torch.kron(q, g), index) for (q, g), (index, _) in
            zip(factors, layout.kron_indices(theta))]


# --------------------------------------------------------------------------- curvatures
@pytest.mark.parametrize("make_net", [tiny_cnn, layer_norm_net], ids=["cnn", "layer_norm"])
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_module_curvatures_equal_a_dense_naive_ggn(make_net, task):
    net, layout, theta, x, y = problem(make_net, task)
    lik = LIK[task]
    dense = naive_ggn(net, theta, x, lik)
    torch.testing.assert_close(ggn(theta, x, y, layout, lik, chunk=4), dense)
    torch.testing.assert_close(diagonal_ggn(theta, x, y, layout, lik, chunk=4),
                               dense.diag())
    last = layout.layer_slices[-1]
    assert last.stop - last.start == net[-1].weight.numel() + net[-1].bias.numel()
    torch.testing.assert_close(last_layer_ggn(theta, x, y, layout, lik, chunk=4),
                               dense[last, last])
    f, jac = layout.jacobian(theta, x)
    torch.testing.assert_close(jac, naive_jacobian(net, theta, x))
    torch.testing.assert_close(f, functional_call(net, params_of(net, theta), (x,)))


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_module_hessian_of_a_linear_net_is_its_ggn(task):
    """A single ``nn.Linear`` is linear in ``theta``: its exact Hessian is its GGN."""
    net, layout, theta, x, y = problem(lambda out: nn.Linear(16, out), task)
    torch.testing.assert_close(full_hessian(theta, x, y, layout, LIK[task]),
                               naive_ggn(net, theta, x, LIK[task]))


@pytest.mark.parametrize("bias", [True, False])
def test_kron_of_a_linear_gaussian_layer_is_the_exact_ggn(bias):
    """Without hidden layers and with a Gaussian likelihood ``G_n = I``, so the exact block
    ``sum_n a_n a_n^T ⊗ I`` is ``Q ⊗ G = (1/N sum_n a_n a_n^T) ⊗ (N I)`` for any N: the
    index puts torch's ``(d_out, d_in)`` weight (and the bias) in K-FAC's order."""
    net, layout, theta, x, y = problem(lambda out: nn.Linear(16, out, bias=bias),
                                       "regression", n=9)
    dense = naive_ggn(net, theta, x, Gaussian())
    (block, index), = kron_block(layout, theta, x, y, Gaussian())
    assert index.numel() == len(theta)
    torch.testing.assert_close(block, dense[index][:, index])


#: A convolution whose kernel covers its whole input (one output pixel), then a Linear
#: layer: on flat inputs unflattened by the net, on images and on series as they are.
ONE_PIXEL = {
    "flat": ((16,), lambda out: nn.Sequential(nn.Unflatten(1, (1, 4, 4)), nn.Conv2d(1, 3, 4),
                                              nn.Tanh(), nn.Flatten(), nn.Linear(3, out))),
    "image": ((1, 4, 4), lambda out: nn.Sequential(nn.Conv2d(1, 3, 4), nn.Tanh(), nn.Flatten(),
                                                   nn.Linear(3, out))),
    "series": ((2, 8), lambda out: nn.Sequential(nn.Conv1d(2, 3, 8), nn.Tanh(), nn.Flatten(),
                                                 nn.Linear(3, out))),
}


@pytest.mark.parametrize("inputs", sorted(ONE_PIXEL))
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_kron_of_one_pixel_convolution_and_one_point_is_exact(task, inputs):
    """For one data point and a convolution with one output pixel (kernel = image) every
    layer's K-FAC block is its exact GGN block (as for an MLP), whatever the input's
    shape: flat, an image (N, C, H, W) or a series (N, C, L) given as it is."""
    shape, net_of = ONE_PIXEL[inputs]
    net, layout, theta, x, y = problem(net_of, task, n=1)
    x = x.view(1, *shape)
    dense = naive_ggn(net, theta, x, LIK[task])
    blocks = kron_block(layout, theta, x, y, LIK[task])
    assert len(blocks) == 2
    for block, index in blocks:
        torch.testing.assert_close(block, dense[index][:, index])


def patches_by_hand(inputs: torch.Tensor, padding, stride: int) -> torch.Tensor:
    """(N, L, C k^d) the 2-wide (2x2 for images) patches of ``inputs`` (N, C, L) or
    (N, C, H, W) at every ``stride``-th position, with ``padding`` zeros around ("same":
    the one pixel after, as torch pads an even kernel)."""
    dims = inputs.dim() - 2
    if padding == "same":
        inputs = nn.functional.pad(inputs, (0, 1) * dims)
    elif padding:
        inputs = nn.functional.pad(inputs, (padding,) * 2 * dims)
    starts = [range(0, size - 1, stride) for size in inputs.shape[2:]]
    if dims == 1:
        return torch.stack([torch.stack([image[:, i:i + 2].flatten() for i in starts[0]])
                            for image in inputs])
    return torch.stack([torch.stack([image[:, i:i + 2, j:j + 2].flatten()
                                     for i in starts[0] for j in starts[1]])
                        for image in inputs])


# padding="same" with an even kernel pads asymmetrically, the case worth testing; torch
# warns that it copies the input to do so, which is torch's concern, not the test's.
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")
@pytest.mark.parametrize("padding, stride", [(0, 1), (1, 2), ("same", 1)])
@pytest.mark.parametrize("task", ["regression", "classification"])
@pytest.mark.parametrize("shape", [(2, 4, 4), (2, 5)], ids=["conv2d", "conv1d"])
def test_conv_kron_factors_match_patches_cut_by_hand(shape, padding, stride, task):
    """KFC / KFAC-expand (Grosse & Martens 2016): ``Q = 1/(N L) sum_{n,l} a a^T`` over the
    input patches ``a_{n,l} = [x_n[:, i:i+2, j:j+2], 1]`` (a series: ``[x_n[:, i:i+2],
    1]``) cut by hand, and ``G = sum_{n,l} J_{n,l}^T Lambda_n J_{n,l}`` from the autograd
    Jacobians in the convolution's outputs. The patches times ``[W^T; b]`` must be the
    convolution's own output. The inputs (N, C, H, W) or (N, C, L) reach the net as they
    are."""
    conv = (nn.Conv2d if len(shape) == 3 else nn.Conv1d)(2, 3, 2, padding=padding,
                                                         stride=stride).double()
    net = nn.Sequential(conv, nn.Tanh(), nn.Flatten()).double()
    with torch.no_grad():
        width = net(torch.zeros(1, *shape, dtype=D)).shape[1]
    out = 1 if task == "regression" else 3
    net.append(nn.Linear(width, out).double())
    model = BayesianModule(net, task=task, noise_scale=1.0 if out == 1 else None)
    layout = layout_of(model)
    g = torch.Generator().manual_seed(6)
    theta = layout.flatten(model.initial_weights())
    x = torch.randn(5, *shape, generator=g, dtype=D)
    y = torch.randn(5, dtype=D) if out == 1 else torch.randint(0, 3, (5,), generator=g)
    (q, gg), _ = kron_ggn(theta, x, y, layout, LIK[task])

    patches = patches_by_hand(x, padding, stride)
    a = torch.cat([patches, torch.ones(*patches.shape[:2], 1, dtype=D)], -1)  # (N, L, D + 1)
    z = conv(x)
    weights = torch.cat([conv.weight.flatten(1).T, conv.bias[None]])
    torch.testing.assert_close(a @ weights, z.flatten(2).transpose(1, 2))
    torch.testing.assert_close(q, torch.einsum("nli,nlj->ij", a, a) / a.shape[0] / a.shape[1])

    zl = z.detach().requires_grad_()
    f = net[1:](zl)
    jz = torch.stack([torch.autograd.grad(f[:, k].sum(), zl, retain_graph=True)[0]
                      for k in range(out)], 1).flatten(3)  # (N, K, d_out, L)
    lam = loss_hessians(f.detach(), LIK[task])
    torch.testing.assert_close(gg, torch.einsum("nkol,nkj,njpl->op", jz, lam, jz))


@pytest.mark.parametrize("shape", [(2, 3, 3), (2, 4)], ids=["conv2d", "conv1d"])
def test_kron_of_a_whole_input_convolution_is_the_ggn_posterior_on_images(shape):
    """A convolution whose kernel covers its input, one output channel, Gaussian
    likelihood: a linear-Gaussian model with one location, on which K-FAC is exact. So on
    images (N, C, H, W) and series (N, C, L) given as they are, ``kron`` and ``ggn`` give
    the same posterior through every step on those inputs: the L-BFGS refits, the
    curvature, the evidence fixed point and the GLM predictive."""
    conv = (nn.Conv2d if len(shape) == 3 else nn.Conv1d)(2, 1, shape[1:]).double()
    model = BayesianModule(nn.Sequential(conv, nn.Flatten()), noise_scale=0.5,
                           prior=GaussianPrior(0.8))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(25, *shape, generator=g, dtype=D)
    w = torch.randn(x[0].numel(), generator=g, dtype=D)
    y = x.flatten(1) @ w + 0.3 * torch.randn(25, generator=g, dtype=D)
    theta = torch.zeros(layout_of(model).num_parameters, dtype=D)
    posts = [laplace_posterior(model, theta, x, y, curvature=CurvatureSettings(curvature),
                               evidence=EvidenceSettings("fixed_point", iterations=4))
             for curvature in ("kron", "ggn")]
    kron, dense = posts
    assert kron.iterations == dense.iterations > 1
    for a, b in ((kron.theta, dense.theta), (kron.alpha, dense.alpha), (kron.beta, dense.beta),
                 (kron.covariance(), dense.covariance()),
                 (kron.log_evidence(), dense.log_evidence())):
        torch.testing.assert_close(a, b)
    x_test = torch.randn(6, *shape, generator=g, dtype=D)
    torch.testing.assert_close(kron.glm_predictive(x_test).scale,
                               dense.glm_predictive(x_test).scale)


def test_kron_refuses_what_it_cannot_factor_naming_the_parameter():
    _, layout, theta, x, y = problem(layer_norm_net, "regression")
    with pytest.raises(ValueError, match="'1.weight' belongs to a LayerNorm"):
        kron_ggn(theta, x, y, layout)
    model = BayesianModule(layer_norm_net(1).double())
    for curvature in ("kron", "kron_separate"):
        with pytest.raises(ValueError, match="LayerNorm.*curvature='ggn'"):
            laplace_posterior(model, theta, x, y, curvature=CurvatureSettings(curvature),
                              evidence=EvidenceSettings(refine=False))
    grouped = BayesianModule(nn.Sequential(nn.Unflatten(1, (2, 2, 4)), nn.Conv2d(2, 2, 1,
                                                                                  groups=2),
                                           nn.Flatten(), nn.Linear(16, 1)))
    with pytest.raises(ValueError, match="groups=2"):
        layout_of(grouped).kron_layers()

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 4)

        def forward(self, x):
            return self.layer(self.layer(x))[:, :1]

    twice = layout_of(BayesianModule(Twice()))
    with pytest.raises(ValueError, match="'layer' was applied 2 times"):
        kron_ggn(twice.flatten(dict(Twice().named_parameters())).detach(),
                 torch.randn(3, 4), torch.randn(3), twice)
    shared = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Linear(4, 1))
    shared[2].weight = shared[0].weight  # named_parameters lists it once, under '0'
    with pytest.raises(ValueError, match=r"layer '2'.*\['2.bias'\].*shared"):
        layout_of(BayesianModule(shared)).kron_layers()


# --------------------------------------------------------------------------- posteriors
def mlp_pair(task: str):
    """The zoo's MLP and a BayesianModule of the same architecture, and the map from the
    MLP's ``theta`` (weights ``(d_in, d_out)``) to the module's (``(d_out, d_in)``)."""
    out = 1 if task == "regression" else 3
    noise = 0.5 if task == "regression" else None
    mlp = BayesianMLP(3, out, (5,), activation="tanh", task=task, noise_scale=noise).double()
    module = BayesianModule(nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, out)),
                            task=task, noise_scale=noise).double()
    mlp_layout, module_layout = layout_of(mlp), layout_of(module)

    def to_module(theta):
        values = mlp_layout.unflatten(theta)
        return module_layout.flatten({f"{2 * int(name.split('.')[1])}.{name.split('.')[2]}":
                                      value.mT if value.dim() == 2 else value
                                      for name, value in values.items()})

    return mlp, module, to_module


@pytest.mark.parametrize("curvature", ["hessian", "ggn", "diag", "kron", "kron_separate",
                                       "last_layer", "low_rank"])
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_module_around_an_mlp_has_the_mlps_posterior(curvature, task):
    """The same network as a BayesianModule and as the zoo's BayesianMLP (one log joint,
    see tests/models/test_module.py): the same evidence-tuned ``alpha`` and ``beta``, log
    evidence and GLM predictive at the same MAP, whatever the curvature's storage order.
    (No L-BFGS refits here: on the two parameter orders they round differently, to MAPs
    1e-5 apart; the refit on a module is checked against the closed form below.)"""
    mlp, module, to_module = mlp_pair(task)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(25, 3, generator=g, dtype=D)
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(25, generator=g, dtype=D) \
        if task == "regression" else torch.randint(0, 3, (25,), generator=g)
    theta = 0.5 * torch.randn(layout_of(mlp).num_parameters, generator=g, dtype=D)
    options = dict(curvature=CurvatureSettings(curvature, indefinite="clip", rank=8),
                   evidence=EvidenceSettings("fixed_point", iterations=3, refine=False,
                                             per_layer_alpha=True))
    ref = laplace_posterior(mlp, theta, x, y, **options)
    post = laplace_posterior(module, to_module(theta), x, y, **options)
    assert post.iterations == ref.iterations
    torch.testing.assert_close(post.alpha, ref.alpha)
    torch.testing.assert_close(post.beta, ref.beta)
    torch.testing.assert_close(post.log_evidence(), ref.log_evidence())
    x_test = torch.randn(7, 3, generator=g, dtype=D)
    for a, b in zip(vars(post.glm_predictive(x_test)).values(),
                    vars(ref.glm_predictive(x_test)).values()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("curvature", ["hessian", "ggn", "kron", "last_layer"])
def test_single_linear_module_is_exact_bayesian_linear_regression(curvature):
    """``nn.Linear(2, 1)`` with a Gaussian likelihood and prior: the Laplace posterior is
    the exact one (PRML 3.53-3.54) and its evidence the exact marginal likelihood, for
    every structure exact on a linear-Gaussian model (K-FAC included: ``G_n = 1``)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 2, generator=g, dtype=D)
    y = x @ torch.tensor([1.5, -0.7], dtype=D) + 0.3 + 0.4 * torch.randn(30, generator=g,
                                                                          dtype=D)
    model = BayesianModule(nn.Linear(2, 1).double(), noise_scale=0.4,
                           prior=GaussianPrior(0.8))
    post = laplace_posterior(model, torch.zeros(3, dtype=D), x, y,
                             curvature=CurvatureSettings(curvature))
    mean, cov, evidence = closed_form(x, y, 0.8**-2, 0.4**-2)
    # torch's Linear stores (weight (1, 2), bias): the order of the closed form's [x, 1]
    torch.testing.assert_close(post.theta, mean, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(post.covariance(), cov, atol=1e-9, rtol=1e-6)
    torch.testing.assert_close(post.log_evidence(), evidence, atol=1e-7, rtol=1e-7)
    phi = torch.cat([x, torch.ones(30, 1, dtype=D)], 1)
    torch.testing.assert_close(post.glm_predictive(x).scale[0] ** 2,
                               0.4**2 + torch.einsum("np,pq,nq->n", phi, cov, phi))


# --------------------------------------------------------------------------- the method
def digits(n: int):
    data = load_digits()
    x = torch.as_tensor(data.data[:n], dtype=torch.float32) / 16.0
    return x, torch.as_tensor(data.target[:n], dtype=torch.long)


@pytest.mark.parametrize("curvature", ["kron", "last_layer"])
def test_digits_cnn_runs_the_whole_laplace_method_and_restores(curvature):
    """MAP by SVI (untraced: torch.func), L-BFGS refits, the curvature, two evidence
    iterations, the GLM predictive; the fit's state rebuilds the same predictive."""
    x, y = digits(150)
    x_test, y_test = digits(300)
    x_test, y_test = x_test[150:], y_test[150:]
    torch.manual_seed(0)
    net = digits_cnn(4)

    def build_model():
        return BayesianModule(net, task="classification")

    method = Laplace(curvature=curvature, evidence="fixed_point", iterations=2)
    fit = method.fit(build_model, x, y, task="classification", seed=0,
                     budget=Budget(steps=150, lr=1e-2, batch_size=None, jit=True),
                     progress=False)
    assert isinstance(fit.guide.layout, ModuleLayout)
    assert all(math.isfinite(v) for v in fit.diagnostics.values())
    probs = fit.predict(x_test, 1).probs[0]
    assert bool(torch.isfinite(probs).all())
    # chance is 1/10; 150 digits and a Laplace around the MAP classify most of the rest
    assert float((probs.argmax(-1) == y_test).float().mean()) > 0.7
    again = method.restore(build_model, fit.state_dict(), x=x, y=y)
    assert torch.equal(again.predict(x_test, 1).probs, fit.predict(x_test, 1).probs)
    assert again.diagnostics == fit.diagnostics
    # the Pyro pair: the linearised module sampled through the guide's Laplace Gaussian
    samples = predict(fit.model, fit.guide, x_test[:20], num_samples=3)
    assert samples.probs.shape == (3, 20, 10) and bool(torch.isfinite(samples.probs).all())


@pytest.mark.parametrize("predictive", ["glm", "mc"])
def test_laplace_entry_fits_a_bring_your_own_network_model(predictive):
    """The ``laplace`` entry (GGN, evidence fixed point) with its model factory replaced by
    a BayesianModule: standardisation, fit and metrics in the caller's units, with the
    closed-form GLM predictive or weights sampled through the module."""
    x, y = digits(120)
    x_test, y_test = digits(240)
    torch.manual_seed(0)
    net = digits_cnn(2)
    entry = replace(zoo.get("laplace"),
                    model=lambda in_dim, out_dim, task, **_: BayesianModule(net, task=task))
    fitted = entry.fit(x, y, steps=100, batch_size=None,
                       method_options={"iterations": 2, "predictive": predictive})
    out = fitted.evaluate(x_test[120:], y_test[120:])
    assert all(math.isfinite(out[k]) for k in ("accuracy", "nll", "brier", "ece"))
    assert out["accuracy"] > 0.5


# --------------------------------------------------------------------------- batch norm
#: Layers with batch norm between: a one-pixel convolution (kernel = image) or a Linear
#: layer, then BatchNorm, Tanh and a Linear head; inputs (1, 4, 4) images or 16 features.
BATCH_NORM_NETS = {
    "conv2d": ((1, 4, 4), lambda out: nn.Sequential(
        nn.Conv2d(1, 3, 4), nn.BatchNorm2d(3), nn.Tanh(), nn.Flatten(), nn.Linear(3, out))),
    "conv1d": ((2, 8), lambda out: nn.Sequential(
        nn.Conv1d(2, 3, 8), nn.BatchNorm1d(3), nn.Tanh(), nn.Flatten(), nn.Linear(3, out))),
    "linear": ((16,), lambda out: nn.Sequential(
        nn.Linear(16, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, out))),
}


def batch_norm_problem(name: str, task: str, n: int):
    """A BayesianModule around a batch-norm net in float64 whose batch norm's deterministic
    scale and shift and running statistics are far from their initial values, a ``theta``
    of its random parameters, and the plain torch net in eval mode holding all of it."""
    shape, make = BATCH_NORM_NETS[name]
    g = torch.Generator().manual_seed(5)
    out = 1 if task == "regression" else 3
    torch.manual_seed(5)
    net = make(out).double()
    model = BayesianModule(net, task=task, noise_scale=1.0 if task == "regression" else None)
    state = model.net_state
    with torch.no_grad():
        for value in state.parameters():
            value.copy_(torch.rand(value.shape, generator=g, dtype=D) + 0.5)
        state.set_buffers({"1.running_mean": torch.randn(net[1].num_features, generator=g,
                                                         dtype=D),
                           "1.running_var": torch.rand(net[1].num_features, generator=g,
                                                       dtype=D) + 0.2})
    layout = layout_of(model)
    theta = torch.randn(layout.num_parameters, generator=g, dtype=D)
    x = torch.randn(n, *shape, generator=g, dtype=D)
    y = torch.randn(n, generator=g, dtype=D) if out == 1 else torch.randint(0, 3, (n,),
                                                                           generator=g)
    reference = nn.Sequential(*[copy.deepcopy(m) for m in net]).eval()
    with torch.no_grad():
        for key, value in {**model.fixed_tensors(), **layout.unflatten(theta)}.items():
            target = (reference.get_buffer(key) if key in state.buffer_names
                      else reference.get_parameter(key))
            target.copy_(value)
    return model, layout, theta, x, y, reference


def sites_jacobian(reference: nn.Module, layout, theta, x):
    """(N, K, P) per point and output, autograd through the eval-mode net in the random
    parameters only."""
    rows = []
    for n in range(x.shape[0]):
        t = theta.clone().requires_grad_()
        f = functional_call(reference, layout.unflatten(t), (x[n:n + 1],))[0]
        rows.append(torch.stack([torch.autograd.grad(f[k], t, retain_graph=True)[0]
                                 for k in range(f.shape[0])]))
    return torch.stack(rows)


@pytest.mark.parametrize("name", sorted(BATCH_NORM_NETS))
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_kron_with_batch_norm_between_is_the_dense_ggn_on_one_point(name, task):
    """Batch norm in eval mode is an affine map per channel with the model's running
    statistics and (deterministic) scale and shift: for one point every K-FAC block of the
    layers around it is the exact GGN block of the eval-mode net, and ``ggn`` is that
    dense GGN; both read the model's trained tensors, not the net's own."""
    model, layout, theta, x, y, reference = batch_norm_problem(name, task, n=1)
    head = "3" if name == "linear" else "4"
    assert [site for site, _ in layout.sites] == ["0.weight", "0.bias", f"{head}.weight",
                                                   f"{head}.bias"]
    jac = sites_jacobian(reference, layout, theta, x)
    f = reference(x)
    dense = torch.einsum("nkp,nkl,nlq->pq", jac, loss_hessians(f, LIK[task]), jac)
    torch.testing.assert_close(layout.output(theta, x), f)
    torch.testing.assert_close(ggn(theta, x, y, layout, LIK[task]), dense)
    blocks = kron_block(layout, theta, x, y, LIK[task])
    assert len(blocks) == 2
    for block, index in blocks:
        torch.testing.assert_close(block, dense[index][:, index])
    # the net's own (initial) batch norm would give another output
    assert not torch.allclose(layout.output(theta, x),
                              functional_call(model.net.eval(), layout.unflatten(theta), (x,)))


def test_kron_refuses_a_random_batch_norm_naming_the_option():
    net = BATCH_NORM_NETS["linear"][1](1)
    model = BayesianModule(net, deterministic=())
    layout = layout_of(model)
    with pytest.raises(ValueError, match=r"'1.weight' belongs to a BatchNorm1d.*deterministic"):
        layout.kron_layers()


@pytest.mark.parametrize("curvature", ["kron", "kron_separate", "diag"])
def test_laplace_fits_a_conv_batch_norm_net_and_predicts_with_the_eval_net(curvature):
    """Conv2d -> BatchNorm2d -> ReLU -> pool -> Linear through the ``laplace`` method: the MAP
    by SVI in train mode updates the running statistics, the curvature and the GLM
    predictive use the eval-mode net, whose mean output is a plain ``net.eval()`` with the
    MAP weights and the model's batch norm."""
    x, y = digits(120)
    x = x.view(-1, 1, 8, 8)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AvgPool2d(2),
                        nn.Flatten(), nn.Linear(36, 10))
    model = BayesianModule(net, task="classification")
    method = Laplace(curvature=curvature)
    fit = method.fit(lambda: model, x, y, task="classification", seed=0,
                     budget=Budget(steps=60, lr=1e-2, batch_size=None), progress=False)
    stats = model.fixed_tensors()
    assert int(stats["1.num_batches_tracked"]) >= 60
    assert not torch.equal(stats["1.running_mean"], net[1].running_mean)
    reference = copy.deepcopy(net).eval()
    with torch.no_grad():
        for key, value in {**stats, **fit.laplace.layout.unflatten(fit.laplace.theta)}.items():
            target = (reference.get_buffer(key) if key in model.net_state.buffer_names
                      else reference.get_parameter(key))
            target.copy_(value)
        torch.testing.assert_close(fit.laplace.layout.output(fit.laplace.theta, x[:30]),
                                   reference(x[:30]))
    probs = fit.predict(x[:30], 1).probs[0]
    assert float((probs.argmax(-1) == y[:30]).float().mean()) > 0.7
    assert all(torch.equal(v, stats[k]) for k, v in model.fixed_tensors().items())


# --------------------------------------------------------------------------- priors per layer
def test_priors_per_layer_give_laplace_its_prior_precision_per_layer():
    """Gaussian priors per layer: ``alpha`` per layer (and tuned by the evidence from
    there); a fan-in prior: per weight (not tunable, refused naming it)."""
    x, y = digits(40)
    net = nn.Sequential(nn.Linear(64, 5), nn.Tanh(), nn.Linear(5, 10)).double()
    model = BayesianModule(net, task="classification",
                           prior={"0": GaussianPrior(0.5), "2": GaussianPrior(2.0)})
    theta = layout_of(model).flatten(model.initial_weights())
    post = laplace_posterior(model, theta, x.double(), y,
                             evidence=EvidenceSettings(refine=False))
    torch.testing.assert_close(post.alpha, torch.tensor([4.0, 0.25], dtype=D))
    fan_in = BayesianModule(net, task="classification", prior=GaussianPrior(fan_in=True))
    post = laplace_posterior(fan_in, theta, x.double(), y,
                             evidence=EvidenceSettings(refine=False))
    torch.testing.assert_close(post.alpha_vector(), fan_in.prior_precision())
    with pytest.raises(ValueError, match="one per weight"):
        laplace_posterior(fan_in, theta, x.double(), y,
                          evidence=EvidenceSettings(evidence="fixed_point"))


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_kron_of_a_layer_with_a_deterministic_bias_is_exact_on_one_point(task):
    """A convolution whose bias is deterministic: its K-FAC block covers the weight alone
    (no bias row), exact for one point and one output pixel as with a bias."""
    torch.manual_seed(2)
    net = ONE_PIXEL["image"][1](1 if task == "regression" else 3).double()
    model = BayesianModule(net, task=task, deterministic=["0.bias"],
                           noise_scale=1.0 if task == "regression" else None)
    layout = layout_of(model)
    assert [name for name, _ in layout.sites] == ["0.weight", "3.weight", "3.bias"]
    theta = torch.randn(layout.num_parameters, dtype=D)
    x = torch.randn(1, 1, 4, 4, dtype=D)
    y = torch.randn(1, dtype=D) if task == "regression" else torch.tensor([2])
    jac = sites_jacobian(net, layout, theta, x)
    f = functional_call(net, layout.unflatten(theta), (x,))
    dense = torch.einsum("nkp,nkl,nlq->pq", jac, loss_hessians(f, LIK[task]), jac)
    blocks = kron_block(layout, theta, x, y, LIK[task])
    assert [index.numel() for _, index in blocks] == [3 * 16, net[3].weight.numel()
                                                      + net[3].bias.numel()]
    for block, index in blocks:
        torch.testing.assert_close(block, dense[index][:, index])


def test_a_saved_laplace_fit_of_a_batch_norm_net_loads_its_running_statistics(tmp_path):
    """The fit keeps the model it was fitted to: its running statistics (and deterministic
    tensors) are saved, and the loaded fit predicts what the fitted one does (a fresh net's
    statistics would give other predictions)."""
    x, y = digits(120)
    x = x.view(-1, 1, 8, 8)

    def net() -> nn.Module:
        return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.AvgPool2d(2), nn.Flatten(), nn.Linear(36, 10))

    fitted = zoo.get("laplace_kron").fit(x, y, net=net, seed=0, steps=40, jit=False,
                                         method_options={"refine": False, "holdout": 0.0})
    path = tmp_path / "fit.pt"
    fitted.save(path)
    loaded = zoo.load(path, net=net)
    before, after = fitted.predict(x[:30]).probs, loaded.predict(x[:30]).probs
    torch.testing.assert_close(after, before)
    saved = loaded.posterior.source.fixed_tensors()["1.running_mean"]
    torch.testing.assert_close(saved, fitted.posterior.source.fixed_tensors()["1.running_mean"])
    assert bool((saved != 0).any())  # not a fresh net's statistics
