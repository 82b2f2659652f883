"""BayesianModule: a Pyro model from any torch module (issue 19, first half)."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoDelta, AutoNormal
from pyro.optim import Adam
from sklearn.datasets import load_digits
from torch import nn

import bnn_zoo
from bnn_zoo.guides._bbb import BayesByBackpropGuide, deep_getattr
from bnn_zoo.guides._mean_field import MeanFieldGuide
from bnn_zoo.models import BayesianMLP, BayesianModule, GaussianPrior, ScaleMixturePrior
from bnn_zoo.models._module import TorchFanInPrior, digits_cnn

PRIORS = [GaussianPrior(), GaussianPrior(0.7, fan_in=True), ScaleMixturePrior()]


def image_cnn() -> nn.Sequential:
    """A CNN on image batches (N, 1, 8, 8): Conv2d -> ReLU -> flatten -> Linear."""
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 36, 4))


def digits(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = load_digits()
    x = torch.as_tensor(data.data[:n], dtype=torch.float32) / 16.0
    return x, torch.as_tensor(data.target[:n], dtype=torch.long)


@pytest.mark.parametrize("prior", PRIORS, ids=["gauss", "fan_in", "mixture"])
@pytest.mark.parametrize("task, out_dim, noise", [("regression", 1, None),
                                                  ("regression", 1, 0.3),
                                                  ("classification", 3, None)])
def test_log_joint_equals_bayesian_mlp(prior, task, out_dim, noise):
    torch.set_default_dtype(torch.float64)
    try:
        x = torch.randn(11, 4)
        y = torch.randn(11) if task == "regression" else torch.randint(out_dim, (11,))
        mlp = BayesianMLP(4, out_dim, (6,), task=task, prior=prior, noise_scale=noise)
        module = BayesianModule(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, out_dim)),
                                task=task, prior=prior, noise_scale=noise)
        weights = {name: torch.randn(shape) for name, shape in mlp.sites}
        # BayesianMLP's layer l is (d_in, d_out) at layers.l.*; torch's is (d_out, d_in) at the
        # Sequential index 2l (the ReLU sits between).
        transposed = {f"{2 * int(name.split('.')[1])}.{name.split('.')[2]}":
                      w.T if w.dim() == 2 else w for name, w in weights.items()}
        mlp_trace = poutine.trace(poutine.condition(mlp, weights)).get_trace(x, y)
        module_trace = poutine.trace(poutine.condition(module, transposed)).get_trace(x, y)
    finally:
        torch.set_default_dtype(torch.float32)
    assert module_trace.nodes["f"]["value"].dtype == torch.float64
    torch.testing.assert_close(module_trace.nodes["f"]["value"], mlp_trace.nodes["f"]["value"])
    torch.testing.assert_close(module_trace.log_prob_sum(), mlp_trace.log_prob_sum())


def test_vectorised_evaluation_equals_loop_over_samples():
    model = BayesianModule(image_cnn(), task="classification")
    x = torch.randn(5, 1, 8, 8)
    params = {name: torch.randn(7, *shape) for name, shape in model.sites}
    f = model.network(x, params)
    loop = torch.stack([model.network(x, {k: v[s] for k, v in params.items()})
                        for s in range(7)])
    assert f.shape == (7, 5, 4)
    torch.testing.assert_close(f, loop)
    # The same through Pyro: a parallel Predictive (samples in a plate beside the data's)
    # against a sequential one, on the same weights.
    samples = {k: v.unsqueeze(1) for k, v in params.items()}
    parallel = Predictive(model, posterior_samples=samples, parallel=True,
                          return_sites=["f"])(x)["f"]
    sequential = Predictive(model, posterior_samples=samples, return_sites=["f"])(x)["f"]
    torch.testing.assert_close(parallel, sequential)
    torch.testing.assert_close(parallel.reshape(f.shape), f)


def test_fan_in_prior_reads_torch_layout():
    model = BayesianModule(image_cnn(), task="classification", prior=GaussianPrior(2.0, True))
    assert model.prior == TorchFanInPrior(2.0, True)
    trace = poutine.trace(model).get_trace(torch.randn(3, 1, 8, 8))
    scales = {name: trace.nodes[name]["fn"].base_dist.scale.unique().item()
              for name, _ in model.sites}
    assert scales == pytest.approx({"0.weight": 2.0 / 3, "0.bias": 2.0,
                                    "3.weight": 2.0 / math.sqrt(108), "3.bias": 2.0})
    # The closed-form KL of the mean-field guide uses the same scales as the model.
    guide = MeanFieldGuide(model)
    q = guide.distributions()["3.weight"]
    prior = model.prior.distribution((4, 108), q.loc).base_dist
    assert prior.scale.unique().item() == pytest.approx(2.0 / math.sqrt(108))


@pytest.mark.parametrize("make_guide", [
    BayesByBackpropGuide,
    lambda model: AutoNormal(model, init_loc_fn=model.init_to_net, init_scale=1e-2),
], ids=["bbb", "autonormal"])
def test_digits_cnn_trains_under_bnn_zoo_fit(make_guide):
    x, y = digits(200)
    model = BayesianModule(digits_cnn(4), task="classification")
    guide = make_guide(model)
    result = bnn_zoo.fit(model, guide, x, y, steps=60, lr=2e-2, batch_size=50, num_particles=2,
                         seed=0)
    assert all(math.isfinite(v) for v in result.losses)
    # 60 steps move the negative ELBO well below where it started (a few hundred nats of
    # likelihood gained against Monte Carlo noise of tens).
    assert sum(result.losses[-10:]) / 10 < sum(result.losses[:10]) / 10 - 50
    probs = bnn_zoo.predict(model, guide, x, num_samples=8).mean
    assert probs.shape == (200, 10)
    # Chance is 1/10; the CNN fits its 200 training digits in these few steps.
    assert (probs.argmax(-1) == y).float().mean() > 0.8


@pytest.mark.parametrize("local", [True, False], ids=["module_local", "global_store"])
@pytest.mark.parametrize("make_guide", [AutoNormal, AutoDelta, BayesByBackpropGuide],
                         ids=["autonormal", "autodelta", "bbb"])
def test_pyro_svi_and_predictive_on_image_batches(local, make_guide):
    x = torch.randn(16, 1, 8, 8)
    y = torch.randint(4, (16,))
    with pyro.settings.context(module_local_params=local):
        model = BayesianModule(image_cnn(), task="classification")
        guide = make_guide(model)
        svi = SVI(model, guide, Adam({"lr": 1e-2}),
                  Trace_ELBO(num_particles=3, vectorize_particles=True))
        losses = [svi.step(x, y) for _ in range(5)]
        out = Predictive(model, guide=guide, num_samples=6, parallel=True,
                         return_sites=["f", "obs"])(x)
    pyro.clear_param_store()
    assert all(math.isfinite(v) for v in losses)
    assert out["f"].shape == (6, 16, 4)
    assert out["obs"].shape == (6, 16)


def test_regression_with_learned_noise_on_any_input_shape():
    model = BayesianModule(nn.Sequential(nn.Flatten(), nn.Linear(6, 1)))
    x, y = torch.randn(9, 2, 3), torch.randn(9)
    trace = poutine.trace(model).get_trace(x, y)
    assert trace.nodes["f"]["value"].shape == (9, 1)
    assert "noise_scale" in dict(model.named_pyro_params())


class Frozen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(2, 3)
        self.head = nn.Linear(3, 1)
        self.head.bias.requires_grad_(False)


@pytest.mark.parametrize("net, error, match", [
    (nn.ReLU(), ValueError, "no parameters"),
    (nn.Sequential(nn.BatchNorm1d(3)), ValueError, "no parameters"),
    (Frozen(), ValueError, "'head.bias' does not require grad"),
    (lambda x: x, TypeError, "torch.nn.Module"),
    (pyro.nn.PyroModule[nn.Linear](2, 1), TypeError, "PyroModule"),
])
def test_bad_modules_are_refused_naming_the_culprit(net, error, match):
    with pytest.raises(error, match=match):
        BayesianModule(net)


def test_wrong_output_width_is_refused():
    model = BayesianModule(nn.Linear(2, 3))  # 3 outputs, but regression wants 1
    with pytest.raises(ValueError, match=r"outputs \(N, 1\) for regression"):
        model(torch.randn(4, 2), torch.randn(4))
    with pytest.raises(ValueError, match="task"):
        BayesianModule(nn.Linear(2, 3), task="ranking")


def test_site_wise_guides_start_at_the_nets_own_weights():
    """A torch module's weights have the layout (out, in, *kernel), which the zoo's MLP
    initialisation (d_in, d_out) would misread: the guides start at the net's values."""
    net = digits_cnn()
    model = BayesianModule(net, task="classification")
    guide = BayesByBackpropGuide(model)
    for name, value in net.named_parameters():
        torch.testing.assert_close(deep_getattr(guide.loc, name).detach(), value.detach())


def test_autoguides_started_by_init_to_net_leave_the_net_unchanged():
    """AutoDelta trains its initial values in place: init_to_net must hand it copies."""
    x, y = digits(32)
    net = digits_cnn(channels=2)
    before = {name: p.detach().clone() for name, p in net.named_parameters()}
    model = BayesianModule(net, task="classification")
    guide = AutoDelta(model, init_loc_fn=model.init_to_net)
    bnn_zoo.fit(model, guide, x, y, steps=3, lr=0.1, seed=0)
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), before[name], rtol=0, atol=0)
