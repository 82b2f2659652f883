"""Figures, drawn with matplotlib's object API (no pyplot state, any backend), saved
atomically by `save_figure`.

* `reliability_diagram`: accuracy against confidence of the top-class
  prediction in equal-width bins (Guo et al. 2017, Fig. 1), with the gap to the
  diagonal and the expected calibration error in the title;
* `write_figures`: from the run records of a comparison
  (`bnn_zoo._harness.runs`), the predictive bands of every entry side by side
  (1-D regression), reliability curves (classification) and ELBO curves.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from bnn_zoo._core import data as data_module
from bnn_zoo._core.checks import check_positive_int, check_tensor
from bnn_zoo._core.files import atomic_path
from bnn_zoo.evaluation._metrics import expected_calibration_error, reliability_bins

__all__ = ["FIGURE_KINDS", "draw_reliability", "figure_path", "predictive_bands",
           "reliability_diagram", "save_figure", "write_figures"]

#: Probability mass of the predictive bands (from the records' ``band``).
BAND_MASS = 0.95
#: The figures `write_figures` may draw per data set.
FIGURE_KINDS = ("bands", "reliability", "elbo")


def figure_path(out: str | Path, kind: str, data: str) -> Path:
    """Where `write_figures` saves figure ``kind`` (of `FIGURE_KINDS`) of the
    data set ``data``: ``<out>/<kind>_<data>.png``."""
    return Path(out) / f"{kind}_{data.replace('/', '_')}.png"


def save_figure(fig: Figure, path: str | Path, *, dpi: int = 110) -> Path:
    """Save ``fig`` to ``path`` atomically (the format from the suffix); return the path."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi)
    return Path(path)


def draw_reliability(bins: dict, ece: float, ax: Axes, title: str | None = None) -> None:
    """Draw reliability bars on ``ax`` from ``bins`` (``edges``, ``count``, ``confidence``,
    ``accuracy`` per bin, as [`reliability_bins`][bnn_zoo.evaluation.reliability_bins]
    gives, as
    tensors or lists) and the expected calibration error ``ece``."""
    bins = {k: np.asarray(v.detach().cpu() if isinstance(v, Tensor) else v, dtype=float)
            for k, v in bins.items()}
    num_bins = len(bins["count"])
    filled = bins["count"] > 0
    centres = (bins["edges"][:-1] + bins["edges"][1:]) / 2
    width = 1.0 / num_bins
    ax.bar(centres[filled], bins["accuracy"][filled], width=width, edgecolor="black",
           color="tab:blue", label="accuracy")
    gap = bins["confidence"][filled] - bins["accuracy"][filled]
    ax.bar(centres[filled], gap, bottom=bins["accuracy"][filled], width=width,
           color="tab:red", alpha=0.3, hatch="//", edgecolor="tab:red", label="gap")
    ax.plot([0, 1], [0, 1], "k--", linewidth=1)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy")
    ax.set_aspect("equal")
    ax.set_title(f"ECE {ece:.3f}" if title is None else f"{title}\nECE {ece:.3f}", fontsize=9)
    # Top-class confidences below 0.3 are rare, so the lower-left corner is nearly always free.
    ax.legend(loc="lower left", fontsize="x-small", framealpha=0.9)


def reliability_diagram(probs: Tensor, y: Tensor, *, num_bins: int = 15, ax: Axes | None = None,
                        title: str | None = None) -> Figure:
    """Draw the reliability diagram of predicted class probabilities.

    Bar ``b`` shows the accuracy of the points whose top-class confidence falls in
    ``((b-1)/B, b/B]``, a hatched bar the gap to that bin's mean confidence, and
    the dashed diagonal perfect calibration. The title gives the ECE,
    ``sum_b |B_b|/N |acc(B_b) - conf(B_b)|`` ([`bnn_zoo.evaluation._metrics`][]).

    Parameters
    ----------
    probs : (N, C) predictive class probabilities (e.g. ``Fitted.predict(x).mean``).
    y : (N,) integer class labels.
    num_bins : number ``B`` of equal-width confidence bins.
    ax : axes to draw on; a new figure with one axes if ``None``.
    title : first line of the axes title (the second is the ECE).

    Returns
    -------
    The figure holding ``ax``.
    """
    check_tensor("probs", probs, ndim=2, floating=True)
    check_tensor("y", y, ndim=1, floating=False)
    check_positive_int("num_bins", num_bins)
    if y.shape[0] != probs.shape[0]:
        raise ValueError(f"Expected y to have one label per row of probs ({probs.shape[0]}), "
                         f"but got {y.shape[0]}.")
    if ax is None:
        ax = Figure(figsize=(4, 4), layout="constrained").add_subplot()
    draw_reliability(reliability_bins(probs, y, num_bins),
                     expected_calibration_error(probs, y, num_bins), ax, title)
    return ax.figure


def predictive_bands(records: Sequence[dict], data: str, split: int) -> Figure:
    """The predictive mean and central band (the records' ``band``) of every record side by
    side, over the training points of split ``split`` of ``data``; the band reaches past
    the training inputs (shaded) so extrapolation shows."""
    dataset = data_module.load(data, split)
    x_train = dataset.x_train[:, 0]
    fig = Figure(figsize=(3.2 * len(records), 3), layout="constrained")
    axes = fig.subplots(1, len(records), sharey=True, squeeze=False)[0]
    for ax, r in zip(axes, records):
        b = r["band"]
        ax.axvspan(float(x_train.min()), float(x_train.max()), color="0.93", zorder=0)
        ax.scatter(x_train, dataset.y_train, s=3, c="0.6")
        ax.fill_between(b["x"], b["lo"], b["hi"], alpha=0.3, label=f"{round(100 * BAND_MASS)}%")
        ax.plot(b["x"], b["mean"], lw=1.5)
        ax.set_title(f"{r['entry']}\nLL {r['metrics']['ll']:.2f}", fontsize=9)
    return fig


def _reliability_curves(records: Sequence[dict], data: str) -> Figure:
    fig = Figure(figsize=(4, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    for r in records:
        rel = r["reliability"]
        used = [i for i, c in enumerate(rel["count"]) if c > 0]
        ax.plot([rel["confidence"][i] for i in used], [rel["accuracy"][i] for i in used],
                "o-", ms=3, label=f"{r['entry']} (ECE {r['metrics']['ece']:.3f})")
    ax.set(xlabel="confidence", ylabel="accuracy", title=f"reliability: {data}")
    ax.legend(fontsize=7)
    return fig


def _elbo_curves(records: Sequence[dict], data: str) -> Figure:
    fig = Figure(figsize=(5, 3.5), layout="constrained")
    ax = fig.add_subplot()
    for r in records:
        ax.plot(np.linspace(0, 1, len(r["losses"])), r["losses"], label=r["entry"], lw=1)
    ax.set(xlabel="fraction of training", ylabel="negative ELBO (smoothed)",
           title=f"training: {data}")
    if all(v > 0 for r in records for v in r["losses"]):
        ax.set_yscale("log")
    ax.legend(fontsize=7)
    return fig


def write_figures(records: Sequence[dict], out: str | Path) -> list[Path]:
    """``bands_<data>.png`` (1-D regression), ``reliability_<data>.png`` (classification)
    and ``elbo_<data>.png`` under ``out``, from the first split of each data set."""
    paths = []
    for data in dict.fromkeys(r["data"] for r in records):
        ok = [r for r in records if r["data"] == data and r["status"] == "ok"]
        if not ok:
            continue
        first = min(r["split"] for r in ok)
        ok = [r for r in ok if r["split"] == first]
        if banded := [r for r in ok if "band" in r]:
            paths.append(save_figure(predictive_bands(banded, data, first),
                                     figure_path(out, "bands", data)))
        if calibrated := [r for r in ok if "reliability" in r]:
            paths.append(save_figure(_reliability_curves(calibrated, data),
                                     figure_path(out, "reliability", data)))
        if curves := [r for r in ok if r.get("losses")]:
            paths.append(save_figure(_elbo_curves(curves, data), figure_path(out, "elbo", data)))
    return paths
