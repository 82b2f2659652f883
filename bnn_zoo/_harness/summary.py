"""Summaries over repeated runs: mean and standard error, and distances to a reference.

Over ``n`` runs of a metric with values ``v_1..v_n`` a summary row holds the mean
``m = 1/n sum_i v_i`` and its standard error ``se = sqrt(s^2 / n)`` with the sample
variance ``s^2 = 1/(n-1) sum_i (v_i - m)^2`` (``nan`` for one run), and the number
of runs ``n``.

The rows are grouped with pandas; the sums are exactly rounded (``math.fsum``), so a summary
does not depend on the order of its runs and a metric equal over its runs has a standard
error of exactly 0 (pandas' own ``mean`` and ``sem`` round otherwise: ``1e-16`` for fit
seconds shared by the splits of one batch).

Distance to a reference predictive (the ``hmc`` entry by default, when it was run) on the
same split. Regression: at every test input the two predictives are moment-matched by
Gaussians ``N(m_1, s_1^2)`` and ``N(m_2, s_2^2)``, whose 2-Wasserstein distance is

    W_2 = sqrt((m_1 - m_2)^2 + (s_1 - s_2)^2)       (Dowson & Landau 1982),

averaged over the test points (``w2_to_ref``, in the units of ``y``), together with
the gap of test log-likelihoods ``ll - ll_ref`` (``ll_gap``). Classification, with the
averaged class probabilities ``p_n`` and ``q_n`` (the reference's) at test point ``n``: the
agreement of the predicted classes ``1/N sum_n [argmax_k p_nk = argmax_k q_nk]``
(``agreement``) and the total variation ``1/N sum_n 1/2 sum_k |p_nk - q_nk|`` (``tv_to_ref``),
the measures of Izmailov et al. 2021, "What Are Bayesian Neural Network Posteriors Really
Like?". `reference_rows` lays them out split by split, beside the reference's
convergence diagnostics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch
from torch import Tensor

from bnn_zoo._core.checks import check_tensor
from bnn_zoo._harness.provenance import run_columns
from bnn_zoo.methods._nuts import ConvergenceGate

__all__ = ["GATE", "REFERENCE", "REFERENCE_COLUMNS", "REFERENCE_DIAGNOSTICS", "RUNS", "SAMPLED",
           "aggregate", "class_agreement", "gaussian_w2", "mean_se", "quantile_w1",
           "reference_distances", "reference_rows", "summarise", "total_variation"]

#: The entry whose predictive the others are measured against, when it was run.
REFERENCE = "hmc"
#: The gate every sampled reference split must pass for distances to be measured to it.
GATE = ConvergenceGate()
#: The diagnostics that mark a record as a sampler's (chains whose convergence is gated).
SAMPLED = frozenset({"chains", "r_hat_pred_max"})
#: The column that counts the runs behind a summary row.
RUNS = "runs"
#: The reference's convergence diagnostics that `reference_rows` shows, each with how
#: it combines over splits (the worst: the largest R-hat, the smallest effective sample size,
#: the most divergences): over the predictive at the test inputs (``_pred``), over the network
#: output at training inputs (``_f``) and over the weights (see [`bnn_zoo.methods._nuts`][]).
REFERENCE_DIAGNOSTICS = {"r_hat_pred_max": max, "ess_pred_min": min, "r_hat_f_max": max,
                         "ess_f_min": min, "r_hat_max": max, "ess_min": min, "divergences": max}
#: The metrics of `reference_rows` (regression's, then classification's), then the
#: diagnostics.
REFERENCE_COLUMNS = ("ll", "rmse", "w1_to_ref", "w2_to_ref", "ll_gap", "accuracy", "nll",
                     "agreement", "tv_to_ref", *REFERENCE_DIAGNOSTICS, "gates")


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (``nan`` for a single value)."""
    if not values:
        raise ValueError("Expected at least one value to summarise, got none.")
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.nan
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _combine(field: str, values: pd.Series) -> dict:
    """One field of a summary row from its values over a group's rows (``None``: none):
    the mean and ``<field>_se`` ([`mean_se`][bnn_zoo._harness.summary.mean_se]) of numbers,
    else the distinct values as text joined by ``"; "``."""
    present = [v for v in values if v is not None]
    if present and all(_is_number(v) for v in present):
        mean, se = mean_se([float(v) for v in present])
        return {field: mean, f"{field}_se": se}
    return {field: "; ".join(dict.fromkeys(map(str, present)))} if present else {}


def aggregate(rows: Sequence[dict], keys: Sequence[str], *,
              ignore: Sequence[str] = ()) -> list[dict]:
    """One summary row per distinct value of ``keys`` (in order of first appearance),
    the fields in ``ignore`` (such as ``split``) left out.

    Every other numeric field becomes its mean and ``<field>_se`` over the group's rows
    that have it; a text field keeps its distinct values joined by ``"; "``; ``runs``
    counts the rows of the group that have no ``reason`` (the runs that finished; a row
    with a ``reason`` says why a run was skipped or failed).
    """
    for row in rows:
        if missing := [k for k in keys if k not in row]:
            raise ValueError(f"Expected every row to have the keys {list(keys)}, but a row "
                             f"lacks {missing}.")
    group = [tuple(row[k] for k in keys) for row in rows]
    finished = pd.DataFrame({"group": group, "finished": ["reason" not in r for r in rows]},
                            dtype=object).groupby("group", sort=False)["finished"]
    summary = {key: {**dict(zip(keys, key)), RUNS: int(n.sum())} for key, n in finished}
    cells = pd.DataFrame([(key, field, value) for key, row in zip(group, rows)
                          for field, value in row.items()
                          if field not in keys and field not in ignore],
                         columns=["group", "field", "value"], dtype=object)
    for (key, field), values in cells.groupby(["group", "field"], sort=False)["value"]:
        summary[key].update(_combine(field, values))
    return list(summary.values())


def gaussian_w2(mean_a: Tensor, std_a: Tensor, mean_b: Tensor, std_b: Tensor) -> Tensor:
    """Pointwise 2-Wasserstein distance between ``N(mean_a, std_a^2)`` and
    ``N(mean_b, std_b^2)``: ``sqrt((m_a - m_b)^2 + (s_a - s_b)^2)``."""
    return ((mean_a - mean_b) ** 2 + (std_a - std_b) ** 2).sqrt()


def quantile_w1(quantiles_a: Tensor, quantiles_b: Tensor) -> Tensor:
    """Pointwise Wasserstein-1 distance between two predictives from their quantiles
    ``Q(u_k)`` at the levels ``u_k = (k - 1/2) / K`` (K, N): the midpoint rule of
    ``W1 = int_0^1 |Q_a(u) - Q_b(u)| du``, ``1/K sum_k |Q_a(u_k) - Q_b(u_k)|`` (N,). It is the
    distance between the K-point distributions at the quantiles, which
    ``scipy.stats.wasserstein_distance`` gives for them, and the distance of the
    competition of Wilson, Izmailov, Hoffman, Gal et al. (NeurIPS 2021) between predictive
    samples as K grows."""
    if quantiles_a.shape != quantiles_b.shape or quantiles_a.dim() != 2:
        raise ValueError(f"Expected quantiles_a and quantiles_b of one shape (levels, points), "
                         f"but got {tuple(quantiles_a.shape)} and {tuple(quantiles_b.shape)}.")
    return (quantiles_a - quantiles_b).abs().mean(0)


def _check_probs(probs_a: Tensor, probs_b: Tensor) -> None:
    for name, probs in (("probs_a", probs_a), ("probs_b", probs_b)):
        check_tensor(name, probs, ndim=2, floating=True)
    if probs_a.shape != probs_b.shape:
        raise ValueError(f"Expected probs_a and probs_b of the same shape (points, classes), "
                         f"but got {tuple(probs_a.shape)} and {tuple(probs_b.shape)}.")


def class_agreement(probs_a: Tensor, probs_b: Tensor) -> Tensor:
    """Pointwise agreement of the predicted classes of two predictives, ``[argmax_k a_nk =
    argmax_k b_nk]`` (1.0 or 0.0), from their class probabilities ``probs_a`` and
    ``probs_b`` (N, C); a tie goes to the first of the tied classes, as in ``argmax``."""
    _check_probs(probs_a, probs_b)
    return (probs_a.argmax(-1) == probs_b.argmax(-1)).to(probs_a.dtype)


def total_variation(probs_a: Tensor, probs_b: Tensor) -> Tensor:
    """Pointwise total variation distance between two categorical predictives,
    ``1/2 sum_k |a_nk - b_nk|`` (0: the same distribution, 1: disjoint supports), from their
    class probabilities ``probs_a`` and ``probs_b`` (N, C)."""
    _check_probs(probs_a, probs_b)
    return 0.5 * (probs_a - probs_b).abs().sum(-1)


def _distances(record: dict, ref: dict) -> dict[str, float]:
    """The distances of ``record``'s predictive to ``ref``'s, from what both records keep:
    the moments and, where both kept them, the quantiles (regression) or the averaged class
    probabilities (classification)."""
    def read(r: dict, key: str) -> dict[str, Tensor]:
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in r[key].items()}

    if "moments" in record and "moments" in ref:
        m, mr = read(record, "moments"), read(ref, "moments")
        distances = {"w2_to_ref": float(gaussian_w2(m["mean"], m["std"], mr["mean"],
                                                    mr["std"]).mean()),
                     "ll_gap": record["metrics"]["ll"] - ref["metrics"]["ll"]}
        if "quantiles" in record and "quantiles" in ref:
            q, qr = (torch.tensor(r["quantiles"], dtype=torch.float64) for r in (record, ref))
            distances["w1_to_ref"] = float(quantile_w1(q, qr).mean())
        return distances
    if "class_probs" in record and "class_probs" in ref:
        p, q = (torch.tensor(r["class_probs"], dtype=torch.float64) for r in (record, ref))
        if not (p.isfinite().all() and q.isfinite().all()):  # a broken predictive's
            return {"agreement": math.nan, "tv_to_ref": math.nan}
        return {"agreement": float(class_agreement(p, q).mean()),
                "tv_to_ref": float(total_variation(p, q).mean())}
    return {}


def reference_distances(records: Sequence[dict], reference: str) -> None:
    """Add the distances to ``reference`` on the same (data, split) to the metrics of every
    ``ok`` record (as from `bnn_zoo._harness.runs.run_one`): ``w2_to_ref`` and
    ``ll_gap`` where both records keep their predictive's moments (regression), and
    ``w1_to_ref`` (`quantile_w1`) where both keep its quantiles,
    ``agreement`` and ``tv_to_ref`` where both keep their class probabilities
    (classification); a record restored without them gets none. A sampler's reference split
    (one with chain diagnostics, `SAMPLED`) that fails `GATE` is measured against by nobody:
    its record gets ``gate_failures``, the reasons, and its diagnostics ``converged`` 0 (1
    where it passes). A reference without chains (a point estimate, a variational fit) is
    not gated."""
    refs = {}
    for r in records:
        if r["entry"] == reference and r["status"] == "ok":
            diagnostics = r.setdefault("diagnostics", {})
            if SAMPLED.intersection(diagnostics):
                r["gate_failures"] = GATE.failures(diagnostics)
                diagnostics["converged"] = float(not r["gate_failures"])
            if not r.get("gate_failures"):
                refs[(r["data"], r["split"])] = r
    for r in records:
        ref = refs.get((r["data"], r["split"]))
        if ref is not None and r["status"] == "ok":
            r["metrics"].update(_distances(r, ref))


def summarise(records: Sequence[dict], *, reference: str | None = None) -> list[dict]:
    """One row per (data, entry) of run records: each metric's mean and standard error
    over the ``ok`` runs, their number ``runs``, the diagnostics' means (``diag_<name>``),
    the code versions and commits of the ``ok`` runs (``code``, ``commit``:
    `run_columns`, distinct values joined by ``"; "``)
    and, in ``reason``, why the other runs were skipped or failed."""
    if reference is not None:
        reference_distances(records, reference)
    rows = []
    for r in records:
        row = {"data": r["data"], "entry": r["entry"], "task": r["task"]}
        if r["status"] == "ok":
            rows.append({**row, **r["metrics"],
                         **{f"diag_{k}": v for k, v in r.get("diagnostics", {}).items()},
                         **run_columns(r)})
        else:
            rows.append({**row, "reason": f"{r['status']}: {r['reason']}"})
    summary = aggregate(rows, ("data", "entry", "task"))
    for row in summary:
        for key in [k for k in row if k.startswith("diag_") and k.endswith("_se")]:
            del row[key]
    return summary


def reference_rows(records: Sequence[dict], reference: str) -> list[dict]:
    """The distances of every entry to ``reference`` split by split: per (data,
    entry) one row per finished split (``split`` its index) with the metrics of
    `REFERENCE_COLUMNS` and the reference's diagnostics of
    `REFERENCE_DIAGNOSTICS`, then a row ``split="all"`` with the metrics' mean and
    standard error over those splits and each diagnostic's worst value over them. The
    reference's rows say in ``gates`` whether the split passes `GATE` (``pass``, or why
    not: no distances are measured to it), and over all splits how many pass."""
    reference_distances(records, reference)
    metrics = [c for c in REFERENCE_COLUMNS if c not in REFERENCE_DIAGNOSTICS and c != "gates"]
    per_split = [{"data": r["data"], "entry": r["entry"], "split": r["split"],
                  **{k: r["metrics"][k] for k in metrics if k in r["metrics"]},
                  **{k: r["diagnostics"][k] for k in REFERENCE_DIAGNOSTICS
                     if k in r.get("diagnostics", {})},
                  **({"gates": "; ".join(r["gate_failures"]) or "pass"}
                     if "gate_failures" in r else {})}
                 for r in records if r["status"] == "ok"]
    rows = []
    for over in aggregate(per_split, ("data", "entry"), ignore=("split", "gates")):
        group = [row for row in per_split
                 if (row["data"], row["entry"]) == (over["data"], over["entry"])]
        for name, worst in REFERENCE_DIAGNOSTICS.items():
            over.pop(f"{name}_se", None)
            if name in over:
                over[name] = worst(row[name] for row in group if name in row)
        gated = [row["gates"] for row in group if "gates" in row]
        if gated:
            over["gates"] = f"{gated.count('pass')}/{len(gated)} pass"
        rows += [*group, {**over, "split": "all"}]
    return rows
