"""Data-parallel Bayes by Backprop on ``torch.distributed``, launched with ``torchrun``.

One machine, two processes (gloo on CPU, nccl with one GPU per process)::

    torchrun --standalone --nproc-per-node 2 benchmarks/distributed_fit.py --data diabetes

Several machines (run on each, ``HOST`` being the first machine's address)::

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        benchmarks/distributed_fit.py --data diabetes

Each process trains on its shard of the training rows (``--batch-size`` rows per
process and step) with gradients averaged over the processes; rank 0 alone prints
and writes ``metrics.json`` under ``--out``. Run with plain ``python`` it is one
process.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist

from bnn_zoo import data, zoo
from bnn_zoo.core import distributed
from bnn_zoo.core.checks import check_device


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="diabetes", choices=data.names())
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=128, help="rows per process and step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None,
                        help="cpu or cuda (default: cuda:LOCAL_RANK when CUDA is available)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--out", type=Path, default=Path("results/distributed_fit"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    launched = distributed.init_process_group()
    try:
        device = distributed.device() if args.device is None else check_device("--device",
                                                                               args.device)
        d = data.load(args.data)
        x, y = distributed.shard(d.x_train.to(device), d.y_train.to(device))
        fitted = zoo.get("bbb").fit(x, y, task=d.task, seed=args.seed, steps=args.steps,
                                         batch_size=args.batch_size,
                                         distributed=distributed.is_initialized())
        metrics = fitted.evaluate(d.x_test.to(device), d.y_test.to(device))
        metrics["processes"] = distributed.world_size()
        if distributed.is_main_process():
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2))
            print(json.dumps(metrics, indent=2))
        return metrics
    finally:
        if launched:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
