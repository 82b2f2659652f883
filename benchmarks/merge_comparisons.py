"""One comparison from the parts it ran in: the runs that each part's ``compare.json`` keeps
(``python -m bnn_zoo compare``, or ``benchmarks/reference_sampler.py --split-ids ...``: each
part on its own splits, with the same entries, settings and code) summarised as one, in the
tables ``compare --reference`` writes: the comparison, the reference's diagnostics and gates
split by split, and the fidelity tables and figure. It is for a reference longer than one
sitting: each part is committed with its runs, and this writes the whole from them, fitting
nothing.

    python benchmarks/merge_comparisons.py benchmarks/results/reference_concrete_4000/0-9 \\
        benchmarks/results/reference_concrete_4000/10-19 \\
        --out benchmarks/results/reference_concrete_4000

The distances to the reference are those each part measured (a kept run has no predictive
left to measure again); the reference's gate is applied again to its kept diagnostics.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

from bnn_zoo._core.files import read_json
from bnn_zoo._harness import compare, flags
from bnn_zoo._harness.summary import REFERENCE

#: What the runs of one entry on one data set must share in every part: their settings, the
#: data's digest aside (it differs from split to split), and of the overrides all but the
#: replica group (a part fits its own splits together; in distribution alike).
SHARED = ("overrides", "num_samples", "quantiles", "device", "dtype", "code")


def shared_settings(run: dict) -> dict:
    """The settings of ``run`` that every part must share (`SHARED`)."""
    settings = {k: run["settings"].get(k) for k in SHARED}
    settings["overrides"] = {k: v for k, v in (settings["overrides"] or {}).items()
                             if k != "replicas"}
    return settings


def part_records(part: Path) -> list[dict]:
    """The run records that ``part/compare.json`` keeps, each with its data's task."""
    document = part / "compare.json"
    if not document.exists():
        raise ValueError(f"Expected a comparison's results folder in parts, but {str(part)!r} "
                         "has no compare.json.")
    kept = read_json(document)
    tasks = {row["data"]: row["task"] for row in kept["summary"]}
    return [{**run, "task": tasks[run["data"]]} for run in kept["runs"]]


def check_parts(parts: Mapping[Path, Sequence[dict]], *, seed: int) -> None:
    """Refuse a run that two parts hold, a run not fitted with ``seed + split``, and runs of
    one (data, entry) whose settings differ between parts, naming the parts."""
    holder: dict[tuple, Path] = {}
    first: dict[tuple, tuple[Path, dict]] = {}
    for part, runs in parts.items():
        for r in runs:
            key = (r["data"], r["entry"], r["split"])
            if key in holder:
                raise ValueError(f"Expected parts with distinct splits, but {key} is in "
                                 f"{holder[key]} and {part}.")
            holder[key] = part
            if r["seed"] != seed + r["split"]:
                raise ValueError(f"Expected the runs of seed {seed} (split k fitted with seed "
                                 f"+ k), but {part} fitted split {r['split']} with seed "
                                 f"{r['seed']}.")
            mine = shared_settings(r)
            like, theirs = first.setdefault((r["data"], r["entry"]), (part, mine))
            for name, value in mine.items():
                if value != theirs[name]:
                    raise ValueError(f"Expected the parts of {r['entry']} on {r['data']} to "
                                     f"share their settings' {name!r}, but {like} has "
                                     f"{theirs[name]!r} and {part} {value!r}.")


def in_comparison_order(records: Sequence[dict]) -> list[dict]:
    """``records`` as one comparison lists them: each (data, entry) where it first appears
    (the reference first, as every part has it), its runs by split."""
    first = {}
    for r in records:
        first.setdefault((r["data"], r["entry"]), len(first))
    return sorted(records, key=lambda r: (first[r["data"], r["entry"]], r["split"]))


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="+", type=Path,
                        help="results folders of the parts, each with its compare.json")
    parser.add_argument("--reference", default=REFERENCE,
                        help=f"the reference entry the parts measured against "
                             f"(default: {REFERENCE})")
    flags.add_shared_flags(parser, out=None, without=("device", "splits"))
    args = flags.parse(parser, argv)
    if args.out is None:
        parser.error("--out: name the results folder of the whole")
    if len(set(args.parts)) < len(args.parts):
        parser.error(f"parts names a folder twice: {[str(p) for p in args.parts]}")
    try:
        parts = {part: part_records(part) for part in args.parts}
        check_parts(parts, seed=args.seed)
    except ValueError as error:
        parser.error(str(error))
    records = in_comparison_order([r for runs in parts.values() for r in runs])
    _, table = compare.write_comparison(records, args.out, reference=args.reference)
    print(table)
    print(compare.write_reference(records, args.out, args.reference))
    return records


if __name__ == "__main__":
    main()
