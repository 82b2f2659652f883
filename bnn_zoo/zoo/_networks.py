"""A user's network in a zoo entry: ``entry.fit(x, y, ..., net=...)``.

``net`` is a ``torch.nn.Module`` or a zero-argument factory returning one. The entry's model
becomes [`BayesianModule`][bnn_zoo.models.BayesianModule] ``(net, task=task, **model_options)``, a
prior on every parameter tensor of the net not kept deterministic (``model_options`` such
as ``{"deterministic": ["0"], "prior": {"4": GaussianPrior(0.5)}}``), and the entry's
method (its guide, budget and predictive) runs on it unchanged. This module turns ``net``
into a builder of fresh models, checks where it lives, and names the networks the harness
bundles (``compare --net cnn``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from bnn_zoo._core.checks import same_device
from bnn_zoo._core.tasks import task_named
from bnn_zoo.methods._options import as_factory
from bnn_zoo.models._module import digits_cnn
from bnn_zoo.models._module_options import net_mode

__all__ = ["NETWORKS", "NETWORK_CHOICES", "NamedNetwork", "Network", "mnist1d_cnn",
           "net_model_defaults", "net_outputs", "network_builder"]

#: What ``net=`` takes: a module (used as given) or a factory (called for every model).
Network = nn.Module | Callable[[], nn.Module]

#: The model options of a fit with ``net=``: the keywords of `BayesianModule`.
NET_MODEL_OPTIONS = ("prior", "deterministic", "noise_scale", "init_noise_scale")


def _check_placement(net: nn.Module, like: Tensor) -> None:
    """A ``ValueError`` naming the first parameter of ``net`` that is not on the device and
    in the dtype of the data ``like``."""
    for name, param in net.named_parameters():
        if not same_device(param.device, like.device) or param.dtype != like.dtype:
            raise ValueError(
                f"Expected net's parameters on the device and in the dtype of x ({like.device}, "
                f"{like.dtype}), but its parameter {name!r} is on {param.device} in "
                f"{param.dtype}; move it with net.to(x.device, x.dtype), or pass a factory "
                "(net=lambda: MyNet()), whose networks the fit moves itself.")


def network_builder(net: object, like: Tensor) -> Callable[[], nn.Module]:
    """A function returning the network of each model the entry builds.

    A module is returned as given (not copied), after checking it lives on the device and
    in the dtype of ``like``; a factory is called each time (a fresh network for every
    fit, ensemble member and restore), its network moved to ``like``'s device and dtype.
    """
    if isinstance(net, nn.Module):
        _check_placement(net, like)
        return lambda: net
    if not callable(net):
        raise TypeError("Expected net to be a torch.nn.Module or a zero-argument factory "
                        f"returning one, but got {type(net).__name__}.")

    def build() -> nn.Module:
        made = net()
        if not isinstance(made, nn.Module):
            raise TypeError("Expected net() to return a torch.nn.Module, but it returned "
                            f"{type(made).__name__}.")
        return made.to(device=like.device, dtype=like.dtype)

    return build


def net_outputs(net: nn.Module, x: Tensor, task: str, classes: int) -> int:
    """The number of outputs ``K`` of ``net``, read from its output at the first two points
    of ``x`` and checked against the task before any training: ``(n, 1)`` for regression,
    ``(n, K)`` class logits with ``K >= classes`` (the labels 0..classes-1 of ``y``; more
    where the network knows classes the training labels do not hold) for classification.
    A network that cannot be applied to ``x``'s shape is refused naming that shape."""
    probe = x[:2]
    try:
        with torch.no_grad(), net_mode(net, False):  # running statistics left as they are
            out = net(probe)
    except RuntimeError as error:
        raise ValueError(f"Expected net to take inputs shaped as x (N, "
                         f"{', '.join(map(str, x.shape[1:]))}), but applied to the first "
                         f"{len(probe)} points it fails: {error}") from None
    shape = tuple(out.shape) if isinstance(out, Tensor) else None
    expected, ok = task_named(task).net_output(shape, len(probe), classes)
    if not ok:
        got = shape if shape is not None else type(out).__name__
        raise ValueError(f"Expected net to map inputs {tuple(probe.shape)} (the first "
                         f"{len(probe)} points of x) to outputs {expected}, but got {got}.")
    return shape[1]


def net_model_defaults(model: Callable) -> dict:
    """The entry's own defaults for the options its model shares with
    `BayesianModule` (``prior``, ``noise_scale``): a fit with ``net=`` keeps the
    entry's prior (``map``'s fan-in prior, read in torch's layout)."""
    return {name: value for name, value in as_factory(model).defaults.items()
            if name in NET_MODEL_OPTIONS}


@dataclass(frozen=True)
class NamedNetwork:
    """A bundled network factory: ``net=NETWORKS["cnn"]`` builds a fresh network per call.

    Its ``repr`` (the name and the data sets it takes) is the same in every process, so a
    comparison's cache of finished runs recognises the runs of the same network.
    """

    name: str
    data: tuple[str, ...]
    build: Callable[[], nn.Module] = field(repr=False, compare=False)

    def __call__(self) -> nn.Module:
        return self.build()


def mnist1d_cnn(channels: int = 16, classes: int = 10) -> nn.Sequential:
    """A small 1-D CNN for MNIST-1D (Greydanus 2020): inputs ``(N, 40)`` unflattened to
    ``(N, 1, 40)``, then ``Conv1d(1, C, 5, stride=2) -> ReLU -> Conv1d(C, C, 3, stride=2)
    -> ReLU -> flatten -> Linear(C * 8, classes)`` (lengths 40 -> 18 -> 8)."""
    return nn.Sequential(nn.Unflatten(1, (1, 40)), nn.Conv1d(1, channels, 5, stride=2),
                         nn.ReLU(), nn.Conv1d(channels, channels, 3, stride=2), nn.ReLU(),
                         nn.Flatten(), nn.Linear(channels * 8, classes))


#: The bundled networks: ``cnn`` is [`digits_cnn`][bnn_zoo.models.digits_cnn] (8 channels of 3x3
#: filters on the 8x8 digits), ``mnist1d_cnn`` is `mnist1d_cnn`.
NETWORKS = {"cnn": NamedNetwork("cnn", ("digits",), digits_cnn),
            "mnist1d_cnn": NamedNetwork("mnist1d_cnn", ("mnist1d",), mnist1d_cnn)}

#: ``python -m bnn_zoo compare --net NAME``: the network NAME fits on each data set.
NETWORK_CHOICES = {"cnn": {"digits": NETWORKS["cnn"], "mnist1d": NETWORKS["mnist1d_cnn"]}}
