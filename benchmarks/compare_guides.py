"""Compare the zoo's guides on small data sets, against the HMC reference.

Runs the chosen zoo entries (default: every entry that supports the data's task)
on the chosen data sets and splits, plus the ``hmc`` reference on the same
splits, and writes under ``--out``: ``compare.md`` (mean ± standard error over
splits of test RMSE, log-likelihood, 90% coverage, the mean 2-Wasserstein distance
of each predictive to the reference's and the log-likelihood gap, fit time and SVI steps
per second; for classification accuracy, NLL, ECE, Brier, the predictive entropy and its
mutual information, the agreement of the predicted classes with the reference's and the
total variation to its predictive), ``compare.csv``, ``compare.json``,
``reference.md``/``.csv``/``.json`` (the distances to the reference and its split R-hat
and effective sample size over the predictive at the test inputs and over the weights, and
whether it passes the convergence gate, split by split and over all splits: nothing is
measured against a split that fails it), and figures (predictive bands side by side for 1-D data,
reliability diagrams, ELBO curves). Finished runs
are cached in ``--out/runs``.

The UCI sets (``uci/yacht``, ...) run under the protocol of ``benchmarks/uci.py``
(:func:`bnn_zoo._harness.compare.data_overrides`): one hidden layer of 50 units (100 on
protein), standardisation inside ``entry.fit``, the data's own splits (split ``k`` with
seed ``k``), and the noise of every entry with a single learned noise scale tuned on 10%
of the training split (``--validation``).

    python benchmarks/compare_guides.py --data sine gap --splits 3
    python benchmarks/compare_guides.py --data two_moons --reference none
    python benchmarks/compare_guides.py --data uci/yacht uci/bostonHousing --splits 3 \\
        --entries map mean_field bbb laplace ensemble --out /tmp/uci_reference
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bnn_zoo._harness import compare, flags
from bnn_zoo._harness.summary import REFERENCE


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_comparison_flags(parser, data=("sine", "gap"), out="results/compare_guides",
                               reference=REFERENCE)
    parser.add_argument("--validation", type=float, default=None,
                        help="share of the training split on which entries with a single "
                             "learned noise scale tune it (default: the UCI protocol's "
                             f"{compare.UCI_VALIDATION} on UCI sets, 0 on the others)")
    args = flags.parse(parser, argv)
    if args.validation is not None and not 0.0 <= args.validation < 1.0:
        parser.error(f"--validation must be in [0, 1), got {args.validation}")
    return compare.run_from_args(args, validation=args.validation)


if __name__ == "__main__":
    main()
