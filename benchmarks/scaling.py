"""Scaling of a sweep with Dask workers: one data set's entries on 1, 2, ... workers.

The comparison of ``benchmarks/uci.py`` (its protocol, :func:`bnn_zoo._harness.compare.
data_overrides`) of every chosen entry on ``--splits`` splits of ``--data``, run through
the sweep engine (:mod:`bnn_zoo._harness.sweep`) on a local Dask cluster of ``J``
single-threaded worker processes for each ``J`` of ``--workers``, each time into an empty
cache (every run fitted). Per ``J``: the wall time of the sweep (the cluster started, the
package imported on every worker and the cache emptied before the clock starts), the
speed-up over the first ``J`` of ``--workers`` and its efficiency (speed-up / ``J``
relative to that count), the peak resident memory of each worker process (its
``ru_maxrss``, importing torch included) and whether every run's metrics (timings aside)
equal those of the first ``J``'s runs.

Writes under ``--out`` ``scaling.md``/``.csv``/``.json`` (one row per ``J``; the peak
memory of each worker in ``peak_rss_mib_each``) and ``scaling.png`` (wall time against
workers beside the ideal ``t_1 / J``, and the peak memory of each worker). Needs
``pip install bnn-zoo[cluster]``.

    BNN_ZOO_DATA=../shared/data/uci python benchmarks/scaling.py --data yacht --workers 1 2
    python benchmarks/scaling.py --tiny --out /tmp/scaling       # seconds: sine, map and bbb
"""

from __future__ import annotations

import argparse
import importlib
import os
import resource
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from matplotlib.figure import Figure

from bnn_zoo._harness import compare, flags
from bnn_zoo._harness.figures import save_figure
from bnn_zoo._harness.sweep import local_cluster
from bnn_zoo._harness.tables import write_tables

OUT = "benchmarks/results/scaling"
#: What ``--tiny`` runs: a toy set, two cheap entries, a few steps.
TINY = {"data": ["sine"], "entries": ["map", "bbb"], "splits": 2, "steps": 5, "num_samples": 5}
#: Metrics that time a run, which differ from one run to the next.
TIMINGS = ("fit_seconds", "steps_per_second")
COLUMNS = ("fits", "wall_seconds", "speedup", "efficiency", "peak_rss_mib", "same_records")


def peak_rss_mib() -> float:
    """The peak resident set size of this process in MiB (``ru_maxrss``: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def import_package() -> None:
    """Import what a worker runs, so that the sweep's clock does not count it."""
    importlib.import_module("bnn_zoo._harness.sweep")


def results(records: Sequence[dict]) -> list[tuple]:
    """What the runs computed, timings aside: keys, status and metrics of each."""
    return [(r["entry"], r["data"], r["split"], r["status"],
             sorted((k, v) for k, v in r.get("metrics", {}).items() if k not in TIMINGS))
            for r in records]


def sweep(workers: int, args: argparse.Namespace) -> tuple[float, list[float], list[dict]]:
    """Wall time, each worker's peak memory (MiB) and the records of the comparison on a
    local cluster of ``workers`` processes, into an empty cache."""
    import distributed  # the cluster extra: bnn-zoo[cluster]

    overrides = partial(compare.data_overrides, overrides=flags.budget_overrides(args),
                        validation=None)
    with (tempfile.TemporaryDirectory() as out,
          local_cluster(workers) as cluster,
          distributed.Client(cluster) as client):
        client.run(import_package)
        started = time.perf_counter()
        records = compare.run_comparison(args.data, args.entries, splits=args.splits,
                                         seed=args.seed, out=out, overrides_by_data=overrides,
                                         num_samples=args.num_samples, log=False,
                                         scheduler=cluster.scheduler_address,
                                         threads=args.threads)
        seconds = time.perf_counter() - started
        memory = list(client.run(peak_rss_mib).values())
    return seconds, memory, records


def rows_of(measured: dict[int, tuple[float, list[float], list[dict]]]) -> list[dict]:
    """One row per worker count, the speed-up and efficiency against the first."""
    (base, (base_seconds, _, base_records)), *_ = measured.items()
    return [{"workers": workers, "fits": len(records), "wall_seconds": seconds,
             "speedup": base_seconds / seconds,
             "efficiency": base_seconds / seconds * base / workers,
             "peak_rss_mib": max(memory), "peak_rss_mib_each": [round(m, 1) for m in memory],
             "same_records": results(records) == results(base_records)}
            for workers, (seconds, memory, records) in measured.items()]


def figure(rows: Sequence[dict], path: Path) -> Path:
    """Wall time against workers (and the ideal ``t_1 / J``), and each worker's peak memory."""
    fig = Figure(figsize=(8, 3.2), layout="constrained")
    time_ax, memory_ax = fig.subplots(1, 2)
    workers = [r["workers"] for r in rows]
    base = rows[0]["wall_seconds"] * rows[0]["workers"]
    time_ax.plot(workers, [r["wall_seconds"] for r in rows], "o-", label="measured")
    time_ax.plot(workers, [base / w for w in workers], "k--", lw=0.8, label="ideal")
    time_ax.set(xlabel="workers", ylabel="wall time (s)", xticks=workers)
    time_ax.legend(fontsize=7)
    for r in rows:
        memory_ax.plot([r["workers"]] * len(r["peak_rss_mib_each"]), r["peak_rss_mib_each"],
                       "o", c="C1")
    memory_ax.set(xlabel="workers", ylabel="peak memory per worker (MiB)", xticks=workers)
    return save_figure(fig, path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_data_flag(parser, ["uci/yacht"])
    flags.add_entries_flag(parser, None)
    flags.add_fit_flags(parser)
    flags.add_shared_flags(parser, out=OUT, threads=1, splits=20, without=("device",))
    parser.add_argument("--workers", nargs="+", type=flags.positive_int, default=[1, 2],
                        help="the worker counts to measure, the first the baseline "
                             "(default: 1 2)")
    parser.add_argument("--tiny", action="store_true",
                        help="a run of seconds (sine, map and bbb, 2 splits, 5 steps), "
                             "for tests")
    args = flags.parse(parser, argv)
    if args.tiny:
        vars(args).update(TINY)
    return args


def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    measured = {workers: sweep(workers, args) for workers in dict.fromkeys(args.workers)}
    rows = rows_of(measured)
    preamble = (f"{', '.join(args.data)}: entries {', '.join(args.entries or ['all'])}, "
                f"{args.splits} splits, {args.threads} thread(s) per worker, on "
                f"{os.cpu_count()} cores.")
    print(write_tables(args.out, "scaling", rows, keys=("workers",), columns=COLUMNS,
                       preamble=preamble))
    print(f"Wrote {args.out}/scaling.md, .csv, .json, {figure(rows, args.out / 'scaling.png')}")
    return rows


if __name__ == "__main__":
    main()
