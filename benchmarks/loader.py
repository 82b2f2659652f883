"""Wall time of a ``bbb`` fit from a ``torch.utils.data.DataLoader`` against the same fit
from in-memory tensors (the goal: at most 1.2 x).

Both fit the ``bbb`` entry for ``--epochs`` epochs of minibatches of ``--batch`` points on
``--points`` synthetic regression points with ``--features`` inputs: the tensors with
``batch_size=B`` (the fit indexes them itself), the loaders with ``entry.fit(loader)``
(:mod:`bnn_zoo._core.batches`): ``dataloader``, a shuffled ``DataLoader`` over a
``TensorDataset`` as users write it (one ``__getitem__`` per point, then collated), and
``batch_sampler``, a ``DataLoader`` whose sampler is a shuffled ``BatchSampler`` with
``batch_size=None`` (one indexing per batch). Fits are interleaved, ``--repeats`` of
each, medians; the time includes the loader's standardisation pass. Written as
``loader.md``, ``.csv`` and ``.json`` under ``--out``.

    python benchmarks/loader.py --out results/loader
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from bnn_zoo import zoo
from bnn_zoo._harness import flags
from bnn_zoo._harness.tables import write_tables

FLOOR = 1.2
KINDS = ("tensors", "dataloader", "batch_sampler")


def data(kind: str, x: torch.Tensor, y: torch.Tensor, batch: int) -> tuple[tuple, dict]:
    """The positional data and budget overrides of a fit of ``kind``."""
    if kind == "tensors":
        return (x, y), {"batch_size": batch}
    dataset = TensorDataset(x, y)
    if kind == "dataloader":
        return (DataLoader(dataset, batch_size=batch, shuffle=True),), {}
    sampler = BatchSampler(RandomSampler(dataset), batch, drop_last=False)
    return (DataLoader(dataset, sampler=sampler, batch_size=None),), {}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=flags.positive_int, default=10000)
    parser.add_argument("--features", type=flags.positive_int, default=16)
    parser.add_argument("--batch", type=flags.positive_int, default=256)
    parser.add_argument("--epochs", type=flags.positive_int, default=10)
    parser.add_argument("--repeats", type=flags.positive_int, default=5)
    flags.add_shared_flags(parser, out="results/loader", threads=1,
                           without=("device", "splits"))
    args = flags.parse(parser, argv)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.points, args.features, generator=g)
    y = x.sum(1).sin() + 0.1 * torch.randn(args.points, generator=g)
    steps = args.epochs * -(-args.points // args.batch)
    entry = zoo.get("bbb")
    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(args.repeats):
        for kind in KINDS:
            positional, overrides = data(kind, x, y, args.batch)
            started = time.perf_counter()
            entry.fit(*positional, steps=steps, seed=args.seed, **overrides)
            seconds[kind].append(time.perf_counter() - started)
    median = {kind: statistics.median(times) for kind, times in seconds.items()}
    row = {"points": args.points, "batch": args.batch, "epochs": args.epochs,
           **{f"{kind}_s": median[kind] for kind in KINDS},
           **{f"{kind}_ratio": median[kind] / median["tensors"] for kind in KINDS[1:]}}
    preamble = (f"{args.threads} thread(s), median of {args.repeats} fits of bbb, "
                f"{steps} steps; *_ratio: the loader fit's time over the tensors' (the goal: "
                f"at most {FLOOR})")
    print(write_tables(args.out, "loader", [row], keys=("points", "batch", "epochs"),
                       columns=[*(f"{k}_s" for k in KINDS), *(f"{k}_ratio" for k in KINDS[1:])],
                       preamble=preamble))
    return {"rows": [row]}


if __name__ == "__main__":
    main()
