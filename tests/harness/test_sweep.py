"""The batches of a sweep without a cluster: a comparison's batches (one per entry and data
set, in order, with the entry's overrides), the serial engine, the cache the client keeps,
and the refusals (bad ``jobs``, ``jobs`` with a scheduler, Dask missing)."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from bnn_zoo._harness import compare, flags, runs, sweep

TINY = {"steps": 5}


def test_serial_engine_runs_every_batch_in_order_in_this_process():
    batches = [sweep.Batch("map", "sine", (0,), (0,), size=s) for s in (10, 30, 20)]
    seen = []

    def run(batch):
        seen.append(batch.size)
        return [{"size": batch.size}]

    assert sweep.run_batches(batches, run=run) == [[{"size": 10}], [{"size": 30}],
                                                   [{"size": 20}]]
    assert seen == [10, 30, 20]  # in this process, in the given order


def test_batches_are_expected_to_take_what_their_past_runs_took(tmp_path):
    """A results JSON under ``out`` says how long a split of an entry took on a data set
    (failed and unfitted runs aside); a batch without past runs is costed by its training
    points at the median rate of the others, so a NUTS batch goes out first even where its
    data set is the smallest."""
    def run(entry, data, fit):
        return {"entry": entry, "data": data, "split": 0, "settings": {},
                "metrics": {"fit_seconds": fit}}

    document = {"summary": [], "runs": [run("nuts", "sine", 90.0), run("nuts", "sine", 110.0),
                                        run("map", "sine", 1.0), run("map", "gap", None)]}
    (tmp_path / "compare.json").write_text(json.dumps(document))
    (tmp_path / "other.json").write_text("[1, 2]")  # not a comparison: read past
    assert sweep.past_fit_seconds(tmp_path) == {("nuts", "sine"): 100.0, ("map", "sine"): 1.0}
    batches = [sweep.Batch(entry, data, (0, 1), (0, 1), out=str(tmp_path), size=size)
               for entry, data, size in [("map", "sine", 500), ("nuts", "sine", 500),
                                         ("map", "gap", 100)]]
    rate = (1.0 / 500 + 100.0 / 500) / 2  # the median of the two known rates
    assert sweep.expected_seconds(batches) == pytest.approx([2.0, 200.0, 2 * 100 * rate])
    assert sweep.launch_order(batches) == [1, 2, 0]


def test_bad_jobs_and_jobs_with_a_scheduler_are_refused():
    with pytest.raises(ValueError, match="jobs"):
        sweep.run_batches([], jobs=0)
    with pytest.raises(ValueError, match="jobs=1 with a scheduler"):
        sweep.run_batches([], jobs=2, scheduler="tcp://127.0.0.1:8786")


@pytest.mark.parametrize("where", [{"jobs": 2}, {"scheduler": "tcp://127.0.0.1:8786"}])
def test_a_cluster_without_dask_says_what_to_install(monkeypatch, where):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed fails
    with pytest.raises(ImportError, match=r"pip install bnn-zoo\[cluster\]"):
        sweep.run_batches([sweep.Batch("map", "sine", (0,), (0,))], **where)


def test_comparison_batches_are_one_per_entry_and_data_set_with_its_own_overrides(
        tmp_path, monkeypatch):
    """``run_comparison`` hands the engine one batch per (data set, entry), in that order,
    with the entry's overrides on that data set (``overrides_by_data``), its seeds and
    whether its splits fit together; the records come back flattened in that order."""
    got = {}

    def engine(batches, *, jobs, scheduler):
        got.update(batches=batches, jobs=jobs, scheduler=scheduler)
        return [[{"entry": b.entry, "data": b.data}] for b in batches]

    monkeypatch.setattr(compare, "run_batches", engine)
    by_data = {"sine": {"steps": 3}, "gap": lambda entry: {"steps": 4 if entry == "map" else 6}}
    records = compare.run_comparison(["sine", "gap"], ["map", "laplace"], splits=[1, 2], seed=5,
                                     out=tmp_path, overrides_by_data=by_data.get, jobs=3,
                                     threads=1)
    assert [(r["data"], r["entry"]) for r in records] == [
        ("sine", "map"), ("sine", "laplace"), ("gap", "map"), ("gap", "laplace")]
    first, *_, last = got["batches"]
    assert (first.splits, first.seeds, first.overrides, first.together) == ((1, 2), (6, 7),
                                                                          {"steps": 3}, True)
    assert (last.overrides, last.threads, last.out, got["jobs"]) == ({"steps": 6}, 1,
                                                                     str(tmp_path), 3)
    assert first.size == 500  # sine's training points
    assert sweep.expected_seconds([first]) == [1000.0]  # no past runs: points x splits
    with pytest.raises(ValueError, match="not both"):
        compare.run_comparison(["sine"], ["map"], out=tmp_path, overrides={},
                               overrides_by_data=by_data.get)



def test_splits_fitted_alone_are_a_batch_each_so_that_workers_share_them(tmp_path, monkeypatch):
    """With ``replicas="off"`` every split is its own batch (one worker would otherwise fit
    an entry's splits one after the other); fitted together they stay one batch."""
    got = {}

    def engine(batches, *, jobs, scheduler):
        got[batches[0].together] = [(b.entry, b.splits, b.seeds) for b in batches]
        return [[] for _ in batches]

    monkeypatch.setattr(compare, "run_batches", engine)
    for replicas in ("off", "on"):
        compare.run_comparison(["sine"], ["map"], splits=[1, 2, 3], seed=5, out=tmp_path,
                               replicas=replicas, jobs=2)
    assert got == {False: [("map", (1,), (6,)), ("map", (2,), (7,)), ("map", (3,), (8,))],
                   True: [("map", (1, 2, 3), (6, 7, 8))]}

def test_the_client_caches_what_a_worker_returns_where_the_cache_lacks_it(tmp_path):
    """Records that come back from a worker whose disk the client does not share are
    written into the client's cache (the file a rerun reads), except failed runs; a file
    already there is kept."""
    batch = sweep.Batch("map", "sine", (0, 1), (0, 1), dict(TINY), num_samples=5,
                        out=str(tmp_path / "worker"), log=False)
    ok, failed = sweep.run_batch(batch)
    failed = {**failed, "status": "failed", "reason": "broken"}
    client = sweep.Batch(**{**batch.__dict__, "out": str(tmp_path / "client")})
    sweep.keep_records([ok, failed], client)
    path = runs.cache_path(client.out, "map", "sine", 0, 0, ok["settings"])
    assert json.loads(path.read_text()) == json.loads(json.dumps(ok))
    assert len(list((tmp_path / "client" / "runs" / "map").iterdir())) == 1  # not the failed
    path.write_text("{}")
    sweep.keep_records([ok], client)
    assert path.read_text() == "{}"
    (again,) = sweep.run_batch(sweep.Batch(**{**batch.__dict__, "splits": (0,), "seeds": (0,),
                                             "out": str(tmp_path / "worker")}))
    assert again["seconds"] == ok["seconds"]  # a worker's own cache: read back, not refitted


def test_the_comparison_flags_take_jobs_or_a_scheduler_not_both(capsys):
    parser = flags.add_comparison_flags(argparse.ArgumentParser())
    args = parser.parse_args(["--scheduler", "tcp://10.0.0.1:8786"])
    assert (args.jobs, args.scheduler) == (1, "tcp://10.0.0.1:8786")
    assert parser.parse_args(["--jobs", "3"]).jobs == 3
    for argv in (["--jobs", "2", "--scheduler", "tcp://10.0.0.1:8786"], ["--jobs", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        assert "--jobs" in capsys.readouterr().err
