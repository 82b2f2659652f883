"""Provenance: the code version and what every run record names, the cache keyed by the
code, the tables' line naming their commits, and the stale-cells command."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bnn_zoo
from bnn_zoo._harness import cli, compare, provenance, readme_tables, runs, stale

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(overrides={"steps": 20}, num_samples=10)


def _tree(root: Path) -> dict[str, Path]:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("x = 1\n")
    (root / "pkg" / "sub" / "b.py").write_text("y = 2\n")
    return {"pkg": root / "pkg"}


def test_code_digest_follows_the_python_source_and_nothing_else(tmp_path):
    roots = _tree(tmp_path)
    first = provenance.code_digest(roots)
    assert re.fullmatch(r"[0-9a-f]{12}", first)
    (tmp_path / "pkg" / "notes.md").write_text("docs change")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "a.py").write_text("compiled")
    assert provenance.code_digest(roots) == first
    (tmp_path / "pkg" / "sub" / "b.py").write_text("y = 3\n")
    changed = provenance.code_digest(roots)
    assert changed != first
    (tmp_path / "pkg" / "sub" / "b.py").rename(tmp_path / "pkg" / "c.py")  # same bytes, moved
    assert provenance.code_digest(roots) not in (first, changed)


def test_code_digest_leaves_out_the_excluded_files(tmp_path):
    roots = _tree(tmp_path)
    first = provenance.code_digest(roots, exclude=["pkg/sub/b.py"])
    (tmp_path / "pkg" / "sub" / "b.py").write_text("y = 3\n")
    assert provenance.code_digest(roots, exclude=["pkg/sub/b.py"]) == first
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert provenance.code_digest(roots, exclude=["pkg/sub/b.py"]) != first


def test_code_version_is_the_digest_of_the_three_packages_less_engine_and_reporting():
    assert provenance.code_version() == provenance.code_digest(
        {"bnn_zoo": ROOT / "bnn_zoo", "bnn_zoo.models": ROOT / "models",
         "bnn_zoo.guides": ROOT / "guides"}, exclude=provenance.NOT_RESULTS)
    for name in provenance.NOT_RESULTS:  # the list names modules that exist
        assert (ROOT / name).is_file(), name


def test_provenance_names_versions_commit_device_threads_and_date():
    import numpy
    import pyro
    import torch

    found = provenance.provenance("cpu")
    assert (found["version"], found["torch"], found["pyro"], found["numpy"]) == (
        bnn_zoo.__version__, torch.__version__, pyro.__version__, numpy.__version__)
    assert (found["code"], found["device"], found["threads"]) == (
        provenance.code_version(), "cpu", torch.get_num_threads())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", found["date"])
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = None
    assert found["commit"] == head
    assert isinstance(found["dirty"], bool) or head is None


def test_run_columns_mark_dirty_missing_and_unknown_provenance():
    origin = {"code": "c0de", "commit": "1a2b3c4", "dirty": False}
    assert provenance.run_columns({"provenance": origin}) == {
        "code": "c0de", "commit": "1a2b3c4", "machine": "unknown"}
    assert provenance.run_columns({"provenance": {**origin, "dirty": True}})["commit"] == (
        "1a2b3c4-dirty")
    assert provenance.run_columns({"provenance": {**origin, "commit": None}})["commit"] == "none"
    assert provenance.run_columns({"settings": {}}) == {
        "code": "unknown", "commit": "unknown", "machine": "unknown"}
    rows = [{"code": "b; a", "commit": "x"}, {"code": "a", "commit": "y"}, {"entry": "z"}]
    assert provenance.versions(rows) == {"code": ["a", "b"], "commit": ["x", "y"],
                                         "machine": []}
    assert provenance.note({"code": ["a", "b"], "commit": ["x"]}) == (
        "Runs of code versions `a`, `b` at commit `x`, on a machine not recorded.")
    assert provenance.note({"code": [], "commit": []}) == ""


def test_the_machine_is_the_gpu_or_the_cpu_with_its_capability():
    cpu = {"cpu": "AMD EPYC 7B13", "cpu_capability": "AVX2", "gpu": None}
    assert provenance.machine(cpu) == "AMD EPYC 7B13 (AVX2)"
    assert provenance.machine({**cpu, "cpu_capability": None}) == "AMD EPYC 7B13"
    assert provenance.machine({**cpu, "gpu": "NVIDIA H100 80GB HBM3"}) == "NVIDIA H100 80GB HBM3"
    assert provenance.machine({"code": "c0de"}) == provenance.machine(None) == "unknown"
    found = provenance.provenance("cpu")
    assert found["gpu"] is None and found["cpu_capability"] in provenance.machine(found)


def test_the_note_names_the_range_of_commits_oldest_first_and_the_machines():
    """Three or more commits are a range from the oldest to the newest of this checkout's
    history (git's commit order, not the hashes' alphabetical one); two are listed."""
    log = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%h", "-n", "40"],
                         capture_output=True, text=True)
    history = log.stdout.split()
    if log.returncode != 0 or len(history) < 40:
        pytest.skip("needs a git checkout with 40 commits of history")
    picked = [history[30], history[0], history[12]]  # newest first in git log
    rows = [{"code": "c0de", "commit": f"{picked[0]}; {picked[1]}", "machine": "B"},
            {"code": "c0de", "commit": f"{picked[2]}-dirty", "machine": "A; unknown"}]
    found = provenance.versions(rows)
    assert found["commit"] == [picked[0], f"{picked[2]}-dirty", picked[1]]
    assert provenance.note(found) == (
        f"Runs of code version `c0de` at 3 commits from `{picked[0]}` to `{picked[1]}`, "
        "on A and B.")
    assert provenance.note({**found, "commit": found["commit"][:2]}).startswith(
        f"Runs of code version `c0de` at commits `{picked[0]}`, `{picked[2]}-dirty`, on")


def test_records_tables_and_cache_name_the_code(tmp_path, capsys, monkeypatch):
    """Every record names its provenance and its code version in its settings; the summary
    rows, the JSON and a line under the Markdown name them; a run of other code is not read
    back from the cache."""
    first = compare.run_comparison(["sine"], ["map"], splits=2, out=tmp_path, **TINY)
    code = provenance.code_version()
    assert all(r["settings"]["code"] == code == r["provenance"]["code"] for r in first)
    summary, table = compare.write_comparison(first, tmp_path)
    found = json.loads((tmp_path / "compare.json").read_text())
    assert found["provenance"]["code"] == [code] == [summary[0]["code"]]
    assert all(run["provenance"]["code"] == code for run in found["runs"])
    assert f"Runs of code version `{code}` at commit" in table.rstrip().splitlines()[-1]
    assert "code,commit" in (tmp_path / "compare.csv").read_text().splitlines()[0]
    found["runs"][0]["settings"]["code"] = "0ld"
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "old.json").write_text(json.dumps(found))
    assert runs.restore_cache(tmp_path / "fresh", "old", task="regression") == 1  # not the 0ld
    monkeypatch.setattr(runs, "code_version", lambda: "other")
    capsys.readouterr()
    again = compare.run_comparison(["sine"], ["map"], splits=2, out=tmp_path, **TINY)
    assert "[cached]" not in capsys.readouterr().out
    assert [r["settings"]["code"] for r in again] == ["other"] * 2
    assert len(list((tmp_path / "runs" / "map").glob("*.json"))) == 4


def test_readme_tables_name_the_commits_only_of_files_that_record_them(tmp_path):
    rows = [{"data": "sine", "entry": "map", "runs": 2, "ll": -1.0}]
    (tmp_path / "old.json").write_text(json.dumps({"summary": rows}))
    (tmp_path / "new.json").write_text(json.dumps(
        {"summary": rows, "provenance": {"code": ["c0de"], "commit": ["1a2b3c4"]}}))
    old = readme_tables.render_block("old.json keys=data,entry columns=ll", tmp_path)
    new = readme_tables.render_block("new.json keys=data,entry columns=ll", tmp_path)
    assert new == f"{old}\nRuns of code version `c0de` at commit `1a2b3c4`, on a machine not " \
                  "recorded.\n"
    assert "Runs of" not in old


def test_uci_rows_carry_code_and_commit(benchmark_script):
    tidy = benchmark_script("uci.py")["tidy_rows"]
    origin = {"code": "c0de", "commit": "1a2b3c4", "dirty": True}
    record = {"entry": "map", "data": "uci/yacht", "split": 0, "seed": 0, "status": "ok",
              "metrics": {"ll": -1.0}, "settings": {"code": "c0de"}, "provenance": origin}
    old = {k: v for k, v in record.items() if k not in ("provenance", "settings")}
    rows = tidy([record, old])
    assert [(r["code"], r["commit"]) for r in rows] == [("c0de", "1a2b3c4-dirty"),
                                                        ("unknown", "unknown")]


def test_stale_lists_the_cells_of_other_code_and_exits_1(tmp_path, capsys):
    results = tmp_path / "results"
    records = compare.run_comparison(["sine"], ["map", "mean_field"], splits=2, out=results,
                                     **TINY)
    compare.write_comparison(records, results)
    assert cli.main(["stale", str(results)]) == 0
    assert "0 stale cells" in capsys.readouterr().out
    document = json.loads((results / "compare.json").read_text())
    document["runs"][1]["settings"]["code"] = "0ld"  # map split 1, of other code
    del document["runs"][2]["settings"]["code"]  # mean_field split 0, recorded without it
    del document["runs"][2]["provenance"]
    (results / "compare.json").write_text(json.dumps(document))
    shutil.copy(results / "compare.json", results / "runs" / "compare.json")  # cache: skipped
    assert [(c["entry"], c["splits"], c["code"]) for c in stale.stale_cells([results])] == [
        ("map", [1], ["0ld"]), ("mean_field", [0], ["unknown"])]
    capsys.readouterr()
    assert cli.main(["stale", str(results / "compare.json")]) == 1
    out = capsys.readouterr().out
    assert "map on sine: splits 1 of 2 (code 0ld)" in out
    assert "2 stale cells (2 runs)" in out


def test_stale_lists_whole_files_of_other_or_unknown_code(tmp_path, capsys):
    """A results file that keeps no comparison's runs is stale as a whole unless its
    provenance (else a provenance.json beside it) names the checkout's code alone; a table
    of this process is not; a path that does not exist is an error."""
    from bnn_zoo._harness.tables import Table, write_table_group, write_tables

    code = provenance.code_version()
    write_tables(tmp_path / "now", "timing", [{"step": "a", "s": 1.0}], keys=("step",),
                 columns=("s",))
    write_table_group(tmp_path / "now", "study", [Table("t", "T", [{"w": 1}], ("w",), ())])
    (tmp_path / "table.json").write_text(json.dumps({"summary": [{"ll": 1.0}]}))
    (tmp_path / "old.json").write_text(json.dumps(
        {"summary": [], "provenance": {"code": ["0ld", code]}}))
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "provenance.json").write_text(json.dumps({"code": "g0"}))
    (tmp_path / "gpu" / "t.json").write_text(json.dumps({"summary": []}))
    assert stale.file_code(tmp_path / "now" / "study.json") == [code]
    assert stale.stale_files([tmp_path]) == [
        {"file": str(tmp_path / "gpu" / "t.json"), "code": ["g0"]},
        {"file": str(tmp_path / "old.json"), "code": sorted(["0ld", code])},
        {"file": str(tmp_path / "table.json"), "code": ["unknown"]}]
    assert cli.main(["stale", str(tmp_path / "now")]) == 0
    assert "0 stale cells (0 runs) and 0 stale files" in capsys.readouterr().out
    assert cli.main(["stale", str(tmp_path / "table.json")]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'table.json'}: the whole file (code unknown)" in out
    assert "and 1 stale files" in out
    assert cli.main(["stale", str(tmp_path / "absent")]) == 2
    for listed in (stale.results_files, stale.stale_files):
        with pytest.raises(ValueError, match="does not exist"):
            listed([tmp_path / "absent"])
    assert stale.results_files([tmp_path]) == []


def test_a_group_of_tables_names_its_code_and_loads_with_it(tmp_path):
    from bnn_zoo import results
    from bnn_zoo._harness.tables import Table, write_table_group

    text = write_table_group(tmp_path, "study", [Table("sweep", "A sweep", [{"w": 4, "v": 2.5}],
                                                       keys=("w",), columns=("v",))])
    assert text.rstrip().splitlines()[-1].startswith(
        f"Runs of code version `{provenance.code_version()}` at commit")
    rendered = readme_tables.render_block("study.json keys=w columns=v table=sweep", tmp_path)
    assert rendered.rstrip().splitlines()[-1] == text.rstrip().splitlines()[-1]
    (row,) = results.load(tmp_path).to_dict("records")
    assert (row["table"], row["w"], row["code"]) == ("sweep", 4, provenance.code_version())


def test_a_table_of_this_process_names_its_code_and_keeps_its_provenance(tmp_path):
    """A benchmark that writes its own numbers (no runs behind them: a timing, say) gets
    the process's code version and commit in the line under its Markdown, and its whole
    provenance (versions, device, threads, date) in the JSON."""
    from bnn_zoo._harness.tables import write_tables
    table = write_tables(tmp_path, "timing", [{"step": "torch", "seconds": 1.5}],
                         keys=("step",), columns=("seconds",))
    document = json.loads((tmp_path / "timing.json").read_text())
    assert document["provenance"]["code"] == [provenance.code_version()]
    assert document["provenance"]["process"]["torch"] == torch.__version__
    assert f"`{provenance.code_version()}`" in table.splitlines()[-1]


def _broken(path: Path, text: str = '{"summary": [{"entry": "map"') -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _one_error_line(err: str, *words: str) -> None:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, (word, err)


def test_every_command_that_reads_results_names_a_file_it_cannot_read(tmp_path, capsys):
    """A results file cut short is an error naming it (exit code 2, one line, no
    traceback) in every command that reads results: ``stale``, the README tables, a
    sweep restoring its cache, and the benchmark scripts that read results."""
    broken = _broken(tmp_path / "results" / "sub" / "compare.json")
    assert cli.main(["stale", str(tmp_path / "results")]) == 2
    _one_error_line(capsys.readouterr().err, "Cannot read results file", str(broken),
                    "line 1, column")
    page = tmp_path / "page.md"
    page.write_text("<!-- table: results/sub/compare.json keys=entry columns=ll -->\n"
                    "<!-- end table -->\n")
    assert cli.main(["tables", str(page), "--root", str(tmp_path)]) == 2
    _one_error_line(capsys.readouterr().err, cli.PROG, str(broken))
    with pytest.raises(ValueError, match=f"Cannot read results file '{broken}'"):
        runs.restore_cache(broken.parent, "compare", task="regression")
    _broken(tmp_path / "sweep" / "checkpoint" / "sine.jsonl", '{"entry": "map"}\n{"entry": \n')
    for argv in ([str(ROOT / "benchmarks" / "moves.py"), str(broken), "--old", str(broken)],
                 [str(ROOT / "benchmarks" / "checkpoint.py"), "--out", str(tmp_path / "sweep"),
                  "--unpack"]):
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2, done.stderr
        _one_error_line(done.stderr, "Cannot read", str(tmp_path))
