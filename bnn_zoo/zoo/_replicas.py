"""The training sets of ``Entry.fit_many``: R sets of equal size (or one set that R seeds
fit), checked and stacked as the replicas of one pass ([`bnn_zoo._core.replicas`][]).

Whether an entry batches is declared by its method, not tried: a method with
``replicas=True`` ([`SVI`][bnn_zoo.methods.SVI] of the zoo's MLP with the ``map``,
``mean_field`` and ``bbb`` guides; [`Ensemble`][bnn_zoo.methods.Ensemble] of such
members, whose R fits of M members train as R x M replicas;
[`Laplace`][bnn_zoo.methods.laplace.Laplace], for its MAP phases) trains them in one pass;
every other method (NUTS, exact GP) and a data-parallel budget (``distributed=True``) fit
one by one through ``Entry.fit``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from torch import Tensor

from bnn_zoo._core.checks import check_data, check_seed

__all__ = ["training_sets"]


def training_sets(xs: object, ys: object, seeds: object, *, any_shape: bool = False
                  ) -> tuple[list[Tensor], list[Tensor], list[int]]:
    """The R training sets and seeds of `fit_many`, checked.

    ``xs`` is a sequence of R inputs (N, D) or one array (R, N, D), ``ys`` likewise R
    targets (N,) or (R, N); or ``xs`` (N, D) and ``ys`` (N,) are one training set that every
    seed fits. ``seeds`` is a sequence of R ints >= 0. Every set must have the same size.
    With ``any_shape`` (a user's network) the inputs of a set may have any shape (N, ...):
    ``ys`` of shape (N,) then marks one training set.
    """
    if isinstance(seeds, (str, bytes, Mapping)) or not isinstance(seeds, Sequence) or not seeds:
        raise TypeError(f"Expected seeds to be a non-empty sequence of ints >= 0, but got "
                        f"{seeds!r}.")
    seeds = [check_seed(f"seeds[{r}]", seed) for r, seed in enumerate(seeds)]
    arrays = (Tensor, np.ndarray)
    if (isinstance(xs, arrays) and xs.ndim == 2) or (
            any_shape and isinstance(xs, arrays) and isinstance(ys, arrays) and ys.ndim == 1):
        x, y = check_data(xs, ys, any_shape=any_shape)
        return [x] * len(seeds), [y] * len(seeds), seeds
    xs, ys = list(xs), list(ys)
    if not (len(xs) == len(ys) == len(seeds)):
        raise ValueError(f"Expected one seed per training set, but got {len(xs)} inputs, "
                         f"{len(ys)} targets and {len(seeds)} seeds.")
    pairs = [check_data(x, y, any_shape=any_shape) for x, y in zip(xs, ys)]
    shapes = [(tuple(x.shape), tuple(y.shape)) for x, y in pairs]
    if len(set(shapes)) > 1:
        raise ValueError(f"Expected training sets of equal size (fit_many stacks them), but "
                         f"got x, y shapes {shapes}.")
    if len({(x.dtype, x.device, y.dtype) for x, y in pairs}) > 1:
        raise ValueError("Expected every training set with the same dtypes and device.")
    return [x for x, _ in pairs], [y for _, y in pairs], seeds
