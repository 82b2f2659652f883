"""Fingerprints of fits: a SHA-256 digest of what each zoo entry's fit saves, predicts and
scores on a fixed set of problems, so that a change meant to move no number can be shown to
move none, bit for bit.

Every fit is seeded (``seed=0``; the fits of ``Entry.fit_many``, ``seeds=(0, 1)``), runs in
float32 on the CPU (one thread unless ``--threads``), and is digested three ways:

* ``state``: the tensors of what ``Fitted.save`` writes (the posterior's state, the
  scalers, a tuned noise scale), numbers as float64 tensors, less the timings; each
  tensor's dtype, shape and bytes hashed, the digests sorted and hashed again, so that
  renaming a key moves nothing;
* ``predictive``: ``Fitted.predict`` at the test inputs after ``pyro.set_rng_seed(1)``
  (the mixture's ``loc`` and ``scale``, or the class probabilities);
* ``metrics``: ``Fitted.evaluate`` at the test points after ``pyro.set_rng_seed(2)``, less
  the timings, each value as its exact hexadecimal float.

The problems:

* tiny fits (the entry's ``tiny`` keywords, 10 steps) of every entry on 100 training and 50
  test points of ``sine`` (one output, two outputs, heteroscedastic noise, a user's
  network), ``diabetes`` (ten inputs), ``two_moons`` (on the entry's model and on a user's
  network) and ``wine`` (three classes); ``fit_many`` on the first 100 points of splits 0
  and 1 of ``sine`` and ``two_moons``; the ``laplace`` entry with each curvature structure,
  predictive and tuning option that no entry declares on ``sine`` and ``two_moons``;
* full-budget fits of every Laplace entry, and of ``laplace`` with the structures no entry
  declares, on splits 0 and 1 of ``uci/yacht``.

An entry that declines a problem (``UnsupportedProblem``) is recorded as ``declined``, one
that refuses its data or options as ``refused`` with the error's type. Bitwise equality holds
on one kind of machine (CPU, libraries): compare fingerprints taken on the same kind.

``--out OUT`` writes ``fingerprints.md``/``.csv``/``.json`` under ``OUT`` (the JSON keeps
the full digests and, under ``"runs"``, the metrics themselves); ``--check FILE`` fingerprints
today's code, prints every case whose digests differ from those of ``FILE`` and exits with 1
if any does, else 0. ``--entries`` restricts both to some entries.

    BNN_ZOO_DATA=../shared/data/uci python benchmarks/fingerprints.py \\
        --out benchmarks/results/fingerprints
    BNN_ZOO_DATA=../shared/data/uci python benchmarks/fingerprints.py \\
        --check benchmarks/results/fingerprints/fingerprints.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyro
import torch
from torch import Tensor, nn

from bnn_zoo import data, zoo
from bnn_zoo._core.files import load_plain, read_json
from bnn_zoo._harness import flags
from bnn_zoo._harness.cli import run_command
from bnn_zoo._harness.provenance import provenance
from bnn_zoo._harness.tables import write_tables

#: The file name under ``--out``.
NAME = "fingerprints"
#: What ``--check`` compares: the outcome of a case and its three digests.
COMPARED = ("outcome", "state", "predictive", "metrics")
KEYS = ("entry", "problem", "setting")
#: The endings of the timings' names (``fit_seconds``, ``map_seconds``, ``steps_per_second``,
#: ...), in the metrics and in the saved state: left out of the digests.
TIMINGS = ("seconds", "per_second")
#: The steps of a tiny fit (on top of the entry's ``tiny`` keywords).
TINY_STEPS = 10
#: The predictive's samples of a tiny fit and of a full-budget one.
TINY_SAMPLES, FULL_SAMPLES = 20, 100
#: The seeds of the fits of ``Entry.fit_many``.
REPLICA_SEEDS = (0, 1)
#: The ``laplace`` entry's settings that no entry declares: structures, predictives, tuning.
LAPLACE_VARIANTS: dict[str, dict[str, Any]] = {
    "curvature=kron_separate": {"curvature": "kron_separate"},
    "curvature=low_rank": {"curvature": "low_rank", "rank": 3},
    "curvature=subnetwork": {"curvature": "subnetwork", "subnetwork": tuple(range(0, 40, 2))},
    "predictive=mc": {"predictive": "mc"},
    "link=mc": {"link": "mc"},
    "evidence=gradient": {"evidence": "gradient"},
    "per_layer_alpha": {"per_layer_alpha": True},
    "prior_precision=(1, 4)": {"prior_precision": (1.0, 4.0)},
    "holdout=0.2": {"holdout": 0.2},
    "refine": {"refine": True},
}
#: The structures that no Laplace entry declares, fitted on the UCI splits with ``laplace``.
UCI_VARIANTS = ("curvature=kron_separate", "curvature=low_rank", "curvature=subnetwork")


@dataclass(frozen=True)
class Problem:
    """Training data, test points (``y_test`` ``None``: no metrics) and the fit keywords that
    go with them; ``x``, ``y`` stacked over :data:`REPLICA_SEEDS` for ``fit_many``."""

    name: str
    x: Tensor
    y: Tensor
    x_test: Tensor
    y_test: Tensor | None
    options: dict[str, Any] = field(default_factory=dict)
    replicas: bool = False


@dataclass(frozen=True)
class Case:
    """One entry fitted on one problem with the keywords of ``setting``."""

    entry: str
    problem: Problem
    setting: str
    keywords: dict[str, Any]
    num_samples: int


def _first(name: str, split: int = 0, n: int = 100) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    d = data.load(name, split)
    return d.x_train[:n], d.y_train[:n], d.x_test[:n // 2], d.y_test[:n // 2]


def _mlp(inputs: int, outputs: int) -> nn.Module:
    """A user's network: ``inputs``-16-``outputs``, tanh."""
    return nn.Sequential(nn.Linear(inputs, 16), nn.Tanh(), nn.Linear(16, outputs))


def tiny_problems() -> list[Problem]:
    """The problems of the tiny fits (see the module's docstring)."""
    x, y, x_test, y_test = _first("sine")
    moons = _first("two_moons")
    sine_net, moons_net = (lambda: _mlp(1, 1)), (lambda: _mlp(2, 2))
    stacked = {name: [_first(name, split) for split in REPLICA_SEEDS]
               for name in ("sine", "two_moons")}
    return [
        Problem("sine", x, y, x_test, y_test),
        Problem("sine, 2 outputs", x, torch.stack([y, y.square()], 1), x_test, None),
        Problem("sine, heteroscedastic", x, y, x_test, y_test,
                {"model_options": {"noise": "heteroscedastic"}}),
        Problem("sine, net", x, y, x_test, y_test, {"net": sine_net}),
        Problem("diabetes", *_first("diabetes")),
        Problem("two_moons", *moons),
        Problem("two_moons, net", *moons, {"net": moons_net}),
        Problem("wine", *_first("wine")),
        *(Problem(f"{name}, splits 0-1", torch.stack([s[0] for s in splits]),
                  torch.stack([s[1] for s in splits]), *splits[0][2:], replicas=True)
          for name, splits in stacked.items()),
    ]


def uci_problems() -> list[Problem]:
    """Splits 0 and 1 of ``uci/yacht``, whole."""
    problems = []
    for split in REPLICA_SEEDS:
        d = data.load("uci/yacht", split)
        problems.append(Problem(f"uci/yacht, split {split}", d.x_train, d.y_train, d.x_test,
                                d.y_test))
    return problems


def cases(entries: Sequence[str]) -> list[Case]:
    """Every case of the fingerprints of ``entries``, in a fixed order (the UCI splits are
    read only where a Laplace entry is among them)."""
    tiny = tiny_problems()
    uci = uci_problems() if any(name.startswith("laplace") for name in entries) else []
    out = []
    for name in entries:
        keywords = {**zoo.get(name).tiny, "steps": TINY_STEPS}
        variants = LAPLACE_VARIANTS if name == "laplace" else {}
        out += [Case(name, problem, "tiny", keywords, TINY_SAMPLES) for problem in tiny]
        out += [Case(name, problem, f"tiny, {label}",
                     {**keywords, "method_options": {"refine": False, **options}}, TINY_SAMPLES)
                for label, options in variants.items() for problem in tiny
                if problem.name in ("sine", "two_moons")]
        if name.startswith("laplace"):
            out += [Case(name, problem, "full budget", {}, FULL_SAMPLES) for problem in uci]
        out += [Case(name, problem, f"full budget, {label}",
                     {"method_options": variants[label]}, FULL_SAMPLES)
                for label in UCI_VARIANTS if label in variants for problem in uci]
    return out


def fits(case: Case) -> list[zoo.Fitted]:
    """The fits of ``case`` (two for ``fit_many``), seeded."""
    entry, problem = zoo.get(case.entry), case.problem
    keywords = {**case.keywords, **problem.options}
    pyro.set_rng_seed(0)
    if problem.replicas:
        return entry.fit_many(problem.x, problem.y, seeds=list(REPLICA_SEEDS), **keywords)
    return [entry.fit(problem.x, problem.y, seed=0, **keywords)]


def _tensor_digest(tensors: Iterable[Tensor]) -> str:
    """SHA-256 of the dtype, shape and bytes of each tensor, in order."""
    digest = hashlib.sha256()
    for tensor in tensors:
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype} {tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _leaves(value: object) -> Iterator[Tensor]:
    """The tensors and numbers (as float64 tensors) in nested dicts, lists and tuples, less
    the timings."""
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield torch.tensor(float(value), dtype=torch.float64)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not str(key).endswith(TIMINGS):
                yield from _leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)


def state_digest(fitted: zoo.Fitted) -> str:
    """The digest of what ``fitted.save`` writes, less the options and the timings: the
    sorted digests of its tensors and numbers, hashed."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fit.pt"
        fitted.save(path)
        state = load_plain(path, what="a saved fit")
    saved = [state[k] for k in ("posterior", "x_scaler", "y_scaler", "validated_noise_scale")]
    digests = sorted(_tensor_digest([leaf]) for leaf in _leaves(saved))
    return hashlib.sha256("".join(digests).encode()).hexdigest()


def predictive_digest(fitted: zoo.Fitted, x: Tensor, num_samples: int) -> str:
    """The digest of the predictive at ``x``, sampled after ``pyro.set_rng_seed(1)``."""
    pyro.set_rng_seed(1)
    pred = fitted.predict(x, num_samples)
    probs = getattr(pred, "probs", None)
    return _tensor_digest([probs] if probs is not None else [pred.loc, pred.scale])


def scores(fitted: zoo.Fitted, x: Tensor, y: Tensor, num_samples: int) -> dict[str, float]:
    """The test metrics less the timings, sampled after ``pyro.set_rng_seed(2)``."""
    pyro.set_rng_seed(2)
    metrics = fitted.evaluate(x, y, num_samples)
    return {k: float(v) for k, v in sorted(metrics.items()) if not k.endswith(TIMINGS)}


def fingerprint(case: Case) -> tuple[dict, dict]:
    """The row of ``case`` (its outcome and digests) and its run (the metrics, the time)."""
    problem = case.problem
    key = {"entry": case.entry, "problem": problem.name, "setting": case.setting}
    started = time.perf_counter()
    try:
        fitted = fits(case)
    except zoo.UnsupportedProblem:
        return {**key, "outcome": "declined"}, key
    except (ValueError, TypeError) as error:
        return {**key, "outcome": f"refused: {type(error).__name__}"}, key
    states = [state_digest(f) for f in fitted]
    predictives = [predictive_digest(f, problem.x_test, case.num_samples) for f in fitted]
    metrics = [] if problem.y_test is None else [
        scores(f, problem.x_test, problem.y_test, case.num_samples) for f in fitted]
    text = json.dumps([{k: v.hex() for k, v in m.items()} for m in metrics])
    row = {**key, "outcome": "ok", "state": _joined(states),
           "predictive": _joined(predictives),
           "metrics": hashlib.sha256(text.encode()).hexdigest()}
    row["fingerprint"] = _joined([row[k] for k in COMPARED])[:16]
    return row, {**key, "metrics": metrics, "seconds": time.perf_counter() - started}


def _joined(digests: Sequence[str]) -> str:
    """One digest for several: that of one alone, else the SHA-256 of them in order."""
    return digests[0] if len(digests) == 1 else hashlib.sha256("".join(digests).encode()
                                                                 ).hexdigest()


def differences(rows: Sequence[dict], baseline: Sequence[dict]) -> list[str]:
    """One line per case whose outcome or digests differ between ``rows`` and ``baseline``,
    or that only one of them holds."""
    old = {tuple(r[k] for k in KEYS): r for r in baseline}
    new = {tuple(r[k] for k in KEYS): r for r in rows}
    lines = []
    for key in dict.fromkeys([*old, *new]):
        case = f"{key[0]} on {key[1]} ({key[2]})"
        if key not in old or key not in new:
            lines.append(f"{case}: only in {'the baseline' if key in old else 'this run'}")
            continue
        moved = [k for k in COMPARED if old[key].get(k) != new[key].get(k)]
        if moved:
            lines.append(f"{case}: {', '.join(moved)} differ")
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    flags.add_shared_flags(parser, out=None, threads=1,
                           without=("device", "seed", "splits", "retain_freed_memory"))
    parser.add_argument("--check", type=Path,
                        help="compare with the fingerprints of this JSON (exit 1 if any differ)")
    parser.add_argument("--entries", nargs="+", choices=zoo.names(), default=zoo.names(),
                        help="fingerprint only these entries (default: all)")
    args = flags.parse(parser, argv)
    if args.out is None and args.check is None:
        parser.error("expected --out, --check or both")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    baseline = None if args.check is None else read_json(args.check, what="fingerprints")
    rows, runs = [], []
    for case in cases(args.entries):
        row, run = fingerprint(case)
        print(f"{case.entry} on {case.problem.name} ({case.setting}): "
              f"{row.get('fingerprint', row['outcome'])}", flush=True)
        rows.append(row)
        runs.append(run)
    process = provenance()
    if args.out is not None:
        write_tables(args.out, NAME, rows, keys=KEYS, columns=("outcome", "fingerprint"),
                     runs=runs, preamble=f"Fits of every zoo entry, digested "
                     f"(`benchmarks/{NAME}.py`): float32 on {process['cpu']} (torch "
                     f"{process['torch']}, threads={process['threads']}).")
    if baseline is None:
        return 0
    taken = {k: baseline["provenance"].get("process", {}).get(k) for k in ("cpu", "threads")}
    if taken != {k: process[k] for k in taken}:
        print(f"Note: {args.check} was taken with {taken['threads']} threads of {taken['cpu']}, "
              f"this run with {process['threads']} of {process['cpu']}: bitwise equality "
              "holds on one kind of machine and thread count.")
    selected = [r for r in baseline["summary"] if r["entry"] in args.entries]
    lines = differences(rows, selected)
    print("\n".join(lines) if lines else f"All {len(rows)} cases identical to {args.check}.")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(run_command(f"benchmarks/{NAME}.py", main))
