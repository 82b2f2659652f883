"""Sample the HMC reference that ``python -m bnn_zoo compare`` measures every guide against,
and bundle it with the package.

Runs the ``hmc`` entry as the default comparison runs its reference (the same options,
predictive samples, quantile levels and split seeds), writes its tables under ``--out``
(``reference.md``: its R-hat, effective sample size and divergences over the predictive at
the test inputs, and whether it passes the convergence gate) and every finished split as
``bnn_zoo/_harness/references/hmc_<data>_split<k>_seed<s>.json``
(`bnn_zoo._harness.bundled.bundle`), with the model's log joint at three weight vectors
that the tests compare with today's model. A split that fails the gate is not bundled.

    python benchmarks/bundle_reference.py --threads 2 --out benchmarks/results/bundled_reference
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from bnn_zoo._core import data as data_module
from bnn_zoo._harness import compare, flags
from bnn_zoo._harness.bundled import bundle
from bnn_zoo._harness.summary import GATE, REFERENCE


def main(argv: Sequence[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_comparison_flags(parser, data=("sine",), entries=(REFERENCE,),
                               reference=REFERENCE, out="results/bundled_reference")
    args = flags.parse(parser, argv)
    if args.entries != [REFERENCE] or args.reference != REFERENCE:
        parser.error(f"Expected --entries {REFERENCE} and --reference {REFERENCE}: the bundle "
                     "holds the default comparison's reference.")
    # The bundle's check is the log joint at a fixed noise scale: regression only.
    others = [d for d in args.data if data_module.load(d).task != "regression"]
    if others:
        parser.error(f"argument --data: expected regression data sets, whose bundle keeps the "
                     f"log joint at the reference's noise scale, got {', '.join(others)}.")
    paths = []
    for record in compare.run_from_args(args):
        failures = GATE.failures(record.get("diagnostics", {}))
        if record["status"] != "ok" or failures:
            print(f"Not bundled: {record['data']} split {record['split']} "
                  f"({record.get('reason') or '; '.join(failures)})")
            continue
        paths.append(bundle(record, data_module.load(record["data"], record["split"])))
        print(f"Wrote {paths[-1]}")
    return paths


if __name__ == "__main__":
    main()
