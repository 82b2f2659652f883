"""Sweeps on a local Dask cluster of worker processes: the records of two workers are the
serial run's, a batch whose worker dies runs again without losing what finished, no batch
waits behind a long one while a worker is free, and a batch that cannot travel to a worker
is refused before any cluster starts. Skipped without Dask distributed
(``pip install bnn-zoo[cluster]``)."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from bnn_zoo._harness import compare, sweep  # noqa: E402

TINY = {"steps": 20}
#: What a run's timing measures, which differs from one fit to the next.
TIMINGS = ("fit_seconds", "steps_per_second")


def results(record: dict) -> dict:
    """What a run computes: its keys, settings, metrics (timings aside), diagnostics, losses
    and predictive moments (not its provenance, whose date is the clock's)."""
    kept = {k: v for k, v in record.items() if k not in ("seconds", "provenance")}
    return {**kept, "metrics": {k: v for k, v in record["metrics"].items() if k not in TIMINGS}}


def test_two_local_workers_give_exactly_the_serial_records(tmp_path):
    kwargs = {"splits": 2, "overrides": TINY, "num_samples": 10, "log": False, "threads": 1}
    serial = compare.run_comparison(["sine"], ["map", "bbb"], out=tmp_path / "serial", **kwargs)
    two = compare.run_comparison(["sine"], ["map", "bbb"], out=tmp_path / "two", jobs=2,
                                 **kwargs)
    assert [(r["entry"], r["split"], r["status"]) for r in two] == [
        ("map", 0, "ok"), ("map", 1, "ok"), ("bbb", 0, "ok"), ("bbb", 1, "ok")]
    assert [results(r) for r in two] == [results(r) for r in serial]
    assert len(list((tmp_path / "two" / "runs").rglob("*.json"))) == 4


def dies_once(batch: sweep.Batch) -> list[dict]:
    """For ``map``: run the first split of ``batch``, keep its record beside the cache, and
    end this worker's process the first time; run ``batch`` the next time (and every other
    entry's batch at once)."""
    marker = Path(batch.out) / "died"
    if batch.entry != "map" or marker.exists():
        return sweep.run_batch(batch)
    (first,) = sweep.run_batch(replace(batch, splits=batch.splits[:1], seeds=batch.seeds[:1]))
    marker.write_text(json.dumps(first))
    os._exit(1)


def test_a_batch_whose_worker_dies_runs_again_and_keeps_what_finished(tmp_path):
    """One worker: the batch fitting ``map`` split by split kills its worker after its
    first split; the nanny starts a new worker, the scheduler runs the batch again, and the
    first split comes back from the cache (the same timing, not a second fit). The batch
    that finished before (``bbb``, the larger, so run first) was on disk before the worker
    died, and is in the results."""
    out = str(tmp_path)
    batches = [sweep.Batch(entry, "sine", (0, 1), (0, 1), dict(TINY), num_samples=10, out=out,
                           log=False, size=size) for entry, size in (("map", 1), ("bbb", 2))]
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        again, finished = sweep.run_batches(batches, scheduler=cluster.scheduler_address,
                                            run=dies_once)
    died = tmp_path / "died"
    first = json.loads(died.read_text())
    assert (first["entry"], first["split"]) == ("map", 0)
    assert [r["split"] for r in again] == [0, 1] and again[0]["seconds"] == first["seconds"]
    assert [r["status"] for r in again + finished] == ["ok"] * 4
    kept = list((tmp_path / "runs" / "bbb").glob("*.json"))
    assert len(kept) == 2
    assert all(p.stat().st_mtime_ns <= died.stat().st_mtime_ns for p in kept)


def sleeps(batch: sweep.Batch) -> list[dict]:
    """Stand in for a fit of ``batch``: sleep a tenth of a second per unit of its size, and
    say when it started and on which worker."""
    started = time.time()
    time.sleep(batch.size / 10)
    return [{"entry": batch.entry, "status": "ok", "started": started,
             "worker": distributed.get_worker().address}]


def test_batches_start_in_order_on_the_first_free_worker(tmp_path):
    """A long batch (2 s) and four short ones (0.1 s) on two workers: the long one goes first
    and keeps its worker, and the short ones start one after the other, in their order, on
    the other worker. (Submitted all at once, the second short one was placed behind the
    long one, and started last, when the free worker took it back.)"""
    batches = [sweep.Batch(entry, "sine", (0,), (0,), out=str(tmp_path), cached_only=True,
                           size=size)
               for entry, size in [("long", 20)] + [(f"short{i}", 1) for i in range(4)]]
    with sweep.local_cluster(2) as cluster:
        ran = sweep.run_batches(batches, scheduler=cluster.scheduler_address, run=sleeps)
    (long,), shorts = ran[0], [records[0] for records in ran[1:]]
    assert all(r["worker"] != long["worker"] for r in shorts)
    assert [r["entry"] for r in sorted(shorts, key=lambda r: r["started"])] == [
        "short0", "short1", "short2", "short3"]


def test_a_worker_that_joins_late_takes_the_waiting_batches(tmp_path, monkeypatch):
    """One worker runs the long batch (8 s); a second joins while it runs (as a SLURM job that
    starts late) and runs every short one before the long one ends."""
    monkeypatch.setattr(sweep, "POLL_SECONDS", 0.2)
    batches = [sweep.Batch(entry, "sine", (0,), (0,), out=str(tmp_path), cached_only=True,
                           size=size)
               for entry, size in [("long", 80)] + [(f"short{i}", 1) for i in range(3)]]
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        joins = threading.Timer(0.5, cluster.scale, args=(2,))
        joins.start()
        ran = sweep.run_batches(batches, scheduler=cluster.scheduler_address, run=sleeps)
        joins.join()
    (long,), shorts = ran[0], [records[0] for records in ran[1:]]
    assert all(r["worker"] != long["worker"] for r in shorts)
    assert all(r["started"] < long["started"] + 8 for r in shorts)


def test_a_batch_that_cannot_travel_is_refused_before_a_cluster_starts(tmp_path):
    net = functools.partial(lambda lock: None, threading.Lock())  # a lock cannot be pickled
    with pytest.raises(ValueError, match="serialisable"):
        sweep.run_batches([sweep.Batch("map", "sine", (0,), (0,), {"net": net})], jobs=2)
