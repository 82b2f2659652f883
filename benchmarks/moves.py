"""How the numbers of a committed comparison moved when it was re-run: per data set, entry
and metric, the change between two versions of one results JSON, paired by split.

A results JSON (``uci_summary.json``, ``classification_summary.json``, ...) keeps every run
under ``"runs"`` (entry, data, split, status, metrics). For each (data, entry) cell and each
metric ``m`` of ``--metrics``, the splits that finished (``status`` ok, ``m`` finite) in both
versions are paired, and with ``n`` pairs

.. math::

    \\Delta_s = m_s^{\\text{new}} - m_s^{\\text{old}}, \\qquad
    \\bar\\Delta = \\frac1n \\sum_s \\Delta_s, \\qquad
    \\mathrm{SE}(\\bar\\Delta) = \\mathrm{sd}_s(\\Delta_s) / \\sqrt n.

A row shows the old and new means over the pairs (each with its standard error over the
splits, as the comparison's tables show a cell), the change ``± SE(Δ̄)``, ``moved``:
whether ``|Δ̄|`` exceeds the new cell's standard error, the yardstick a reader of the table
has, and ``paired_z``, the change in units of its own standard error,
:math:`\\bar\\Delta / \\mathrm{SE}(\\bar\\Delta)`. Where only the random streams changed
(another seed stream, another thread count) the :math:`\\Delta_s` are noise around zero and
``paired_z`` is about standard normal; a move many paired errors wide is a change of the
method or of its budget.

The old version is a git revision's copy of the file (``--since``, default ``HEAD``) or
another file (``--old``). Writes ``<name>.md``/``.csv``/``.json`` under ``--out`` (default:
the file's folder; ``<name>`` defaults to the stem less ``_summary``, then ``_moves``), naming
the new runs' code versions, and prints the moved rows.

    python benchmarks/moves.py benchmarks/results/uci/uci_summary.json --since 38ae04c
    python benchmarks/moves.py new.json --old old.json --metrics ll --out /tmp/moves
    python benchmarks/moves.py benchmarks/results/nngp_ard/uci_summary.json --since 64f4faa \\
        --old-path benchmarks/results/uci/uci_summary.json --metrics ll --name nngp_ard_moves

(the last: another file at a revision as the old version, ``--old-path``).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from bnn_zoo._core.files import parse_json, read_json
from bnn_zoo._harness.cli import run_command
from bnn_zoo._harness.provenance import run_columns, versions
from bnn_zoo._harness.summary import mean_se
from bnn_zoo._harness.tables import markdown_table, write_tables

KEYS = ("data", "entry", "metric")
COLUMNS = ("old", "new", "change", "paired_z", "moved")


def read_old(path: Path, since: str, old: Path | None, old_path: Path | None = None) -> dict:
    """The old version of the results JSON ``path``: the file ``old``, or ``path`` (or
    ``old_path``, another results file of the same checkout) as the git revision ``since``
    has it."""
    if old is not None:
        return read_json(old)
    path = old_path or path
    found = subprocess.run(["git", "-C", str(path.parent), "rev-parse", "--show-toplevel"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise ValueError(f"Expected path={str(path)!r} inside a git checkout (or the old "
                         "version as a file, --old), but it is not.")
    root = found.stdout.strip()
    relative = path.resolve().relative_to(Path(root).resolve()).as_posix()
    shown = subprocess.run(["git", "-C", root, "show", f"{since}:{relative}"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        raise ValueError(f"Expected {relative} at revision since={since!r}, but git says: "
                         f"{shown.stderr.strip()}")
    return parse_json(shown.stdout, what="results file", source=f"{relative!r} at revision {since}")


def finished(document: Mapping, metrics: Sequence[str]) -> pd.DataFrame:
    """The values of ``metrics`` over the finished runs of a results JSON (status ok, a
    finite value), a row per (data, entry, metric, split)."""
    if "runs" not in document:
        raise ValueError("Expected a results JSON with its runs (a 'runs' list), but it has none.")
    values = [(run["data"], run["entry"], metric, run["split"], float(value))
              for run in document["runs"] if run.get("status") == "ok" for metric in metrics
              if isinstance(value := (run.get("metrics") or {}).get(metric), (int, float))
              and math.isfinite(value)]
    return pd.DataFrame(values, columns=[*KEYS, "split", "value"]).drop_duplicates(
        [*KEYS, "split"], keep="last")


def moves(old: Mapping, new: Mapping, metrics: Sequence[str]) -> list[dict]:
    """One row per (data, entry, metric) with paired splits in both versions, in the new
    document's order: ``runs`` (pairs), ``old``, ``new`` and ``change`` (each with its
    ``_se``, :func:`~bnn_zoo._harness.summary.mean_se` as the comparison's tables),
    ``paired_z`` (:func:`paired_z`) and ``moved`` (``|change|`` above the new cell's
    standard error)."""
    pairs = finished(new, metrics).merge(finished(old, metrics), on=[*KEYS, "split"],
                                         suffixes=("", "_old"))
    rows = []
    for (data, entry, metric), pair in pairs.groupby(list(KEYS), sort=False):
        old_mean, old_se = mean_se(list(pair["value_old"]))
        new_mean, new_se = mean_se(list(pair["value"]))
        change, change_se = mean_se(list(pair["value"] - pair["value_old"]))
        rows.append({"data": data, "entry": entry, "metric": metric, "runs": len(pair),
                     "old": old_mean, "old_se": old_se, "new": new_mean, "new_se": new_se,
                     "change": change, "change_se": change_se,
                     "paired_z": paired_z(change, change_se), "moved": abs(change) > new_se})
    return rows


def paired_z(change: float, change_se: float) -> float:
    """``change / change_se``: ``0`` for no change, ``±inf`` for the same change in every
    split (no spread), ``nan`` without a standard error (one pair)."""
    if change == 0:
        return 0.0
    if change_se == 0:
        return math.copysign(math.inf, change)
    return change / change_se


def unpaired(old: Mapping, new: Mapping) -> tuple[list[tuple], list[tuple]]:
    """The (data, entry) cells that only the old and only the new version has."""
    cells = [{(run["data"], run["entry"]) for run in doc["runs"]} for doc in (old, new)]
    return sorted(cells[0] - cells[1]), sorted(cells[1] - cells[0])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="the results JSON as it is now")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--since", default="HEAD", help="git revision of the old version")
    source.add_argument("--old", type=Path, help="a file holding the old version")
    parser.add_argument("--old-path", type=Path,
                        help="with --since: take this results file at the revision as the "
                             "old version (default: the path itself)")
    parser.add_argument("--metrics", nargs="+", default=["ll", "rmse"])
    parser.add_argument("--out", type=Path, help="output folder (default: the file's)")
    parser.add_argument("--name", help="output name (default: <stem>_moves)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    new = read_json(args.path)
    if args.old is not None and args.old_path is not None:
        raise ValueError("--old-path names a file at the --since revision; --old names a "
                         "file as it is: give one of them.")
    old = read_old(args.path, args.since, args.old, args.old_path)
    rows = moves(old, new, args.metrics)
    gone, added = unpaired(old, new)
    origin = (str(args.old) if args.old is not None else f"revision {args.since}" +
              (f" of `{args.old_path.as_posix()}`" if args.old_path is not None else ""))
    preamble = (f"Changes of `{args.path.name}` since {origin}, paired by split; `moved`: the "
                f"change exceeds the new cell's standard error. Cells only in the new "
                f"version: {len(added)}; only in the old: {len(gone)}.")
    name = args.name or f"{args.path.stem.removesuffix('_summary')}_moves"
    write_tables(args.out or args.path.parent, name, rows, keys=KEYS, columns=COLUMNS,
                 preamble=preamble, provenance=versions(run_columns(r) for r in new["runs"]))
    print(preamble)
    print(markdown_table([r for r in rows if r["moved"]], keys=KEYS, columns=COLUMNS))
    return rows


if __name__ == "__main__":
    sys.exit(run_command("benchmarks/moves.py", main))
