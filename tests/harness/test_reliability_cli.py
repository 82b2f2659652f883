"""Bad input and faults at the command line, the comparison cache and the result files,
table-driven (issue "Every bad input answered"): each case asserts the exit code or error
type, that the message names the culprit (the flag, the path, the entry), and that no file
was lost or half-written. Tiny budgets throughout (``--steps 5``)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import multiprocessing
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure

from bnn_zoo import data
from bnn_zoo._core import files
from bnn_zoo._harness import cli, compare, flags, runs, tables
from bnn_zoo._harness.figures import save_figure
from bnn_zoo.zoo import Entry

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--steps", "5", "--num-samples", "5"]
FIT = ["fit", "--entry", "map", "--data", "sine", *TINY]
COMPARE = ["compare", "--entries", "map", *TINY]
KEEP = "an earlier result\n"


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its content."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _no_temporary_files(root: Path) -> None:
    leftovers = [p for p in root.rglob(".*") if p.is_file()]
    assert not leftovers, f"temporary files left behind: {leftovers}"


def _file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(KEEP)


def _fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


def _broken_json(path: Path) -> None:
    """A results JSON cut short, as a full disk or an editor may leave one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"runs": [{"entry": "map", "data"')


def _not_writable(out: Path, monkeypatch) -> None:
    """A results folder this process may not write (``os.access`` says so: the tests run
    as root, for whom every folder is writable)."""
    out.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != out and real(p, mode))


def _shared_uci(monkeypatch) -> None:
    root = Path(os.environ.get("BNN_ZOO_DATA", ROOT.parent.parent / "shared" / "data" / "uci"))
    if not (root / "yacht").is_dir():
        pytest.skip("the UCI data are not available (set BNN_ZOO_DATA)")
    monkeypatch.setenv("BNN_ZOO_DATA", str(root))


def _no_uci_files(out: Path, monkeypatch) -> None:
    empty = out.parent / "no_uci"
    empty.mkdir()
    monkeypatch.setenv("BNN_ZOO_DATA", str(empty))


# ---------------------------------------------------------------------------------------
# The command line: bad values, names and paths are answered before any work, exit code 2
# ---------------------------------------------------------------------------------------

CUDA = "cuda:99" if torch.cuda.is_available() else "cuda"

# case: (argv ("{out}": the results folder), words the error names, setup(out, monkeypatch))
CLI_ERRORS = {
    "steps zero": ([*FIT, "--steps", "0"], ["--steps", "'0'"], None),
    "steps negative": ([*COMPARE, "--steps", "-3"], ["--steps", "'-3'"], None),
    "steps not a number": ([*FIT, "--steps", "5.5"], ["--steps", "'5.5'"], None),
    "num samples not a number": ([*FIT, "--num-samples", "abc"], ["--num-samples", "'abc'"],
                                 None),
    "num samples zero": ([*COMPARE, "--num-samples", "0"], ["--num-samples"], None),
    "splits negative": ([*COMPARE, "--splits", "-1"], ["--splits", "'-1'"], None),
    "splits zero": ([*COMPARE, "--splits", "0"], ["--splits"], None),
    "threads zero": ([*FIT, "--threads", "0"], ["--threads", "'0'"], None),
    "seed negative": ([*COMPARE, "--seed", "-1"], ["--seed", "'-1'"], None),
    "seed above 32 bits": ([*FIT, "--seed", str(2**32)], ["--seed", str(2**32)], None),
    "split negative": ([*FIT, "--split", "-1"], ["--split", "'-1'"], None),
    "split beyond the data's splits": ([*FIT, "--data", "uci/yacht", "--split", "20"],
                                       ["split", "20"], lambda out, mp: _shared_uci(mp)),
    "device without CUDA": ([*FIT, "--device", CUDA], ["--device", "cuda"], None),
    "device unknown": ([*COMPARE, "--device", "gpu"], ["--device", "gpu"], None),
    "device without data": ([*FIT, "--device", "meta"], ["--device", "'meta'", "holds data"],
                            None),
    "entry unknown": (["fit", "--entry", "no_such", "--data", "sine"], ["--entry", "no_such"],
                      None),
    "entry missing": (["fit", "--data", "sine"], ["--entry"], None),
    "one of the entries unknown": (["compare", "--entries", "map", "no_such"],
                                   ["--entries", "no_such"], None),
    "reference unknown": ([*COMPARE, "--reference", "no_such"], ["--reference", "no_such"],
                          None),
    "data unknown": ([*FIT, "--data", "no_such"], ["--data", "no_such"], None),
    "one of the data sets unknown": ([*COMPARE, "--data", "sine", "no_such"],
                                     ["--data", "no_such"], None),
    "UCI files missing (fit)": ([*FIT, "--data", "uci/yacht"], ["yacht", "BNN_ZOO_DATA"],
                                _no_uci_files),
    "UCI files missing (compare)": ([*COMPARE, "--data", "sine", "uci/yacht"],
                                    ["yacht", "BNN_ZOO_DATA"], _no_uci_files),
    "out is a file (fit)": ([*FIT, "--out", "{out}"], ["--out", "{out}", "is a file"],
                            lambda out, mp: _file(out)),
    "out is a file (compare)": ([*COMPARE, "--out", "{out}"], ["--out", "is a file"],
                                lambda out, mp: _file(out)),
    "out below a file": ([*COMPARE, "--out", "{out}/sub"], ["--out", "{out}", "is a file"],
                         lambda out, mp: _file(out)),
    "out not writable": ([*COMPARE, "--out", "{out}"], ["--out", "not writable"],
                         _not_writable),
    "table file is a folder (compare)": ([*COMPARE, "--out", "{out}"],
                                         ["--out", "compare.md", "is a folder"],
                                         lambda out, mp: (out / "compare.md").mkdir(parents=True)),
    "figure file is a folder": ([*COMPARE, "--out", "{out}"], ["bands_sine.png", "is a folder"],
                                lambda out, mp: (out / "bands_sine.png").mkdir(parents=True)),
    "table file is a folder (fit)": ([*FIT, "--out", "{out}"],
                                     ["--out", "map_sine_split0.json", "is a folder"],
                                     lambda out, mp: (out / "map_sine_split0.json").mkdir(
                                         parents=True)),
    "cache folder is a file": ([*COMPARE, "--out", "{out}"], ["--out", "runs", "is a file"],
                               lambda out, mp: _file(out / "runs")),
    "entry's cache folder is a file": ([*COMPARE, "--out", "{out}"],
                                       ["runs/map", "is a file"],
                                       lambda out, mp: _file(out / "runs" / "map")),
    "priors figure is a folder": (["priors", "--widths", "2", "--samples", "10", "--out",
                                   "{out}"], ["--out", "tail_parameters.png", "is a folder"],
                                  lambda out, mp: (out / "tail_parameters.png").mkdir(
                                      parents=True)),
    "priors depth below 2": (["priors", "--depth", "1", "--out", "{out}"], ["--depth", "'1'"],
                             None),
    "priors width zero": (["priors", "--widths", "10", "0", "--out", "{out}"], ["--widths"],
                          None),
    "priors activation unknown": (["priors", "--activation", "swish", "--out", "{out}"],
                                  ["--activation", "swish"], None),
    "list task unknown": (["list", "--task", "ranking"], ["--task", "ranking"], None),
    "datasets task unknown": (["datasets", "--task", "ranking"], ["--task", "ranking"], None),
    "data unknown names the families": (
        [*FIT, "--data", "nope"],
        ["--data", "'nope'", "two_moons", "uci/<name>", "uci_gap/<name>",
         "`python -m bnn_zoo datasets` lists them all"], None),
    "data misspelt": ([*FIT, "--data", "uci/yach"], ["'uci/yach'", "Did you mean 'uci/yacht'"],
                      None),
    "table file is a FIFO (fit)": ([*FIT, "--out", "{out}"],
                                   ["--out", "map_sine_split0.md", "it is a FIFO"],
                                   lambda out, mp: _fifo(out / "map_sine_split0.md")),
    "results file unreadable (stale)": (["stale", "{out}"],
                                        ["Cannot read results file", "broken.json", "line 1"],
                                        lambda out, mp: _broken_json(out / "sub" / "broken.json")),
    "command unknown": (["train"], ["invalid choice", "train"], None),
}


@pytest.mark.parametrize("case", sorted(CLI_ERRORS))
def test_bad_input_is_answered_before_any_work(case, tmp_path, monkeypatch, capsys):
    argv, words, setup = CLI_ERRORS[case]
    out = tmp_path / "out"
    if setup is not None:
        setup(out, monkeypatch)
    _file(tmp_path / "keep.txt")
    before = _files(tmp_path)
    for module in (runs, cli):
        monkeypatch.setattr(module, "run_one", lambda *a, **k: pytest.fail("a fit ran"))
    if argv[0] in ("fit", "compare", "priors") and "--out" not in argv:
        argv = [*argv, "--out", "{out}"]
    code = cli.main([a.replace("{out}", str(out)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    for word in words:
        assert word.replace("{out}", str(out)) in err, (word, err)
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("python -m bnn_zoo")  # argparse's last line
    assert _files(tmp_path) == before  # nothing written, nothing lost


def test_debug_shows_the_traceback_of_a_user_error(tmp_path, monkeypatch, capsys):
    _no_uci_files(tmp_path / "out", monkeypatch)
    assert cli.main([*FIT, "--data", "uci/yacht"]) == 2
    plain = capsys.readouterr().err
    assert plain.count("\n") == 1 and "Traceback" not in plain
    for argv in (["--debug", *FIT, "--data", "uci/yacht"], [*FIT, "--data", "uci/yacht",
                                                           "--debug"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" in err and "FileNotFoundError" in err and "yacht" in err


def test_installed_script_exit_code():
    """The installed ``bnn-zoo`` script exits with 2 on a bad flag (``python -m bnn_zoo``
    runs in the tests below)."""
    script = Path(sys.executable).parent / "bnn-zoo"
    if not script.exists():
        pytest.skip("the package is not installed with its scripts")
    done = subprocess.run([str(script), "fit", "--entry", "map", "--data", "sine", "--steps",
                           "0"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2 and "argument --steps" in done.stderr
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------
# The command line: a requested run that fails or is declined gives exit code 1
# ---------------------------------------------------------------------------------------

def _broken_map(monkeypatch) -> None:
    """The ``map`` entry's fit raises, as a broken entry would (fitted alone or as replicas)."""
    real = runs.zoo.get

    class Broken(Entry):
        def fit(self, *args, **kwargs):
            raise RuntimeError("the optimiser exploded")

        fit_many = fit

    broken = Broken(**{f.name: getattr(real("map"), f.name) for f in dataclasses.fields(Entry)})
    monkeypatch.setattr(runs.zoo, "get", lambda name: broken if name == "map" else real(name))


# case: (argv, exit code, words on stderr, setup(monkeypatch))
RUN_OUTCOMES = {
    "fit of an entry that errors": (FIT, 1, ["map", "failed", "optimiser exploded"],
                                    _broken_map),
    "compare with an entry that errors": (["compare", "--entries", "map", "mean_field", *TINY], 1,
                                          ["map", "failed", "optimiser exploded"], _broken_map),
    "fit of an unsupported problem": (["fit", "--entry", "nngp", "--data", "two_moons", *TINY],
                                      1, ["nngp", "skipped", "classification"], None),
    "compare, an entry asked for declines": (["compare", "--entries", "map", "nngp", "--data",
                                              "two_moons", *TINY], 1, ["nngp", "skipped"], None),
    "compare, the reference declines": ([*COMPARE, "--data", "two_moons", "--reference",
                                         "nngp"], 1, ["nngp", "skipped"], None),
    "compare, a default entry declines": (["compare", "--data", "two_moons", *TINY], 0, [],
                                          lambda mp: mp.setattr(cli, "QUICK_ENTRIES",
                                                                ("map", "nngp"))),
}


@pytest.mark.parametrize("case", sorted(RUN_OUTCOMES))
def test_exit_code_says_whether_every_requested_run_ran(case, tmp_path, monkeypatch, capsys):
    argv, expected, words, setup = RUN_OUTCOMES[case]
    if setup is not None:
        setup(monkeypatch)
    code = cli.main([*argv, "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == expected, captured.err
    for word in words:
        assert word in captured.err
    assert "Traceback" not in captured.err
    if argv[0] == "compare":  # the tables are written all the same, with the reason
        table = (tmp_path / "compare.md").read_text()
        assert all(word in table for word in words)
        json.loads((tmp_path / "compare.json").read_text())
    _no_temporary_files(tmp_path)


# ---------------------------------------------------------------------------------------
# The benchmark scripts share the flags and their checks
# ---------------------------------------------------------------------------------------

# script: (argv, the flag named)
BENCHMARK_ERRORS = {
    "compare_guides": (["--steps", "0"], "--steps"),
    "classification": (["--data", "sine"], "--data"),
    "uci": (["--num-samples", "abc"], "--num-samples"),
    "laplace_variants": (["--splits", "0"], "--splits"),
    "laplace_torch": (["--marglik-steps", "0"], "--marglik-steps"),
    "nngp": (["--train-size", "0"], "--train-size"),
    "rff": (["--num-features", "-1"], "--num-features"),
    "mixture": (["--lr", "-0.1"], "--lr"),
    "speed": (["--threads", "0"], "--threads"),
    "throughput": (["--device", CUDA], "--device"),
    "distributed_fit": (["--batch-size", "0"], "--batch-size"),
}


@pytest.mark.parametrize("script", sorted(BENCHMARK_ERRORS))
def test_benchmark_flags_are_checked_before_any_work(script, tmp_path, monkeypatch, capsys):
    argv, flag = BENCHMARK_ERRORS[script]
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    module = importlib.import_module(script)
    monkeypatch.setattr(runs, "run_one", lambda *a, **k: pytest.fail("a fit ran"))
    with pytest.raises(SystemExit) as stop:
        module.main([*argv, "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "argument" in err and flag in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_benchmark_out_is_checked_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    module = importlib.import_module("compare_guides")
    _file(tmp_path / "taken")
    with pytest.raises(SystemExit):
        module.main(["--out", str(tmp_path / "taken")])
    assert f"--out {tmp_path / 'taken'}" in capsys.readouterr().err
    assert (tmp_path / "taken").read_text() == KEEP


# ---------------------------------------------------------------------------------------
# The comparison cache: the key covers every setting; a damaged file is refitted
# ---------------------------------------------------------------------------------------

SINE = data.load("sine")
BASE = {"entry": "map", "dataset": SINE, "split": 0, "seed": 0, "overrides": {"steps": 5},
        "num_samples": 5}


def _key(entry, dataset, split, seed, overrides, num_samples) -> Path:
    return runs.cache_path("out", entry, dataset.name, split, seed,
                           runs.run_settings(dataset, overrides, num_samples))


def _other_values(dataset: data.Dataset) -> data.Dataset:
    moved = dict(dataset.__dict__)
    moved["y_train"] = dataset.y_train + 1.0
    return data.Dataset(**moved)


# case: the settings that differ from BASE
CACHE_KEY_CASES = {
    "entry": {"entry": "mean_field"},
    "data set": {"dataset": data.load("gap")},
    "data values (another file under the same name)": {"dataset": _other_values(SINE)},
    "split": {"split": 1},
    "seed": {"seed": 1},
    "steps": {"overrides": {"steps": 6}},
    "budget option": {"overrides": {"steps": 5, "lr": 0.1}},
    "model options": {"overrides": {"steps": 5, "model_options": {"hidden": [20]}}},
    "guide options": {"overrides": {"steps": 5, "guide_options": {"init_scale": 0.1}}},
    "method options": {"overrides": {"steps": 5, "method_options": {"members": 2}}},
    "num_samples": {"num_samples": 6},
    "dtype": {"dataset": data.load("sine", dtype=torch.float64)},
}


@pytest.mark.parametrize("case", sorted(CACHE_KEY_CASES))
def test_cache_key_changes_with_every_setting_of_a_result(case):
    assert _key(**{**BASE, **CACHE_KEY_CASES[case]}) != _key(**BASE)


def test_cache_key_changes_with_the_device_and_not_with_key_order():
    settings = runs.run_settings(SINE, {"steps": 5, "lr": 0.1}, 5)
    path = runs.cache_path("out", "map", "sine", 0, 0, settings)
    assert runs.cache_path("out", "map", "sine", 0, 0, {**settings, "device": "cuda:0"}) != path
    reordered = runs.run_settings(SINE, {"lr": 0.1, "steps": 5}, 5)
    assert runs.cache_path("out", "map", "sine", 0, 0, reordered) == path


def _record(path: Path) -> dict:
    return json.loads(path.read_text())


# case: damage(path of the cached record), words of the warning
CACHE_DAMAGE = {
    "truncated": (lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2]),
                  "fitting it again"),
    "empty": (lambda p: p.write_text(""), "Expecting value"),
    "not JSON": (lambda p: p.write_text("<html>oops</html>"), "Expecting value"),
    "binary garbage": (lambda p: p.write_bytes(b"\xff\xfe\x00\x81" * 10), "decode"),
    "a list, not a record": (lambda p: p.write_text("[1, 2]"), "fields missing"),
    "fields missing": (lambda p: p.write_text(json.dumps({"entry": "map"})), "fields missing"),
    "results missing": (lambda p: p.write_text(json.dumps(
        {k: v for k, v in _record(p).items() if k != "metrics"})), "results missing"),
    "another run's record": (lambda p: p.write_text(json.dumps({**_record(p), "seed": 7})),
                             "another run"),
}


@pytest.fixture(scope="module")
def cached_map(tmp_path_factory) -> tuple[Path, dict]:
    """A comparison folder holding one cached run of ``map`` on ``sine``, and its record."""
    out = tmp_path_factory.mktemp("cache")
    (record,) = compare.run_comparison(["sine"], ["map"], out=out, overrides={"steps": 5},
                                       num_samples=5, log=False)
    return out, record


@pytest.mark.parametrize("case", sorted(CACHE_DAMAGE))
def test_damaged_cache_file_is_refitted_with_a_warning(case, cached_map, tmp_path):
    source, first = cached_map
    out = tmp_path / "out"
    (path,) = (source / "runs" / "map").glob("*.json")
    target = out / path.relative_to(source)
    target.parent.mkdir(parents=True)
    target.write_bytes(path.read_bytes())
    damage, words = CACHE_DAMAGE[case]
    damage(target)
    with pytest.warns(runs.CacheWarning, match=words) as warned:
        (again,) = compare.run_comparison(["sine"], ["map"], out=out, overrides={"steps": 5},
                                          num_samples=5, log=False)
    assert any(str(target) in str(w.message) for w in warned)  # the warning names the file
    same = ("ll", "rmse", "coverage_90")  # same seed, same fit
    assert again["status"] == "ok"
    assert [again["metrics"][k] for k in same] == [first["metrics"][k] for k in same]
    assert _record(target)["metrics"] == again["metrics"]  # the file is whole again
    _no_temporary_files(out)


def test_cache_file_that_cannot_be_written_costs_a_warning_not_the_run(tmp_path):
    settings = runs.run_settings(SINE, {"steps": 5}, 5)
    path = runs.cache_path(tmp_path, "map", "sine", 0, 0, settings)
    path.mkdir(parents=True)  # a folder where the record goes: unreadable and unwritable
    with pytest.warns(runs.CacheWarning) as warned:
        record = runs.cached_run("map", SINE, split=0, seed=0, overrides={"steps": 5},
                                 num_samples=5, out=tmp_path, log=False)
    assert record["status"] == "ok"
    assert [str(path) in str(w.message) for w in warned] == [True, True]  # read, then write
    _no_temporary_files(tmp_path)


# ---------------------------------------------------------------------------------------
# Atomic writes: a failing or interrupted write leaves the previous file intact
# ---------------------------------------------------------------------------------------

def _half_then(error: BaseException):
    def write_text(self, text, *args, **kwargs):
        with open(self, "w") as f:
            f.write(text[: len(text) // 2])
        raise error

    return write_text


def _write_table(out: Path) -> None:
    tables.write_tables(out, "result", [{"entry": "new", "ll": 1.0}], keys=("entry",),
                        columns=("ll",))


def _save_figure(out: Path) -> None:
    fig = Figure()
    fig.add_subplot().plot([0, 1])
    save_figure(fig, out / "result.png")


# case: (write into out, fault (monkeypatch) -> exception type)
WRITE_FAULTS = {
    "table, disk full mid-write": (_write_table, lambda mp: mp.setattr(
        Path, "write_text", _half_then(OSError(28, "No space left on device"))), OSError),
    "table, Ctrl-C mid-write": (_write_table, lambda mp: mp.setattr(
        Path, "write_text", _half_then(KeyboardInterrupt())), KeyboardInterrupt),
    "table, rename fails": (_write_table, lambda mp: mp.setattr(
        os, "replace", lambda a, b: (_ for _ in ()).throw(OSError("rename failed"))), OSError),
    "figure, drawing fails": (_save_figure, lambda mp: mp.setattr(
        Figure, "savefig", lambda self, *a, **k: (_ for _ in ()).throw(ValueError("bad"))),
        ValueError),
    "figure, Ctrl-C while saving": (_save_figure, lambda mp: mp.setattr(
        Figure, "savefig", lambda self, *a, **k: (_ for _ in ()).throw(KeyboardInterrupt())),
        KeyboardInterrupt),
}


@pytest.mark.parametrize("case", sorted(WRITE_FAULTS))
def test_failing_write_keeps_the_previous_file(case, tmp_path, monkeypatch):
    write, fault, error = WRITE_FAULTS[case]
    for name in ("result.md", "result.csv", "result.json", "result.png"):
        _file(tmp_path / name)
    fault(monkeypatch)
    with pytest.raises(error):
        write(tmp_path)
    monkeypatch.undo()
    assert all(p.read_text() == KEEP for p in tmp_path.iterdir())
    _no_temporary_files(tmp_path)


def test_atomic_write_keeps_permissions(tmp_path):
    """``mkstemp`` makes owner-only files; a result file gets the usual permissions, or
    keeps those of the file it replaces."""
    new = files.write_text_atomic(tmp_path / "new.txt", "x")
    assert stat.S_IMODE(new.stat().st_mode) == files.NEW_FILE_MODE
    private = tmp_path / "private.txt"
    private.write_text("old")
    private.chmod(0o600)
    files.write_text_atomic(private, "new")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and private.read_text() == "new"


# ---------------------------------------------------------------------------------------
# Concurrency and interruption
# ---------------------------------------------------------------------------------------

def _writer(path: str, tag: int, times: int) -> None:
    for i in range(times):
        files.write_text_atomic(path, json.dumps({"writer": tag, "i": i, "pad": "x" * 4000}))


def test_two_writers_and_a_reader_of_one_file_never_collide(tmp_path):
    path = tmp_path / "runs" / "record.json"
    files.write_text_atomic(path, json.dumps({"writer": -1}))
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_writer, args=(str(path), tag, 300)) for tag in (0, 1)]
    for w in writers:
        w.start()
    reads = 0
    while any(w.is_alive() for w in writers):
        json.loads(path.read_text())  # never half-written
        reads += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0  # no write failed
    assert json.loads(path.read_text())["i"] == 299 and reads > 0
    _no_temporary_files(tmp_path)


def _default_sigint() -> None:
    """In the child before it starts Python: Ctrl-C as in a user's shell. A child inherits
    an ignored SIGINT, and Python then installs no KeyboardInterrupt handler; pytest started
    in the background by a non-interactive shell (``pytest &``) ignores SIGINT, as POSIX has
    it, and the test then failed with all 20 splits fitted."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _bnn_zoo(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bnn_zoo", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"})


def test_two_comparisons_into_one_out_folder(tmp_path):
    argv = ["compare", "--entries", "map", "--splits", "3", *TINY, "--threads", "1",
            "--out", str(tmp_path)]
    processes = [_bnn_zoo(*argv), _bnn_zoo(*argv)]
    for p in processes:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    documents = sorted(tmp_path.rglob("*.json"))
    assert len(documents) == 1 + 3  # compare.json and one record per split
    for document in documents:
        json.loads(document.read_text())
    assert "| map | 3 |" in (tmp_path / "compare.md").read_text()
    _no_temporary_files(tmp_path)


def test_ctrl_c_leaves_whole_files_and_the_rerun_resumes(tmp_path):
    # One by one: fitted as replicas, the 20 splits would finish together, before the signal.
    argv = ["compare", "--entries", "map", "--splits", "20", *TINY, "--threads", "1",
            "--replicas", "off", "--out", str(tmp_path)]
    process = _bnn_zoo(*argv)
    first = process.stdout.readline()  # the first finished run
    assert first.startswith("[ok] map on sine split 0"), first
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and "interrupted" in err and "Traceback" not in err
    cached = sorted((tmp_path / "runs" / "map").glob("*.json"))
    assert 1 <= len(cached) < 20
    for document in cached:
        json.loads(document.read_text())
    _no_temporary_files(tmp_path)
    again = _bnn_zoo(*[str(len(cached)) if a == "20" else a for a in argv])
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert out.count("[cached]") == len(cached)


# ---------------------------------------------------------------------------------------
# The argparse types of the shared flags
# ---------------------------------------------------------------------------------------

# type: (good text, its value, bad texts)
FLAG_TYPES = {
    "positive_int": (flags.positive_int, "3", 3, ["0", "-1", "1.5", "x", ""]),
    "random_seed": (flags.random_seed, "0", 0, ["-1", str(2**32), "seed"]),
    "positive_float": (flags.positive_float, "0.5", 0.5, ["0", "-1", "nan", "inf", "x"]),
    "dataset_name": (flags.dataset_name, "yacht", "uci/yacht", ["no_such", "uci/no_such"]),
    "entry_name": (flags.entry_name, "map", "map", ["no_such", ""]),
    "torch_device": (flags.torch_device, "cpu", torch.device("cpu"), ["gpu", CUDA]),
}


@pytest.mark.parametrize("name", sorted(FLAG_TYPES))
def test_flag_types_accept_good_and_name_bad_values(name):
    parse, good, value, bad = FLAG_TYPES[name]
    assert parse(good) == value
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match="(?i)expected|unknown"):
            parse(text)
