"""The NUTS reference beyond ``sine``: split R-hat and ESS over the predictive
(bnn_zoo.methods._nuts), the per-split distance tables (bnn_zoo._harness.summary) and the UCI
protocol in ``benchmarks/compare_guides.py`` (bnn_zoo._harness.compare)."""

from __future__ import annotations

import json
import math
import runpy
import sys
from dataclasses import replace
from pathlib import Path

import pyro
import pytest
import torch
from pyro import poutine
from pyro.ops.stats import split_gelman_rubin

from bnn_zoo import zoo
from bnn_zoo._core import data
from bnn_zoo._harness import compare, summary
from bnn_zoo._harness.summary import reference_rows
from bnn_zoo.methods._nuts import (
    ConvergenceGate,
    NUTSPosterior,
    PosteriorSamples,
    _average_ranks,
    _normal_scores,
    bulk_ess,
    r_hat_ess,
    rank_r_hat,
)
from bnn_zoo.models._mlp import BayesianMLP

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def white_noise(chains: int, draws: int, quantities: int = 1, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(chains, draws, quantities, generator=g, dtype=torch.float64)


def _rank_r_hat_of_shifted_normals(d: float) -> float:
    """The large-n rank-normalised split R-hat of two chains N(+d, 1) and N(-d, 1), by
    quadrature: the draws' normal scores are z(x) = Phi^-1(F(x)), F the pooled mixture's
    CDF; chain 1's scores have mean m and variance v, chain 2's -m and v (symmetry), so the
    four half-chain means are (m, m, -m, -m), B/n = 4 m^2 / 3 and R^2 = 1 + 4 m^2 / (3 v).
    The folded draws |x| have one distribution in both chains: their R-hat is 1."""
    x = torch.linspace(-12, 12, 200_001, dtype=torch.float64)
    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), 1.0)
    mixture = 0.5 * (normal.cdf(x - d) + normal.cdf(x + d))
    z = torch.special.ndtri(mixture.clamp(1e-300, 1 - 1e-16))
    density = normal.log_prob(x - d).exp() * (x[1] - x[0])
    m = (z * density).sum()
    v = (z.square() * density).sum() - m**2
    return math.sqrt(1 + 4 * m**2 / (3 * v))


def test_r_hat_of_identical_chains_is_one_and_of_shifted_chains_closed_form():
    # Two chains of 2n iid N(0, 1) draws; split R-hat cuts them into four halves of n.
    # Identical chains: within variance W ~ 1, between B/n ~ 1/n, so R = sqrt(((n-1)/n W +
    # B/n) / W) = 1 + O(1/n) (n = 2000: within 1e-3 of one, allow 1e-2).
    n = 2000
    draws = white_noise(1, 2 * n).expand(2, 2 * n, 1)
    r_hat, _ = r_hat_ess(draws)
    assert abs(r_hat - 1.0) < 1e-2
    # Chains shifted by +d and -d: R-hat of the normal scores, by quadrature. Monte Carlo
    # error: W has relative sd sqrt(2 / (4n)) = 1.6%, the half-chain means add ~3% to B/n;
    # 5% on R covers both with room.
    d = 1.0
    shift = torch.tensor([d, -d], dtype=torch.float64)[:, None, None]
    shifted = white_noise(2, 2 * n, seed=1) + shift
    r_hat, _ = r_hat_ess(shifted)
    assert r_hat == pytest.approx(_rank_r_hat_of_shifted_normals(d), rel=0.05)
    # the largest over quantities: a converged quantity beside a shifted one
    both = torch.cat([white_noise(2, 2 * n, seed=2), shifted], -1)
    assert r_hat_ess(both)[0] == pytest.approx(r_hat)


def test_rank_r_hat_sees_chains_that_differ_in_scale_only_through_the_folded_draws():
    # N(0, 1) and N(0, 3^2): the bulk's half-chain means all agree (R-hat of the normal
    # scores within 1% of one at n = 2000 draws a half), while the folded draws |x| differ
    # in location between the chains, which the rank-normalised R-hat reports.
    scale = torch.tensor([1.0, 3.0], dtype=torch.float64)[:, None, None]
    draws = white_noise(2, 4000, seed=6) * scale
    bulk = split_gelman_rubin(_normal_scores(draws), chain_dim=0, sample_dim=1)
    assert float(bulk) < 1.01
    assert float(rank_r_hat(draws)) > 1.1


def test_ess_of_white_noise_and_of_an_ar1_chain_match_their_closed_forms():
    # iid draws: ESS = C S. AR(1) x_t = rho x_{t-1} + e_t: rho_k = rho^k, so
    # ESS = C S / (1 + 2 sum_k rho^k) = C S (1 - rho) / (1 + rho). The estimate's relative
    # Monte Carlo error at C S = 8000 is a few percent; allow 15%.
    chains, draws, rho = 2, 4000, 0.5
    _, ess = r_hat_ess(white_noise(chains, draws))
    assert ess == pytest.approx(chains * draws, rel=0.15)
    e = white_noise(chains, draws, seed=3)
    x = torch.empty_like(e)
    x[:, 0] = e[:, 0] / math.sqrt(1 - rho**2)  # stationary start
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + e[:, t]
    _, ess = r_hat_ess(x)
    assert ess == pytest.approx(chains * draws * (1 - rho) / (1 + rho), rel=0.15)
    with pytest.raises(ValueError, match="chains, draws >= 4"):
        r_hat_ess(torch.zeros(2, 3, 1))


def test_bulk_ess_is_that_of_rank_normal_scores_so_unchanged_by_monotone_maps():
    # Bulk ESS sees the draws only through their ranks: exp (increasing) leaves it as it is,
    # while the ESS of the raw draws changes.
    from pyro.ops.stats import effective_sample_size

    x = white_noise(2, 301, quantities=3, seed=4).cumsum(1) * 0.1 + white_noise(2, 301, 3, 5)
    torch.testing.assert_close(bulk_ess(x.exp()), bulk_ess(x), rtol=1e-12, atol=0)
    raw = effective_sample_size(x, chain_dim=0, sample_dim=1)
    assert not torch.allclose(effective_sample_size(x.exp(), chain_dim=0, sample_dim=1), raw)


def test_average_ranks_match_scipy_with_ties():
    scipy_stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(6)
    x = torch.randint(0, 5, (40, 3), generator=g).double()  # many ties
    expected = torch.from_numpy(scipy_stats.rankdata(x.numpy(), axis=0, method="average"))
    torch.testing.assert_close(_average_ranks(x), expected)


def prior_draws(model, x: torch.Tensor, num: int, seed: int) -> dict[str, torch.Tensor]:
    """``num`` prior draws of every weight of ``model``, stacked."""
    pyro.set_rng_seed(seed)
    traces = [poutine.trace(model).get_trace(x) for _ in range(num)]
    names = [n for n in traces[0].nodes if n.startswith("layers.")]
    return {n: torch.stack([t.nodes[n]["value"].detach() for t in traces]) for n in names}


def outputs_by_hand(model, chain: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """f(x) under every draw of ``chain``, one conditioned model run per draw: (S, N)."""
    draws = next(iter(chain.values())).shape[0]
    return torch.stack([
        poutine.trace(poutine.condition(model, {k: v[s] for k, v in chain.items()}))
        .get_trace(x).nodes["f"]["value"][..., 0] for s in range(draws)])


def test_predictive_diagnostics_are_those_of_the_outputs_chain_by_chain():
    model = BayesianMLP(1, 1, (3,), noise_scale=0.5).double()
    x = torch.linspace(-2, 2, 7, dtype=torch.float64)[:, None]
    first = prior_draws(model, x, 40, seed=0)
    second = prior_draws(model, x, 40, seed=1)
    pooled = {k: torch.cat([first[k], second[k]]) for k in first}
    posterior = NUTSPosterior(model, PosteriorSamples(pooled), {}, chains=2)
    got = posterior.predictive_diagnostics(x)
    by_hand = torch.stack([outputs_by_hand(model, c, x) for c in (first, second)])
    r_hat, ess = r_hat_ess(by_hand)
    assert got == pytest.approx({"r_hat_pred_max": r_hat, "ess_pred_min": ess}, rel=1e-10)
    # the same draws in both chains agree (R-hat near one: 4 halves of 20 iid draws give
    # R^2 = 1 + O(1/20)); the second chain's output bias shifted by 10 prior sds does not:
    # chains whose draws never overlap have normal scores in the lower and upper half of
    # N(0, 1), means -+sqrt(2/pi) and variance 1 - 2/pi each, so R^2 -> 1 + 4 (2/pi) /
    # (3 (1 - 2/pi)) = 3.34, R = 1.83 (a rank-normalised R-hat is bounded)
    same = {k: torch.cat([first[k], first[k]]) for k in first}
    agreed = NUTSPosterior(model, PosteriorSamples(same), {}, chains=2).predictive_diagnostics(x)
    assert agreed["r_hat_pred_max"] < 1.2
    apart = {**same, "layers.1.bias": torch.cat([first["layers.1.bias"],
                                                 first["layers.1.bias"] + 10.0])}
    shifted = NUTSPosterior(model, PosteriorSamples(apart), {}, chains=2).predictive_diagnostics(x)
    assert shifted["r_hat_pred_max"] > 1.7
    with pytest.raises(ValueError, match="3 chains of equal length"):
        NUTSPosterior(model, PosteriorSamples(pooled), {}, chains=3)


TINY_NUTS = {"warmup": 4, "samples": 4, "max_tree_depth": 3}


def test_fitted_nuts_reports_predictive_diagnostics_at_the_test_inputs(tmp_path):
    d = data.load("sine")
    fitted = zoo.get("nuts").fit(d.x_train, d.y_train, steps=5, jit=False,
                                 method_options={**TINY_NUTS, "chains": 2})
    at_test = fitted.diagnostics_at(d.x_test)
    assert {"r_hat_pred_max", "ess_pred_min", "r_hat_max", "ess_f_min"} <= set(at_test)
    assert all(math.isfinite(at_test[k]) for k in ("r_hat_pred_max", "ess_pred_min"))
    assert "r_hat_pred_max" not in fitted.diagnostics  # computed at the inputs asked for
    fitted.save(tmp_path / "nuts.pt")  # the chains survive a save
    assert zoo.load(tmp_path / "nuts.pt").diagnostics_at(d.x_test) == pytest.approx(at_test)
    plain = zoo.get("map").fit(d.x_train, d.y_train, steps=5, jit=False)
    assert plain.diagnostics_at(d.x_test) == plain.diagnostics


def record(entry, split, ll, mean, std, **diagnostics):
    return {"entry": entry, "data": "uci/toy", "task": "regression", "split": split,
            "status": "ok", "metrics": {"ll": ll, "rmse": 1.0},
            "moments": {"mean": mean, "std": std}, "diagnostics": diagnostics}


def test_reference_rows_give_distances_split_by_split_and_the_worst_diagnostics():
    passing = {"r_hat_pred_max": 1.005, "ess_pred_min": 800.0, "chains": 4.0}
    records = [
        record("nuts", 0, -1.0, [0.0, 0.0], [1.0, 1.0], **passing),
        record("nuts", 1, -2.0, [0.0, 0.0], [1.0, 1.0], **{**passing, "ess_pred_min": 500.0}),
        record("nuts", 2, -2.0, [0.0, 0.0], [1.0, 1.0], r_hat_pred_max=1.20, ess_pred_min=50.0,
               chains=2.0),
        record("map", 0, -1.5, [3.0, 0.0], [1.0, 5.0]),  # W2: 3 and 4, mean 3.5
        record("map", 1, -1.0, [0.0, 0.0], [2.0, 1.0]),  # W2: 1 and 0, mean 0.5
        record("map", 2, -1.0, [9.0, 9.0], [2.0, 1.0]),  # against a failing split: none
        {"entry": "map", "data": "uci/toy", "task": "regression", "split": 3,
         "status": "failed", "reason": "boom"},
    ]
    rows = reference_rows(records, "nuts")
    assert [(r["entry"], r["split"]) for r in rows] == [
        ("nuts", 0), ("nuts", 1), ("nuts", 2), ("nuts", "all"),
        ("map", 0), ("map", 1), ("map", 2), ("map", "all")]
    nuts_2, nuts_all, map0, map1, map2, map_all = rows[2:]
    assert map0["w2_to_ref"] == pytest.approx(3.5) and map0["ll_gap"] == pytest.approx(-0.5)
    assert map1["w2_to_ref"] == pytest.approx(0.5) and map1["ll_gap"] == pytest.approx(1.0)
    assert "w2_to_ref" not in map2 and "ll_gap" not in map2
    assert map_all["w2_to_ref"] == pytest.approx(2.0)
    assert map_all["w2_to_ref_se"] == pytest.approx(1.5)  # sd 3/sqrt(2) over sqrt(2) runs
    assert map_all["runs"] == 3 and "r_hat_pred_max" not in map_all
    assert nuts_all["r_hat_pred_max"] == 1.20 and nuts_all["ess_pred_min"] == 50.0
    assert "r_hat_pred_max_se" not in nuts_all and nuts_all["w2_to_ref"] == 0.0
    assert rows[0]["gates"] == rows[1]["gates"] == "pass"
    assert nuts_2["gates"] == "chains 2 < 4; R-hat 1.2000 > 1.01; ESS 50 < 400"
    assert nuts_all["gates"] == "2/3 pass" and "gates" not in map_all


def test_a_reference_without_chains_is_not_gated():
    # A point estimate as the reference (no chain diagnostics): every split is measured.
    records = [record("map", 0, -1.0, [0.0], [1.0]), record("bbb", 0, -1.2, [3.0], [1.0])]
    rows = {(r["entry"], r["split"]): r for r in reference_rows(records, "map")}
    assert rows["bbb", 0]["w2_to_ref"] == pytest.approx(3.0)
    assert "gates" not in rows["map", 0]


def test_the_gate_names_each_failure_and_passes_converged_chains():
    gate = ConvergenceGate()
    assert gate.failures({"chains": 8.0, "r_hat_pred_max": 1.01, "ess_pred_min": 400.0}) == []
    assert gate.failures({"chains": 8.0, "r_hat_pred_max": math.nan,
                          "ess_pred_min": 400.0}) == ["R-hat nan > 1.01"]
    assert gate.failures({}) == ["chains unknown", "R-hat unknown", "ESS unknown"]


def test_uci_sets_get_the_uci_protocol_and_other_sets_keep_their_overrides():
    on_yacht = compare.data_overrides("uci/yacht", {"steps": 5}, None)
    assert on_yacht("map") == {"steps": 5, "validation": compare.UCI_VALIDATION}
    assert on_yacht("nuts") == on_yacht("laplace") == {"steps": 5}  # no single tunable noise
    assert compare.data_overrides("uci/yacht", {}, 0.0)("map") == {}
    on_protein = compare.data_overrides("uci/protein-tertiary-structure", {}, None)
    assert on_protein("map")["model_options"] == {"hidden": (100,)}
    assert on_protein("nngp")["model_options"] == {"hidden": (100,)}  # takes **options
    # rff_logitnormal has no hidden layers (its model refuses "hidden"): its own model.
    assert "model_options" not in on_protein("rff_logitnormal")
    assert compare.data_overrides("sine", {"steps": 5}, None)("map") == {"steps": 5}
    assert compare.data_overrides("sine", {}, 0.2)("bbb") == {"validation": 0.2}
    weight = poutine.trace(zoo.get("map").model(3, 1)).get_trace(torch.zeros(2, 3))
    assert weight.nodes["layers.0.weight"]["value"].shape == (3, 50)  # the protocol's 50 units


def test_compare_guides_on_uci_writes_the_reference_tables(uci_data, tmp_path, monkeypatch,
                                                           capsys):
    # The command of the README on one yacht split with a tiny budget and a tiny HMC, whose
    # few draws cannot pass the convergence gate: a gate that passes everything lets the
    # distances through (four draws a chain can give a negative ESS).
    hmc = zoo.get("hmc")
    monkeypatch.setitem(zoo._REGISTRY, "hmc", replace(
        hmc, method=replace(hmc.method, warmup=4, samples=4, chains=2, map_iterations=5)))
    monkeypatch.setattr(summary, "GATE", ConvergenceGate(r_hat=math.inf, ess=-math.inf,
                                                         chains=1))
    monkeypatch.setattr(sys, "argv", [
        "compare_guides.py", "--data", "uci/yacht", "--splits", "1", "--entries", "map",
        "ensemble", "--steps", "5", "--num-samples", "5", "--threads", "1",
        "--out", str(tmp_path)])
    runpy.run_path(str(BENCHMARKS / "compare_guides.py"), run_name="__main__")
    assert "[failed]" not in capsys.readouterr().out
    document = json.loads((tmp_path / "reference.json").read_text())
    rows = {(r["entry"], r["split"]): r for r in document["summary"]}
    assert set(rows) == {(e, s) for e in ("hmc", "map", "ensemble") for s in (0, "all")}
    assert {"r_hat_pred_max", "ess_pred_min", "r_hat_max", "ess_min"} <= set(rows["hmc", 0])
    assert rows["hmc", 0]["gates"] == "pass" and rows["hmc", "all"]["gates"] == "1/1 pass"
    assert all(math.isfinite(rows[e, 0][k]) for e in ("map", "ensemble")
               for k in ("w2_to_ref", "ll_gap"))
    assert "r_hat_pred_max" in (tmp_path / "reference.md").read_text()
    runs = json.loads((tmp_path / "compare.json").read_text())["runs"]
    settings = {r["entry"]: r["settings"]["overrides"] for r in runs}
    assert settings["map"]["validation"] == settings["ensemble"]["validation"] == 0.1
    assert "validation" not in settings["hmc"]


def test_nuts_starts_from_its_own_map_fit_whatever_the_global_param_store_holds():
    # Another fit's values under the MAP guide's parameter names in Pyro's global store (as
    # a comparison of several data sets leaves them) must neither leak into the start nor
    # break it: the chains are those of a fit from an empty store.
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(30, 2, generator=g), torch.randn(30, generator=g)
    options = {"steps": 3, "jit": False, "method_options": {**TINY_NUTS, "max_tree_depth": 2}}
    clean = zoo.get("nuts").fit(x, y, **options)
    pyro.clear_param_store()
    pyro.param("AutoDelta.layers.0.weight", torch.zeros(2, 50))
    pyro.param("AutoDelta.layers.1.bias", torch.full((1,), 5.0))
    stale = zoo.get("nuts").fit(x, y, **options)
    for name, value in clean.posterior.samples.samples.items():
        torch.testing.assert_close(stale.posterior.samples.samples[name], value, msg=name)
    assert stale.diagnostics["noise_scale"] == clean.diagnostics["noise_scale"]
