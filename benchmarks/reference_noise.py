"""The reference's noise as a measured choice: ``hmc`` on every split with the regression
noise (a) fixed at the full-batch MAP's (``MapNoise``), (b) fixed at the value tuned on
held-out points (``HeldOutNoise``, the entry's), (c) sampled with the weights under
``HalfNormal(--prior-scale)`` (``SampledNoise``), (d) one per input (a heteroscedastic
output), each with its test log-likelihood and RMSE, its gate (``ConvergenceGate``) and its
noise scale (none for (c) and (d), whose noise is not one number).

Writes ``reference_noise.md``, ``.csv`` and ``.json`` (per data set and choice, the mean
and standard error over the splits, and how many splits pass the gate; the JSON keeps every
run), after every fit, so a study that stops keeps what it measured.

    python benchmarks/reference_noise.py --data yacht bostonHousing --splits 3 --threads 2 \\
        --out benchmarks/results/reference_noise

``--noise`` fits some of the choices only, and ``--max-leapfrog`` (with ``--warmup``,
``--samples`` and ``--chains``) changes the sampler, to see what a split that fails the
gate needs.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bnn_zoo import data, zoo
from bnn_zoo._harness import flags
from bnn_zoo._harness.compare import split_indices
from bnn_zoo._harness.summary import GATE, aggregate
from bnn_zoo._harness.tables import write_tables
from bnn_zoo.methods import HeldOutNoise, MapNoise, SampledNoise

COLUMNS = ("ll", "rmse", "noise_scale", "r_hat_pred_max", "ess_pred_min", "leapfrog_steps",
           "fit_seconds", "gates")


def choices(prior_scale: float) -> dict[str, dict]:
    """The noise choices, as the options of ``zoo.get("hmc").fit``."""
    return {"map": {"method_options": {"noise": MapNoise()}},
            "held_out": {"method_options": {"noise": HeldOutNoise()}},
            "sampled": {"method_options": {"noise": SampledNoise(prior_scale)}},
            "heteroscedastic": {"model_options": {"noise": "heteroscedastic"}}}


#: ``hmc``'s sampler settings that a flag sets (``max_leapfrog``: ``--max-leapfrog``).
SAMPLER_SETTINGS = {"warmup": "warm-up iterations", "samples": "draws per chain",
                    "chains": "chains", "max_leapfrog": "most leapfrog steps an iteration"}


def add_sampler_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for each of `SAMPLER_SETTINGS` (default: the entry's)."""
    for name, what in SAMPLER_SETTINGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=flags.positive_int,
                            default=None, help=f"hmc's {what} (default: the entry's)")


def sampler_options(args: argparse.Namespace) -> dict:
    """The ``method_options`` of ``hmc`` that the sampler flags set."""
    return {k: getattr(args, k) for k in SAMPLER_SETTINGS if getattr(args, k) is not None}


def run(name: str, split: int, noise: str, options: dict, sampler: dict, steps: int | None
        ) -> dict:
    """One ``hmc`` fit of split ``split`` of ``name`` with the noise choice ``options``."""
    dataset = data.load(name, split=split)
    method_options = {**sampler, **options.get("method_options", {})}
    started = time.perf_counter()
    fitted = zoo.get("hmc").fit(dataset.x_train, dataset.y_train, seed=split, progress=False,
                                method_options=method_options,
                                model_options=options.get("model_options"),
                                **({} if steps is None else {"steps": steps}))
    seconds = time.perf_counter() - started
    metrics = fitted.evaluate(dataset.x_test, dataset.y_test)
    diagnostics = fitted.diagnostics_at(dataset.x_test)
    failures = GATE.failures(diagnostics)
    return {"data": name, "noise": noise, "split": split, "ll": metrics["ll"],
            "rmse": metrics["rmse"], "noise_scale": diagnostics.get("noise_scale", math.nan),
            "r_hat_pred_max": diagnostics["r_hat_pred_max"],
            "ess_pred_min": diagnostics["ess_pred_min"],
            "leapfrog_steps": diagnostics["leapfrog_steps"], "fit_seconds": seconds,
            "gates": "; ".join(failures) or "pass"}


def write(out: Path, runs: list[dict]) -> str:
    """The tables of the runs so far (written after every fit, so a long study that stops
    keeps what it measured); returns the Markdown."""
    summary = aggregate(runs, ("data", "noise"), ignore=("split", "gates"))
    for row in summary:
        gated = [r["gates"] for r in runs if (r["data"], r["noise"]) == (row["data"],
                                                                         row["noise"])]
        row["gates"] = f"{gated.count('pass')}/{len(gated)} pass"
    return write_tables(out, "reference_noise", summary, keys=("data", "noise"),
                        section="data", columns=COLUMNS, runs=runs)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_shared_flags(parser, out="results/reference_noise", splits=3,
                           without=("seed", "retain_freed_memory"))
    flags.add_data_flag(parser, default=("uci/yacht",))
    parser.add_argument("--prior-scale", type=float, default=1.0,
                        help="the HalfNormal scale of the sampled noise (default: 1)")
    add_sampler_flags(parser)
    parser.add_argument("--noise", nargs="+", choices=tuple(choices(1.0)), default=None,
                        help="the noise choices to fit (default: all four)")
    parser.add_argument("--steps", type=flags.positive_int, default=None,
                        help="steps of the MAP start (default: the entry's)")
    args = flags.parse(parser, argv)
    sampler = sampler_options(args)
    chosen = {noise: options for noise, options in choices(args.prior_scale).items()
              if args.noise is None or noise in args.noise}
    runs = []
    for name in args.data:
        for split in split_indices(name, args.splits):
            for noise, options in chosen.items():
                runs.append(run(name, split, noise, options, sampler, args.steps))
                print(f"[ok] {noise} on {name} split {split}: {runs[-1]['fit_seconds']:.0f} s, "
                      f"{runs[-1]['gates']}", file=sys.stderr, flush=True)
                markdown = write(args.out, runs)
    print(markdown)
    return runs


if __name__ == "__main__":
    main()
