"""Compare zoo entries on data sets: fit, evaluate, tabulate and plot.

:func:`run_comparison` fits every chosen entry on every chosen split through the
zoo's contract (``entry.fit``, ``Fitted.evaluate``, ``Fitted.predict``) and
returns one record per (entry, data set, split). Each finished record is cached
as JSON under ``out/runs/``, so a rerun after a crash (or with more entries or
splits) skips what is done. :func:`write_tables` turns the records into a
Markdown table, a CSV and a JSON of mean +/- standard error over splits;
:func:`write_figures` draws the predictive bands of every entry side by side
(1-D regression), reliability diagrams (classification) and ELBO curves.

Distance to a reference (the ``nuts`` entry by default, when it was run): at
every test input the two predictives are moment-matched by Gaussians
``N(m_1, s_1^2)`` and ``N(m_2, s_2^2)``, whose 2-Wasserstein distance is

    W_2 = sqrt((m_1 - m_2)^2 + (s_1 - s_2)^2)       (Dowson & Landau 1982),

averaged over the test points (``w2_to_ref``, in the units of ``y``), together
with the gap of test log-likelihoods ``ll - ll_ref`` (``ll_gap``).

The command line (``python -m bnn_zoo compare``) and ``benchmarks/compare_guides.py``
share :func:`add_arguments` and :func:`main_from_args`.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pyro
import torch
from torch import Tensor

from bnn_zoo import zoo
from bnn_zoo.core import data as data_module
from bnn_zoo.core.checks import check_positive_int
from bnn_zoo.core.predictive import GaussianMixturePredictive
from bnn_zoo.evaluation.metrics import reliability_bins
from bnn_zoo.zoo import UnsupportedProblem

__all__ = ["REFERENCE", "add_arguments", "default_entries", "gaussian_w2", "main_from_args",
           "run_comparison", "summarise", "write_figures", "write_tables"]

REFERENCE = "nuts"
GRID_POINTS = 200
CURVE_POINTS = 200
BAND_MASS = 0.95
TABLE_COLUMNS = {
    "regression": ("rmse", "ll", "coverage_90", "w2_to_ref", "ll_gap", "fit_seconds",
                   "steps_per_second"),
    "classification": ("accuracy", "nll", "ece", "brier", "fit_seconds", "steps_per_second"),
}
LOWER_IS_BETTER = {"rmse", "nll", "ece", "brier", "w2_to_ref", "fit_seconds"}


def default_entries(task: str, *, reference: str | None = REFERENCE) -> list[str]:
    """Every registered entry supporting ``task``, the (slow) reference excluded."""
    return [n for n in zoo.names(task) if n != reference]


def gaussian_w2(mean_a: Tensor, std_a: Tensor, mean_b: Tensor, std_b: Tensor) -> Tensor:
    """Pointwise 2-Wasserstein distance between ``N(mean_a, std_a^2)`` and
    ``N(mean_b, std_b^2)``: ``sqrt((m_a - m_b)^2 + (s_a - s_b)^2)``."""
    return ((mean_a - mean_b) ** 2 + (std_a - std_b) ** 2).sqrt()


def _run_path(out: Path, entry: str, data: str, split: int, seed: int, overrides: dict) -> Path:
    tag = ""
    if overrides:
        digest = hashlib.sha1(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:8]
        tag = f"_{digest}"
    return out / "runs" / entry / f"{data.replace('/', '_')}_split{split}_seed{seed}{tag}.json"


def _thin(values: Sequence[float], points: int = CURVE_POINTS) -> list[float]:
    """Chunk means of ``values``: at most ``points`` of them (a smoothed curve)."""
    if len(values) <= points:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    chunks = torch.tensor_split(t, points)
    return [float(c.mean()) for c in chunks]


def _grid(dataset: data_module.Dataset) -> Tensor:
    x = torch.cat([dataset.x_train, dataset.x_test])
    lo, hi = float(x.min()), float(x.max())
    pad = 0.1 * (hi - lo)
    return torch.linspace(lo - pad, hi + pad, GRID_POINTS, dtype=x.dtype,
                          device=x.device).unsqueeze(-1)


def _tolist(t: Tensor) -> list:
    return t.detach().to("cpu", torch.float64).tolist()


def run_one(entry: str, dataset: data_module.Dataset, *, split: int, seed: int,
            overrides: dict | None = None, num_samples: int = 200) -> dict:
    """Fit ``entry`` on ``dataset`` and return its record (metrics and what the figures need).

    An entry that raises :class:`~bnn_zoo.zoo.UnsupportedProblem` gives a record with
    ``status="skipped"`` and the reason; any other error ``status="failed"``.
    """
    record = {"entry": entry, "data": dataset.name, "task": dataset.task, "split": split,
              "seed": seed, "overrides": overrides or {}}
    started = time.perf_counter()
    try:
        fitted = zoo.get(entry).fit(dataset.x_train, dataset.y_train, task=dataset.task,
                                    seed=seed, progress=False, **(overrides or {}))
    except UnsupportedProblem as error:
        return {**record, "status": "skipped", "reason": str(error)}
    except Exception as error:  # a benchmark reports a broken entry and goes on
        return {**record, "status": "failed", "reason": f"{type(error).__name__}: {error}"}
    pyro.set_rng_seed(seed)
    record["metrics"] = fitted.evaluate(dataset.x_test, dataset.y_test, num_samples)
    record["diagnostics"] = dict(fitted.diagnostics)
    record["losses"] = _thin(fitted.result.losses) if fitted.result is not None else []
    pred = fitted.predict(dataset.x_test, num_samples)
    if isinstance(pred, GaussianMixturePredictive):
        record["moments"] = {"mean": _tolist(pred.mean), "std": _tolist(pred.stddev)}
        if dataset.in_dim == 1:
            grid = _grid(dataset)
            band = fitted.predict(grid, num_samples)
            lo, hi = band.interval(BAND_MASS)
            record["band"] = {"x": _tolist(grid[:, 0]), "mean": _tolist(band.mean),
                              "lo": _tolist(lo), "hi": _tolist(hi)}
    else:
        bins = reliability_bins(pred.mean, dataset.y_test)
        record["reliability"] = {k: _tolist(v) for k, v in bins.items()}
    record["seconds"] = time.perf_counter() - started
    return {**record, "status": "ok"}


def run_comparison(data: Iterable[str], entries: Sequence[str] | None = None, *,
                   splits: int | Sequence[int] = 1, out: str | Path = "results/compare",
                   device: str | torch.device = "cpu",
                   overrides: dict | Callable[[str], dict] | None = None,
                   num_samples: int = 200, reference: str | None = None,
                   log: bool = True) -> list[dict]:
    """Fit each entry on each split of each data set; return the records.

    Parameters
    ----------
    data : data set names (see :func:`bnn_zoo.core.data.names`).
    entries : zoo entries; ``None``: :func:`default_entries` of each data set's task.
    splits : a count ``K`` (splits ``0..K-1``, capped at the data set's number of
        splits) or explicit split indices; split ``k`` is fitted with seed ``k``.
    out : results folder; finished runs are cached in ``out/runs`` and reused.
    device : where data and fits live (``"cpu"``, ``"cuda"``).
    overrides : passed to every ``entry.fit`` (e.g. ``{"steps": 500}``), or a function of
        the entry's name giving its own (see ``benchmarks/uci.py``).
    reference : an entry (e.g. ``"nuts"``) also run on every split, so that
        :func:`summarise` can measure the distance of every predictive to it.
    """
    check_positive_int("num_samples", num_samples)
    if entries is not None:
        for name in entries:
            zoo.get(name)  # unknown names fail before any fit
    out = Path(out)
    records = []
    for name in data:
        indices = _split_indices(name, splits)
        for split in indices:
            dataset = data_module.load(name, split).to(device)
            chosen = list(entries) if entries is not None else default_entries(dataset.task)
            if reference is not None and reference not in chosen:
                chosen = [reference, *chosen]
            for entry in chosen:
                own = overrides(entry) if callable(overrides) else overrides
                records.append(_cached_run(entry, dataset, split, own or {}, num_samples, out,
                                           log))
    return records


def _split_indices(name: str, splits: int | Sequence[int]) -> list[int]:
    if isinstance(splits, int):
        check_positive_int("splits", splits)
        return list(range(min(splits, data_module.num_splits(name))))
    return [int(s) for s in splits]


def _cached_run(entry: str, dataset: data_module.Dataset, split: int, overrides: dict,
                num_samples: int, out: Path, log: bool) -> dict:
    path = _run_path(out, entry, dataset.name, split, split, overrides)
    if path.exists():
        record = json.loads(path.read_text())
        status = "cached"
    else:
        record = run_one(entry, dataset, split=split, seed=split, overrides=overrides,
                         num_samples=num_samples)
        status = record["status"]
        if status != "failed":
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            tmp.replace(path)
    if log:
        detail = record.get("reason", "") if record["status"] != "ok" else (
            f"{record['seconds']:.1f} s")
        print(f"[{status}] {entry} on {dataset.name} split {split}: {detail}", flush=True)
    return record


def _mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def _reference_distances(records: list[dict], reference: str) -> None:
    """Add ``w2_to_ref`` and ``ll_gap`` to the metrics of every regression record whose
    (data, split) has an ``ok`` record of ``reference``."""
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


def summarise(records: list[dict], *, reference: str | None = REFERENCE) -> list[dict]:
    """One row per (data, entry): each metric's mean and standard error over splits
    (``<metric>`` and ``<metric>_se``), the number of splits, and skip reasons."""
    if reference is not None:
        _reference_distances(records, reference)
    rows: dict[tuple[str, str], dict] = {}
    for r in records:
        row = rows.setdefault((r["data"], r["entry"]), {
            "data": r["data"], "entry": r["entry"], "task": r["task"], "splits": 0,
            "values": {}, "diagnostics": {}, "reasons": []})
        if r["status"] != "ok":
            row["reasons"].append(f"{r['status']}: {r['reason']}")
            continue
        row["splits"] += 1
        for key, value in r["metrics"].items():
            row["values"].setdefault(key, []).append(value)
        for key, value in r.get("diagnostics", {}).items():
            row["diagnostics"].setdefault(key, []).append(value)
    summary = []
    for row in rows.values():
        out = {k: row[k] for k in ("data", "entry", "task", "splits")}
        for key, values in row.pop("values").items():
            out[key], out[f"{key}_se"] = _mean_se(values)
        for key, values in row.pop("diagnostics").items():
            out[f"diag_{key}"] = _mean_se(values)[0]
        out["reason"] = "; ".join(sorted(set(row["reasons"])))
        summary.append(out)
    return summary


def _fmt(mean: float | None, se: float | None) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    digits = 3 if abs(mean) < 100 else 1
    if se is None or math.isnan(se):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def markdown_table(summary: list[dict], columns: Sequence[str] | None = None,
                   extra: dict[str, dict[str, str]] | None = None) -> str:
    """Markdown tables (one per data set) of mean ± standard error over splits.

    ``extra`` maps a column title to ``{data: text}`` (e.g. published numbers) and is
    appended as rows named after the titles.
    """
    lines: list[str] = []
    for data in dict.fromkeys(row["data"] for row in summary):
        rows = [row for row in summary if row["data"] == data]
        task = rows[0]["task"]
        cols = [c for c in (columns or TABLE_COLUMNS[task]) if any(c in r for r in rows)]
        lines += [f"### {data}", "",
                  "| entry | splits | " + " | ".join(cols) + " | notes |",
                  "|---|---|" + "---|" * len(cols) + "---|"]
        for row in rows:
            cells = [_fmt(row.get(c), row.get(f"{c}_se")) for c in cols]
            notes = ", ".join(f"{k[5:]} {v:.3g}" for k, v in row.items() if k.startswith("diag_"))
            notes = "; ".join(x for x in (notes, row["reason"]) if x)
            lines.append(f"| {row['entry']} | {row['splits']} | " + " | ".join(cells)
                         + f" | {notes} |")
        for title, by_data in (extra or {}).items():
            if data in by_data:
                lines.append(f"| {title} | published | {by_data[data]} |")
        lines.append("")
    return "\n".join(lines)


def write_tables(records: list[dict], out: str | Path, *, reference: str | None = REFERENCE,
                 name: str = "compare", columns: Sequence[str] | None = None,
                 extra: dict[str, dict[str, str]] | None = None) -> str:
    """Write ``<name>.md``, ``<name>.csv`` and ``<name>.json`` under ``out``; return the
    Markdown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(records, reference=reference)
    table = markdown_table(summary, columns, extra)
    (out / f"{name}.md").write_text(table)
    keys = list(dict.fromkeys(k for row in summary for k in row))
    with open(out / f"{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(summary)
    runs = [{k: r.get(k) for k in ("entry", "data", "split", "seed", "status", "metrics",
                                   "diagnostics", "reason", "overrides")} for r in records]
    (out / f"{name}.json").write_text(json.dumps({"summary": summary, "runs": runs}, indent=1,
                                                 default=float))
    return table


def write_figures(records: list[dict], out: str | Path) -> list[Path]:
    """Predictive bands side by side (1-D regression), reliability diagrams
    (classification) and ELBO curves, from the first split of each data set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for data in dict.fromkeys(r["data"] for r in records):
        ok = [r for r in records if r["data"] == data and r["status"] == "ok"]
        if not ok:
            continue
        first = min(r["split"] for r in ok)
        ok = [r for r in ok if r["split"] == first]
        stem = data.replace("/", "_")
        banded = [r for r in ok if "band" in r]
        if banded:
            dataset = data_module.load(data, first)
            fig, axes = plt.subplots(1, len(banded), figsize=(3.2 * len(banded), 3),
                                     sharey=True, squeeze=False)
            for ax, r in zip(axes[0], banded):
                b = r["band"]
                ax.scatter(dataset.x_train[:, 0], dataset.y_train, s=3, c="0.6")
                ax.fill_between(b["x"], b["lo"], b["hi"], alpha=0.3,
                                label=f"{round(100 * BAND_MASS)}%")
                ax.plot(b["x"], b["mean"], lw=1.5)
                ax.set_title(f"{r['entry']}\nLL {r['metrics']['ll']:.2f}", fontsize=9)
            fig.tight_layout()
            paths.append(_save(fig, out / f"bands_{stem}.png"))
        calibrated = [r for r in ok if "reliability" in r]
        if calibrated:
            fig, ax = plt.subplots(figsize=(4, 4))
            ax.plot([0, 1], [0, 1], "k:", lw=1)
            for r in calibrated:
                rel = r["reliability"]
                used = [i for i, c in enumerate(rel["count"]) if c > 0]
                ax.plot([rel["confidence"][i] for i in used], [rel["accuracy"][i] for i in used],
                        "o-", ms=3, label=f"{r['entry']} (ECE {r['metrics']['ece']:.3f})")
            ax.set(xlabel="confidence", ylabel="accuracy", title=f"reliability: {data}")
            ax.legend(fontsize=7)
            paths.append(_save(fig, out / f"reliability_{stem}.png"))
        curves = [r for r in ok if r["losses"]]
        if curves:
            fig, ax = plt.subplots(figsize=(5, 3.5))
            for r in curves:
                ax.plot(torch.linspace(0, 1, len(r["losses"])).tolist(), r["losses"],
                        label=r["entry"], lw=1)
            ax.set(xlabel="fraction of training", ylabel="negative ELBO (smoothed)",
                   title=f"training: {data}")
            if all(v > 0 for r in curves for v in r["losses"]):
                ax.set_yscale("log")
            ax.legend(fontsize=7)
            paths.append(_save(fig, out / f"elbo_{stem}.png"))
    return paths


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _entry_or_none(text: str) -> str | None:
    return None if text.lower() == "none" else text


def add_arguments(parser: argparse.ArgumentParser, *, data: Sequence[str] = ("sine",),
                  out: str = "results/compare", splits: int = 1,
                  reference: str | None = None,
                  entries: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The flags shared by ``python -m bnn_zoo compare`` and the benchmark scripts.

    ``entries`` is the default entry list; ``None`` (or ``--entries all``) runs every
    entry that supports the data's task.
    """
    every = "every entry supporting the task"
    parser.add_argument("--data", "--datasets", nargs="+", default=list(data), dest="data",
                        help=f"data sets (default: {' '.join(data)})")
    parser.add_argument("--entries", nargs="+", default=None if entries is None else list(entries),
                        help=f"zoo entries, or 'all' for {every} (default: "
                             f"{every if entries is None else ' '.join(entries)})")
    parser.add_argument("--splits", "--seeds", type=int, default=splits, dest="splits",
                        help=f"splits 0..N-1, split k fitted with seed k (default: {splits})")
    parser.add_argument("--steps", type=int, default=None,
                        help="override every entry's number of training steps")
    parser.add_argument("--num-samples", type=int, default=200,
                        help="posterior samples per prediction")
    parser.add_argument("--reference", default=reference, type=_entry_or_none,
                        help=f"reference entry to measure distances to, e.g. {REFERENCE}, "
                             f"or none (default: {reference})")
    parser.add_argument("--out", type=Path, default=Path(out),
                        help=f"results folder (default: {out})")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice)")
    return parser


def main_from_args(args: argparse.Namespace, *, columns: Sequence[str] | None = None,
                   extra: dict[str, dict[str, str]] | None = None) -> list[dict]:
    """Run the comparison the parsed flags ask for, print the table, write the files."""
    if args.threads is not None:
        torch.set_num_threads(check_positive_int("threads", args.threads))
    overrides = {} if args.steps is None else {"steps": check_positive_int("steps", args.steps)}
    entries = None if args.entries == ["all"] else args.entries
    records = run_comparison(args.data, entries, splits=args.splits, out=args.out,
                             device=args.device, overrides=overrides,
                             num_samples=args.num_samples, reference=args.reference)
    table = write_tables(records, args.out, reference=args.reference or REFERENCE,
                         columns=columns, extra=extra)
    figures = write_figures(records, args.out)
    print(table)
    print(f"Wrote {args.out}/compare.md, .csv, .json" +
          "".join(f", {p.name}" for p in figures))
    return records
