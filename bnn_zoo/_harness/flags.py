"""Command-line flags shared by ``python -m bnn_zoo`` and every script in ``benchmarks/``.

`add_shared_flags` adds ``--out``, ``--threads``, ``--device``, ``--seed``,
``--splits`` and ``--retain-freed-memory``; `parse` parses and applies them, and is
the one place that sets torch's CPU thread count and glibc's policy for freed memory
(`retain_freed_memory`: settings of the whole process, which
a command line's process may choose and importing the package never changes).
`add_data_flag`, `add_entries_flag`, `add_fit_flags`,
`add_engine_flags` and `add_comparison_flags` add the flags of scripts that fit
zoo entries on data sets;
`budget_overrides` turns ``--steps`` into the keyword arguments of ``entry.fit``;
`add_net_flag` adds ``--net`` and `network` gives the networks it names, one
per data set.

Every value is checked while parsing, before any work starts: numbers by the argparse
types `int_at_least`, `positive_int`, `random_seed` and
`positive_float`, ``--device`` by `torch_device` (a device this machine has),
data sets and zoo entries by name (`dataset_name`, `entry_name`), and
``--out`` by `check_writable`. A bad value is answered
as argparse answers one: the usage, a line naming the flag, exit code 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import torch

from bnn_zoo import zoo
from bnn_zoo._core import data as data_module
from bnn_zoo._core.checks import check_device, check_positive_int
from bnn_zoo._core.lr_schedule import LR_SCHEDULES
from bnn_zoo._harness.memory import retain_freed_memory
from bnn_zoo._harness.outputs import check_writable
from bnn_zoo._harness.summary import REFERENCE

__all__ = ["AUTO", "SHARED_FLAGS", "add_comparison_flags", "add_data_flag", "add_engine_flags",
           "add_entries_flag", "add_fit_flags", "add_net_flag", "add_shared_flags", "apply",
           "budget_overrides", "dataset_name", "entry_name", "int_at_least", "network", "parse",
           "positive_float", "positive_int", "random_seed", "reference_entry", "set_threads",
           "torch_device"]

#: ``--reference auto``: the bundled reference where one matches (`bnn_zoo._harness.bundled`).
AUTO = "auto"
SHARED_FLAGS = ("out", "threads", "device", "seed", "splits", "retain_freed_memory")
#: The largest seed + 1 (``pyro.set_rng_seed`` seeds numpy, which takes 32 bits).
SEED_LIMIT = 2**32


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer ``low <= n`` (``< high`` when given)."""
    expected = f"an integer >= {low}" + ("" if high is None else f" and < {high}")

    def integer(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < low or (high is not None and value >= high):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return integer


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return int_at_least(1)(text)


def random_seed(text: str) -> int:
    """An argparse type: a random seed, an integer in ``[0, 2**32)``."""
    return int_at_least(0, SEED_LIMIT)(text)


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def torch_device(text: str) -> torch.device:
    """An argparse type: a ``torch.device`` this machine has (``cpu``, ``cuda``, ``cuda:N``)."""
    try:
        device = check_device("--device", text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if device.type == "meta":
        raise argparse.ArgumentTypeError("expected a device that holds data (cpu, cuda), got "
                                         "'meta', which holds shapes without values")
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and device.index is not None and device.index >= count:
        raise argparse.ArgumentTypeError(f"expected a CUDA device index below {count} (the "
                                         f"GPUs of this machine), got {text!r}")
    return device


def dataset_name(text: str) -> str:
    """An argparse type: a name [`bnn_zoo._core.data.load`][] accepts; a bare UCI name
    (``yacht``) becomes ``uci/yacht``."""
    name = f"uci/{text}" if text in data_module.UCI_SETS else text
    try:
        return data_module.check_name(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def entry_name(text: str) -> str:
    """An argparse type: the name of a zoo entry (see ``python -m bnn_zoo list``)."""
    try:
        zoo.get(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _entry_or_all(text: str) -> str:
    return "all" if text.lower() == "all" else entry_name(text)


def _reference(text: str) -> str | None:
    """A ``--reference``: an entry, ``none`` (``None``) or `AUTO`."""
    return None if text.lower() == "none" else AUTO if text.lower() == AUTO else entry_name(text)


class _Requested(argparse.Action):
    """Store the values and add the zoo entries among them to ``args.requested``: the
    entries asked for by name, whose skipped runs count as failures."""

    def __call__(self, parser, namespace, values, option_string=None):
        # ``--entries all`` is stored as ``None``: every entry supporting the task.
        setattr(namespace, self.dest, None if values == ["all"] else values)
        names = values if isinstance(values, list) else [values]
        asked = [n for n in names if n not in (None, "all", AUTO)]
        namespace.requested = list(dict.fromkeys([*getattr(namespace, "requested", []), *asked]))


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
        parser.add_argument("--threads", type=positive_int, default=threads,
                            help=f"torch CPU threads (default: {threads or 'chosen by torch'})")
    if "device" not in without:
        parser.add_argument("--device", type=torch_device, default=device,
                            help=f"cpu, cuda or cuda:N (default: "
                                 f"{device or 'chosen by the script'})")
    if "seed" not in without:
        parser.add_argument("--seed", type=random_seed, default=seed,
                            help=f"random seed; a comparison fits split k with seed + k "
                                 f"(default: {seed})")
    if "splits" not in without:
        parser.add_argument("--splits", type=positive_int, default=splits,
                            help=f"train/test splits 0..N-1 of each data set, capped at the "
                                 f"data set's number of splits (default: {splits})")
    if "retain_freed_memory" not in without:
        parser.add_argument("--retain-freed-memory", action="store_true",
                            help="make glibc keep freed memory for reuse: faster CPU steps on "
                                 "large tensors (replicas), for this process (default: glibc's "
                                 "own policy)")
    return parser


def set_threads(threads: int | None) -> None:
    """Set torch's CPU thread count (``None``: leave torch's choice). The harness and the
    benchmarks set it here and nowhere else."""
    if threads is not None:
        torch.set_num_threads(check_positive_int("threads", threads))


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
          ) -> argparse.Namespace:
    """Parse ``argv`` (the types check every value; ``--device`` becomes a
    ``torch.device``), check that ``--out`` can be written and apply ``--threads``; a bad
    value exits through ``parser.error`` (usage, one line naming the flag, exit code 2)."""
    args = parser.parse_args(argv)
    try:
        return apply(args)
    except (ValueError, TypeError) as error:
        parser.error(str(error))


def apply(args: argparse.Namespace) -> argparse.Namespace:
    """Check that ``args.out`` (if any) can be written, creating nothing, and apply
    ``args.threads`` and ``args.retain_freed_memory``; ``ValueError`` naming the flag
    otherwise (``--retain-freed-memory`` where the C library is not glibc)."""
    if getattr(args, "out", None) is not None:
        check_writable("--out", args.out)
    set_threads(getattr(args, "threads", None))
    if getattr(args, "retain_freed_memory", False) and not retain_freed_memory():
        raise ValueError("--retain-freed-memory needs glibc's malloc, and this process's C "
                         "library is not glibc.")
    return args


def add_data_flag(parser: argparse.ArgumentParser, default: Sequence[str],
                  choices: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """``--data`` (also ``--datasets``): the data sets to run on (see `dataset_name`)."""
    parser.add_argument("--data", "--datasets", nargs="+", default=list(default), dest="data",
                        type=dataset_name, choices=choices,
                        help=f"data sets (default: {' '.join(default)}; "
                             f"`{data_module.LIST_COMMAND}` lists them)")
    return parser


def add_entries_flag(parser: argparse.ArgumentParser, default: Sequence[str] | None
                     ) -> argparse.ArgumentParser:
    """``--entries``: zoo entries; ``None`` (or ``--entries all``) means every entry that
    supports the data's task. The entries named on the command line are also kept in
    ``args.requested``."""
    every = "every entry supporting the task"
    parser.set_defaults(requested=[])
    parser.add_argument("--entries", nargs="+", default=None if default is None else list(default),
                        type=_entry_or_all, action=_Requested,
                        help=f"zoo entries, or 'all' for {every} (default: "
                             f"{every if default is None else ' '.join(default)})")
    return parser


def add_fit_flags(parser: argparse.ArgumentParser, *, steps: int | None = None,
                  num_samples: int = 200) -> argparse.ArgumentParser:
    """``--steps`` (every entry's training steps; default the entry's own budget),
    ``--lr-schedule`` (every fit's learning-rate schedule; default the entry's own) and
    ``--num-samples`` (posterior samples per prediction)."""
    parser.add_argument("--steps", type=positive_int, default=steps,
                        help=f"training steps of every fit (default: "
                             f"{steps or 'the budget of each entry'})")
    parser.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=None,
                        help="learning-rate schedule of every fit (default: the budget of "
                             "each entry)")
    parser.add_argument("--num-samples", type=positive_int, default=num_samples,
                        help=f"posterior samples per prediction (default: {num_samples})")
    return parser


def add_comparison_flags(parser: argparse.ArgumentParser, *, data: Sequence[str] = ("sine",),
                         out: str = "results/compare", splits: int = 1,
                         reference: str | None = None, entries: Sequence[str] | None = None,
                         threads: int | None = None) -> argparse.ArgumentParser:
    """The flags of a comparison (``python -m bnn_zoo compare`` and the scripts built on
    `bnn_zoo._harness.compare.run_comparison`): the shared flags, ``--data``,
    ``--entries``, ``--steps``, ``--num-samples``, ``--reference``, ``--replicas``, and
    ``--jobs`` or ``--scheduler`` (`add_engine_flags`)."""
    add_data_flag(parser, data)
    add_entries_flag(parser, entries)
    add_fit_flags(parser)
    parser.add_argument("--reference", default=reference, type=_reference, action=_Requested,
                        help=f"reference entry to measure distances to, e.g. {REFERENCE} "
                             f"(sampled, or read from this comparison's cache), {AUTO} (the "
                             f"bundled {REFERENCE} reference where one matches the run, none "
                             f"elsewhere), or none (default: {reference})")
    parser.add_argument("--replicas", choices=("auto", "on", "off"), default="auto",
                        help="fit the splits of a data set together as replicas in one pass: "
                             "where the entry can and there are several (auto, the default), "
                             "for every entry, even one split, or fail (on), never (off)")
    add_engine_flags(parser)
    return add_shared_flags(parser, out=out, splits=splits, threads=threads)


def add_engine_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--jobs J`` (a local Dask cluster of ``J`` single-threaded worker processes; 1: this
    process) or ``--scheduler ADDRESS`` (a running Dask cluster): where the (entry, data
    set) batches of a comparison run (`bnn_zoo._harness.sweep.run_batches`)."""
    engine = parser.add_mutually_exclusive_group()
    engine.add_argument("--jobs", type=positive_int, default=1,
                        help="worker processes of a local Dask cluster, each fitting whole "
                             "(entry, data set) batches with --threads threads (default: 1, "
                             "in this process; more needs bnn-zoo[cluster])")
    engine.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="address of a running Dask scheduler (e.g. "
                             "tcp://10.0.0.1:8786) whose workers run the batches (needs "
                             "bnn-zoo[cluster])")
    return parser


def add_cached_only_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--cached-only``: fit nothing; write the tables from the cached runs, listing the
    missing ones as not run (``run_comparison(cached_only=True)``)."""
    parser.add_argument("--cached-only", action="store_true",
                        help="fit nothing: write the tables from the cached runs, listing the "
                             "missing ones as not run")
    return parser


def add_net_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--net``: ``mlp`` (each entry's own model) or a name of
    `bnn_zoo.zoo.NETWORK_CHOICES`: the bundled network for each data set, that every
    entry taking one fits in its place."""
    parser.add_argument("--net", default="mlp", choices=["mlp", *zoo.NETWORK_CHOICES],
                        help="mlp: each entry's own model; cnn: a small CNN for the data set "
                             "(digits: bnn_zoo.models.digits_cnn, mnist1d: "
                             "bnn_zoo.zoo.NETWORKS['mnist1d_cnn']) in its place, for the "
                             "entries that take a network (default: mlp)")
    return parser


def network(args: argparse.Namespace) -> dict[str, zoo.NamedNetwork] | None:
    """The networks ``--net`` names, by data set (``None`` for ``mlp`` or without the
    flag)."""
    name = getattr(args, "net", "mlp")
    return None if name == "mlp" else zoo.NETWORK_CHOICES[name]


def reference_entry(args: argparse.Namespace) -> str | None:
    """The entry ``--reference`` names: `REFERENCE` for `AUTO` (read from the bundled
    references where one matches), ``None`` for ``none``."""
    return REFERENCE if args.reference == AUTO else args.reference


def budget_overrides(args: argparse.Namespace) -> dict:
    """The budget keywords of ``entry.fit`` that the flags ask for (``--steps``,
    ``--lr-schedule``)."""
    overrides = {} if args.steps is None else {"steps": check_positive_int("steps", args.steps)}
    if getattr(args, "lr_schedule", None) is not None:
        overrides["lr_schedule"] = args.lr_schedule
    return overrides
