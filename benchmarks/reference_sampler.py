"""The comparison against a reference sampled with other settings: ``python -m bnn_zoo compare
--reference hmc`` (each UCI set under its protocol,
:func:`bnn_zoo._harness.compare.data_overrides`), with the reference's ``--warmup``,
``--samples``, ``--chains`` or ``--max-leapfrog`` changed on every split alike: for a data set
whose splits the entry's own chains leave short of the convergence gate (longer chains,
longer trajectories). Writes what ``compare --reference`` writes under ``--out``: the
comparison, the reference's diagnostics and gates split by split, the fidelity tables and
the figures. ``--split-ids`` runs the named splits in place of ``0..N-1``: a reference
longer than one sitting runs in parts, each committed with its runs, that
``benchmarks/merge_comparisons.py`` summarises as one comparison.

    python benchmarks/reference_sampler.py --data uci/yacht --splits 20 --samples 4000 \\
        --threads 1 --jobs 2 --replicas off --entries map \\
        --out benchmarks/results/reference_yacht_4000
"""

from __future__ import annotations

import argparse
import runpy
from collections.abc import Callable, Sequence
from pathlib import Path

from bnn_zoo._harness import compare, flags
from bnn_zoo._harness.figures import write_figures
from bnn_zoo._harness.summary import REFERENCE

NOISE = runpy.run_path(str(Path(__file__).with_name("reference_noise.py")),
                       run_name="reference_noise")


def with_sampler(overrides: Callable[[str], dict], reference: str, sampler: dict
                 ) -> Callable[[str], dict]:
    """``overrides`` of every entry, the ``reference``'s ``method_options`` updated with
    ``sampler``."""
    def for_entry(entry: str) -> dict:
        own = overrides(entry)
        if entry != reference:
            return own
        return {**own, "method_options": {**own.get("method_options", {}), **sampler}}

    return for_entry


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_comparison_flags(parser, data=("uci/yacht",), out="results/reference_sampler",
                               reference=REFERENCE, entries=("map",))
    NOISE["add_sampler_flags"](parser)
    parser.add_argument("--split-ids", type=int, nargs="+", metavar="K",
                        help="the splits to run, by index, in place of --splits (a part of a "
                             "longer comparison; default: 0..N-1 of --splits)")
    args = flags.parse(parser, argv)
    reference = flags.reference_entry(args)
    if reference is None:
        parser.error("--reference none leaves no sampler to change; name the reference")
    if args.split_ids and len(set(args.split_ids)) < len(args.split_ids):
        parser.error(f"--split-ids names a split twice: {args.split_ids}")
    sampler = NOISE["sampler_options"](args)
    budget = flags.budget_overrides(args)
    records = compare.run_comparison(
        args.data, args.entries, splits=args.split_ids or args.splits, seed=args.seed, out=args.out,
        device=args.device, num_samples=args.num_samples, reference=reference,
        overrides_by_data=lambda name: with_sampler(compare.data_overrides(name, budget), reference,
                                                    sampler),
        replicas=args.replicas, jobs=args.jobs, scheduler=args.scheduler, threads=args.threads)
    _, table = compare.write_comparison(records, args.out, reference=reference)
    write_figures(records, args.out)
    print(table)
    print(compare.write_reference(records, args.out, reference))
    return records


if __name__ == "__main__":
    main()
