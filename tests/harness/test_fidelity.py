"""The fidelity table and figure: entries ranked by their distance to the reference over
the splits it passed its gate on, with their fit time."""

from __future__ import annotations

import json

import pytest

from bnn_zoo._harness import fidelity


def _record(entry: str, split: int, quantiles: list, seconds: float, task="regression",
            diagnostics=None) -> dict:
    return {"entry": entry, "data": "toy", "task": task, "split": split, "status": "ok",
            "metrics": {"ll": -1.0, "fit_seconds": seconds},
            "diagnostics": diagnostics or {},
            "moments": {"mean": [0.0], "std": [1.0]}, "quantiles": quantiles}


PASSING = {"chains": 4.0, "r_hat_pred_max": 1.001, "ess_pred_min": 900.0}
FAILING = {"chains": 4.0, "r_hat_pred_max": 1.2, "ess_pred_min": 900.0}


def test_entries_ranked_by_w1_over_the_gated_splits():
    """Split 1's reference fails the gate, so only split 0 is measured; ``far`` is 2 units
    from the reference there and ``near`` 0.5: ``near`` ranks first. The reference itself
    gets no row, and an entry that failed has none either."""
    records = [_record("hmc", 0, [[0.0], [1.0]], 100.0, diagnostics=PASSING),
               _record("hmc", 1, [[0.0], [1.0]], 100.0, diagnostics=FAILING),
               _record("far", 0, [[2.0], [3.0]], 1.0), _record("far", 1, [[0.0], [1.0]], 1.0),
               _record("near", 0, [[0.5], [1.5]], 10.0),
               {"entry": "broken", "data": "toy", "task": "regression", "split": 0,
                "status": "failed", "reason": "x"}]
    rows = fidelity.fidelity_rows(records, "hmc")
    assert [(r["entry"], r["rank"], r["runs"]) for r in rows] == [("near", 1, 1), ("far", 2, 1)]
    assert rows[0]["w1_to_ref"] == pytest.approx(0.5)
    assert rows[1]["w1_to_ref"] == pytest.approx(2.0)
    assert rows[1]["fit_seconds"] == 1.0


def test_classification_ranks_by_total_variation_and_files_are_written(tmp_path):
    def clf(entry, probs, seconds):
        return {"entry": entry, "data": "moons", "task": "classification", "split": 0,
                "status": "ok", "metrics": {"nll": 0.3, "fit_seconds": seconds},
                "diagnostics": PASSING if entry == "hmc" else {}, "class_probs": probs}

    records = [clf("hmc", [[0.9, 0.1], [0.2, 0.8]], 50.0),
               clf("a", [[0.5, 0.5], [0.2, 0.8]], 2.0), clf("b", [[0.8, 0.2], [0.3, 0.7]], 3.0)]
    table = fidelity.write_fidelity(records, tmp_path, "hmc")
    saved = json.loads((tmp_path / "fidelity.json").read_text())["summary"]
    assert [(r["entry"], r["rank"]) for r in saved] == [("b", 1), ("a", 2)]
    assert [r["tv_to_ref"] for r in saved] == pytest.approx([0.1, 0.2])
    assert "| b |" in table and (tmp_path / "fidelity.png").stat().st_size > 0
    assert fidelity.write_fidelity(records[:1], tmp_path / "none", "hmc") is None


def test_an_entry_without_quantiles_is_left_out():
    """A run that kept no quantiles (one of a sweep without a reference) has no W1 to rank."""
    old = _record("old", 0, [[0.0], [1.0]], 1.0)
    del old["quantiles"]
    records = [_record("hmc", 0, [[0.0], [1.0]], 100.0, diagnostics=PASSING), old]
    assert fidelity.fidelity_rows(records, "hmc") == []


def test_labels_of_points_that_coincide_do_not_overlap():
    """Fifteen entries at one point (more than five lines above and below): each label
    moves up or down until it clears the others."""
    rows = [{"data": "toy", "entry": f"entry_{i}", "task": "regression", "w1_to_ref": 0.5,
             "w1_to_ref_se": 0.1, "fit_seconds": 2.0} for i in range(15)]
    ax = fidelity.fidelity_figure(rows).axes[0]
    boxes = [text.get_window_extent() for text in ax.texts]
    assert len(boxes) == 15
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
