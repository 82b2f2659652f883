"""Data-parallel training under ``torchrun``: each process reads its shard of the
training set, and ``entry.fit(..., distributed=True)`` averages the gradients over the
processes before every step, so ``W`` processes take the step one process would take on
the union of their minibatches."""

from bnn_zoo._core.distributed import (
    device,
    init_process_group,
    is_main_process,
    rank,
    shard,
    world_size,
)

__all__ = ["device", "init_process_group", "is_main_process", "rank", "shard", "world_size"]
