"""``benchmarks/fingerprints.py``: the digests of a tiny fit are the same when it is fitted
again and move when the fit does, and ``--check`` names the cases whose digests differ."""

from __future__ import annotations

import dataclasses
import json

import pytest


@pytest.fixture
def fingerprints_script(benchmark_script) -> dict:
    return benchmark_script("fingerprints.py")


def _case(script: dict, entry: str, problem: str):
    return next(c for c in script["cases"]([entry])
                if c.problem.name == problem and c.setting == "tiny")


@pytest.mark.parametrize(("entry", "problem"),
                         [("map", "sine"), ("nuts", "two_moons"), ("hmc", "sine")])
def test_a_tiny_fit_has_the_same_digests_twice_and_others_after_one_more_step(
        fingerprints_script, entry, problem):
    """The saved states of ``nuts`` and ``hmc`` hold their sampling (and MAP) times, which
    the digest leaves out."""
    fingerprint = fingerprints_script["fingerprint"]
    case = _case(fingerprints_script, entry, problem)
    row, run = fingerprint(case)
    again, _ = fingerprint(case)
    assert row == again and row["outcome"] == "ok" and len(row["fingerprint"]) == 16
    assert not [k for k in run["metrics"][0] if k.endswith(fingerprints_script["TIMINGS"])]
    longer = {"method_options": {**case.keywords.get("method_options", {}), "warmup": 5}} \
        if entry in ("nuts", "hmc") else {"steps": 11}
    other, _ = fingerprint(dataclasses.replace(case, keywords={**case.keywords, **longer}))
    assert all(other[k] != row[k] for k in ("state", "predictive", "metrics"))


def test_an_entry_that_declines_a_problem_is_recorded_as_declined(fingerprints_script):
    row, _ = fingerprints_script["fingerprint"](_case(fingerprints_script, "nngp", "two_moons"))
    assert row == {"entry": "nngp", "problem": "two_moons", "setting": "tiny",
                   "outcome": "declined"}


def test_check_passes_on_the_same_code_and_names_an_altered_digest(tmp_path, capsys,
                                                                   fingerprints_script):
    main = fingerprints_script["main"]
    assert main(["--out", str(tmp_path), "--entries", "map"]) == 0
    path = tmp_path / "fingerprints.json"
    document = json.loads(path.read_text())
    assert [r["outcome"] for r in document["summary"]] == ["ok"] * 10
    capsys.readouterr()
    assert main(["--check", str(path), "--entries", "map"]) == 0
    assert "All 10 cases identical" in capsys.readouterr().out
    document["summary"][0]["predictive"] = "0" * 64
    del document["summary"][-1]
    path.write_text(json.dumps(document))
    assert main(["--check", str(path), "--entries", "map"]) == 1
    out = capsys.readouterr().out
    assert "map on sine (tiny): predictive differ" in out
    assert "map on two_moons, splits 0-1 (tiny): only in this run" in out
