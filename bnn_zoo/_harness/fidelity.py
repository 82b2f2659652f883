"""Fidelity to the reference: per data set, every entry ranked by the distance of its
predictive to the reference's, with what its fit cost, and a figure of the two.

The distances are those of the NeurIPS 2021 competition on approximate inference in
Bayesian deep learning (Wilson, Izmailov, Hoffman, Gal et al.): the Wasserstein-1 distance
between the predictives at each test input for regression (``w1_to_ref``,
`bnn_zoo._harness.summary.quantile_w1`) and their total variation for classification
(``tv_to_ref``), averaged over the test inputs and then over the splits on which the
reference passed its gate (`bnn_zoo._harness.summary.reference_distances`: a split it fails
is measured by nobody). Rank 1 is the closest entry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

from bnn_zoo._harness.figures import save_figure
from bnn_zoo._harness.provenance import run_columns, versions
from bnn_zoo._harness.summary import aggregate, reference_distances
from bnn_zoo._harness.tables import write_tables

__all__ = ["DISTANCE", "FIDELITY_COLUMNS", "fidelity_figure", "fidelity_rows",
           "write_fidelity"]

#: The distance each task ranks its entries by.
DISTANCE = {"regression": "w1_to_ref", "classification": "tv_to_ref"}
#: The columns of the fidelity table: the rank, the distances, the fit's cost.
FIDELITY_COLUMNS = ("rank", "w1_to_ref", "w2_to_ref", "ll_gap", "tv_to_ref", "agreement",
                    "fit_seconds")


def fidelity_rows(records: Sequence[dict], reference: str) -> list[dict]:
    """One row per (data, entry) but the reference: the mean and standard error over the
    splits measured against ``reference`` of its distances and its fit time (``runs``: those
    splits), ranked within the data set by `DISTANCE` of its task (``rank`` 1: the closest;
    an entry with no measured split comes last, unranked)."""
    reference_distances(records, reference)
    measured = [{"data": r["data"], "entry": r["entry"], "task": r["task"],
                 **{k: r["metrics"][k] for k in FIDELITY_COLUMNS if k in r["metrics"]},
                 **run_columns(r)}
                for r in records if r["status"] == "ok" and r["entry"] != reference
                and DISTANCE[r["task"]] in r["metrics"]]
    rows = aggregate(measured, ("data", "entry", "task"))
    ranked = []
    for data in dict.fromkeys(row["data"] for row in rows):
        group = sorted((row for row in rows if row["data"] == data),
                       key=lambda row: _distance(row))
        ranked += [{**row, "rank": i + 1} for i, row in enumerate(group)]
    return ranked


def _distance(row: dict) -> float:
    value = row.get(DISTANCE[row["task"]], math.nan)
    return math.inf if math.isnan(value) else value


def fidelity_figure(rows: Sequence[dict]) -> Figure:
    """Per data set, every entry's distance to the reference (± its standard error over the
    splits) against its mean fit time, both on log scales, each point named."""
    datasets = list(dict.fromkeys(row["data"] for row in rows))
    fig = Figure(figsize=(6.5, 4.5 * len(datasets)), layout="constrained")
    for ax, data in zip(fig.subplots(len(datasets), 1, squeeze=False)[:, 0], datasets):
        group = [row for row in rows if row["data"] == data]
        distance = DISTANCE[group[0]["task"]]
        ax.errorbar([r["fit_seconds"] for r in group], [r[distance] for r in group],
                    yerr=[0.0 if math.isnan(r.get(f"{distance}_se", math.nan))
                          else r[f"{distance}_se"] for r in group], fmt="o", ms=4,
                    capsize=2)
        labels = [ax.annotate(r["entry"], (r["fit_seconds"], r[distance]), fontsize=7,
                              xytext=(3, 2), textcoords="offset points") for r in group]
        ax.set(xscale="log", yscale="log", xlabel="fit time (s)",
               ylabel=f"{distance} (closer is lower)",
               title=f"{data}: fidelity to the reference against cost")
        _separate(fig, labels)
    return fig


#: The height (points) of a line of the labels' 7-point text: the step of a label's shifts.
_LINE = 9


def _shifts(count: int) -> list[int]:
    """The offsets (points, up or down from the default's) a label tries in turn: 0, then
    whole lines alternately below and above, out to ``count`` lines. A placed label blocks at
    most two of them, so with ``count`` labels one is always clear."""
    return [0, *(sign * _LINE * k for k in range(1, count + 1) for sign in (-1, 1))]


def _separate(fig: Figure, labels: Sequence[Annotation]) -> None:
    """Move each label of ``labels`` to the first of its `_shifts` where it overlaps no
    label placed before it (with 2 points between them side by side), or where it overlaps
    them least if none is clear."""
    fig.draw_without_rendering()
    placed: list[Bbox] = []
    for label in labels:
        x, y = label.xyann
        tried = []  # (overlap, shift, box) of each shift tried
        for shift in _shifts(len(labels)):
            label.xyann = (x, y + shift)
            box = label.get_window_extent().padded(2, 0)
            common = (Bbox.intersection(box, other) for other in placed)
            overlap = sum(c.width * c.height for c in common if c is not None)
            tried.append((overlap, shift, box))
            if overlap == 0.0:
                break
        _, shift, box = min(tried, key=lambda t: t[0])
        label.xyann = (x, y + shift)
        placed.append(box)


def write_fidelity(records: Sequence[dict], out: str | Path, reference: str) -> str | None:
    """Write ``fidelity.md``, ``.csv``, ``.json`` (`fidelity_rows`) and ``fidelity.png``
    (`fidelity_figure`) under ``out``; return the Markdown, or ``None`` (nothing written)
    where no entry was measured against ``reference``."""
    rows = fidelity_rows(records, reference)
    if not rows:
        return None
    preamble = (f"Every entry ranked by its distance to `{reference}` (rank 1: the closest), "
                "mean ± standard error over the splits on which the reference passed its "
                "gate (`runs`): `w1_to_ref`, the mean Wasserstein-1 distance between the "
                "predictives at the test inputs (regression); `tv_to_ref`, their mean total "
                "variation (classification); with each fit's time in seconds.")
    table = write_tables(out, "fidelity", rows, keys=("data", "entry"), section="data",
                         columns=FIDELITY_COLUMNS, preamble=preamble,
                         provenance=versions(rows))
    save_figure(fidelity_figure(rows), Path(out) / "fidelity.png")
    return table
