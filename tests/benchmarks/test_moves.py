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
