"""The comparison machinery: metrics and distances against hand computations, the
cached runs and their keys, skipping, the table writer, atomic writes, figures and
the shared flags."""

from __future__ import annotations

import argparse
import json
import math
import shutil

import pytest
import torch
from matplotlib.figure import Figure

from bnn_zoo import data, zoo
from bnn_zoo._core import files
from bnn_zoo._core.predictive import GaussianMixturePredictive
from bnn_zoo._harness import compare, flags, runs, summary, tables
from bnn_zoo._harness.figures import save_figure, write_figures
from bnn_zoo.evaluation._metrics import metrics

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
    closed = summary.gaussian_w2(t(m1), t(s1), t(m2), t(s2))
    assert float(closed) == pytest.approx(float(numeric), rel=1e-4)
    assert float(closed) == pytest.approx(math.hypot(0.8, 0.5), abs=1e-12)


def test_quantile_w1_is_scipys_distance_and_the_mixtures_within_the_midpoint_error():
    """``quantile_w1`` on the kept quantiles is ``scipy.stats.wasserstein_distance`` between
    the K-point distributions at them. Against the exact W1 ``int |F_a(t) - F_b(t)| dt`` (by
    quadrature on a fine grid) the midpoint rule only loses the outer halves of the
    extreme levels' tails, so it is never above it: by 0.9% for two Gaussians of scales 1
    and 2 (``1 - mean_k |z(u_k)| / E|Z|``, asserted within 1%), by 1.3% for the two
    mixtures here (asserted within 2%)."""
    scipy_stats = pytest.importorskip("scipy.stats")
    def t(values):
        return torch.tensor(values, dtype=torch.float64)
    a = GaussianMixturePredictive(t([[0.0, 1.0], [0.8, -1.0], [0.3, 0.0]]),
                                  t([[0.5, 0.2], [0.3, 0.6], [0.4, 0.3]]))
    b = GaussianMixturePredictive(t([[0.2, 0.5], [0.1, -0.2]]), t([[0.9, 0.4], [0.2, 0.5]]))
    gaussians = (GaussianMixturePredictive(t([[0.0]]), t([[1.0]])),
                 GaussianMixturePredictive(t([[0.0]]), t([[2.0]])))
    grid = torch.linspace(-12.0, 12.0, 240_001, dtype=torch.float64)
    for (p, q), within in (((a, b), 0.02), (gaussians, 0.01)):
        qa, qb = (torch.stack([r.quantile(u) for u in runs.w1_levels()]) for r in (p, q))
        w1 = summary.quantile_w1(qa, qb)
        cdfs = [torch.distributions.Normal(r.loc, r.scale).cdf(grid[:, None, None]).mean(1)
                for r in (p, q)]
        exact = torch.trapezoid((cdfs[0] - cdfs[1]).abs(), grid, dim=0)
        for n in range(len(w1)):
            assert float(w1[n]) == pytest.approx(
                scipy_stats.wasserstein_distance(qa[:, n].numpy(), qb[:, n].numpy()),
                rel=1e-12)
            assert (1 - within) * exact[n] <= w1[n] <= exact[n] * (1 + 1e-6)
    with pytest.raises(ValueError, match="quantiles_a and quantiles_b"):
        summary.quantile_w1(qa, qb[:-1])


def test_w1_needs_both_records_quantiles():
    """``w1_to_ref`` is the mean over test points of `quantile_w1`, and only where the entry
    and the reference both kept quantiles (a run compared with a reference)."""
    def record(entry, quantiles=None):
        r = {"entry": entry, "data": "toy", "task": "regression", "split": 0, "status": "ok",
             "metrics": {"ll": -1.0}, "diagnostics": {},
             "moments": {"mean": [0.0, 0.0], "std": [1.0, 1.0]}}
        return r if quantiles is None else {**r, "quantiles": quantiles}

    records = [record("ref", [[0.0, 1.0], [2.0, 3.0]]), record("a", [[1.0, 1.0], [2.0, 5.0]]),
               record("b")]
    summary.reference_distances(records, "ref")
    assert records[1]["metrics"]["w1_to_ref"] == pytest.approx((0.5 + 1.0) / 2)
    assert "w1_to_ref" not in records[2]["metrics"]


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
    rows = {r["entry"]: r for r in summary.summarise(records, reference="ref")}
    a = rows["a"]
    assert a["runs"] == 2
    assert a["ll"] == pytest.approx(-1.25)
    assert a["ll_se"] == pytest.approx(math.sqrt(0.125 / 2))  # sample var 0.125, n = 2
    # split 0: W2 = (3 + 4) / 2 per point; split 1: 0
    assert a["w2_to_ref"] == pytest.approx(1.75)
    assert a["ll_gap"] == pytest.approx((-0.5 + 1.0) / 2)
    assert rows["b"]["runs"] == 0 and "too big" in rows["b"]["reason"]
    table = tables.markdown_table(list(rows.values()), keys=("data", "entry"), section="data",
                                  columns=("ll", "w2_to_ref"), notes=compare.notes)
    assert "### toy" in table and "| a | 2 | " in table and "-1.250 ± 0.250" in table
    assert "| b | 0 | - | - | skipped: too big |" in table


def test_aggregate_gives_mean_standard_error_and_runs():
    rows = [{"k": "x", "v": 1.0, "n": 2, "tag": "a"}, {"k": "x", "v": 3.0, "n": 4, "tag": "b"},
            {"k": "y", "v": 5.0, "n": 1, "tag": "a"}]
    x, y = summary.aggregate(rows, ("k",))
    assert x["runs"] == 2 and x["v"] == 2.0 and x["v_se"] == pytest.approx(1.0)  # sqrt(2 / 2)
    assert x["n"] == 3.0 and x["tag"] == "a; b"
    assert y["runs"] == 1 and y["v"] == 5.0 and math.isnan(y["v_se"])
    with pytest.raises(ValueError, match="keys"):
        summary.aggregate([{"v": 1.0}], ("k",))


def test_write_tables_writes_markdown_csv_json(tmp_path):
    rows = summary.aggregate([{"data": "d", "entry": "e", "ll": -1.0},
                              {"data": "d", "entry": "e", "ll": -2.0}], ("data", "entry"))
    published = [{"data": "d", "entry": "VI (published)", "ll": -3.0, "ll_se": 0.1}]
    text = tables.write_tables(tmp_path, "t", rows, keys=("data", "entry"), columns=("ll",),
                               markdown_rows=published, runs=[{"ll": -1.0}, {"ll": float("nan")}])
    assert text == (tmp_path / "t.md").read_text()
    assert "| d | e | 2 | -1.500 ± 0.500 |" in text
    assert "| d | VI (published) | - | -3.000 ± 0.100 |" in text
    assert (tmp_path / "t.csv").read_text().splitlines() == ["data,entry,runs,ll,ll_se",
                                                             "d,e,2,-1.5,0.5"]
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["summary"] == [{"data": "d", "entry": "e", "runs": 2, "ll": -1.5, "ll_se": 0.5}]
    assert saved["runs"][1] == {"ll": None}  # nan is not JSON
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.json", "t.md"]


def test_format_value():
    assert tables.format_value(1.23456, 0.01) == "1.235 ± 0.010"
    assert tables.format_value(123.45, 2.0) == "123.5 ± 2.0"
    assert tables.format_value(2.5e-5, 1e-6) == "2.5e-05 ± 1e-06"
    assert tables.format_value(float("nan")) == "-" and tables.format_value(None) == "-"
    assert tables.format_value(3) == "3" and tables.format_value("ok") == "ok"


def test_atomic_writes_leave_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "r.txt"
    files.write_text_atomic(path, "old")
    with pytest.raises(RuntimeError), files.atomic_path(path) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".txt" and tmp != path
        tmp.write_text("half")
        raise RuntimeError("crash")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.txt"]
    fig = Figure()
    fig.add_subplot().plot([0, 1])
    saved = save_figure(fig, tmp_path / "f.png")
    assert saved.read_bytes()[:4] == b"\x89PNG" and len(list(tmp_path.iterdir())) == 2


def test_default_entries_come_from_the_registry():
    names = compare.default_entries("regression")
    assert summary.REFERENCE not in names
    assert set(names) == set(zoo.names("regression")) - {summary.REFERENCE}
    assert {"map", "mean_field", "bbb", "lowrank", "iaf", "ensemble"} <= set(names)


def test_unsupported_problem_is_skipped_with_its_reason():
    dataset = data.load("sine")
    record = runs.run_one("nuts", dataset, split=0, seed=0,
                          overrides={"method_options": {"max_points": 10}})
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
    _, table = compare.write_comparison(again, tmp_path)
    assert "### sine" in table and "| map | 2 |" in table
    paths = write_figures(again, tmp_path)
    assert {p.name for p in paths} == {"bands_sine.png", "elbo_sine.png"}
    # The band reaches half the training range past the training inputs on each side.
    x_train = data.load("sine", 0).x_train[:, 0]
    lo, hi, span = float(x_train.min()), float(x_train.max()), float(x_train.max() - x_train.min())
    band_x = again[0]["band"]["x"]
    assert band_x[0] == pytest.approx(lo - span / 2) and band_x[-1] == pytest.approx(hi + span / 2)
    assert (tmp_path / "compare.csv").read_text().startswith("data,entry,task,runs")


def test_cached_only_fits_nothing_and_lists_the_missing_runs(tmp_path, capsys):
    # One by one: a group of replicas of other splits would be other runs.
    kwargs = dict(out=tmp_path, overrides=TINY, num_samples=20, replicas="off")
    compare.run_comparison(["sine"], ["map"], splits=1, **kwargs)
    records = compare.run_comparison(["sine"], ["map"], splits=3, cached_only=True, **kwargs)
    assert [r["status"] for r in records] == ["ok", "skipped", "skipped"]
    assert all(r["reason"] == runs.NOT_CACHED for r in records[1:])
    assert len(list((tmp_path / "runs" / "map").glob("*.json"))) == 1  # nothing new cached
    assert capsys.readouterr().out.count("[skipped]") == 2


def test_committed_runs_restore_the_cache_and_rewrite_the_same_tables(tmp_path, capsys):
    """A fresh checkout has the comparison's JSON but no cache: restored from the JSON, a
    cached-only rerun finds the finished runs, lists the one that never ran as before, and
    writes the same table (with the line naming the runs' code)."""
    kwargs = dict(out=tmp_path, overrides=TINY, num_samples=20, replicas="off")
    compare.run_comparison(["sine"], ["map"], splits=2, **kwargs)
    records = compare.run_comparison(["sine"], ["map"], splits=3, cached_only=True, **kwargs)
    _, table = compare.write_comparison(records, tmp_path, name="committed")
    shutil.rmtree(tmp_path / "runs")
    assert runs.restore_cache(tmp_path, "committed", task="regression") == 2  # not the hole
    assert runs.restore_cache(tmp_path, "committed", task="regression") == 0  # none missing
    assert runs.restore_cache(tmp_path, "absent", task="regression") == 0
    capsys.readouterr()
    again = compare.run_comparison(["sine"], ["map"], splits=3, cached_only=True, **kwargs)
    assert capsys.readouterr().out.count("[cached]") == 2
    assert [r["metrics"] for r in again[:2]] == [r["metrics"] for r in records[:2]]
    assert again[2]["reason"] == runs.NOT_CACHED
    assert compare.write_comparison(again, tmp_path, name="rewritten")[1] == table


def test_cache_key_holds_every_setting_that_changes_a_result():
    dataset = data.load("sine")
    base = runs.run_settings(dataset, {"steps": 20}, 200)
    path = runs.cache_path("out", "map", "sine", 0, 0, base)
    changed = [runs.run_settings(dataset, {"steps": 20, "model_options": {"hidden": (100,)}}, 200),
               runs.run_settings(dataset, {"steps": 20}, 100),
               {**base, "device": "cuda:0"},
               {**base, "dtype": "torch.float64"}]
    assert len({runs.cache_path("out", "map", "sine", 0, 0, s) for s in changed} | {path}) == 5
    assert runs.cache_path("out", "map", "sine", 0, 1, base) != path
    assert runs.cache_path("out", "map", "sine", 0, 0, dict(reversed(base.items()))) == path


def test_corrupt_cache_file_is_refitted_with_a_warning(tmp_path, capsys):
    kwargs = dict(out=tmp_path, overrides=TINY, num_samples=10)
    (first,) = compare.run_comparison(["sine"], ["map"], **kwargs)
    (path,) = (tmp_path / "runs" / "map").glob("*.json")
    path.write_text(path.read_text()[: len(path.read_text()) // 2])  # truncated
    with pytest.warns(runs.CacheWarning, match="fitting it again"):
        (again,) = compare.run_comparison(["sine"], ["map"], **kwargs)
    assert again["status"] == "ok" and again["metrics"]["ll"] == first["metrics"]["ll"]  # same seed
    assert json.loads(path.read_text())["metrics"] == again["metrics"]
    capsys.readouterr()
    compare.run_comparison(["sine"], ["map"], **kwargs)
    assert "[cached]" in capsys.readouterr().out
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "seed": 7}))  # another run's record at this path
    with pytest.warns(runs.CacheWarning, match="another run"):
        compare.run_comparison(["sine"], ["map"], **kwargs)


def test_classification_records_reliability(tmp_path):
    records = compare.run_comparison(["two_moons"], ["map"], out=tmp_path, overrides=TINY,
                                     num_samples=10, log=False)
    assert records[0]["status"] == "ok"
    assert sum(records[0]["reliability"]["count"]) == 200
    assert "ece" in summary.summarise(records)[0]
    names = {p.name for p in write_figures(records, tmp_path)}
    assert "reliability_two_moons.png" in names


def test_unknown_entry_fails_before_fitting(tmp_path):
    with pytest.raises(ValueError, match="Unknown zoo entry"):
        compare.run_comparison(["sine"], ["map", "no_such_entry"], out=tmp_path)
    assert not (tmp_path / "runs").exists()


def test_shared_flags_parse_check_and_set_threads():
    parser = flags.add_shared_flags(argparse.ArgumentParser(), out="results/x", splits=3)
    before = torch.get_num_threads()
    try:
        args = flags.parse(parser, ["--threads", "2", "--seed", "4"])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert str(args.out) == "results/x" and args.splits == 3 and args.seed == 4
    assert args.device == torch.device("cpu")
    with pytest.raises(SystemExit):
        flags.parse(parser, ["--splits", "0"])
    with pytest.raises(SystemExit):
        flags.parse(parser, ["--device", "gpu"])
    bare = flags.add_shared_flags(argparse.ArgumentParser(), out=None,
                                  without=("splits", "seed", "retain_freed_memory"))
    assert vars(bare.parse_args([])) == {"out": None, "threads": None,
                                         "device": torch.device("cpu")}
    with pytest.raises(ValueError, match="Unknown shared flags"):
        flags.add_shared_flags(argparse.ArgumentParser(), out=None, without=("steps",))


def test_retain_freed_memory_flag_is_applied_only_when_given(monkeypatch, capsys):
    # The real call changes the whole process (the test session): record it instead.
    calls = []
    monkeypatch.setattr(flags, "retain_freed_memory", lambda: calls.append(1) or True)
    parser = flags.add_shared_flags(argparse.ArgumentParser(), out=None)
    assert not flags.parse(parser, []).retain_freed_memory and calls == []
    assert flags.parse(parser, ["--retain-freed-memory"]).retain_freed_memory and calls == [1]
    monkeypatch.setattr(flags, "retain_freed_memory", lambda: False)  # not glibc
    with pytest.raises(SystemExit):
        flags.parse(parser, ["--retain-freed-memory"])
    assert "--retain-freed-memory needs glibc" in capsys.readouterr().err
