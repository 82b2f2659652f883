"""Run a sweep's batches of fits: in this process, or on a Dask cluster.

The unit of work of a comparison is a `Batch`: one zoo entry on the chosen splits of
one data set (those splits stay together, so that an entry that batches its fits trains
them as replicas in one pass), or on one split where the entry fits the splits alone
(``replicas="off"``, or an entry that cannot batch them), so that the workers share them.
`run_batch` runs one in whatever process it lands in: it sets the thread count, loads the
splits, and fits or reads each run through
`bnn_zoo._harness.runs.cached_runs`, which caches each record atomically as it
finishes. `run_batches` runs many, in the order given back:

* ``jobs=1`` (no ``scheduler``): one after the other in this process (Dask is not needed);
* ``jobs=J``: on a local Dask cluster of ``J`` single-threaded worker processes
  (``distributed.LocalCluster``), started and closed here;
* ``scheduler=ADDRESS``: on a running Dask cluster (``dask scheduler`` and ``dask worker``,
  dask-jobqueue's ``SLURMCluster`` or ``PBSCluster``, Kubernetes), whose workers need only
  the package and the data folder (``BNN_ZOO_DATA``).

Dask distributed (Rocklin 2015, "Dask: Parallel Computation with Blocked algorithms and
Task Scheduling") is the engine: pure Python, light to install, and the scheduler that HPC
users of the PyData stack already run through dask-jobqueue. It is optional
(``pip install bnn-zoo[cluster]``). The batches go out longest first
(`expected_seconds`: the fit seconds that the results under the batch's ``out``
record for its entry and data set, or its training points x splits at the rate of the
others), so that the last to finish is a short one; the client sends a batch only when a
worker thread is free for it, so each starts on the first free worker in that order and
none waits behind a long one on a busy worker (Dask assigns a task submitted on its own to a
worker at once, before anyone knows how long it takes). A batch whose worker dies is run again
on another worker (the scheduler reschedules the tasks of a lost worker; ``retries`` re-runs
a batch that raised), and its runs that finished before are read back from the cache. The
client also writes every returned record into the cache under the batch's ``out`` (where
none is there yet), so that nothing finished is lost when the workers do not share the
client's filesystem.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from bnn_zoo._core import data as data_module
from bnn_zoo._core.checks import check_positive_int
from bnn_zoo._harness.bundled import bundled_runs
from bnn_zoo._harness.flags import set_threads
from bnn_zoo._harness.runs import cache_record, cached_runs
from bnn_zoo._harness.stale import kept_runs

__all__ = ["INSTALL", "POLL_SECONDS", "RETRIES", "Batch", "expected_seconds", "keep_records",
           "launch_order", "local_cluster", "past_fit_seconds", "run_batch", "run_batches"]

#: How many times a batch that raised is submitted again (a worker's death is the
#: scheduler's to recover: it reschedules the lost worker's tasks).
RETRIES = 2
#: How often, in seconds, `run_batches` looks for workers that joined the cluster while
#: no batch finished (a SLURM job of dask-jobqueue starting late).
POLL_SECONDS = 5.0
#: What to install for ``jobs > 1`` or a ``scheduler``.
INSTALL = "pip install bnn-zoo[cluster]"


@dataclass(frozen=True)
class Batch:
    """One zoo entry on some splits of one data set: what `run_batch` runs.

    ``overrides`` are the keyword arguments of the entry's fit (resolved for this entry and
    data set, with ``net`` where a network replaces the entry's model); split ``splits[i]``
    is fitted with seed ``seeds[i]``; ``together``: fitted as replicas in one pass
    (`cached_runs`); ``cached_only``: nothing fitted, missing
    runs recorded as skipped; ``threads``: torch's CPU threads in the process that runs it
    (``None``: leave them); ``size``: training points of one split, for the order of
    `run_batches` where no earlier run says how long the entry takes
    (`expected_seconds`); ``quantiles``: its regression runs keep their predictive's
    quantiles (a comparison with a reference); ``bundled``: its runs are read from the
    bundled references (`bnn_zoo._harness.bundled.bundled_runs`), never fitted.
    """

    entry: str
    data: str
    splits: tuple[int, ...]
    seeds: tuple[int, ...]
    overrides: dict = field(default_factory=dict)
    num_samples: int = 200
    out: str = "results/compare"
    device: str = "cpu"
    together: bool = False
    cached_only: bool = False
    threads: int | None = None
    log: bool = True
    size: int = 0
    quantiles: bool = False
    bundled: bool = False


def past_fit_seconds(out: str | Path) -> dict[tuple[str, str], float]:
    """The mean fit seconds of one split of each (entry, data set) in the results JSONs
    under ``out`` (the ``"runs"`` that a comparison keeps, of any code version): a batch
    fitted as replicas records its pass divided among its splits."""
    seconds = defaultdict(list)
    for path in Path(out).glob("*.json"):
        for run in kept_runs(path) or ():
            fit = (run.get("metrics") or {}).get("fit_seconds")
            if isinstance(fit, (int, float)) and fit > 0:
                seconds[run["entry"], run["data"]].append(fit)
    return {key: statistics.fmean(values) for key, values in seconds.items()}


def expected_seconds(batches: Sequence[Batch]) -> list[float]:
    """How long each batch is expected to take, for the order of `run_batches`: its
    splits times the mean fit seconds of a split of its entry and data set that earlier
    results under its ``out`` record (`past_fit_seconds`), and for a batch without
    them, its training points times splits at the median rate (seconds per point and split)
    of the batches with them (at 1 where none has them, so the order is by size)."""
    past = {out: past_fit_seconds(out) for out in {batch.out for batch in batches}}
    known = [past[b.out].get((b.entry, b.data)) for b in batches]
    rates = [seconds / b.size for b, seconds in zip(batches, known, strict=True)
             if seconds is not None and b.size > 0]
    rate = statistics.median(rates) if rates else 1.0
    return [len(b.splits) * (seconds if seconds is not None else b.size * rate)
            for b, seconds in zip(batches, known, strict=True)]


def launch_order(batches: Sequence[Batch]) -> list[int]:
    """The indices of ``batches`` in the order a cluster starts them: the longest expected
    first (`expected_seconds`), ties in the order given."""
    expected = expected_seconds(batches)
    return sorted(range(len(batches)), key=lambda i: -expected[i])


def run_batch(batch: Batch) -> list[dict]:
    """The records of ``batch``'s runs, in the order of its splits (see
    `cached_runs`), each cached under ``batch.out`` as it
    finishes."""
    set_threads(batch.threads)
    datasets = [data_module.load(batch.data, split).to(batch.device) for split in batch.splits]
    if batch.bundled:
        return bundled_runs(batch.entry, datasets, splits=batch.splits, seeds=batch.seeds,
                            overrides=batch.overrides, num_samples=batch.num_samples,
                            quantiles=batch.quantiles, together=batch.together, log=batch.log)
    return cached_runs(batch.entry, datasets, splits=list(batch.splits), seeds=list(batch.seeds),
                       overrides=batch.overrides, num_samples=batch.num_samples, out=batch.out,
                       log=batch.log, together=batch.together, fit_missing=not batch.cached_only,
                       quantiles=batch.quantiles)


def _distributed() -> ModuleType:
    try:
        import distributed
    except ImportError as error:
        raise ImportError("Running batches with jobs > 1 or on a scheduler needs Dask "
                          f"distributed: {INSTALL}") from error
    return distributed


def local_cluster(jobs: int):
    """A local Dask cluster (``distributed.LocalCluster``) of ``jobs`` single-threaded worker
    processes, without Dask's memory limit per worker (which would restart a worker fitting
    a large batch) and with its dashboard and the scheduler's HTTP server (metrics, health)
    on a free port, so that it runs beside other clusters; a context manager that closes
    it."""
    return _distributed().LocalCluster(n_workers=check_positive_int("jobs", jobs),
                                       threads_per_worker=1, processes=True,
                                       dashboard_address=":0", memory_limit=0)


def _check_serialisable(batches: Sequence[Batch], dumps: Callable[[object], bytes]) -> None:
    """A batch that cannot travel to a worker (e.g. a ``net`` holding a lock or an open file)
    fails here, before the cluster starts, naming its entry and data set."""
    for batch in batches:
        try:
            dumps(batch)
        except Exception as error:  # pickle raises many types
            raise ValueError(f"Expected the overrides of {batch.entry!r} on {batch.data} "
                             "(and its net) to be serialisable, to send them to a Dask "
                             f"worker, but they are not ({type(error).__name__}: {error}); "
                             "run with jobs=1, or pass a net that can be pickled.") from error


def keep_records(records: Sequence[dict], batch: Batch) -> None:
    """Write each record of ``batch`` that its run would cache into the cache under
    ``batch.out`` where no file is there (`cache_record`:
    records of finished or skipped runs, not of failed runs nor of a ``cached_only`` or
    ``bundled`` batch)."""
    if not (batch.cached_only or batch.bundled):
        for record in records:
            if record["status"] != "failed":
                cache_record(batch.out, record)


def run_batches(batches: Iterable[Batch], *, jobs: int = 1, scheduler: str | None = None,
                run: Callable[[Batch], list[dict]] = run_batch,
                retries: int = RETRIES) -> list[list[dict]]:
    """``run(batch)`` of every batch, in the order of ``batches``.

    Parameters
    ----------
    batches : the batches (`Batch`).
    jobs : ``1``: one after the other in this process; ``J > 1``: on a local Dask cluster
        of ``J`` single-threaded worker processes, started and closed here
        (`local_cluster`).
    scheduler : the address of a running Dask scheduler (e.g. ``tcp://10.0.0.1:8786``) to
        send the batches to (with ``jobs=1``).
    run : what runs a batch (`run_batch`); on a cluster, a function the workers can
        import or unpickle.
    retries : how many times a batch that raised is submitted again on a cluster.
    """
    batches = list(batches)
    check_positive_int("jobs", jobs)
    if scheduler is not None and jobs != 1:
        raise ValueError(f"Expected jobs=1 with a scheduler (its workers run the batches), "
                         f"but got jobs={jobs} and scheduler={scheduler!r}.")
    if scheduler is None and jobs == 1:
        return [run(batch) for batch in batches]
    distributed = _distributed()
    _check_serialisable(batches, distributed.protocol.pickle.dumps)
    with contextlib.ExitStack() as stack:
        if scheduler is None:
            cluster = stack.enter_context(local_cluster(jobs))
            scheduler = cluster.scheduler_address
        client = stack.enter_context(distributed.Client(scheduler))
        waiting = launch_order(batches)
        running: dict = {}
        results: list[list[dict]] = [[] for _ in batches]
        while waiting or running:
            for _ in range(min(len(waiting), _threads(client) - len(running))):
                i = waiting.pop(0)
                running[client.submit(run, batches[i], pure=False, retries=retries)] = i
            try:
                done = distributed.wait(list(running), timeout=POLL_SECONDS,
                                        return_when="FIRST_COMPLETED").done
            except asyncio.TimeoutError:  # none finished; workers may have joined since
                continue
            for future in done:
                i = running.pop(future)
                results[i] = future.result()
                keep_records(results[i], batches[i])
    return results


def _threads(client) -> int:
    """The worker threads of ``client``'s cluster now (at least one: a cluster whose workers
    have not yet joined takes one batch, which waits for them)."""
    return max(1, sum(client.nthreads().values()))
