"""The committed tables are what today's summary code makes of the committed runs, byte for
byte: each results file's ``"runs"`` summarised again give its Markdown, CSV and JSON."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from bnn_zoo._core.files import read_json
from bnn_zoo._harness import compare
from bnn_zoo._harness.summary import summarise

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
SUFFIXES = (".md", ".csv", ".json")


def _records(path: Path, task: str) -> list[dict]:
    """The runs kept in ``path`` as the records a comparison summarises (a run that
    finished has no ``reason``)."""
    return [{**{k: v for k, v in run.items() if not (k == "reason" and v is None)},
             "task": task} for run in read_json(path)["runs"]]


def _assert_same(written: Path, committed: Path, names: list[str]) -> None:
    for name in names:
        for suffix in SUFFIXES:
            assert (written / f"{name}{suffix}").read_bytes() == (
                committed / f"{name}{suffix}").read_bytes(), f"{committed.name}/{name}{suffix}"


@pytest.mark.parametrize("folder", ["compare", "sine_reference", "classification_reference",
                                    "bbb_sine"])
def test_a_comparison_regenerates(tmp_path, folder):
    committed = RESULTS / folder
    task = read_json(committed / "compare.json")["summary"][0]["task"]
    compare.write_comparison(_records(committed / "compare.json", task), tmp_path)
    _assert_same(tmp_path, committed, ["compare"])


def test_the_classification_tables_regenerate(tmp_path, benchmark_script):
    script = benchmark_script("classification.py")
    committed = RESULTS / "classification"
    compare.write_comparison(_records(committed / "classification.json", "classification"),
                             tmp_path, name="classification", columns=script["COLUMNS"],
                             section=None)
    _assert_same(tmp_path, committed, ["classification"])


def test_the_uci_tables_regenerate(tmp_path, benchmark_script):
    uci = benchmark_script("uci.py")
    committed = RESULTS / "uci"
    records = _records(committed / "uci_summary.json", "regression")
    measured = {r["data"] for r in records}
    compare.write_comparison(
        records, tmp_path, name="uci_summary", reference=None, columns=uci["COLUMNS"],
        markdown_rows=[r for r in uci["published_rows"]() if r["data"] in measured])
    with contextlib.redirect_stdout(io.StringIO()):
        uci["write_standard_tables"](summarise(records), tmp_path)
    _assert_same(tmp_path, committed, ["uci_summary", "uci_best", "uci_wins", "uci_methods"])


def test_the_uci_gap_coverage_regenerates(tmp_path, benchmark_script):
    uci = benchmark_script("uci.py")
    committed = RESULTS / "uci_gap"
    with contextlib.redirect_stdout(io.StringIO()):
        uci["write_gap_tables"](_records(committed / "uci_gap_summary.json", "regression"),
                                tmp_path)
    _assert_same(tmp_path, committed, ["uci_gap_coverage"])
