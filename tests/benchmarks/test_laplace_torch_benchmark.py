"""``benchmarks/laplace_torch.py``: the zoo's Laplace pipeline against a plain-torch MAP and
laplace-torch. laplace-torch is not a dependency: without it the script stops
with the install command; with it, a tiny run writes every column."""

from __future__ import annotations

import json
import math
import runpy
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "laplace_torch.py"


@pytest.fixture(scope="module")
def script():
    return runpy.run_path(str(SCRIPT))


def test_torch_map_lowers_the_map_objective(script):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, generator=g)
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(64, generator=g)

    def objective(steps: int) -> float:
        net, sigma = script["torch_map"](x, y, hidden=16, steps=steps, lr=1e-2, batch=64,
                                         seed=0)
        with torch.no_grad():
            nll = -torch.distributions.Normal(net(x).squeeze(-1), sigma).log_prob(y).sum()
            return float(nll + 0.5 * sum(p.pow(2).sum() for p in net.parameters()))

    assert objective(300) < 0.5 * objective(1)


def test_without_laplace_torch_the_script_says_how_to_install_it(script, monkeypatch):
    monkeypatch.setitem(sys.modules, "laplace", None)  # makes `from laplace import` fail
    with pytest.raises(SystemExit, match="pip install laplace-torch"):
        script["import_laplace_torch"]()


# laplace-torch's dependencies script functions with torch.jit on import, which torch 2.13
# deprecates: their warning, not ours.
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_tiny_run_writes_both_pipelines_scores_and_the_ratios(script, tmp_path):
    pytest.importorskip("laplace", reason="laplace-torch is not installed")
    script["main"](["--data", "sine", "--splits", "1", "--steps", "20", "--marglik-steps",
                    "2", "--out", str(tmp_path)])
    row = json.loads((tmp_path / "laplace_torch.json").read_text())["summary"][0]
    for key in ("zoo", "zoo_posthoc", "laplace_torch"):
        assert row[f"{key}_s"] > 0 and math.isfinite(row[f"{key}_ll"])
    assert math.isclose(row["ratio"], row["zoo_s"] / row["laplace_torch_s"])
