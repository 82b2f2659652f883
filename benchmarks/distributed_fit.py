"""Data-parallel Bayes by Backprop on ``torch.distributed``, launched with ``torchrun``.

One machine, two processes (gloo on CPU, nccl with one GPU per process)::

    torchrun --standalone --nproc-per-node 2 benchmarks/distributed_fit.py --data diabetes

Several machines (run on each, ``HOST`` being the first machine's address)::

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        benchmarks/distributed_fit.py --data diabetes

Each process trains on its shard of the training rows (``--batch-size`` rows per
process and step) with gradients averaged over the processes; rank 0 alone prints
and writes the test metrics as ``metrics.md``, ``.csv`` and ``.json`` under ``--out``.
Run with plain ``python`` it is one process.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch.distributed as dist

from bnn_zoo import data, zoo
from bnn_zoo._core import distributed
from bnn_zoo._harness import flags
from bnn_zoo._harness.tables import write_tables

ENTRY = "bbb"


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="diabetes", choices=data.names())
    parser.add_argument("--batch-size", type=flags.positive_int, default=128,
                        help="rows per process and step")
    flags.add_fit_flags(parser, steps=2000)
    flags.add_shared_flags(parser, out="results/distributed_fit", threads=1, device=None,
                           without=("splits",))
    args = flags.parse(parser, argv)
    launched = distributed.init_process_group()
    try:
        device = distributed.device() if args.device is None else args.device
        d = data.load(args.data)
        x, y = distributed.shard(d.x_train.to(device), d.y_train.to(device))
        fitted = zoo.get(ENTRY).fit(x, y, task=d.task, seed=args.seed, steps=args.steps,
                                    batch_size=args.batch_size,
                                    distributed=distributed.is_initialized())
        metrics = fitted.evaluate(d.x_test.to(device), d.y_test.to(device), args.num_samples)
        metrics["processes"] = distributed.world_size()
        if distributed.is_main_process():
            print(write_tables(args.out, "metrics", [{"data": args.data, "entry": ENTRY,
                                                      **metrics}],
                               keys=("data", "entry"), columns=list(metrics)))
        if launched:  # leave together: no process tears the group down under its peer
            dist.barrier()
        return metrics
    finally:
        if launched:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
