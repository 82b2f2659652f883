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
import pandas as pd
from matplotlib.figure import Figure

from bnn_zoo import results
from bnn_zoo._harness import flags
from bnn_zoo._harness.figures import save_figure
from bnn_zoo._harness.provenance import versions
from bnn_zoo._harness.summary import GATE, REFERENCE
from bnn_zoo._harness.tables import write_tables

#: The diagnostics of a reference's run that the tables show, and that its gate reads.
DIAGNOSTICS = ("noise_scale", "leapfrog_steps", "r_hat_pred_max", "ess_pred_min", "chains")
SPLIT_COLUMNS = ("noise_scale", "noise_rank", "leapfrog_steps", "ll", "r_hat_pred_max",
                 "ess_pred_min", "gates")
SET_COLUMNS = ("splits", "passing", "failing_noise_ranks", "spearman_noise_r_hat")


def reference_runs(folder: Path, reference: str) -> pd.DataFrame:
    """The finished runs of ``reference`` that ``folder/compare.json`` keeps, a row each
    (`bnn_zoo.results.load`), its diagnostics under their own names."""
    runs = results.load(folder / "compare.json")
    runs = runs[(runs["entry"] == reference) & (runs["status"] == "ok")]
    if runs.empty:
        raise ValueError(f"Expected finished runs of {reference!r} in {folder}, found none.")
    if "diag_noise_scale" not in runs or runs["diag_noise_scale"].isna().any():
        raise ValueError(f"Expected a sampled reference with a fixed noise in {folder}, but "
                         "some of its runs keep no noise_scale (a classifier has none).")
    return runs.rename(columns={f"diag_{name}": name for name in DIAGNOSTICS})


def split_rows(runs: pd.DataFrame) -> list[dict]:
    """One row per run (a data set's split): its noise, the noise's rank in its data set
    (1: the smallest, ties by split), its leapfrog steps, test LL, predictive R-hat and ESS,
    and its gate."""
    runs = pd.concat(own.sort_values("split") for _, own in runs.groupby("data", sort=False))
    runs = runs.assign(
        noise_rank=runs.groupby("data", sort=False)["noise_scale"].rank(method="first")
        .astype(int),
        gates=["; ".join(GATE.failures(d)) or "pass"
               for d in runs[list(DIAGNOSTICS)].to_dict("records")])
    return runs[["data", "split", *SPLIT_COLUMNS, "code", "commit", "machine"]].to_dict(
        "records")


def set_rows(rows: Sequence[dict]) -> list[dict]:
    """Per data set of `split_rows`: its splits, how many pass, the noise ranks of those
    that fail, and Spearman's rank correlation between noise and R-hat (Pearson's
    correlation of their ranks)."""
    out = []
    for data, own in pd.DataFrame(rows).groupby("data", sort=False):
        failing = sorted(own.loc[own["gates"] != "pass", "noise_rank"])
        out.append({"data": data, "splits": len(own),
                    "passing": int((own["gates"] == "pass").sum()),
                    "failing_noise_ranks": " ".join(map(str, failing)) or "-",
                    "spearman_noise_r_hat": float(own["noise_scale"].rank().corr(
                        own["r_hat_pred_max"].rank()))})
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
        runs = pd.concat([reference_runs(folder, args.reference) for folder in args.folders])
    except ValueError as error:
        parser.error(str(error))
    held = runs[["data", "split"]]
    if held.duplicated().any():
        twice = sorted(map(tuple, held[held.duplicated()].to_numpy().tolist()))
        parser.error(f"folders hold a split twice: {twice}")
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
