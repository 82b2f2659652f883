"""Fits from a loader (:mod:`bnn_zoo._core.batches`, :class:`~bnn_zoo._core.batch_step.
LoaderStep`): the same fit as from the tensors in float64 where the batches are the same
(full batch, or the in-memory minibatch order), streaming moments against the in-memory
statistics, predictions and metrics of a loader against the tensors', and bad loaders
refused by name."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoDelta
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler, TensorDataset

import bnn_zoo
from bnn_zoo._core.batch_step import LoaderStep
from bnn_zoo._core.batches import Moments, as_batches, chunks, tensor_batches
from bnn_zoo._core.scaling import Standardizer
from bnn_zoo.guides._bbb import BayesByBackpropGuide
from bnn_zoo.models import BayesianMLP

N, B = 48, 16


def problem(n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 2, generator=g, dtype=torch.float64)
    return x, x.sum(1).sin() + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


class EpochOrder(Sampler):
    """The minibatch order of :class:`~bnn_zoo._core.step.SVIStep` with ``seed``: a fresh
    permutation from one CPU generator per epoch. The first pass, in which the fit checks
    the loader by its first batch, is in order and draws nothing."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.order, self.checked = n, torch.Generator().manual_seed(seed), False

    def __iter__(self):
        if not self.checked:
            self.checked = True
            return iter(range(self.n))
        return iter(torch.randperm(self.n, generator=self.order).tolist())

    def __len__(self) -> int:
        return self.n


def fit(data: tuple, guide=AutoDelta, **options) -> tuple[list[float], dict]:
    pyro.set_rng_seed(0)
    model = BayesianMLP(2, 1, hidden=(8,)).double()
    g = guide(model)
    result = bnn_zoo.fit(model, g, *data, steps=9, seed=3, **options)
    return result.losses, {k: v.detach().clone() for k, v in result.parameters.items()}


def assert_same(a: tuple, b: tuple) -> None:
    torch.testing.assert_close(torch.tensor(a[0]), torch.tensor(b[0]), rtol=1e-12, atol=0)
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], rtol=1e-12, atol=1e-14)


def test_a_full_batch_loader_fits_as_the_tensors():
    x, y = problem()
    assert_same(fit((DataLoader(TensorDataset(x, y), batch_size=N),)), fit((x, y)))


@pytest.mark.parametrize("jit", [False, True])
def test_a_loader_in_the_minibatch_order_of_the_tensors_fits_as_they_do(jit):
    """Three epochs of three minibatches, each batch's likelihood scaled by N / B."""
    x, y = problem()
    loader = DataLoader(TensorDataset(x, y), batch_size=B, sampler=EpochOrder(N, 3))
    assert_same(fit((loader,), jit=jit), fit((x, y), batch_size=B, jit=jit))


def test_bbb_from_a_list_of_batches_draws_the_noise_of_the_tensors_fit():
    """A list of batches draws no random numbers: Bayes by Backprop over one epoch in the
    tensors' order is the same fit, noise and all."""
    x, y = problem()
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(3))
    batches = [(x[i], y[i]) for i in perm.split(B)]
    options = dict(guide=BayesByBackpropGuide)
    a = fit((batches,), num_data=N, **options)
    b = fit((x, y), batch_size=B, **options)
    torch.testing.assert_close(torch.tensor(a[0][:3]), torch.tensor(b[0][:3]), rtol=1e-12,
                               atol=0)


def test_a_short_last_batch_is_scaled_by_its_own_size():
    """N = 40 in batches of 16, 16, 8, under JIT (a trace per batch size): the loss of the
    short batch is its log joint with the likelihood scaled by 40 / 8, as the tensors'
    padded short minibatch (weights B / b) gives it."""
    x, y = problem(40)
    order = EpochOrder(40, 3)
    loader = DataLoader(TensorDataset(x, y), batch_size=B, sampler=order)
    assert_same(fit((loader,), jit=True), fit((x, y), batch_size=B, jit=True))


def test_moments_merge_to_the_in_memory_statistics():
    x, _ = problem(37)
    moments = Moments()
    for part in x.split(10):
        moments.update(part)
    expected = Standardizer.fit(x)
    torch.testing.assert_close(moments.mean, expected.mean, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(moments.std, expected.std, rtol=1e-14, atol=1e-15)
    assert moments.count == 37


def test_chunks_cut_a_loader_and_tensors_alike():
    x, y = problem()
    from_loader = [c for c, _ in chunks(as_batches(DataLoader(TensorDataset(x, y),
                                                              batch_size=N)), None, 20)]
    assert [c.shape[0] for c in from_loader] == [20, 20, 8]
    torch.testing.assert_close(torch.cat(from_loader), x)


def test_predict_and_evaluate_of_a_loader_equal_the_tensors():
    x, y = problem()
    model = BayesianMLP(2, 1, hidden=(8,)).double()
    guide = AutoDelta(model)
    bnn_zoo.fit(model, guide, x, y, steps=5)
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    whole = bnn_zoo.predict(model, guide, x, num_samples=2)
    torch.testing.assert_close(bnn_zoo.predict(model, guide, loader, num_samples=2).mean,
                               whole.mean)
    expected = bnn_zoo.evaluate(model, guide, x, y, num_samples=2)
    got = bnn_zoo.evaluate(model, guide, loader, num_samples=2)
    assert got.keys() == expected.keys()
    for name in expected:  # (the metrics count fractions in float32)
        assert got[name] == pytest.approx(expected[name], rel=1e-12, abs=1e-7), name


def generator_of_batches():
    x, y = problem()
    yield x, y


@pytest.mark.parametrize("data, options, match", [
    ((generator_of_batches(),), {"num_data": N}, "re-iterable"),
    (([problem()],), {}, "num_data"),
    (([],), {"num_data": N}, "at least one batch"),
    (([(problem()[0],) * 3],), {"num_data": N}, "batch 0 is a tuple of 3"),
    (([{"x": 1}],), {"num_data": N}, "batch 0 is a dict"),
    ((DataLoader(TensorDataset(*problem()), batch_size=N), problem()[1]), {}, "y=None"),
    (([problem()],), {"num_data": N, "batch_size": 4}, "batch_size=None"),
    (([problem()],), {"num_data": 0}, "num_data"),
    (problem(), {"num_data": N}, "num_data=None"),
    ((problem()[0],), {}, "Expected y"),
    (([(torch.zeros(4, 2, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))],),
     {"num_data": 4}, "Batch 0 of the loader"),
    ((DataLoader(TensorDataset(problem()[0].index_fill(0, torch.tensor([N - 1]), math.nan),
                               problem()[1]), batch_size=B),),
     {}, r"x.dataset.tensors\[0\] to contain only finite values"),
])
def test_bad_loaders_are_refused_by_name(data, options, match):
    model = BayesianMLP(2, 1, hidden=(4,)).double()
    with pytest.raises(ValueError, match=match):
        bnn_zoo.fit(model, AutoDelta(model), *data, steps=1, **options)


def test_a_loader_that_yields_nothing_on_a_later_pass_is_refused():
    class Once:
        def __init__(self):
            self.passes = 0

        def __iter__(self):
            self.passes += 1
            return iter([problem()] if self.passes <= 2 else [])

    model = BayesianMLP(2, 1, hidden=(4,)).double()
    with pytest.raises(ValueError, match="a pass yielded none"):
        bnn_zoo.fit(model, AutoDelta(model), Once(), num_data=N, steps=3)


def test_a_batch_sampler_of_index_lists_gives_batches_of_one_read_each():
    """The fast idiom for tensors in a Dataset: a BatchSampler as sampler with
    batch_size=None reads each batch with one indexing, and the fit takes it as any
    loader."""
    x, y = problem()
    dataset = TensorDataset(x, y)
    loader = DataLoader(dataset, sampler=BatchSampler(EpochOrder(N, 3), B, False),
                        batch_size=None)
    assert_same(fit((loader,), num_data=N), fit((x, y), batch_size=B))


def seeded_loaders(**options) -> tuple[DataLoader, DataLoader]:
    """Two equal loaders over one TensorDataset, each shuffled by its own generator of one
    seed (so both draw the same orders)."""
    dataset = TensorDataset(*problem(N - 3))
    return tuple(DataLoader(dataset, sampler=RandomSampler(
        dataset, generator=torch.Generator().manual_seed(5)), **options) for _ in range(2))


@pytest.mark.parametrize("options", [
    dict(batch_size=B), dict(batch_size=B, drop_last=True), dict(batch_size=None)])
def test_a_tensor_dataset_is_read_in_the_batches_its_loader_yields(options):
    """One indexing per batch of the sampler's indices (or per index, batch_size=None)
    gives the loader's own batches, pass after pass."""
    fast, loader = seeded_loaders(**options)
    for _ in range(2):
        got, expected = list(tensor_batches(fast)), list(loader)
        assert len(got) == len(expected) > 0
        for a, b in zip(got, expected):
            assert len(a) == len(b) == 2
            for u, v in zip(a, b):
                assert torch.equal(u, v)


@pytest.mark.parametrize("loader", [
    DataLoader(TensorDataset(*problem()), batch_size=B, collate_fn=lambda items: items),
    DataLoader(TensorDataset(*problem()), batch_size=B, num_workers=1),
    DataLoader(list(zip(*problem())), batch_size=B),
    [problem()],
])
def test_other_loaders_are_read_as_they_are(loader):
    assert tensor_batches(loader) is None


def test_a_short_last_batch_pads_to_the_first_batch_and_traces_once():
    """N = 40 in batches of 16, 16, 8: the short batch enters as 16 rows (its own points
    repeated, weights 2 and 0), so the JIT step keeps one trace."""
    x, y = problem(40)
    model = BayesianMLP(2, 1, hidden=(4,)).double()
    step = LoaderStep(model, AutoDelta(model), as_batches(DataLoader(TensorDataset(x, y),
                                                                     batch_size=B)),
                      lr=0.01, jit=True)
    for _ in range(3):
        step()
    assert step.x.shape[0] == B
    torch.testing.assert_close(step.x, x[[*range(32, 40), *range(32, 40)]])
    assert step.padded(torch.arange(B))[1].tolist() == [2.0] * 8 + [0.0] * 8
    assert len(step._compiled) == 1
