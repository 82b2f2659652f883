"""Data-parallel SVI: two processes on the CPU (gloo, loopback) take exactly the steps
one process takes on the same global minibatches.

One spawn of two processes runs every distributed check (starting processes is the
slow part); the single-process reference runs in the test process.
"""

from __future__ import annotations

from pathlib import Path

import pyro
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import bnn_zoo
from bnn_zoo import zoo
from bnn_zoo._core import distributed
from bnn_zoo._core.elbo import MeanFieldELBO
from bnn_zoo._core.step import SVIStep
from bnn_zoo.guides import BayesByBackpropGuide
from bnn_zoo.models import BayesianMLP

WORLD = 2
N, LOCAL_BATCH, STEPS = 24, 3, 4


def global_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, 2, generator=g, dtype=torch.float64)
    return x, x.sum(-1) + 0.1 * torch.randn(N, generator=g, dtype=torch.float64)


def local_indices() -> list[torch.Tensor]:
    """The fixed minibatch indices into each (strided) shard, one batch per step."""
    g = torch.Generator().manual_seed(4)
    return [torch.randperm(N // WORLD, generator=g)[:LOCAL_BATCH] for _ in range(STEPS)]


def run_steps(x: torch.Tensor, y: torch.Tensor, indices: list[torch.Tensor],
              distributed_: bool) -> tuple[dict[str, torch.Tensor], list[float]]:
    """``STEPS`` BBB steps on fixed minibatches ``indices``, with the same initial
    parameters and the same weight noise on every process."""
    pyro.set_rng_seed(0)
    model = BayesianMLP(2, 1, (5,), activation="tanh").double()
    guide = BayesByBackpropGuide(model)
    step = SVIStep(model, guide, x, y, lr=0.05, batch_size=len(indices[0]), elbo=MeanFieldELBO,
                   distributed=distributed_)
    batches = iter(indices)
    step.next_batch = lambda: (0, next(batches))
    pyro.set_rng_seed(1)
    losses = [step() for _ in indices]
    return {k: v.detach().clone() for k, v in guide.named_parameters()} | {
        k: v.detach().clone() for k, v in model.named_parameters()}, losses


def worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    distributed.init_loopback_group(rank, WORLD, port)
    try:
        x, y = distributed.shard(*global_data())
        params, losses = run_steps(x, y, local_indices(), distributed_=True)
        checkpoint = Path(out) / f"checkpoint-{rank}.pt"  # only rank 0's may appear
        model = BayesianMLP(2, 1, (5,)).double()
        bnn_zoo.fit(model, BayesByBackpropGuide(model), x, y, steps=2, batch_size=4,
                    checkpoint=checkpoint, distributed=True, seed=0)
        fitted = zoo.get("bbb").fit(x, y, steps=2, jit=False, distributed=True, validation=0.25,
                                   model_options={"hidden": (4,)})
        torch.save({"params": params, "losses": losses, "x_mean": fitted.x_scaler.mean,
                    "x_std": fitted.x_scaler.std, "y_mean": fitted.y_scaler.mean,
                    "noise": fitted.diagnostics["validated_noise_scale"],
                    "rank": distributed.rank(), "world": distributed.world_size()},
                   Path(out) / f"rank{rank}.pt")
        # Leave together, as PyTorch's shutdown asks: no process tears its group down
        # while its peer may still hold the connection open.
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("distributed")
    mp.spawn(worker, args=(distributed.free_port(), str(out)), nprocs=WORLD, join=True)
    return out, [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def test_two_processes_take_the_steps_of_one_on_the_global_batches(two_processes):
    _, ranks = two_processes
    x, y = global_data()
    # Strided shards: row j of shard r is global row j * WORLD + r.
    global_indices = [torch.cat([idx * WORLD + r for r in range(WORLD)])
                      for idx in local_indices()]
    params, losses = run_steps(x, y, global_indices, distributed_=False)
    for rank in ranks:
        assert (rank["rank"], rank["world"]) in {(0, WORLD), (1, WORLD)}
        assert rank["params"].keys() == params.keys()
        for name, value in params.items():
            torch.testing.assert_close(rank["params"][name], value, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(torch.tensor(rank["losses"]), torch.tensor(losses),
                                   rtol=1e-10, atol=0)


def test_rank_zero_alone_writes_the_checkpoint(two_processes):
    out, _ = two_processes
    assert (out / "checkpoint-0.pt").exists()
    assert not (out / "checkpoint-1.pt").exists()


def test_entry_standardises_with_the_statistics_of_all_shards(two_processes):
    _, ranks = two_processes
    x, y = global_data()
    for rank in ranks:
        torch.testing.assert_close(rank["x_mean"], x.mean(0))
        torch.testing.assert_close(rank["x_std"], x.std(0, unbiased=False))
        torch.testing.assert_close(rank["y_mean"], y.mean())


def test_every_process_tunes_the_same_validated_noise(two_processes):
    """Each shard holds out its own rows; the noise search averages over all of them."""
    _, ranks = two_processes
    assert ranks[0]["noise"] == ranks[1]["noise"] > 0


def test_distributed_without_a_process_group_is_a_value_error():
    x, y = global_data()
    model = BayesianMLP(2, 1, (3,)).double()
    with pytest.raises(ValueError, match="torchrun"):
        bnn_zoo.fit(model, BayesByBackpropGuide(model), x, y, steps=1, distributed=True)
    assert (distributed.rank(), distributed.world_size(), distributed.is_main_process()) == (
        0, 1, True)
    assert distributed.shard(x)[0] is not None and torch.equal(distributed.shard(x)[0], x)
