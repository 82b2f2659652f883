"""The one table writer of the harness: Markdown, CSV and JSON of summary rows.

A summary row (as from `bnn_zoo._harness.summary.aggregate`) holds its key
fields (e.g. ``data`` and ``entry``), the number of runs ``runs``, and per metric
``<metric>`` (the mean) with ``<metric>_se`` (its standard error); the Markdown shows
them as ``mean ± se``. Every file is written atomically
(`bnn_zoo._core.files`). The comparison, the command line and every script in
``benchmarks/`` write their results through `write_tables`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bnn_zoo._core.files import read_json, write_text_atomic
from bnn_zoo._harness.provenance import UNKNOWN, note, run_columns
from bnn_zoo._harness.provenance import provenance as process_provenance
from bnn_zoo._harness.summary import RUNS

__all__ = ["BEST", "Table", "format_value", "markdown_matrix", "markdown_table",
           "merge_summary", "run_line", "write_csv", "write_table_group", "write_tables"]

#: Which value of a metric is the best, as `markdown_matrix` takes it: the sign that makes
#: the best the largest.
BEST = {"max": 1.0, "min": -1.0}


def _number(value: float, digits: int) -> str:
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3g}"
    return f"{value:.{digits}f}"


def run_line(row: dict) -> str:
    """One finished run as a progress line: numbers to 4 decimals, text as it is."""
    return str({k: v if isinstance(v, str) else round(v, 4) for k, v in row.items()})


def format_value(mean: object, se: object = None) -> str:
    """``mean ± se`` (3 decimals, 1 from 100 on, 3 significant digits for very small or
    large values); ``-`` for a missing or ``nan`` mean; text and integers as they are."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if isinstance(mean, bool) or not isinstance(mean, (int, float)):
        return str(mean)
    if isinstance(mean, int):
        return str(mean)
    digits = 3 if abs(mean) < 100 else 1
    text = _number(mean, digits)
    if isinstance(se, (int, float)) and not math.isnan(se):
        text += f" ± {_number(float(se), digits)}"
    return text


def _table(rows: Sequence[dict], keys: Sequence[str], columns: Sequence[str],
           notes: Callable[[dict], str] | None) -> list[str]:
    cols = [c for c in columns if any(c in r for r in rows)]
    counted = any(RUNS in r for r in rows)
    if notes is not None and not any(notes(r) for r in rows):
        notes = None
    header = [*keys, *([RUNS] if counted else []), *cols, *(["notes"] if notes else [])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [format_value(row.get(k)) for k in keys]
        if counted:
            cells.append(format_value(row.get(RUNS)))
        cells += [format_value(row.get(c), row.get(f"{c}_se")) for c in cols]
        if notes:
            cells.append(notes(row))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown_table(rows: Sequence[dict], *, keys: Sequence[str], columns: Sequence[str],
                   section: str | None = None, notes: Callable[[dict], str] | None = None,
                   ) -> str:
    """Markdown of summary rows: one column per key, ``runs``, one per metric in
    ``columns`` that some row has (``mean ± se``), and ``notes(row)`` if given.

    With ``section`` (one of the row fields, e.g. ``"data"``) there is one table per
    value of that field under a ``### <value>`` heading, without the field as a column.
    """
    if not rows:
        return ""
    if section is None:
        return "\n".join(_table(rows, keys, columns, notes)) + "\n"
    shown = [k for k in keys if k != section]
    lines: list[str] = []
    for value in dict.fromkeys(row[section] for row in rows):
        part = [row for row in rows if row[section] == value]
        lines += [f"### {value}", "", *_table(part, shown, columns, notes), ""]
    return "\n".join(lines)


def _finite(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _column_label(value: object) -> str:
    """A data set's column heading: its name without the family and from its first dash on
    (``uci/wine-quality-red``: ``wine``)."""
    return str(value).split("/", 1)[-1].split("-", 1)[0]


def markdown_matrix(rows: Sequence[dict], *, key: str, across: str, metric: str,
                    best: str) -> str:
    """Markdown of one metric as a matrix: a line per value of the field ``key`` (an entry),
    a column per value of ``across`` (a data set, headed by `_column_label`), each cell the
    mean of ``metric`` (as `format_value` shows it) and, in brackets, its rank in the
    column (1: the best, in bold; ``best`` is ``"max"`` or ``"min"``; values that show the
    same share the better rank); ``-`` where a line has no finite value. The lines are
    sorted by their mean rank over the columns where they have a value (column
    ``mean rank``), then by name. One row per cell: a second row of the same ``key`` and
    ``across`` is an error."""
    if best not in BEST:
        raise ValueError(f"best={best!r}: expected one of {', '.join(BEST)}.")
    cells: dict[tuple, float] = {}
    for row in rows:
        cell = (row[key], row[across])
        if cell in cells:
            raise ValueError(f"Two rows for {key}={cell[0]!r}, {across}={cell[1]!r}: a "
                             f"matrix takes one row per cell (filter with where=...).")
        cells[cell] = row.get(metric)
    lines_of = list(dict.fromkeys(row[key] for row in rows))
    columns = list(dict.fromkeys(row[across] for row in rows))
    scores = {cell: BEST[best] * float(format_value(v)) for cell, v in cells.items()
              if _finite(v)}
    ranks = {(line, column): 1 + sum(other > score for (_, c), other in scores.items()
                                     if c == column)
             for (line, column), score in scores.items()}
    mean_rank = {line: statistics.fmean(r for (l, _), r in ranks.items() if l == line)
                 for line in lines_of if any(l == line for l, _ in ranks)}
    order = sorted(lines_of, key=lambda line: (mean_rank.get(line, math.inf), str(line)))
    header = [key, "mean rank", *(_column_label(c) for c in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for line in order:
        shown = [str(line), f"{mean_rank[line]:.1f}" if line in mean_rank else "-"]
        for column in columns:
            rank = ranks.get((line, column))
            text = format_value(cells.get((line, column)))
            shown.append("-" if rank is None else
                         f"**{text}** (1)" if rank == 1 else f"{text} ({rank})")
        lines.append("| " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def _json_safe(value: object) -> object:
    """``nan`` and infinities as ``null`` (JSON has neither), containers recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _csv(rows: Sequence[dict]) -> str:
    fields = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_csv(path: str | Path, rows: Sequence[dict]) -> Path:
    """Write ``rows`` as CSV to ``path`` atomically (a column per field of any row, in order
    of first appearance; a missing field is an empty cell); return the path."""
    write_text_atomic(Path(path), _csv(rows))
    return Path(path)


def _json(document: object) -> str:
    return json.dumps(_json_safe(document), indent=1, allow_nan=False, default=str)


def write_tables(out: str | Path, name: str, rows: Sequence[dict], *, keys: Sequence[str],
                 columns: Sequence[str], section: str | None = None,
                 notes: Callable[[dict], str] | None = None, runs: Sequence[dict] | None = None,
                 markdown_rows: Sequence[dict] = (), preamble: str = "",
                 provenance: Mapping[str, Sequence[str]] | None = None) -> str:
    """Write ``<name>.md``, ``<name>.csv`` and ``<name>.json`` under ``out``; return the
    Markdown.

    Parameters
    ----------
    rows : summary rows (see `markdown_table`); the CSV has one line per row and
        a column per field of any row, the JSON holds them under ``"summary"``.
    keys, columns, section, notes : what the Markdown shows (`markdown_table`).
    runs : the runs behind the summary (one dict each), kept in the JSON under ``"runs"``.
    markdown_rows : rows shown in the Markdown only, after the measured ones (e.g.
        published numbers, which are not measurements of this run).
    preamble : text printed above the Markdown tables (e.g. the settings).
    provenance : the code versions and commits of the numbers (as from
        `versions`), kept in the JSON under
        ``"provenance"`` and named in a line under the Markdown
        (`note`); ``None``: the numbers are this
        process's, and the JSON also keeps its whole
        `provenance` under ``"provenance"``,
        ``"process"`` (versions, device, threads, date).
    """
    if provenance is None:
        provenance = _process_versions()
    out = Path(out)
    table = markdown_table([*rows, *markdown_rows], keys=keys, columns=columns,
                           section=section, notes=notes)
    if preamble:
        table = f"{preamble}\n\n{table}"
    if note(provenance):
        table = f"{table}\n{note(provenance)}\n"
    write_text_atomic(out / f"{name}.md", table)
    write_text_atomic(out / f"{name}.csv", _csv(rows))
    document = {"summary": list(rows), **({"runs": list(runs)} if runs is not None else {}),
                "provenance": dict(provenance)}
    write_text_atomic(out / f"{name}.json", _json(document))
    return table


def merge_summary(out: str | Path, name: str, rows: Sequence[dict], *, keys: Sequence[str]
                  ) -> list[dict]:
    """The summary rows of ``<name>.json`` under ``out`` (none if there is no such file),
    each replaced by the row of ``rows`` with the same values of ``keys``, followed by the
    rows of ``rows`` that replace none: what to pass to `write_tables`, with
    ``provenance`` from `versions` of the merged rows (and this run's whole `provenance`
    under ``"process"``), when one run measures some rows of a table (one setting of a
    benchmark) and keeps the others. A kept row that does not name its
    ``code``, ``commit`` and ``machine`` (`run_columns`) takes its file's, so that the table
    names the code of every row it shows, not only this run's."""
    path = Path(out) / f"{name}.json"
    document = read_json(path) if path.exists() else {"summary": []}
    found = document.get("provenance") or {}
    origin = {column: "; ".join(found.get(column) or [UNKNOWN])
              for column in ("code", "commit", "machine")}
    new = {tuple(row.get(k) for k in keys): row for row in rows}
    merged = [new.pop(tuple(row.get(k) for k in keys), {**origin, **row})
              for row in document["summary"]]
    return merged + list(new.values())


@dataclass(frozen=True)
class Table:
    """One table of a group written together by `write_table_group`: its ``key`` (in
    the JSON and the CSV's name), its ``heading`` and what `markdown_table` needs."""

    key: str
    heading: str
    rows: Sequence[dict]
    keys: Sequence[str]
    columns: Sequence[str]


def _process_versions() -> dict:
    """This process's code version, commit and machine (`run_columns`) as `versions`
    gives them, with its whole `provenance` under ``"process"``."""
    process = process_provenance()
    columns = run_columns({"provenance": process})
    return {**{key: [value] for key, value in columns.items()}, "process": process}


def write_table_group(out: str | Path, name: str, tables: Sequence[Table]) -> str:
    """Write several tables of one study, this process's numbers: ``<name>.md`` (a
    ``## heading`` per table, then the line naming their code, `note`),
    ``<name>_<key>.csv`` per table and ``<name>.json`` (``{key: rows}`` and, under
    ``"provenance"``, the process's, as `write_tables` keeps it); return the Markdown."""
    out = Path(out)
    origin = _process_versions()
    text = "\n".join(f"## {t.heading}\n\n" + markdown_table(t.rows, keys=t.keys, columns=t.columns)
                     for t in tables) + f"\n{note(origin)}\n"
    write_text_atomic(out / f"{name}.md", text)
    for t in tables:
        write_text_atomic(out / f"{name}_{t.key}.csv", _csv(t.rows))
    write_text_atomic(out / f"{name}.json",
                      _json({**{t.key: list(t.rows) for t in tables}, "provenance": origin}))
    return text
