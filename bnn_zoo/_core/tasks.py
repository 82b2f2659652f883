"""The two tasks a network learns, regression and classification, as objects.

A task owns what the models and the data ask of it: the width of the network's output,
whether the targets carry observation noise ``sigma`` (regression: ``y_n ~ N(f(x_n),
sigma^2)``; classification: ``y_n ~ Categorical(softmax(f(x_n)))``, none), the dtype of the
targets, how a split is stratified, and how a fit's targets are checked and standardised
(regression: with their training statistics; class labels: not at all). `task_named` turns
a user's name into its object, the one place the name is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from bnn_zoo._core import distributed
from bnn_zoo._core.batches import Moments
from bnn_zoo._core.checks import check_choice, check_class_labels
from bnn_zoo._core.scaling import Standardizer

__all__ = ["TASKS", "Classification", "Regression", "Task", "as_floats", "task_named"]


def as_floats(values: object, dtype: torch.dtype) -> Tensor:
    """``values`` (an array) as a tensor of ``dtype``, read through float64."""
    return torch.as_tensor(np.asarray(values, dtype=np.float64)).to(dtype)


class Task:
    """What a model or a data set asks of its task."""

    #: The name a user passes (``task="regression"``).
    name: ClassVar[str]
    #: Whether the targets carry observation noise ``sigma``.
    noisy: ClassVar[bool]
    #: The network's outputs per point, as an error message states them.
    expected_outputs: ClassVar[str]

    def targets(self, values: object, dtype: torch.dtype) -> Tensor:
        """The targets ``values`` (an array) as a tensor; ``dtype`` is the inputs' dtype."""
        raise NotImplementedError

    def out_dim(self, num_classes: int | None) -> int:
        """The width of the network's output on a single-output data set."""
        raise NotImplementedError

    def num_classes(self, y: np.ndarray | Tensor) -> int | None:
        """The number of classes of the labels ``y``; ``None`` without classes."""
        return None

    def stratify(self, y: np.ndarray) -> np.ndarray | None:
        """What a train/test split stratifies by: ``None`` for none."""
        return None

    def width_ok(self, width: int) -> bool:
        """Whether a network with ``width`` outputs suits the task."""
        raise NotImplementedError

    def check_out_dim(self, out_dim: int, heteroscedastic: bool) -> None:
        """Refuse an output width that does not suit the task."""
        raise NotImplementedError

    def noise_scale(self, noise_scale: float | None) -> float | None:
        """The observation noise a model starts from: the user's ``noise_scale`` (``None``:
        learned), or a fixed 1 where the task has none."""
        return noise_scale if self.noisy else 1.0

    def noise_outputs(self, out_dim: int) -> int:
        """How many noise scales a model of ``out_dim`` outputs holds."""
        return out_dim if self.noisy else 1

    def check(self, y: Tensor, name: str) -> Tensor:
        """The targets ``y`` of a fit, checked (named ``name`` in errors)."""
        raise NotImplementedError

    def scaler(self, y: Tensor, fit: Callable[[Tensor], Standardizer]) -> Standardizer | None:
        """The standardisation of the targets ``y``, fitted by ``fit``; ``None`` for none."""
        raise NotImplementedError

    def outputs(self, y: Tensor, *, distributed_fit: bool = False) -> int:
        """The number of outputs of a model of the targets ``y`` (of all the shards with
        ``distributed_fit``)."""
        raise NotImplementedError

    def statistics(self) -> Moments | _Classes:
        """What a pass over a loader's targets gathers (each batch by ``update(y)``)."""
        raise NotImplementedError

    def loader_scaler(self, statistics: Moments | _Classes) -> Standardizer | None:
        """`scaler` from a loader's `statistics`."""
        raise NotImplementedError

    def loader_outputs(self, statistics: Moments | _Classes) -> int:
        """`outputs` from a loader's `statistics`."""
        raise NotImplementedError

    def like(self, x: Tensor) -> Tensor:
        """Two targets for inputs ``x`` (a restore's lazy guides run on them)."""
        raise NotImplementedError

    def net_output(self, shape: tuple[int, ...] | None, n: int, classes: int
                   ) -> tuple[str, bool]:
        """What a network's output on ``n`` points must be, and whether ``shape`` is it."""
        raise NotImplementedError


class _Classes:
    """The number of classes of the labels seen: ``max + 1``."""

    def __init__(self) -> None:
        self.count = 0

    def update(self, y: Tensor) -> None:
        self.count = max(self.count, Classification().num_classes(y))


class Regression(Task):
    """Real targets, float (N,) or (N, D), observed with Gaussian noise."""

    name = "regression"
    noisy = True
    expected_outputs = "(N, 1)"

    def targets(self, values: object, dtype: torch.dtype) -> Tensor:
        return as_floats(values, dtype)

    def out_dim(self, num_classes: int | None) -> int:
        return 1

    def width_ok(self, width: int) -> bool:
        return width == 1

    def check_out_dim(self, out_dim: int, heteroscedastic: bool) -> None:
        if out_dim < 1 or (heteroscedastic and out_dim != 1):
            raise ValueError(f"Expected out_dim >= 1 for regression (1 with "
                             f"noise='heteroscedastic'), but got {out_dim}.")

    def check(self, y: Tensor, name: str) -> Tensor:
        if not y.is_floating_point() or y.dim() not in (1, 2) or (
                y.dim() == 2 and y.shape[1] < 2):
            raise ValueError(f"Expected {name} to be floats of shape (N,) (one output) or "
                             f"(N, D) with D >= 2 outputs for regression, got {y.dtype} of "
                             f"shape {tuple(y.shape)}.")
        return y

    def scaler(self, y: Tensor, fit: Callable[[Tensor], Standardizer]) -> Standardizer:
        return fit(y)

    def outputs(self, y: Tensor, *, distributed_fit: bool = False) -> int:
        return 1 if y.dim() == 1 else y.shape[1]

    def statistics(self) -> Moments:
        return Moments()

    def loader_scaler(self, statistics: Moments) -> Standardizer:
        return Standardizer.from_mean_std(statistics.mean, statistics.std)

    def loader_outputs(self, statistics: Moments) -> int:
        return 1 if statistics.mean.dim() == 0 else statistics.mean.shape[0]

    def like(self, x: Tensor) -> Tensor:
        return x.new_zeros(2)

    def net_output(self, shape: tuple[int, ...] | None, n: int, classes: int
                   ) -> tuple[str, bool]:
        return "(n, 1) for regression", shape == (n, 1)


class Classification(Task):
    """Class labels, int64 (N,), observed through the softmax of K >= 2 outputs."""

    name = "classification"
    noisy = False
    expected_outputs = "(N, K) with K >= 2 classes"

    def targets(self, values: object, dtype: torch.dtype) -> Tensor:
        return torch.as_tensor(np.asarray(values), dtype=torch.int64)

    def out_dim(self, num_classes: int | None) -> int:
        return int(num_classes)

    def num_classes(self, y: np.ndarray | Tensor) -> int | None:
        return int(y.max()) + 1

    def stratify(self, y: np.ndarray) -> np.ndarray | None:
        return y

    def width_ok(self, width: int) -> bool:
        return width >= 2

    def check_out_dim(self, out_dim: int, heteroscedastic: bool) -> None:
        if not self.width_ok(out_dim):
            raise ValueError(f"Expected out_dim >= 2 classes for classification, got {out_dim}.")

    def check(self, y: Tensor, name: str) -> Tensor:
        if y.dim() != 1:
            raise ValueError(f"Expected {name} to be class labels 0..C-1 of shape (N,) for "
                             f"classification, got shape {tuple(y.shape)}.")
        return check_class_labels(name, y)

    def scaler(self, y: Tensor, fit: Callable[[Tensor], Standardizer]) -> None:
        return None

    def outputs(self, y: Tensor, *, distributed_fit: bool = False) -> int:
        classes = self.num_classes(y)
        return distributed.global_max(classes, y.device) if distributed_fit else classes

    def statistics(self) -> _Classes:
        return _Classes()

    def loader_scaler(self, statistics: _Classes) -> None:
        return None

    def loader_outputs(self, statistics: _Classes) -> int:
        return statistics.count

    def like(self, x: Tensor) -> Tensor:
        return x.new_zeros(2, dtype=torch.long)

    def net_output(self, shape: tuple[int, ...] | None, n: int, classes: int
                   ) -> tuple[str, bool]:
        least = max(classes, 2)
        return (f"(n, K) class logits with K >= {least} (the classes of y)",
                shape is not None and len(shape) == 2 and shape[0] == n and shape[1] >= least)


_BY_NAME = {kind.name: kind for kind in (Regression(), Classification())}
#: The names of the tasks.
TASKS = tuple(_BY_NAME)


def task_named(name: str) -> Task:
    """The task called ``name``; a ``ValueError`` lists the names for any other."""
    return _BY_NAME[check_choice("task", name, TASKS)]
