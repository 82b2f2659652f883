"""Summaries over repeated runs: mean and standard error, and distances to a reference.

Over ``n`` runs of a metric with values ``v_1..v_n`` a summary row holds the mean
``m = 1/n sum_i v_i`` and its standard error ``se = sqrt(s^2 / n)`` with the sample
variance ``s^2 = 1/(n-1) sum_i (v_i - m)^2`` (``nan`` for one run), and the number
of runs ``n``.

Distance to a reference predictive (the ``nuts`` entry by default, when it was run):
at every test input the two predictives are moment-matched by Gaussians
``N(m_1, s_1^2)`` and ``N(m_2, s_2^2)``, whose 2-Wasserstein distance is

    W_2 = sqrt((m_1 - m_2)^2 + (s_1 - s_2)^2)       (Dowson & Landau 1982),

averaged over the test points (``w2_to_ref``, in the units of ``y``), together with
the gap of test log-likelihoods ``ll - ll_ref`` (``ll_gap``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["REFERENCE", "RUNS", "aggregate", "gaussian_w2", "mean_se", "reference_distances",
           "summarise"]

#: The entry whose predictive the others are measured against, when it was run.
REFERENCE = "nuts"
#: The column that counts the runs behind a summary row.
RUNS = "runs"


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


def aggregate(rows: Sequence[dict], keys: Sequence[str], *,
              ignore: Sequence[str] = ()) -> list[dict]:
    """One summary row per distinct value of ``keys`` (in order of first appearance),
    the fields in ``ignore`` (such as ``split``) left out.

    Every other numeric field becomes its mean and ``<field>_se`` over the group's rows
    that have it; a text field keeps its distinct values joined by ``"; "``; ``runs``
    counts the rows of the group that have no ``reason`` (the runs that finished; a row
    with a ``reason`` says why a run was skipped or failed).
    """
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        missing = [k for k in keys if k not in row]
        if missing:
            raise ValueError(f"Expected every row to have the keys {list(keys)}, but a row "
                             f"lacks {missing}.")
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    summary = []
    for key, group in groups.items():
        out: dict = dict(zip(keys, key))
        out[RUNS] = sum("reason" not in row for row in group)
        fields = dict.fromkeys(f for row in group for f in row
                               if f not in keys and f not in ignore)
        for field in fields:
            values = [row[field] for row in group if row.get(field) is not None]
            if values and all(_is_number(v) for v in values):
                out[field], out[f"{field}_se"] = mean_se([float(v) for v in values])
            elif values:
                out[field] = "; ".join(dict.fromkeys(str(v) for v in values))
        summary.append(out)
    return summary


def gaussian_w2(mean_a: Tensor, std_a: Tensor, mean_b: Tensor, std_b: Tensor) -> Tensor:
    """Pointwise 2-Wasserstein distance between ``N(mean_a, std_a^2)`` and
    ``N(mean_b, std_b^2)``: ``sqrt((m_a - m_b)^2 + (s_a - s_b)^2)``."""
    return ((mean_a - mean_b) ** 2 + (std_a - std_b) ** 2).sqrt()


def reference_distances(records: Sequence[dict], reference: str) -> None:
    """Add ``w2_to_ref`` and ``ll_gap`` to the metrics of every regression record (as from
    :func:`bnn_zoo.harness.runs.run_one`) whose (data, split) has an ``ok`` record of
    ``reference``."""
    refs = {(r["data"], r["split"]): r for r in records
            if r["entry"] == reference and r["status"] == "ok" and "moments" in r}
    for r in records:
        ref = refs.get((r["data"], r["split"]))
        if ref is None or r["status"] != "ok" or "moments" not in r:
            continue
        m = {k: torch.tensor(v, dtype=torch.float64) for k, v in r["moments"].items()}
        mr = {k: torch.tensor(v, dtype=torch.float64) for k, v in ref["moments"].items()}
        r["metrics"]["w2_to_ref"] = float(gaussian_w2(m["mean"], m["std"], mr["mean"],
                                                      mr["std"]).mean())
        r["metrics"]["ll_gap"] = r["metrics"]["ll"] - ref["metrics"]["ll"]


def summarise(records: Sequence[dict], *, reference: str | None = None) -> list[dict]:
    """One row per (data, entry) of run records: each metric's mean and standard error
    over the ``ok`` runs, their number ``runs``, the diagnostics' means (``diag_<name>``)
    and, in ``reason``, why the other runs were skipped or failed."""
    if reference is not None:
        reference_distances(records, reference)
    rows = []
    for r in records:
        row = {"data": r["data"], "entry": r["entry"], "task": r["task"]}
        if r["status"] == "ok":
            rows.append({**row, **r["metrics"],
                         **{f"diag_{k}": v for k, v in r.get("diagnostics", {}).items()}})
        else:
            rows.append({**row, "reason": f"{r['status']}: {r['reason']}"})
    summary = aggregate(rows, ("data", "entry", "task"))
    for row in summary:
        for key in [k for k in row if k.startswith("diag_") and k.endswith("_se")]:
            del row[key]
    return summary
