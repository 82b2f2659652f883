"""Compare the zoo's guides on small data sets, against a NUTS reference.

Runs the chosen zoo entries (default: every entry that supports the data's task)
on the chosen data sets and splits, plus the ``nuts`` reference on the same
splits, and writes under ``--out``: ``compare.md`` (mean ± standard error over
splits of test RMSE, log-likelihood, 90% coverage, the mean 2-Wasserstein distance
of each predictive to NUTS's and the log-likelihood gap, fit time and SVI steps per
second; accuracy/NLL/ECE/Brier for classification), ``compare.csv``,
``compare.json``, and figures (predictive bands side by side for 1-D data,
reliability diagrams, ELBO curves). Finished runs are cached in ``--out/runs``.

    python benchmarks/compare_guides.py --data sine gap --splits 3
    python benchmarks/compare_guides.py --data two_moons --reference none
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bnn_zoo.harness import compare, flags
from bnn_zoo.harness.summary import REFERENCE


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_comparison_flags(parser, data=("sine", "gap"), out="results/compare_guides",
                               reference=REFERENCE)
    return compare.run_from_args(flags.parse(parser, argv))


if __name__ == "__main__":
    main()
