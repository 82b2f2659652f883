"""``Entry.fit_many``: R independent fits of one entry, as replicas in one pass where the
entry's method can batch them (:mod:`bnn_zoo.core.replicas`), one by one where not.

Whether an entry batches is declared by its method, not tried: a method with
``replicas=True`` (:class:`~bnn_zoo.methods.svi.SVI` of the zoo's MLP with the ``map``,
``mean_field`` and ``bbb`` guides; :class:`~bnn_zoo.methods.ensemble.Ensemble` of such
members, whose R fits of M members train as R x M replicas;
:class:`~bnn_zoo.methods.laplace.Laplace`, for its MAP phases) has a ``fit_many``; every
other method (NUTS, exact GP) and a data-parallel budget (``distributed=True``) fit one by
one through :meth:`Entry.fit`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from bnn_zoo.core.checks import check_bool, check_data, check_seed
from bnn_zoo.evaluation.noise_tuning import tune_noise
from bnn_zoo.methods.base import Budget
from bnn_zoo.zoo._fitted import Fitted
from bnn_zoo.zoo._networks import Network
from bnn_zoo.zoo._preparation import check_targets, output_dim, training_data

if TYPE_CHECKING:  # Entry.fit_many calls fit_many: the entry is only an annotation here
    from bnn_zoo.zoo._entry import Entry

__all__ = ["batches_replicas", "fit_many", "training_sets"]


def _configure(entry: Entry, model_options: Mapping[str, Any] | None,
               guide_options: Mapping[str, Any] | None,
               method_options: Mapping[str, Any] | None, budget_overrides: dict
               ) -> tuple[dict, dict, object, Budget, bool]:
    """The checked options, model options, method and budget of a fit, and whether its
    fits batch: the method declares ``replicas=True`` and the budget is not distributed."""
    options, model_kw, method, budget = entry.settings(model_options, guide_options,
                                                       method_options, budget_overrides)
    batches = bool(getattr(method, "replicas", False)) and not budget.distributed
    return options, model_kw, method, budget, batches


def batches_replicas(entry: Entry, *, model_options: Mapping[str, Any] | None = None,
                     guide_options: Mapping[str, Any] | None = None,
                     method_options: Mapping[str, Any] | None = None,
                     **budget_overrides: Any) -> bool:
    """Whether ``entry.fit_many`` with these options (those of :meth:`Entry.fit`) trains
    its fits as replicas in one pass rather than one by one."""
    return _configure(entry, model_options, guide_options, method_options,
                      budget_overrides)[-1]


def training_sets(xs: object, ys: object, seeds: object, *, any_shape: bool = False
                  ) -> tuple[list[Tensor], list[Tensor], list[int]]:
    """The R training sets and seeds of :func:`fit_many`, checked.

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


def fit_many(entry: Entry, xs: object, ys: object, *, seeds: Sequence[int],
             task: str | None = None, progress: bool | None = False,
             model_options: Mapping[str, Any] | None = None,
             guide_options: Mapping[str, Any] | None = None,
             method_options: Mapping[str, Any] | None = None, net: Network | None = None,
             **budget_overrides: Any) -> list[Fitted]:
    """R independent fits of ``entry``: fit ``r`` on ``xs[r]``, ``ys[r]`` (see
    :func:`training_sets`) from ``seeds[r]``; the options are those of :meth:`Entry.fit`.
    Fits of a user's network (``net``) run one by one.

    Each :class:`~bnn_zoo.zoo.Fitted` behaves as one from ``entry.fit``: standardised with
    its own training statistics, predicting, evaluating and saving alike. Where the entry
    batches (:func:`batches_replicas`), fit ``r`` starts from the initial values of
    ``entry.fit(xs[r], ys[r], seed=seeds[r])`` and follows its trajectory up to round-off
    when the fit is deterministic (MAP on full batches); in general every fit takes the
    minibatch order of ``seeds[0]`` and noise of its own, so fits agree with ``entry.fit``
    in distribution. Its ``fit_seconds`` is the batch's wall time shared equally. For
    classification the number of classes is that of all the sets together.
    """
    xs, ys, seeds = training_sets(xs, ys, seeds, any_shape=net is not None)
    check_bool("progress", progress, allow_none=True)
    options, model_kw, method, budget, batches = _configure(
        entry, model_options, guide_options, method_options, budget_overrides)
    if not batches or net is not None:
        return [entry.fit(x, y, task=task, seed=seed, progress=progress, net=net, **options,
                          **budget_overrides) for x, y, seed in zip(xs, ys, seeds)]
    task, _ = check_targets(entry.name, entry.tasks, ys[0], task, "ys[0]")
    ys = [check_targets(entry.name, entry.tasks, y, task, f"ys[{r}]")[1]
          for r, y in enumerate(ys)]
    started = time.perf_counter()
    prepared = [training_data(x, y, task, budget, seed, entry=entry.name,
                              tunable_noise=entry.tunable_noise)
                for x, y, seed in zip(xs, ys, seeds)]
    x = torch.stack([p.x for p in prepared])
    y = torch.stack([p.y for p in prepared])
    out_dim = output_dim(task, y.flatten(0, 1))  # the R sets stacked: one set of R N rows
    build_model = entry.model_factory(x.shape[-1], out_dim, task, model_kw, x)
    posteriors = method.fit_many(build_model, x, y, task=task, seeds=seeds,
                                 budget=replace(budget, validation=0.0), progress=progress)
    posteriors = [posterior if p.validation is None else tune_noise(posterior, *p.validation)
                  for posterior, p in zip(posteriors, prepared)]
    seconds = (time.perf_counter() - started) / len(seeds)
    return [Fitted(entry.name, task, p.x_scaler, p.y_scaler, posterior, seconds, x.shape[-1],
                   out_dim, options) for p, posterior in zip(prepared, posteriors)]
