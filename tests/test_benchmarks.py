"""Every script in ``benchmarks/`` runs with tiny flags, without the network; a script
missing from ``TINY_ARGS`` fails the suite (as Pyro's ``tests/test_examples.py`` does).
Every script takes the shared flags and writes its tables through the harness's one
table writer."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

# file name -> flags that make it run in seconds ("{out}" becomes a temporary folder)
TINY_ARGS: dict[str, list[str]] = {
    "speed.py": ["--repeats", "1", "--inner", "1", "--nets", "13-50-1", "--out", "{out}"],
    "replicas.py": ["--replicas", "2", "--steps", "3", "--repeats", "1", "--points", "20",
                    "--out", "{out}"],
    "compare_guides.py": ["--data", "sine", "--entries", "map", "--steps", "10",
                          "--num-samples", "5", "--reference", "none", "--out", "{out}"],
    "uci.py": ["--data", "yacht", "--splits", "1", "--entries", "map", "--steps", "10",
               "--num-samples", "5", "--out", "{out}"],
}
NEEDS_UCI = {"uci.py"}
# scripts whose tiny run lives beside the method's other tests, which also check the numbers
TESTED_ELSEWHERE = {
    "bbb_priors.py": "test_bbb.py",
    "classification.py": "test_mean_field_clf.py",
    "distributed_fit.py": "test_scale_scripts.py",
    "laplace.py": "test_laplace.py",
    "mixture.py": "test_mixture.py",
    "nngp.py": "test_nngp.py",
    "rff.py": "test_rff.py",
    "throughput.py": "test_scale_scripts.py",
}


def test_every_script_is_listed():
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    missing = scripts - set(TINY_ARGS) - set(TESTED_ELSEWHERE)
    assert not missing, f"add tiny flags for {sorted(missing)} to TINY_ARGS"
    tests = Path(__file__).resolve().parent
    for script, test_file in TESTED_ELSEWHERE.items():
        assert script.removesuffix(".py") in (tests / test_file).read_text(), (script, test_file)


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
def test_script_uses_the_shared_flags_and_the_table_writer(script):
    text = (BENCHMARKS / script).read_text()
    assert "flags.parse(" in text
    assert "add_shared_flags" in text or "add_comparison_flags" in text
    assert any(w in text for w in ("write_tables(", "write_table_group(", "write_comparison(",
                                   "run_from_args("))
    for own in ("set_num_threads", "argparse.FileType", ".write_text(", "savefig(", "csv.",
                "json.dump"):
        assert own not in text, f"{script} uses {own}; the harness does that"


@pytest.mark.parametrize("script", sorted(TINY_ARGS))
def test_script_runs_with_tiny_flags(script, tmp_path, monkeypatch, request, capsys):
    if script in NEEDS_UCI:
        request.getfixturevalue("uci_data")
    argv = [a.replace("{out}", str(tmp_path)) for a in TINY_ARGS[script]]
    monkeypatch.setattr(sys, "argv", [script, *argv])
    runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    assert "[failed]" not in capsys.readouterr().out  # a comparison reports a failed fit
    assert any(p.suffix == ".md" for p in tmp_path.iterdir())
