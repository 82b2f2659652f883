"""Every SVI pair of the zoo is a Pyro citizen: Pyro's own ``SVI`` with ``pyro.optim``,
``Predictive``, ``poutine.trace``, the autoguides and ``MCMC`` work on it in both
``module_local_params`` modes, and importing the zoo changes no Pyro setting."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS, SVI, JitTrace_ELBO, Predictive, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import (
    AutoDelta,
    AutoLowRankMultivariateNormal,
    AutoMultivariateNormal,
    AutoNormal,
)
from pyro.optim import Adam

from bnn_zoo import zoo
from bnn_zoo.guides._params import LowRankMultivariateNormal
from bnn_zoo.methods._svi import SVI as SVIMethod
from bnn_zoo.models import BayesianMLP
from bnn_zoo.models._mlp import init_to_fan_in

# (entry, task, out_dim) of every entry whose method is SVI on a guide factory (the others,
# Laplace, NUTS, ensembles, the exact GP, are checked as Pyro pairs after fitting, in
# tests/zoo/test_contract.py).
PAIRS = [(name, zoo.get(name).tasks[0], 1 if zoo.get(name).tasks[0] == "regression" else 3)
         for name in zoo.names() if isinstance(zoo.get(name).method, SVIMethod)]
# Guides that are mean-field Gaussian over a Gaussian prior: the closed-form-KL ELBO applies.
MEAN_FIELD = {"bbb", "mean_field", "mean_field_clf"}
# Pyro 1.9.2's autoguides holding plain nn.Parameters (see bnn_zoo.guides._params).
PYRO_NN_PARAMETER_GUIDES = (AutoLowRankMultivariateNormal, AutoMultivariateNormal)
MODES = [pytest.param(True, id="module_local"), pytest.param(False, id="global_store")]
N, IN_DIM, NUM_SAMPLES = 12, 2, 7


@pytest.fixture(params=MODES)
def module_local_params(request):
    """Run the test under one setting of ``module_local_params``, on a clear store."""
    pyro.clear_param_store()
    with pyro.settings.context(module_local_params=request.param):
        yield request.param
    pyro.clear_param_store()


def problem(task: str, out_dim: int, n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, IN_DIM, generator=gen)
    if task == "regression":
        return x, torch.sin(x.sum(-1)) + 0.1 * torch.randn(n, generator=gen)
    return x, torch.randint(out_dim, (n,), generator=gen)


def build(name: str, task: str, out_dim: int):
    entry = zoo.get(name)
    model = entry.model(IN_DIM, out_dim, task=task)
    guide = entry.guide(model)
    if type(guide) in PYRO_NN_PARAMETER_GUIDES and pyro.settings.get("module_local_params"):
        pytest.xfail(f"{name!r} builds Pyro's {type(guide).__name__}, whose nn.Parameters "
                     "Pyro's SVI cannot step under module_local_params=True; "
                     "bnn_zoo.guides._params.LowRankMultivariateNormal can")
    return model, guide


def snapshot(*modules) -> dict[str, torch.Tensor]:
    return {f"{i}.{k}": v.detach().clone() for i, m in enumerate(modules)
            for k, v in m.named_parameters()}


def run_svi(model, guide, x, y, elbo, steps: int = 3) -> tuple[list[float], dict, dict]:
    """Pyro's SVI with pyro.optim.Adam: the losses and the parameters of model and guide
    before and after (``before`` taken after the first step, which creates lazy ones)."""
    svi = SVI(model, guide, Adam({"lr": 0.05}), elbo)
    losses = [svi.step(x, y)]
    before = snapshot(model, guide)
    losses += [svi.step(x, y) for _ in range(steps)]
    return losses, before, snapshot(model, guide)


def assert_trained(losses: list[float], before: dict, after: dict) -> None:
    assert all(math.isfinite(v) for v in losses), losses
    assert before and before.keys() == after.keys()
    unmoved = [k for k in before if torch.equal(before[k], after[k])]
    assert not unmoved, f"parameters that did not move: {unmoved}"


def elbos(name: str) -> list:
    out = [Trace_ELBO(max_plate_nesting=1)]
    if name in MEAN_FIELD:
        out.append(TraceMeanField_ELBO(max_plate_nesting=1))
    return out


@pytest.mark.parametrize("name,task,out_dim", PAIRS)
def test_pyro_svi_trains_every_pair(module_local_params, name, task, out_dim):
    x, y = problem(task, out_dim)
    for elbo in elbos(name):
        pyro.clear_param_store()
        model, guide = build(name, task, out_dim)
        assert_trained(*run_svi(model, guide, x, y, elbo))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name,task,out_dim", PAIRS)
def test_pyro_jit_elbo_trains_every_pair(name, task, out_dim):
    """``JitTrace_ELBO`` reads parameters from the global store by name, so it applies in
    Pyro's default mode only (pyro 1.9.2 raises a KeyError under module_local_params)."""
    pyro.clear_param_store()
    x, y = problem(task, out_dim)
    with pyro.settings.context(module_local_params=False):
        model, guide = build(name, task, out_dim)
        elbo = JitTrace_ELBO(max_plate_nesting=1, ignore_jit_warnings=True)
        assert_trained(*run_svi(model, guide, x, y, elbo))


def latent_sites(model, x, y) -> set[str]:
    trace = poutine.trace(model).get_trace(x, y)
    return {name for name, site in trace.nodes.items() if site["type"] == "sample"
            and not site["is_observed"] and not poutine.util.site_is_subsample(site)}


@pytest.mark.parametrize("name,task,out_dim", PAIRS)
def test_predictive_and_guide_trace(module_local_params, name, task, out_dim):
    """After a few SVI steps, ``Predictive`` draws ``obs`` (S, N) and ``f`` (S, N[, C]) in
    parallel, and the guide's trace holds every latent site of the model."""
    x, y = problem(task, out_dim)
    model, guide = build(name, task, out_dim)
    losses, _, _ = run_svi(model, guide, x, y, Trace_ELBO(max_plate_nesting=1), steps=1)
    x_new = torch.randn(5, IN_DIM)
    samples = Predictive(model, guide=guide, num_samples=NUM_SAMPLES, return_sites=("obs", "f"),
                         parallel=True)(x_new)
    f_shape = (NUM_SAMPLES, 5) if name == "rff_logitnormal" else (NUM_SAMPLES, 5, out_dim)
    assert samples["obs"].shape == (NUM_SAMPLES, 5)
    assert samples["f"].shape == f_shape
    assert torch.isfinite(samples["f"]).all()
    guide_sites = set(poutine.trace(guide).get_trace(x, y).nodes)
    assert latent_sites(model, x, y) <= guide_sites


AUTOGUIDES = {
    "AutoNormal": lambda model: AutoNormal(model, init_loc_fn=init_to_fan_in, init_scale=0.01),
    "AutoDelta": lambda model: AutoDelta(model, init_loc_fn=init_to_fan_in),
    "AutoLowRankMultivariateNormal": lambda model: AutoLowRankMultivariateNormal(
        model, init_loc_fn=init_to_fan_in, init_scale=0.01, rank=2),
    "AutoMultivariateNormal": lambda model: AutoMultivariateNormal(
        model, init_loc_fn=init_to_fan_in, init_scale=0.01),
    "LowRankMultivariateNormal": lambda model: LowRankMultivariateNormal(
        model, init_loc_fn=init_to_fan_in, init_scale=0.01, rank=2),
}
# Pyro's default mode only: these hold nn.Parameters (see bnn_zoo.guides._params).
DEFAULT_MODE_ONLY = {guide.__name__ for guide in PYRO_NN_PARAMETER_GUIDES}


@pytest.mark.parametrize("autoguide", sorted(AUTOGUIDES))
@pytest.mark.parametrize("task,out_dim", [("regression", 1), ("classification", 3)])
def test_pyro_autoguides_on_the_zoos_mlp(module_local_params, autoguide, task, out_dim):
    if module_local_params and autoguide in DEFAULT_MODE_ONLY:
        pytest.skip(f"Pyro's {autoguide} holds nn.Parameters that its SVI cannot step "
                    "under module_local_params=True")
    x, y = problem(task, out_dim)
    model = BayesianMLP(IN_DIM, out_dim, (4,), task=task)
    guide = AUTOGUIDES[autoguide](model)
    assert_trained(*run_svi(model, guide, x, y, Trace_ELBO(max_plate_nesting=1)))
    samples = Predictive(model, guide=guide, num_samples=NUM_SAMPLES, return_sites=("obs", "f"),
                         parallel=True)(x)
    assert samples["obs"].shape == (NUM_SAMPLES, N)
    assert samples["f"].shape == (NUM_SAMPLES, N, out_dim)


def test_nuts_samples_a_tiny_mlp():
    x, y = problem("regression", 1, n=8)
    model = BayesianMLP(IN_DIM, 1, (2,), noise_scale=0.3)
    mcmc = MCMC(NUTS(model, max_tree_depth=4), num_samples=5, warmup_steps=5,
                disable_progbar=True)
    mcmc.run(x, y)
    draws = mcmc.get_samples()
    assert draws["layers.0.weight"].shape == (5, IN_DIM, 2)
    assert draws["layers.1.bias"].shape == (5, 1)
    assert all(torch.isfinite(v).all() for v in draws.values())
    samples = Predictive(model, posterior_samples=draws, return_sites=("obs",))(x)
    assert samples["obs"].shape == (5, 8)


def test_importing_the_zoo_changes_no_pyro_setting():
    code = ("import json, pyro; before = pyro.settings.get(); import bnn_zoo, bnn_zoo.zoo; "
            "print(json.dumps([before, pyro.settings.get()], default=str))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    before, after = json.loads(out)
    assert before == after
    assert after["module_local_params"] is False  # Pyro's default, untouched


# The README's "five lines", written as plain Pyro: Pyro's SVI and Predictive on the zoo's
# model and guide.
PLAIN_PYRO_EXAMPLE = """\
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.optim import Adam
from bnn_zoo import data
from bnn_zoo.guides import BayesByBackpropGuide
from bnn_zoo.models import BayesianMLP

d = data.load("sine")
model = BayesianMLP(1, 1, hidden=(50,))
guide = BayesByBackpropGuide(model)
svi = SVI(model, guide, Adam({"lr": 0.01}), Trace_ELBO())
losses = [svi.step(d.x_train, d.y_train) for step in range(1000)]
pred = Predictive(model, guide=guide, num_samples=100, return_sites=("obs",))(d.x_test)
print(pred["obs"].mean(0)[:3], pred["obs"].std(0)[:3])
"""


@pytest.mark.parametrize("local", [True, False])
def test_the_readme_example_as_plain_pyro(local, capsys):
    """The plain-Pyro version of the README's example runs in either mode and fits: the
    loss falls, the predictive mean is within twice the noise of the test targets, and
    what it prints is the predictive's first three means and standard deviations."""
    pyro.clear_param_store()
    scope: dict = {}
    with pyro.settings.context(module_local_params=local):
        exec(compile(PLAIN_PYRO_EXAMPLE, "plain Pyro example", "exec"), scope)
    losses, d, pred = scope["losses"], scope["d"], scope["pred"]
    mean, std = pred["obs"].mean(0), pred["obs"].std(0)
    assert capsys.readouterr().out == f"{mean[:3]} {std[:3]}\n"
    assert (std > 0).all()
    assert sum(losses[-50:]) < sum(losses[:50])
    rmse = (pred["obs"].mean(0) - d.y_test).pow(2).mean().sqrt()
    assert rmse < 2 * d.noise_scale + 0.1, rmse
