"""Compare zoo entries on data sets: every chosen entry on every chosen split.

`run_comparison` fits every entry on every split through the zoo's contract and
returns one record per (entry, data set, split) (`bnn_zoo._harness.runs`, which
caches them under ``<out>/runs``); `run_from_args` runs what the comparison flags
(`bnn_zoo._harness.flags.add_comparison_flags`) ask for and writes the summary
(mean ± standard error over splits, distances to a reference predictive:
`bnn_zoo._harness.summary`) as ``compare.md``, ``.csv`` and ``.json``
(`bnn_zoo._harness.tables`) with the figures (`bnn_zoo._harness.figures`), and,
when the reference ran, ``reference.md``/... split by split (`write_reference`).
On the UCI sets every comparison follows the UCI protocol of ``benchmarks/uci.py``
(`data_overrides`): its model per data set, and the noise tuned on held-out training
data where asked (`protocol_overrides`).
With a network (``--net cnn``: `bnn_zoo.zoo.NETWORK_CHOICES`, a CNN for each data set)
every entry that takes one fits it in place of its own model (``entry.fit(..., net=...)``),
e.g. the guides on a CNN.
The fits run as batches, one per (entry, data set) (`bnn_zoo._harness.sweep`): in this
process, or on a local or running Dask cluster (``jobs``, ``scheduler``; ``--jobs``,
``--scheduler``), with the same records.
``python -m bnn_zoo compare``, ``benchmarks/compare_guides.py``,
``benchmarks/classification.py`` and ``benchmarks/uci.py`` are built on it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

import torch

from bnn_zoo import zoo
from bnn_zoo._core import data as data_module
from bnn_zoo._core.checks import check_choice, check_positive_int
from bnn_zoo._harness import flags
from bnn_zoo._harness.bundled import NOT_BUNDLED
from bnn_zoo._harness.fidelity import write_fidelity
from bnn_zoo._harness.figures import FIGURE_KINDS, figure_path, write_figures
from bnn_zoo._harness.outputs import check_writable
from bnn_zoo._harness.provenance import run_columns, versions
from bnn_zoo._harness.runs import CACHE
from bnn_zoo._harness.summary import REFERENCE, REFERENCE_COLUMNS, reference_rows, summarise
from bnn_zoo._harness.sweep import Batch, run_batches
from bnn_zoo._harness.tables import write_tables

__all__ = ["REPLICAS", "TABLE_COLUMNS", "UCI_MODEL_OPTIONS", "UCI_VALIDATION", "data_overrides",
           "default_entries", "failures", "notes", "output_files", "protocol_overrides",
           "records_from_args", "run_comparison", "run_from_args", "split_indices",
           "write_comparison", "write_reference"]

#: ``replicas`` of `run_comparison`: fit the splits of a data set together as replicas
#: where the entry can (``auto``), demand it (``on``), or fit one by one (``off``).
REPLICAS = ("auto", "on", "off")

#: The UCI protocol's model options per data set (one hidden layer of 50 units elsewhere).
UCI_MODEL_OPTIONS = {"uci/protein-tertiary-structure": {"hidden": (100,)}}
#: The UCI protocol's share of each training split held out to tune the observation noise.
UCI_VALIDATION = 0.1

TABLE_COLUMNS = {
    "regression": ("rmse", "ll", "coverage_90", "w1_to_ref", "w2_to_ref", "ll_gap", "fit_seconds",
                   "steps_per_second"),
    "classification": ("accuracy", "nll", "ece", "brier", "mi", "agreement", "tv_to_ref",
                       "fit_seconds", "steps_per_second"),
}


def protocol_overrides(overrides: dict, validation: float) -> Callable[[str], dict]:
    """Per entry: ``overrides``, plus ``validation`` (the share of each training split held
    out to tune the noise) where the entry has a tunable noise (``Entry.tunable_noise``)."""
    def for_entry(entry: str) -> dict:
        if validation > 0 and zoo.get(entry).tunable_noise:
            return {**overrides, "validation": validation}
        return overrides

    return for_entry


def data_overrides(name: str, overrides: dict, validation: float | None = None
                   ) -> Callable[[str], dict]:
    """The overrides of every entry on data set ``name`` (`protocol_overrides`): on a
    UCI set (``uci/...``, or its gap splits ``uci_gap/...``) the UCI protocol's, its model
    options (`UCI_MODEL_OPTIONS`, those the entry's model takes) and ``validation``
    (``None``: `UCI_VALIDATION`); on another set ``overrides`` and ``validation``
    (``None``: 0, the noise learned with the weights)."""
    uci = data_module.uci_set(name)
    if uci is None:
        return protocol_overrides(overrides, validation or 0.0)
    protocol = protocol_overrides(overrides, UCI_VALIDATION if validation is None else validation)
    options = UCI_MODEL_OPTIONS.get(f"{data_module.UCI_PREFIX}{uci}", {})

    def for_entry(entry: str) -> dict:
        # Protein's 100 hidden units are for the networks with hidden layers, not for a
        # model without them (rff_logitnormal's random features), which would refuse them.
        accepted = zoo.get(entry).model_keywords
        own = {k: v for k, v in options.items() if accepted is None or k in accepted}
        return {**protocol(entry), "model_options": own} if own else protocol(entry)

    return for_entry


def default_entries(task: str, *, reference: str | None = REFERENCE,
                    net: bool = False) -> list[str]:
    """Every registered entry supporting ``task`` (with ``net=True``: and taking a user's
    network), the (slow) reference excluded."""
    return [n for n in zoo.names(task, accepts_net=net) if n != reference]


def split_indices(name: str, splits: int | Sequence[int]) -> list[int]:
    """The split indices of ``name`` to run (reading a UCI set's number of splits, so that
    a missing or damaged data folder fails before any fit)."""
    available = data_module.num_splits(name)
    if isinstance(splits, int):
        check_positive_int("splits", splits)
        return list(range(min(splits, available)))
    # A toy set has a split for every index; a UCI set has its own number of them.
    upper = available if data_module.uci_set(name) is not None else None
    chosen = list(splits)
    for s in chosen:
        if (isinstance(s, bool) or not isinstance(s, int) or s < 0
                or (upper is not None and s >= upper)):
            raise ValueError(f"Expected splits of {name} to be integers >= 0"
                             + ("" if upper is None else f" and < {upper}") + f", but got {s!r}.")
    return chosen


def _check_names(data: Sequence[str], entries: Sequence[str] | None,
                 reference: str | None, net: zoo.Network | Mapping | None) -> None:
    """Unknown data sets and entries, and data sets a bundled network does not take (or
    ``net``, a mapping, names none for), fail before any fit."""
    for name in data:
        data_module.check_name(name)
        if isinstance(net, Mapping) and name not in net:
            known = ", ".join(f"{d} ({getattr(n, 'name', n)!r})" for d, n in net.items())
            raise ValueError(f"net has networks for {known}, not for {name!r}.")
        chosen = net[name] if isinstance(net, Mapping) else net
        if isinstance(chosen, zoo.NamedNetwork) and name not in chosen.data:
            raise ValueError(f"The network {chosen.name!r} takes the data sets "
                             f"{', '.join(chosen.data)}, not {name!r}.")
    for name in [*(entries or ()), *([reference] if reference is not None else [])]:
        zoo.get(name)


def run_comparison(data: Iterable[str], entries: Sequence[str] | None = None, *,
                   splits: int | Sequence[int] = 1, seed: int = 0,
                   out: str | Path = "results/compare", device: str | torch.device = "cpu",
                   overrides: dict | Callable[[str], dict] | None = None,
                   overrides_by_data: Callable[[str], dict | Callable[[str], dict]] | None = None,
                   num_samples: int = 200, reference: str | None = None,
                   bundled_reference: bool = False, log: bool = True,
                   net: zoo.Network | Mapping[str, zoo.Network] | None = None,
                   replicas: str = "auto", cached_only: bool = False, jobs: int = 1,
                   scheduler: str | None = None, threads: int | None = None) -> list[dict]:
    """Fit each entry on each split of each data set; return the records.

    Parameters
    ----------
    data : data set names (see [`bnn_zoo._core.data.names`][]).
    entries : zoo entries; ``None``: `default_entries` of each data set's task.
    splits : a count ``K`` (splits ``0..K-1``, capped at the data set's number of
        splits) or explicit split indices; split ``k`` is fitted with seed ``seed + k``.
    out : results folder; finished runs are cached in ``out/runs`` and reused.
    device : where data and fits live (``"cpu"``, ``"cuda"``).
    overrides : keyword arguments of every ``entry.fit`` (e.g. ``{"steps": 500}`` or
        ``{"model_options": {"hidden": (100,)}}``), or a function of the entry's name
        giving its own.
    overrides_by_data : in place of ``overrides``, a function of the data set's name giving
        its ``overrides`` (e.g. ``functools.partial(data_overrides, overrides={},
        validation=None)``, the UCI protocol of ``benchmarks/uci.py``).
    reference : an entry (e.g. ``"hmc"``) also run on every split, so that
        `summarise` can measure the distance of every
        predictive to it; every regression run then keeps its predictive's quantiles
        for the Wasserstein-1 distance (`bnn_zoo._harness.runs.W1_LEVELS`).
    bundled_reference : read the reference's runs from the bundled references
        (`bnn_zoo._harness.bundled`), never fitting them: a split that none matches is
        recorded as skipped, with the reason `bnn_zoo._harness.bundled.NOT_BUNDLED`.
    net : a network every entry fits in place of its own model (``entry.fit(...,
        net=net)``; ``None``: the entries' own models); entries that take none are skipped,
        and by default only those that do run. A [`NamedNetwork`][bnn_zoo.zoo.NamedNetwork] (from
        `bnn_zoo.zoo.NETWORKS`) keys the cache by its name; another factory by its
        ``repr``. A mapping from data set names to networks (a value of
        `bnn_zoo.zoo.NETWORK_CHOICES`) gives each data set its own.
    replicas : ``"auto"``: an entry that batches its fits ([`bnn_zoo.zoo.batches_replicas`][])
        fits two or more splits of a data set with equal training sizes as one group of
        replicas in one pass (``entry.fit_many``), the others (one split, and every fit of a
        ``net``) one by one; ``"on"``: every entry fits its splits as one group, even one
        split, and a ``ValueError`` for an entry that cannot batch; ``"off"``: every split
        one by one (``entry.fit``). Replicas draw their minibatch order and noise jointly,
        so a split's result depends on the group it was fitted in (in distribution it does
        not): the group, the split indices asked for, is part of each run's cache key, and
        a group with a run missing is fitted again whole (`cached_runs`). On the CPU with a
        fixed thread count the same call reproduces every split's metrics.
    cached_only : fit nothing: a run missing from the cache is recorded as skipped, with
        that reason (to rewrite the tables of finished runs while others are missing).
    jobs, scheduler : where the (entry, data set) batches run
        (`bnn_zoo._harness.sweep.run_batches`): in this process (``jobs=1``), on a
        local Dask cluster of ``jobs`` single-threaded processes, or on the running Dask
        cluster at the address ``scheduler``; the records are the same. With
        ``cached_only``, in this process.
    threads : torch's CPU threads in the process that fits a batch (``None``: its own).
    """
    check_positive_int("num_samples", num_samples)
    check_choice("replicas", replicas, REPLICAS)
    if overrides is not None and overrides_by_data is not None:
        raise ValueError("Expected overrides or overrides_by_data, not both.")
    data = list(data)
    _check_names(data, entries, reference, net)
    plan = {name: split_indices(name, splits) for name in data}
    cached = [*(entries if entries is not None else zoo.names()), *filter(None, [reference])]
    check_writable("out", out, folders=[CACHE, *(f"{CACHE}/{e}" for e in cached)])
    # A worker started elsewhere (--scheduler) finds the same folder on a shared file system.
    common = {"num_samples": num_samples, "out": str(Path(out).absolute()), "device": str(device),
              "cached_only": cached_only, "threads": threads, "log": log,
              "quantiles": reference is not None}
    batches = [batch for name, indices in plan.items() for batch in _batches(
        name, indices, entries, seed=seed, reference=reference,
        bundled=reference if bundled_reference else None, net=net, replicas=replicas,
        overrides=overrides if overrides_by_data is None else overrides_by_data(name),
        common=common)]
    if cached_only:  # reading the cache is the client's work
        jobs, scheduler = 1, None
    return [r for records in run_batches(batches, jobs=jobs, scheduler=scheduler)
            for r in records]


def _batches(name: str, indices: Sequence[int], entries: Sequence[str] | None, *, seed: int,
             reference: str | None, bundled: str | None,
             net: zoo.Network | Mapping[str, zoo.Network] | None,
             replicas: str, overrides: dict | Callable[[str], dict] | None,
             common: dict) -> list[Batch]:
    """The batches of data set ``name`` (one per entry: its splits ``indices``, or one per
    split where the entry fits them alone), with the
    arguments of `run_comparison` (``bundled``: the reference read from the bundled
    references, or ``None``); ``common``: the fields every batch shares."""
    datasets = [data_module.load(name, split) for split in indices]
    chosen = (list(entries) if entries is not None
              else default_entries(datasets[0].task, net=net is not None))
    if reference is not None and reference not in chosen:
        chosen = [reference, *chosen]
    equal = len({tuple(d.x_train.shape) for d in datasets}) == 1
    batches = []
    for entry in chosen:
        own = (overrides(entry) if callable(overrides) else overrides) or {}
        # A group of one replica gains nothing over a single fit and costs its set-up.
        together = ((replicas == "on" or (replicas == "auto" and len(indices) > 1))
                    and equal and net is None and zoo.batches_replicas(zoo.get(entry), **own))
        if replicas == "on" and not together:
            raise ValueError(f"Expected entry {entry!r} to fit the splits of {name} as "
                             "replicas (replicas='on'), but it cannot batch them "
                             + ("on a user's network." if net is not None else
                                "with these options." if equal else
                                "(their training sets differ in size)."))
        if net is not None:
            own = {**own, "net": net[name] if isinstance(net, Mapping) else net}
        # Splits fitted alone are a batch each, so that the workers share them out.
        for group in [tuple(indices)] if together else [(i,) for i in indices]:
            batches.append(Batch(entry, name, group, tuple(seed + s for s in group), own,
                                 together=together, size=datasets[0].x_train.shape[0],
                                 bundled=entry == bundled, **common))
    return batches


def failures(records: Sequence[dict], requested: Collection[str] = ()) -> list[dict]:
    """The records that make a comparison fail: every failed run, and the skipped runs
    (declined by their entry) of the entries in ``requested`` (those asked for by name)."""
    return [r for r in records if r["status"] == "failed"
            or (r["status"] == "skipped" and r["entry"] in requested)]


def output_files(data: Sequence[str], name: str = "compare") -> list[str]:
    """The files a comparison on ``data`` writes under its results folder (tables, the
    reference tables and figures), relative to it."""
    return [*(f"{table}{suffix}" for table in (name, "reference", "fidelity")
              for suffix in (".md", ".csv", ".json")), "fidelity.png",
            *(figure_path("", kind, d).name for d in data for kind in FIGURE_KINDS)]


def notes(row: dict) -> str:
    """The notes column of a comparison table: mean diagnostics, and why runs were skipped
    or failed."""
    diagnostics = ", ".join(f"{k[5:]} {v:.3g}" for k, v in row.items()
                            if k.startswith("diag_") and isinstance(v, float))
    return "; ".join(x for x in (diagnostics, row.get("reason", "")) if x)


def write_comparison(records: list[dict], out: str | Path, *, name: str = "compare",
                     reference: str | None = REFERENCE, columns: Sequence[str] | None = None,
                     section: str | None = "data", markdown_rows: Sequence[dict] = (),
                     preamble: str = "") -> tuple[list[dict], str]:
    """Summarise ``records`` and write ``<name>.md``, ``.csv`` and ``.json`` under ``out``
    (one Markdown table per data set, or with ``section=None`` one table with a ``data``
    column; ``columns`` default to `TABLE_COLUMNS` of the data's task; ``preamble``
    above the Markdown tables); return the summary rows and the Markdown. The JSON keeps
    every run under ``"runs"`` (keys, status, metrics, diagnostics, reason, the settings of
    its cache key, its provenance and, for classification, its reliability bins), from which
    `restore_cache` rebuilds the cache of a fresh checkout, and
    under ``"provenance"`` the code versions and commits of the finished runs
    (`versions`), which a line under the Markdown names;
    each summary row has the ``code`` and ``commit`` of its runs."""
    summary = summarise(records, reference=reference)
    tasks = dict.fromkeys(row["task"] for row in summary)
    chosen = columns or [c for task in tasks for c in TABLE_COLUMNS[task]]
    runs = [{**{k: r.get(k) for k in ("entry", "data", "split", "seed", "status", "metrics",
                                      "diagnostics", "reason", "settings", "provenance")},
             **({"reliability": r["reliability"]} if "reliability" in r else {})}
            for r in records]
    table = write_tables(out, name, summary, keys=("data", "entry"), section=section,
                         columns=list(dict.fromkeys(chosen)), notes=notes, runs=runs,
                         markdown_rows=markdown_rows, preamble=preamble,
                         provenance=versions(summary))
    return summary, table


def write_reference(records: list[dict], out: str | Path, reference: str) -> str | None:
    """Write ``reference.md``, ``.csv`` and ``.json`` under ``out``: per data set, every
    entry's distances to ``reference`` and the reference's convergence diagnostics split by
    split and over all splits (`reference_rows`), and the entries ranked by their distance
    (`bnn_zoo._harness.fidelity.write_fidelity`: ``fidelity.md``, ..., ``fidelity.png``);
    return the reference's Markdown, or ``None`` (nothing written) when the reference has
    no finished run."""
    finished = {r["task"] for r in records if r["entry"] == reference and r["status"] == "ok"}
    if not finished:
        return None
    preamble = (f"Distances to `{reference}` split by split (`all`: mean ± standard error "
                "over the splits; for the diagnostics, the worst split). `r_hat_pred_max`, "
                "`ess_pred_min`: the largest split R-hat and smallest bulk effective sample "
                "size over the network output at the test inputs, chain by chain; `_f`: the "
                "same at (up to 50) training inputs; `r_hat_max`, `ess_min`: over the "
                "weights. Regression: `w1_to_ref`, the mean over test points of the "
                "Wasserstein-1 distance between the two predictives (from 32 quantiles); "
                "`w2_to_ref`, that of the 2-Wasserstein distance between Gaussians with "
                "their means and standard deviations; `ll_gap`, the entry's test LL less the "
                "reference's.")
    if "classification" in finished:
        preamble += (" Classification: `agreement`, the share of test points whose most "
                     f"probable class is `{reference}`'s; `tv_to_ref`, the mean total "
                     "variation between the two predictive distributions, 1/2 sum_k |p_k - "
                     "q_k|; the network output is the class probabilities.")
    table = write_tables(out, "reference", reference_rows(records, reference),
                         keys=("data", "entry", "split"), section="data",
                         columns=REFERENCE_COLUMNS, preamble=preamble,
                         provenance=versions(run_columns(r) for r in records))
    write_fidelity(records, out, reference)
    return table


def records_from_args(args: argparse.Namespace, *, validation: float | None = 0.0,
                      net: Mapping[str, zoo.Network] | None = None) -> list[dict]:
    """The records of `run_comparison` as the parsed comparison flags
    (`add_comparison_flags`) ask for it, each data set with its
    `data_overrides` (``validation`` as there), the networks ``net`` in place of the
    entries' models, and ``--cached-only`` where the command has it. With ``--reference
    auto`` the reference is `REFERENCE` read, with its own budget, from the bundled
    references (`bnn_zoo._harness.bundled`), unless ``--entries`` names it; the splits that
    none matches have no reference: their runs of it are left out."""
    bundled = args.reference == flags.AUTO and REFERENCE not in (args.entries or ())
    budget = flags.budget_overrides(args)

    def by_data(name: str) -> Callable[[str], dict]:
        guides = data_overrides(name, budget, validation)
        reference = data_overrides(name, {}, validation)
        return lambda entry: reference(entry) if bundled and entry == REFERENCE else guides(entry)

    records = run_comparison(args.data, args.entries, splits=args.splits, seed=args.seed,
                             out=args.out, device=args.device, overrides_by_data=by_data,
                             num_samples=args.num_samples,
                             reference=flags.reference_entry(args), bundled_reference=bundled,
                             net=net, replicas=args.replicas,
                             cached_only=getattr(args, "cached_only", False), jobs=args.jobs,
                             scheduler=args.scheduler, threads=args.threads)
    return [r for r in records if r.get("reason") != NOT_BUNDLED]


def run_from_args(args: argparse.Namespace, *, validation: float | None = 0.0) -> list[dict]:
    """Run the comparison that the parsed comparison flags ask for, print the table and
    write the files and figures under ``args.out``. Each data set runs with its
    `data_overrides` (``validation``: the share of each training split on which
    entries with a tunable noise tune it; ``None``: the UCI protocol's on UCI sets, none
    elsewhere); the batches run where ``--jobs`` and ``--scheduler`` say
    (`records_from_args`)."""
    check_writable("--out", args.out, files=output_files(args.data), folders=[CACHE])
    net = flags.network(args)
    records = records_from_args(args, validation=validation, net=net)
    preamble = "" if net is None else (
        f"Every entry fits the network `{args.net}` ("
        + ", ".join(f"`{net[d].name}` on {d}" for d in args.data)
        + ") in place of its own model (`entry.fit(..., net=...)`).")
    chosen = flags.reference_entry(args)
    _, table = write_comparison(records, args.out, reference=chosen or REFERENCE,
                                preamble=preamble)
    figures = write_figures(records, args.out)
    print(table)
    if chosen is not None:
        reference = write_reference(records, args.out, chosen)
        if reference is not None:
            print(reference)
            print(f"Wrote {args.out}/reference.md, .csv, .json")
    print(f"Wrote {args.out}/compare.md, .csv, .json" + "".join(f", {p.name}" for p in figures))
    return records
