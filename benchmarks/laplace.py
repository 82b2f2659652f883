"""Laplace variants (seed 001) against each other, with and without evidence tuning.

For every data set, split and curvature variant (``laplace_full``, ``laplace_ggn``,
``laplace_diag``, ``laplace_kron``, ``laplace_last_layer``) the entry is fitted twice
through the zoo, once with ``alpha`` from the prior and ``beta`` from the MAP's
learned noise and once tuned by MacKay's evidence fixed point
(``evidence="fixed_point"``; the ``laplace`` entry is ``laplace_ggn`` tuned), and
evaluated on the test split with the GLM predictive: test log-likelihood per point,
RMSE, 90% coverage and fit time (mean and standard error over splits). A figure shows
the predictive bands of every tuned variant on the first 1-D data set.

    python benchmarks/laplace.py --out results/laplace
    BNN_ZOO_DATA=../shared/data/uci python benchmarks/laplace.py   # adds uci/concrete

Writes ``laplace.md``, ``laplace.csv`` and ``laplace_bands.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
from pathlib import Path

import matplotlib
import torch

from bnn_zoo import data, zoo

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

VARIANTS = ["laplace_full", "laplace_ggn", "laplace_diag", "laplace_kron", "laplace_last_layer"]
METRICS = ["ll", "rmse", "coverage_90", "fit_seconds"]


def default_datasets() -> list[str]:
    return ["gap", "sine"] + (["uci/concrete"] if os.environ.get("BNN_ZOO_DATA") else [])


def run(args: argparse.Namespace) -> tuple[list[dict], list[tuple]]:
    """Fit and evaluate every combination; also keep the tuned fits of the first 1-D set."""
    rows, bands = [], []
    for name in args.datasets:
        for split in range(min(args.splits, data.num_splits(name))):
            d = data.load(name, split)
            for variant in args.variants:
                for evidence in (None, "fixed_point"):
                    overrides = {"steps": args.steps} if args.steps else {}
                    fitted = zoo.get(variant).fit(d.x_train, d.y_train, seed=split,
                                                  evidence=evidence, **overrides)
                    out = fitted.evaluate(d.x_test, d.y_test)
                    post = fitted.guide.posterior
                    rows.append({"dataset": name, "split": split, "variant": variant,
                                 "evidence": evidence or "none", "alpha": float(post.alpha[-1]),
                                 "beta": float(post.beta),
                                 **{m: out[m] for m in METRICS}})
                    print(rows[-1], flush=True)
                    if d.in_dim == 1 and evidence and (not bands or bands[0][2] is d):
                        bands.append((variant, fitted, d))
    return rows, bands


def summarise(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["dataset"], row["variant"], row["evidence"]), []).append(row)
    out = []
    for (name, variant, evidence), group in groups.items():
        entry = {"dataset": name, "variant": variant, "evidence": evidence,
                 "splits": len(group)}
        for m in METRICS:
            values = [r[m] for r in group]
            entry[m] = statistics.fmean(values)
            entry[m + "_se"] = (statistics.stdev(values) / math.sqrt(len(values))
                                if len(values) > 1 else 0.0)
        out.append(entry)
    return out


def write_markdown(summary: list[dict], path: Path) -> None:
    lines = ["| data | variant | evidence | splits | test LL | RMSE | 90% cover | fit s |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(
            f"| {s['dataset']} | {s['variant']} | {s['evidence']} | {s['splits']} | "
            f"{s['ll']:.3f} ± {s['ll_se']:.3f} | {s['rmse']:.3f} ± {s['rmse_se']:.3f} | "
            f"{s['coverage_90']:.2f} | {s['fit_seconds']:.1f} |")
    path.write_text("\n".join(lines) + "\n")


def plot_bands(bands: list[tuple], path: Path) -> None:
    """Predictive mean and +-2 standard deviations of each fit in ``bands``."""
    fig, axes = plt.subplots(1, max(1, len(bands)), figsize=(3.2 * max(1, len(bands)), 3),
                             sharey=True, squeeze=False)
    for ax, (variant, fitted, d) in zip(axes[0], bands):
        grid = torch.linspace(float(d.x_test.min()) - 1, float(d.x_test.max()) + 1, 300,
                              dtype=d.x_train.dtype).unsqueeze(-1)
        pred = fitted.predict(grid)
        mean, std = pred.mean.numpy(), pred.stddev.numpy()
        ax.scatter(d.x_train[:, 0], d.y_train, s=3, c="k", alpha=0.4)
        ax.plot(grid[:, 0], mean, c="C0")
        ax.fill_between(grid[:, 0].numpy(), mean - 2 * std, mean + 2 * std, alpha=0.3)
        ax.set_title(f"{variant} ({d.name}, tuned)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, bands = run(args)
    summary = summarise(rows)
    write_markdown(summary, out / "laplace.md")
    with open(out / "laplace.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot_bands(bands, out / "laplace_bands.png")
    print((out / "laplace.md").read_text())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/laplace")
    parser.add_argument("--datasets", nargs="+", default=default_datasets())
    parser.add_argument("--variants", nargs="+", default=VARIANTS)
    parser.add_argument("--splits", type=int, default=3, help="splits per data set (at most)")
    parser.add_argument("--steps", type=int, default=None, help="SVI steps for the MAP")
    parser.add_argument("--threads", type=int, default=1)
    main(parser.parse_args())
