"""The SVI step as a CUDA graph (`bnn_zoo._core.graphs`): where it is recorded, and on a
GPU that a replayed step is the step it recorded.

A deterministic step (a point-mass guide) replayed from its graph must move the parameters
exactly as the op-by-op step does, to float32 round-off: minibatches, the padded short one,
a learning-rate schedule, replicas and a loader's batches included. A step with random
draws must draw fresh noise on every replay. The tests on CUDA skip without a GPU; the
choice of when to record, and the learning rate a schedule fills in place, run on the CPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import bnn_zoo
from bnn_zoo._core.graphs import WARMUP, GraphWarning, capturable
from bnn_zoo._core.lr_schedule import set_lr
from bnn_zoo._core.replicas import fit_replicas
from bnn_zoo._core.step import SVIStep, TrainingDiverged
from bnn_zoo.guides import BayesByBackpropGuide
from bnn_zoo.models import BayesianMLP
from bnn_zoo.zoo._defaults import map_guide

#: Steps of the fits compared: every minibatch key (four under Graves' KL weights, one
#: otherwise) runs its warm-up and then replays.
STEPS = 8 * WARMUP
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")


def problem(n: int = 50, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 2, generator=g)
    return x.to(device), (torch.sin(x[:, 0]) + 0.1 * torch.randn(n, generator=g)).to(device)


@pytest.mark.parametrize("device, option, jit, distributed, recorded", [
    ("cuda", None, True, False, True),
    ("cuda", True, True, False, True),
    ("cuda", None, False, False, False),
    ("cuda", False, True, False, False),
    ("cuda", None, True, True, False),
    ("cpu", None, True, False, False),
    ("meta", None, True, False, False),
])
def test_a_graph_is_recorded_for_a_traced_step_on_cuda_unless_refused(
        device, option, jit, distributed, recorded):
    assert capturable(torch.device(device), option, jit=jit, distributed=distributed) is recorded


@pytest.mark.parametrize("device, jit, distributed, match", [
    ("cpu", True, False, "data on cpu"), ("cuda", True, True, "a distributed step"),
    ("cuda", False, False, "jit=False")])
def test_cuda_graph_true_where_none_can_be_recorded_is_refused(device, jit, distributed,
                                                               match):
    with pytest.raises(ValueError, match=f"cuda_graph=True.*{match}"):
        capturable(torch.device(device), True, jit=jit, distributed=distributed)


def test_fit_refuses_cuda_graph_on_the_cpu_and_a_non_bool():
    x, y = problem()
    model = BayesianMLP(2, 1, (4,))
    with pytest.raises(ValueError, match="cuda_graph=True"):
        bnn_zoo.fit(model, map_guide(model), x, y, steps=2, jit=True, cuda_graph=True)
    with pytest.raises(TypeError, match="cuda_graph"):
        bnn_zoo.fit(model, map_guide(model), x, y, steps=2, cuda_graph=1)


def test_a_schedule_fills_a_tensor_rate_in_place():
    rate = torch.tensor(0.1)
    optimizer = torch.optim.Adam([torch.zeros(2, requires_grad=True)], lr=rate)
    set_lr(optimizer, 0.025)
    assert optimizer.param_groups[0]["lr"] is rate
    assert rate.item() == pytest.approx(0.025, rel=1e-7)  # a float32 rate


def test_a_resumed_step_keeps_its_own_rate_and_capture_settings():
    # A checkpoint of a recorded step holds a tensor rate and capturable=True: a step op by
    # op resumes with a float rate and without capture (and the other way round on CUDA).
    x, y = problem()
    model = BayesianMLP(2, 1, (4,))
    step = SVIStep(model, map_guide(model), x, y, lr=0.01)
    state = step.state_dict()
    for group in state["optimizer"]["param_groups"]:
        group.update(lr=torch.tensor(0.01), capturable=True)
    step.load_state_dict(state)
    assert step.optimizer.param_groups[0]["lr"] == pytest.approx(0.01, rel=1e-7)
    assert not isinstance(step.optimizer.param_groups[0]["lr"], torch.Tensor)
    assert step.optimizer.param_groups[0]["capturable"] is False


def assert_recorded_moves_as_op_by_op(fit: Callable[[torch.nn.Module, torch.nn.Module, bool],
                                                     object], replicas: int | None = None) -> None:
    """Run ``fit(model, guide, cuda_graph)`` on a fresh MAP pair on CUDA (``replicas`` of it)
    recorded and op by op, from the same seed: the parameters agree to float32 round-off."""
    results = []
    for graph in (True, False):
        pyro.set_rng_seed(0)
        model = BayesianMLP(2, 1, (8,))
        model = (model if replicas is None else model.replicated(replicas)).cuda()
        guide = map_guide(model)
        fit(model, guide, graph)
        results.append({k: v.detach().clone() for k, v in guide.named_parameters()})
    for name in results[0]:
        torch.testing.assert_close(results[0][name], results[1][name], rtol=1e-5, atol=1e-6)


@CUDA
@pytest.mark.parametrize("options", [
    {}, {"batch_size": 16}, {"batch_size": 16, "lr_schedule": "cosine", "check_every": 5},
    {"batch_size": 16, "kl_weighting": "graves"}])
def test_a_replayed_point_mass_step_moves_the_parameters_as_the_step_op_by_op(options):
    # Batch 16 of 50 points: epochs of three full minibatches and a padded one.
    x, y = problem(device="cuda")
    assert_recorded_moves_as_op_by_op(lambda model, guide, graph: bnn_zoo.fit(
        model, guide, x, y, steps=STEPS, lr=0.05, seed=0, progress=False, jit=True,
        cuda_graph=graph, **options))


@CUDA
def test_replayed_replicas_move_as_replicas_op_by_op():
    x, y = problem(device="cuda")
    x, y = x.expand(3, *x.shape) * torch.tensor([1.0, 2.0, 3.0], device="cuda")[:, None, None], \
        y.expand(3, *y.shape)
    assert_recorded_moves_as_op_by_op(lambda model, guide, graph: fit_replicas(
        model, guide, x, y, steps=STEPS, lr=0.05, batch_size=16, seed=0, progress=False,
        jit=True, cuda_graph=graph, check_every=4), replicas=3)


@CUDA
def test_a_replayed_loader_step_reads_each_new_batch():
    x, y = problem(device="cuda")
    assert_recorded_moves_as_op_by_op(lambda model, guide, graph: bnn_zoo.fit(
        model, guide, DataLoader(TensorDataset(x, y), batch_size=16), steps=STEPS, lr=0.05,
        seed=0, progress=False, jit=True, cuda_graph=graph))


@CUDA
def test_every_replay_draws_fresh_noise():
    # Parameters held still (lr 1e-12): the replayed losses of Bayes by Backprop vary from
    # step to step, with the mean of the op-by-op losses within 5 standard errors.
    x, y = problem(device="cuda")
    losses = {}
    for graph in (True, False):
        model = BayesianMLP(2, 1, (8,), noise_scale=0.1).cuda()
        step = SVIStep(model, BayesByBackpropGuide(model), x, y, lr=1e-12, jit=True,
                       cuda_graph=graph)
        losses[graph] = torch.stack([step.advance() for _ in range(100)])[2 * WARMUP:]
        assert (step.graphs is not None and len(step.graphs.graphs) == 1) is graph
    replayed, eager = losses[True], losses[False]
    assert replayed.unique().numel() == replayed.numel()
    se = (replayed.var() / replayed.numel() + eager.var() / eager.numel()).sqrt()
    assert (replayed.mean() - eager.mean()).abs() < 5 * se


def cusp(x, y):
    z = pyro.sample("z", dist.Normal(0.0, 1.0))
    pyro.factor("cusp", -z.abs().sqrt())
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(z, 1.0), obs=y)


@CUDA
def test_a_replayed_step_with_a_nan_gradient_stops_and_keeps_the_parameters():
    from pyro.infer.autoguide import AutoDelta
    x, y = torch.zeros(10, 1, device="cuda"), torch.zeros(10, device="cuda")
    guide = AutoDelta(cusp, init_loc_fn=lambda site: torch.zeros((), device="cuda"))
    with pytest.raises(TrainingDiverged):
        bnn_zoo.fit(cusp, guide, x, y, steps=20, lr=0.1, validate=False, jit=True,
                    cuda_graph=True)
    assert guide.median()["z"] == 0.0


class ReadsSizes(torch.nn.Module):
    """A linear model on the points with finite targets: boolean indexing reads their number
    back to the host on every step, which a CUDA graph cannot record."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x, y):
        keep = torch.isfinite(y)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(x[keep] @ self.w, 1.0), obs=y[keep])


@CUDA
def test_a_step_that_cannot_be_recorded_runs_op_by_op_and_says_so_once():
    x, y = problem(device="cuda")
    model = ReadsSizes().cuda()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = bnn_zoo.fit(model, lambda x, y: None, x, y, steps=STEPS, lr=0.05,
                             jit=True, cuda_graph=True, progress=False, validate=False)
    assert [w.category for w in caught if w.category is GraphWarning] == [GraphWarning]
    assert len(result.losses) == STEPS and result.losses[-1] < result.losses[0]
