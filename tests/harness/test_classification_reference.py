"""The NUTS reference for classification: the agreement of the predicted classes and the
total variation between predictive distributions (bnn_zoo._harness.summary), split by split
beside the chains' diagnostics, and ``compare --reference nuts`` on a classification set."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from bnn_zoo import zoo
from bnn_zoo._harness import cli, summary
from bnn_zoo._harness.summary import class_agreement, reference_rows, total_variation
from bnn_zoo.methods._nuts import ConvergenceGate

F64 = torch.float64


def test_agreement_and_total_variation_by_hand():
    p = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.5, 0.3], [0.4, 0.4, 0.2]], dtype=F64)
    q = torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.2, 0.7], [0.1, 0.8, 0.1]], dtype=F64)
    # arg-max: p (0, 1, 0: the tie of 0.4 and 0.4 goes to the first), q (0, 2, 1)
    torch.testing.assert_close(class_agreement(p, q), torch.tensor([1.0, 0.0, 0.0], dtype=F64))
    # 1/2 (0.3 + 0.2 + 0.1), 1/2 (0.1 + 0.3 + 0.4), 1/2 (0.3 + 0.4 + 0.1)
    torch.testing.assert_close(total_variation(p, q), torch.tensor([0.3, 0.4, 0.4], dtype=F64))
    torch.testing.assert_close(total_variation(q, p), total_variation(p, q))
    disjoint = torch.tensor([[1.0, 0.0]], dtype=F64), torch.tensor([[0.0, 1.0]], dtype=F64)
    assert total_variation(*disjoint).item() == 1.0
    assert class_agreement(*disjoint).item() == 0.0


def test_identical_predictives_agree_everywhere_at_no_distance():
    g = torch.Generator().manual_seed(0)
    p = torch.randn(20, 4, generator=g, dtype=F64).softmax(-1)
    assert torch.equal(class_agreement(p, p), torch.ones(20, dtype=F64))
    assert torch.equal(total_variation(p, p), torch.zeros(20, dtype=F64))


def test_distances_refuse_mismatched_or_bad_probabilities():
    p = torch.full((3, 2), 0.5)
    with pytest.raises(ValueError, match="same shape"):
        total_variation(p, torch.full((3, 3), 1 / 3))
    with pytest.raises(ValueError, match="probs_b to have 2 dimensions"):
        class_agreement(p, p[0])
    with pytest.raises(TypeError, match="probs_a to be a torch.Tensor"):
        total_variation(p.tolist(), p)


def record(entry, split, probs, **diagnostics):
    return {"entry": entry, "data": "toy_clf", "task": "classification", "split": split,
            "status": "ok", "metrics": {"accuracy": 1.0, "nll": 0.1},
            "class_probs": probs, "diagnostics": diagnostics}


def test_reference_rows_give_agreement_and_total_variation_split_by_split():
    records = [
        record("nuts", 0, [[0.9, 0.1], [0.3, 0.7]], r_hat_pred_max=1.004, ess_pred_min=900.0,
               chains=4.0),
        record("nuts", 1, [[0.5, 0.5], [0.2, 0.8]], r_hat_pred_max=1.008, ess_pred_min=450.0,
               chains=4.0),
        record("map", 0, [[0.6, 0.4], [0.6, 0.4]]),  # agree 1, 0; TV 0.3, 0.3
        record("map", 1, [[0.5, 0.5], [0.2, 0.8]]),  # the same predictive: 1, 0
        {**record("map", 2, None), "status": "failed", "reason": "boom"},
        {**record("bbb", 0, None), "class_probs": None},  # restored: kept no probabilities
    ]
    records[-1].pop("class_probs")
    rows = {(r["entry"], r["split"]): r for r in reference_rows(records, "nuts")}
    assert rows["map", 0]["agreement"] == pytest.approx(0.5)
    assert rows["map", 0]["tv_to_ref"] == pytest.approx(0.3)
    assert rows["map", 1]["agreement"] == 1.0 and rows["map", 1]["tv_to_ref"] == 0.0
    assert rows["map", "all"]["agreement"] == pytest.approx(0.75)
    assert rows["map", "all"]["agreement_se"] == pytest.approx(0.25)  # sd 0.5/sqrt(2), 2 runs
    assert rows["map", "all"]["tv_to_ref"] == pytest.approx(0.15)
    assert rows["nuts", "all"]["agreement"] == 1.0 and rows["nuts", "all"]["tv_to_ref"] == 0.0
    assert rows["nuts", "all"]["r_hat_pred_max"] == 1.008
    assert rows["nuts", "all"]["ess_pred_min"] == 450.0
    assert rows["nuts", "all"]["gates"] == "2/2 pass"
    assert "agreement" not in rows["bbb", 0] and rows["bbb", 0]["accuracy"] == 1.0
    assert ("map", 2) not in rows


TINY_NUTS = {"warmup": 4, "samples": 4, "max_tree_depth": 3}


def test_compare_with_the_nuts_reference_on_a_classification_set(tmp_path, monkeypatch,
                                                                  capsys):
    nuts = zoo.get("nuts")
    monkeypatch.setitem(zoo._REGISTRY, "nuts", replace(
        nuts, method=replace(nuts.method, **TINY_NUTS)))
    # A few draws cannot pass the gate, which test_reference_diagnostics checks; here a
    # gate that passes everything lets the distances through.
    # (four draws a chain give an R-hat far above one and an ESS that can be negative).
    monkeypatch.setattr(summary, "GATE", ConvergenceGate(r_hat=math.inf, ess=-math.inf,
                                                         chains=1))
    code = cli.main(["compare", "--data", "two_moons", "--entries", "map", "bbb",
                     "--reference", "nuts", "--steps", "5", "--num-samples", "8",
                     "--splits", "1", "--threads", "1", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    rows = {(r["entry"], r["split"]): r
            for r in json.loads((tmp_path / "reference.json").read_text())["summary"]}
    assert set(rows) == {(e, s) for e in ("nuts", "map", "bbb") for s in (0, "all")}
    for entry in ("map", "bbb"):
        assert 0.0 <= rows[entry, 0]["agreement"] <= 1.0
        assert 0.0 <= rows[entry, 0]["tv_to_ref"] <= 1.0
    assert rows["nuts", 0]["agreement"] == 1.0 and rows["nuts", 0]["tv_to_ref"] == 0.0
    assert all(math.isfinite(rows["nuts", 0][k]) for k in ("r_hat_pred_max", "ess_pred_min"))
    markdown = (tmp_path / "reference.md").read_text()
    assert "| agreement | tv_to_ref |" in markdown and "r_hat_pred_max" in markdown
    compare_md = (tmp_path / "compare.md").read_text()
    assert "agreement" in compare_md and "| mi |" in compare_md
