"""Re-run the committed results: the command behind every folder of ``benchmarks/results``.

:data:`RESULTS` names, for each committed folder, the commands that write it (run from the
repository root, each with today's code) and what kind of run it is:

* a *sweep* (a comparison over entries, data sets and splits, through
  :func:`bnn_zoo._harness.compare.run_comparison`): its numbers do not depend on the machine's
  load, so it takes ``--jobs`` and ``--scheduler`` and runs on every core or a cluster;
* a *timing* (``speed``, ``throughput``, ...): its numbers are wall times and ratios of them,
  so it runs alone, on an idle machine, with the threads its command sets;
* *other*: a single process whose numbers do not depend on the load.

``gpu`` and ``laplace_cnn_gpu`` are left out (:data:`ELSEWHERE`): they are written on a CUDA
machine.

    python benchmarks/reproduce.py --list                      # the folders and commands
    python benchmarks/reproduce.py uci uci_gap --jobs 2        # two folders, both cores
    python benchmarks/reproduce.py --all --jobs 2              # everything (many hours)
    python benchmarks/reproduce.py --all --dry-run             # print what would run

The commands run one after the other, a sweep's batches spread over ``--jobs`` local
workers or the cluster at ``--scheduler``; a command that fails is reported and the next
one runs. Each sweep resumes from its cache: a rerun of an interrupted reproduction fits
only what is missing (runs of other code than today's are refitted, never reused); a
sweep folder holding a ``checkpoint/`` folder (the finished runs of an unfinished sweep, carried
from another machine by ``benchmarks/checkpoint.py``) has it unpacked into its cache first.
The UCI folders need ``BNN_ZOO_DATA`` (see the getting-started page), ``mnist1d`` the
``mnist1d`` extra and ``laplace_torch`` the ``laplace-torch`` package.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bnn_zoo._harness import flags

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = "benchmarks/results"
#: A sweep's packed run cache, one file per data set (``benchmarks/checkpoint.py``),
#: unpacked before the sweep runs.
CHECKPOINT = "checkpoint"
KINDS = ("sweep", "timing", "other")
#: The regression entries measured against the reference (every one but ``hmc`` itself and
#: ``nuts``, five minutes a split that fail every gate).
FIDELITY_ENTRIES = ("bbb deep_ensemble ensemble fullrank iaf ivon laplace laplace_diag "
                    "laplace_ensemble laplace_full laplace_ggn laplace_kron laplace_last_layer "
                    "lowrank map mc_dropout mean_field mixture multiswag nngp nngp-erf "
                    "rff_logitnormal sghmc sgld swag")


@dataclass(frozen=True)
class Result:
    """A committed results folder (under :data:`RESULTS_DIR`), the commands that write it
    (arguments of ``python``; each ends with ``--out <folder>``) and their kind (one of
    :data:`KINDS`)."""

    folder: str
    commands: tuple[tuple[str, ...], ...]
    kind: str

    def argv(self, jobs: int, scheduler: str | None) -> list[list[str]]:
        """The full commands, a sweep's with ``--jobs`` or ``--scheduler``."""
        engine = (["--scheduler", scheduler] if scheduler is not None else
                  ["--jobs", str(jobs)] if jobs > 1 else [])
        return [[sys.executable, *command, *(engine if self.kind == "sweep" else [])]
                for command in self.commands]


def _result(folder: str, kind: str, *commands: str) -> Result:
    """A :class:`Result` of ``commands`` (each a string of arguments; ``--out`` appended)."""
    out = ("--out", f"{RESULTS_DIR}/{folder}")
    return Result(folder, tuple((*c.split(), *out) for c in commands), kind)


BENCH = "benchmarks"
#: The flags of a reference sampled split by split, two splits at a time on two cores.
SPLIT_BY_SPLIT = "--threads 1 --jobs 2 --replicas off --entries map"


def _reference_sweep(folder: str, data: str) -> Result:
    """The reference on every split of ``data`` (20), sampled split by split by
    ``bnn_zoo compare`` into ``folder``."""
    return _result(folder, "sweep",
                   f"-m bnn_zoo compare --data {data} --reference hmc --splits 20 "
                   f"{SPLIT_BY_SPLIT}")


def _reference_parts(folder: str, data: str, parts: dict[str, str]) -> tuple[Result, ...]:
    """A reference on ``data`` sampled in parts (``benchmarks/reference_sampler.py``): each
    part ``name -> split ids`` into ``folder/name``, then their merge into ``folder``
    (``benchmarks/merge_comparisons.py``)."""
    return (*(_result(f"{folder}/{name}", "sweep",
                      f"{BENCH}/reference_sampler.py --data {data} --split-ids {ids} "
                      f"{SPLIT_BY_SPLIT}") for name, ids in parts.items()),
            _result(folder, "other", f"{BENCH}/merge_comparisons.py " + " ".join(
                f"{RESULTS_DIR}/{folder}/{name}" for name in parts)))


#: The sets of the study of the learning-rate schedule (constant against cosine).
LR_STUDY_DATA = "uci/yacht uci/bostonHousing uci/energy uci/concrete"
#: Every committed folder and how it is written, the cheap ones first.
RESULTS: tuple[Result, ...] = (
    _result("priors", "other", "-m bnn_zoo priors --depth 4 --width 2"),
    _result("bbb_priors", "other", f"{BENCH}/bbb_priors.py"),
    _result("bbb_sine", "sweep",
            "-m bnn_zoo compare --entries bbb mean_field map --splits 3 --threads 1"),
    _result("bundled_reference", "other", f"{BENCH}/bundle_reference.py --threads 2"),
    _result("compare", "sweep", "-m bnn_zoo compare --threads 1"),
    _result("lr_schedule_constant", "sweep",
            f"{BENCH}/compare_guides.py --data {LR_STUDY_DATA} --entries map mean_field bbb "
            "--splits 5 --reference none --lr-schedule constant --threads 2"),
    _result("lr_schedule", "other",
            f"{BENCH}/compare_guides.py --data {LR_STUDY_DATA} --entries map mean_field bbb "
            "--splits 5 --reference none --threads 2",
            f"{BENCH}/moves.py {RESULTS_DIR}/lr_schedule/compare.json --old "
            f"{RESULTS_DIR}/lr_schedule_constant/compare.json --metrics ll rmse "
            "--name lr_schedule_moves"),
    _result("sine_reference", "sweep",
            f"{BENCH}/compare_guides.py --data sine --entries map mean_field bbb laplace "
            "ensemble lowrank nngp iaf mixture --threads 1"),
    _result("laplace", "other", f"{BENCH}/laplace_variants.py --data sine gap --splits 1"),
    _result("mixture", "other",
            f"{BENCH}/mixture.py --steps 1000 --eval-particles 8192 --grad-repeats 50"),
    _result("mixture_nuts", "other", f"{BENCH}/mixture_nuts.py"),
    _result("gate_floor", "other", f"{BENCH}/gate_floor.py"),
    _result("rff", "other", f"{BENCH}/rff.py --steps 800 --threads 1"),
    _result("nngp", "other", f"{BENCH}/nngp.py --splits 5 --threads 1"),
    _result("laplace_torch", "other", f"{BENCH}/laplace_torch.py --splits 10"),
    _result("classification_reference", "sweep",
            f"{BENCH}/compare_guides.py --data two_moons breast_cancer wine --splits 3 "
            "--threads 1 --jobs 2 --replicas off"),
    _result("compare_cnn", "sweep", "-m bnn_zoo compare --data digits --net cnn"),
    _result("compare_cnn_mnist1d", "sweep", "-m bnn_zoo compare --data mnist1d --net cnn"),
    _result("laplace_cnn", "other", f"{BENCH}/laplace_cnn.py --splits 2 --threads 1"),
    _result("classification", "sweep",
            f"{BENCH}/classification.py --data two_moons breast_cancer wine digits mnist1d "
            "--splits 5 --entries map ensemble mean_field mean_field_clf bbb lowrank fullrank "
            "iaf mixture laplace laplace_ggn laplace_full laplace_diag laplace_kron "
            "laplace_last_layer laplace_ensemble mc_dropout swag multiswag sgld sghmc nuts"),
    _result("uci_gap", "sweep",
            f"{BENCH}/uci.py --gap --data yacht energy --threads 1 --reference nuts"),
    _result("uci", "sweep", f"{BENCH}/uci.py --splits 20 --threads 1 --reference nuts"),
    _result("nngp_ard", "other",
            f"{BENCH}/uci.py --data yacht bostonHousing energy concrete --entries nngp nngp-erf "
            "--splits 20 --threads 1",
            f"{BENCH}/moves.py {RESULTS_DIR}/nngp_ard/uci_summary.json --since 1910f8c "
            f"--old-path {RESULTS_DIR}/uci/uci_summary.json --metrics ll rmse "
            "--name nngp_ard_moves"),
    _result("seed_spread", "sweep",
            f"{BENCH}/seed_spread.py --data uci/protein-tertiary-structure --entries map "
            "--splits 5 --threads 1"),
    _result("reference_noise", "other",
            f"{BENCH}/reference_noise.py --data uci/yacht --splits 3 --samples 1000 --threads 2"),
    _result("reference_energy_leapfrog", "other",
            f"{BENCH}/reference_noise.py --data uci/energy --splits 1 --threads 1 --noise held_out "
            "--max-leapfrog 1024"),
    _result("reference_hmc", "sweep",
            "-m bnn_zoo compare --data uci/bostonHousing --reference hmc --splits 5 --threads 2 "
            f"--entries {FIDELITY_ENTRIES}"),
    _reference_sweep("reference_boston", "uci/bostonHousing"),
    _result("reference_yacht", "sweep",
            "-m bnn_zoo compare --data uci/yacht --reference hmc --splits 20 --threads 2 "
            "--entries map"),
    _result("reference_energy", "sweep",
            "-m bnn_zoo compare --data uci/energy --reference hmc --splits 3 --threads 2 "
            "--entries map"),
    _result("reference_concrete", "sweep",
            "-m bnn_zoo compare --data uci/concrete --reference hmc --splits 3 --threads 2 "
            "--entries map"),
    _reference_sweep("reference_classification_20_splits", "wine breast_cancer"),
    _reference_sweep("reference_two_moons", "two_moons"),
    _result("reference_yacht_4000", "sweep",
            f"{BENCH}/reference_sampler.py --data uci/yacht --splits 20 --samples 4000 "
            f"{SPLIT_BY_SPLIT}"),
    *_reference_parts("reference_concrete_2000", "uci/concrete",
                      {"0-3": "0 1 2 3", "4-5": "4 5", "6-9": "6 7 8 9", "10-13": "10 11 12 13"}),
    _result("reference_concrete_4000/8_and_11", "sweep",
            f"{BENCH}/reference_sampler.py --data uci/concrete --split-ids 8 11 --samples 4000 "
            f"{SPLIT_BY_SPLIT}"),
    *_reference_parts("reference_digits", "digits",
                      {"0-1": "0 1", "2-5": "2 3 4 5", "6-9": "6 7 8 9", "10-13": "10 11 12 13",
                       "14-17": "14 15 16 17", "18-19": "18 19"}),
    *_reference_parts("reference_wine_quality_red", "uci/wine-quality-red",
                      {"0-1": "0 1", "2-5": "2 3 4 5", "6-9": "6 7 8 9",
                       "10-13": "10 11 12 13", "14-18": "14 15 16 17 18",
                       "19": "19"}),
    _result("gate_by_noise", "other",
            f"{BENCH}/gate_by_noise.py {RESULTS_DIR}/reference_yacht_4000 "
            f"{RESULTS_DIR}/reference_concrete_2000"),
    _result("speed", "timing", f"{BENCH}/speed.py --runs 5"),
    _result("cnn", "timing", f"{BENCH}/cnn.py --threads 1"),
    _result("loader", "timing", f"{BENCH}/loader.py --repeats 9"),
    _result("hmc_chains", "timing", f"{BENCH}/hmc_chains.py --chains 8 160 --threads 2"),
    _result("throughput", "timing",
            f"{BENCH}/throughput.py --device cpu --processes 1 --threads 1 --repeats 7"),
    _result("scaling", "timing", f"{BENCH}/scaling.py --splits 5 --workers 1 2"),
    _result("replicas", "timing",
            *(f"{BENCH}/replicas.py --threads {threads} --repeats 3{allocator}"
              for allocator in ("", " --retain-freed-memory") for threads in (1, 2))),
)
#: Folders of :data:`RESULTS_DIR` that no command here writes.
ELSEWHERE = {"fingerprints": "benchmarks/fingerprints.py, run on the code before a change",
             "gpu": "benchmarks/gpu_check.sh on a CUDA machine",
             "laplace_cnn_gpu": "benchmarks/laplace_cnn.py --device cuda on a CUDA machine"}


def chosen(folders: Sequence[str], every: bool) -> list[Result]:
    """The results of ``folders`` (all with ``every``), in :data:`RESULTS`'s order."""
    known = {r.folder for r in RESULTS}
    unknown = [f for f in folders if f not in known]
    if unknown:
        raise ValueError(f"Expected folders among {sorted(known)}, but got {unknown}.")
    if every == bool(folders):
        raise ValueError("Expected folder names or --all (not both).")
    return [r for r in RESULTS if every or r.folder in folders]


def run(results: Sequence[Result], *, jobs: int = 1, scheduler: str | None = None,
        dry_run: bool = False) -> list[dict]:
    """Run the commands of ``results`` one after the other from the repository root, a
    sweep's after unpacking the checkpoint its folder holds (``benchmarks/checkpoint.py``);
    return one row per command: folder, kind, command, exit status and wall seconds."""
    rows = []
    for result in results:
        packed = ROOT / RESULTS_DIR / result.folder / CHECKPOINT
        if result.kind == "sweep" and packed.exists() and not dry_run:
            subprocess.run([sys.executable, str(ROOT / BENCH / "checkpoint.py"), "--out",
                            str(packed.parent), "--unpack"], cwd=ROOT, check=True)
        for argv in result.argv(jobs, scheduler):
            line = " ".join(["python", *argv[1:]])
            print(f"[{result.folder}] {line}", flush=True)
            started, status = time.perf_counter(), 0
            if not dry_run:
                status = subprocess.run(argv, cwd=ROOT, check=False).returncode
            rows.append({"folder": result.folder, "kind": result.kind, "command": line,
                         "status": status, "seconds": time.perf_counter() - started})
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", help="folders of benchmarks/results to write")
    parser.add_argument("--all", action="store_true", help="every folder")
    parser.add_argument("--list", action="store_true", help="print the folders and commands")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    flags.add_engine_flags(parser)
    args = parser.parse_args(argv)
    if args.list:
        for result in RESULTS:
            for line in result.argv(1, None):
                print(f"{result.folder:26} {result.kind:7} python {' '.join(line[1:])}")
        return []
    try:
        results = chosen(args.folders, args.all)
    except ValueError as error:
        parser.error(str(error))
    rows = run(results, jobs=args.jobs, scheduler=args.scheduler, dry_run=args.dry_run)
    failed = [r for r in rows if r["status"] != 0]
    for row in failed:
        print(f"FAILED ({row['status']}): {row['command']}", file=sys.stderr)
    print(f"{len(rows) - len(failed)} of {len(rows)} commands finished in "
          f"{sum(r['seconds'] for r in rows) / 60:.1f} min")
    return rows


if __name__ == "__main__":
    main()
