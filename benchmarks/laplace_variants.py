"""Laplace variants (Bishop 2006, section 5.7) against each other, with and without evidence tuning.

For every data set, split and curvature variant (``laplace_full``, ``laplace_ggn``,
``laplace_diag``, ``laplace_kron``, ``laplace_last_layer``) the entry is fitted twice
through the zoo, once with ``alpha`` from the prior and ``beta`` from the MAP's
learned noise and once tuned by MacKay's evidence fixed point
(``evidence="fixed_point"``; the ``laplace`` entry is ``laplace_ggn`` tuned), and
evaluated on the test split with the GLM predictive: test log-likelihood per point,
RMSE, 90% coverage and fit time (mean and standard error over splits). A figure shows
the predictive bands of every tuned variant on the first 1-D data set.

    python benchmarks/laplace_variants.py --out results/laplace
    BNN_ZOO_DATA=../shared/data/uci python benchmarks/laplace_variants.py   # adds uci/concrete

Fits go through :func:`bnn_zoo._harness.compare.run_comparison` (the evidence setting as
``method_options``), which caches them under ``--out/runs``. Writes ``laplace.md``,
``.csv``, ``.json`` (with the fitted ``alpha`` and ``beta`` where the posterior reports
them in its diagnostics) and ``laplace_bands.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from bnn_zoo._harness import compare, flags
from bnn_zoo._harness.figures import predictive_bands, save_figure
from bnn_zoo._harness.summary import aggregate
from bnn_zoo._harness.tables import write_tables

VARIANTS = ("laplace_full", "laplace_ggn", "laplace_diag", "laplace_kron", "laplace_last_layer")
#: ``None``: alpha from the prior, beta from the MAP's noise; else the evidence tuning.
EVIDENCE = (None, "fixed_point")
METRICS = ("ll", "rmse", "coverage_90", "fit_seconds")
TUNED = "fixed_point"


def default_datasets() -> list[str]:
    return ["gap", "sine"] + (["uci/concrete"] if os.environ.get("BNN_ZOO_DATA") else [])


def run(args: argparse.Namespace) -> dict[str, list[dict]]:
    """The run records of every variant on every split, per evidence setting."""
    return {evidence or "none": compare.run_comparison(
        args.data, args.variants, splits=args.splits, seed=args.seed, out=args.out,
        device=args.device, num_samples=args.num_samples,
        overrides={**flags.budget_overrides(args), "method_options": {"evidence": evidence}})
        for evidence in EVIDENCE}


def rows_of(records: dict[str, list[dict]]) -> list[dict]:
    """One row per run: data, variant, evidence, the metrics and the diagnostics."""
    rows = []
    for evidence, runs in records.items():
        for r in runs:
            row = {"data": r["data"], "variant": r["entry"], "evidence": evidence}
            if r["status"] == "ok":
                rows.append({**row, **{m: r["metrics"][m] for m in METRICS},
                             **r["diagnostics"]})
            else:
                rows.append({**row, "reason": f"{r['status']}: {r['reason']}"})
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_data_flag(parser, default_datasets())
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    flags.add_fit_flags(parser)
    flags.add_shared_flags(parser, out="results/laplace", threads=1, splits=3)
    args = flags.parse(parser, argv)
    records = run(args)
    rows = rows_of(records)
    summary = aggregate(rows, ("data", "variant", "evidence"))
    diagnostics = dict.fromkeys(k for r in rows for k in r
                                if k not in {"data", "variant", "evidence", "reason", *METRICS})
    print(write_tables(args.out, "laplace", summary, keys=("data", "variant", "evidence"),
                       columns=[*METRICS, *diagnostics], notes=lambda row: row.get("reason", ""),
                       runs=rows))
    banded = [r for r in records[TUNED] if r["status"] == "ok" and "band" in r]
    if banded:
        first = (banded[0]["data"], banded[0]["split"])
        shown = [r for r in banded if (r["data"], r["split"]) == first]
        save_figure(predictive_bands(shown, *first), args.out / "laplace_bands.png", dpi=120)
    return summary


if __name__ == "__main__":
    main()
