"""Every script in ``benchmarks/`` runs with tiny flags, without the network, in a test
that checks the tables it writes; a script without such a test fails the suite (as Pyro's
``tests/test_examples.py`` does). Every script parses the shared flags, checked before any
work, and writes its tables through the harness's one table writer (Markdown, CSV and JSON
side by side)."""

from __future__ import annotations

import ast
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bnn_zoo._harness import tables
from bnn_zoo.methods import HeldOutNoise

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TESTS = Path(__file__).resolve().parents[1]
#: The benchmark scripts; ``reproduce.py`` runs them (``tests/benchmarks/test_reproduce.py``).
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "reproduce.py")

#: script -> (test file, test function) that runs it with tiny flags and checks its tables
TINY_RUNS: dict[str, tuple[str, str]] = {
    "bbb_priors.py": ("guides/test_bbb.py",
                      "test_bbb_priors_benchmark_runs_and_its_committed_table_shows_the_narrow_"
                      "prior_collapse"),
    "bundle_reference.py": ("harness/test_bundled.py",
                            "test_the_bundling_script_bundles_what_passes_the_gate"),
    "checkpoint.py": ("benchmarks/test_checkpoint.py",
                      "test_a_packed_sweep_resumes_from_a_fresh_cache"),
    "classification.py": ("guides/test_mean_field_clf.py", "test_classification_benchmark_script"),
    "fingerprints.py": ("benchmarks/test_fingerprints.py",
                        "test_check_passes_on_the_same_code_and_names_an_altered_digest"),
    "cnn.py": ("models/test_module_handlers.py", "test_cnn_benchmark_runs_and_writes_its_ratios"),
    "compare_guides.py": ("benchmarks/test_benchmarks.py",
                          "test_compare_guides_writes_a_row_per_entry"),
    "distributed_fit.py": ("benchmarks/test_scale_scripts.py",
                           "test_distributed_example_runs_as_one_process"),
    "gate_floor.py": ("benchmarks/test_benchmarks.py",
                      "test_gate_floor_fails_short_correlated_chains_and_passes_long_ones"),
    "gate_by_noise.py": ("benchmarks/test_benchmarks.py",
                         "test_gate_by_noise_ranks_each_splits_noise_against_its_gate"),
    "hmc_chains.py": ("benchmarks/test_benchmarks.py",
                      "test_hmc_chains_writes_the_time_of_each_chain_count_and_its_ratio"),
    "large_net.py": ("benchmarks/test_benchmarks.py",
                     "test_large_net_fits_the_scalable_entries_and_refuses_the_dense_one"),
    "laplace_cnn.py": ("benchmarks/test_benchmarks.py",
                       "test_laplace_cnn_writes_a_row_per_entry_and_the_reliability_diagrams"),
    "laplace_torch.py": ("benchmarks/test_laplace_torch_benchmark.py",
                         "test_tiny_run_writes_both_pipelines_scores_and_the_ratios"),
    "laplace_variants.py": ("methods/test_laplace.py",
                            "test_benchmark_script_runs_with_tiny_flags"),
    "loader.py": ("benchmarks/test_benchmarks.py",
                  "test_loader_benchmark_writes_the_times_and_ratios"),
    "mixture.py": ("guides/test_mixture.py", "test_benchmark_script_runs_with_tiny_flags"),
    "mixture_nuts.py": ("guides/test_mixture.py", "test_mixture_against_nuts_on_a_small_bnn_fast"),
    "moves.py": ("benchmarks/test_moves.py",
                 "test_main_reads_the_old_version_from_git_and_writes_its_tables"),
    "nngp.py": ("models/test_nngp.py", "test_benchmark_script_runs_with_tiny_flags"),
    "reference_noise.py": ("benchmarks/test_benchmarks.py",
                           "test_reference_noise_runs_every_noise_choice_and_gates_it"),
    "merge_comparisons.py": ("benchmarks/test_benchmarks.py",
                             "test_a_comparison_run_in_parts_merges_into_the_whole_run"),
    "reference_sampler.py": ("benchmarks/test_benchmarks.py",
                             "test_reference_sampler_changes_the_references_sampler_and_no_"
                             "other_entrys"),
    "replicas.py": ("benchmarks/test_benchmarks.py",
                    "test_replicas_reports_the_times_and_peak_memory"),
    "rff.py": ("models/test_rff.py", "test_benchmark_script_runs"),
    "scaling.py": ("benchmarks/test_benchmarks.py",
                   "test_scaling_writes_each_workers_time_memory_and_records"),
    "seed_spread.py": ("benchmarks/test_moves.py",
                       "test_seed_spread_fits_each_offset_and_writes_its_tables"),
    "speed.py": ("benchmarks/test_benchmarks.py",
                 "test_speed_reports_each_steps_time_and_peak_memory"),
    "throughput.py": ("benchmarks/test_scale_scripts.py",
                      "test_throughput_benchmark_writes_table_json_and_figure"),
    "uci.py": ("benchmarks/test_benchmarks.py",
               "test_uci_script_writes_the_tidy_runs_the_best_table_and_the_figure"),
}


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


def test_every_script_has_a_test_that_runs_it():
    """Each script is named, as a path or a module, in the test listed for it or in the
    module-level functions and constants that test uses (its fixtures, the script's path)."""
    missing = set(SCRIPTS) - set(TINY_RUNS)
    assert not missing, f"add a tiny run of {sorted(missing)} and list it in TINY_RUNS"
    for script, (test_file, test_name) in TINY_RUNS.items():
        module = ast.parse((TESTS / test_file).read_text())
        top = {}
        for node in module.body:
            if isinstance(node, (ast.FunctionDef, ast.Assign)):
                names = [node.name] if isinstance(node, ast.FunctionDef) else [
                    t.id for t in node.targets if isinstance(t, ast.Name)]
                top.update(dict.fromkeys(names, node))
        assert test_name in top, f"{test_file} has no {test_name} (listed for {script})"
        texts: set[str] = set()
        todo, seen = [test_name], set()
        while todo:  # the test, then what it names, then what those name
            node = top[todo.pop()]
            texts |= _strings(node)
            named = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if isinstance(node, ast.FunctionDef):
                named |= {a.arg for a in node.args.args}  # fixtures
            todo += [n for n in named & top.keys() - seen]
            seen |= named
        stem = script.removesuffix(".py")
        assert any(t == stem or t.endswith(script) for t in texts), (script, test_name)


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_checks_the_shared_flags_before_any_work(script, tmp_path, capsys,
                                                        benchmark_script):
    """``--threads 0``, a negative ``--seed`` and an ``--out`` under a file are each
    refused as argparse refuses a bad value (exit code 2, a line naming the flag) by the
    harness's parser, before anything runs or is written."""
    main = benchmark_script(script)["main"]
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    threads = torch.get_num_threads()
    for argv, flag in ((["--threads", "0"], "--threads"), (["--seed", "-1"], "--seed"),
                       (["--out", str(blocker / "out")], "--out")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2, (script, argv)
        assert flag in capsys.readouterr().err, (script, argv)
    assert torch.get_num_threads() == threads
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"]


def run_recording_tables(script: dict, argv: list[str], out: Path,
                         monkeypatch: pytest.MonkeyPatch):
    """Run ``script``'s ``main(argv)`` (its module as ``benchmark_script`` loads it) and
    check that every table file under ``out`` came through the harness's table writer,
    each Markdown table with its JSON and CSV; return what ``main`` returns."""
    written: list[Path] = []
    write = tables.write_text_atomic

    def recording(path, text):
        written.append(Path(path))
        return write(path, text)

    monkeypatch.setattr(tables, "write_text_atomic", recording)
    result = script["main"]([*argv, "--out", str(out)])
    files = {p for p in out.iterdir() if p.suffix in (".md", ".csv", ".json")}
    assert files and files <= set(written), sorted(files - set(written))
    for md in (p for p in files if p.suffix == ".md"):
        assert md.with_suffix(".json") in files, md
        assert any(p.suffix == ".csv" and p.stem.startswith(md.stem) for p in files), md
    return result


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_compare_guides_writes_a_row_per_entry(tmp_path, monkeypatch, benchmark_script):
    """One fitted run per (data, entry), its metrics in the CSV, the JSON and the Markdown."""
    out = tmp_path / "compare"
    run_recording_tables(benchmark_script("compare_guides.py"), [
        "--data", "sine", "--entries", "map", "mean_field", "--steps", "10",
        "--num-samples", "5", "--reference", "none"], out, monkeypatch)
    document = json.loads((out / "compare.json").read_text())
    assert [(r["entry"], r["status"]) for r in document["runs"]] == [("map", "ok"),
                                                                     ("mean_field", "ok")]
    rows = read_csv(out / "compare.csv")
    assert [(r["data"], r["entry"], r["runs"]) for r in rows] == [("sine", "map", "1"),
                                                                  ("sine", "mean_field", "1")]
    for row in rows:
        assert float(row["rmse"]) > 0 and math.isfinite(float(row["ll"]))
        assert 0 <= float(row["coverage_50"]) <= float(row["coverage_95"]) <= 1
        assert float(row["fit_seconds"]) > 0
    assert "| map |" in (out / "compare.md").read_text()
    assert (out / "bands_sine.png").stat().st_size > 0


def test_large_net_fits_the_scalable_entries_and_refuses_the_dense_one(
        tmp_path, monkeypatch, benchmark_script):
    """At width 8 the ResNet-18 has 175k weights: ``bbb`` fits and predicts, and
    ``laplace_full``'s guard refuses the 175k x 175k matrix (114 GiB) by name."""
    script = benchmark_script("large_net.py")
    assert sum(p.numel() for p in script["resnet18"]().parameters()) == 11_173_962
    rows = run_recording_tables(script, [
        "--entries", "bbb", "laplace_full", "--width", "8", "--n", "16", "--steps", "2",
        "--batch", "8", "--samples", "2"], tmp_path, monkeypatch)
    fitted, refused = rows
    assert fitted["outcome"] == "fit and predicted" and 0 <= fitted["accuracy"] <= 1
    assert fitted["peak_mb"] > 0 and fitted["weights"] == refused["weights"]
    assert refused["outcome"].startswith("refused: curvature='hessian' needs a dense")


def test_laplace_cnn_writes_a_row_per_entry_and_the_reliability_diagrams(
        tmp_path, monkeypatch, benchmark_script):
    """Each entry's metrics and tuned prior precisions over its splits, one run per split in
    the JSON, and a reliability diagram per entry."""
    out = tmp_path / "laplace_cnn"
    rows = run_recording_tables(benchmark_script("laplace_cnn.py"), [
        "--entries", "map", "laplace_last_layer", "--splits", "2", "--steps", "5"], out,
        monkeypatch)
    assert [(r["entry"], r["runs"]) for r in rows] == [("map", 2), ("laplace_last_layer", 2)]
    document = json.loads((out / "laplace_cnn.json").read_text())
    assert [(r["entry"], r["split"]) for r in document["runs"]] == [
        ("map", 0), ("map", 1), ("laplace_last_layer", 0), ("laplace_last_layer", 1)]
    last = rows[1]
    assert 0 <= last["accuracy"] <= 1 and 0 <= last["ece"] <= 1
    assert last["alpha_max"] > 0 and math.isnan(rows[0]["alpha_min"])
    assert (out / "reliability.png").stat().st_size > 0


def test_uci_script_writes_the_tidy_runs_the_best_table_and_the_figure(tmp_path, monkeypatch,
                                                                       uci_data, benchmark_script):
    """``uci.csv`` holds one row per (entry, data set, split) with the protocol's columns,
    a skipped run says why, and the best-entry table compares with the best published LL."""
    # mean_field_clf is classification-only: its runs on a regression set are skipped.
    run_recording_tables(benchmark_script("uci.py"),
                         ["--data", "yacht", "--splits", "2", "--entries", "map",
                          "mean_field_clf", "--steps", "10", "--num-samples", "5"],
                         tmp_path, monkeypatch)
    rows = read_csv(tmp_path / "uci.csv")
    assert [(r["entry"], r["dataset"], r["split"]) for r in rows] == [
        ("map", "yacht", "0"), ("map", "yacht", "1"), ("mean_field_clf", "yacht", "0"),
        ("mean_field_clf", "yacht", "1")]
    for row in rows[:2]:
        assert row["status"] == "ok" and math.isfinite(float(row["ll"]))
        assert float(row["rmse"]) > 0 and 0 <= float(row["coverage_90"]) <= 1
        assert float(row["fit_seconds"]) > 0
    assert rows[2]["status"] == "skipped" and "not 'regression'" in rows[2]["reason"]
    assert "not 'regression'" in (tmp_path / "uci_summary.md").read_text()  # the hole says why
    best = (tmp_path / "uci_best.md").read_text()
    assert "| uci/yacht | map | 2 |" in best and "deep ensembles" in best
    assert (tmp_path / "uci_ll.png").stat().st_size > 0


def test_uci_script_writes_the_distances_to_a_reference(tmp_path, uci_data, benchmark_script):
    """``--reference`` writes ``reference.json`` as ``compare`` does: per split and over the
    splits, each entry's W1 and W2 distances and LL gap to the reference (0 for the
    reference)."""
    script = benchmark_script("uci.py")
    script["main"](["--data", "yacht", "--splits", "2", "--entries", "map", "mean_field",
                    "--steps", "10", "--num-samples", "5", "--reference", "map",
                    "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "reference.json").read_text())["summary"]
    over = {r["entry"]: r for r in rows if r["split"] == "all"}
    assert over["map"]["w2_to_ref"] == 0 and over["map"]["ll_gap"] == 0
    assert over["map"]["w1_to_ref"] == 0
    assert over["mean_field"]["w2_to_ref"] > 0 and over["mean_field"]["runs"] == 2
    assert over["mean_field"]["w1_to_ref"] > 0
    ranked = json.loads((tmp_path / "fidelity.json").read_text())["summary"]
    assert [(r["entry"], r["rank"], r["runs"]) for r in ranked] == [("mean_field", 1, 2)]
    assert (tmp_path / "fidelity.png").stat().st_size > 0
    assert {r["split"] for r in rows if r["entry"] == "mean_field"} == {0, 1, "all"}


def test_uci_script_in_two_workers_writes_what_one_process_writes(tmp_path, uci_data,
                                                                  benchmark_script):
    """``--jobs 2`` fits the (entry, data set) batches on a local Dask cluster of two
    processes (run as a user runs the script) and writes exactly the rows of a run in one
    process, in the order of ``--data``."""
    pytest.importorskip("distributed")
    args = ["--data", "yacht", "bostonHousing", "--splits", "1", "--entries", "map", "--steps",
            "10", "--num-samples", "5"]
    benchmark_script("uci.py")["main"](
        [*args, "--out", str(tmp_path / "one")])
    subprocess.run([sys.executable, str(BENCHMARKS / "uci.py"), *args, "--jobs", "2", "--out",
                    str(tmp_path / "two")], check=True, capture_output=True)
    rows = {folder: [(r["entry"], r["dataset"], r["split"], r["status"], float(r["ll"]))
                     for r in read_csv(tmp_path / folder / "uci.csv")] for folder in ("one", "two")}
    assert [r[:4] for r in rows["two"]] == [("map", "yacht", "0", "ok"),
                                           ("map", "bostonHousing", "0", "ok")]
    assert [r[:4] for r in rows["one"]] == [r[:4] for r in rows["two"]]
    assert [r[4] for r in rows["two"]] == [r[4] for r in rows["one"]]


def test_scaling_writes_each_workers_time_memory_and_records(tmp_path, benchmark_script):
    """``--tiny`` on two workers: a row with the fits, a wall time, the peak memory of each
    worker and the records equal to the baseline's (itself), the figure; the speed-up and
    efficiency of a second count by hand."""
    pytest.importorskip("distributed")
    script = benchmark_script("scaling.py")
    (row,) = script["main"](["--tiny", "--workers", "2", "--out", str(tmp_path)])
    assert (row["workers"], row["fits"], row["speedup"], row["same_records"]) == (2, 4, 1.0, True)
    assert len(row["peak_rss_mib_each"]) == 2 and row["peak_rss_mib"] > 50  # torch alone
    assert json.loads((tmp_path / "scaling.json").read_text())["summary"][0]["workers"] == 2
    assert (tmp_path / "scaling.png").stat().st_size > 0
    record = {"entry": "map", "data": "sine", "split": 0, "status": "ok",
              "metrics": {"ll": -1.0, "fit_seconds": 3.0}}
    faster = {"entry": "map", "data": "sine", "split": 0, "status": "ok",
              "metrics": {"ll": -1.0, "fit_seconds": 1.0}}
    rows = script["rows_of"]({1: (12.0, [300.0], [record]), 4: (4.0, [310.0, 320.0], [faster])})
    assert (rows[1]["speedup"], rows[1]["efficiency"], rows[1]["peak_rss_mib"]) == (3.0, 0.75,
                                                                                   320.0)
    assert rows[1]["same_records"]  # timings aside
    moved = {**faster, "metrics": {"ll": -1.1}}
    assert not script["rows_of"]({1: (1.0, [1.0], [record]), 2: (1.0, [1.0], [moved])})[1][
        "same_records"]


def test_uci_script_refuses_jobs_below_one(tmp_path, capsys, benchmark_script):
    script = benchmark_script("uci.py")
    with pytest.raises(SystemExit):
        script["main"](["--jobs", "0", "--out", str(tmp_path)])
    assert "--jobs" in capsys.readouterr().err


def test_uci_best_published_and_wins_by_hand(benchmark_script):
    script = benchmark_script("uci.py")
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


def test_uci_entries_of_published_methods_against_their_numbers_by_hand(benchmark_script):
    """MC dropout published -1.55 +- 0.03 on yacht: -1.57 reaches it within the standard
    error, -1.59 does not; entries of no published method get no row."""
    script = benchmark_script("uci.py")
    summary = [{"data": "uci/yacht", "entry": "mc_dropout", "runs": 20, "ll": ll, "ll_se": 0.1}
               for ll in (-1.57, -1.59)]
    summary.append({"data": "uci/yacht", "entry": "map", "runs": 20, "ll": 0.0, "ll_se": 0.1})
    rows = script["method_rows"](summary)
    assert [(r["entry"], r["published"], r["published_ll"], r["reaches"]) for r in rows] == [
        ("mc_dropout", "MC dropout", -1.55, True), ("mc_dropout", "MC dropout", -1.55, False)]


def test_speed_summarises_runs_by_medians_and_the_spread_of_each_ratio(benchmark_script):
    runs = [{"a_ms": 1.0, "zoo_vs_hand": 1.2, "zoo_jit_vs_hand": 1.0, "zoo_lrt_jit_vs_hand": r}
            for r in (0.9, 1.1, 1.0)]
    row = benchmark_script("speed.py")["summary"]("13-50-1", runs)
    assert (row["net"], row["batch"], row["runs"], row["a_ms"]) == ("13-50-1", 100, 3, 1.0)
    assert (row["zoo_lrt_jit_vs_hand"], row["zoo_lrt_jit_vs_hand_min"],
            row["zoo_lrt_jit_vs_hand_max"]) == (1.0, 0.9, 1.1)


def test_speed_reports_each_steps_time_and_peak_memory(tmp_path, monkeypatch, benchmark_script):
    """One row per net: every step's time and its ratios to the plain MAP step and to the
    hand-written step of the same estimator, as computed from those times, in the CSV
    and JSON too. Each hand-written step allocates its gradients afresh
    (``set_to_none``), so its peak is at least their size: P float32 weights for
    ``torch_map``, 2P (means and scales) for ``torch_bbb``; less 1 MiB for the kernel's
    per-CPU RSS counters (see test_memory)."""
    script = benchmark_script("speed.py")
    (row,) = run_recording_tables(script, ["--repeats", "1", "--inner", "2", "--nets",
                                           "784-400-400-10"], tmp_path, monkeypatch)["rows"]
    weights_mib = sum(a * b + b for a, b in [(784, 400), (400, 400), (400, 10)]) * 4 / 2**20
    assert row["torch_map_mib"] >= weights_mib - 1
    assert row["torch_bbb_mib"] >= 2 * weights_mib - 1
    for step in script["STEPS"]:
        assert 0 <= row[f"{step}_mib"] < 1024 and row[f"{step}_ms"] > 0
        assert row[f"{step}_per_map"] == pytest.approx(row[f"{step}_ms"] / row["torch_map_ms"])
    for ratio, zoo_step in script["RATIOS"].items():
        hand = script["LIKE"][zoo_step]
        assert row[ratio] == pytest.approx(row[f"{zoo_step}_ms"] / row[f"{hand}_ms"])
        assert row[f"{ratio}_min"] == row[ratio] == row[f"{ratio}_max"]  # one run
    assert row["runs"] == 1
    (saved,) = json.loads((tmp_path / "speed.json").read_text())["summary"]
    assert saved == pytest.approx(row)
    (line,) = read_csv(tmp_path / "speed.csv")
    assert {k: float(v) for k, v in line.items() if k != "net"} == pytest.approx(
        {k: v for k, v in row.items() if k != "net"})
    assert "zoo_bbb_lrt_jit_mib" in (tmp_path / "speed.md").read_text()
    assert (tmp_path / "speed.png").stat().st_size > 0


def test_replicas_reports_the_times_and_peak_memory(tmp_path, monkeypatch, benchmark_script):
    """The row of the setting run: both fits' times, their ratio and speed-up as computed
    from them, and both fits' peak memory, the same in the JSON and the CSV."""
    (row,) = run_recording_tables(benchmark_script("replicas.py"),
                                  ["--replicas", "2", "--steps", "3", "--repeats", "1",
                                   "--points", "20"], tmp_path, monkeypatch)
    assert (row["entry"], row["replicas"], row["steps"], row["device"]) == ("bbb", 2, 3, "cpu")
    assert row["one_fit_s"] > 0 and row["replicas_s"] > 0 and row["hand_step_ratio"] > 0
    assert row["ratio"] == pytest.approx(row["replicas_s"] / row["one_fit_s"])
    assert row["speedup_vs_one_by_one"] == pytest.approx(2 / row["ratio"])
    # A fit builds a model, a guide and an optimiser, so it takes some memory; 1 GiB is
    # far above what 2 replicas of a 13-50-1 net on 20 points can take.
    assert 0 < row["one_fit_mib"] < 1024 and 0 < row["replicas_mib"] < 1024
    assert json.loads((tmp_path / "replicas.json").read_text())["summary"] == [row]
    (line,) = read_csv(tmp_path / "replicas.csv")
    assert set(line) == set(row)
    assert float(line["replicas_mib"]) == pytest.approx(row["replicas_mib"])
    assert "replicas_mib" in (tmp_path / "replicas.md").read_text()


def _replicas_setting(benchmark_script, out):
    """A tiny run of ``replicas.py`` into ``out`` at a thread count (torch's count restored
    after): the row it measured."""
    script = benchmark_script("replicas.py")

    def run(threads: int) -> dict:
        saved = torch.get_num_threads()
        try:
            return script["main"](["--replicas", "2", "--steps", "3", "--repeats", "1",
                                   "--points", "20", "--out", str(out),
                                   "--threads", str(threads)])[0]
        finally:
            torch.set_num_threads(saved)
    return run


def test_replicas_keeps_the_rows_of_other_settings(tmp_path, benchmark_script):
    # One run measures one setting: a run with another thread count adds its row, a rerun
    # of a setting replaces that setting's row.
    run = _replicas_setting(benchmark_script, tmp_path)
    run(1)
    second = run(2)
    third = run(1)
    summary = json.loads((tmp_path / "replicas.json").read_text())["summary"]
    assert [(row["threads"], row["allocator"]) for row in summary] == [(1, "default"),
                                                                        (2, "default")]
    assert summary[1]["replicas_s"] == second["replicas_s"]
    assert summary[0]["replicas_s"] == third["replicas_s"]  # replaced (2 rows), not added


def test_replicas_names_the_code_of_every_row_it_keeps(tmp_path, benchmark_script):
    # A row kept from a file of other code, which names its code only in the file's
    # provenance (as files did before rows named it), keeps that code: the table's line
    # and provenance name both versions, and the file is stale, not passed off as this
    # run's.
    from bnn_zoo._harness.provenance import code_version
    from bnn_zoo._harness.stale import stale_files

    run = _replicas_setting(benchmark_script, tmp_path)
    path = tmp_path / "replicas.json"
    run(1)
    document = json.loads(path.read_text())
    for column in ("code", "commit", "machine"):
        del document["summary"][0][column]
    document["provenance"] = {"code": ["0123456789ab"], "commit": ["abc1234"],
                              "machine": ["an older machine"]}
    path.write_text(json.dumps(document))
    run(2)
    document = json.loads(path.read_text())
    kept, measured = document["summary"]
    assert (kept["code"], kept["commit"], kept["machine"]) == (
        "0123456789ab", "abc1234", "an older machine")
    assert measured["code"] == code_version()
    assert document["provenance"]["code"] == sorted(["0123456789ab", code_version()])
    assert document["provenance"]["process"]["code"] == code_version()  # torch, date, ...
    assert "0123456789ab" in (tmp_path / "replicas.md").read_text()
    assert [row["file"] for row in stale_files([path])] == [str(path)]


def test_loader_benchmark_writes_the_times_and_ratios(tmp_path, monkeypatch, benchmark_script):
    """A tiny run: one row, each loader's ratio its time over the tensors' fit, in the
    JSON too."""
    (row,) = run_recording_tables(benchmark_script("loader.py"),
                                  ["--points", "64", "--batch", "16", "--epochs", "1",
                                   "--repeats", "1"], tmp_path, monkeypatch)["rows"]
    for kind in ("dataloader", "batch_sampler"):
        assert row[f"{kind}_ratio"] == pytest.approx(row[f"{kind}_s"] / row["tensors_s"])
    (saved,) = json.loads((tmp_path / "loader.json").read_text())["summary"]
    assert saved == pytest.approx(row)


def test_reference_noise_runs_every_noise_choice_and_gates_it(tmp_path, benchmark_script):
    """Each of the four noise choices fits ``hmc`` on the split and is judged by the gate (2
    chains: never a pass); only the fixed choices report one noise scale."""
    runs = benchmark_script("reference_noise.py")["main"](
        ["--data", "sine", "--splits", "1", "--warmup", "4", "--samples", "4", "--chains", "2",
         "--steps", "5", "--out", str(tmp_path)])
    assert [r["noise"] for r in runs] == ["map", "held_out", "sampled", "heteroscedastic"]
    assert all("chains 2 < 4" in r["gates"] for r in runs)
    assert [math.isnan(r["noise_scale"]) for r in runs] == [False, False, True, True]
    assert runs[0]["noise_scale"] != runs[1]["noise_scale"]
    summary = json.loads((tmp_path / "reference_noise.json").read_text())["summary"]
    assert [(r["noise"], r["gates"]) for r in summary] == [
        ("map", "0/1 pass"), ("held_out", "0/1 pass"), ("sampled", "0/1 pass"),
        ("heteroscedastic", "0/1 pass")]


def test_reference_sampler_changes_the_references_sampler_and_no_other_entrys(
        tmp_path, benchmark_script):
    """The sampler flags reach ``hmc``'s method options on every split, never ``map``'s; the
    comparison and the reference's gates are written (no fidelity table: no split passes);
    a comparison without a reference is refused."""
    script = benchmark_script("reference_sampler.py")
    records = script["main"](["--data", "sine", "--splits", "2", "--warmup", "4", "--samples",
                              "6", "--chains", "2", "--steps", "5", "--num-samples", "5",
                              "--out", str(tmp_path)])
    options = {(r["entry"], r["split"]): r["settings"]["overrides"].get("method_options")
               for r in records}
    assert options == {("hmc", 0): {"warmup": 4, "samples": 6, "chains": 2},
                       ("hmc", 1): {"warmup": 4, "samples": 6, "chains": 2},
                       ("map", 0): None, ("map", 1): None}
    gates = {r["split"]: r["gates"] for r in json.loads(
        (tmp_path / "reference.json").read_text())["summary"] if r["entry"] == "hmc"}
    assert gates.pop("all") == "0/2 pass"  # the two chains asked for fail the gate
    assert sorted(gates) == [0, 1] and all(g.startswith("chains 2 < 4") for g in gates.values())
    assert (tmp_path / "compare.json").is_file() and (tmp_path / "reference.md").is_file()
    with pytest.raises(SystemExit):
        script["main"](["--data", "sine", "--reference", "none", "--out", str(tmp_path)])


def test_a_comparison_run_in_parts_merges_into_the_whole_run(tmp_path, benchmark_script):
    """Splits 0 and 1 run as two parts (``--split-ids``) and merged give the tables of the run
    of both at once: each entry's metrics and distances to the reference, its speed aside
    (each part fitted its own); parts that share a split, differ in their settings or were
    fitted with another seed are refused."""
    sampler, merge = (benchmark_script(s)["main"] for s in ("reference_sampler.py",
                                                             "merge_comparisons.py"))
    tiny = ["--data", "sine", "--entries", "mean_field", "--reference", "map", "--steps", "5",
            "--num-samples", "5", "--replicas", "off"]
    for name, splits in [("whole", ["--splits", "2"]), ("part0", ["--split-ids", "0"]),
                         ("part1", ["--split-ids", "1"])]:
        sampler([*tiny, *splits, "--out", str(tmp_path / name)])
    merge([str(tmp_path / "part0"), str(tmp_path / "part1"), "--out", str(tmp_path / "merged"),
           "--reference", "map"])

    def rows(folder: str, table: str) -> list[dict]:
        summary = json.loads((tmp_path / folder / f"{table}.json").read_text())["summary"]
        speed = ("fit_seconds", "steps_per_second", "commit")
        return [{k: v for k, v in row.items() if not k.startswith(speed)} for row in summary]

    for table in ("compare", "reference", "fidelity"):
        assert rows("merged", table) == rows("whole", table)
    assert {r["entry"]: r["runs"] for r in rows("merged", "compare")} == {"map": 2,
                                                                         "mean_field": 2}
    assert rows("merged", "fidelity")[0]["w1_to_ref"] > 0
    with pytest.raises(SystemExit):  # fitted with seeds 0 and 1, not 1 and 2
        merge([str(tmp_path / "part0"), str(tmp_path / "part1"), "--seed", "1", "--out",
               str(tmp_path / "x")])
    with pytest.raises(SystemExit):  # split 0 twice
        merge([str(tmp_path / "part0"), str(tmp_path / "whole"), "--out", str(tmp_path / "x")])
    sampler([*tiny, "--split-ids", "1", "--num-samples", "6", "--out", str(tmp_path / "other")])
    with pytest.raises(SystemExit):  # 5 predictive samples against 6
        merge([str(tmp_path / "part0"), str(tmp_path / "other"), "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        sampler([*tiny, "--split-ids", "1", "1", "--out", str(tmp_path / "x")])


def _reference_folder(folder: Path, data: str,
                      splits: dict[int, tuple[float | None, float]]) -> Path:
    """A comparison's folder whose ``compare.json`` keeps ``hmc`` runs on ``data``: split k
    with the noise scale (``None``: none kept, as a classifier's) and the R-hat over the
    test predictive of ``splits[k]``."""
    runs = [{"entry": "hmc", "data": data, "split": k, "status": "ok", "metrics": {"ll": -1.0},
             "provenance": {"code": "c0de", "commit": "abc1234", "cpu": "a CPU"},
             "diagnostics": {"chains": 8.0, "ess_pred_min": 1000.0, "leapfrog_steps": 100.0,
                             "r_hat_pred_max": r_hat,
                             **({} if noise is None else {"noise_scale": noise})}}
            for k, (noise, r_hat) in splits.items()]
    folder.mkdir()
    (folder / "compare.json").write_text(json.dumps({"summary": [], "runs": runs}))
    return folder


def test_gate_by_noise_ranks_each_splits_noise_against_its_gate(tmp_path, benchmark_script):
    """Each split's noise is ranked within its data set (1: the smallest) beside its gate;
    per set, the failing splits' noise ranks and Spearman's correlation between noise and
    R-hat (-1 where R-hat falls as the noise grows, whatever the values); a split held
    twice, or runs that keep no noise (a classifier's), are refused."""
    main = benchmark_script("gate_by_noise.py")["main"]
    falls = _reference_folder(tmp_path / "a", "uci/a", {0: (0.3, 1.002), 1: (0.1, 1.05),
                                                       2: (0.2, 1.005)})
    rises = _reference_folder(tmp_path / "b", "uci/b", {3: (1.0, 1.001), 4: (2.0, 1.02)})
    rows = main([str(falls), str(rises), "--out", str(tmp_path / "out")])
    assert [(r["split"], r["noise_rank"], r["gates"]) for r in rows] == [
        (0, 3, "pass"), (1, 1, "R-hat 1.0500 > 1.01"), (2, 2, "pass"), (3, 1, "pass"),
        (4, 2, "R-hat 1.0200 > 1.01")]
    sets = json.loads((tmp_path / "out" / "gate_by_noise_sets.json").read_text())["summary"]
    assert [(s["data"], s["splits"], s["passing"], s["failing_noise_ranks"]) for s in sets] == [
        ("uci/a", 3, 2, "1"), ("uci/b", 2, 1, "2")]
    assert [s["spearman_noise_r_hat"] for s in sets] == pytest.approx([-1.0, 1.0])
    assert (tmp_path / "out" / "gate_by_noise.png").stat().st_size > 0
    twice = _reference_folder(tmp_path / "c", "uci/a", {2: (0.5, 1.0)})
    classifier = _reference_folder(tmp_path / "d", "wine", {0: (None, 1.0)})
    for folders in ([falls, twice], [classifier]):
        with pytest.raises(SystemExit):
            main([*map(str, folders), "--out", str(tmp_path / "x")])


def test_reference_noise_fits_the_chosen_noise_with_the_chosen_sampler(tmp_path, monkeypatch,
                                                                       benchmark_script):
    """``--noise`` fits only the named choices; ``--max-leapfrog`` reaches the sampler, whose
    leapfrog steps per draw the rows report."""
    from bnn_zoo import zoo

    entry_type, seen = type(zoo.get("hmc")), []
    original = entry_type.fit

    def spy(self, *args, **kwargs):
        seen.append(kwargs["method_options"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(entry_type, "fit", spy)
    runs = benchmark_script("reference_noise.py")["main"](
        ["--data", "sine", "--splits", "1", "--warmup", "4", "--samples", "4", "--chains", "2",
         "--steps", "5", "--noise", "held_out", "--max-leapfrog", "3", "--out", str(tmp_path)])
    assert [r["noise"] for r in runs] == ["held_out"]
    assert seen[0]["max_leapfrog"] == 3 and isinstance(seen[0]["noise"], HeldOutNoise)
    assert 1 <= runs[0]["leapfrog_steps"] <= 3


def test_gate_floor_fails_short_correlated_chains_and_passes_long_ones(tmp_path,
                                                                      benchmark_script):
    """Chains of ESS 0.02 per draw (20 effective draws a chain) fail the gate at every
    repeat, independent draws (2000 a chain) pass it at every one; the chains are AR(1)
    with unit variance and lag-one correlation ``rho`` within 5 standard errors."""
    script = benchmark_script("gate_floor.py")
    rows = script["main"](["--chains", "4", "--draws", "1000", "--ess-per-draw", "0.02", "1",
                           "--points", "20", "--repeats", "3", "--out", str(tmp_path)])
    assert [(r["ess_per_draw"], r["fails_gate"]) for r in rows] == [(0.02, 1.0), (1.0, 0.0)]
    x = script["stationary_chains"](4, 20000, 1, 1 / 3, torch.Generator().manual_seed(0))
    rho, ess = 0.5, 4 * 20000 / 3
    assert abs(float(x.var()) - 1) < 5 * math.sqrt(2 / ess)
    lag = float((x[:, 1:] * x[:, :-1]).mean())
    assert abs(lag - rho) < 5 * math.sqrt(2 / ess)
    assert (tmp_path / "gate_floor.json").exists()


def test_hmc_chains_writes_the_time_of_each_chain_count_and_its_ratio(tmp_path,
                                                                      benchmark_script):
    rows = benchmark_script("hmc_chains.py")["main"](
        ["--chains", "3", "--points", "20", "--repeats", "1", "--inner", "1",
         "--out", str(tmp_path)])
    assert [(r["chains"], r["potential"]) for r in rows] == [
        (1, "compiled"), (1, "eager"), (3, "compiled"), (3, "eager")]
    compiled, eager = rows[2], rows[3]
    assert rows[0]["ratio"] == 1.0 and compiled["ratio"] == compiled["ms"] / rows[0]["ms"]
    assert eager["ratio"] == eager["ms"] / rows[1]["ms"]
    assert compiled["per_chain_ms"] == pytest.approx(compiled["ms"] / 3)
    assert compiled["speedup"] == eager["speedup"] == eager["ms"] / compiled["ms"]
    summary = json.loads((tmp_path / "hmc_chains.json").read_text())["summary"]
    assert sorted((r["chains"], r["potential"]) for r in summary) == [
        (1, "compiled"), (1, "eager"), (3, "compiled"), (3, "eager")]
