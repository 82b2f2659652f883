"""The standard UCI regression benchmark, beside the published numbers.

Protocol (Hernandez-Lobato & Adams 2015; Gal & Ghahramani 2016): the data's own
train/test splits (20, 5 for protein), one hidden ReLU layer of 50 units (100 for
protein), inputs and targets standardised with the training split's statistics
inside ``entry.fit``, metrics in original units, mean ± standard error over splits.
Every entry runs with its own fixed budget (the same for every data set; nothing is
tuned on the test splits). An entry with a single learned noise scale
(``Entry.tunable_noise``: the SVI entries) fits on 90% of the training split and
takes the noise that maximises the log-likelihood of the other 10%
(``--validation``; see :mod:`bnn_zoo.evaluation._noise_tuning`); the others keep their own noise
model (Laplace's evidence, the GP's marginal likelihood). The protocol's settings are
:func:`bnn_zoo._harness.compare.data_overrides`, which ``benchmarks/compare_guides.py`` applies
to the UCI sets too.

Writes under ``--out``:

* ``uci.csv``: one row per (entry, data set, split): ``entry, dataset, split, seed, status,
  ll, rmse, coverage_50, coverage_90, coverage_95, fit_seconds, reason`` (why a run was
  skipped or failed, e.g. a data set too large for an exact GP), ``code, commit`` (the
  code version and git commit of the run: :mod:`bnn_zoo._harness.provenance`);
* ``uci_summary.md``/``.csv``/``.json``: per data set, every entry's mean ± standard error
  over splits and the number of splits, the published VI, PBP, MC dropout and
  deep-ensembles rows beside them, and in ``notes`` why runs are missing;
* ``uci_best.md``/...: per data set, the zoo's best entry by test log-likelihood against
  the best published one (MC dropout or deep ensembles);
* ``uci_wins.md``/...: per entry, on how many data sets its test log-likelihood beats VI's,
  PBP's and the best published, and its total fit time;
* ``uci_methods.md``/...: per data set, the entries that run a published method
  (``mc_dropout``, ``deep_ensemble``) against its published test log-likelihood;
* ``uci_ll.png``: one panel per data set, every entry's test log-likelihood minus the best
  published one, with standard-error bars;
* with ``--reference nuts``: ``reference.md``/``.csv``/``.json``, every entry's distance to
  the reference predictive (2-Wasserstein between moment-matched Gaussians, log-likelihood
  gap) and the reference's convergence diagnostics, split by split and over the splits
  (:func:`bnn_zoo._harness.compare.write_reference`, as ``compare`` writes them).

Finished (entry, data set, split) runs are cached in ``--out/runs`` and skipped on a
rerun. The cache is not committed, but ``uci_summary.json`` keeps every run's record: each
run starts by restoring the missing cache files from the ``uci_summary.json`` in ``--out``
(:func:`bnn_zoo._harness.runs.restore_cache`), so on a fresh checkout of the committed
results a run fits only what they lack, and ``--cached-only`` rewrites them as they are. The
cache key holds the code version (:mod:`bnn_zoo._harness.provenance`): a committed run of
other code than the checkout's is fitted again (``--cached-only`` lists it as not cached;
``python -m bnn_zoo stale`` lists such cells).
With ``--replicas auto`` (the default) the splits of a data set are fitted together,
as replicas in one vectorised pass, by every entry that can batch them (``map``,
``mean_field``, ``bbb``, ``ensemble`` and ``deep_ensemble``, whose splits x members all
train as replicas, and the ``laplace`` entries their MAP phases, then each split's
posterior alone), and
one by one by the others; ``--replicas off`` fits every split alone.

The unit of work is one (entry, data set) batch of splits (the splits of a data set stay
together, so that they batch as replicas; :mod:`bnn_zoo._harness.sweep`). ``--jobs J`` runs
the batches on a local Dask cluster of ``J`` single-threaded worker processes (each torch
with ``--threads`` threads), the longest first; ``--scheduler ADDRESS`` sends them to a
running Dask cluster (``dask scheduler``/``dask worker``, or dask-jobqueue's
``SLURMCluster`` on a cluster's nodes), whose workers need only the package and the data
folder. Both need ``pip install bnn-zoo[cluster]`` and give the records of a run in one
process; a batch whose worker dies runs again, and the runs that finished are in the cache.
Small nets gain little from a second thread and much from a second process: on 2 cores
``--jobs 2 --threads 1`` uses both.

    BNN_ZOO_DATA=../shared/data/uci python benchmarks/uci.py --splits 5 --threads 1

``--gap`` runs the same protocol on the gap splits instead (Foong, Li, Hernandez-Lobato &
Turner 2019, "'In-Between' Uncertainty in Bayesian Neural Networks";
``data.load("uci_gap/<name>", split=d)``): one split per input dimension ``d`` (``--splits
K``: the first ``K`` dimensions), its middle third by ``x_d`` held out as the test set, so
that the test log-likelihood is the in-between one. It writes under ``--out`` (default
``results/uci_gap``) ``uci_gap.csv`` (one row per entry, data set and dimension, the
dimension in ``split``), ``uci_gap_summary.md``/... (mean ± standard error over the
dimensions; no published rows: the papers above report none for these splits) and
``uci_gap_coverage.md``/...: per data set and entry, the mean coverage of the 90% interval
over the dimensions, the lowest, how many dimensions fall below :data:`COVERAGE_FLOOR` and
whether the mean keeps to it (:func:`coverage_rows`). The cache and ``--cached-only``
work as above, from ``uci_gap_summary.json``.

    BNN_ZOO_DATA=../shared/data/uci python benchmarks/uci.py --gap --data yacht energy \
        --entries map bbb --threads 1
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from bnn_zoo._core.data import UCI_GAP_PREFIX, UCI_PREFIX, UCI_SETS, uci_set
from bnn_zoo._harness import compare, flags, provenance, published, runs
from bnn_zoo._harness.figures import save_figure
from bnn_zoo._harness.tables import write_csv, write_tables

DEFAULT_SETS = UCI_SETS
#: The default results folders of the standard splits and of the gap splits (``--gap``).
OUT, GAP_OUT = "results/uci", "results/uci_gap"
#: The coverage of the 90% interval that an entry keeps on the gap splits where its
#: in-between uncertainty holds, below which it collapses.
COVERAGE_FLOOR = 0.8
COLUMNS = ("rmse", "ll", "coverage_90", "fit_seconds")
#: Where the x axis of a panel of ``uci_ll.png`` stops (LL minus the best published).
FIGURE_FLOOR = -1.5
#: The metrics of a run in ``uci.csv``.
METRICS = ("ll", "rmse", "coverage_50", "coverage_90", "coverage_95", "fit_seconds")


def published_rows() -> list[dict]:
    """The published RMSE and test log-likelihood of every method on every data set, as
    rows beside the measured ones in ``uci.md``."""
    rows = []
    for name in published.PUBLISHED:
        for method in published.METHODS:
            row = {"data": f"uci/{name}", "entry": f"{method} (published)"}
            for metric in ("rmse", "ll"):
                row[metric], row[f"{metric}_se"] = published.published(name, metric, method)
            rows.append(row)
    return rows


def best_published(data: str) -> tuple[str, float, float]:
    """``(method, mean, se)`` of the highest published test log-likelihood on ``data``."""
    return max(((m, *published.published(data, "ll", m)) for m in published.METHODS),
               key=lambda item: item[1])


#: The entries that run a method of the published table, and its name there.
PUBLISHED_METHODS = {"mc_dropout": "MC dropout", "deep_ensemble": "deep ensembles"}


def method_rows(summary: Sequence[dict]) -> list[dict]:
    """Per data set, each entry of :data:`PUBLISHED_METHODS` against the published test LL
    of its method: ``reaches`` where its mean is at least the published mean less the
    published standard error."""
    rows = []
    for r in _finished(summary):
        method = PUBLISHED_METHODS.get(r["entry"])
        if method is not None:
            mean, se = published.published(r["data"], "ll", method)
            rows.append({"data": r["data"], "entry": r["entry"], "runs": r["runs"],
                         "ll": r["ll"], "ll_se": r.get("ll_se"), "published": method,
                         "published_ll": mean, "published_ll_se": se,
                         "reaches": r["ll"] >= mean - se})
    return rows


def tidy_rows(records: Sequence[dict]) -> list[dict]:
    """One row per run: its keys, status, metrics, if it did not finish why, and the code
    version and commit it comes from (:func:`~bnn_zoo._harness.provenance.run_columns`)."""
    return [{"entry": r["entry"], "dataset": uci_set(r["data"]), "split": r["split"],
             "seed": r["seed"], "status": r["status"],
             **{k: r.get("metrics", {}).get(k) for k in METRICS}, "reason": r.get("reason", ""),
             **provenance.run_columns(r)}
            for r in records]


def _finished(summary: Sequence[dict]) -> list[dict]:
    return [r for r in summary if r.get("runs") and isinstance(r.get("ll"), float)]


def wins(summary: Sequence[dict]) -> list[dict]:
    """Per entry: data sets where its mean test LL beats VI's, PBP's and the best published,
    and its fit time."""
    rows = []
    for entry in dict.fromkeys(row["entry"] for row in summary):
        mine = [r for r in _finished(summary) if r["entry"] == entry]
        total = sum(r["fit_seconds"] * r["runs"] for r in mine)
        rows.append({
            "entry": entry, "data_sets": len(mine),
            "ll_above_vi": sum(r["ll"] > published.published(r["data"], "ll", "VI")[0]
                               for r in mine),
            "ll_above_pbp": sum(r["ll"] > published.published(r["data"], "ll", "PBP")[0]
                                for r in mine),
            "ll_above_best": sum(r["ll"] > best_published(r["data"])[1] for r in mine),
            "fit_minutes": total / 60, "mean_fit_seconds": total / max(1, sum(r["runs"]
                                                                              for r in mine)),
        })
    return rows


def best_rows(summary: Sequence[dict]) -> list[dict]:
    """Per data set: the zoo's best entry by mean test LL against the best published, among
    the entries that ran the most splits there (a mean over a few splits is not compared
    with one over twenty)."""
    rows = []
    for data in dict.fromkeys(r["data"] for r in summary):
        finished = [r for r in _finished(summary) if r["data"] == data]
        if not finished:
            continue
        most = max(r["runs"] for r in finished)
        best = max((r for r in finished if r["runs"] == most), key=lambda r: r["ll"])
        method, mean, se = best_published(data)
        rows.append({"data": data, "entry": best["entry"], "runs": best["runs"],
                     "ll": best["ll"], "ll_se": best.get("ll_se"), "published": method,
                     "published_ll": mean, "published_ll_se": se, "beats": best["ll"] > mean})
    return rows


def ll_figure(summary: Sequence[dict], path: Path) -> Path:
    """One panel per data set: each entry's mean test LL minus the best published one, with
    standard-error bars; the published methods as crosses."""
    sets = list(dict.fromkeys(r["data"] for r in summary))
    cols = min(3, len(sets))
    rows = -(-len(sets) // cols)
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, data in zip(axes, sets):
        best = best_published(data)[1]
        mine = [r for r in _finished(summary) if r["data"] == data]
        names = [r["entry"] for r in mine] + [f"{m} (published)" for m in published.METHODS]
        values = [r["ll"] - best for r in mine] + [
            published.published(data, "ll", m)[0] - best for m in published.METHODS]
        # One split has no standard error (nan): no bar.
        errors = [r["ll_se"] if math.isfinite(r.get("ll_se") or math.nan) else 0.0
                  for r in mine] + [
            published.published(data, "ll", m)[1] for m in published.METHODS]
        ys = range(len(names))
        # Far-off entries would squash the rest: the axis stops at FIGURE_FLOOR, and a value
        # beyond it is drawn at the edge as "<" with its number.
        lo = max(FIGURE_FLOOR, min(v - e for v, e in zip(values, errors)) - 0.1)
        hi = max(v + e for v, e in zip(values, errors)) + 0.1
        for y, v, e, name in zip(ys, values, errors, names):
            colour = "0.5" if name.endswith("(published)") else "C0"
            if v < lo:
                ax.plot(lo, y, "<", c=colour, ms=5)
                ax.annotate(f"{v:.2f}", (lo, y), xytext=(6, -3), textcoords="offset points",
                            fontsize=6)
            else:
                ax.errorbar(v, y, xerr=e, fmt="x" if colour == "0.5" else "o", c=colour,
                            ms=4, capsize=2)
        ax.axvline(0, c="k", lw=0.5)
        ax.set_yticks(list(ys), names, fontsize=6)
        ax.set_xlim(lo, hi)
        ax.set_title(data.removeprefix("uci/"), fontsize=9)
        ax.set_xlabel("test LL - best published (nats/point)", fontsize=7)
    for ax in axes[len(sets):]:
        ax.set_axis_off()
    return save_figure(fig, path)


def coverage_rows(records: Sequence[dict]) -> list[dict]:
    """Per data set and entry of the finished gap-split runs in ``records``: the mean
    coverage of the 90% interval over the input dimensions (``coverage_90``), the lowest
    (``coverage_90_min``), how many dimensions fall below :data:`COVERAGE_FLOOR`
    (``dims_below``) and whether the mean keeps to it (``keeps``)."""
    finished = [{"data": r["data"], "entry": r["entry"], "coverage": r["metrics"]["coverage_90"]}
                for r in records if r["status"] == "ok"]
    if not finished:
        return []
    rows = pd.DataFrame(finished).groupby(["data", "entry"], sort=False)["coverage"].agg(
        runs="count", coverage_90="mean", coverage_90_min="min",
        dims_below=lambda c: (c < COVERAGE_FLOOR).sum()).reset_index()
    rows["keeps"] = rows["coverage_90"] >= COVERAGE_FLOOR
    return rows.to_dict("records")


def write_standard_tables(summary: list[dict], out: Path) -> None:
    """Write and print the tables of the standard splits against the published numbers:
    ``uci_best``, ``uci_wins``, ``uci_methods`` (:func:`method_rows`) and the figure
    ``uci_ll.png``."""
    best = best_rows(summary)
    origin = provenance.versions(summary)
    best_table = write_tables(out, "uci_best", best, keys=("data", "entry"),
                              columns=("ll", "published", "published_ll", "beats"),
                              provenance=origin)
    won = write_tables(out, "uci_wins", wins(summary), keys=("entry",),
                       columns=("data_sets", "ll_above_vi", "ll_above_pbp", "ll_above_best",
                                "fit_minutes", "mean_fit_seconds"), provenance=origin)
    methods = method_rows(summary)
    methods_table = write_tables(out, "uci_methods", methods, keys=("data", "entry"),
                                 columns=("ll", "published", "published_ll", "reaches"),
                                 provenance=origin)
    figure = ll_figure(summary, out / "uci_ll.png")
    print(best_table)
    print(won)
    print(methods_table)
    print(f"The best entry beats the best published test LL on {sum(r['beats'] for r in best)} "
          f"of {len(best)} data sets.")
    print(f"Wrote {out}/uci.csv, uci_summary.md/.csv/.json, uci_best.*, uci_wins.*, "
          f"uci_methods.*, {figure.name}")


def write_gap_tables(records: list[dict], out: Path) -> None:
    """Write and print the coverage table of the gap splits (``uci_gap_coverage``)."""
    origin = provenance.versions(provenance.run_columns(r) for r in records
                                 if r["status"] == "ok")
    table = write_tables(out, "uci_gap_coverage", coverage_rows(records), keys=("data", "entry"),
                         columns=("coverage_90", "coverage_90_min", "dims_below", "keeps"),
                         provenance=origin)
    print(table)
    print(f"Wrote {out}/uci_gap.csv, uci_gap_summary.md/.csv/.json, uci_gap_coverage.*")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The flags of the protocol; ``--out`` defaults to :data:`GAP_OUT` with ``--gap``, and
    ``--data`` names the sets in full (``uci/<name>`` or, with ``--gap``, ``uci_gap/<name>``)."""
    gap = argparse.ArgumentParser(add_help=False)
    gap.add_argument("--gap", action="store_true")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_comparison_flags(parser, data=DEFAULT_SETS, splits=20, threads=1,
                               out=GAP_OUT if gap.parse_known_args(argv)[0].gap else OUT)
    parser.add_argument("--gap", action="store_true",
                        help="the gap splits (uci_gap/<name>): one split per input dimension, "
                             f"its middle third held out (default --out: {GAP_OUT})")
    parser.add_argument("--validation", type=float, default=compare.UCI_VALIDATION,
                        help="share of the training split on which entries with a single "
                             "learned noise scale tune it (0: keep the learned noise)")
    flags.add_cached_only_flag(parser)
    args = flags.parse(parser, argv)
    if not 0.0 <= args.validation < 1.0:
        parser.error(f"--validation must be in [0, 1), got {args.validation}")
    prefix = UCI_GAP_PREFIX if args.gap else UCI_PREFIX
    args.data = [f"{prefix}{uci_set(d) or d}" for d in args.data]
    return args


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    prefix = UCI_GAP_PREFIX if args.gap else UCI_PREFIX
    name = prefix.removesuffix("/")
    restored = runs.restore_cache(args.out, f"{name}_summary", task="regression")
    print(f"Restored {restored} cached runs from {args.out}/{name}_summary.json")
    records = compare.records_from_args(args, validation=args.validation)
    reference = flags.reference_entry(args)
    measured = {r["data"] for r in records}
    write_csv(args.out / f"{name}.csv", tidy_rows(records))
    summary, table = compare.write_comparison(
        records, args.out, name=f"{name}_summary", reference=reference, columns=COLUMNS,
        markdown_rows=[r for r in published_rows() if r["data"] in measured])
    print(table)
    if reference is not None and compare.write_reference(records, args.out,
                                                          reference) is not None:
        print(f"Wrote {args.out}/reference.md, .csv, .json")
    if args.gap:
        write_gap_tables(records, args.out)
    else:
        write_standard_tables(summary, args.out)
    return records


if __name__ == "__main__":
    main()
