"""The standard UCI regression benchmark, beside the published numbers.

Protocol (Hernandez-Lobato & Adams 2015; Gal & Ghahramani 2016): the data's own
train/test splits (20, 5 for protein), one hidden ReLU layer of 50 units (100 for
protein), inputs and targets standardised with the training split's statistics
inside ``entry.fit``, metrics in original units, mean ± standard error over splits.
Every entry runs with its own fixed budget (the same for every data set; nothing is
tuned on the test splits). An entry with a single learned noise scale
(``Entry.tunable_noise``: the SVI entries) fits on 90% of the training split and
takes the noise that maximises the log-likelihood of the other 10%
(``--validation``; see :mod:`bnn_zoo.evaluation.noise_tuning`); the others keep their own noise
model (Laplace's evidence, the GP's marginal likelihood).

Writes under ``--out``: ``uci.md``/``.csv``/``.json`` (per data set: every entry
with the published VI, PBP, MC dropout and deep-ensembles rows beside it),
``uci_summary.md``/``.csv``/``.json`` (per entry: on how many data sets its test
log-likelihood beats VI's and PBP's, and its total fit time) and ``uci_ll.png``.
Finished (entry, data set, split) runs are cached in ``--out/runs`` and skipped on a
rerun. With ``--replicas auto`` (the default) the splits of a data set are fitted together,
as replicas in one vectorised pass, by every entry that can batch them (``map``,
``mean_field``, ``bbb``; ``ensemble`` trains its members as replicas within each fit), and
one by one by the others; ``--replicas off`` fits every split alone.

    BNN_ZOO_DATA=../shared/data/uci python benchmarks/uci.py --splits 5 --threads 1
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from bnn_zoo import zoo
from bnn_zoo.core.data import UCI_SETS
from bnn_zoo.harness import compare, flags, published
from bnn_zoo.harness.figures import save_figure
from bnn_zoo.harness.tables import write_tables

DEFAULT_SETS = tuple(n for n in UCI_SETS if n != "protein-tertiary-structure")
COLUMNS = ("rmse", "ll", "coverage_90", "fit_seconds")
#: The protocol's model options per data set (one hidden layer of 50 units elsewhere).
MODEL_OPTIONS = {"protein-tertiary-structure": {"hidden": (100,)}}
#: The share of each training split held out to tune the observation noise.
VALIDATION_FRACTION = 0.1


def protocol_overrides(overrides: dict, validation: float) -> Callable[[str], dict]:
    """Per entry: ``overrides``, plus ``validation`` where the entry has a tunable noise."""
    def for_entry(entry: str) -> dict:
        if validation > 0 and zoo.get(entry).tunable_noise:
            return {**overrides, "validation": validation}
        return overrides

    return for_entry


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


def wins(summary: list[dict]) -> list[dict]:
    """Per entry: data sets where its mean test LL beats VI's / PBP's, and fit time."""
    rows = []
    for entry in dict.fromkeys(row["entry"] for row in summary):
        mine = [r for r in summary if r["entry"] == entry and "ll" in r]
        total = sum(r["fit_seconds"] * r["runs"] for r in mine)
        rows.append({
            "entry": entry, "data_sets": len(mine),
            "ll_above_vi": sum(r["ll"] > published.published(r["data"], "ll", "VI")[0]
                               for r in mine),
            "ll_above_pbp": sum(r["ll"] > published.published(r["data"], "ll", "PBP")[0]
                                for r in mine),
            "fit_minutes": total / 60, "mean_fit_seconds": total / max(1, sum(r["runs"]
                                                                              for r in mine)),
        })
    return rows


def ll_figure(summary: list[dict], path: Path) -> Path:
    """Test log-likelihood of every entry relative to PBP's, per data set."""
    sets = list(dict.fromkeys(r["data"] for r in summary))
    entries = list(dict.fromkeys(r["entry"] for r in summary))
    fig = Figure(figsize=(1.2 * len(sets) + 3, 4), layout="constrained")
    ax = fig.add_subplot()
    for j, method in enumerate(published.METHODS):
        ys = [published.published(s, "ll", method)[0] - published.published(s, "ll", "PBP")[0]
              for s in sets]
        ax.scatter(range(len(sets)), ys, marker="x", c=f"C{j}", label=method)
    for k, entry in enumerate(entries):
        xs, ys = [], []
        for i, s in enumerate(sets):
            row = next((r for r in summary if r["data"] == s and r["entry"] == entry
                        and "ll" in r), None)
            if row is not None:
                xs.append(i + 0.1 + 0.05 * k)
                ys.append(row["ll"] - published.published(s, "ll", "PBP")[0])
        ax.scatter(xs, ys, marker="o", s=14, c=f"C{k + len(published.METHODS)}", label=entry)
    ax.axhline(0, c="k", lw=0.5)
    ax.set_xticks(range(len(sets)), [s.removeprefix("uci/") for s in sets], rotation=30,
                  fontsize=7)
    ax.set(ylabel="test LL - PBP's (nats/point)", title="UCI: higher is better")
    ax.set_ylim(-1.5, 2.5)
    ax.legend(fontsize=6, ncol=2)
    return save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_comparison_flags(parser, data=DEFAULT_SETS, out="results/uci", splits=20,
                               threads=1)
    parser.add_argument("--validation", type=float, default=VALIDATION_FRACTION,
                        help="share of the training split on which entries with a single "
                             "learned noise scale tune it (0: keep the learned noise)")
    args = flags.parse(parser, argv)
    if not 0.0 <= args.validation < 1.0:
        parser.error(f"--validation must be in [0, 1), got {args.validation}")
    records = []
    for name in args.data:
        name = name.removeprefix("uci/")
        overrides = flags.budget_overrides(args)
        if name in MODEL_OPTIONS:
            overrides["model_options"] = MODEL_OPTIONS[name]
        records += compare.run_comparison([f"uci/{name}"], args.entries, splits=args.splits,
                                          seed=args.seed, out=args.out, device=args.device,
                                          overrides=protocol_overrides(overrides, args.validation),
                                          num_samples=args.num_samples,
                                          reference=args.reference, replicas=args.replicas)
    measured = {r["data"] for r in records}
    summary, table = compare.write_comparison(
        records, args.out, name="uci", reference=args.reference, columns=COLUMNS,
        markdown_rows=[r for r in published_rows() if r["data"] in measured])
    won = write_tables(args.out, "uci_summary", wins(summary), keys=("entry",),
                       columns=("data_sets", "ll_above_vi", "ll_above_pbp", "fit_minutes",
                                "mean_fit_seconds"))
    figure = ll_figure(summary, args.out / "uci_ll.png")
    print(table)
    print(won)
    print(f"Wrote {args.out}/uci.md, .csv, .json, uci_summary.md, .csv, .json, {figure.name}")
    return records


if __name__ == "__main__":
    main()
