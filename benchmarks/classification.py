"""Classification benchmark: every classification entry of the zoo on every classification set.

For each (data set, entry) pair: fit on the training split with the entry's own
budget (``entry.fit``), then on the held-out split report accuracy, NLL per
point, Brier score, ECE (15 bins), mean predictive entropy (nats), fit time and
milliseconds per SVI step. Writes, under ``--out``:

* ``classification.md``: the Markdown table (also printed);
* ``classification.csv``: the same numbers, one row per pair;
* ``reliability.png``: reliability diagrams (matplotlib's Agg canvas), one row per data
  set, one column per entry.

    python benchmarks/classification.py                       # all entries, 4 data sets
    python benchmarks/classification.py --steps 20 --datasets wine --num-samples 20
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
from matplotlib.figure import Figure

from bnn_zoo import data, zoo
from bnn_zoo.harness.figures import reliability_diagram

DATASETS = ("two_moons", "breast_cancer", "digits", "wine")
COLUMNS = ("accuracy", "nll", "brier", "ece", "entropy", "fit_seconds", "ms_per_step")


def run(dataset: str, entry: str, args: argparse.Namespace) -> tuple[dict, torch.Tensor,
                                                                   torch.Tensor]:
    """Fit ``entry`` on ``dataset`` and return its metrics row, test probabilities and labels."""
    d = data.load(dataset, args.split)
    overrides = {} if args.steps is None else {"steps": args.steps}
    fitted = zoo.get(entry).fit(d.x_train, d.y_train, task="classification", seed=args.seed,
                                **overrides)
    metrics = fitted.evaluate(d.x_test, d.y_test, num_samples=args.num_samples)
    probs = fitted.predict(d.x_test, num_samples=args.num_samples).mean
    steps_per_second = metrics.pop("steps_per_second", float("nan"))
    row = {"dataset": dataset, "entry": entry, **metrics, "ms_per_step": 1e3 / steps_per_second}
    return row, probs, d.y_test


def markdown(rows: list[dict]) -> str:
    header = "| data set | entry | " + " | ".join(COLUMNS) + " |"
    lines = [header, "|---|---|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [f"{r[c]:.4f}" if c not in ("fit_seconds", "ms_per_step") else f"{r[c]:.2f}"
                 for c in COLUMNS]
        lines.append(f"| {r['dataset']} | {r['entry']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", nargs="+", default=None,
                        help="zoo entries (default: every entry supporting classification)")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--split", type=int, default=0, help="train/test split of each data set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help="override every entry's number of SVI steps (for quick runs)")
    parser.add_argument("--num-samples", type=int, default=200,
                        help="posterior samples of the predictive")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/classification"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    entries = args.entries or zoo.names("classification")
    for name in entries:
        if "classification" not in zoo.get(name).tasks:
            parser.error(f"entry {name!r} does not support classification")

    rows = []
    fig = Figure(figsize=(3 * len(entries), 3 * len(args.datasets)), layout="constrained")
    axes = fig.subplots(len(args.datasets), len(entries), squeeze=False)
    for i, dataset in enumerate(args.datasets):
        for j, entry in enumerate(entries):
            row, probs, y = run(dataset, entry, args)
            rows.append(row)
            reliability_diagram(probs, y, ax=axes[i, j], title=f"{dataset}: {entry}")
            print(f"{dataset:>14} {entry:>16}  acc {row['accuracy']:.3f}  nll {row['nll']:.3f}"
                  f"  ece {row['ece']:.3f}  {row['fit_seconds']:.1f} s", flush=True)

    table = markdown(rows)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "classification.md").write_text(table + "\n")
    with open(args.out / "classification.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["dataset", "entry", *COLUMNS])
        writer.writeheader()
        writer.writerows({k: r[k] for k in writer.fieldnames} for r in rows)
    fig.savefig(args.out / "reliability.png", dpi=100)
    return rows


if __name__ == "__main__":
    main()
