"""Numerical guards of the exact GP: each case either raises an error whose type
and message name the culprit, or fits with finite metrics and diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

from bnn_zoo import data, zoo
from bnn_zoo._core.step import TrainingDiverged
from bnn_zoo.methods._gp import fit_evidence
from bnn_zoo.models._nngp import NNGPRegression, NotPositiveDefinite
from bnn_zoo.models._nngp_kernel import NNGPKernel
from bnn_zoo.zoo import UnsupportedProblem


def sine(n: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    ds = data.load("sine")
    return ds.x_train[:n].to(dtype), ds.y_train[:n].to(dtype)


def duplicated(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = sine(n)
    return torch.cat([x] * 3), torch.cat([y] * 3)


def constant_targets(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, _ = sine(n)
    return x, torch.full((n,), 2.5)


# (case, data, fit options, expected error or None for a finite fit, pattern in its message)
CASES = [
    ("lr 1e3 diverges", sine(80), {"lr": 1e3}, TrainingDiverged, r"lr=1000\.0 at step \d+"),
    ("lr 10 is finite", sine(30), {"lr": 10.0}, None, None),
    ("one point", sine(1), {}, None, None),
    ("two points", sine(2), {}, None, None),
    ("three points", sine(3), {}, None, None),
    ("duplicate inputs", duplicated(10), {}, None, None),
    ("duplicates, tiny fixed noise", duplicated(10),
     {"model_options": {"noise_scale": 1e-9}}, None, None),
    ("constant targets", constant_targets(20), {}, None, None),
    ("float32 inputs", sine(30, torch.float32), {}, None, None),
    ("float64 inputs", sine(30, torch.float64), {}, None, None),
    ("depth 0", sine(10), {"model_options": {"depth": 0}}, ValueError, "depth >= 1"),
    ("negative depth", sine(10), {"model_options": {"depth": -2}}, ValueError, "depth >= 1"),
    ("non-int depth", sine(10), {"model_options": {"depth": 1.5}}, TypeError, "depth"),
    ("unknown activation", sine(10), {"model_options": {"activation": "swish"}}, ValueError,
     "activation 'swish'"),
    ("more points than max_points", sine(30), {"method_options": {"max_points": 20}},
     UnsupportedProblem, "max_points=20"),
    ("kernel variance out of bounds", sine(10), {"model_options": {"weight_variance": 1e9}},
     ValueError, "weight_variance"),
]


@pytest.mark.parametrize("case, xy, options, error, pattern", CASES,
                         ids=[case[0] for case in CASES])
def test_exact_gp_fails_clearly_or_fits_finitely(case, xy, options, error, pattern):
    x, y = xy
    if error is not None:
        with pytest.raises(error, match=pattern):
            zoo.get("nngp").fit(x, y, steps=20, **options)
        return
    fitted = zoo.get("nngp").fit(x, y, steps=20, **options)
    metrics = fitted.evaluate(x, y)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert 0 < fitted.diagnostics["jitter"] <= 1e-2
    pred = fitted.predict(x)
    assert pred.loc.dtype == x.dtype


def test_divergence_keeps_the_last_finite_hyperparameters():
    x, y = sine(80, torch.float64)
    gp = NNGPRegression(1).double()
    with pytest.raises(TrainingDiverged, match="lr=1000.0") as info:
        fit_evidence(gp, x, y, steps=20, lr=1e3, seed=0)
    assert "last finite hyperparameters" in str(info.value)
    values = gp.hyperparameters()
    assert all(math.isfinite(v) and v > 0 for v in values.values()), values
    assert math.isfinite(gp.log_evidence(x, y).item())


def test_jitter_escalates_and_is_recorded():
    """A rank-one kernel (identity activation, one feature, no noise to speak of) needs more
    than the first jitter on duplicated points; the factorisation escalates and records it."""
    x = torch.linspace(-1, 1, 50, dtype=torch.float64).unsqueeze(-1)
    gp = NNGPRegression(1, activation="identity", noise_scale=1e-12, jitter=1e-18).double()
    chol, noise_variance = gp.factorise(x)
    assert torch.isfinite(chol).all() and gp.largest_jitter > 1e-18
    mean_variance = gp.kernel(x).diagonal().mean()
    torch.testing.assert_close(noise_variance, 1e-24 + gp.largest_jitter * mean_variance)


def test_a_kernel_that_is_not_finite_is_named():
    gp = NNGPRegression(1).double()
    with pytest.raises(NotPositiveDefinite, match="not finite.*noise_scale"):
        gp.factorise(torch.tensor([[1e200], [2.0]], dtype=torch.float64))


def test_kernel_variances_are_bounded():
    with pytest.raises(ValueError, match="bias_variance"):
        NNGPKernel(1, bias_variance=1e-9)
    kernel = NNGPKernel(1).double()
    with torch.no_grad():
        for p in kernel.parameters():
            p.fill_(1e4)  # far beyond the upper bound in the unconstrained space
    assert kernel.weight_variance.item() <= 1e8
    assert torch.isfinite(kernel(torch.ones(2, 1, dtype=torch.float64))).all()
