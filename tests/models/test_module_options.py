"""BayesianModule on networks as people write them: batch norm (running statistics
updated in training steps, fixed at prediction), parameters kept deterministic by name or
type, and priors per parameter (a mapping or a function of the name and the tensor)."""

from __future__ import annotations

import copy
import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoDelta
from torch import nn

import bnn_zoo
from bnn_zoo import zoo
from bnn_zoo.guides._mean_field import MeanFieldGuide
from bnn_zoo.models import BayesianModule, GaussianPrior, ScaleMixturePrior
from bnn_zoo.models._priors import SitePriors, TorchFanInPrior, prior_of_site


def bn_cnn() -> nn.Sequential:
    """Conv2d -> BatchNorm2d -> ReLU -> flatten -> Linear on (N, 1, 6, 6) images."""
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(3 * 16, 3))


def images(n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 6, 6, generator=g) * 2 + 1, torch.randint(0, 3, (n,), generator=g)


def running_stats(model: BayesianModule) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.net_state.buffers_by_name().items()}


def test_batch_norm_is_deterministic_by_default_and_its_buffers_are_the_models():
    net = bn_cnn()
    model = BayesianModule(net, task="classification")
    assert [name for name, _ in model.sites] == ["0.weight", "0.bias", "4.weight", "4.bias"]
    assert model.deterministic == {"1.weight", "1.bias"}
    assert {"net_state.1/running_mean", "net_state.1/running_var",
            "net_state.1/weight_unconstrained"} <= set(model.state_dict())
    everything = BayesianModule(net, task="classification", deterministic=())
    assert "1.weight" in dict(everything.sites)


def test_training_step_updates_running_stats_as_torch_and_prediction_does_not():
    """One sample in a training step: the batch statistics and torch's running-average
    update of a plain train-mode forward; a prediction (no ``y``) uses the running
    statistics, changes nothing, and equals the plain net in eval mode."""
    torch.manual_seed(0)
    net = bn_cnn()
    model = BayesianModule(net, task="classification")
    x, y = images()
    weights = {name: torch.randn(shape) for name, shape in model.sites}
    reference = copy.deepcopy(net)
    with torch.no_grad():
        for name, value in weights.items():
            reference.get_parameter(name).copy_(value)
    trace = poutine.trace(poutine.condition(model, weights)).get_trace(x, y)
    torch.testing.assert_close(trace.nodes["f"]["value"], reference.train()(x))
    stats = running_stats(model)
    torch.testing.assert_close(stats["1.running_mean"], reference[1].running_mean)
    torch.testing.assert_close(stats["1.running_var"], reference[1].running_var)
    assert int(stats["1.num_batches_tracked"]) == 1
    assert torch.equal(net[1].running_mean, torch.zeros(3))  # the user's net never changes
    predicted = poutine.trace(poutine.condition(model, weights)).get_trace(x, None)
    torch.testing.assert_close(predicted.nodes["f"]["value"], reference.eval()(x))
    for name, value in running_stats(model).items():
        assert torch.equal(value, stats[name])
    assert net.training and net[1].training  # the user's modes restored


def test_many_samples_update_the_running_stats_by_their_mean():
    """S weight samples at once (vmap): each sample's own update, averaged; no crash."""
    torch.manual_seed(0)
    model = BayesianModule(bn_cnn(), task="classification")
    x, _ = images()
    params = {name: torch.randn(4, *shape) for name, shape in model.sites}
    start = running_stats(model)
    f = model.network(x, params, train=True)
    assert f.shape == (4, 12, 3)
    means = []
    for s in range(4):
        model.net_state.set_buffers(start)
        model.network(x, {k: v[s] for k, v in params.items()}, train=True)
        means.append(running_stats(model)["1.running_mean"])
    model.net_state.set_buffers(start)
    model.network(x, params, train=True)
    torch.testing.assert_close(running_stats(model)["1.running_mean"],
                               torch.stack(means).mean(0))
    assert int(running_stats(model)["1.num_batches_tracked"]) == 1
    before = running_stats(model)
    model.eval()
    eval_f = model.network(x, params)
    assert eval_f.shape == (4, 12, 3)
    assert all(torch.equal(v, before[k]) for k, v in running_stats(model).items())


def test_map_fit_updates_running_stats_and_predicts_as_the_eval_net_with_its_map():
    """``bnn_zoo.fit`` (SVI with vectorised particles) changes the running statistics and
    learns the batch norm's affine point estimate; ``bnn_zoo.predict`` changes neither and
    its logits are those of a plain ``net.eval()`` with the MAP weights and the model's
    deterministic parameters and running statistics."""
    torch.manual_seed(0)
    net = bn_cnn()
    model = BayesianModule(net, task="classification")
    guide = AutoDelta(model, init_loc_fn=model.init_to_net)
    x, y = images(30)
    start = running_stats(model)
    bnn_zoo.fit(model, guide, x, y, steps=30, lr=0.05, num_particles=2)
    trained = running_stats(model)
    assert not torch.allclose(trained["1.running_mean"], start["1.running_mean"])
    assert int(trained["1.num_batches_tracked"]) >= 30  # and the step's first, building call
    assert not torch.equal(model.fixed_tensors()["1.weight"], torch.ones(3))
    pred = bnn_zoo.predict(model, guide, x, num_samples=2)
    assert all(torch.equal(v, trained[k]) for k, v in running_stats(model).items())
    reference = copy.deepcopy(net).eval()
    with torch.no_grad():
        for name, value in {**guide.median(), **model.fixed_tensors()}.items():
            target = (reference.get_parameter(name) if name not in model.net_state.buffer_names
                      else reference.get_buffer(name))
            target.copy_(value)
        expected = torch.log_softmax(reference(x), -1)
    torch.testing.assert_close(pred.log_probs[0], expected)


@pytest.mark.parametrize("deterministic, random", [
    (("0",), ["1.weight", "1.bias", "3.weight", "3.bias"]),
    ((nn.Linear, nn.BatchNorm1d), []),
    (("3.bias", nn.BatchNorm1d), ["0.weight", "0.bias", "3.weight"]),
    ("0.weight", ["0.bias", "1.weight", "1.bias", "3.weight", "3.bias"]),
])
def test_deterministic_by_name_or_type(deterministic, random):
    net = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2))
    if not random:
        with pytest.raises(ValueError, match="no parameters to put a prior on"):
            BayesianModule(net, task="classification", deterministic=deterministic)
        return
    model = BayesianModule(net, task="classification", deterministic=deterministic)
    assert [name for name, _ in model.sites] == random
    trace = poutine.trace(model).get_trace(torch.randn(6, 4), torch.randint(0, 2, (6,)))
    sampled = {name for name, node in trace.nodes.items() if node["type"] == "sample"}
    assert sampled == {*random, "obs", "f", "data"}
    params = {name.removeprefix("net_state.") for name, node in trace.nodes.items()
              if node["type"] == "param"}
    assert {name.replace(".", "/") for name in model.deterministic} <= params


def test_deterministic_layers_are_learned_point_estimates_and_frozen_ones_stay():
    """A deterministic parameter trains with the guide (SVI point estimate); one with
    ``requires_grad=False`` is a constant."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    net[2].bias.requires_grad_(False)
    model = BayesianModule(net, deterministic=("0", "2.bias"), noise_scale=0.1)
    guide = AutoDelta(model)
    x = torch.randn(20, 3)
    y = x.sum(-1)
    bnn_zoo.fit(model, guide, x, y, steps=20, lr=0.05)
    fixed = model.fixed_tensors()
    assert not torch.equal(fixed["0.weight"], net[0].weight.detach())
    assert torch.equal(fixed["2.bias"], net[2].bias.detach())


def test_bad_deterministic_and_prior_selectors_are_named():
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    with pytest.raises(ValueError, match="deterministic names '2'"):
        BayesianModule(net, deterministic=["2"])
    with pytest.raises(TypeError, match="deterministic.*3"):
        BayesianModule(net, deterministic=[3])
    with pytest.raises(ValueError, match="prior names '0.kernel'"):
        BayesianModule(net, prior={"0.kernel": GaussianPrior()})
    with pytest.raises(TypeError, match="prior of '0.weight'"):
        BayesianModule(net, prior=lambda name, tensor: 1.0)


def test_priors_per_layer_by_mapping_and_function_give_each_site_its_log_density():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    mapping = {"": GaussianPrior(2.0), nn.Linear: GaussianPrior(3.0), "2": ScaleMixturePrior(),
               "2.bias": GaussianPrior(0.5, fan_in=True)}
    model = BayesianModule(net, task="classification", prior=mapping)
    assert isinstance(model.prior, SitePriors)
    chosen = {name: prior_of_site(model.prior, name) for name, _ in model.sites}
    assert chosen["0.weight"] == GaussianPrior(2.0)  # a module name beats a type
    assert chosen["2.weight"] == ScaleMixturePrior()  # a deeper module beats the root
    assert chosen["2.bias"] == TorchFanInPrior(0.5, fan_in=True)  # its own name wins
    trace = poutine.trace(model).get_trace(torch.randn(5, 3), torch.randint(0, 2, (5,)))
    trace.compute_log_prob()
    w = trace.nodes["0.weight"]["value"]
    expected = torch.distributions.Normal(0.0, 2.0).log_prob(w).sum()
    torch.testing.assert_close(trace.nodes["0.weight"]["log_prob_sum"], expected)
    by_function = BayesianModule(net, task="classification",
                                 prior=lambda name, t: GaussianPrior(1.0 + t.dim()))
    assert prior_of_site(by_function.prior, "0.weight") == GaussianPrior(3.0)
    assert prior_of_site(by_function.prior, "0.bias") == GaussianPrior(2.0)


def test_mean_field_kl_takes_each_sites_prior():
    """The closed-form KL of the mean-field guide against per-layer Gaussian priors."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    scales = {"0": 2.0, "2": 0.5}
    model = BayesianModule(net, prior={k: GaussianPrior(v) for k, v in scales.items()})
    guide = MeanFieldGuide(model)
    expected = 0.0
    for name, q in guide.distributions().items():
        p = torch.distributions.Normal(0.0, scales[name.split(".")[0]])
        expected = expected + torch.distributions.kl_divergence(q, p).sum()
    torch.testing.assert_close(guide.kl_divergence(), expected)


def test_prior_precision_per_layer_and_per_weight():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    assert BayesianModule(net, prior=GaussianPrior(0.5)).prior_precision() == 4.0
    per_layer = BayesianModule(net, prior={"0": GaussianPrior(0.5), "2": GaussianPrior(2.0)})
    torch.testing.assert_close(per_layer.prior_precision(),
                               torch.tensor([4.0, 0.25], dtype=torch.float64))
    fan_in = BayesianModule(net, prior=GaussianPrior(1.0, fan_in=True)).prior_precision()
    assert fan_in.shape == (12 + 4 + 4 + 1,)
    torch.testing.assert_close(fan_in[[0, 12, 16]],
                               torch.tensor([3.0, 1.0, 4.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="prior of '0.weight'"):
        BayesianModule(net, prior=ScaleMixturePrior()).prior_precision()


@pytest.mark.parametrize("entry", ["map", "mean_field_clf"])
def test_entries_pass_deterministic_and_priors_through_model_options(entry):
    """``entry.fit(..., net=..., model_options={...})``: the model is built with them, the
    batch norm's statistics are trained, and a saved fit (names as selectors) loads."""
    x, y = images(40)
    torch.manual_seed(0)
    fitted = zoo.get(entry).fit(
        x, y, net=bn_cnn, steps=20, batch_size=20,
        model_options={"deterministic": ["0.bias", "1"], "prior": {"4": GaussianPrior(0.5)}})
    model = fitted.model
    assert [name for name, _ in model.sites] == ["0.weight", "4.weight", "4.bias"]
    assert prior_of_site(model.prior, "4.weight") == GaussianPrior(0.5)
    # 20 traced steps (jit=True) and the untraced first calls
    assert int(model.net_state.buffers_by_name()["1.num_batches_tracked"]) >= 20
    out = fitted.evaluate(x, y)
    assert math.isfinite(out["nll"])
    pyro.clear_param_store()


def test_entry_options_with_a_type_are_used_but_not_saved(tmp_path):
    x, y = images(20)
    fitted = zoo.get("map").fit(x, y, net=bn_cnn, steps=2,
                                model_options={"deterministic": [nn.BatchNorm2d]})
    with pytest.raises(ValueError, match="Cannot save options"):
        fitted.save(tmp_path / "fit.pt")
