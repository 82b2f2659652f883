"""K-FAC Laplace on networks wider than the data: with 160 points a 300- or 600-unit
layer's Kronecker factors are singular, with many zero eigenvalues (dead units), on
which float32 ``eigh`` fails to converge or returns NaN (seed 0 of the first failed so);
every fit must finish with finite metrics and evidence (the jitter's bound is tested on
the factors themselves, in ``tests/core/test_linalg.py``). About 3 minutes: slow."""

from __future__ import annotations

import math

import pytest
from torch import nn

from bnn_zoo import data, zoo

WIDE = [pytest.param(300, 200, None, id="1-300-300-1"),
        pytest.param(600, 20, {"refine": False}, id="1-600-600-1")]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("width, steps, options", WIDE)
def test_laplace_kron_fits_a_network_wider_than_the_data(width, steps, options, seed):
    d = data.load("sine")

    def net() -> nn.Module:
        return nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                             nn.Linear(width, 1))

    fitted = zoo.get("laplace_kron").fit(d.x_train[:160], d.y_train[:160], seed=seed,
                                         steps=steps, net=net, method_options=options)
    metrics = fitted.evaluate(d.x_test, d.y_test)
    assert all(math.isfinite(metrics[k]) for k in ("rmse", "ll", "coverage_90"))
    assert math.isfinite(fitted.diagnostics["log_evidence"])
    assert 0 <= fitted.diagnostics["jitter"] < math.inf
