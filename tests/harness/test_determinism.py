"""Determinism: on the CPU with a fixed thread count the same comparison reproduces every
split's metrics; a split fitted among replicas depends on its group (the cache key records
it) and agrees in distribution with the same split fitted alone; committed cells of today's
code are refitted to their committed numbers by the project's own command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from bnn_zoo._harness import compare, provenance, summary

ROOT = Path(__file__).resolve().parents[2]
#: The metrics that measure time, not the fit.
TIMES = ("fit_seconds", "steps_per_second")


def _fitted(records: list[dict]) -> list[str]:
    """Each record's metrics but the times, and its loss curve, as exact JSON."""
    return [json.dumps({"metrics": {k: v for k, v in r["metrics"].items() if k not in TIMES},
                        "losses": r["losses"]}, sort_keys=True) for r in records]


@pytest.mark.parametrize("replicas", ["on", "off"])
def test_the_same_comparison_reproduces_every_split_exactly(tmp_path, replicas):
    """Two runs of one tiny comparison into fresh folders give byte-equal metrics and loss
    curves per split, whatever ran in between."""
    kwargs = dict(splits=2, overrides={"steps": 20}, num_samples=10, replicas=replicas,
                  log=False)
    first = compare.run_comparison(["sine"], ["map", "bbb"], out=tmp_path / "a", **kwargs)
    torch.randn(7)  # the global random state moves on
    again = compare.run_comparison(["sine"], ["map", "bbb"], out=tmp_path / "b", **kwargs)
    assert [r["status"] for r in first] == ["ok"] * 4
    assert _fitted(first) == _fitted(again)
    assert first[0]["metrics"] != first[1]["metrics"]  # the splits differ


def test_a_group_with_a_missing_run_is_fitted_again_whole(tmp_path, capsys):
    """Replicas: the cache key holds the group; when one run of a group is missing the
    whole group is refitted (no split of another group joins it) and reproduces it."""
    kwargs = dict(splits=3, out=tmp_path, overrides={"steps": 20}, num_samples=10)
    first = compare.run_comparison(["sine"], ["bbb"], **kwargs)
    assert [r["settings"]["overrides"]["replicas"] for r in first] == [[0, 1, 2]] * 3
    files = sorted((tmp_path / "runs" / "bbb").glob("*split1_*.json"))
    files[0].unlink()
    capsys.readouterr()
    again = compare.run_comparison(["sine"], ["bbb"], **kwargs)
    assert "[cached]" not in capsys.readouterr().out
    assert _fitted(again) == _fitted(first)
    two = compare.run_comparison(["sine"], ["bbb"], **{**kwargs, "splits": 2})
    assert [r["settings"]["overrides"]["replicas"] for r in two] == [[0, 1]] * 2
    assert len(list((tmp_path / "runs" / "bbb").glob("*.json"))) == 5


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["map", "bbb"])
def test_replicas_agree_in_distribution_with_fits_alone(tmp_path, entry):
    """Over the 20 splits of sine, the mean of the paired differences of test LL between a
    split fitted among replicas and fitted alone is within 4 standard errors of 0."""
    kwargs = dict(splits=20, overrides={"steps": 1000}, num_samples=100, log=False)
    together = compare.run_comparison(["sine"], [entry], replicas="on", out=tmp_path / "on",
                                      **kwargs)
    alone = compare.run_comparison(["sine"], [entry], replicas="off", out=tmp_path / "off",
                                   **kwargs)
    differences = [a["metrics"]["ll"] - b["metrics"]["ll"] for a, b in zip(together, alone)]
    mean, se = summary.mean_se(differences)
    print(f"{entry}: mean LL difference replicas - alone {mean:.4f} ± {se:.4f} (20 splits)")
    assert any(d != 0 for d in differences)  # the two modes are different fits
    assert abs(mean) <= max(4 * se, 1e-3)


#: The cheap entries whose committed UCI cells the project's command must reproduce.
CHEAP = ("map", "bbb", "mean_field", "laplace")


@pytest.mark.slow
@pytest.mark.parametrize("entry", CHEAP)
def test_committed_yacht_cells_of_todays_code_are_reproduced(tmp_path, uci_data, entry,
                                                              benchmark_script):
    """``benchmarks/uci.py --data yacht --entries ENTRY --splits 20`` refits every split's
    test LL of the committed ``uci_summary.json`` to 1e-3, for the committed runs of this
    checkout's code version (the others are of other code: nothing to compare). Exact on a
    machine of the kind that made them: MKL's kernels depend on the CPU's instruction set,
    and on another kind the splits differ and agree only in distribution
    (docs/guide/cli.md, provenance)."""
    committed = json.loads((ROOT / "benchmarks/results/uci/uci_summary.json").read_text())
    cell = [r for r in committed["runs"] if (r["entry"], r["data"]) == (entry, "uci/yacht")]
    code = provenance.code_version()
    mine = {r["split"]: r for r in cell if provenance.run_code(r) == code and r["status"] == "ok"}
    if not mine:
        found = sorted({provenance.run_code(r) for r in cell})
        pytest.skip(f"the committed runs of {entry} on yacht are of code versions {found}, "
                    f"not this checkout's {code}: rerun the comparison to compare them")
    script = benchmark_script("uci.py")
    records = script["main"](["--data", "yacht", "--entries", entry, "--splits", "20",
                              "--out", str(tmp_path)])
    refitted = {r["split"]: r["metrics"]["ll"] for r in records if r["status"] == "ok"}
    for split, run in mine.items():
        assert math.isclose(refitted[split], run["metrics"]["ll"], abs_tol=1e-3), split
