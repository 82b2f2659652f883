"""Results as data: ``bnn_zoo.results.load`` reads a results folder or file into a
DataFrame, a run per row."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bnn_zoo import results
from bnn_zoo._core.files import read_json

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def test_a_comparison_folder_loads_a_run_per_row_with_its_provenance():
    runs = results.load(RESULTS / "compare")
    kept = read_json(RESULTS / "compare" / "compare.json")["runs"]
    assert len(runs) == len(kept)
    assert {"file", "entry", "data", "split", "seed", "status", "ll", "rmse", "code", "commit",
            "torch", "device", "threads", "num_samples"} <= set(runs.columns)
    assert set(runs["file"]) == {"compare.json"}
    first = kept[0]
    row = runs.iloc[0]
    assert row["ll"] == first["metrics"]["ll"]
    assert row["torch"] == first["provenance"]["torch"]
    assert row["code"] == first["settings"]["code"]
    for name, value in first["diagnostics"].items():
        assert row[f"diag_{name}"] == value


def test_the_runs_give_the_committed_means():
    runs = results.load(RESULTS / "classification" / "classification.json")
    summary = read_json(RESULTS / "classification" / "classification.json")["summary"]
    means = runs[runs["status"] == "ok"].groupby(["data", "entry"])["accuracy"].mean()
    for row in summary:
        if row["runs"]:
            assert math.isclose(means[(row["data"], row["entry"])], row["accuracy"],
                                rel_tol=1e-12)


def test_a_folder_of_tables_without_runs_loads_their_rows(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"summary": [{"k": 1, "v": 2.0}]}))
    (tmp_path / "b.json").write_text(json.dumps({"sweep": [{"w": 3}], "tails": [{"t": 4}]}))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "cached.json").write_text("not read")
    rows = results.load(tmp_path)
    assert list(rows["file"]) == ["a.json", "b.json", "b.json"]
    assert rows["v"].iloc[0] == 2.0
    assert list(rows["table"].iloc[1:]) == ["sweep", "tails"]
    assert list(rows["w"].iloc[1:2]) == [3]


def test_where_a_file_keeps_runs_only_runs_are_rows(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"summary": [{"data": "d", "runs": 2}]}))
    runs = [{"entry": "map", "data": "d", "split": s, "status": "ok", "metrics": {"ll": s}}
            for s in range(2)]
    (tmp_path / "compare.json").write_text(json.dumps({"runs": runs}))
    loaded = results.load(tmp_path)
    assert list(loaded["split"]) == [0, 1] and list(loaded["ll"]) == [0, 1]
    assert set(loaded["file"]) == {"compare.json"}
    assert set(loaded["code"]) == {"unknown"}


def test_the_parts_of_a_merged_comparison_are_read_once(tmp_path):
    """A comparison run in two parts and merged keeps all its runs in the merged file; the
    parts' files give no rows, while a part loaded on its own gives its runs."""
    runs = [{"entry": "hmc", "data": "d", "split": s, "status": "ok", "metrics": {"ll": s}}
            for s in range(4)]
    (tmp_path / "compare.json").write_text(json.dumps({"runs": runs}))
    for name, part in (("0-1", runs[:2]), ("2-3", runs[2:])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "compare.json").write_text(json.dumps({"runs": part}))
    loaded = results.load(tmp_path)
    assert list(loaded["split"]) == [0, 1, 2, 3]
    assert set(loaded["file"]) == {"compare.json"}
    assert list(results.load(tmp_path / "2-3")["split"]) == [2, 3]


def test_the_committed_results_load_as_one_table():
    """Every committed results file reads, a merged reference's runs once, and the runs of
    ``fingerprints.json``, whose ``metrics`` is a list of rows, as flat runs."""
    loaded = results.load(RESULTS)
    digits = loaded[loaded["file"].str.startswith("reference_digits/")]
    assert set(digits["file"]) == {"reference_digits/compare.json"}
    assert not digits.duplicated(["entry", "split"]).any()
    kept = read_json(RESULTS / "fingerprints" / "fingerprints.json")["runs"]
    fingerprints = loaded[loaded["file"] == "fingerprints/fingerprints.json"]
    assert len(fingerprints) == len(kept)
    assert [m for m in fingerprints["metrics"] if isinstance(m, list)] == [
        run["metrics"] for run in kept if run.get("metrics") is not None]


@pytest.mark.parametrize("text", ["{\"runs\": [", ""])
def test_a_file_that_cannot_be_read_is_named(tmp_path, text):
    (tmp_path / "broken.json").write_text(text)
    with pytest.raises(ValueError, match="broken.json"):
        results.load(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        results.load(tmp_path / "missing")
