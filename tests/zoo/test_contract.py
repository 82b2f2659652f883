"""The contract every zoo entry keeps, one matrix over ``zoo.names()`` and the tasks each
entry supports: a tiny fit (the entry's own :attr:`~bnn_zoo.zoo.Entry.tiny` keywords, so a
new entry is covered as it is registered), predictive shapes, metric keys, determinism under
a seed, dtype and device of the data, plain Pyro's ``Predictive`` on the fitted pair, and a
save/load round trip that predicts the same; and for every entry that takes a user's
network, the same on images (N, C, H, W) and series (N, C, L) given to a small CNN as
they are."""

from __future__ import annotations

import dataclasses
import math
import re

import pyro
import pytest
import torch
from torch import nn

from bnn_zoo import data, zoo
from bnn_zoo.methods._ensemble import Ensemble
from bnn_zoo.methods._nuts import NUTS
from bnn_zoo.methods._svi import SVI
from bnn_zoo.models._priors import ScaleMixturePrior
from bnn_zoo.zoo.reference import auto_normal

REGRESSION_METRICS = {"rmse", "ll", "coverage_50", "coverage_90", "coverage_95", "fit_seconds"}
CLASSIFICATION_METRICS = {"accuracy", "nll", "brier", "ece", "fit_seconds"}
TIMINGS = {"fit_seconds", "steps_per_second", "sampling_seconds"}
CASES = [(name, task) for name in zoo.names() for task in zoo.get(name).tasks]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


def tiny_problem(task: str, dtype: torch.dtype = torch.float64, device: str = "cpu"):
    """30 training and 10 test points of ``sine`` or ``two_moons`` (both classes present)."""
    d = data.load("sine" if task == "regression" else "two_moons")
    x, y = d.x_train[:40].to(device=device, dtype=dtype), d.y_train[:40].to(device)
    if task == "regression":
        y = y.to(dtype)
    return x[:30], y[:30], x[30:], y[30:]


def tiny_fit(name: str, task: str, x, y, seed: int = 0, **options) -> zoo.Fitted:
    """A fit of entry ``name`` with its declared tiny keywords (and ``options``)."""
    entry = zoo.get(name)
    return entry.fit(x, y, task=task, seed=seed, **{**entry.tiny, **options})


def seeded_metrics(fitted: zoo.Fitted, x, y) -> dict[str, float]:
    pyro.set_rng_seed(1)
    return {k: v for k, v in fitted.evaluate(x, y, num_samples=8).items() if k not in TIMINGS}


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}-{t}" for n, t in CASES])
def case(request):
    """One tiny float64 fit per (entry, task), shared by the tests of this module."""
    name, task = request.param
    pyro.set_rng_seed(0)
    x, y, x_test, y_test = tiny_problem(task)
    return name, task, tiny_fit(name, task, x, y), x_test, y_test


def test_fit_predicts_with_the_promised_shapes_and_metrics(case):
    name, task, fitted, x_test, y_test = case
    assert fitted.entry == name and fitted.task == task
    pred = fitted.predict(x_test, num_samples=8)
    n = x_test.shape[0]
    if task == "regression":
        assert pred.loc.shape == pred.scale.shape and pred.loc.shape[1:] == (n,)
        assert pred.mean.shape == (n,) and bool((pred.stddev > 0).all())
    else:
        assert pred.probs.shape[1:] == (n, fitted.out_dim) == (n, 2)
        torch.testing.assert_close(pred.mean.sum(-1), torch.ones(n, dtype=pred.mean.dtype))
    out = fitted.evaluate(x_test, y_test, num_samples=8)
    assert (REGRESSION_METRICS if task == "regression" else CLASSIFICATION_METRICS) <= set(out)
    assert all(isinstance(v, float) and math.isfinite(v) for v in out.values()), out


def test_same_seed_gives_identical_metrics(case):
    name, task, fitted, x_test, y_test = case
    x, y, _, _ = tiny_problem(task)
    pyro.set_rng_seed(123)  # the fit seeds itself: the global state before it must not matter
    again = tiny_fit(name, task, x, y)
    assert seeded_metrics(again, x_test, y_test) == seeded_metrics(fitted, x_test, y_test)


def test_dtype_follows_the_data(case):
    """float64 data in, float64 predictive out."""
    _, task, fitted, x_test, _ = case
    pred = fitted.predict(x_test, num_samples=4)
    assert pred.mean.dtype == torch.float64
    assert fitted.x_scaler.mean.dtype == torch.float64


def test_plain_pyro_predictive_samples_obs(case):
    _, _, fitted, x_test, _ = case
    xs = fitted.x_scaler.transform(x_test)
    samples = pyro.infer.Predictive(fitted.model, guide=fitted.guide, num_samples=3)(xs)
    assert samples["obs"].shape == (3, x_test.shape[0])
    assert bool(torch.isfinite(samples["obs"].double()).all())


def test_save_and_load_predict_the_same(case, tmp_path):
    name, task, fitted, x_test, _ = case
    path = tmp_path / "fitted.pt"
    fitted.save(path)
    assert list(tmp_path.iterdir()) == [path]  # the temporary file was renamed, not left
    loaded = zoo.load(path)
    assert (loaded.entry, loaded.task, loaded.in_dim, loaded.out_dim) == (
        name, task, fitted.in_dim, fitted.out_dim)
    predictions = []
    for f in (fitted, loaded):
        pyro.set_rng_seed(5)
        predictions.append(f.predict(x_test, num_samples=6))
    before, after = predictions
    torch.testing.assert_close(after.mean, before.mean)
    if task == "regression":
        torch.testing.assert_close(after.stddev, before.stddev)


@CUDA
@pytest.mark.parametrize("name,task", CASES, ids=[f"{n}-{t}" for n, t in CASES])
def test_device_follows_the_data(name, task):
    x, y, x_test, _ = tiny_problem(task, torch.float32, "cuda")
    fitted = tiny_fit(name, task, x, y)
    pred = fitted.predict(x_test, num_samples=4)
    assert all(v.device.type == "cuda" for v in vars(pred).values() if v is not None)
    assert pred.mean.dtype == torch.float32


# --- a user's network on inputs of any shape ---------------------------------------------

#: The input shape (C, H, W) or (C, L) and the network of each layout: a convolution, ReLU,
#: average pooling, then Linear -> Tanh -> Linear, as a user writes a small CNN.
SHAPED = {
    "image": ((1, 4, 4), lambda out: nn.Sequential(
        nn.Conv2d(1, 2, 2), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(2, 3),
        nn.Tanh(), nn.Linear(3, out))),
    "series": ((2, 6), lambda out: nn.Sequential(
        nn.Conv1d(2, 2, 3), nn.ReLU(), nn.AvgPool1d(2), nn.Flatten(), nn.Linear(4, 3),
        nn.Tanh(), nn.Linear(3, out))),
}
NET_CASES = [(name, task, layout) for name in zoo.names(accepts_net=True)
             for task in zoo.get(name).tasks for layout in SHAPED]


def shaped_problem(task: str, layout: str):
    """30 training and 10 test inputs of the layout's shape (float32, as CNNs run), with
    regression targets (their mean) or two classes (its sign), and the layout's network
    factory."""
    shape, make_net = SHAPED[layout]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, *shape, generator=g)
    signal = x.flatten(1).mean(1)
    y = signal if task == "regression" else (signal > signal.median()).long()
    out = 1 if task == "regression" else 2
    return x[:30], y[:30], x[30:], y[30:], lambda: make_net(out)


@pytest.mark.parametrize("name,task,layout", NET_CASES,
                         ids=[f"{n}-{t}-{s}" for n, t, s in NET_CASES])
def test_network_takes_images_and_series_as_they_are(name, task, layout, tmp_path):
    """Every entry that takes a network fits, predicts, evaluates and saves with a CNN on
    inputs (N, C, H, W) or (N, C, L), no reshaping inside the network."""
    x, y, x_test, y_test, make_net = shaped_problem(task, layout)
    pyro.set_rng_seed(0)
    fitted = tiny_fit(name, task, x, y, net=make_net)
    assert fitted.in_shape == x.shape[1:]
    n, out = x_test.shape[0], 1 if task == "regression" else 2
    pred = fitted.predict(x_test, num_samples=4)
    assert pred.mean.shape == ((n,) if task == "regression" else (n, out))
    assert bool(torch.isfinite(pred.mean).all()) and pred.mean.dtype == torch.float32
    metrics = fitted.evaluate(x_test, y_test, num_samples=4)
    assert (REGRESSION_METRICS if task == "regression" else CLASSIFICATION_METRICS) <= set(
        metrics)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    fitted.save(tmp_path / "fit.pt")
    loaded = zoo.load(tmp_path / "fit.pt", net=make_net)
    predictions = []
    for f in (fitted, loaded):
        pyro.set_rng_seed(5)
        predictions.append(f.predict(x_test, num_samples=4).mean)
    torch.testing.assert_close(*predictions)


@pytest.mark.parametrize("name", zoo.names())
def test_entry_cites_a_paper_and_declares_its_tiny_fit(name):
    """``source`` is a citation a user can look up (authors, year, quoted title), not a file;
    ``notes``, if any, cites notes by author or title, not by a number; ``tiny`` holds only
    budget fields and ``method_options``."""
    entry = zoo.get(name)
    assert re.match(r'[A-Z][\w&,. ]+ (19|20)\d\d, "[^"]+"', entry.source), entry.source
    assert entry.notes is None or (
        "notes" in entry.notes and not re.search(r"\bseed|\b\d{3}\b", entry.notes)), entry.notes
    budget_fields = {f.name for f in dataclasses.fields(zoo.Budget)}
    assert set(entry.tiny) <= budget_fields | {"method_options"} and entry.tiny["steps"] <= 10


# --- options, files and their errors --------------------------------------------------------

def test_unknown_options_name_their_namespace_and_the_accepted_keys():
    x, y, _, _ = tiny_problem("regression")
    entry = zoo.get("mixture")
    with pytest.raises(ValueError, match="model_options 'hiden'.*hidden"):
        entry.fit(x, y, model_options={"hiden": (3,)})
    with pytest.raises(ValueError, match="guide_options 'components'.*num_components"):
        entry.fit(x, y, guide_options={"components": 3})
    with pytest.raises(ValueError, match="method_options 'members'"):
        entry.fit(x, y, method_options={"members": 3})
    with pytest.raises(ValueError, match="budget option 'hidden'.*steps"):
        entry.fit(x, y, hidden=(3,))
    with pytest.raises(ValueError, match="no guide"):
        zoo.get("nngp").fit(x, y, guide_options={"init_scale": 0.1})


def test_guide_options_reach_the_guide_of_composed_methods():
    x, y, _, _ = tiny_problem("regression")
    fitted = tiny_fit("mixture", "regression", x, y, guide_options={"num_components": 3})
    assert fitted.guide.num_components == 3
    composed = NUTS(start=SVI(auto_normal)).with_guide_options({"init_scale": 0.5})
    assert composed.start.guide_options == {"init_scale": 0.5}
    composed = Ensemble(member=SVI(auto_normal)).with_guide_options({"init_scale": 0.5})
    assert composed.member.guide_options == {"init_scale": 0.5}
    with pytest.raises(ValueError, match="guide_options 'init_scale'"):  # map_guide has none
        zoo.get("ensemble").fit(x, y, guide_options={"init_scale": 0.5})


def test_save_refuses_options_that_are_not_plain_data(tmp_path):
    x, y, _, _ = tiny_problem("regression")
    fitted = tiny_fit("bbb", "regression", x, y, model_options={"prior": ScaleMixturePrior()})
    with pytest.raises(ValueError, match=r"options\['model_options'\]\['prior'\]"):
        fitted.save(tmp_path / "f.pt")
    assert list(tmp_path.iterdir()) == []


def test_load_errors_name_the_file(tmp_path):
    missing = tmp_path / "missing.pt"
    with pytest.raises(ValueError, match="missing.pt"):
        zoo.load(missing)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="garbage.pt"):
        zoo.load(garbage)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(ValueError, match="other.pt.*not a fitted zoo entry"):
        zoo.load(other)
    pickled = tmp_path / "pickled.pt"
    torch.save({"format": "bnn_zoo.fitted/1", "entry": ScaleMixturePrior()}, pickled)
    with pytest.raises(ValueError, match="pickled.pt"):  # weights_only refuses the object
        zoo.load(pickled)


def test_validated_noise_survives_save_and_load(tmp_path):
    x, y, x_test, _ = tiny_problem("regression")
    fitted = tiny_fit("map", "regression", x, y, validation=0.25)
    fitted.save(tmp_path / "map.pt")
    loaded = zoo.load(tmp_path / "map.pt")
    assert loaded.diagnostics["validated_noise_scale"] == fitted.diagnostics[
        "validated_noise_scale"]
    torch.testing.assert_close(loaded.predict(x_test).scale, fitted.predict(x_test).scale)
    torch.testing.assert_close(loaded.predict(x_test).mean, fitted.predict(x_test).mean)
