"""Which of a reference's splits fail the convergence gate, against the observation noise
their chains keep: the runs that committed reference folders keep (``compare.json`` of
``python -m bnn_zoo compare --reference hmc``, ``benchmarks/reference_sampler.py`` or
``benchmarks/merge_comparisons.py``), fitting nothing.

The reference's chains hold the noise scale fixed at the value tuned on held-out points
(`bnn_zoo.methods.HeldOutNoise`), and that value differs from split to split. A smaller
noise sharpens the likelihood, ``sum_i log N(y_i | f(x_i), sigma^2)``, and with it the
posterior over the weights; chains that settle in different modes then disagree about the
predictive, which the split R-hat over the test predictive measures.

Per split: its noise, the noise's rank within its data set (1: the smallest), the
leapfrog steps a draw, the test LL, the largest R-hat and smallest bulk ESS over the test
predictive, and whether the split passes the gate (`bnn_zoo.methods.ConvergenceGate`). Per
data set: the splits, how many pass, the noise ranks of those that fail, and Spearman's
rank correlation between noise and R-hat. A figure sets each split's R-hat against its
noise over its set's median.

    python benchmarks/gate_by_noise.py benchmarks/results/reference_yacht_4000 \\
        benchmarks/results/reference_concrete_2000 --out benchmarks/results/gate_by_noise
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from bnn_zoo._core.files import read_json
from bnn_zoo._harness import flags
from bnn_zoo._harness.figures import save_figure
from bnn_zoo._harness.provenance import run_columns, versions
from bnn_zoo._harness.summary import GATE, REFERENCE
from bnn_zoo._harness.tables import write_tables

SPLIT_COLUMNS = ("noise_scale", "noise_rank", "leapfrog_steps", "ll", "r_hat_pred_max",
                 "ess_pred_min", "gates")
SET_COLUMNS = ("splits", "passing", "failing_noise_ranks", "spearman_noise_r_hat")


def reference_runs(folder: Path, reference: str) -> list[dict]:
    """The finished runs of ``reference`` that ``folder/compare.json`` keeps."""
    document = folder / "compare.json"
    if not document.exists():
        raise ValueError(f"Expected a comparison's results folder, but {str(folder)!r} has no "
                         "compare.json.")
    runs = [r for r in read_json(document)["runs"]
            if r["entry"] == reference and r["status"] == "ok"]
    if not runs:
        raise ValueError(f"Expected finished runs of {reference!r} in {document}, found none.")
    missing = [r["split"] for r in runs if "noise_scale" not in r.get("diagnostics", {})]
    if missing:
        raise ValueError(f"Expected a sampled reference with a fixed noise in {document}, but "
                         f"splits {missing} keep no noise_scale (a classifier has none).")
    return runs


def ranks(values: Sequence[float]) -> np.ndarray:
    """The rank of each of ``values`` among them, 1 for the smallest (ties in input order)."""
    return np.argsort(np.argsort(values, kind="stable"), kind="stable") + 1


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks of ``x`` and ``y``."""
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def split_rows(runs: Sequence[dict]) -> list[dict]:
    """One row per run (a data set's split): its noise, the noise's rank in its data set,
    its leapfrog steps, test LL, predictive R-hat and ESS, and its gate."""
    rows = []
    for data in dict.fromkeys(r["data"] for r in runs):
        own = sorted((r for r in runs if r["data"] == data), key=lambda r: r["split"])
        rank = ranks([r["diagnostics"]["noise_scale"] for r in own])
        for r, k in zip(own, rank, strict=True):
            d = r["diagnostics"]
            rows.append({"data": data, "split": r["split"], "noise_scale": d["noise_scale"],
                         "noise_rank": int(k), "leapfrog_steps": d.get("leapfrog_steps"),
                         "ll": r["metrics"]["ll"], "r_hat_pred_max": d["r_hat_pred_max"],
                         "ess_pred_min": d["ess_pred_min"],
                         "gates": "; ".join(GATE.failures(d)) or "pass", **run_columns(r)})
    return rows


def set_rows(rows: Sequence[dict]) -> list[dict]:
    """Per data set of `split_rows`: its splits, how many pass, the noise ranks of those
    that fail, and the rank correlation between noise and R-hat."""
    out = []
    for data in dict.fromkeys(r["data"] for r in rows):
        own = [r for r in rows if r["data"] == data]
        failing = sorted(r["noise_rank"] for r in own if r["gates"] != "pass")
        out.append({"data": data, "splits": len(own),
                    "passing": sum(r["gates"] == "pass" for r in own),
                    "failing_noise_ranks": " ".join(map(str, failing)) or "-",
                    "spearman_noise_r_hat": spearman([r["noise_scale"] for r in own],
                                                     [r["r_hat_pred_max"] for r in own])})
    return out


def figure(rows: Sequence[dict]) -> Figure:
    """Each split's R-hat over the test predictive against its noise over its data set's
    median (R-hat logarithmic), the gate's R-hat dashed, the failing splits hollow."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for data in dict.fromkeys(r["data"] for r in rows):
        own = [r for r in rows if r["data"] == data]
        median = np.median([r["noise_scale"] for r in own])
        x = np.array([r["noise_scale"] / median for r in own])
        y = np.array([r["r_hat_pred_max"] - 1 for r in own])
        passing = np.array([r["gates"] == "pass" for r in own])
        colour = ax.scatter(x[passing], y[passing], label=data).get_facecolor()[0]
        ax.scatter(x[~passing], y[~passing], facecolors="none", edgecolors=[colour])
    ax.axhline(GATE.r_hat - 1, color="grey", linestyle="--", label="gate")
    ax.set(yscale="log", xlabel="noise scale / the set's median",
           ylabel="R-hat - 1 over the test predictive")
    ax.legend()
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path,
                        help="results folders of references, each with its compare.json")
    parser.add_argument("--reference", default=REFERENCE,
                        help=f"the sampled reference entry (default: {REFERENCE})")
    flags.add_shared_flags(parser, out="results/gate_by_noise",
                           without=("device", "splits", "retain_freed_memory"))
    args = flags.parse(parser, argv)
    try:
        runs = [r for folder in args.folders for r in reference_runs(folder, args.reference)]
    except ValueError as error:
        parser.error(str(error))
    held = [(r["data"], r["split"]) for r in runs]
    if len(set(held)) < len(held):
        parser.error(f"folders hold a split twice: {sorted(k for k in held if held.count(k) > 1)}")
    rows = split_rows(runs)
    provenance = versions(rows)
    print(write_tables(args.out, "gate_by_noise", rows, keys=("data", "split"),
                       columns=SPLIT_COLUMNS, provenance=provenance))
    print(write_tables(args.out, "gate_by_noise_sets", set_rows(rows), keys=("data",),
                       columns=SET_COLUMNS, provenance=provenance))
    save_figure(figure(rows), Path(args.out) / "gate_by_noise.png")
    return rows


if __name__ == "__main__":
    main()
