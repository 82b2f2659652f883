"""``benchmarks/checkpoint.py``: an unfinished sweep's run cache packed into one file per
data set and unpacked on a fresh checkout, where the sweep then reads every packed run back
instead of fitting it."""

from __future__ import annotations

import json
import shutil

import pytest

from bnn_zoo._harness import compare, runs

TINY = dict(overrides={"steps": 20}, num_samples=20, replicas="off")


@pytest.fixture
def checkpoint_script(benchmark_script) -> dict:
    return benchmark_script("checkpoint.py")


def test_a_packed_sweep_resumes_from_a_fresh_cache(tmp_path, capsys, checkpoint_script):
    """Two finished runs are packed without their loss curves; a run of other code in the
    cache is left out, and one in the file is not unpacked. Unpacked into a fresh folder,
    a cached-only sweep reads both runs with the same metrics and moments."""
    main = checkpoint_script["main"]

    def runs_moved(*argv: str) -> int:
        """What ``main`` reports it packed or unpacked; it exits with 0."""
        assert main(list(argv)) == 0
        return int(capsys.readouterr().out.splitlines()[-1].split()[1])

    first, fresh = tmp_path / "first", tmp_path / "fresh"
    records = compare.run_comparison(["sine"], ["map"], splits=2, out=first, **TINY)
    other = json.loads(next((first / "runs" / "map").glob("*.json")).read_text())
    other["settings"]["code"] = other["provenance"]["code"] = "0ld"
    runs.cache_record(first, other)
    assert runs_moved("--out", str(first)) == 2
    assert [p.name for p in (first / "checkpoint").iterdir()] == ["sine.jsonl"]
    lines = (first / "checkpoint" / "sine.jsonl").read_text().splitlines()
    packed = [json.loads(line) for line in lines]
    assert [(r["entry"], r["split"], r["losses"]) for r in packed] == [("map", 0, []),
                                                                       ("map", 1, [])]
    (fresh / "checkpoint").mkdir(parents=True)
    (fresh / "checkpoint" / "sine.jsonl").write_text("\n".join([*lines, json.dumps(other)]) + "\n")
    assert runs_moved("--out", str(fresh), "--unpack") == 2
    assert runs_moved("--out", str(fresh), "--unpack") == 0  # none missing
    again = compare.run_comparison(["sine"], ["map"], splits=2, out=fresh, cached_only=True,
                                   **TINY)
    assert capsys.readouterr().out.count("[cached]") == 2
    for new, old in zip(again, records, strict=True):
        assert (new["metrics"], new["moments"]) == (old["metrics"], old["moments"])
    shutil.rmtree(fresh / "runs")
    (fresh / "checkpoint" / "sine.jsonl").unlink()
    assert runs_moved("--out", str(fresh), "--unpack") == 0  # no file, nothing to write


def test_each_data_set_has_its_own_file_and_a_data_set_without_runs_none(
        tmp_path, monkeypatch, checkpoint_script):
    """Runs are grouped into one file per data set (``/`` becomes ``_``), each in the
    order entry, split, seed; a file left from a data set with no run of today's code goes."""
    records = [_record("map", "uci/yacht"), _record("bbb", "uci/yacht"),
               _record("map", "two_moons")]
    records[1]["split"] = 1
    monkeypatch.setitem(checkpoint_script["pack"].__globals__, "cached_records",
                        lambda out: sorted(records, key=checkpoint_script["_key"]))
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "uci_energy.jsonl").write_text("{}\n")
    assert checkpoint_script["pack"](tmp_path, None) == 3
    files = {p.name: [json.loads(line) for line in p.read_text().splitlines()]
             for p in folder.iterdir()}
    assert {name: [(r["entry"], r["data"], r["split"]) for r in group]
            for name, group in files.items()} == {
        "uci_yacht.jsonl": [("bbb", "uci/yacht", 1), ("map", "uci/yacht", 0)],
        "two_moons.jsonl": [("map", "two_moons", 0)]}


def _record(entry: str, data: str, status: str = "ok") -> dict:
    record = {"entry": entry, "data": data, "split": 0, "seed": 0, "status": status}
    if status == "ok":
        record.update(losses=[3.0, 2.0], moments={"mean": [0.0], "std": [1.0]})
    return record


def test_the_test_point_predictive_is_kept_only_where_the_reference_can_measure_it(
        checkpoint_script):
    """On a data set where the reference was skipped, nothing reads an entry's moments;
    where it ran, or has not run yet, the distances to it will."""
    records = [_record("nuts", "uci/big", "skipped"), _record("map", "uci/big"),
               _record("map", "uci/small"), _record("nuts", "uci/small")]
    slim = checkpoint_script["packed"](records, "nuts")
    assert [("moments" in r, r.get("losses")) for r in slim] == [
        (False, None), (False, []), (True, []), (True, [])]
    assert slim[2]["moments"] == records[2]["moments"]
    assert checkpoint_script["packed"](records, "laplace")[1]["moments"] == {"mean": [0.0],
                                                                               "std": [1.0]}


def test_a_sweep_without_a_reference_keeps_no_test_point_predictive(tmp_path,
                                                                    checkpoint_script):
    """``--reference none`` (the classification sweep): no distance will read the
    per-point predictive of any run, so none is packed; the metrics stay."""
    records = [_record("map", "two_moons"), _record("nuts", "wine")]
    records[0]["class_probs"] = [[0.5, 0.5]]
    slim = checkpoint_script["packed"](records, None)
    assert [sorted(r) for r in slim] == [["data", "entry", "losses", "seed", "split",
                                          "status"]] * 2
    assert checkpoint_script["parse_args"](["--out", str(tmp_path), "--reference",
                                            "none"]).reference is None


@pytest.mark.parametrize("argv", [[], ["--out", "missing"], ["--out", "missing", "--unpack"]])
def test_out_must_be_a_folder(argv, tmp_path, capsys, monkeypatch, checkpoint_script):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        checkpoint_script["main"](argv)
    assert exit_.value.code == 2
    assert "--out: expected a sweep's output folder" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
