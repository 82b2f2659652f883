"""The comparison machinery: metrics and distances against hand computations, the
cached runs, skipping, tables and figures."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bnn_zoo import data, zoo
from bnn_zoo.core.predictive import GaussianMixturePredictive
from bnn_zoo.evaluation.metrics import metrics
from bnn_zoo.harness import compare

TINY = {"steps": 20}


def test_gaussian_predictive_metrics_match_hand_computation():
    """A predictive N(m, s^2) (every mixture component equal) at targets placed at known
    z-scores: LL is the Gaussian log density, coverage counts |z| below the quantiles."""
    m, s = 1.5, 0.4
    z = torch.tensor([0.0, 0.5, -0.6, 0.7, 1.0, -1.5, 1.7, 1.9, -2.0, 2.5], dtype=torch.float64)
    y = m + s * z
    pred = GaussianMixturePredictive(torch.full((3, 10), m, dtype=torch.float64),
                                     torch.full((3, 10), s, dtype=torch.float64))
    out = metrics(pred, y)
    ll = (-0.5 * z**2 - math.log(s) - 0.5 * math.log(2 * math.pi)).mean()
    assert out["ll"] == pytest.approx(float(ll), abs=1e-9)
    assert out["rmse"] == pytest.approx(float(s * (z**2).mean().sqrt()), abs=1e-9)
    # z quantiles: 0.674 (50%), 1.645 (90%), 1.960 (95%)
    assert out["coverage_50"] == pytest.approx(3 / 10)
    assert out["coverage_90"] == pytest.approx(6 / 10)
    assert out["coverage_95"] == pytest.approx(8 / 10)


def test_gaussian_w2_matches_quantile_integral():
    """In 1-D, W2^2 = int_0^1 (F^-1(u) - G^-1(u))^2 du; for Gaussians it is
    (m1 - m2)^2 + (s1 - s2)^2."""
    m1, s1, m2, s2 = 0.3, 1.2, -0.5, 0.7
    u = (torch.arange(200_000, dtype=torch.float64) + 0.5) / 200_000
    std_normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), 1.0)
    q = std_normal.icdf(u)
    numeric = (((m1 + s1 * q) - (m2 + s2 * q)) ** 2).mean().sqrt()
    t = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    closed = compare.gaussian_w2(t(m1), t(s1), t(m2), t(s2))
    assert float(closed) == pytest.approx(float(numeric), rel=1e-4)
    assert float(closed) == pytest.approx(math.hypot(0.8, 0.5), abs=1e-12)


def test_summary_mean_and_standard_error_and_reference_distance():
    def record(entry, split, ll, mean, std):
        return {"entry": entry, "data": "toy", "task": "regression", "split": split,
                "status": "ok", "metrics": {"ll": ll}, "diagnostics": {},
                "moments": {"mean": mean, "std": std}}

    records = [record("ref", 0, -1.0, [0.0, 0.0], [1.0, 1.0]),
               record("ref", 1, -2.0, [0.0, 0.0], [1.0, 1.0]),
               record("a", 0, -1.5, [3.0, 0.0], [1.0, 5.0]),
               record("a", 1, -1.0, [0.0, 0.0], [1.0, 1.0]),
               {"entry": "b", "data": "toy", "task": "regression", "split": 0,
                "status": "skipped", "reason": "too big"}]
    rows = {r["entry"]: r for r in compare.summarise(records, reference="ref")}
    a = rows["a"]
    assert a["splits"] == 2
    assert a["ll"] == pytest.approx(-1.25)
    assert a["ll_se"] == pytest.approx(math.sqrt(0.125 / 2))  # sample var 0.125, n = 2
    # split 0: W2 = (3 + 4) / 2 per point; split 1: 0
    assert a["w2_to_ref"] == pytest.approx(1.75)
    assert a["ll_gap"] == pytest.approx((-0.5 + 1.0) / 2)
    assert rows["b"]["splits"] == 0 and "too big" in rows["b"]["reason"]
    table = compare.markdown_table(compare.summarise(records, reference="ref"))
    assert "| a | 2 | " in table and "-1.250 ± 0.250" in table


def test_default_entries_come_from_the_registry():
    names = compare.default_entries("regression")
    assert compare.REFERENCE not in names
    assert set(names) == set(zoo.names("regression")) - {compare.REFERENCE}
    assert {"map", "mean_field", "bbb", "lowrank", "iaf", "ensemble"} <= set(names)


def test_unsupported_problem_is_skipped_with_its_reason():
    dataset = data.load("sine")
    record = compare.run_one("nuts", dataset, split=0, seed=0, overrides={"max_points": 10})
    assert record["status"] == "skipped"
    assert "max_points" in record["reason"]


def test_run_comparison_caches_and_resumes(tmp_path, capsys):
    kwargs = dict(splits=2, out=tmp_path, overrides=TINY, num_samples=20)
    first = compare.run_comparison(["sine"], ["map"], **kwargs)
    assert [r["status"] for r in first] == ["ok", "ok"]
    assert [r["split"] for r in first] == [0, 1]
    files = sorted((tmp_path / "runs" / "map").glob("*.json"))
    assert len(files) == 2
    capsys.readouterr()
    again = compare.run_comparison(["sine"], ["map"], **kwargs)
    assert capsys.readouterr().out.count("[cached]") == 2
    assert [r["metrics"] for r in again] == [json.loads(f.read_text())["metrics"] for f in files]
    table = compare.write_tables(again, tmp_path)
    assert "### sine" in table and "| map | 2 |" in table
    paths = compare.write_figures(again, tmp_path)
    assert {p.name for p in paths} == {"bands_sine.png", "elbo_sine.png"}
    assert (tmp_path / "compare.csv").read_text().startswith("data,entry,task,splits")


def test_classification_records_reliability(tmp_path):
    records = compare.run_comparison(["two_moons"], ["map"], out=tmp_path, overrides=TINY,
                                     num_samples=10, log=False)
    assert records[0]["status"] == "ok"
    assert sum(records[0]["reliability"]["count"]) == 200
    assert "ece" in compare.summarise(records)[0]
    names = {p.name for p in compare.write_figures(records, tmp_path)}
    assert "reliability_two_moons.png" in names


def test_unknown_entry_fails_before_fitting(tmp_path):
    with pytest.raises(ValueError, match="Unknown zoo entry"):
        compare.run_comparison(["sine"], ["map", "no_such_entry"], out=tmp_path)
    assert not (tmp_path / "runs").exists()
