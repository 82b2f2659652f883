"""Argument checks shared by the public API.

Every check raises ``ValueError`` or ``TypeError`` with a message that names the
argument and says what was expected, so bad input never reaches Pyro or torch
as an opaque shape error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["as_data_tensor", "check_bool", "check_choice", "check_class_labels", "check_data",
           "check_device", "check_fraction", "check_module_device", "check_positive",
           "check_positive_int", "check_seed", "check_tensor", "check_values", "same_device"]


def check_tensor(name: str, value: object, *, ndim: int | Sequence[int] | None = None,
                 floating: bool | None = None) -> Tensor:
    """Return ``value`` if it is a finite, non-empty tensor of the expected rank.

    ``floating=True`` requires a floating dtype, ``False`` an integer dtype.
    """
    if not isinstance(value, Tensor):
        raise TypeError(f"Expected {name} to be a torch.Tensor, but got {type(value).__name__}.")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if value.dim() not in allowed:
            raise ValueError(
                f"Expected {name} to have {' or '.join(map(str, allowed))} dimensions, "
                f"but got shape {tuple(value.shape)}."
            )
    if value.numel() == 0:
        raise ValueError(f"Expected {name} to be non-empty, but got shape {tuple(value.shape)}.")
    if floating is True and not value.is_floating_point():
        raise TypeError(f"Expected {name} to have a floating dtype, but got {value.dtype}.")
    if floating is False and (value.is_floating_point() or value.is_complex()):
        raise TypeError(f"Expected {name} to have an integer dtype, but got {value.dtype}.")
    # A meta tensor has no values to check (it stands in for a device in tests).
    if (value.is_floating_point() and not value.is_meta
            and not bool(torch.isfinite(value).all())):
        raise ValueError(f"Expected {name} to contain only finite values, but found NaN or inf.")
    return value


def as_data_tensor(name: str, value: object) -> object:
    """``value`` as the data tensor it unambiguously stands for, anything else unchanged.

    A numpy array (what scikit-learn users pass) becomes the tensor with the same values and
    dtype (float64 stays float64; integer labels become int64); a tensor that requires
    gradients is detached, since data are constants of the fit.
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"Expected {name} to hold numbers, but got a numpy array of dtype "
                            f"{value.dtype}.")
        array = np.ascontiguousarray(value)
        return torch.from_numpy(array.astype(np.int64) if array.dtype.kind in "bui" else array)
    if isinstance(value, Tensor) and value.requires_grad:
        return value.detach()
    return value


def check_values(name: str, value: Tensor) -> Tensor:
    """Return ``value`` if it holds values: a tensor on the ``meta`` device has a shape and
    a dtype but no data, and nothing can be fitted to it or predicted at it."""
    if value.is_meta:
        raise ValueError(f"Expected {name} on a device that holds data ('cpu', 'cuda'), but it "
                         "is on the 'meta' device, which holds shapes without values; pass "
                         f"{name} with its values, e.g. {name}.to('cpu').")
    return value


def check_data(x: object, y: object | None = None, *, any_shape: bool = False,
               values: bool = True) -> tuple[Tensor, Tensor | None]:
    """Check inputs ``x`` of shape (N, D) and, if given, targets ``y`` of length N.

    ``any_shape=True`` accepts inputs of any shape (N, ...) (images (N, C, H, W), series
    (N, C, L)), for a model that checks the shape of its own inputs (a user's network:
    [`BayesianModule`][bnn_zoo.models.BayesianModule]). ``values=False`` accepts tensors without
    values (the ``meta`` device, see `check_values`), for the internals that run on
    them. Returns them as tensors: numpy arrays are converted and tensors that require
    gradients detached (see `as_data_tensor`); nothing else is coerced.
    """
    x = check_tensor("x", as_data_tensor("x", x), ndim=None if any_shape else 2, floating=True)
    if any_shape and x.dim() == 0:
        raise ValueError("Expected x to have a first dimension of N data points, but got a "
                         "0-dimensional tensor.")
    if values:
        check_values("x", x)
    if y is None:
        return x, None
    y = check_tensor("y", as_data_tensor("y", y), ndim=(1, 2))
    if values:
        check_values("y", y)
    if y.shape[0] != x.shape[0]:
        raise ValueError(
            f"Expected y to have one row per row of x ({x.shape[0]}), but got {y.shape[0]}."
        )
    if y.device != x.device:
        raise ValueError(f"Expected x and y on the same device, but got {x.device} and {y.device}.")
    return x, y


def check_positive(name: str, value: object, *, allow_none: bool = False) -> float | None:
    """Return ``value`` as a float if it is a finite number > 0."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Expected {name} to be a number > 0, but got {value!r}.")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"Expected {name} > 0, but got {value!r}.")
    return float(value)


def check_positive_int(name: str, value: object, *, allow_none: bool = False) -> int | None:
    """Return ``value`` if it is an int >= 1."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Expected {name} to be an integer >= 1, but got {value!r}.")
    if value < 1:
        raise ValueError(f"Expected {name} >= 1, but got {value!r}.")
    return value


def check_seed(name: str, value: object, *, allow_none: bool = False) -> int | None:
    """Return ``value`` as an int if it is an integer >= 0 (a Python or numpy integer; not
    a bool, not a float)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"Expected {name} to be an integer >= 0, but got {value!r}.")
    if value < 0:
        raise ValueError(f"Expected {name} >= 0, but got {value!r}.")
    return int(value)


def check_bool(name: str, value: object, *, allow_none: bool = False) -> bool | None:
    """Return ``value`` if it is ``True`` or ``False`` (not 0/1, not a string)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        expected = "True, False or None" if allow_none else "True or False"
        raise TypeError(f"Expected {name} to be {expected}, but got {value!r}.")
    return value


def check_fraction(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Expected {name} to be a number in [0, 1), but got {value!r}.")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"Expected {name} in [0, 1), but got {value!r}.")
    return float(value)


def check_class_labels(name: str, y: Tensor, num_classes: int | None = None) -> Tensor:
    """``y`` as int64 class labels in ``0..num_classes-1`` (``None``: any labels >= 0).

    Float labels are accepted only when every value is an integer (``1.0``, as numpy and
    scikit-learn users often hold labels) and then cast; any fractional label is refused
    rather than cut to a class.
    """
    if y.dtype == torch.bool or y.is_complex():
        raise TypeError(f"Expected {name} to hold integer class labels, but got {y.dtype}.")
    if y.is_floating_point():
        if not bool((y == y.round()).all()):
            raise TypeError(f"Expected {name} to hold integer class labels (classification), "
                            f"but got {y.dtype} values with a fractional part.")
    y = y.long()
    low, high = int(y.min()), int(y.max())
    if low < 0 and num_classes is None:
        raise ValueError(f"Expected {name} to hold class labels 0..C-1, but got the label {low}.")
    if num_classes is not None and (low < 0 or high >= num_classes):
        raise ValueError(f"Expected {name} to hold class labels 0..{num_classes - 1} of the "
                         f"{num_classes} classes, but got labels from {low} to {high}.")
    return y


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; expected one of: {', '.join(choices)}.")
    return value  # type: ignore[return-value]


def check_device(name: str, device: object, *, expected: torch.device | None = None
                 ) -> torch.device:
    """Return ``device`` (a ``torch.device`` or a string such as ``"cuda:0"``) as a
    ``torch.device``, checking it is a known device type, available here, and (when
    ``expected`` is given) the device the rest of the computation lives on."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"Expected {name} to be a torch.device or a string such as 'cpu' or "
                        f"'cuda', but got {type(device).__name__}.")
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"Unknown {name} {str(device)!r}: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"Expected {name} to be available, but got {str(device)!r} and CUDA is "
                         "not available on this machine.")
    if expected is not None and not same_device(device, expected):
        raise ValueError(f"Expected {name} on device {expected}, but got {device}.")
    return device


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether ``a`` and ``b`` name the same device (``cuda`` meaning the current CUDA device)."""
    def index(d: torch.device) -> int | None:
        if d.index is None and d.type == "cuda":
            return torch.cuda.current_device()
        return d.index

    return a.type == b.type and (a.type == "cpu" or index(a) == index(b))


def check_module_device(name: str, module: object, device: torch.device) -> None:
    """Check that every parameter and buffer of ``module`` (if it is an ``nn.Module``)
    lives on ``device``, the device of the data."""
    if not isinstance(module, torch.nn.Module):
        return
    for tensor_name, tensor in (*module.named_parameters(), *module.named_buffers()):
        if not same_device(tensor.device, device):
            raise ValueError(
                f"Expected {name} on the device of x ({device}), but its tensor {tensor_name!r} "
                f"is on {tensor.device}; move it with {name}.to(x.device)."
            )
