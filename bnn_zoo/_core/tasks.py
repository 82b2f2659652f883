"""The two tasks a network learns, regression and classification, as objects.

A task owns what the models and the data ask of it: the width of the network's output,
whether the targets carry observation noise ``sigma`` (regression: ``y_n ~ N(f(x_n),
sigma^2)``; classification: ``y_n ~ Categorical(softmax(f(x_n)))``, none), the dtype of the
targets and how a split is stratified. `task_named` turns a user's name into its object,
the one place the name is read.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from bnn_zoo._core.checks import check_choice

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

    def num_classes(self, y: np.ndarray) -> int | None:
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


class Classification(Task):
    """Class labels, int64 (N,), observed through the softmax of K >= 2 outputs."""

    name = "classification"
    noisy = False
    expected_outputs = "(N, K) with K >= 2 classes"

    def targets(self, values: object, dtype: torch.dtype) -> Tensor:
        return torch.as_tensor(np.asarray(values), dtype=torch.int64)

    def out_dim(self, num_classes: int | None) -> int:
        return int(num_classes)

    def num_classes(self, y: np.ndarray) -> int | None:
        return int(y.max()) + 1

    def stratify(self, y: np.ndarray) -> np.ndarray | None:
        return y

    def width_ok(self, width: int) -> bool:
        return width >= 2

    def check_out_dim(self, out_dim: int, heteroscedastic: bool) -> None:
        if not self.width_ok(out_dim):
            raise ValueError(f"Expected out_dim >= 2 classes for classification, got {out_dim}.")


_BY_NAME = {kind.name: kind for kind in (Regression(), Classification())}
#: The names of the tasks.
TASKS = tuple(_BY_NAME)


def task_named(name: str) -> Task:
    """The task called ``name``; a ``ValueError`` lists the names for any other."""
    return _BY_NAME[check_choice("task", name, TASKS)]
