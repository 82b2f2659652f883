"""Figures of the prior diagnostics (`bnn_zoo._harness.prior_diagnostics`), drawn with
matplotlib's object API (no display needed) and saved atomically by
`bnn_zoo._harness.figures.save_figure`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import Tensor

from bnn_zoo._harness.figures import save_figure

__all__ = ["plot_output_vs_gaussian", "plot_tail_parameters"]


def plot_output_vs_gaussian(samples: dict[int, Tensor], variance: float, path: Path) -> None:
    """Histogram (log density) of the prior output at one input for each width ``H``
    (``samples[H]`` of shape (S,)) against the Gaussian limit ``N(0, variance)``."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    scale = math.sqrt(variance)
    grid = torch.linspace(-6 * scale, 6 * scale, 400, dtype=torch.float64)
    for width, values in samples.items():
        ax.hist(values.detach().cpu().double().numpy(), bins=120, range=(-6 * scale, 6 * scale),
                density=True, histtype="step", label=f"H = {width}")
    gauss = torch.exp(-0.5 * (grid / scale) ** 2) / (scale * math.sqrt(2 * math.pi))
    ax.plot(grid.numpy(), gauss.numpy(), "k--", label="GP limit")
    ax.set_yscale("log")
    ax.set_ylim(1e-4 / scale, None)
    ax.set_xlabel("f(x) under the prior")
    ax.set_ylabel("density")
    ax.set_title("One hidden layer: the output approaches its Gaussian limit")
    ax.legend()
    save_figure(fig, path, dpi=120)


def plot_tail_parameters(rows: Sequence[dict[str, float]], path: Path) -> None:
    """Estimated tail parameter against the layer ``l``, with the theorem's ``l/2``
    (``rows`` as from `bnn_zoo._harness.prior_diagnostics.tail_table`)."""
    layers = [r["layer"] for r in rows]
    fig = Figure(figsize=(5, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(layers, [r["theta_moments"] for r in rows], "o-", label="moment norms")
    ax.plot(layers, [r["theta_survival"] for r in rows], "s-", label="log-survival")
    ax.plot(layers, [r["theta_theory"] for r in rows], "k--", label="sub-Weibull l/2")
    ax.set_xticks(layers)
    ax.set_xlabel("layer l")
    ax.set_ylabel("tail parameter theta")
    ax.set_title("Units get heavier-tailed with depth")
    ax.legend()
    save_figure(fig, path, dpi=120)
