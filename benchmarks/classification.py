"""Classification benchmark: every classification entry of the zoo on every classification set.

For each (data set, entry) pair: fit on the training split with the entry's own
budget (``entry.fit``, through :func:`bnn_zoo._harness.compare.run_comparison`, which
caches finished runs under ``--out/runs``), then on the held-out split report
accuracy, NLL per point, Brier score, ECE (15 bins), mean predictive entropy (nats) and
its epistemic part, the mutual information between label and weights (``mi``; the JSON
and CSV also keep the aleatoric part, ``aleatoric``), the AUROC of the predictive entropy
for telling test points from a shifted copy of them (Gaussian noise of one training
standard deviation per feature), fit time and milliseconds per SVI step, mean ± standard
error over ``--splits``.
Writes, under ``--out``:

* ``classification.md`` (also printed), ``classification.csv`` and
  ``classification.json``: one row per pair;
* ``reliability.png``: reliability diagrams of the first split, one row per data set,
  one column per entry.

Finished runs are cached in ``--out/runs``; ``classification.json`` keeps every run's
record, and each run first restores the cache files it lacks from the one in ``--out``
(:func:`bnn_zoo._harness.runs.restore_cache`), so that on a fresh checkout a run fits only
what that file lacks, or holds under other settings (e.g. an entry that batches its
splits as replicas, which joins the cache key, where the file's runs were fitted one by
one). A restored run whose record holds no reliability bins has no diagram (its panel
says so).

    python benchmarks/classification.py                       # all entries, 4 data sets
    python benchmarks/classification.py --data mnist1d        # needs bnn-zoo[mnist1d]
    python benchmarks/classification.py --steps 20 --datasets wine --num-samples 20
    python benchmarks/classification.py --jobs 2     # a local Dask cluster of 2 processes
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from matplotlib.figure import Figure

from bnn_zoo import zoo
from bnn_zoo._harness import compare, flags, runs
from bnn_zoo._harness.figures import draw_reliability, save_figure

DATASETS = ("two_moons", "breast_cancer", "digits", "wine")
#: MNIST-1D needs the optional ``mnist1d`` package, so it is a choice, not a default.
CHOICES = (*DATASETS, "mnist1d")
COLUMNS = ("accuracy", "nll", "brier", "ece", "entropy", "mi", "auroc_shift", "fit_seconds",
           "ms_per_step")


def reliability_grid(records: list[dict], datasets: Sequence[str], entries: Sequence[str]
                     ) -> Figure:
    """Reliability diagrams of the first split: one row per data set, one column per entry."""
    fig = Figure(figsize=(3 * len(entries), 3 * len(datasets)), layout="constrained")
    axes = fig.subplots(len(datasets), len(entries), squeeze=False)
    for i, dataset in enumerate(datasets):
        for j, entry in enumerate(entries):
            done = [r for r in records if r["data"] == dataset and r["entry"] == entry
                    and r["status"] == "ok"]
            first = min(done, key=lambda r: r["split"]) if done else None
            if first is None:
                axes[i, j].set_axis_off()
            elif "reliability" in first:
                draw_reliability(first["reliability"], first["metrics"]["ece"], axes[i, j],
                                 f"{dataset}: {entry}")
            else:  # restored from a JSON that kept no bins
                axes[i, j].set_axis_off()
                axes[i, j].text(0.5, 0.5, f"{dataset}: {entry}\nno bins kept", ha="center",
                                va="center", fontsize=8, transform=axes[i, j].transAxes)
    return fig


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_data_flag(parser, DATASETS, choices=CHOICES)
    flags.add_entries_flag(parser, None)
    flags.add_fit_flags(parser)
    flags.add_shared_flags(parser, out="results/classification", threads=1)
    flags.add_cached_only_flag(parser)
    flags.add_engine_flags(parser)
    args = flags.parse(parser, argv)
    entries = args.entries or zoo.names("classification")
    restored = runs.restore_cache(args.out, "classification", task="classification")
    print(f"Restored {restored} cached runs from {args.out}/classification.json")
    records = compare.run_comparison(args.data, entries, splits=args.splits, seed=args.seed,
                                     out=args.out, device=args.device,
                                     overrides=flags.budget_overrides(args),
                                     num_samples=args.num_samples,
                                     cached_only=args.cached_only, jobs=args.jobs,
                                     scheduler=args.scheduler, threads=args.threads)
    for r in records:
        if r["status"] == "ok" and "steps_per_second" in r["metrics"]:
            r["metrics"]["ms_per_step"] = 1e3 / r["metrics"]["steps_per_second"]
    summary, table = compare.write_comparison(records, args.out, name="classification",
                                              columns=COLUMNS, section=None)
    print(table)
    save_figure(reliability_grid(records, args.data, entries), args.out / "reliability.png",
                dpi=100)
    return summary


if __name__ == "__main__":
    main()
