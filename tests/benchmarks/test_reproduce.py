"""``benchmarks/reproduce.py`` names the command behind every committed results folder: each
folder is named once, each command is one its script accepts (parsed by the script's own
parser, nothing run), writes into its folder, and a sweep takes the engine's flags."""

from __future__ import annotations

import argparse
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from bnn_zoo._harness import cli

ROOT = Path(__file__).resolve().parents[2]
REPRODUCE = runpy.run_path(str(ROOT / "benchmarks" / "reproduce.py"), run_name="reproduce")
RESULTS = REPRODUCE["RESULTS"]


class Parsed(Exception):
    """Raised in place of running a script once its flags parsed."""


def test_every_committed_folder_has_its_command_or_names_where_it_comes_from():
    on_disk = {p.name for p in (ROOT / "benchmarks" / "results").iterdir() if p.is_dir()}
    listed = {r.folder.split("/")[0] for r in RESULTS}
    assert on_disk == listed | set(REPRODUCE["ELSEWHERE"])
    assert len({r.folder for r in RESULTS}) == len(RESULTS)
    for result in RESULTS:
        assert (ROOT / "benchmarks" / "results" / result.folder).is_dir(), result.folder
        assert result.kind in REPRODUCE["KINDS"]


@pytest.mark.parametrize("result", RESULTS, ids=lambda r: r.folder)
def test_each_command_parses_with_its_scripts_own_flags(result, monkeypatch):
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        parsed = parse(self, args, namespace)
        if getattr(parsed, "command", None) is not None or "out" in vars(parsed):
            raise Parsed(parsed)  # the script's parser accepted every flag
        return parsed  # an inner parser (e.g. uci.py's --gap probe)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    for argv in result.argv(jobs=2, scheduler=None):
        args = argv[1:]
        out = args.index("--out")
        assert args[out + 1] == f"benchmarks/results/{result.folder}"
        assert ("--jobs" in args) == (result.kind == "sweep")
        with pytest.raises(Parsed):
            if args[:2] == ["-m", "bnn_zoo"]:
                cli.main(args[2:])
            else:
                script = runpy.run_path(str(ROOT / args[0]), run_name=Path(args[0]).stem)
                script["main"](args[1:])


def test_dry_run_prints_each_command_and_refuses_unknown_folders(capsys):
    main = REPRODUCE["main"]
    rows = main(["uci", "speed", "--jobs", "2", "--dry-run"])
    assert [r["folder"] for r in rows] == ["uci", "speed"]
    assert "--jobs 2" in rows[0]["command"] and "--jobs" not in rows[1]["command"]
    assert all(r["status"] == 0 for r in rows)
    assert "[uci] python benchmarks/uci.py" in capsys.readouterr().out
    for argv in (["nope"], ["uci", "--all"], []):
        with pytest.raises(SystemExit):
            main(argv)


def test_a_sweep_folder_with_a_checkpoint_is_unpacked_before_its_commands(
        tmp_path, monkeypatch, benchmark_script):
    """The checkpoint that ``benchmarks/checkpoint.py`` packs (under its own folder name) is
    unpacked into the sweep's cache before the sweep runs; a sweep without one, and a
    timing run, run their commands alone."""
    run = REPRODUCE["run"]
    calls = []

    def record(argv, **_):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setitem(run.__globals__, "ROOT", tmp_path)
    monkeypatch.setattr(subprocess, "run", record)
    chosen = REPRODUCE["chosen"](["uci", "uci_gap", "speed"], False)
    uci = tmp_path / "benchmarks" / "results" / "uci"
    uci.mkdir(parents=True)
    (uci / benchmark_script("checkpoint.py")["CHECKPOINT"]).mkdir()
    rows = run(chosen, jobs=2)
    unpack = [sys.executable, str(tmp_path / "benchmarks" / "checkpoint.py"), "--out", str(uci),
              "--unpack"]
    expected = [[*([unpack] if r.folder == "uci" else []), *r.argv(2, None)] for r in chosen]
    assert [r.folder for r in chosen] == ["uci_gap", "uci", "speed"]
    assert calls == [argv for group in expected for argv in group]
    assert [r["folder"] for r in rows] == [r.folder for r in chosen]
