"""The command line: ``python -m bnn_zoo {list,datasets,fit,compare,priors,stale,tables}`` (also
``bnn-zoo``).

* ``list``: the zoo's entries with their tasks, source documents and descriptions;
* ``datasets``: every data set ``--data`` takes, with its task and a line on it;
* ``fit --entry NAME --data NAME``: fit one entry on one split, print its test metrics
  and, with ``--out``, write them as ``<entry>_<data>_split<k>.md/.csv/.json``;
* ``compare``: fit several entries on a data set and print a Markdown table of the
  metrics with time (mean ± standard error over splits), writing CSV/JSON and
  figures (predictive bands for 1-D data) under ``--out``; with no flags it runs
  `QUICK_ENTRIES` on ``sine``, with ``--entries all`` every entry of the task
  (see `bnn_zoo._harness.compare`); ``--net cnn`` (with ``--data digits`` or
  ``mnist1d``) fits a small CNN in place of each entry's MLP, by default with `NET_ENTRIES`;
* ``priors``: prior diagnostics, the Gaussian limit and the unit tails (see
  `bnn_zoo._harness.prior_command`);
* ``stale PATH...``: the cells of results folders or files whose runs other code than the
  checkout's made (see `bnn_zoo._harness.stale`); exit code 1 when there are any;
* ``tables [--check]``: rewrite the tables of the README and the docs from the results
  files they name (with ``--check``, write nothing and exit 1 if one differs).

Every command takes the shared flags of `bnn_zoo._harness.flags` that apply to it;
every value and every output path is checked before any work starts. Exit codes:

* 0: everything asked for ran;
* 1: a run failed, or an entry asked for by name (``fit --entry``, ``compare --entries``,
  ``--reference``) declined the problem (a run that an entry of ``--entries all`` or of
  the default list declines is no failure); the tables are written all the same;
* 2: bad input (a bad flag, an unknown entry or data set, a results path that cannot be
  written, missing data files): argparse's usage and one line naming the culprit, or one
  line ``python -m bnn_zoo: error: ...`` without a traceback (``--debug`` shows it);
* 130: interrupted (Ctrl-C); finished runs of a comparison stay cached.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from bnn_zoo import zoo
from bnn_zoo._core import data as data_module
from bnn_zoo._core.tasks import TASKS
from bnn_zoo._harness import compare, flags, prior_command, readme_tables, stale
from bnn_zoo._harness.outputs import check_writable
from bnn_zoo._harness.provenance import run_columns, versions
from bnn_zoo._harness.runs import run_one
from bnn_zoo._harness.tables import write_tables

__all__ = ["NET_ENTRIES", "QUICK_ENTRIES", "build_parser", "main", "run_command"]

#: What ``compare`` runs without ``--entries``: one entry per family that fits ``sine`` in
#: seconds, so the README's first command finishes in a minute or two on 2 CPU cores.
QUICK_ENTRIES = ("map", "mean_field", "bbb", "laplace", "nngp")
#: What ``compare --net cnn`` runs without ``--entries``: the guides of the comparison that
#: take a network (an entry that does not is skipped, with the reason in the table).
NET_ENTRIES = ("map", "mean_field", "mean_field_clf", "bbb", "lowrank", "laplace", "ensemble")
PROG = "python -m bnn_zoo"
#: Errors that are the user's (bad values, paths, data files): one line, exit code 2.
USER_ERRORS = (ValueError, TypeError, OSError)


def _list(args: argparse.Namespace) -> int:
    rows = [(name, zoo.get(name)) for name in zoo.names(args.task)]
    width = max((len(n) for n, _ in rows), default=5)
    print(f"{'entry':<{width}}  {'tasks':<27}  description; paper")
    for name, entry in rows:
        tasks = ",".join(entry.tasks)
        print(f"{name:<{width}}  {tasks:<27}  {entry.description}")
        if entry.source is not None:
            print(f"{'':<{width}}  {'':<27}  {entry.source}")
    return 0


def _datasets(args: argparse.Namespace) -> int:
    rows = [row for row in data_module.catalogue() if args.task in (None, row[1])]
    width = max(len(name) for name, _, _ in rows)
    print(f"{'data set':<{width}}  {'task':<14}  description")
    for name, task, description in rows:
        print(f"{name:<{width}}  {task:<14}  {description}")
    return 0


def _fit(args: argparse.Namespace) -> int:
    name = f"{args.entry}_{args.data.replace('/', '_')}_split{args.split}"
    if args.out is not None:
        check_writable("--out", args.out, files=[f"{name}{s}" for s in (".md", ".csv", ".json")])
    dataset = data_module.load(args.data, args.split).to(args.device)
    record = run_one(args.entry, dataset, split=args.split, seed=args.seed,
                     overrides=flags.budget_overrides(args), num_samples=args.num_samples)
    if record["status"] != "ok":
        print(f"{PROG}: {args.entry} on {args.data}: {record['status']}: {record['reason']}",
              file=sys.stderr)
        return 1
    shown = {**record["metrics"], **record["diagnostics"]}
    print(f"{args.entry} on {args.data} (split {args.split}, seed {args.seed}):")
    for key, value in shown.items():
        print(f"  {key:<18} {value:.4g}")
    if args.out is not None:
        keys = ("entry", "data", "split", "seed")
        write_tables(args.out, name, [{**{k: record[k] for k in keys}, **shown}], keys=keys,
                     columns=list(shown), runs=[record],
                     provenance=versions([run_columns(record)]))
        print(f"Wrote {args.out / name}.md, .csv, .json")
    return 0


def _compare(args: argparse.Namespace) -> int:
    named = args.entries is None or any(e in args.requested for e in args.entries)
    if args.net != "mlp" and not named:
        args.entries = list(NET_ENTRIES)
    records = compare.run_from_args(args)
    failed = compare.failures(records, args.requested)
    for r in failed:
        print(f"{PROG}: {r['entry']} on {r['data']} split {r['split']}: {r['status']}: "
              f"{r['reason']}", file=sys.stderr)
    return int(bool(failed))


def _priors(args: argparse.Namespace) -> int:
    prior_command.run(args)
    return 0


def _stale(args: argparse.Namespace) -> int:
    return stale.run(args.paths)


def _tables(args: argparse.Namespace) -> int:
    return readme_tables.rewrite(args.files, args.root.resolve(), args.check)


def build_parser() -> argparse.ArgumentParser:
    """The ``bnn_zoo`` argument parser with its ``list``, ``datasets``, ``fit``, ``compare``,
    ``priors``, ``stale`` and ``tables`` commands."""
    parser = argparse.ArgumentParser(prog=PROG,
                                     description="A Pyro model zoo for Bayesian neural networks.")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="list the zoo's entries")
    listing.add_argument("--task", choices=TASKS, default=None)
    listing.set_defaults(run=_list)
    datasets = commands.add_parser("datasets", help="list the data sets, with their tasks")
    datasets.add_argument("--task", choices=TASKS, default=None)
    datasets.set_defaults(run=_datasets)

    fitting = commands.add_parser("fit", help="fit one entry on one data split, print metrics")
    fitting.add_argument("--entry", required=True, type=flags.entry_name,
                         help="zoo entry (see `list`)")
    fitting.add_argument("--data", required=True, type=flags.dataset_name,
                         help=f"data set (see `{data_module.LIST_COMMAND}`)")
    fitting.add_argument("--split", type=flags.int_at_least(0), default=0)
    flags.add_fit_flags(fitting)
    flags.add_shared_flags(fitting, out=None, without=("splits",))
    fitting.set_defaults(run=_fit)

    comparing = commands.add_parser("compare", help="compare entries on a data set")
    flags.add_comparison_flags(comparing, entries=QUICK_ENTRIES, reference=flags.AUTO)
    flags.add_net_flag(comparing)
    comparing.set_defaults(run=_compare)

    prior_command.add_parser(commands).set_defaults(run=_priors)
    listing_stale = commands.add_parser(
        "stale", help="list the cells of results whose runs other code made")
    listing_stale.add_argument("paths", nargs="+", metavar="PATH",
                               help="results folder (searched recursively) or results JSON")
    listing_stale.set_defaults(run=_stale)
    tables = commands.add_parser(
        "tables", help="rewrite the generated tables of the README and the docs from their "
                       "results files")
    tables.add_argument("files", nargs="*", type=Path,
                        help="Markdown files (default: README.md and docs/**/*.md of --root)")
    tables.add_argument("--root", type=Path, default=Path("."),
                        help="the repository: marker paths are relative to it")
    tables.add_argument("--check", action="store_true",
                        help="exit 1 if a table differs from its source; write nothing")
    tables.set_defaults(run=_tables)
    for command in commands.choices.values():
        # SUPPRESS: without --debug after the command, the one before it holds.
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the traceback of an error")
    return parser


def run_command(prog: str, command: Callable[[], object], debug: bool = False) -> int:
    """Run ``command`` and return its exit code: what it returns where that is an int, else
    0; for a user's error (`USER_ERRORS`: a bad value, a path that cannot be written,
    a results file that cannot be read) one line ``<prog>: error: ...`` on standard error
    (with ``debug``, the traceback first) and 2; when interrupted (Ctrl-C), 130."""
    try:
        code = command()
    except USER_ERRORS as error:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return code if isinstance(code, int) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m bnn_zoo`` and the ``bnn-zoo`` script; returns the exit
    code (see the module's docstring)."""
    try:
        args = flags.parse(build_parser(), argv)
    except SystemExit as stop:  # argparse's answer to bad flags (2) or --help (0)
        return stop.code if isinstance(stop.code, int) else 2
    return run_command(PROG, lambda: args.run(args), args.debug)
