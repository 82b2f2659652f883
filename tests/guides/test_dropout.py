"""MC dropout (Gal and Ghahramani 2016) as a guide: its predictive is the average of the
masked deterministic networks, its masks keep inputs at rate 1 - p, and they fall on the
inputs of every layer but the first, on the zoo's MLP and on a user's network."""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro import poutine
from torch import nn

from bnn_zoo._core.predictive import predict
from bnn_zoo.guides._dropout import MCDropoutGuide, dropout_masks
from bnn_zoo.models import BayesianMLP, BayesianModule
from bnn_zoo.models._mlp import init_to_fan_in

S, N, P = 6, 7, 0.3


def guide_draw(guide, x):
    """The guide's trace under the sample plate that :func:`predict` opens."""
    with pyro.plate("_predictive_samples", S, dim=-2):
        return poutine.trace(guide).get_trace(x, None)


def mlp_outputs(guide, trace, x):
    """The zoo's MLP (ReLU) with the guide's point masses ``M``, the inputs of each layer
    after the first multiplied by the trace's masks over ``1 - p``: (S, N, out)."""
    m = guide.point.median(x)
    h = torch.relu(x @ m["layers.0.weight"] + m["layers.0.bias"]).expand(S, N, -1)
    z1 = trace.nodes["dropout.layers.1"]["value"].squeeze(1)  # (S, d_1)
    h = torch.relu((h * z1[:, None] / (1 - P)) @ m["layers.1.weight"] + m["layers.1.bias"])
    z2 = trace.nodes["dropout.layers.2"]["value"].squeeze(1)
    return (h * z2[:, None] / (1 - P)) @ m["layers.2.weight"] + m["layers.2.bias"]


@pytest.mark.parametrize("task,out", [("regression", 1), ("classification", 3)])
def test_predictive_is_the_average_of_the_masked_networks(task, out):
    x = torch.randn(N, 2, dtype=torch.float64)
    model = BayesianMLP(2, out, (5, 4), task=task, noise_scale=0.4).double()
    guide = MCDropoutGuide(model, dropout=P, init_loc_fn=init_to_fan_in).double()
    y = torch.zeros(N) if task == "regression" else torch.zeros(N, dtype=torch.long)
    guide(x, y)  # creates the point masses
    pyro.set_rng_seed(3)
    pred = predict(model, guide, x, num_samples=S)
    pyro.set_rng_seed(3)  # the same masks: predict draws the guide first, under this plate
    f = mlp_outputs(guide, guide_draw(guide, x), x)
    if task == "regression":
        torch.testing.assert_close(pred.loc, f.squeeze(-1), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(pred.mean, f.squeeze(-1).mean(0), rtol=1e-12, atol=1e-12)
    else:
        probs = torch.softmax(f, -1)
        torch.testing.assert_close(pred.mean, probs.mean(0), rtol=1e-12, atol=1e-12)


def test_a_users_network_drops_the_inputs_of_every_layer_but_the_first():
    net = nn.Sequential(nn.Linear(2, 5), nn.ReLU(), nn.Linear(5, 4), nn.Tanh(),
                        nn.Linear(4, 1)).double()
    model = BayesianModule(net, noise_scale=0.4)
    guide = MCDropoutGuide(model, dropout=P, init_loc_fn=model.init_to_net).double()
    x = torch.randn(N, 2, dtype=torch.float64)
    guide(x, torch.zeros(N, dtype=torch.float64))  # creates the point masses
    pyro.set_rng_seed(4)
    pred = predict(model, guide, x, num_samples=S)
    pyro.set_rng_seed(4)
    trace = guide_draw(guide, x)
    z2, z4 = (trace.nodes[f"dropout.{i}"]["value"].squeeze(1) for i in (2, 4))
    w = {name: p.detach() for name, p in net.named_parameters()}
    h = torch.relu(x @ w["0.weight"].T + w["0.bias"])
    h = torch.tanh((h * z2[:, None] / (1 - P)) @ w["2.weight"].T + w["2.bias"])
    f = (h * z4[:, None] / (1 - P)) @ w["4.weight"].T + w["4.bias"]
    torch.testing.assert_close(pred.loc, f.squeeze(-1), rtol=1e-12, atol=1e-12)


def test_masks_keep_inputs_at_rate_one_minus_p_and_spare_the_first_layer():
    model = BayesianMLP(3, 1, (50, 50), noise_scale=0.4)
    guide = MCDropoutGuide(model, dropout=P)
    x = torch.randn(4, 3)
    guide(x, torch.zeros(4))
    samples = 400
    with pyro.plate("samples", samples, dim=-2):
        trace = poutine.trace(guide).get_trace(x)
    z = torch.cat([trace.nodes[f"dropout.layers.{i}"]["value"] for i in (1, 2)])
    assert set(z.unique().tolist()) == {0.0, 1.0}
    n = z.numel()  # 2 * 400 * 50 Bernoulli draws
    error = ((1 - P) * P / n) ** 0.5
    assert abs(z.mean().item() - (1 - P)) < 4 * error
    first = trace.nodes["layers.0.weight"]["value"]
    torch.testing.assert_close(first, guide.point.median(x)["layers.0.weight"].expand_as(first))
    assert "dropout.layers.0" not in trace.nodes


def test_the_mask_rule_on_convolutions_and_linear_layers():
    net = nn.Sequential(nn.Conv2d(1, 3, 2), nn.ReLU(), nn.Conv2d(3, 2, 2), nn.Flatten(),
                        nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    masks = dropout_masks(BayesianModule(net, task="classification"))
    assert masks == {"2.weight": ("dropout.2", (1, 3, 1, 1)),
                     "4.weight": ("dropout.4", (1, 8)),
                     "6.weight": ("dropout.6", (1, 4))}
    assert dropout_masks(BayesianMLP(2, 1, (5,))) == {
        "layers.1.weight": ("dropout.layers.1", (5, 1))}


def test_a_dropout_rate_outside_zero_one_is_named():
    with pytest.raises(ValueError, match="dropout"):
        MCDropoutGuide(BayesianMLP(2, 1, (5,)), dropout=1.0)
