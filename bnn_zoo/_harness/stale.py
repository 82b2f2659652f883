"""Stale results: the cells and files of the results that other code than the checkout's made.

A cell is one (entry, data set) of a comparison. Its runs are those kept in a results
file's ``"runs"`` (as `write_comparison` writes them: every
committed ``compare.json``, ``uci_summary.json``, ``classification.json``); a run is stale
when its code version (`run_code`) is not the checkout's
(`code_version`), or is unknown (a run recorded before
runs named their code). The run cache never reads a stale run back
(`cached_runs`), so these are the cells a rerun fits again. Every other results file (a
timing, a study, a table derived from a comparison) is stale as a whole when the code
versions its ``"provenance"`` names (else those of a ``provenance.json`` beside it) are
not only the checkout's, or when it names none.

``python -m bnn_zoo stale PATH...`` (a results folder, searched recursively, or a results
file) prints one line per stale cell (file, entry, data set, the stale splits and their
code versions) and per stale file, and their counts, and exits with 1 when there are any,
0 otherwise; a results file that cannot be read or parsed is an error (exit code 2, the
file named).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from bnn_zoo._core.files import read_json
from bnn_zoo._harness.provenance import UNKNOWN, code_version, run_code
from bnn_zoo._harness.runs import NOT_CACHED, results_jsons

__all__ = ["PROVENANCE_FILE", "RUN_FIELDS", "file_code", "kept_runs", "results_files", "run",
           "stale_cells", "stale_files"]


#: The fields of a run record that a comparison's results file keeps.
RUN_FIELDS = ("entry", "data", "split", "settings")
#: The file that records the provenance of a folder of results that do not keep their own.
PROVENANCE_FILE = "provenance.json"


def _runs(document: object) -> list[dict] | None:
    """The run records a results document keeps (`kept_runs`)."""
    runs = document.get("runs") if isinstance(document, dict) else None
    if not isinstance(runs, list) or not runs or not all(
            isinstance(r, dict) and all(k in r for k in RUN_FIELDS) for r in runs):
        return None
    return runs


def kept_runs(path: Path) -> list[dict] | None:
    """The run records kept in the results JSON file ``path``, or ``None`` when it keeps
    none (a JSON document of another kind). A file that cannot be read or parsed raises a
    ``ValueError`` naming it (`read_json`)."""
    return _runs(read_json(path))


def _codes(document: object) -> list[str]:
    """The code versions a results document's ``"provenance"`` names (a list of them, one,
    or its process's), none where it names none."""
    found = document.get("provenance") if isinstance(document, dict) else None
    if not isinstance(found, dict):
        return []
    code = found.get("code") or (found.get("process") or {}).get("code")
    return sorted(code) if isinstance(code, list) else [code] if isinstance(code, str) else []


def _document_code(path: Path, document: object) -> list[str]:
    beside = path.parent / PROVENANCE_FILE
    codes = _codes(document)
    if not codes and beside.is_file() and beside != path:
        codes = _codes({"provenance": read_json(beside)})
    return codes or [UNKNOWN]


def file_code(path: Path) -> list[str]:
    """The code versions of the results file ``path``: those its provenance names, else
    those of the `PROVENANCE_FILE` beside it (its ``"code"``), else `UNKNOWN`."""
    return _document_code(path, read_json(path))


def _documents(paths: Iterable[str | Path]) -> list[tuple[Path, object]]:
    """Each results file at ``paths``, parsed once: each file named, and every ``*.json``
    under each folder named but the run cache ``runs/`` and the `PROVENANCE_FILE`
    records; a path that does not exist is a ``ValueError``."""
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            files += [f for f in results_jsons(path) if f.name != PROVENANCE_FILE]
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"Expected paths to be results folders or files, but {path} "
                             "does not exist.")
    return [(f, read_json(f)) for f in files]


def results_files(paths: Iterable[str | Path]) -> list[Path]:
    """The results files at ``paths`` (`_documents`) that keep the run records of a
    comparison (a ``"runs"`` list of records with `RUN_FIELDS`)."""
    return [path for path, document in _documents(paths) if _runs(document)]


def _cells(documents: list[tuple[Path, object]], code: str) -> list[dict]:
    rows = []
    for file, document in documents:
        cells: dict[tuple[str, str], list[dict]] = {}
        for r in _runs(document) or []:
            if r.get("reason") != NOT_CACHED:
                cells.setdefault((r["entry"], r["data"]), []).append(r)
        for (entry, data), group in cells.items():
            old = [r for r in group if run_code(r) != code]
            if old:
                rows.append({"file": str(file), "entry": entry, "data": data,
                             "splits": sorted(r["split"] for r in old),
                             "code": sorted({run_code(r) for r in old}), "runs": len(group)})
    return rows


def _files(documents: list[tuple[Path, object]], code: str) -> list[dict]:
    return [{"file": str(f), "code": codes} for f, document in documents
            if _runs(document) is None and (codes := _document_code(f, document)) != [code]]


def stale_cells(paths: Iterable[str | Path], code: str | None = None) -> list[dict]:
    """One row per (file, entry, data set) of `results_files` with a run whose code
    version is not ``code`` (default: the checkout's `code_version`): ``file``,
    ``entry``, ``data``, ``splits`` (the stale ones, sorted), ``code`` (their versions) and
    ``runs`` (the cell's runs). Runs a table listed as never run (not cached) do not count."""
    return _cells(_documents(paths), code or code_version())


def stale_files(paths: Iterable[str | Path], code: str | None = None) -> list[dict]:
    """One row per results file at ``paths`` (`_documents`) that keeps no comparison's
    runs and whose code versions (`file_code`) are not only ``code`` (default: the
    checkout's `code_version`): ``file`` and ``code``."""
    return _files(_documents(paths), code or code_version())


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
    """Print the stale cells (`stale_cells`) and files (`stale_files`) of ``paths``
    and their counts; return 1 when there are any, 0 otherwise."""
    code, documents = code_version(), _documents(paths)
    rows, files = _cells(documents, code), _files(documents, code)
    for row in rows:
        print(f"{row['file']}: {row['entry']} on {row['data']}: splits {_spans(row['splits'])} "
              f"of {row['runs']} (code {', '.join(row['code'])})")
    for row in files:
        print(f"{row['file']}: the whole file (code {', '.join(row['code'])})")
    splits = sum(len(row["splits"]) for row in rows)
    print(f"{len(rows)} stale cells ({splits} runs) and {len(files)} stale files of other "
          f"code than this checkout's ({code}).")
    return int(bool(rows or files))
