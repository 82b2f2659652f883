"""How far a comparison's cells move by the seed alone: the entries on each data set's splits
under several seed offsets (offset ``s`` fits split ``k`` with seed ``s + k``, as
``--seed`` does in every comparison), with the UCI protocol on UCI sets
(:func:`bnn_zoo._harness.compare.data_overrides`).

Per (data set, entry, metric), over the offsets: ``mean``, the mean of the cell's mean over
the splits; ``cell_se``, the mean of the standard error a table shows beside it; ``seed_sd``,
the standard deviation of the cell's mean from offset to offset (what re-running the same
code with other random streams moves it by); and, over every two offsets, the paired z of
``benchmarks/moves.py`` (the mean change over the splits in units of its standard error):
``z_rms``, its root mean square, against ``t_rms``, the root mean square of Student's t with
``n - 1`` degrees of freedom, what ``n`` independent splits give; and ``z_max``, the largest
``|z|``. Writes ``seed_spread.md``, ``.csv`` and ``.json`` (with every run) under ``--out``;
each offset's runs are cached in ``<out>/seed_<s>/runs``.

    python benchmarks/seed_spread.py --data uci/protein-tertiary-structure --entries map \\
        --splits 5 --threads 1 --out benchmarks/results/seed_spread
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import runpy
import statistics
from collections.abc import Sequence
from pathlib import Path

from bnn_zoo._harness import flags
from bnn_zoo._harness.compare import data_overrides, run_comparison
from bnn_zoo._harness.provenance import run_columns, versions
from bnn_zoo._harness.tables import write_tables

MOVES = runpy.run_path(str(Path(__file__).with_name("moves.py")), run_name="moves")
#: The fields of a run the JSON keeps (its predictive moments stay in the cache).
KEPT = ("entry", "data", "split", "seed", "status", "metrics", "diagnostics", "reason", "settings",
        "provenance")
COLUMNS = ("seeds", "mean", "cell_se", "seed_sd", "z_rms", "t_rms", "z_max")


def t_rms(splits: int) -> float:
    """The root mean square of Student's t with ``splits - 1`` degrees of freedom,
    ``sqrt(nu / (nu - 2))`` (infinite for ``nu <= 2``)."""
    nu = splits - 1
    return math.sqrt(nu / (nu - 2)) if nu > 2 else math.inf


def spread(by_seed: dict[int, list[dict]], metrics: Sequence[str]) -> list[dict]:
    """One row per (data set, entry, metric) of the runs of each seed offset (``by_seed``)."""
    cells: dict[tuple, dict[int, dict]] = {}
    for seed, records in by_seed.items():
        # The same runs paired with themselves: each offset's cell means and errors.
        for row in MOVES["moves"]({"runs": records}, {"runs": records}, metrics):
            cells.setdefault((row["data"], row["entry"], row["metric"]), {})[seed] = row
    pairs: dict[tuple, list[float]] = {}
    for a, b in itertools.combinations(by_seed, 2):
        for row in MOVES["moves"]({"runs": by_seed[a]}, {"runs": by_seed[b]}, metrics):
            pairs.setdefault((row["data"], row["entry"], row["metric"]), []).append(
                row["paired_z"])
    summary = []
    for (data, entry, metric), rows in cells.items():
        means = [r["new"] for r in rows.values()]
        z = pairs.get((data, entry, metric), [])
        splits = min(r["runs"] for r in rows.values())
        summary.append({
            "data": data, "entry": entry, "metric": metric, "runs": splits,
            "seeds": len(rows), "mean": statistics.fmean(means),
            "cell_se": statistics.fmean(r["new_se"] for r in rows.values()),
            "seed_sd": statistics.stdev(means) if len(means) > 1 else math.nan,
            "z_rms": math.sqrt(statistics.fmean(v * v for v in z)) if z else math.nan,
            "t_rms": t_rms(splits), "z_max": max(map(abs, z), default=math.nan)})
    return summary


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_shared_flags(parser, out="results/seed_spread", splits=5,
                           without=("seed", "retain_freed_memory"))
    flags.add_data_flag(parser, default=("uci/protein-tertiary-structure",))
    flags.add_entries_flag(parser, default=("map",))
    flags.add_engine_flags(parser)
    parser.add_argument("--seeds", type=flags.int_at_least(0), nargs="+",
                        default=[1000 * i for i in range(8)],
                        help="the seed offsets (default: 0, 1000, ..., 7000)")
    parser.add_argument("--metrics", nargs="+", default=["ll", "rmse"],
                        help="the metrics of the runs to compare (default: ll rmse)")
    flags.add_fit_flags(parser)
    args = flags.parse(parser, argv)
    if len(args.seeds) < 2 or len(set(args.seeds)) < len(args.seeds):
        parser.error(f"--seeds needs two distinct offsets or more, each once, got {args.seeds}")
    by_data = functools.partial(data_overrides, overrides=flags.budget_overrides(args),
                                validation=None)
    by_seed = {seed: run_comparison(
        args.data, args.entries, splits=args.splits, seed=seed, out=args.out / f"seed_{seed}",
        device=args.device, overrides_by_data=by_data, num_samples=args.num_samples,
        jobs=args.jobs, scheduler=args.scheduler, threads=args.threads)
        for seed in args.seeds}
    runs = [{**{k: record.get(k) for k in KEPT}, "seed_offset": seed}
            for seed, records in by_seed.items() for record in records]
    summary = spread(by_seed, args.metrics)
    print(write_tables(args.out, "seed_spread", summary, keys=("data", "entry", "metric"),
                       section="data", columns=COLUMNS, runs=runs,
                       provenance=versions(run_columns(r) for r in runs)))
    return summary


if __name__ == "__main__":
    main()
