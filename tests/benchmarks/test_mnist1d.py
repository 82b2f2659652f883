"""MNIST-1D (Greydanus 2020) as a data set, its 1-D CNN and ``compare --data mnist1d --net
cnn``. The data need the optional ``mnist1d`` package (``pip install
bnn-zoo[mnist1d]``); without it these tests skip, except the one checking the error."""

from __future__ import annotations

import json
import math
import os
import random
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bnn_zoo import data, zoo
from bnn_zoo._core import data as data_module
from bnn_zoo._harness import cli
from bnn_zoo.zoo._networks import mnist1d_cnn

CLASSIFICATION_BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "classification.py"
NEEDS_PACKAGE = "the mnist1d data set needs the optional mnist1d package (bnn-zoo[mnist1d])"


def _require_package() -> None:
    pytest.importorskip("mnist1d", reason=NEEDS_PACKAGE)


def test_load_gives_the_standard_sizes_dtypes_and_labels():
    _require_package()
    d = data.load("mnist1d", 0)
    assert (d.name, d.task, d.num_classes, d.out_dim, d.in_dim) == (
        "mnist1d", "classification", 10, 10, 40)
    assert d.x_train.shape == (4000, 40) and d.x_test.shape == (1000, 40)
    assert d.x_train.dtype == d.x_test.dtype == torch.float32
    assert d.y_train.dtype == d.y_test.dtype == torch.int64
    # The package draws 500 signals per digit; the split is stratified, 400 / 100 each.
    assert torch.bincount(d.y_train, minlength=10).tolist() == [400] * 10
    assert torch.bincount(d.y_test, minlength=10).tolist() == [100] * 10
    # The package standardises the whole set to mean 0, standard deviation 1.
    x = torch.cat([d.x_train, d.x_test]).double()
    assert abs(x.mean().item()) < 1e-6 and abs(x.std().item() - 1) < 1e-3
    assert data.load("mnist1d", 0, dtype=torch.float64).x_train.dtype == torch.float64


def test_splits_are_seeded_reshuffles_of_the_same_signals():
    _require_package()
    first, again, other = (data.load("mnist1d", k) for k in (0, 0, 1))
    assert torch.equal(first.x_train, again.x_train) and torch.equal(first.y_test, again.y_test)
    assert not torch.equal(first.x_train, other.x_train)

    def rows(d: data.Dataset) -> set[tuple[float, ...]]:
        return {tuple(r) for r in torch.cat([d.x_train, d.x_test]).tolist()}

    assert rows(first) == rows(other) and len(rows(first)) == 5000


def test_loading_changes_no_global_random_state():
    """``make_dataset`` reseeds Python's and numpy's global generators (with 42): the loader
    restores both, and draws from them continue as if it had not run."""
    _require_package()
    data_module._mnist1d_arrays.cache_clear()  # generate anew, not from this process's cache
    random.seed(7)
    np.random.seed(7)  # noqa: NPY002 (the legacy global generator is what is tested)
    python_state, numpy_state = random.getstate(), np.random.get_state()  # noqa: NPY002
    data.load("mnist1d", 0)
    assert random.getstate() == python_state
    after = np.random.get_state()  # noqa: NPY002
    assert after[0] == numpy_state[0] and np.array_equal(after[1], numpy_state[1])
    assert after[2:] == numpy_state[2:]


def test_loading_selects_no_matplotlib_backend():
    """The package imports ``matplotlib.pyplot`` when the loader first needs it: in a fresh
    process, that resolves no backend and changes no rcParams."""
    _require_package()
    script = """
import matplotlib, sys
def rc():
    return {k: matplotlib.rcParams._get(k) for k in matplotlib.rcParams}
before = rc()
from bnn_zoo import data
assert "mnist1d" not in sys.modules  # imported on first use only
data.load("mnist1d", 0)
assert "matplotlib.pyplot" in sys.modules
print(sorted(k for k, v in rc().items() if before[k] != v))
"""
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_the_package_the_error_names_the_extra(monkeypatch):
    data_module._mnist1d_arrays.cache_clear()
    monkeypatch.setitem(sys.modules, "mnist1d", None)  # makes `import mnist1d...` fail
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)
    with pytest.raises(ImportError, match=r"pip install bnn-zoo\[mnist1d\]"):
        data.load("mnist1d", 0)
    assert "mnist1d" in data.names()


def test_mnist1d_cnn_maps_signals_to_logits():
    net = mnist1d_cnn()
    assert net(torch.randn(3, 40)).shape == (3, 10)
    assert mnist1d_cnn(channels=4, classes=3)(torch.randn(2, 40)).shape == (2, 3)
    # Two convolutions of 16 channels (5 and 3 taps) and a Linear(16 * 8, 10).
    assert sum(p.numel() for p in net.parameters()) == (16 * 5 + 16) + (16 * 16 * 3 + 16) + (
        16 * 8 * 10 + 10)
    assert zoo.NETWORK_CHOICES["cnn"]["mnist1d"] is zoo.NETWORKS["mnist1d_cnn"]
    assert zoo.NETWORK_CHOICES["cnn"]["digits"] is zoo.NETWORKS["cnn"]


def test_bbb_fits_the_cnn_on_mnist1d():
    _require_package()
    d = data.load("mnist1d", 0)
    x, y = d.x_train[:256], d.y_train[:256]
    fitted = zoo.get("bbb").fit(x, y, net=mnist1d_cnn, steps=5, batch_size=64, seed=0)
    prediction = fitted.predict(d.x_test[:20], num_samples=4)
    assert prediction.mean.shape == (20, 10)
    assert torch.allclose(prediction.mean.sum(-1), torch.ones(20), atol=1e-5)
    metrics = fitted.evaluate(d.x_test[:50], d.y_test[:50], num_samples=4)
    assert math.isfinite(metrics["nll"]) and 0 <= metrics["accuracy"] <= 1


def test_compare_with_the_cnn_on_mnist1d_writes_its_tables(tmp_path):
    _require_package()
    code = cli.main(["compare", "--data", "mnist1d", "--net", "cnn", "--entries", "map", "bbb",
                     "--steps", "5", "--num-samples", "2", "--out", str(tmp_path)])
    assert code == 0
    table = (tmp_path / "compare.md").read_text()
    assert "network `cnn` (`mnist1d_cnn` on mnist1d)" in table
    assert (tmp_path / "compare.csv").is_file()
    rows = json.loads((tmp_path / "compare.json").read_text())["summary"]
    assert {(r["entry"], r["data"]) for r in rows} == {("map", "mnist1d"), ("bbb", "mnist1d")}


def test_the_classification_benchmark_takes_mnist1d_but_not_by_default(tmp_path):
    script = runpy.run_path(str(CLASSIFICATION_BENCHMARK), run_name="bench")
    assert "mnist1d" not in script["DATASETS"]  # the default needs no optional package
    _require_package()
    rows = script["main"](["--data", "mnist1d", "--entries", "map", "--steps", "3",
                           "--num-samples", "2", "--out", str(tmp_path)])
    assert [(r["data"], r["entry"], r["runs"]) for r in rows] == [("mnist1d", "map", 1)]
    assert "| mnist1d | map |" in (tmp_path / "classification.md").read_text()
