"""``entry.fit(loader)``: the same fit as from the tensors in float64 (MAP and Laplace,
full batch), the Laplace posterior's refit, curvature, evidence and predictive summed over
a loader's batches equal to the tensors', predictions and metrics of a loader equal to the
tensors', bad loaders and entries that need all the data refused by name, and a fit on a
memory-mapped array larger than the process's memory limit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from bnn_zoo import zoo
from bnn_zoo._core.batches import as_batches
from bnn_zoo.methods.laplace._evidence import EvidenceSettings
from bnn_zoo.methods.laplace._layouts import layout_of
from bnn_zoo.methods.laplace._problem import CurvatureSettings, laplace_posterior, refine_map
from bnn_zoo.models import BayesianMLP
from bnn_zoo.models._likelihood import Gaussian

N = 40
FAST = dict(steps=15, jit=False)


def problem(task: str = "regression") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    x = 3 + 2 * torch.randn(N, 3, generator=g, dtype=torch.float64)
    if task == "classification":
        return x, (x[:, 0] > 3).long() + (x[:, 1] > 3).long()
    return x, 5 + x.sum(1).sin() + 0.1 * torch.randn(N, generator=g, dtype=torch.float64)


def full_batch(x, y) -> DataLoader:
    return DataLoader(TensorDataset(x, y), batch_size=N)


@pytest.mark.parametrize("name, task, method_options", [
    ("map", "regression", {}),
    ("laplace_kron", "classification", {"refine": False, "holdout": 0.0}),
    ("laplace", "regression", {"evidence": None, "refine": False}),
])
def test_a_full_batch_loader_fits_as_the_tensors(name, task, method_options):
    """Same scalers, same MAP, same curvature and predictive (Laplace: kron without refits
    for a classifier, none of its points held out (a loader's never are); the GGN with the
    L-BFGS refit for a regression)."""
    x, y = problem(task)
    entry = zoo.get(name)
    options = dict(FAST, method_options=method_options)
    a = entry.fit(x, y, batch_size=None, **options)
    b = entry.fit(full_batch(x, y), **options)
    torch.testing.assert_close(b.x_scaler.mean, a.x_scaler.mean, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(b.x_scaler.std, a.x_scaler.std, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(b.result.losses, a.result.losses, rtol=1e-10, atol=0)
    pa, pb = a.predict(x, num_samples=2), b.predict(x, num_samples=2)
    torch.testing.assert_close(pb.mean, pa.mean, rtol=1e-9, atol=1e-12)
    if name != "map":
        torch.testing.assert_close(pb.variance if task == "regression" else pb.probs,
                                   pa.variance if task == "regression" else pa.probs,
                                   rtol=1e-9, atol=1e-12)
        assert b.diagnostics["log_evidence"] == pytest.approx(a.diagnostics["log_evidence"],
                                                             rel=1e-10)


def test_a_loader_of_several_outputs_fits_as_the_tensors():
    """Targets (N, 2): the loader's fit has two outputs, each standardised with its own
    statistics, and fits as the tensors' fit."""
    x, y = problem()
    y = torch.stack([y, 2 * y.cos()], dim=1)
    a = zoo.get("map").fit(x, y, batch_size=None, **FAST)
    b = zoo.get("map").fit(full_batch(x, y), **FAST)
    assert a.out_dim == b.out_dim == 2
    torch.testing.assert_close(b.y_scaler.std, a.y_scaler.std, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(b.predict(x, num_samples=2).mean,
                               a.predict(x, num_samples=2).mean, rtol=1e-9, atol=1e-12)


def test_laplace_refuses_a_loader_of_several_outputs():
    """Laplace on (N, D) targets holds a curvature per output over tensors in memory."""
    x, y = problem()
    y = torch.stack([y, 2 * y.cos()], dim=1)
    with pytest.raises(ValueError, match="one curvature per output"):
        zoo.get("laplace").fit(full_batch(x, y), **FAST)


@pytest.mark.parametrize("curvature", ["ggn", "hessian", "diag", "kron", "kron_separate",
                                       "last_layer", "low_rank"])
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_the_laplace_posterior_sums_a_loaders_batches_as_the_tensors(curvature, task):
    """At one MAP, with the evidence tuned by the fixed point: the curvature, energy,
    evidence and GLM predictive from batches of 7 (a short last one) equal the tensors'
    in float64."""
    x, y = problem(task)
    model = BayesianMLP(3, 1 if task == "regression" else 3, hidden=(6,),
                        task=task).double()
    theta = 0.3 * torch.randn(layout_of(model).num_parameters, dtype=torch.float64,
                              generator=torch.Generator().manual_seed(0))
    settings = dict(curvature=CurvatureSettings(curvature, rank=5, indefinite="clip"),
                    evidence=EvidenceSettings("fixed_point", iterations=2, refine=False))
    a = laplace_posterior(model, theta, x, y, **settings)
    b = laplace_posterior(model, theta, as_batches(DataLoader(TensorDataset(x, y),
                                                              batch_size=7)), None, **settings)
    assert float(b.log_evidence()) == pytest.approx(float(a.log_evidence()), rel=1e-12)
    torch.testing.assert_close(b.alpha_vector(), a.alpha_vector(), rtol=1e-10, atol=0)
    torch.testing.assert_close(b.beta, a.beta, rtol=1e-10, atol=0)
    pa, pb = a.glm_predictive(x, "probit", 2), b.glm_predictive(x, "probit", 2)
    for got, expected in ((pb.mean, pa.mean), (pb.stddev if task == "regression" else pb.probs,
                                               pa.stddev if task == "regression" else pa.probs)):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_the_map_refit_sums_the_objective_over_a_loaders_batches():
    """Three L-BFGS iterations of the refit from the same start: the same iterates from
    batches of 7 as from the tensors (the sums differ in their order only)."""
    x, y = problem()
    model = BayesianMLP(3, 1, hidden=(6,)).double()
    layout = layout_of(model)
    theta = 0.3 * torch.randn(layout.num_parameters, generator=torch.Generator().manual_seed(0),
                              dtype=torch.float64)
    alpha, beta = torch.ones_like(theta), torch.tensor(4.0, dtype=torch.float64)
    batches = as_batches(DataLoader(TensorDataset(x, y), batch_size=7))
    a, b = (refine_map(theta, *data, layout, Gaussian(), alpha, beta, max_iter=3)
            for data in ((x, y), (batches, None)))
    assert (a - theta).abs().max() > 1e-3
    torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["map", "laplace_diag"])
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_predict_and_evaluate_of_a_loader_equal_the_tensors(name, task):
    x, y = problem(task)
    fitted = zoo.get(name).fit(x, y, batch_size=None, **FAST)
    loader = DataLoader(TensorDataset(x, y), batch_size=9)
    torch.testing.assert_close(fitted.predict(loader, num_samples=2).mean,
                               fitted.predict(x, num_samples=2).mean, rtol=1e-12, atol=1e-12)
    expected, got = fitted.evaluate(x, y, num_samples=2), fitted.evaluate(loader, num_samples=2)
    assert got.keys() == expected.keys()
    for key in expected:  # (the metrics count fractions in float32)
        assert got[key] == pytest.approx(expected[key], rel=1e-10, abs=1e-7), key


def test_a_minibatch_loader_fits_every_streaming_entry_on_a_users_network():
    """bbb, an ensemble and laplace_kron on images through a user's CNN, from a
    shuffled loader with a short last batch; each predicts on the loader too."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 1, 4, 4, generator=g)
    y = (x.mean((1, 2, 3)) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)

    def net() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(),
                                   torch.nn.Linear(8, 2))

    for name in ("bbb", "ensemble", "laplace_kron"):
        fitted = zoo.get(name).fit(loader, net=net, steps=6, jit=False,
                                   method_options={"members": 2} if name ==
                                   "ensemble" else {})
        assert fitted.in_shape == (1, 4, 4)
        assert fitted.predict(loader, num_samples=2).mean.shape == (30, 2)


@pytest.mark.parametrize("name", ["nuts", "nngp"])
def test_an_entry_that_needs_all_the_data_refuses_a_loader_by_name(name):
    x, y = problem()
    with pytest.raises(zoo.UnsupportedProblem, match=rf"Entry '{name}'.*needs all the "
                                                      "training data"):
        zoo.get(name).fit(full_batch(x, y))


@pytest.mark.parametrize("options, match", [
    ({"num_data": N + 1}, "num_data"),
    ({"validation": 0.2}, "validation=0.0"),
    ({"batch_size": 8}, "batch_size"),
    ({"y": torch.zeros(N)}, "y=None"),
])
def test_bad_loader_fits_are_refused_by_name(options, match):
    x, y = problem()
    with pytest.raises(ValueError, match=match):
        zoo.get("map").fit(full_batch(x, y), **FAST, **options)


def test_a_batch_unlike_the_first_is_refused_naming_it():
    x, y = problem()
    batches = [(x[:20], y[:20]), (x[20:, :2], y[20:])]
    with pytest.raises(ValueError, match=r"every batch's x like the first's"):
        zoo.get("map").fit(batches, **FAST)


MEMMAP_FIT = textwrap.dedent("""
    import resource, sys
    import numpy as np, torch
    from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler
    from bnn_zoo import zoo

    path, rows, cols, margin = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    row_bytes = 4 * (cols + 1)

    class Rows(Dataset):
        # Reads a contiguous range of rows (features then target, float32) through a
        # memory map of that range alone, so the array is never mapped or held whole.
        def __len__(self):
            return rows

        def __getitem__(self, index):
            lo, hi = index[0], index[-1] + 1
            block = np.memmap(path, np.float32, "r", offset=lo * row_bytes,
                              shape=(hi - lo, cols + 1))
            data = torch.from_numpy(np.array(block))
            return data[:, :cols], data[:, cols]

    loader = DataLoader(Rows(), sampler=BatchSampler(SequentialSampler(range(rows)), 4096,
                                                     False), batch_size=None)
    zoo.get("map").fit(loader, steps=2, jit=False)  # a first fit: lazy imports, allocators
    status = open("/proc/self/status").read()
    baseline = int(status.split("VmSize:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (baseline + margin, baseline + margin))
    try:
        np.ones(rows * (cols + 1), np.float32)
    except MemoryError:
        pass
    else:
        raise SystemExit("the limit does not hold the array in memory")
    fitted = zoo.get("map").fit(loader, steps=10, jit=False)
    pred = fitted.predict(loader, num_samples=1).mean
    print(pred.shape[0], float(pred.std()))
""")


@pytest.mark.slow
def test_a_fit_on_a_memory_mapped_array_larger_than_the_memory_limit_completes(tmp_path):
    """A float32 array of 1.5 x the margin over the subprocess's own footprint, read
    through np.memmap windows by a Dataset: the fit, its standardisation pass and a
    prediction batch by batch complete under RLIMIT_AS, where the array itself cannot be
    allocated."""
    import numpy as np

    margin, cols = 128 * 1024**2, 255
    rows = int(1.5 * margin) // (4 * (cols + 1))
    path = tmp_path / "data.f32"
    g = np.random.default_rng(0)
    with open(path, "wb") as out:
        for lo in range(0, rows, 65536):
            x = g.standard_normal((min(65536, rows - lo), cols), dtype=np.float32)
            out.write(np.concatenate([x, x[:, :1] + 0.1], 1).astype(np.float32).tobytes())
    done = subprocess.run([sys.executable, "-c", MEMMAP_FIT, str(path), str(rows), str(cols),
                           str(margin)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    count, spread = done.stdout.split()[-2:]
    assert int(count) == rows and 0 < float(spread) < 10
