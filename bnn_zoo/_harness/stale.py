"""Stale cells: the runs of a comparison's results that other code than the checkout's made.

A cell is one (entry, data set) of a comparison. Its runs are those kept in a results
file's ``"runs"`` (as `write_comparison` writes them: every
committed ``compare.json``, ``uci_summary.json``, ``classification.json``); a run is stale
when its code version (`run_code`) is not the checkout's
(`code_version`), or is unknown (a run recorded before
runs named their code). The run cache never reads a stale run back
(`cached_runs`), so these are the cells a rerun fits again.

``python -m bnn_zoo stale PATH...`` (a results folder, searched recursively, or a results
file) prints one line per stale cell (file, entry, data set, the stale splits and their
code versions) and their count, and exits with 1 when there are any, 0 otherwise; a
results file that cannot be read or parsed is an error (exit code 2, the file named).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from bnn_zoo._core.files import read_json
from bnn_zoo._harness.provenance import code_version, run_code
from bnn_zoo._harness.runs import NOT_CACHED, results_jsons

__all__ = ["RUN_FIELDS", "kept_runs", "results_files", "run", "stale_cells"]


#: The fields of a run record that a comparison's results file keeps.
RUN_FIELDS = ("entry", "data", "split", "settings")


def kept_runs(path: Path) -> list[dict] | None:
    """The run records kept in the results JSON file ``path``, or ``None`` when it keeps
    none (a JSON document of another kind). A file that cannot be read or parsed raises a
    ``ValueError`` naming it (`read_json`)."""
    document = read_json(path)
    runs = document.get("runs") if isinstance(document, dict) else None
    if not isinstance(runs, list) or not runs or not all(
            isinstance(r, dict) and all(k in r for k in RUN_FIELDS) for r in runs):
        return None
    return runs


def _results(paths: Iterable[str | Path]) -> list[tuple[Path, list[dict]]]:
    """Each results file at ``paths`` with the run records it keeps (see
    `results_files`), each file read once."""
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            found += [(f, kept) for f in results_jsons(path) if (kept := kept_runs(f))]
        elif not path.is_file():
            raise ValueError(f"Expected paths to be results folders or files, but {path} "
                             "does not exist.")
        elif (kept := kept_runs(path)) is None:
            raise ValueError(f"Expected {path} to keep the runs of a comparison (a \"runs\" "
                             "list of run records), but it does not.")
        else:
            found.append((path, kept))
    return found


def results_files(paths: Iterable[str | Path]) -> list[Path]:
    """The results files at ``paths`` that keep the run records of a comparison (a
    ``"runs"`` list of records with `RUN_FIELDS`): each file named, and every such
    ``*.json`` under each folder named (the run cache ``runs/`` aside); a named file that
    keeps none, or a path that does not exist, is a ``ValueError``."""
    return [path for path, _ in _results(paths)]


def stale_cells(paths: Iterable[str | Path], code: str | None = None) -> list[dict]:
    """One row per (file, entry, data set) of `results_files` with a run whose code
    version is not ``code`` (default: the checkout's `code_version`): ``file``,
    ``entry``, ``data``, ``splits`` (the stale ones, sorted), ``code`` (their versions) and
    ``runs`` (the cell's runs). Runs a table listed as never run (not cached) do not count."""
    code = code or code_version()
    rows = []
    for file, kept in _results(paths):
        cells: dict[tuple[str, str], list[dict]] = {}
        for r in kept:
            if r.get("reason") != NOT_CACHED:
                cells.setdefault((r["entry"], r["data"]), []).append(r)
        for (entry, data), group in cells.items():
            old = [r for r in group if run_code(r) != code]
            if old:
                rows.append({"file": str(file), "entry": entry, "data": data,
                             "splits": sorted(r["split"] for r in old),
                             "code": sorted({run_code(r) for r in old}), "runs": len(group)})
    return rows


def _spans(values: Sequence[int]) -> str:
    """``0-3, 7`` for ``[0, 1, 2, 3, 7]``."""
    spans: list[list[int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def run(paths: Sequence[str | Path]) -> int:
    """Print the stale cells of ``paths`` (`stale_cells`) and their count; return 1
    when there are any, 0 otherwise."""
    code = code_version()
    rows = stale_cells(paths, code)
    for row in rows:
        print(f"{row['file']}: {row['entry']} on {row['data']}: splits {_spans(row['splits'])} "
              f"of {row['runs']} (code {', '.join(row['code'])})")
    splits = sum(len(row["splits"]) for row in rows)
    print(f"{len(rows)} stale cells ({splits} runs) of other code than this checkout's "
          f"({code}).")
    return int(bool(rows))
