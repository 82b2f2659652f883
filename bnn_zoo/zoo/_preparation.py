"""The data of a zoo fit, checked and prepared for the method: the task and targets, the
standardisation with the training statistics, the held-out points of a tuned noise scale,
and the number of outputs.

An entry's method always fits standardised data: every input column (every pixel of an
image) and, for regression, the targets are shifted and scaled by their training mean and
standard deviation; [`Fitted`][bnn_zoo.zoo.Fitted] maps its predictions back to the caller's
units with the same statistics.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from bnn_zoo._core import distributed
from bnn_zoo._core.batches import Batches, Moments, as_batches
from bnn_zoo._core.checks import check_data
from bnn_zoo._core.data import holdout
from bnn_zoo._core.scaling import Standardizer
from bnn_zoo._core.tasks import task_named
from bnn_zoo.methods._base import Budget, UnsupportedProblem

__all__ = ["TrainingData", "check_inputs", "check_targets", "loader_training_data", "output_dim",
           "training_data"]


class TrainingData(NamedTuple):
    """What a method fits: the scalers of ``x`` and (regression) ``y``, the standardised
    ``x`` and ``y`` (or the standardised batches of a loader, and ``y`` ``None``), and the
    held-out standardised ``(x, y)`` on which the noise scale is tuned (``None`` without
    validation)."""

    x_scaler: Standardizer
    y_scaler: Standardizer | None
    x: Tensor | Batches
    y: Tensor | None
    validation: tuple[Tensor, Tensor] | None


def check_inputs(entry: str, x: object, y: object, *, net: bool) -> tuple[Tensor, Tensor]:
    """``x`` and ``y`` as tensors, checked (see `check_data`):
    ``x`` of any shape (N, ...) for a fit of a user's network (``net``), of shape (N, D) for
    the model of entry ``entry``."""
    x, _ = check_data(x, any_shape=True)
    if not net and x.dim() != 2:
        raise ValueError(f"Expected x of shape (N, D) (2 dimensions) for entry "
                         f"{entry!r}'s own model, but got shape {tuple(x.shape)}; "
                         "inputs of other shapes need a network that takes them "
                         "(entry.fit(..., net=...)).")
    return check_data(x, y, any_shape=True)


def check_targets(entry: str, tasks: tuple[str, ...], y: Tensor, task: str | None,
                  name: str = "y") -> tuple[str, Tensor]:
    """The task (``task``, or inferred from ``y``'s dtype) and the checked targets ``y``
    (named ``name`` in errors): floats of shape (N,) (one output) or (N, D) (D >= 2 outputs,
    each standardised with its own statistics) for regression, labels 0..C-1 of shape
    (N,) for classification; a task outside ``tasks``, those entry ``entry`` supports,
    raises [`UnsupportedProblem`][]."""
    if task is not None:
        task_named(task)
    task = task or ("classification" if not y.is_floating_point() else "regression")
    if task not in tasks:
        raise UnsupportedProblem(
            f"Entry {entry!r} supports {', '.join(tasks)}, not {task!r}.")
    return task, task_named(task).check(y, name)


def training_data(x: Tensor, y: Tensor, task: str, budget: Budget, validation: float,
                  seed: int, *, entry: str, tunable_noise: bool) -> TrainingData:
    """The scalers of ``x`` and (regression) ``y``, fitted on the training data (on all
    shards with ``budget.distributed``), the standardised data, and the held-out points
    (the fraction ``validation`` > 0, regression only) split off with ``seed``; validation
    of entry ``entry`` needs ``tunable_noise`` (one noise scale to tune)."""
    fit_scaler = distributed.fit_standardizer if budget.distributed else Standardizer.fit
    x_scaler = fit_scaler(x)
    y_scaler = task_named(task).scaler(y, fit_scaler)
    xs = x_scaler.transform(x)
    ys = y_scaler.transform(y) if y_scaler is not None else y
    if validation == 0 or not task_named(task).noisy:
        return TrainingData(x_scaler, y_scaler, xs, ys, None)
    if not tunable_noise:
        raise ValueError(f"Entry {entry!r} has no single noise scale to tune: "
                         "expected validation=0.")
    xs, ys, x_val, y_val = holdout(xs, ys, validation, seed=seed)
    return TrainingData(x_scaler, y_scaler, xs, ys, (x_val, y_val))


def output_dim(task: str, y: Tensor, *, distributed_fit: bool = False) -> int:
    """The number of outputs of the model: for regression 1 (``y`` (N,)) or D (``y``
    (N, D)), for classification the number of classes ``max(y) + 1`` (of all the shards
    together with ``distributed_fit``)."""
    return task_named(task).outputs(y, distributed_fit=distributed_fit)


def loader_training_data(entry: str, tasks: tuple[str, ...], loader: object, y: object,
                         task: str | None, budget: Budget, validation: float, *, net: bool,
                         num_data: int | None) -> tuple[str, TrainingData, int]:
    """The task, the `TrainingData` and the number of outputs of a fit of entry
    ``entry`` on ``loader`` (see [`as_batches`][bnn_zoo._core.batches.as_batches]): one pass over
    it checks every batch (inputs as those of the first, targets by
    `check_targets`) and gathers the standardisation statistics
    ([`Moments`][bnn_zoo._core.batches.Moments]), the number of points and of classes; the
    data is then the loader's [`Batches`][bnn_zoo._core.batches.Batches] of ``N`` points,
    each batch checked and standardised as it is drawn. ``num_data``, where given, must
    be that count. Validation and distributed training need the data as tensors."""
    if y is not None:
        raise ValueError("Expected y=None with a loader for x: the loader yields the targets "
                         "with the inputs.")
    for name, value, default in (("validation", validation, 0.0),
                                 ("distributed", budget.distributed, False)):
        if value != default:
            raise ValueError(f"Expected {name}={default} with a loader for x: {name} needs "
                             "the training data as tensors x, y.")
    first = as_batches(loader, name="x", sized=False).raw_first  # N: counted below
    x0, _ = check_inputs(entry, *first, net=net)
    task, _ = check_targets(entry, tasks, first[1], task)

    def checked(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if x.shape[1:] != x0.shape[1:] or x.dtype != x0.dtype or x.device != x0.device:
            raise ValueError(f"Expected every batch's x like the first's: shape (B, "
                             f"{', '.join(map(str, x0.shape[1:]))}) of {x0.dtype} on "
                             f"{x0.device}, but got {tuple(x.shape)} of {x.dtype} on "
                             f"{x.device}.")
        return x, check_targets(entry, tasks, y, task)[1]

    raw = Batches(loader, 1, first).map(checked)
    targets = task_named(task)
    x_moments, y_statistics = Moments(), targets.statistics()
    for x, y in raw:
        x_moments.update(x)
        y_statistics.update(y)
    if num_data is not None and num_data != x_moments.count:
        raise ValueError(f"Expected num_data to be the number of points the loader yields "
                         f"in one pass, {x_moments.count}, but got {num_data!r}.")
    x_scaler = Standardizer.from_mean_std(x_moments.mean, x_moments.std)
    y_scaler = targets.loader_scaler(y_statistics)

    def standardised(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return x_scaler.transform(x), y if y_scaler is None else y_scaler.transform(y)

    batches = Batches(loader, x_moments.count, first).map(checked).map(standardised)
    return task, TrainingData(x_scaler, y_scaler, batches, None, None), targets.loader_outputs(
        y_statistics)
