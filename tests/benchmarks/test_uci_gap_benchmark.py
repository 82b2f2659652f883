"""``benchmarks/uci.py --gap``: the UCI protocol on the gap splits, one per input dimension,
with its own tables and results folder."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest


@pytest.fixture
def uci_script(benchmark_script) -> dict:
    return benchmark_script("uci.py")


def test_gap_run_writes_its_tables_and_rewrites_them_from_the_cache(tmp_path, uci_data, uci_script):
    """A tiny ``--gap`` run of ``map`` on two dimensions of yacht writes one row per
    dimension, the summary over the dimensions (without published rows) and the coverage
    table; ``--cached-only`` on a fresh folder holding only the committed files rewrites
    the same rows without fitting."""
    argv = ["--gap", "--data", "yacht", "--splits", "2", "--entries", "map", "--steps", "10",
            "--num-samples", "5"]
    records = uci_script["main"]([*argv, "--out", str(tmp_path / "first")])
    assert [(r["data"], r["split"], r["status"]) for r in records] == [
        ("uci_gap/yacht", 0, "ok"), ("uci_gap/yacht", 1, "ok")]
    first = tmp_path / "first"
    with open(first / "uci_gap.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["entry"], r["dataset"], r["split"]) for r in rows] == [
        ("map", "yacht", "0"), ("map", "yacht", "1")]
    assert all(math.isfinite(float(r["ll"])) and 0 <= float(r["coverage_90"]) <= 1
               for r in rows)
    summary = (first / "uci_gap_summary.md").read_text()
    assert "### uci_gap/yacht" in summary and "| map | 2 |" in summary
    assert "published" not in summary
    (coverage,) = json.loads((first / "uci_gap_coverage.json").read_text())["summary"]
    values = [float(r["coverage_90"]) for r in rows]
    assert coverage["coverage_90"] == pytest.approx(sum(values) / 2)
    assert coverage["coverage_90_min"] == pytest.approx(min(values))
    assert not (first / "uci_summary.md").exists() and not (first / "uci_ll.png").exists()
    again = tmp_path / "again"
    again.mkdir()
    (again / "uci_gap_summary.json").write_text((first / "uci_gap_summary.json").read_text())
    rewritten = uci_script["main"]([*argv, "--out", str(again), "--cached-only"])
    assert [r["metrics"]["ll"] for r in rewritten] == [r["metrics"]["ll"] for r in records]


def test_gap_runs_default_to_their_own_results_folder(tmp_path, monkeypatch, uci_script):
    monkeypatch.chdir(tmp_path)
    parse = uci_script["parse_args"]
    assert parse(["--gap"]).out == Path("results/uci_gap")
    assert parse([]).out == Path("results/uci") and not parse([]).gap
    assert parse(["--gap", "--out", "elsewhere"]).out == Path("elsewhere")


def test_coverage_rows_by_hand(uci_script):
    """Per data set and entry: the mean and lowest coverage over the dimensions, how many
    fall below the floor (0.8) and whether the mean keeps to it; unfinished runs left out."""
    def run(entry: str, split: int, coverage: float, status: str = "ok") -> dict:
        return {"data": "uci_gap/energy", "entry": entry, "split": split, "status": status,
                "metrics": {"coverage_90": coverage}}

    records = [run("a", 0, 0.9), run("a", 1, 0.6), run("a", 2, 0.99), run("b", 0, 0.5),
               run("b", 1, 0.7), run("b", 2, 1.0, status="skipped")]
    rows = {r["entry"]: r for r in uci_script["coverage_rows"](records)}
    assert rows["a"]["coverage_90"] == pytest.approx(0.83)
    assert (rows["a"]["coverage_90_min"], rows["a"]["dims_below"], rows["a"]["keeps"]) == (
        0.6, 1, True)
    assert (rows["b"]["runs"], rows["b"]["dims_below"], rows["b"]["keeps"]) == (2, 2, False)
