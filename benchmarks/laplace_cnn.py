"""Every Laplace entry on a user's CNN: scikit-learn's 8x8 digits as images (N, 1, 8, 8), the
network ``Conv2d -> ReLU -> AvgPool2d -> Flatten -> Linear -> Tanh -> Linear`` given to each
entry with ``net=``, its prior precision tuned as the entry does by default (the evidence,
then a factor chosen on a tenth of the training points held out; Daxberger et al. 2021,
"Laplace Redux -- Effortless Bayesian Deep Learning"), against ``map`` on the same network.

Writes ``laplace_cnn.md``/``.csv``/``.json`` (accuracy, NLL, ECE, Brier, fit seconds and the
tuned prior precisions per entry, each over ``--splits`` random 80/20 splits of the 1797
digits) and ``reliability.png`` (the reliability diagram of each entry on split 0).

    python benchmarks/laplace_cnn.py --out benchmarks/results/laplace_cnn
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence

import matplotlib.pyplot as plt
import pyro
import torch
from sklearn.datasets import load_digits
from torch import Tensor, nn

from bnn_zoo import zoo
from bnn_zoo._harness import flags
from bnn_zoo._harness.figures import reliability_diagram, save_figure
from bnn_zoo._harness.summary import aggregate
from bnn_zoo._harness.tables import write_tables

ENTRIES = ("map", "laplace", "laplace_full", "laplace_ggn", "laplace_diag", "laplace_kron",
           "laplace_last_layer")
METRICS = ("accuracy", "nll", "ece", "brier")


def cnn() -> nn.Module:
    """The user's CNN: images (N, 1, 8, 8) to logits (N, 10)."""
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 4 * 4, 32), nn.Tanh(), nn.Linear(32, 10))


def split(k: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Split ``k``: a seeded 80/20 permutation of the digits, pixels in [0, 1]."""
    data = load_digits()
    x = (torch.as_tensor(data.images, dtype=torch.float32) / 16).unsqueeze(1).to(device)
    y = torch.as_tensor(data.target).to(device)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(k)).to(device)
    cut = round(0.8 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def run(entry: str, k: int, args: argparse.Namespace) -> tuple[dict, Tensor, Tensor]:
    """One fit of ``entry`` on split ``k``: its record, test probabilities and labels."""
    x, y, x_test, y_test = split(k, args.device)
    pyro.set_rng_seed(k)
    overrides = {} if args.steps is None else {"steps": args.steps}
    start = time.perf_counter()
    fitted = zoo.get(entry).fit(x, y, net=cnn, seed=k, **overrides)
    seconds = time.perf_counter() - start
    metrics = fitted.evaluate(x_test, y_test)
    alphas = [v for key, v in fitted.diagnostics.items() if key.startswith("alpha_")]
    record = {"entry": entry, "split": k, "fit_seconds": seconds,
              **{m: metrics[m] for m in METRICS},
              "alpha_min": min(alphas, default=math.nan),
              "alpha_max": max(alphas, default=math.nan)}
    return record, fitted.predict(x_test).probs.mean(0), y_test


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_shared_flags(parser, out="results/laplace_cnn", threads=2, splits=3)
    flags.add_entries_flag(parser, ENTRIES)
    parser.add_argument("--steps", type=flags.positive_int, default=None,
                        help="training steps of every fit (default: the entry's budget)")
    args = flags.parse(parser, argv)
    records, curves, rows = [], {}, []
    for entry in args.entries:
        for k in range(args.splits):
            record, probs, y = run(entry, k, args)
            records.append(record)
            curves.setdefault(entry, (probs, y))
            print(f"{entry} split {k}: " + ", ".join(f"{m} {record[m]:.3f}" for m in METRICS),
                  flush=True)
        rows = write_results(records, curves, args)
    return rows


def write_results(records: Sequence[dict], curves: dict, args: argparse.Namespace
                  ) -> list[dict]:
    """The tables and the reliability diagrams of the runs so far (written after every
    entry, so that a long run keeps what it finished)."""
    rows = aggregate(records, ("entry",), ignore=("split",))
    table = write_tables(args.out, "laplace_cnn", rows, keys=("entry",),
                         columns=(*METRICS, "fit_seconds", "alpha_min", "alpha_max"),
                         runs=records)
    fig, axes = plt.subplots(1, len(curves), figsize=(3 * len(curves), 3), squeeze=False)
    for ax, (entry, (probs, y)) in zip(axes[0], curves.items()):
        reliability_diagram(probs, y, ax=ax, title=entry)
    save_figure(fig, args.out / "reliability.png")
    print(table, flush=True)
    return rows


if __name__ == "__main__":
    main()
