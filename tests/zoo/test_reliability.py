"""Bad inputs and faults, table-driven (issue "Every bad input answered"): each case asserts
the error type, that the message names the culprit, and that no file is lost or half-written."""

from __future__ import annotations

import math
import shutil
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
import pyro
import pyro.infer
import pytest
import torch
from pyro.infer.autoguide import AutoNormal

import bnn_zoo
import bnn_zoo.methods._base
from bnn_zoo import data, zoo
from bnn_zoo._core.checkpoint import CheckpointWarning
from bnn_zoo._core.predictive import CategoricalPredictive, GaussianMixturePredictive
from bnn_zoo.evaluation._metrics import NonFiniteMetricWarning, metrics
from bnn_zoo.methods._base import Budget, UnsupportedProblem
from bnn_zoo.models import BayesianMLP

SOURCE = Path(__file__).resolve().parents[3] / "shared" / "data" / "uci"


@pytest.fixture
def uci_copy(tmp_path, monkeypatch) -> Path:
    """A private copy of the yacht files under ``BNN_ZOO_DATA`` that a case may damage."""
    source = Path(__import__("os").environ.get("BNN_ZOO_DATA", SOURCE)) / "yacht"
    if not source.exists():
        pytest.skip("the UCI data are not available (set BNN_ZOO_DATA)")
    shutil.copytree(source, tmp_path / "yacht")
    monkeypatch.setenv("BNN_ZOO_DATA", str(tmp_path))
    return tmp_path / "yacht" / "data"


def _truncate(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2].rsplit(" ", 1)[0] + " 1.5e")


DATA_FILE_CASES = {
    # case: (file, damage, error type, words the message must contain)
    "garbled data": ("data.txt", lambda p: p.write_text("1 2 three\n4 5 6\n"), ValueError,
                     ["data.txt"]),
    "truncated data": ("data.txt", _truncate, ValueError, ["data.txt"]),
    "empty data": ("data.txt", lambda p: p.write_text(""), ValueError, ["data.txt"]),
    "empty split": ("index_train_0.txt", lambda p: p.write_text(""), ValueError,
                    ["index_train_0.txt"]),
    "index out of range": ("index_test_0.txt", lambda p: p.write_text("0\n1\n100000\n"),
                           ValueError, ["index_test_0.txt", "100000"]),
    "negative index": ("index_train_0.txt", lambda p: p.write_text("-1\n2\n"), ValueError,
                       ["index_train_0.txt"]),
    "fractional index": ("index_train_0.txt", lambda p: p.write_text("0.5\n2\n"), ValueError,
                         ["index_train_0.txt", "integer"]),
    "feature column out of range": ("index_features.txt", lambda p: p.write_text("0\n99\n"),
                                    ValueError, ["index_features.txt"]),
    "missing split file": ("index_test_0.txt", lambda p: p.unlink(), FileNotFoundError,
                           ["index_test_0.txt"]),
    "garbled split count": ("n_splits.txt", lambda p: p.write_text("twenty\n"), ValueError,
                            ["n_splits.txt"]),
}


@pytest.mark.parametrize("case", sorted(DATA_FILE_CASES))
def test_damaged_uci_file_is_named(uci_copy: Path, case: str):
    file, damage, error, words = DATA_FILE_CASES[case]
    damage(uci_copy / file)
    with pytest.raises(error) as info:
        data.load("uci/yacht", split=0)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("split", [20, 10**6])
def test_split_beyond_the_standard_splits(uci_copy: Path, split: int):
    with pytest.raises(ValueError, match="split"):
        data.load("uci/yacht", split=split)


def test_failed_download_leaves_no_file_and_no_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("BNN_ZOO_DATA", raising=False)
    monkeypatch.setenv("BNN_ZOO_CACHE", str(tmp_path / "cache"))

    def refuse(url, timeout=None):
        assert timeout is not None and timeout > 0  # a download never waits forever
        raise OSError("network unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    with pytest.raises(OSError, match="n_splits.txt"):
        data.load("uci/yacht")
    assert not (tmp_path / "cache" / "yacht").exists()


@pytest.mark.parametrize("name, split, error, words", [
    ("no_such_set", 0, ValueError, ["no_such_set", "sine"]),
    ("uci/no_such_set", 0, ValueError, ["no_such_set", "yacht"]),
    (3, 0, TypeError, ["name"]),
    ("sine", -1, ValueError, ["split"]),
    ("sine", 1.5, ValueError, ["split"]),
    ("sine", True, ValueError, ["split"]),
])
def test_bad_load_arguments(name, split, error, words):
    with pytest.raises(error) as info:
        data.load(name, split=split)
    for word in words:
        assert word in str(info.value)


# === The API edge: fit, predict, evaluate, entries, checkpoints ==========================
# Every table maps a case name to (what to call, the error type, words the message must
# contain). The calls are small: two optimiser steps of a net of 4 hidden units.

def problem(n: int = 30, classes: int = 0):
    """Inputs (n, 2) and regression targets (n,) or labels 0..classes-1 (n,)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=gen)
    y = torch.sin(x[:, 0]) if not classes else (x[:, 0] > 0).long() + (classes > 2) * (
        x[:, 1] > 0).long()
    return x, y


def core_fit(x=None, y=None, *, task="regression", out=1, **options):
    """``bnn_zoo.fit`` of a small BNN with a mean-field guide (two steps by default)."""
    if x is None:
        x, y = problem(classes=2 if task == "classification" else 0)
    model = BayesianMLP(2, out, (4,), task=task)
    return bnn_zoo.fit(model, AutoNormal(model), x, y, **{"steps": 2, **options})


def expect(call, error, words):
    with pytest.raises(error) as info:
        call()
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    return info


X, Y = problem()
_, LABELS = problem(classes=2)

# --- silent broadcasting of the observed value ---------------------------------------------

OBSERVED_SHAPE_CASES = {
    "regression y (N, 1)": (lambda: core_fit(X, Y[:, None]), ["y", "(30,)", "(30, 1)"]),
    "regression y (N, 2)": (lambda: core_fit(X, Y[:, None].expand(30, 2)), ["y", "(30, 2)"]),
    "classification y (N, 1)": (
        lambda: core_fit(X, LABELS[:, None], task="classification", out=2), ["y", "(30, 1)"]),
    "y (N, 1) with vectorised particles": (
        lambda: core_fit(X, Y[:, None], num_particles=4), ["y", "(30, 1)"]),
    "y (N, 1) with minibatches": (lambda: core_fit(X, Y[:, None], batch_size=8),
                                  ["y", "(8,)", "(8, 1)"]),
    "y (N, 1) with jit": (lambda: core_fit(X, Y[:, None], jit=True), ["y", "(30, 1)"]),
    "y (N, 1) with the mean-field ELBO": (
        lambda: core_fit(X, Y[:, None], elbo=pyro.infer.TraceMeanField_ELBO), ["y", "(30, 1)"]),
    "y (N, 1) without validation": (lambda: core_fit(X, Y[:, None], validate=False),
                                    ["y", "(30, 1)"]),
    "labels beyond the classes": (
        lambda: core_fit(X, LABELS + 3, task="classification", out=2, validate=False),
        ["y", "support"]),
}


@pytest.mark.parametrize("case", sorted(OBSERVED_SHAPE_CASES))
def test_observed_value_of_another_shape_is_refused(case):
    call, words = OBSERVED_SHAPE_CASES[case]
    expect(call, ValueError, words)


# --- options of bnn_zoo.fit -------------------------------------------------------------------

FIT_OPTION_CASES = {
    "seed negative": ({"seed": -1}, ValueError, ["seed"]),
    "seed float": ({"seed": 1.5}, TypeError, ["seed"]),
    "seed bool": ({"seed": True}, TypeError, ["seed"]),
    "seed string": ({"seed": "0"}, TypeError, ["seed"]),
    "progress string": ({"progress": "yes"}, TypeError, ["progress"]),
    "progress int": ({"progress": 1}, TypeError, ["progress"]),
    "validate int": ({"validate": 1}, TypeError, ["validate"]),
    "jit int": ({"jit": 1}, TypeError, ["jit"]),
    "distributed string": ({"distributed": "no"}, TypeError, ["distributed"]),
    "lr NaN": ({"lr": math.nan}, ValueError, ["lr"]),
    "lr inf": ({"lr": math.inf}, ValueError, ["lr"]),
    "lr string": ({"lr": "0.1"}, TypeError, ["lr"]),
    "num_particles 0": ({"num_particles": 0}, ValueError, ["num_particles"]),
    "num_particles float": ({"num_particles": 2.0}, TypeError, ["num_particles"]),
    "batch_size float": ({"batch_size": 2.5}, TypeError, ["batch_size"]),
    "steps bool": ({"steps": True}, TypeError, ["steps"]),
    "steps negative": ({"steps": -3}, ValueError, ["steps"]),
    "checkpoint_every 0": ({"checkpoint_every": 0}, ValueError, ["checkpoint_every"]),
    "checkpoint not a path": ({"checkpoint": 3}, TypeError, ["checkpoint"]),
    "checkpoint in a missing folder": ({"checkpoint": "/no/such/folder/fit.pt"}, ValueError,
                                       ["checkpoint", "/no/such/folder"]),
    "max_plate_nesting 0": ({"max_plate_nesting": 0}, ValueError, ["max_plate_nesting"]),
    "elbo instance": ({"elbo": pyro.infer.Trace_ELBO()}, TypeError, ["elbo"]),
    "kl_weighting capitalised": ({"kl_weighting": "Graves"}, ValueError, ["kl_weighting"]),
}


@pytest.mark.parametrize("case", sorted(FIT_OPTION_CASES))
def test_bad_fit_option_is_named(case):
    options, error, words = FIT_OPTION_CASES[case]
    expect(lambda: core_fit(X, Y, **options), error, words)


def test_checkpoint_that_is_a_folder_is_refused(tmp_path):
    expect(lambda: core_fit(X, Y, checkpoint=tmp_path), ValueError, ["checkpoint", "folder"])
    assert list(tmp_path.iterdir()) == []


def test_model_or_guide_that_is_not_callable():
    model = BayesianMLP(2, 1, (4,))
    expect(lambda: bnn_zoo.fit(model, None, X, Y, steps=2), TypeError, ["guide", "None"])
    expect(lambda: bnn_zoo.fit("mlp", AutoNormal(model), X, Y, steps=2), TypeError,
           ["model", "'mlp'"])


# --- data at the edge ---------------------------------------------------------------------

META = torch.device("meta")  # a second device on any machine (no values: shapes only)

DATA_CASES = {
    "x a list": (X.tolist(), Y, TypeError, ["x", "list"]),
    "x of strings": (np.array([["a", "b"]] * 30), Y, TypeError, ["x", "numpy"]),
    "x integer": (X.long(), Y, TypeError, ["x", "floating"]),
    "x one-dimensional": (X[:, 0], Y, ValueError, ["x", "dimensions"]),
    "x three-dimensional": (X[None], Y, ValueError, ["x", "dimensions"]),
    "x empty": (X[:0], Y[:0], ValueError, ["x", "non-empty"]),
    "y shorter than x": (X, Y[:5], ValueError, ["y", "30", "5"]),
    "y NaN": (X, torch.where(Y > 0, math.nan, Y), ValueError, ["y", "finite"]),
    "x inf": (X.clone().index_fill_(0, torch.tensor([3]), math.inf), Y, ValueError,
              ["x", "finite"]),
    "y on another device": (X, Y.to(META), ValueError, ["device", "meta"]),
    "x on the meta device": (X.to(META), Y, ValueError, ["x", "'meta'", "holds data"]),
    "x and y on the meta device": (X.to(META), Y.to(META), ValueError,
                                   ["x", "'meta'", "holds data"]),
}


#: ``bnn_zoo.fit`` takes inputs of any shape (N, ...) (a user's network may take images), so
#: a wrong rank is refused by the model, or by the lengths of x and y, not by the runner.
ANY_SHAPE_CASES = {
    "x one-dimensional": (X[:, 0], Y, ValueError, ["x", "(N, 2)", "(30,)"]),
    "x three-dimensional": (X[None], Y, ValueError, ["y", "row of x", "(1)"]),
}


@pytest.mark.parametrize("case", sorted(DATA_CASES))
@pytest.mark.parametrize("api", ["bnn_zoo.fit", "entry.fit"])
def test_bad_data_is_named(api, case):
    x, y, error, words = (ANY_SHAPE_CASES if api == "bnn_zoo.fit" and case in ANY_SHAPE_CASES
                          else DATA_CASES)[case]
    call = (lambda: core_fit(x, y)) if api == "bnn_zoo.fit" else (
        lambda: zoo.get("map").fit(x, y, steps=2))
    expect(call, error, words)


def test_model_on_another_device_than_the_data():
    model = BayesianMLP(2, 1, (4,)).to(META)
    expect(lambda: bnn_zoo.fit(model, AutoNormal(model), X, Y, steps=2), ValueError,
           ["model", "device"])


# --- a user's network whose output does not fit the task ----------------------------------

class _Pair(torch.nn.Module):
    """A network that returns two tensors instead of one."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.layer(x), self.layer(x)


_, LABELS3 = problem(classes=3)
NET_OUTPUT_CASES = {
    # case: (targets, the network's factory, words the message must contain)
    "3 outputs for regression": (Y, lambda: torch.nn.Linear(2, 3),
                                 ["net", "(2, 2)", "(n, 1) for regression", "(2, 3)"]),
    "1 output for 3 classes": (LABELS3, lambda: torch.nn.Linear(2, 1),
                               ["net", "K >= 3", "(2, 1)"]),
    "2 outputs for 3 classes": (LABELS3, lambda: torch.nn.Linear(2, 2),
                                ["net", "K >= 3", "(2, 2)"]),
    "outputs (N,)": (Y, lambda: torch.nn.Sequential(torch.nn.Linear(2, 1),
                                                    torch.nn.Flatten(0)),
                     ["net", "(n, 1)", "(2,)"]),
    "outputs (N, 1, 1)": (Y, lambda: torch.nn.Sequential(torch.nn.Linear(2, 1),
                                                         torch.nn.Unflatten(1, (1, 1))),
                          ["net", "(n, 1)", "(2, 1, 1)"]),
    "outputs a tuple": (Y, _Pair, ["net", "(n, 1)", "tuple"]),
    "net that does not take x's shape": (Y, lambda: torch.nn.Linear(5, 1),
                                         ["net", "inputs shaped as x (N, 2)"]),
}


@pytest.mark.parametrize("case", sorted(NET_OUTPUT_CASES))
@pytest.mark.parametrize("name", ["map", "laplace"])
def test_network_output_that_does_not_fit_the_task_is_refused_before_training(
        name, case, monkeypatch):
    y, net, words = NET_OUTPUT_CASES[case]
    monkeypatch.setattr(bnn_zoo.methods._base, "fit", lambda *a, **k: pytest.fail("a fit ran"))
    expect(lambda: zoo.get(name).fit(X, y, net=net, steps=2), ValueError, words)


def test_network_with_more_outputs_than_the_labels_classes_gives_them_all():
    """A network knows classes the training labels may lack: its outputs set the classes."""
    fitted = zoo.get("map").fit(X, LABELS, net=lambda: torch.nn.Linear(2, 3), steps=2, jit=False)
    assert fitted.out_dim == 3 and fitted.predict(X, num_samples=2).probs.shape == (2, 30, 3)


# --- Budget fields ------------------------------------------------------------------------

BUDGET_CASES = {
    "steps 0": ({"steps": 0}, ValueError),
    "steps float": ({"steps": 1.5}, TypeError),
    "lr 0": ({"lr": 0.0}, ValueError),
    "lr NaN": ({"lr": math.nan}, ValueError),
    "batch_size 0": ({"batch_size": 0}, ValueError),
    "batch_size string": ({"batch_size": "256"}, TypeError),
    "num_particles 0": ({"num_particles": 0}, ValueError),
    "kl_weighting unknown": ({"kl_weighting": "blundell"}, ValueError),
    "jit 1": ({"jit": 1}, TypeError),
    "jit string": ({"jit": "True"}, TypeError),
    "distributed 0": ({"distributed": 0}, TypeError),
}
#: The held-out share is the entry's, not a budget field: checked by entry.fit alone.
VALIDATION_CASES = {"1": (1.0, ValueError), "negative": (-0.1, ValueError),
                    "string": ("0.1", TypeError), "bool": (True, TypeError)}


@pytest.mark.parametrize("case", sorted(BUDGET_CASES))
def test_bad_budget_field_is_named(case):
    options, error = BUDGET_CASES[case]
    (field,) = options
    expect(lambda: Budget(**options), error, [field])
    # the same through the budget overrides of entry.fit, before any work
    expect(lambda: zoo.get("map").fit(X, Y, **options), error, [field])


@pytest.mark.parametrize("case", sorted(VALIDATION_CASES))
def test_bad_validation_is_named(case):
    value, error = VALIDATION_CASES[case]
    expect(lambda: zoo.get("map").fit(X, Y, validation=value), error, ["validation"])


# --- entry.fit ------------------------------------------------------------------------------

ENTRY_CASES = {
    "seed negative": (lambda e: e.fit(X, Y, steps=2, seed=-1), ValueError, ["seed"]),
    "seed float": (lambda e: e.fit(X, Y, steps=2, seed=1.0), TypeError, ["seed"]),
    "seed bool": (lambda e: e.fit(X, Y, steps=2, seed=True), TypeError, ["seed"]),
    "task unknown": (lambda e: e.fit(X, Y, steps=2, task="ranking"), ValueError,
                     ["task", "ranking", "regression"]),
    "progress string": (lambda e: e.fit(X, Y, steps=2, progress="no"), TypeError,
                        ["progress"]),
    "budget option misspelt": (lambda e: e.fit(X, Y, stepz=2), ValueError,
                               ["budget option", "stepz", "steps"]),
    "model option as a budget option": (lambda e: e.fit(X, Y, steps=2, hidden=(3,)),
                                        ValueError, ["budget option", "hidden"]),
    "unknown guide option": (lambda e: e.fit(X, Y, steps=2, guide_options={"rank": 2}),
                             ValueError, ["guide_options", "rank"]),
    "unknown method option": (lambda e: e.fit(X, Y, steps=2, method_options={"members": 3}),
                              ValueError, ["method_options", "members"]),
    "model_options not a mapping": (lambda e: e.fit(X, Y, steps=2, model_options=[1]),
                                    TypeError, ["model_options"]),
    "guide_options a string": (lambda e: e.fit(X, Y, steps=2, guide_options="rank=2"),
                               TypeError, ["guide_options"]),
    "regression y (N, 1)": (lambda e: e.fit(X, Y[:, None], steps=2), ValueError,
                            ["y", "(30, 1)"]),
    "labels (N, 1)": (lambda e: e.fit(X, LABELS[:, None], steps=2), ValueError,
                      ["y", "(30, 1)"]),
    "negative labels": (lambda e: e.fit(X, LABELS - 1, steps=2), ValueError, ["y", "-1"]),
    "fractional labels": (lambda e: e.fit(X, Y, task="classification", steps=2), TypeError,
                          ["y", "fractional"]),
    "boolean labels": (lambda e: e.fit(X, LABELS.bool(), steps=2), TypeError,
                       ["y", "bool"]),
}


@pytest.mark.parametrize("case", sorted(ENTRY_CASES))
def test_bad_entry_fit_is_named(case):
    call, error, words = ENTRY_CASES[case]
    expect(lambda: call(zoo.get("map")), error, words)


@pytest.mark.parametrize("name, call, error, words", [
    ("nngp", lambda e: e.fit(X, LABELS, steps=2), UnsupportedProblem,
     ["nngp", "classification"]),
    ("laplace", lambda e: e.fit(X, Y, steps=2, validation=0.2), ValueError,
     ["laplace", "validation"]),
])
def test_entry_that_cannot_do_what_is_asked(name, call, error, words):
    expect(lambda: call(zoo.get(name)), error, words)


# --- predict and evaluate of a fit --------------------------------------------------------

@pytest.fixture(scope="module")
def fitted():
    """A regression and a classification fit of the ``map`` entry (float32)."""
    pyro.set_rng_seed(0)
    entry = zoo.get("map")
    return {"regression": entry.fit(X, Y, steps=2, model_options={"hidden": (4,)}),
            "classification": entry.fit(X, LABELS, steps=2, model_options={"hidden": (4,)})}


PREDICT_CASES = {
    "x with other columns": ("regression", lambda f: f.predict(X[:, :1]), ValueError,
                             ["x", "2 columns"]),
    "x one-dimensional": ("regression", lambda f: f.predict(X[:, 0]), ValueError, ["x"]),
    "num_samples 0": ("regression", lambda f: f.predict(X, num_samples=0), ValueError,
                      ["num_samples"]),
    "num_samples float": ("regression", lambda f: f.predict(X, num_samples=1.5), TypeError,
                          ["num_samples"]),
    "x NaN": ("regression", lambda f: f.predict(X * math.nan), ValueError, ["x", "finite"]),
    "x empty": ("regression", lambda f: f.predict(X[:0]), ValueError, ["x", "non-empty"]),
    "x on another device": ("regression", lambda f: f.predict(X.to(META)), ValueError,
                            ["x", "device"]),
    "evaluate x and y on the meta device": ("regression",
                                            lambda f: f.evaluate(X.to(META), Y.to(META)),
                                            ValueError, ["x", "'meta'", "holds data"]),
    "evaluate y on the meta device": ("classification",
                                      lambda f: f.evaluate(X, LABELS.to(META)), ValueError,
                                      ["y", "'meta'", "holds data"]),
    "bnn_zoo.predict x on the meta device": (
        "regression", lambda f: bnn_zoo.predict(f.model, f.guide, X.to(META)), ValueError,
        ["x", "'meta'", "holds data"]),
    "bnn_zoo.evaluate y on the meta device": (
        "regression", lambda f: bnn_zoo.evaluate(f.model, f.guide, X, Y.to(META)),
        ValueError, ["y", "'meta'", "holds data"]),
    "evaluate y (N, 1)": ("regression", lambda f: f.evaluate(X, Y[:, None]), ValueError,
                          ["y", "(30,)", "(30, 1)"]),
    "evaluate y shorter": ("regression", lambda f: f.evaluate(X, Y[:5]), ValueError,
                           ["y", "30"]),
    "evaluate boolean targets": ("regression", lambda f: f.evaluate(X, Y > 0), TypeError,
                                 ["y", "bool"]),
    "evaluate fractional labels": ("classification",
                                   lambda f: f.evaluate(X, LABELS.float() + 0.5), TypeError,
                                   ["y", "fractional"]),
    "evaluate a label beyond the classes": ("classification",
                                            lambda f: f.evaluate(X, LABELS + 1), ValueError,
                                            ["y", "2 classes", "0..1"]),
    "evaluate a negative label": ("classification", lambda f: f.evaluate(X, LABELS - 1),
                                  ValueError, ["y", "2 classes"]),
    "evaluate labels (N, 1)": ("classification", lambda f: f.evaluate(X, LABELS[:, None]),
                               ValueError, ["y", "(30, 1)"]),
    "evaluate boolean labels": ("classification", lambda f: f.evaluate(X, LABELS.bool()),
                                TypeError, ["y", "bool"]),
    "bnn_zoo.evaluate y (N, 1)": ("regression",
                                  lambda f: bnn_zoo.evaluate(f.model, f.guide, X, Y[:, None]),
                                  ValueError, ["y", "(30, 1)"]),
    "bnn_zoo.evaluate a label beyond the classes": (
        "classification", lambda f: bnn_zoo.evaluate(f.model, f.guide, X, LABELS + 1),
        ValueError, ["y", "2 classes"]),
    "bnn_zoo.predict num_samples bool": (
        "regression", lambda f: bnn_zoo.predict(f.model, f.guide, X, num_samples=True),
        TypeError, ["num_samples"]),
    "metrics of something else": ("regression", lambda f: bnn_zoo.metrics("pred", Y),
                                  TypeError, ["pred"]),
}


@pytest.mark.parametrize("case", sorted(PREDICT_CASES))
def test_bad_predict_or_evaluate_is_named(fitted, case):
    task, call, error, words = PREDICT_CASES[case]
    expect(lambda: call(fitted[task]), error, words)


# --- what users pass that must work (cast where the meaning is unambiguous) ----------------

def test_numpy_everywhere_and_float64_inputs_of_a_float32_fit(fitted):
    reg, clf = fitted["regression"], fitted["classification"]
    pyro.set_rng_seed(1)
    expected = reg.predict(X, num_samples=5).mean
    pyro.set_rng_seed(1)
    got = reg.predict(X.double().numpy(), num_samples=5).mean  # cast to the fit's float32
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected)
    assert set(reg.evaluate(X.numpy(), Y.numpy(), num_samples=5)) >= {"rmse", "ll"}
    probs = bnn_zoo.predict(clf.model, clf.guide, X.double().numpy(), num_samples=5).mean
    assert probs.shape == (30, 2) and probs.dtype == torch.float32
    # integral float labels (as numpy users hold them) are cast, not refused: the same
    # metrics as the integer labels under the same draws
    pyro.set_rng_seed(2)
    cast = clf.evaluate(X, LABELS.double().numpy(), num_samples=5)
    pyro.set_rng_seed(2)
    integer = clf.evaluate(X, LABELS, num_samples=5)
    assert cast == integer
    assert math.isfinite(core_fit(X.numpy(), Y.numpy()).losses[-1])


def test_inputs_that_require_gradients_and_numpy_integer_seeds():
    x = X.clone().requires_grad_()
    result = core_fit(x, Y.clone().requires_grad_(), steps=3, seed=np.int64(2))
    assert result.steps == 3 and all(math.isfinite(v) for v in result.losses)
    fitted = zoo.get("map").fit(x, Y, steps=2, seed=np.int64(2),
                                model_options={"hidden": (4,)})
    assert fitted.predict(x, num_samples=2).mean.shape == (30,)


# --- metrics never NaN or inf silently ----------------------------------------------------

NON_FINITE_METRIC_CASES = {
    "regression: a target of zero density": (
        lambda: metrics(GaussianMixturePredictive(torch.zeros(2, 3), torch.full((2, 3), 1e-30)),
                        torch.ones(3)), "ll"),
    "classification: a label of probability zero": (
        lambda: metrics(CategoricalPredictive(torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])),
                        torch.tensor([1, 0])), "nll"),
}


@pytest.mark.parametrize("case", sorted(NON_FINITE_METRIC_CASES))
def test_non_finite_metric_warns_naming_it(case):
    call, name = NON_FINITE_METRIC_CASES[case]
    with pytest.warns(NonFiniteMetricWarning, match=name):
        out = call()
    assert not math.isfinite(out[name])


# --- checkpoints --------------------------------------------------------------------------

def folder_state(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def checkpoint_fit(path, *, hidden=(4,), n=30, steps=4, **options):
    model = BayesianMLP(2, 1, hidden)
    x, y = problem(n)
    return bnn_zoo.fit(model, AutoNormal(model), x, y, **{"steps": steps, "lr": 0.01,
                                                         "checkpoint": path, "seed": 0,
                                                         **options})


class _Marker:
    """Unpickling this object would create the marker file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _write_pickled_object(path: Path) -> None:
    torch.save({"format": "bnn_zoo.checkpoint/1", "step": _Marker(str(path) + ".ran")}, path)


CORRUPT_CHECKPOINT_CASES = {
    "a pickled object": (_write_pickled_object, ["fit.pt", "plain data"]),
    "truncated": (lambda p: (checkpoint_fit(p), p.write_bytes(p.read_bytes()[:300])),
                  ["fit.pt", "truncated"]),
    "garbage bytes": (lambda p: p.write_bytes(b"\x80\x02not a checkpoint"), ["fit.pt"]),
    "empty": (lambda p: p.write_bytes(b""), ["fit.pt"]),
    "a tensor file of another kind": (lambda p: torch.save({"weights": torch.zeros(3)}, p),
                                      ["fit.pt", "not a checkpoint"]),
    "incomplete": (lambda p: torch.save({"format": "bnn_zoo.checkpoint/1", "step": 2}, p),
                   ["fit.pt", "incomplete", "optimizer"]),
}


@pytest.mark.parametrize("case", sorted(CORRUPT_CHECKPOINT_CASES))
def test_unreadable_checkpoint_is_named_and_kept(tmp_path, case):
    path = tmp_path / "fit.pt"
    write, words = CORRUPT_CHECKPOINT_CASES[case]
    write(path)
    before = folder_state(tmp_path)
    expect(lambda: checkpoint_fit(path, steps=8), ValueError, words)
    assert folder_state(tmp_path) == before  # nothing lost, nothing half-written, nothing run
    assert not (tmp_path / "fit.pt.ran").exists()


MISMATCHED_CHECKPOINT_CASES = {
    "another model shape": ({"hidden": (6,)}, ["fit.pt", "shape"]),
    "another data size": ({"n": 20}, ["fit.pt", "data size N", "30", "20"]),
    "another batch size": ({"batch_size": 10}, ["fit.pt", "batch size", "10"]),
    "another ELBO": ({"elbo": pyro.infer.TraceMeanField_ELBO}, ["fit.pt", "ELBO",
                                                                 "TraceMeanField_ELBO"]),
    "another KL weighting": ({"batch_size": 15, "kl_weighting": "graves"},
                             ["fit.pt", "KL weighting"]),
    "fewer steps than done": ({"steps": 2}, ["fit.pt", "steps", "4"]),
}


@pytest.mark.parametrize("case", sorted(MISMATCHED_CHECKPOINT_CASES))
def test_checkpoint_of_another_run_is_named_and_kept(tmp_path, case):
    path = tmp_path / "fit.pt"
    checkpoint_fit(path, batch_size=15)
    before = folder_state(tmp_path)
    options, words = MISMATCHED_CHECKPOINT_CASES[case]
    expect(lambda: checkpoint_fit(path, **{"batch_size": 15, **options}), ValueError, words)
    assert folder_state(tmp_path) == before


def test_checkpoint_and_saved_fit_are_not_confused(fitted, tmp_path):
    checkpoint, saved = tmp_path / "fit.pt", tmp_path / "saved.pt"
    checkpoint_fit(checkpoint)
    fitted["regression"].save(saved)
    before = folder_state(tmp_path)
    expect(lambda: zoo.load(checkpoint), ValueError, ["fit.pt", "not a fitted zoo entry"])
    expect(lambda: checkpoint_fit(saved), ValueError, ["saved.pt", "not a checkpoint"])
    assert folder_state(tmp_path) == before


def test_resume_with_another_lr_applies_it_with_a_warning(tmp_path):
    path = tmp_path / "fit.pt"
    checkpoint_fit(path)
    with pytest.warns(CheckpointWarning, match="lr=0.01"):
        result = checkpoint_fit(path, steps=6, lr=0.002)
    assert result.steps == 2
    state = torch.load(path, weights_only=True)
    assert state["run"]["lr"] == 0.002
    assert all(group["lr"] == 0.002 for group in state["optimizer"]["param_groups"])


def test_failed_checkpoint_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path,
                                                                            monkeypatch):
    path = tmp_path / "fit.pt"
    checkpoint_fit(path)
    before = folder_state(tmp_path)
    names: list[str] = []
    real_save, real_mkstemp = torch.save, tempfile.mkstemp

    def failing_save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)  # the whole file is written, then the disk fails
        raise OSError("disk full")

    def recording_mkstemp(*args, **kwargs):
        handle, name = real_mkstemp(*args, **kwargs)
        names.append(name)
        return handle, name

    monkeypatch.setattr(torch, "save", failing_save)
    monkeypatch.setattr(tempfile, "mkstemp", recording_mkstemp)
    expect(lambda: checkpoint_fit(path, steps=8, checkpoint_every=2), OSError, ["disk full"])
    assert folder_state(tmp_path) == before
    assert names and all(Path(name).parent == tmp_path and Path(name).name != "fit.pt.tmp"
                         for name in names)  # a unique temporary beside the checkpoint


def test_failed_save_of_a_fit_keeps_the_old_file(fitted, tmp_path, monkeypatch):
    path = tmp_path / "fit.pt"
    fitted["regression"].save(path)
    before = folder_state(tmp_path)
    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(OSError("full")))
    expect(lambda: fitted["regression"].save(path), OSError, ["full"])
    assert folder_state(tmp_path) == before
    expect(lambda: fitted["regression"].save(tmp_path / "missing" / "fit.pt"),
           FileNotFoundError, ["missing"])
