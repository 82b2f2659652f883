"""``benchmarks/moves.py``: the change of a results JSON's cells between two versions, paired
by split, against the new cell's standard error."""

from __future__ import annotations

import json
import math
import statistics
import subprocess

import pytest


@pytest.fixture
def moves_script(benchmark_script) -> dict:
    return benchmark_script("moves.py")


def _run(entry: str, split: int, ll: float, status: str = "ok") -> dict:
    return {"data": "uci/yacht", "entry": entry, "split": split, "status": status,
            "metrics": {"ll": ll, "rmse": 1.0}, "settings": {"code": "c0de"}}


OLD = {"runs": [_run("map", 0, -1.0), _run("map", 1, -2.0), _run("map", 2, -3.0),
                _run("bbb", 0, -1.5), _run("gone", 0, 0.0)]}
NEW = {"runs": [_run("map", 0, -0.5), _run("map", 1, -1.0), _run("map", 2, -3.0),
                _run("map", 3, -9.0),  # no old split 3: not paired
                _run("bbb", 0, -1.5), _run("bbb", 1, float("nan")),
                _run("added", 0, 1.0)]}


def test_changes_are_paired_by_split_and_moved_compares_with_the_new_cells_se(moves_script):
    moves = moves_script["moves"]
    rows = {(r["entry"], r["metric"]): r for r in moves(OLD, NEW, ["ll"])}
    assert set(rows) == {("map", "ll"), ("bbb", "ll")}
    row = rows["map", "ll"]
    changes = [0.5, 1.0, 0.0]
    assert row["runs"] == 3
    assert row["change"] == pytest.approx(statistics.fmean(changes))
    assert row["change_se"] == pytest.approx(statistics.stdev(changes) / math.sqrt(3))
    assert row["old"] == pytest.approx(-2.0)
    assert row["new"] == pytest.approx(-1.5)
    new_se = statistics.stdev([-0.5, -1.0, -3.0]) / math.sqrt(3)
    assert row["new_se"] == pytest.approx(new_se)
    assert 0.5 < new_se and row["moved"] is False
    assert row["paired_z"] == pytest.approx(row["change"] / row["change_se"])
    single = rows["bbb", "ll"]  # one finite pair: no standard error, so it cannot have moved
    assert single["runs"] == 1 and single["change"] == 0.0 and single["moved"] is False
    assert math.isnan(single["change_se"]) and single["paired_z"] == 0.0


def test_a_change_beyond_the_cells_error_is_moved(moves_script):
    moves = moves_script["moves"]
    new = {"runs": [_run("map", s, ll + 1.0) for s, ll in enumerate((-1.0, -1.1, -0.9))]}
    old = {"runs": [_run("map", s, ll) for s, ll in enumerate((-1.0, -1.1, -0.9))]}
    (row,) = moves(old, new, ["ll"])
    assert row["change"] == pytest.approx(1.0) and row["change_se"] == pytest.approx(0.0)
    assert row["moved"] is True and row["paired_z"] == math.inf


def test_unpaired_cells_are_named(moves_script):
    gone, added = moves_script["unpaired"](OLD, NEW)
    assert gone == [("uci/yacht", "gone")]
    assert added == [("uci/yacht", "added")]


def test_a_document_without_runs_is_refused(moves_script):
    with pytest.raises(ValueError, match="'runs' list"):
        moves_script["moves"]({"summary": []}, NEW, ["ll"])


def test_a_file_outside_git_needs_the_old_version_as_a_file(tmp_path, moves_script):
    path = tmp_path / "uci_summary.json"
    path.write_text(json.dumps(NEW))
    with pytest.raises(ValueError, match="inside a git checkout"):
        moves_script["main"]([str(path)])
    (tmp_path / "old.json").write_text(json.dumps(OLD))
    rows = moves_script["main"]([str(path), "--old", str(tmp_path / "old.json"), "--metrics", "ll"])
    assert [r["entry"] for r in rows] == ["map", "bbb"]


def test_main_reads_the_old_version_from_git_and_writes_its_tables(tmp_path, capsys, moves_script):
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    path = tmp_path / "uci_summary.json"
    path.write_text(json.dumps(OLD))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "add", path.name], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "old"], check=True)
    path.write_text(json.dumps(NEW))
    rows = moves_script["main"]([str(path), "--metrics", "ll", "rmse"])
    assert [(r["entry"], r["metric"]) for r in rows] == [
        ("map", "ll"), ("map", "rmse"), ("bbb", "ll"), ("bbb", "rmse")]
    saved = json.loads((tmp_path / "uci_moves.json").read_text())
    assert saved["provenance"]["code"] == ["c0de"]
    assert len(saved["summary"]) == 4
    table = (tmp_path / "uci_moves.md").read_text()
    assert "Cells only in the new version: 1; only in the old: 1." in table
    assert "| uci/yacht | map | ll | 3 | -2.000 ± 0.577 | -1.500 ± 0.764 | 0.500 ± 0.289 |" \
        in table
    assert "since revision HEAD" in capsys.readouterr().out
    with pytest.raises(ValueError, match="since='nope'"):
        moves_script["main"]([str(path), "--since", "nope"])


def test_another_file_at_a_revision_is_the_old_version(tmp_path, capsys, moves_script):
    """--old-path: a new results folder's cells paired with those another file had at a
    revision (an ablation against the committed table); not together with --old."""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    committed = tmp_path / "uci" / "uci_summary.json"
    committed.parent.mkdir()
    committed.write_text(json.dumps(OLD))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "add", "uci/uci_summary.json"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "old"], check=True)
    committed.write_text(json.dumps({"runs": []}))  # the file has moved on since
    new = tmp_path / "ablation" / "uci_summary.json"
    new.parent.mkdir()
    new.write_text(json.dumps(NEW))
    rows = moves_script["main"]([str(new), "--old-path", str(committed), "--metrics", "ll"])
    assert [(r["entry"], r["metric"]) for r in rows] == [("map", "ll"), ("bbb", "ll")]
    assert "since revision HEAD of `" in capsys.readouterr().out
    with pytest.raises(ValueError, match="give one of them"):
        moves_script["main"]([str(new), "--old-path", str(committed), "--old", str(new)])


def test_seed_spread_measures_each_cells_move_from_seed_to_seed(benchmark_script):
    """``seed_spread``: per cell, the spread of its mean over the seed offsets and the paired z
    between every two of them, as ``moves`` computes one; t's root mean square for n splits."""
    script = benchmark_script("seed_spread.py")
    by_seed = {0: [_run("map", s, ll) for s, ll in enumerate((-1.0, -2.0, -3.0, -4.0))],
               1: [_run("map", s, ll) for s, ll in enumerate((-1.5, -2.0, -3.5, -4.0))],
               2: [_run("map", s, ll) for s, ll in enumerate((-1.0, -1.0, -2.0, -4.0))]}
    rows = {r["metric"]: r for r in script["spread"](by_seed, ["ll", "rmse"])}
    means = [-2.5, -2.75, -2.0]
    row = rows["ll"]
    assert (row["runs"], row["seeds"]) == (4, 3)
    assert row["mean"] == pytest.approx(statistics.fmean(means))
    assert row["seed_sd"] == pytest.approx(statistics.stdev(means))
    cell_se = [statistics.stdev(v) / 2 for v in ((-1.0, -2.0, -3.0, -4.0),
                                                 (-1.5, -2.0, -3.5, -4.0),
                                                 (-1.0, -1.0, -2.0, -4.0))]
    assert row["cell_se"] == pytest.approx(statistics.fmean(cell_se))
    z = [script["MOVES"]["moves"]({"runs": by_seed[a]}, {"runs": by_seed[b]}, ["ll"])[0]
         ["paired_z"] for a, b in ((0, 1), (0, 2), (1, 2))]
    assert row["z_rms"] == pytest.approx(math.sqrt(statistics.fmean(v * v for v in z)))
    assert row["z_max"] == pytest.approx(max(map(abs, z)))
    assert row["t_rms"] == pytest.approx(math.sqrt(3.0))  # t with 3 degrees of freedom
    assert rows["rmse"]["seed_sd"] == 0.0 and rows["rmse"]["z_max"] == 0.0
    assert script["t_rms"](3) == math.inf  # t with 2 degrees of freedom: no finite variance
    assert script["t_rms"](5) == pytest.approx(math.sqrt(2.0))
    assert script["t_rms"](20) == pytest.approx(math.sqrt(19 / 17))


def test_seed_spread_fits_each_offset_and_writes_its_tables(tmp_path, benchmark_script):
    """A tiny run: two offsets of ``map`` on two splits of sine, cached per offset, every run
    kept with its offset; one offset is refused."""
    script = benchmark_script("seed_spread.py")
    summary = script["main"](["--data", "sine", "--entries", "map", "--splits", "2", "--seeds",
                              "0", "7", "--steps", "5", "--out", str(tmp_path)])
    assert [(r["entry"], r["metric"], r["runs"], r["seeds"]) for r in summary] == [
        ("map", "ll", 2, 2), ("map", "rmse", 2, 2)]
    assert all(r["seed_sd"] > 0 and math.isfinite(r["z_max"]) for r in summary)
    saved = json.loads((tmp_path / "seed_spread.json").read_text())
    assert sorted((r["seed_offset"], r["seed"]) for r in saved["runs"]) == [
        (0, 0), (0, 1), (7, 7), (7, 8)]
    assert (tmp_path / "seed_7" / "runs" / "map").is_dir()
    assert "| map | ll | 2 | 2 |" in (tmp_path / "seed_spread.md").read_text()
    with pytest.raises(SystemExit):
        script["main"](["--data", "sine", "--seeds", "3", "3", "--out", str(tmp_path)])
