"""Bayes by Backprop under three weight priors, side by side.

For each network (``seed_1-3-1_sigmoid``: the worked example of Thakur's notes on Blundell
et al. 2015, one hidden layer of 3 sigmoid units; ``bbb_1-50-1_relu``: the ``bbb`` entry's
own net) and each prior
(``gaussian_0.05``: the notes' ``N(0, 0.05^2)``; ``gaussian_1``: ``N(0, 1)``, the entry's
default; ``scale_mixture``: Blundell et al.'s ``1/2 N(0, 1) + 1/2 N(0, e^-12)``,
:class:`~bnn_zoo.models.ScaleMixturePrior`), the ``bbb`` entry is fitted on ``sine`` (the
notes' curve) with its own budget, split ``k`` with seed ``--seed + k``: test
log-likelihood per point, RMSE, 90% coverage and fit seconds, mean ± standard error over
``--splits``. Writes ``bbb_priors.md``, ``.csv`` and ``.json`` under ``--out``.

    python benchmarks/bbb_priors.py --out benchmarks/results/bbb_priors
    python benchmarks/bbb_priors.py --steps 20 --num-samples 10 --out /tmp/bbb   # seconds
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import pyro

from bnn_zoo import data, zoo
from bnn_zoo._harness import flags
from bnn_zoo._harness.compare import split_indices
from bnn_zoo._harness.summary import aggregate
from bnn_zoo._harness.tables import run_line, write_tables
from bnn_zoo.models import GaussianPrior, ScaleMixturePrior

PRIORS = {"gaussian_0.05": GaussianPrior(0.05), "gaussian_1": GaussianPrior(1.0),
          "scale_mixture": ScaleMixturePrior()}
NETS = {"seed_1-3-1_sigmoid": {"hidden": (3,), "activation": "sigmoid"},
        "bbb_1-50-1_relu": {"hidden": (50,), "activation": "relu"}}
METRICS = ("ll", "rmse", "coverage_90", "fit_seconds")


def run(dataset: str, split: int, net: str, prior: str, args: argparse.Namespace) -> dict:
    """One ``bbb`` fit of ``net`` under ``prior`` and its test metrics."""
    d = data.load(dataset, split).to(args.device)
    fitted = zoo.get("bbb").fit(d.x_train, d.y_train, seed=args.seed + split,
                                model_options={**NETS[net], "prior": PRIORS[prior]},
                                **flags.budget_overrides(args))
    out = fitted.evaluate(d.x_test, d.y_test, num_samples=args.num_samples)
    return {"data": dataset, "net": net, "prior": prior, "split": split,
            **{k: out[k] for k in METRICS}}


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_data_flag(parser, ("sine",), choices=("sine", "gap"))
    parser.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    parser.add_argument("--priors", nargs="+", default=list(PRIORS), choices=list(PRIORS))
    flags.add_fit_flags(parser)
    flags.add_shared_flags(parser, out="results/bbb_priors", threads=1, splits=1)
    args = flags.parse(parser, argv)
    pyro.set_rng_seed(args.seed)
    rows = []
    for dataset in args.data:
        for split in split_indices(dataset, args.splits):
            for net in args.nets:
                for prior in args.priors:
                    rows.append(run(dataset, split, net, prior, args))
                    print(run_line(rows[-1]), flush=True)
    keys = ("data", "net", "prior")
    summary = aggregate(rows, keys, ignore=("split",))
    steps = "its budget's steps" if args.steps is None else f"{args.steps} steps"
    preamble = (f"`bbb` entry, {steps}; {args.num_samples} posterior samples per prediction; seeds "
                f"{args.seed}..{args.seed + args.splits - 1}.")
    print(write_tables(args.out, "bbb_priors", summary, keys=keys, columns=METRICS, runs=rows,
                       preamble=preamble))
    return rows


if __name__ == "__main__":
    main()
