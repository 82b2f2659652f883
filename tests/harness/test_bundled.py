"""The bundled HMC reference: of today's posterior, converged, and what ``python -m bnn_zoo
compare`` measures the guides against without sampling it again."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bnn_zoo import data, zoo
from bnn_zoo._harness import bundled, cli, flags
from bnn_zoo._harness.runs import data_digest
from bnn_zoo._harness.summary import GATE, REFERENCE
from bnn_zoo.methods import ConvergenceGate

BUNDLED_FILES = sorted(bundled.BUNDLED.glob("*.json"))


def test_the_default_comparison_has_a_bundled_reference():
    assert bundled.bundled_path(REFERENCE, "sine", 0, 0) in BUNDLED_FILES


@pytest.mark.parametrize("path", BUNDLED_FILES, ids=lambda p: p.stem)
def test_a_bundled_reference_is_of_todays_posterior_and_converged(path):
    stored, today = bundled.check_posterior(path)
    # float32 sums over the training points: relative rounding about 1e-6.
    assert today == pytest.approx(stored, rel=1e-5)
    record = json.loads(path.read_text())["runs"][0]
    assert record["status"] == "ok" and not GATE.failures(record["diagnostics"])
    assert record["settings"]["data_digest"] == data_digest(data.load(record["data"],
                                                                      record["split"]))
    levels = record["settings"]["quantiles"]
    assert len(record["quantiles"]) == levels
    assert all(len(q) == len(record["moments"]["mean"]) for q in record["quantiles"])


def test_the_posterior_check_can_fail():
    """Another noise scale (or prior, or likelihood) moves the log joints far beyond the
    tolerance of the test above."""
    path = bundled.bundled_path(REFERENCE, "sine", 0, 0)
    document = json.loads(path.read_text())
    check = document["check"]
    weights = [{k: torch.tensor(v) for k, v in w.items()} for w in check["weights"]]
    other = bundled.log_joint(REFERENCE, data.load("sine"), 1.01 * check["noise_scale"],
                              weights)
    assert other != pytest.approx(check["log_joint"], rel=1e-4)


def test_no_bundled_file_is_a_skipped_run(capsys):
    records = bundled.bundled_runs(REFERENCE, [data.load("sine", 0)], splits=[0], seeds=[7],
                                   overrides={}, num_samples=200, quantiles=True,
                                   together=False)
    assert records[0]["status"] == "skipped" and records[0]["reason"] == bundled.NOT_BUNDLED
    assert capsys.readouterr().out == ""  # where none is bundled, the comparison is quiet


def _table_rows(markdown: str, entry: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith(f"| {entry} |")]


def test_compare_measures_the_guides_against_the_bundled_reference(tmp_path, capsys):
    # --steps is the guides' budget; the bundled reference keeps its own.
    assert cli.main(["compare", "--entries", "map", "--steps", "50", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"[bundled] {REFERENCE} on sine split 0: sampled in" in out
    table = (tmp_path / "compare.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| entry |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    map_row, reference_row = ([c.strip() for c in _table_rows(table, e)[0].strip("|").split("|")]
                              for e in ("map", REFERENCE))
    for column in ("w1_to_ref", "w2_to_ref"):
        assert float(map_row[columns.index(column)]) > 0.0
    ll = {row[0]: float(row[columns.index("ll")]) for row in (map_row, reference_row)}
    assert float(map_row[columns.index("ll_gap")]) == pytest.approx(
        ll["map"] - ll[REFERENCE], abs=2e-3)
    assert float(reference_row[columns.index("w1_to_ref")]) == 0.0
    assert "| pass |" in (tmp_path / "reference.md").read_text()
    runs = json.loads((tmp_path / "compare.json").read_text())["runs"]
    assert {r["entry"] for r in runs} == {"map", REFERENCE}
    assert not (tmp_path / "runs" / REFERENCE).exists()  # read, not cached as this code's


def test_compare_without_a_matching_bundle_has_no_reference(tmp_path, capsys):
    assert cli.main(["compare", "--entries", "map", "--steps", "20", "--num-samples", "10",
                     "--seed", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not _table_rows(out, REFERENCE) and "w1_to_ref" not in out
    assert not (tmp_path / "reference.md").exists()
    runs = json.loads((tmp_path / "compare.json").read_text())["runs"]
    assert [r["entry"] for r in runs] == ["map"]


def test_the_bundling_script_bundles_what_passes_the_gate(tmp_path, monkeypatch,
                                                          benchmark_script):
    """``bundle_reference.py`` samples ``hmc`` (tiny here) as the default comparison would
    and bundles the splits that pass the gate: none under the real gate (2 chains), the
    split under a gate that 4 draws of 2 chains pass, with the log joints of its check."""
    entry_type = type(zoo.get(REFERENCE))
    fit = entry_type.fit

    def tiny(self, *args, **kwargs):
        kwargs["method_options"] = {"warmup": 4, "samples": 4, "chains": 2, "map_iterations": 5}
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(entry_type, "fit", tiny)
    monkeypatch.setattr(bundled, "BUNDLED", tmp_path / "references")
    main = benchmark_script("bundle_reference.py")["main"]
    assert main(["--out", str(tmp_path / "strict")]) == []
    assert not (tmp_path / "references").exists()
    monkeypatch.setitem(main.__globals__, "GATE", ConvergenceGate(r_hat=math.inf, ess=-math.inf,
                                                                  chains=2))
    paths = main(["--out", str(tmp_path / "lenient")])
    assert paths == [tmp_path / "references" / f"{REFERENCE}_sine_split0_seed0.json"]
    stored, today = bundled.check_posterior(paths[0])
    assert today == pytest.approx(stored, rel=1e-5)
    record = json.loads(paths[0].read_text())["runs"][0]
    assert record["diagnostics"]["chains"] == 2.0 and "losses" not in record


def test_the_bundling_script_refuses_classification_before_any_work(tmp_path, capsys,
                                                                    benchmark_script):
    with pytest.raises(SystemExit) as exit_:
        benchmark_script("bundle_reference.py")["main"](["--data", "sine", "two_moons",
                                                         "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert "argument --data: expected regression data sets" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_every_comparison_script_reads_auto_as_the_bundled_reference_entry():
    parse = cli.build_parser().parse_args
    assert flags.reference_entry(parse(["compare"])) == REFERENCE
    assert flags.reference_entry(parse(["compare", "--reference", "none"])) is None
    assert flags.reference_entry(parse(["compare", "--reference", "nuts"])) == "nuts"
