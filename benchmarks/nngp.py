"""The infinite-width limit against finite nets (seed 001, second half).

1. Prior: for one-hidden-layer nets of growing width ``H`` under the fan-in Gaussian
   prior, the empirical covariance of the outputs at three inputs against the NNGP
   kernel (largest error, in Monte Carlo standard errors: the covariance is exact at
   every ``H``), and the distance of the output's marginal from its Gaussian limit
   (excess kurtosis, which falls as 1/H, and the Kolmogorov-Smirnov distance).
2. Posterior: test log-likelihood per point and RMSE of the zoo entries ``nngp`` (the
   GP limit, type-II ML) and finite-width BNNs (``bbb``, ``map``, ...) on ``sine``,
   ``gap`` and ``uci/concrete``, mean and standard error over splits.

Writes ``nngp.md``, ``nngp.json``, ``covariance.png`` and ``test_ll.png`` into ``--out``.

    python benchmarks/nngp.py --out results/nngp
    python benchmarks/nngp.py --widths 1 16 --samples 200 --datasets sine --entries nngp map \
        --steps 5 --train-size 60        # a few seconds
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402

from bnn_zoo import data, zoo  # noqa: E402
from bnn_zoo.harness.prior_command import width_sweep, write_tables  # noqa: E402


def evaluate_entries(datasets: list[str], entries: list[str], splits: int, steps: int | None,
                 train_size: int | None) -> list[dict]:
    rows = []
    for name in datasets:
        for entry in entries:
            runs = []
            for split in range(splits):
                ds = data.load(name, split)
                n = ds.x_train.shape[0] if train_size is None else train_size
                overrides = {} if steps is None else {"steps": steps}
                fitted = zoo.get(entry).fit(ds.x_train[:n], ds.y_train[:n], seed=split,
                                            **overrides)
                runs.append(fitted.evaluate(ds.x_test, ds.y_test))
            row = {"dataset": name, "entry": entry, "splits": splits}
            for key in ("ll", "rmse", "coverage_90", "fit_seconds"):
                values = [r[key] for r in runs]
                row[key] = statistics.fmean(values)
                row[f"{key}_se"] = (statistics.stdev(values) / math.sqrt(splits)
                                    if splits > 1 else 0.0)
            rows.append(row)
            print(f"{name:14s} {entry:10s} ll {row['ll']:.3f} +- {row['ll_se']:.3f}  "
                  f"rmse {row['rmse']:.3f}  {row['fit_seconds']:.1f}s", flush=True)
    return rows


def plot(sweep: list[dict], rows: list[dict], out: Path) -> None:
    widths = [r["width"] for r in sweep]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
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
    fig.tight_layout()
    fig.savefig(out / "covariance.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    entries = list(dict.fromkeys(r["entry"] for r in rows))
    bar = 0.8 / len(entries)
    for j, entry in enumerate(entries):
        mine = [next(r for r in rows if r["dataset"] == d and r["entry"] == entry)
                for d in datasets]
        ax.bar([i + j * bar for i in range(len(datasets))], [r["ll"] for r in mine], bar,
               yerr=[r["ll_se"] for r in mine], label=entry)
    ax.set_xticks([i + 0.4 - bar / 2 for i in range(len(datasets))], datasets)
    ax.set_ylabel("test log-likelihood per point")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "test_ll.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/nngp"))
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 4, 16, 64, 256, 1024])
    parser.add_argument("--samples", type=int, default=20000, help="prior samples per width")
    parser.add_argument("--activation", default="relu")
    parser.add_argument("--datasets", nargs="+", default=["sine", "gap", "uci/concrete"])
    parser.add_argument("--entries", nargs="+", default=["nngp", "nngp-erf", "bbb", "map"])
    parser.add_argument("--splits", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="override every entry's steps")
    parser.add_argument("--train-size", type=int, default=None, help="use only the first N "
                        "training points (for quick runs)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pyro.set_rng_seed(0)
    x = torch.tensor([[-1.0], [0.5], [2.0]], dtype=torch.float64)
    sweep, _ = width_sweep(args.widths, x, args.samples, args.activation)
    rows = evaluate_entries(args.datasets, args.entries, args.splits, args.steps, args.train_size)
    brief = [{k: r[k] for k in ("dataset", "entry", "splits", "ll", "ll_se", "rmse",
                                "coverage_90", "fit_seconds")} for r in rows]
    write_tables(args.out, "nngp", [
        ("width_sweep", f"Prior: one hidden {args.activation} layer against the NNGP kernel",
         sweep),
        ("test", "Test log-likelihood and RMSE", brief),
    ])
    plot(sweep, rows, args.out)
    return {"width_sweep": sweep, "test": rows}


if __name__ == "__main__":
    main()
