"""Every script in ``benchmarks/`` runs with tiny flags, without the network; a script
missing from ``TINY_ARGS`` fails the suite (as Pyro's ``tests/test_examples.py`` does).
Every script takes the shared flags and writes its tables through the harness's one
table writer."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

# file name -> flags that make it run in seconds ("{out}" becomes a temporary folder)
TINY_ARGS: dict[str, list[str]] = {
    "speed.py": ["--repeats", "1", "--inner", "1", "--nets", "13-50-1", "--out", "{out}"],
    "replicas.py": ["--replicas", "2", "--steps", "3", "--repeats", "1", "--points", "20",
                    "--out", "{out}"],
    "compare_guides.py": ["--data", "sine", "--entries", "map", "--steps", "10",
                          "--num-samples", "5", "--reference", "none", "--out", "{out}"],
    "uci.py": ["--data", "yacht", "--splits", "1", "--entries", "map", "--steps", "10",
               "--num-samples", "5", "--out", "{out}"],
}
NEEDS_UCI = {"uci.py"}
# scripts whose tiny run lives beside the method's other tests, which also check the numbers
TESTED_ELSEWHERE = {
    "bbb_priors.py": "test_bbb.py",
    "classification.py": "test_mean_field_clf.py",
    "cnn.py": "test_module_handlers.py",
    "distributed_fit.py": "test_scale_scripts.py",
    "laplace_torch.py": "test_laplace_torch_benchmark.py",
    "laplace_variants.py": "test_laplace.py",
    "mixture.py": "test_mixture.py",
    "mixture_nuts.py": "test_mixture.py",
    "nngp.py": "test_nngp.py",
    "rff.py": "test_rff.py",
    "throughput.py": "test_scale_scripts.py",
}


def test_every_script_is_listed():
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    missing = scripts - set(TINY_ARGS) - set(TESTED_ELSEWHERE)
    assert not missing, f"add tiny flags for {sorted(missing)} to TINY_ARGS"
    tests = Path(__file__).resolve().parent
    for script, test_file in TESTED_ELSEWHERE.items():
        assert script.removesuffix(".py") in (tests / test_file).read_text(), (script, test_file)


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
def test_script_uses_the_shared_flags_and_the_table_writer(script):
    text = (BENCHMARKS / script).read_text()
    assert "flags.parse(" in text
    assert "add_shared_flags" in text or "add_comparison_flags" in text
    assert any(w in text for w in ("write_tables(", "write_table_group(", "write_comparison(",
                                   "run_from_args("))
    for own in ("set_num_threads", "argparse.FileType", ".write_text(", "savefig(", "csv.",
                "json.dump"):
        assert own not in text, f"{script} uses {own}; the harness does that"


@pytest.mark.parametrize("script", sorted(TINY_ARGS))
def test_script_runs_with_tiny_flags(script, tmp_path, monkeypatch, request, capsys):
    if script in NEEDS_UCI:
        request.getfixturevalue("uci_data")
    argv = [a.replace("{out}", str(tmp_path)) for a in TINY_ARGS[script]]
    monkeypatch.setattr(sys, "argv", [script, *argv])
    runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    assert "[failed]" not in capsys.readouterr().out  # a comparison reports a failed fit
    assert any(p.suffix == ".md" for p in tmp_path.iterdir())


def test_uci_script_writes_the_tidy_runs_the_best_table_and_the_figure(tmp_path, uci_data):
    """``uci.csv`` holds one row per (entry, data set, split) with the protocol's columns,
    a skipped run says why, and the best-entry table compares with the best published LL."""
    import csv

    script = runpy.run_path(str(BENCHMARKS / "uci.py"), run_name="uci")
    # mean_field_clf is classification-only: its runs on a regression set are skipped.
    script["main"](["--data", "yacht", "--splits", "2", "--entries", "map", "mean_field_clf",
                    "--steps", "10", "--num-samples", "5", "--out", str(tmp_path)])
    with open(tmp_path / "uci.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["entry"], r["dataset"], r["split"]) for r in rows] == [
        ("map", "yacht", "0"), ("map", "yacht", "1"), ("mean_field_clf", "yacht", "0"),
        ("mean_field_clf", "yacht", "1")]
    assert {"ll", "rmse", "coverage_90", "fit_seconds"} <= rows[0].keys()
    assert rows[2]["status"] == "skipped" and "not 'regression'" in rows[2]["reason"]
    assert "not 'regression'" in (tmp_path / "uci_summary.md").read_text()  # the hole says why
    best = (tmp_path / "uci_best.md").read_text()
    assert "| uci/yacht | map | 2 |" in best and "deep ensembles" in best
    assert (tmp_path / "uci_ll.png").stat().st_size > 0


def test_uci_script_writes_the_distances_to_a_reference(tmp_path, uci_data):
    """``--reference`` writes ``reference.json`` as ``compare`` does: per split and over the
    splits, each entry's W2 distance and LL gap to the reference (0 for the reference)."""
    import json

    script = runpy.run_path(str(BENCHMARKS / "uci.py"), run_name="uci")
    script["main"](["--data", "yacht", "--splits", "2", "--entries", "map", "mean_field",
                    "--steps", "10", "--num-samples", "5", "--reference", "map",
                    "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "reference.json").read_text())["summary"]
    over = {r["entry"]: r for r in rows if r["split"] == "all"}
    assert over["map"]["w2_to_ref"] == 0 and over["map"]["ll_gap"] == 0
    assert over["mean_field"]["w2_to_ref"] > 0 and over["mean_field"]["runs"] == 2
    assert {r["split"] for r in rows if r["entry"] == "mean_field"} == {0, 1, "all"}


def test_uci_script_in_two_workers_writes_what_one_process_writes(tmp_path, uci_data):
    """``--jobs 2`` fits the data sets in spawned workers (run as a user runs the script:
    a worker imports it as the main module) and writes the rows of a run in one process,
    in the order of ``--data``."""
    import csv
    import subprocess

    args = ["--data", "yacht", "bostonHousing", "--splits", "1", "--entries", "map", "--steps",
            "10", "--num-samples", "5"]
    runpy.run_path(str(BENCHMARKS / "uci.py"), run_name="uci")["main"](
        [*args, "--out", str(tmp_path / "one")])
    subprocess.run([sys.executable, str(BENCHMARKS / "uci.py"), *args, "--jobs", "2", "--out",
                    str(tmp_path / "two")], check=True, capture_output=True)
    rows = {}
    for folder in ("one", "two"):
        with open(tmp_path / folder / "uci.csv") as f:
            rows[folder] = [(r["entry"], r["dataset"], r["split"], r["status"], float(r["ll"]))
                            for r in csv.DictReader(f)]
    assert [r[:4] for r in rows["two"]] == [("map", "yacht", "0", "ok"),
                                           ("map", "bostonHousing", "0", "ok")]
    assert [r[:4] for r in rows["one"]] == [r[:4] for r in rows["two"]]
    assert [r[4] for r in rows["two"]] == pytest.approx([r[4] for r in rows["one"]])


def test_uci_script_refuses_jobs_below_one(tmp_path, capsys):
    script = runpy.run_path(str(BENCHMARKS / "uci.py"), run_name="uci")
    with pytest.raises(SystemExit):
        script["main"](["--jobs", "0", "--out", str(tmp_path)])
    assert "--jobs" in capsys.readouterr().err


def test_uci_best_published_and_wins_by_hand():
    script = runpy.run_path(str(BENCHMARKS / "uci.py"), run_name="uci")
    assert script["best_published"]("uci/yacht") == ("deep ensembles", -1.18, 0.21)
    assert script["best_published"]("wine-quality-red")[0] == "MC dropout"
    summary = [{"data": "uci/yacht", "entry": "a", "runs": 20, "ll": -1.0, "ll_se": 0.1,
                "fit_seconds": 3.0},
               {"data": "uci/yacht", "entry": "b", "runs": 20, "ll": -1.5, "ll_se": 0.1,
                "fit_seconds": 1.0},
               {"data": "uci/yacht", "entry": "c", "runs": 3, "ll": 0.0, "ll_se": 0.1,
                "fit_seconds": 1.0},
               {"data": "uci/wine-quality-red", "entry": "a", "runs": 0, "reason": "skipped"}]
    (best,) = script["best_rows"](summary)  # c's 3 splits are not set against a's 20
    assert (best["entry"], best["beats"], best["published_ll"]) == ("a", True, -1.18)
    wins = {r["entry"]: r for r in script["wins"](summary)}
    assert wins["a"]["ll_above_best"] == 1 and wins["b"]["ll_above_best"] == 0
    assert wins["b"]["ll_above_pbp"] == 1 and wins["a"]["data_sets"] == 1
    assert wins["a"]["fit_minutes"] == pytest.approx(1.0)


def test_speed_reports_each_steps_peak_memory_beside_its_time(tmp_path):
    """Each hand-written step allocates its gradients afresh (``set_to_none``), so its peak
    is at least their size: P float32 weights for ``torch_map``, 2P (means and scales) for
    ``torch_bbb``; less 1 MiB for the kernel's per-CPU RSS counters (see test_memory)."""
    script = runpy.run_path(str(BENCHMARKS / "speed.py"), run_name="speed")
    (row,) = script["main"](["--repeats", "1", "--inner", "2", "--nets", "784-400-400-10",
                             "--out", str(tmp_path)])["rows"]
    weights_mib = sum(a * b + b for a, b in [(784, 400), (400, 400), (400, 10)]) * 4 / 2**20
    assert row["torch_map_mib"] >= weights_mib - 1
    assert row["torch_bbb_mib"] >= 2 * weights_mib - 1
    for step in script["STEPS"]:
        assert 0 <= row[f"{step}_mib"] < 1024 and row[f"{step}_ms"] > 0
    assert "zoo_bbb_lrt_jit_mib" in (tmp_path / "speed.md").read_text()


def test_replicas_reports_the_peak_memory_of_both_fits(tmp_path):
    script = runpy.run_path(str(BENCHMARKS / "replicas.py"), run_name="replicas")
    (row,) = script["main"](["--replicas", "2", "--steps", "3", "--repeats", "1", "--points",
                             "20", "--out", str(tmp_path)])
    # A fit builds a model, a guide and an optimiser, so it takes some memory; 1 GiB is
    # far above what 2 replicas of a 13-50-1 net on 20 points can take.
    assert 0 < row["one_fit_mib"] < 1024 and 0 < row["replicas_mib"] < 1024
    assert "replicas_mib" in (tmp_path / "replicas.md").read_text()


def test_replicas_keeps_the_rows_of_other_settings(tmp_path):
    # One run measures one setting: a run with another thread count adds its row, a rerun
    # of a setting replaces that setting's row.
    script = runpy.run_path(str(BENCHMARKS / "replicas.py"), run_name="replicas")
    threads = torch.get_num_threads()
    common = ["--replicas", "2", "--steps", "3", "--repeats", "1", "--points", "20",
              "--out", str(tmp_path)]
    try:
        script["main"]([*common, "--threads", "1"])
        second = script["main"]([*common, "--threads", "2"])[0]
        third = script["main"]([*common, "--threads", "1"])[0]
    finally:
        torch.set_num_threads(threads)
    summary = json.loads((tmp_path / "replicas.json").read_text())["summary"]
    assert [(row["threads"], row["allocator"]) for row in summary] == [(1, "default"),
                                                                        (2, "default")]
    assert summary[1]["replicas_s"] == second["replicas_s"]
    assert summary[0]["replicas_s"] == third["replicas_s"]  # replaced (2 rows), not added
