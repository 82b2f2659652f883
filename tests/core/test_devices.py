"""Everything runs on the device of the data: models, guides, fit and predict.

The ``meta`` device stands in for a GPU here: like CUDA it refuses to mix with
(non-scalar) CPU tensors, so a tensor silently created on the CPU fails these
tests. Meta tensors hold no values, so on ``meta`` we check the loss, its
gradients and the predictive (not a whole ``fit``, which reads the loss); the
full fit/predict runs on the CPU, and on CUDA when it is available.
"""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro import poutine
from pyro.distributions import ExpandedDistribution, Independent

import bnn_zoo
import bnn_zoo._core.elbo.mean_field
from bnn_zoo import zoo
from bnn_zoo._core.checks import check_device
from bnn_zoo._core.elbo import MeanFieldELBO
from bnn_zoo._core.predictive import sample_predictive
from bnn_zoo._core.step import SVIStep
from bnn_zoo.guides import BayesByBackpropGuide
from bnn_zoo.models import BayesianMLP

TASKS = [("regression", 1), ("classification", 3)]
GUIDES = ["bbb", "mean_field", "map"]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


def problem(task: str, out_dim: int, device, dtype=torch.float32, n: int = 12):
    x = torch.randn(n, 3, dtype=dtype).to(device)
    if task == "regression":
        y = torch.randn(n, dtype=dtype).to(device)
    else:
        y = torch.randint(out_dim, (n,)).to(device)
    return x, y


def tensors_of(trace) -> list[tuple[str, torch.Tensor]]:
    """Every tensor a trace holds: site values and the parameters of site distributions."""
    out = []
    for name, site in trace.nodes.items():
        if isinstance(site.get("value"), torch.Tensor):
            out.append((name, site["value"]))
        fn = site.get("fn")
        while isinstance(fn, (Independent, ExpandedDistribution)):
            fn = fn.base_dist
        for key in getattr(fn, "arg_constraints", {}):
            value = fn.__dict__.get(key)
            if isinstance(value, torch.Tensor):
                out.append((f"{name}.{key}", value))
    return out


@pytest.fixture
def meta_without_value_reads(monkeypatch):
    """Meta tensors have no values: turn off the checks that read them (validation,
    the ELBO's NaN warning)."""
    monkeypatch.setattr(bnn_zoo._core.elbo.mean_field, "warn_if_nan", lambda value, msg="": value)
    with pyro.validation_enabled(False):
        yield torch.device("meta")


@pytest.mark.parametrize("task,out_dim", TASKS)
@pytest.mark.parametrize("name", GUIDES)
def test_loss_gradients_and_predictive_stay_on_meta(meta_without_value_reads, name, task,
                                                    out_dim):
    device = meta_without_value_reads
    entry = zoo.get(name)
    model = entry.model(3, out_dim, task=task, hidden=(8,)).to(device)
    guide = entry.guide(model)
    x, y = problem(task, out_dim, device)
    step = SVIStep(model, guide, x, y, lr=0.1, batch_size=5, elbo=MeanFieldELBO)
    loss = step.loss(*step.next_batch())
    loss.backward()
    assert loss.device == device
    assert {p.device for p in step.params} == {device}
    assert {p.grad.device for p in step.params} == {device}
    guide_trace = poutine.trace(guide).get_trace(x, y)
    model_trace = poutine.trace(poutine.replay(model, guide_trace)).get_trace(x, y)
    for where, value in tensors_of(guide_trace) + tensors_of(model_trace):
        assert value.device == device or value.dim() == 0, where
    # bnn_zoo.predict refuses data without values; the sampler under it runs on meta
    pred = sample_predictive(model, guide, x, num_samples=4, max_plate_nesting=1)
    for value in vars(pred).values():
        assert value.device == device
        assert value.shape[:2] == (4, x.shape[0])


def test_bbb_guide_is_built_on_the_models_device_and_dtype():
    model = BayesianMLP(3, 1, (8,)).to(device="meta", dtype=torch.float64)
    guide = BayesByBackpropGuide(model)
    assert {(p.device.type, p.dtype) for p in guide.parameters()} == {("meta", torch.float64)}


def test_model_and_data_on_different_devices_is_a_value_error():
    model = BayesianMLP(3, 1, (8,)).to("meta")
    guide = BayesByBackpropGuide(model)
    x, y = problem("regression", 1, "cpu")
    with pytest.raises(ValueError, match="model on the device of x"):
        bnn_zoo.fit(model, guide, x, y, steps=1)
    with pytest.raises(ValueError, match="guide on the device of x"):
        bnn_zoo.predict(BayesianMLP(3, 1, (8,)), guide, x)


def test_fitted_predict_refuses_x_on_another_device():
    x, y = problem("regression", 1, "cpu")
    fitted = zoo.get("bbb").fit(x, y, steps=2, jit=False, model_options={"hidden": (4,)})
    with pytest.raises(ValueError, match="Expected x on a device that holds data.*'meta'"):
        fitted.predict(x.to("meta"))


def test_check_device():
    assert check_device("device", "cpu") == torch.device("cpu")
    assert check_device("device", torch.device("meta")).type == "meta"
    with pytest.raises(ValueError, match="Unknown device 'gpu0'"):
        check_device("device", "gpu0")
    with pytest.raises(TypeError, match="device"):
        check_device("device", 0.5)
    with pytest.raises(ValueError, match="on device meta"):
        check_device("device", "cpu", expected=torch.device("meta"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            check_device("device", "cuda")


@pytest.mark.parametrize("task,out_dim", TASKS)
def test_entry_fits_and_predicts_in_the_dtype_of_the_data(task, out_dim):
    x, y = problem(task, out_dim, "cpu", torch.float64, n=40)
    fitted = zoo.get("bbb").fit(x, y, task=task, steps=5, batch_size=16,
                                model_options={"hidden": (8,)})
    assert {p.dtype for p in fitted.guide.parameters()} == {torch.float64}
    assert fitted.predict(x, num_samples=3).mean.dtype == torch.float64
    assert all(isinstance(v, float) for v in fitted.evaluate(x, y, num_samples=3).values())


@CUDA
@pytest.mark.parametrize("task,out_dim", TASKS)
@pytest.mark.parametrize("name", GUIDES)
def test_entry_fits_and_predicts_on_cuda(name, task, out_dim):
    x, y = problem(task, out_dim, "cuda", n=40)
    fitted = zoo.get(name).fit(x, y, task=task, steps=5, batch_size=16,
                               model_options={"hidden": (8,)})
    assert {p.device.type for p in fitted.guide.parameters()} == {"cuda"}
    pred = fitted.predict(x, num_samples=3)
    assert all(v.device.type == "cuda" for v in vars(pred).values())
    assert all(isinstance(v, float) for v in fitted.evaluate(x, y, num_samples=3).values())
