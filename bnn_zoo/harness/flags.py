"""Command-line flags shared by ``python -m bnn_zoo`` and every script in ``benchmarks/``.

:func:`add_shared_flags` adds ``--out``, ``--threads``, ``--device``, ``--seed`` and
``--splits``; :func:`parse` parses and applies them, and is the one place that sets
torch's CPU thread count. :func:`add_data_flag`, :func:`add_entries_flag`,
:func:`add_fit_flags` and :func:`add_comparison_flags` add the flags of scripts that fit
zoo entries on data sets; :func:`budget_overrides` turns ``--steps`` into the keyword
arguments of ``entry.fit``.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Sequence
from pathlib import Path

import torch

from bnn_zoo.core.checks import check_device, check_positive_int
from bnn_zoo.harness.summary import REFERENCE

__all__ = ["SHARED_FLAGS", "add_comparison_flags", "add_data_flag", "add_entries_flag",
           "add_fit_flags", "add_shared_flags", "apply", "budget_overrides", "parse",
           "set_threads"]

SHARED_FLAGS = ("out", "threads", "device", "seed", "splits")


def add_shared_flags(parser: argparse.ArgumentParser, *, out: str | None,
                     threads: int | None = None, device: str | None = "cpu", seed: int = 0,
                     splits: int = 1,
                     without: Collection[str] = ()) -> argparse.ArgumentParser:
    """Add the shared flags, with these defaults, except those named in ``without``.

    ``out=None`` makes the results folder optional; ``threads=None`` leaves torch's own
    choice; ``device=None`` lets the script choose (e.g. one GPU per process).
    """
    unknown = set(without) - set(SHARED_FLAGS)
    if unknown:
        raise ValueError(f"Unknown shared flags in without: {sorted(unknown)}; expected some "
                         f"of {', '.join(SHARED_FLAGS)}.")
    if "out" not in without:
        parser.add_argument("--out", type=Path, default=None if out is None else Path(out),
                            help=f"results folder (default: {out})")
    if "threads" not in without:
        parser.add_argument("--threads", type=int, default=threads,
                            help=f"torch CPU threads (default: {threads or 'chosen by torch'})")
    if "device" not in without:
        parser.add_argument("--device", default=device,
                            help=f"cpu, cuda or cuda:N (default: "
                                 f"{device or 'chosen by the script'})")
    if "seed" not in without:
        parser.add_argument("--seed", type=int, default=seed,
                            help=f"random seed; a comparison fits split k with seed + k "
                                 f"(default: {seed})")
    if "splits" not in without:
        parser.add_argument("--splits", type=int, default=splits,
                            help=f"train/test splits 0..N-1 of each data set, capped at the "
                                 f"data set's number of splits (default: {splits})")
    return parser


def set_threads(threads: int | None) -> None:
    """Set torch's CPU thread count (``None``: leave torch's choice). The harness and the
    benchmarks set it here and nowhere else."""
    if threads is not None:
        torch.set_num_threads(check_positive_int("threads", threads))


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
          ) -> argparse.Namespace:
    """Parse ``argv``, check the shared flags (``--device`` becomes a ``torch.device``) and
    apply ``--threads``."""
    args = parser.parse_args(argv)
    return apply(args)


def apply(args: argparse.Namespace) -> argparse.Namespace:
    """Check and apply the shared flags of already parsed ``args``."""
    if getattr(args, "device", None) is not None:
        args.device = check_device("--device", args.device)
    if hasattr(args, "splits"):
        check_positive_int("splits", args.splits)
    for name in ("steps", "num_samples"):
        if getattr(args, name, None) is not None:
            check_positive_int(name, getattr(args, name))
    set_threads(getattr(args, "threads", None))
    return args


def add_data_flag(parser: argparse.ArgumentParser, default: Sequence[str],
                  choices: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """``--data`` (also ``--datasets``): the data sets to run on."""
    parser.add_argument("--data", "--datasets", nargs="+", default=list(default), dest="data",
                        choices=choices, help=f"data sets (default: {' '.join(default)})")
    return parser


def add_entries_flag(parser: argparse.ArgumentParser, default: Sequence[str] | None
                     ) -> argparse.ArgumentParser:
    """``--entries``: zoo entries; ``None`` (or ``--entries all``) means every entry that
    supports the data's task."""
    every = "every entry supporting the task"
    parser.add_argument("--entries", nargs="+", default=None if default is None else list(default),
                        help=f"zoo entries, or 'all' for {every} (default: "
                             f"{every if default is None else ' '.join(default)})")
    return parser


def add_fit_flags(parser: argparse.ArgumentParser, *, steps: int | None = None,
                  num_samples: int = 200) -> argparse.ArgumentParser:
    """``--steps`` (every entry's training steps; default the entry's own budget) and
    ``--num-samples`` (posterior samples per prediction)."""
    parser.add_argument("--steps", type=int, default=steps,
                        help=f"training steps of every fit (default: "
                             f"{steps or 'the budget of each entry'})")
    parser.add_argument("--num-samples", type=int, default=num_samples,
                        help=f"posterior samples per prediction (default: {num_samples})")
    return parser


def _entry_or_none(text: str) -> str | None:
    return None if text.lower() == "none" else text


def add_comparison_flags(parser: argparse.ArgumentParser, *, data: Sequence[str] = ("sine",),
                         out: str = "results/compare", splits: int = 1,
                         reference: str | None = None, entries: Sequence[str] | None = None,
                         threads: int | None = None) -> argparse.ArgumentParser:
    """The flags of a comparison (``python -m bnn_zoo compare`` and the scripts built on
    :func:`bnn_zoo.harness.compare.run_comparison`): the shared flags, ``--data``,
    ``--entries``, ``--steps``, ``--num-samples`` and ``--reference``."""
    add_data_flag(parser, data)
    add_entries_flag(parser, entries)
    add_fit_flags(parser)
    parser.add_argument("--reference", default=reference, type=_entry_or_none,
                        help=f"reference entry to measure distances to, e.g. {REFERENCE}, "
                             f"or none (default: {reference})")
    return add_shared_flags(parser, out=out, splits=splits, threads=threads)


def budget_overrides(args: argparse.Namespace) -> dict:
    """The budget keywords of ``entry.fit`` that the flags ask for (``--steps``)."""
    return {} if args.steps is None else {"steps": check_positive_int("steps", args.steps)}
