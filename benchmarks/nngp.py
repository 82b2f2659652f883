"""The infinite-width limit against finite nets.

After the second half of Arbel's lecture notes "Bayesian NN under a Laplace approximation"
(2021):

1. Prior: for one-hidden-layer nets of growing width ``H`` under the fan-in Gaussian
   prior, the empirical covariance of the outputs at three inputs against the NNGP
   kernel (largest error, in Monte Carlo standard errors: the covariance is exact at
   every ``H``), and the distance of the output's marginal from its Gaussian limit
   (excess kurtosis, which falls as 1/H, and the Kolmogorov-Smirnov distance).
2. Posterior: test log-likelihood per point and RMSE of the zoo entries ``nngp`` (the
   GP limit, type-II ML) and finite-width BNNs (``bbb``, ``map``, ...) on ``sine``,
   ``gap`` and ``uci/concrete``, mean and standard error over splits.

Writes ``nngp.md``, ``nngp.json``, ``nngp_width_sweep.csv``, ``nngp_test.csv``,
``covariance.png`` and ``test_ll.png`` into ``--out``.

    python benchmarks/nngp.py --out results/nngp
    python benchmarks/nngp.py --widths 1 16 --samples 200 --datasets sine --entries nngp map \
        --steps 5 --train-size 60        # a few seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import pyro
import torch
from matplotlib.figure import Figure

from bnn_zoo import data
from bnn_zoo._harness import flags
from bnn_zoo._harness.compare import default_entries, split_indices
from bnn_zoo._harness.figures import save_figure
from bnn_zoo._harness.prior_command import width_sweep
from bnn_zoo._harness.runs import run_one
from bnn_zoo._harness.summary import aggregate
from bnn_zoo._harness.tables import Table, run_line, write_table_group

METRICS = ("ll", "rmse", "coverage_90", "fit_seconds")


def evaluate_entries(args: argparse.Namespace) -> list[dict]:
    """Per data set and entry: the test metrics' mean and standard error over the splits,
    each entry fitted on the first ``--train-size`` training points (all by default); an
    entry that declines or fails has the reason instead."""
    rows = []
    for name in args.data:
        for split in split_indices(name, args.splits):
            ds = data.load(name, split).to(args.device)
            n = ds.x_train.shape[0] if args.train_size is None else args.train_size
            ds = dataclasses.replace(ds, x_train=ds.x_train[:n], y_train=ds.y_train[:n])
            for entry in args.entries or default_entries(ds.task):
                record = run_one(entry, ds, split=split, seed=args.seed + split,
                                 overrides=flags.budget_overrides(args),
                                 num_samples=args.num_samples)
                row = {"data": name, "entry": entry}
                if record["status"] == "ok":
                    rows.append({**row, **{k: record["metrics"][k] for k in METRICS}})
                else:
                    rows.append({**row, "reason": f"{record['status']}: {record['reason']}"})
                print(run_line(rows[-1]), flush=True)
    return aggregate(rows, ("data", "entry"))


def plot(sweep: list[dict], rows: list[dict], out: Path) -> None:
    widths = [r["width"] for r in sweep]
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.plot(widths, [r["cov_error_in_se"] for r in sweep], "o-")
    left.axhline(4, color="k", ls="--", label="4 standard errors")
    left.set_xscale("log")
    left.set_xlabel("width H")
    left.set_ylabel("max |Cov_emp - K| / s.e.")
    left.set_title("Covariance of f against the NNGP kernel")
    left.legend()
    kurt = [max(abs(r["excess_kurtosis"]), 1e-4) for r in sweep]
    right.loglog(widths, kurt, "o-", label="|excess kurtosis|")
    right.loglog(widths, [r["ks_to_gaussian"] for r in sweep], "s-", label="KS distance")
    right.loglog(widths, [kurt[0] / w for w in widths], "k--", label="1/H")
    right.set_xlabel("width H")
    right.set_title("Distance of f(x) from its Gaussian limit")
    right.legend()
    save_figure(fig, out / "covariance.png", dpi=120)

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    datasets = list(dict.fromkeys(r["data"] for r in rows))
    entries = list(dict.fromkeys(r["entry"] for r in rows))
    bar = 0.8 / len(entries)
    for j, entry in enumerate(entries):
        mine = {datasets.index(r["data"]): r for r in rows if r["entry"] == entry and "ll" in r}
        errors = [0.0 if math.isnan(r["ll_se"]) else r["ll_se"] for r in mine.values()]
        ax.bar([i + j * bar for i in mine], [r["ll"] for r in mine.values()], bar, yerr=errors,
               label=entry)
    ax.set_xticks([i + 0.4 - bar / 2 for i in range(len(datasets))], datasets)
    ax.set_ylabel("test log-likelihood per point")
    ax.legend()
    save_figure(fig, out / "test_ll.png", dpi=120)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=flags.positive_int, nargs="+",
                        default=[1, 4, 16, 64, 256, 1024])
    parser.add_argument("--samples", type=flags.positive_int, default=20000,
                        help="prior samples per width")
    parser.add_argument("--activation", default="relu")
    flags.add_data_flag(parser, ("sine", "gap", "uci/concrete"))
    flags.add_entries_flag(parser, ("nngp", "nngp-erf", "bbb", "map"))
    flags.add_fit_flags(parser)
    parser.add_argument("--train-size", type=flags.positive_int, default=None,
                        help="use only the first N training points (for quick runs)")
    flags.add_shared_flags(parser, out="results/nngp", threads=1)
    args = flags.parse(parser, argv)
    pyro.set_rng_seed(args.seed)
    x = torch.tensor([[-1.0], [0.5], [2.0]], dtype=torch.float64, device=args.device)
    sweep, _ = width_sweep(args.widths, x, args.samples, args.activation)
    rows = evaluate_entries(args)
    print(write_table_group(args.out, "nngp", [
        Table("width_sweep", f"Prior: one hidden {args.activation} layer against the NNGP "
              "kernel", sweep, keys=("width",), columns=[k for k in sweep[0] if k != "width"]),
        Table("test", "Test log-likelihood and RMSE", rows, keys=("data", "entry"),
              columns=[*METRICS, "reason"]),
    ]))
    plot(sweep, rows, args.out)
    return {"width_sweep": sweep, "test": rows}


if __name__ == "__main__":
    main()
