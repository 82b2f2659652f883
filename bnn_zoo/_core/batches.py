"""Data sets given as minibatches: a loader (a ``torch.utils.data.DataLoader``, or any
re-iterable of ``(x, y)`` batches) in place of the tensors ``x``, ``y``, for data that does
not fit in memory.

[`as_batches`][] checks a loader and wraps it in [`Batches`][], which knows the size
``N`` of the data set (``num_data``, or ``len(loader.dataset)``) and yields each batch
checked, through the per-batch transforms added by `Batches.map`
(the standardisation of a zoo entry's fit). What takes a loader reads it in one of two ways:

* SVI ([`LoaderStep`][bnn_zoo._core.batch_step.LoaderStep]) draws one batch per step and scales
  its likelihood by ``N / B`` through the data plate, as a minibatch of in-memory tensors;
* sums over the data (the Laplace curvature and energies, the streaming standardisation
  statistics [`Moments`][], the metrics of a test set) go through every batch once:
  [`chunks`][] yields the same chunks of points from tensors or from a loader.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset, default_collate, default_convert

from bnn_zoo._core.checks import check_data, check_positive_int, check_tensor

__all__ = ["Batches", "Moments", "as_batches", "chunks", "first_inputs", "is_loader", "num_points",
           "num_targets", "summed", "tensor_batches"]

#: ``transform(x, y) -> (x, y)``, applied to every batch as it is drawn.
Transform = Callable[[Tensor, Tensor | None], tuple[Tensor, Tensor | None]]


def is_loader(value: object, y: object = None) -> bool:
    """Whether ``value`` is given as batches: iterable, and neither a tensor nor an array
    (both of which iterate over their rows); a list or tuple only without targets ``y``
    (with them it is data of the wrong type, named as such by the data checks)."""
    if isinstance(value, (list, tuple)) and y is not None:
        return False
    return (not isinstance(value, (Tensor, np.ndarray, str, bytes))
            and hasattr(value, "__iter__"))


def _unpack(item: object, index: int, targets: bool, check: bool = True
            ) -> tuple[Tensor, Tensor | None]:
    """Batch ``index`` of a loader, ``(x, y)`` (or ``x`` alone, or ``[x]``, where
    ``targets`` is false), checked by `check_data` unless
    ``check`` is false (the batches of a ``TensorDataset`` checked whole, see
    [`as_batches`][])."""
    if isinstance(item, (tuple, list)) and len(item) == 2:
        x, y = item
    elif not targets and isinstance(item, (tuple, list)) and len(item) == 1:
        x, y = item[0], None  # a TensorDataset of inputs alone yields [x]
    elif not targets and not isinstance(item, (tuple, list, dict)):
        x, y = item, None
    else:
        kind = f"a {type(item).__name__}" + (f" of {len(item)}" if isinstance(
            item, (tuple, list)) else "")
        raise ValueError(f"Expected the loader to yield (x, y) pairs of tensors"
                         f"{'' if targets else ' or x alone'}, but batch {index} is {kind}.")
    if not check:
        return x, (y if targets else None)
    try:
        x, y = check_data(x, y, any_shape=True)
    except (TypeError, ValueError) as error:
        raise type(error)(f"Batch {index} of the loader: {error}") from None
    return x, (y if targets else None)


class Batches:
    """A checked loader: re-iterable, yielding ``(x, y)`` batches of a data set of
    ``num_data`` points through the transforms of [`map`][].

    ``raw_first`` is the first batch as it comes (drawn once when the loader is checked),
    ``first`` the same through the transforms: what a fit reads shapes, dtype and device
    from. ``num_batches`` is ``len(loader)``
    where the loader has one, else ``ceil(num_data / first batch size)`` (``None`` where
    both are unknown).
    """

    def __init__(self, loader: Iterable, num_data: int | None, first: tuple[Tensor, Tensor | None],
                 *, targets: bool = True, transforms: tuple[Transform, ...] = ()) -> None:
        self.loader, self.num_data, self.targets = loader, num_data, targets
        self.transforms = transforms
        self.raw_first = first
        self.first = self._apply(*first)
        try:
            self.num_batches = len(loader)  # type: ignore[arg-type]
        except TypeError:
            self.num_batches = None if num_data is None else math.ceil(
                num_data / first[0].shape[0])

    def _apply(self, x: Tensor, y: Tensor | None) -> tuple[Tensor, Tensor | None]:
        for transform in self.transforms:
            x, y = transform(x, y)
        return x, y

    def map(self, transform: Transform) -> Batches:
        """These batches with ``transform`` applied to each after the transforms so far."""
        return Batches(self.loader, self.num_data, self.raw_first, targets=self.targets,
                       transforms=(*self.transforms, transform))

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor | None]]:
        fast = tensor_batches(self.loader)
        for index, item in enumerate(fast or self.loader):
            yield self._apply(*_unpack(item, index, self.targets, check=fast is None))


def tensor_batches(loader: Iterable) -> Iterator[list[Tensor]] | None:
    """The batches of a ``DataLoader`` over a ``TensorDataset`` (default collation, no
    worker processes, no pinned memory) read with one indexing of each tensor per batch of
    indices its sampler draws: the batches the loader yields, without its ``__getitem__``
    per point and the stacking of the points. ``None`` for any other loader, which is read
    as it is."""
    if not (isinstance(loader, DataLoader) and type(loader.dataset) is TensorDataset
            and loader.num_workers == 0 and not loader.pin_memory):
        return None
    if loader.batch_sampler is not None and loader.collate_fn is default_collate:
        indices = loader.batch_sampler
    elif loader.batch_sampler is None and loader.collate_fn is default_convert:
        indices = loader.sampler  # batch_size=None: each draw indexes the data set once
    else:
        return None
    tensors = loader.dataset.tensors
    return ([t[torch.as_tensor(index)] for t in tensors] for index in indices)


def as_batches(loader: object, num_data: int | None = None, *, name: str = "x",
               targets: bool = True, sized: bool = True) -> Batches:
    """``loader`` checked as [`Batches`][] (a [`Batches`][] is returned as it is).

    It must be re-iterable (every ``iter(loader)`` a fresh pass: a ``DataLoader``, a list
    of batches; not a generator, which is used up after one pass) and yield ``(x, y)``
    pairs (or ``x`` alone where ``targets`` is false). ``num_data``, the size ``N`` of the
    data set, defaults to ``len(loader.dataset)`` (left ``None`` where it is unknown and
    not ``sized``: predictions and metrics need no ``N``). Errors name ``name`` (the
    argument the loader was passed as) or ``num_data``. Every batch is checked as it is
    drawn, but those of a ``TensorDataset`` read by [`tensor_batches`][], whose tensors
    are checked whole here."""
    if isinstance(loader, Batches):
        return loader
    if iter(loader) is loader:
        raise ValueError(f"Expected {name} to be re-iterable (a DataLoader, or a list of "
                         f"batches): every pass needs a fresh iterator, but got "
                         f"{type(loader).__name__}, an iterator that can be gone through once.")
    if num_data is None:
        try:
            num_data = len(loader.dataset)  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            if sized:
                raise ValueError(f"Expected num_data, the number of points in the data "
                                 f"set: {name} ({type(loader).__name__}) has no dataset whose "
                                 "len() gives it.") from None
    check_positive_int("num_data", num_data, allow_none=not sized)
    item = next(iter(loader), None)
    if item is None:
        raise ValueError(f"Expected {name} to yield at least one batch, but it is empty.")
    if tensor_batches(loader) is not None:  # its batches are parts of tensors checked here
        for i, tensor in enumerate(loader.dataset.tensors):  # type: ignore[attr-defined]
            check_tensor(f"{name}.dataset.tensors[{i}]", tensor)
    return Batches(loader, num_data, _unpack(item, 0, targets), targets=targets)


def first_inputs(x: Tensor | Batches) -> Tensor:
    """``x``, or the inputs of the first batch of [`Batches`][] ``x``: what a model or
    guide reads its device, dtype and input shape from."""
    return x.first[0] if isinstance(x, Batches) else x


def chunks(x: Tensor | Batches, y: Tensor | None, size: int
           ) -> Iterator[tuple[Tensor, Tensor | None]]:
    """The data in chunks of at most ``size`` points: the tensors ``x``, ``y`` split, or
    each batch of [`Batches`][] ``x`` split (``y`` is then ``None``), so a sum over the
    data is the same sum over the same chunks whichever way the data came."""
    for xb, yb in (x if isinstance(x, Batches) else [(x, y)]):
        yield from zip(xb.split(size), [None] * math.ceil(xb.shape[0] / size)
                       if yb is None else yb.split(size))


def summed(fn: Callable[[Tensor, Tensor], tuple[Tensor, ...]], x: Tensor | Batches,
           y: Tensor | None) -> tuple[Tensor, ...]:
    """``fn(x, y)``, a tuple of sums over the data points; for a loader's
    [`Batches`][bnn_zoo._core.batches.Batches] ``x`` (``y`` ``None``) the sum of ``fn`` over its
    batches, one pass."""
    if not isinstance(x, Batches):
        return fn(x, y)
    total: tuple[Tensor, ...] | None = None
    for xb, yb in x:
        parts = fn(xb, yb)
        total = parts if total is None else tuple(a + b for a, b in zip(total, parts))
    return total


def num_points(x: Tensor | Batches) -> int:
    """The number of data points: ``len(x)``, or a loader's ``num_data``."""
    return x.num_data if isinstance(x, Batches) else x.shape[0]


def num_targets(x: Tensor | Batches, y: Tensor | None) -> int:
    """The number of observed numbers: ``y.numel()``, or for a loader ``num_data`` times
    those of one point of its first batch."""
    if not isinstance(x, Batches):
        return y.numel()
    first = x.first[1]
    return x.num_data * (first.numel() // first.shape[0])


@dataclass
class Moments:
    """The count, mean and summed squared deviations of the rows of a stream of tensors,
    merged batch by batch by the pairwise update of Chan, Golub & LeVeque (1979, "Updating
    formulae and a pairwise algorithm for computing sample variances"): a batch of ``m``
    rows with mean ``mu_b`` and squared deviations ``M_b`` joins ``n`` rows as

    .. math::

        \\delta = \\mu_b - \\mu, \\quad \\mu \\leftarrow \\mu + \\delta \\frac{m}{n + m},
        \\quad M \\leftarrow M + M_b + \\delta^2 \\frac{n m}{n + m}.
    """

    count: int = 0
    mean: Tensor | None = None
    squares: Tensor | None = None

    def update(self, t: Tensor) -> None:
        """Add the rows of ``t`` (m, ...)."""
        m = t.shape[0]
        mean = t.mean(0)
        squares = (t - mean).square().sum(0)
        if self.mean is None:
            self.count, self.mean, self.squares = m, mean, squares
            return
        total = self.count + m
        delta = mean - self.mean
        self.mean = self.mean + delta * (m / total)
        self.squares = self.squares + squares + delta.square() * (self.count * m / total)
        self.count = total

    @property
    def std(self) -> Tensor:
        """The population standard deviation ``sqrt(M / n)``."""
        return (self.squares / self.count).sqrt() if self.count > 1 \
            else torch.ones_like(self.mean)
