"""Figures, drawn with matplotlib's object API (no pyplot state, any backend).

* :func:`reliability_diagram`: accuracy against confidence of the top-class
  prediction in equal-width bins (Guo et al. 2017, Fig. 1), with the gap to the
  diagonal and the expected calibration error in the title.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from bnn_zoo.core.checks import check_positive_int, check_tensor
from bnn_zoo.evaluation.metrics import expected_calibration_error, reliability_bins

__all__ = ["reliability_diagram"]


def reliability_diagram(probs: Tensor, y: Tensor, *, num_bins: int = 15, ax: Axes | None = None,
                        title: str | None = None) -> Figure:
    """Draw the reliability diagram of predicted class probabilities.

    Bar ``b`` shows the accuracy of the points whose top-class confidence falls in
    ``((b-1)/B, b/B]``, a hatched bar the gap to that bin's mean confidence, and
    the dashed diagonal perfect calibration. The title gives the ECE,
    ``sum_b |B_b|/N |acc(B_b) - conf(B_b)|`` (:mod:`bnn_zoo.evaluation.metrics`).

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
    bins = {k: v.detach().cpu().numpy() for k, v in reliability_bins(probs, y, num_bins).items()}
    filled = bins["count"] > 0
    centres = (bins["edges"][:-1] + bins["edges"][1:]) / 2
    width = 1.0 / num_bins
    ece = expected_calibration_error(probs, y, num_bins)
    ax.bar(centres[filled], bins["accuracy"][filled], width=width, edgecolor="black",
           color="tab:blue", label="accuracy")
    gap = bins["confidence"][filled] - bins["accuracy"][filled]
    ax.bar(centres[filled], gap, bottom=bins["accuracy"][filled], width=width,
           color="tab:red", alpha=0.3, hatch="//", edgecolor="tab:red", label="gap")
    ax.plot([0, 1], [0, 1], "k--", linewidth=1)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy")
    ax.set_aspect("equal")
    ax.set_title(f"ECE {ece:.3f}" if title is None else f"{title}\nECE {ece:.3f}")
    # Top-class confidences below 0.3 are rare, so the lower-left corner is nearly always free.
    ax.legend(loc="lower left", fontsize="x-small", framealpha=0.9)
    return ax.figure
