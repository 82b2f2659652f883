"""Results as data: the runs kept in a results folder or file as a pandas DataFrame.

A comparison keeps every run it summarises in its results JSON file, under ``"runs"``
(`bnn_zoo._harness.compare.write_comparison`: every ``compare.json``,
``uci_summary.json``, ``classification.json`` of ``benchmarks/results/``); the other
scripts of ``benchmarks/`` keep their runs there as flat rows, or only their summary rows.
[`load`][bnn_zoo.results.load] reads them into one table, a run per row:

    from bnn_zoo import results
    runs = results.load("benchmarks/results/uci")
    runs.groupby(["data", "entry"])["ll"].agg(["mean", "sem", "count"])
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from bnn_zoo._core.files import read_json
from bnn_zoo._harness.provenance import run_columns
from bnn_zoo._harness.runs import results_jsons

__all__ = ["load", "run_row"]

#: The fields of a run record spread into columns of their own (see `run_row`).
NESTED = ("metrics", "diagnostics", "settings", "provenance")


def _with(row: Mapping, origin: Mapping | None) -> dict:
    """``row`` and the fields of ``origin`` it lacks."""
    return {**row, **{k: v for k, v in (origin or {}).items() if k not in row}}


def run_row(run: Mapping, origin: Mapping | None = None) -> dict:
    """One run record as a flat row: its own fields (``entry``, ``data``, ``split``,
    ``seed``, ``status``, ``reason``...), then its metrics under their names, its
    diagnostics as ``diag_<name>``, its settings (``num_samples``, ``dtype``, ``overrides``...)
    and its provenance (``version``, ``torch``, ``pyro``, ``device``, ``threads``,
    ``date``...), with ``code`` and ``commit`` as the tables show them
    (`bnn_zoo._harness.provenance.run_columns`). A flat run (as the benchmark
    scripts keep them) keeps its fields. ``origin``: the provenance of the process that
    wrote the file, for runs that keep none of their own. A run whose `NESTED` fields are
    not mappings (``metrics`` a list of rows, as ``benchmarks/fingerprints.py`` keeps them)
    is a flat run."""
    if not any(isinstance(run.get(key), Mapping) for key in NESTED):
        return _with(run, origin)
    provenance = run.get("provenance") or origin or {}
    row = {k: v for k, v in run.items() if k not in NESTED}
    row.update(run.get("metrics") or {})
    row.update({f"diag_{k}": v for k, v in (run.get("diagnostics") or {}).items()})
    row.update({k: v for k, v in (run.get("settings") or {}).items() if k != "code"})
    row.update({k: v for k, v in provenance.items() if k not in ("code", "commit", "dirty")})
    return {**row, **run_columns({**run, "provenance": provenance})}


def _rows(path: Path) -> tuple[bool, list[dict]]:
    """Whether the results file ``path`` keeps runs, and its rows: its runs, else its
    summary rows, else the rows of each table of a group (``table``: its key); no rows
    for a file of another kind."""
    document = read_json(path)
    if not isinstance(document, dict):
        return False, []
    origin = (document.get("provenance") or {}).get("process")
    if isinstance(document.get("runs"), list):
        return True, [run_row(run, origin) for run in document["runs"]]
    if isinstance(document.get("summary"), list):
        return False, [_with(row, origin) for row in document["summary"]]
    return False, [{"table": key, **_with(row, origin)} for key, table in document.items()
                   if isinstance(table, list) for row in table if isinstance(row, dict)]


def load(path: str | Path) -> pd.DataFrame:
    """The results at ``path`` as a DataFrame, a run per row.

    ``path`` is a results JSON file or a folder, whose ``*.json`` files are read
    recursively (the run cache ``runs/`` aside). Where some file keeps the runs behind its
    tables (a ``"runs"`` list), the rows are the runs of those files (a comparison's
    through [`run_row`][bnn_zoo.results.run_row]: metrics, diagnostics and provenance as
    columns); elsewhere they are the files' summary rows, or the rows of each of their
    tables (``table``: its name), which are the measurements of scripts that keep no
    runs. The parts of a comparison run in parts (the subfolders of a folder whose own file
    keeps runs: `benchmarks/merge_comparisons.py` keeps theirs in the merged file) give no
    rows of their own, so each run is read once. Column ``file`` names the file (relative
    to the folder). A file that cannot be
    read or parsed raises a ``ValueError`` naming it; a file of another kind gives no rows.
    """
    path = Path(path)
    if path.is_dir():
        files = [(f, f.relative_to(path).as_posix()) for f in results_jsons(path)]
    elif path.exists():
        files = [(path, path.name)]
    else:
        raise ValueError(f"Expected a results folder or file, but {str(path)!r} does not "
                         "exist.")
    read = [(file, name, *_rows(file)) for file, name in files]
    merges = {file.parent for file, _, kept, _ in read if kept}
    any_runs = bool(merges)
    return pd.DataFrame([{"file": name, **row} for file, name, kept, rows in read
                         if (kept or not any_runs) and merges.isdisjoint(file.parents[1:])
                         for row in rows])
