"""Bring your own network: a Pyro model from any ``torch.nn.Module``.

:class:`BayesianModule` puts a prior on every parameter tensor of ``net`` (one sample site
per tensor, named as ``net.named_parameters()`` names it, e.g. ``0.weight``) and evaluates
the network with the sampled tensors in place of its own:

.. math::

    \\theta_j \\sim p(\\theta_j) \\;\\text{for each parameter tensor}\\;j,\\qquad
    f = \\mathrm{net}(x; \\theta),\\qquad y_n \\sim p(y_n \\mid f(x_n))

with the likelihood of :func:`bnn_zoo.models.likelihood.observe` (Gaussian for regression,
categorical for classification), as TyXe's ``PytorchBNN`` does for any module. A whole batch
of weight samples (vectorised particles, a parallel ``Predictive``) runs in one pass: the
net with the sampled tensors swapped in for its parameters (as ``torch.func.functional_call``
does), under ``torch.func.vmap`` over the sample dimension. The loss can be traced
(``bnn_zoo.fit(jit=True)``).

Local reparameterisation and flipout apply to its ``nn.Linear`` and ``nn.Conv{1,2,3}d``
layers as effect handlers (:mod:`bnn_zoo.core.handlers`, installed by
:class:`~bnn_zoo.core.elbo.LocalReparameterizationELBO` and
:class:`~bnn_zoo.core.elbo.FlipoutELBO`): the net's code knows nothing of them.

The net itself is held outside the module tree (in a tuple, as Pyro's autoguides hold
their model), so its parameters are not parameters of the Pyro model: they are only the
shapes, the names and, through :meth:`BayesianModule.init_to_net`, optional initial values
for a guide. Buffers (batch-norm running statistics) are refused: a running statistic is
state updated by the forward pass, neither a random variable nor a constant, and one
shared buffer cannot follow many weight samples evaluated at once.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Mapping

import pyro
import torch
from pyro.nn import PyroModule
from torch import Tensor, nn
from torch.func import vmap

from bnn_zoo.core.checks import check_choice
from bnn_zoo.core.nn import noisy_layer
from bnn_zoo.models.likelihood import observe
from bnn_zoo.models.mlp import TASKS, drop_plate_dim
from bnn_zoo.models.noise import ObservationNoise
from bnn_zoo.models.priors import GaussianPrior, ScaleMixturePrior

__all__ = ["BayesianModule", "TorchFanInPrior", "digits_cnn"]

#: Site names of the model's own: a parameter of the net may not take one.
RESERVED_NAMES = ("data", "f", "obs", "noise_scale")


class TorchFanInPrior(GaussianPrior):
    """:class:`GaussianPrior` with ``fan_in=True`` for tensors in torch's layout.

    A torch weight is ``(d_out, d_in, *kernel)`` (``Linear``, ``Conv1d/2d/3d``), so its
    fan-in is ``prod(shape[1:])`` (``d_in`` times the kernel size), and the prior scale is
    ``scale / sqrt(fan_in)`` (Neal 1996); tensors of one dimension (biases) keep ``scale``.
    :class:`BayesianModule` uses it in place of ``GaussianPrior(fan_in=True)``, whose
    ``scale_for`` reads the zoo's own ``(d_in, d_out)`` layout.
    """

    def scale_for(self, shape: tuple[int, ...]) -> float:
        if self.fan_in and len(shape) >= 2:
            return self.scale / math.sqrt(math.prod(shape[1:]))
        return self.scale


def _check_net(net: object) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every parameter of ``net``, after refusing what the model cannot
    treat as a Bayesian network."""
    if not isinstance(net, nn.Module):
        raise TypeError(f"Expected net to be a torch.nn.Module, but got {type(net).__name__}.")
    if isinstance(net, PyroModule):
        raise TypeError(f"Expected net to be a plain torch.nn.Module, but got the PyroModule "
                        f"{type(net).__name__}; BayesianModule adds the priors itself.")
    for name, buffer in net.named_buffers():
        raise ValueError(
            f"net has the buffer {name!r} (shape {tuple(buffer.shape)}); BayesianModule refuses "
            "buffers: running statistics (batch norm) are state that the forward pass updates, "
            "which one buffer cannot do for many weight samples at once. Replace the layer "
            "(e.g. nn.BatchNorm by nn.LayerNorm or nn.GroupNorm) or remove the buffer.")
    sites = []
    for name, param in net.named_parameters():
        if not param.requires_grad:
            raise ValueError(
                f"net's parameter {name!r} does not require grad; BayesianModule puts a prior "
                "on every parameter, so a frozen one would be sampled all the same. Set "
                "requires_grad=True on it, or make it a constant of the network's code.")
        if name in RESERVED_NAMES:
            raise ValueError(f"net's parameter {name!r} takes the name of one of the model's "
                             f"own sites {RESERVED_NAMES}; rename it.")
        if not param.is_floating_point():
            raise ValueError(f"Expected net's parameter {name!r} to be floating point, but it "
                             f"is {param.dtype}.")
        sites.append((name, tuple(param.shape)))
    if not sites:
        raise ValueError(f"net ({type(net).__name__}) has no parameters: there is nothing to "
                         "put a prior on.")
    return sites


Owners = list[tuple[nn.Module, tuple[tuple[str, str], ...]]]


def _owners(net: nn.Module) -> Owners:
    """Each submodule of ``net`` owning parameters, with the ``(local name, site name)`` of
    its parameters (``("weight", "0.weight")``). A parameter shared by several modules (tied
    weights) is one site, listed under each of them."""
    site_of = {id(param): name for name, param in net.named_parameters()}
    owned: dict[str, list[tuple[str, str]]] = {}
    for name, param in net.named_parameters(remove_duplicate=False):
        prefix, _, local = name.rpartition(".")
        owned.setdefault(prefix, []).append((local, site_of[id(param)]))
    return [(net.get_submodule(prefix), tuple(names)) for prefix, names in owned.items()]


@contextlib.contextmanager
def _swapped(owners: Owners, tensors: Mapping[str, Tensor]) -> Iterator[None]:
    """The net's parameters replaced by ``tensors`` (by site name) while the context runs,
    restored afterwards, as ``torch.func.functional_call`` does; unlike it, this can be
    traced by ``torch.jit`` (``bnn_zoo.fit(jit=True)``) and costs nothing per call."""
    saved = []
    try:
        for module, names in owners:
            for local, name in names:
                saved.append((module._parameters, local, module._parameters[local]))
                module._parameters[local] = tensors[name]
        yield
    finally:
        for params, local, value in reversed(saved):
            params[local] = value


def _add_noise(layer: nn.Module, args: tuple, kwargs: dict, output: Tensor, *,
               noise: Callable[[nn.Module, Tensor, Mapping[str, Tensor]], Tensor],
               inputs: Mapping[str, Tensor]) -> Tensor:
    """Forward hook: ``output + noise(layer, x, inputs)`` for the layer's input ``x``."""
    return output + noise(layer, args[0] if args else kwargs["input"], inputs)


class BayesianModule(ObservationNoise, PyroModule):
    """Bayesian network from any ``torch.nn.Module``: a prior on each parameter tensor.

    Parameters
    ----------
    net : a ``torch.nn.Module`` mapping inputs ``(N, ...)`` to outputs ``(N, K)``: ``K = 1``
        for regression, ``K >= 2`` class logits for classification. It must have at least
        one parameter, every one requiring grad, and no buffers. It is not copied; its
        parameter values are never used by the model (see :meth:`init_to_net`).
    task : ``"regression"`` or ``"classification"``.
    prior : :class:`GaussianPrior` (default ``N(0, 1)``; with ``fan_in=True`` the scale of a
        weight is divided by the square root of its fan-in in torch's layout, see
        :class:`TorchFanInPrior`) or :class:`ScaleMixturePrior`.
    noise_scale : regression only; a float fixes ``sigma``, ``None`` learns it (initialised
        at ``init_noise_scale``), as in :class:`~bnn_zoo.models.BayesianMLP`.

    The model lives on the device and in the dtype of ``net``'s parameters. It exposes
    ``sites`` and ``prior`` as :class:`~bnn_zoo.models.BayesianMLP` does, so the zoo's
    site-wise guides (Bayes by Backprop, mean field) and Pyro's autoguides apply unchanged.
    """

    def __init__(self, net: nn.Module, *, task: str = "regression",
                 prior: GaussianPrior | ScaleMixturePrior | None = None,
                 noise_scale: float | None = None, init_noise_scale: float = 0.5) -> None:
        super().__init__()
        self.task = check_choice("task", task, TASKS)
        self._sites = _check_net(net)
        self._shapes = dict(self._sites)
        self._owners = _owners(net)
        self._net = (net,)  # in a tuple: its parameters are not the model's
        prior = GaussianPrior() if prior is None else prior
        if not isinstance(prior, (GaussianPrior, ScaleMixturePrior)):
            raise TypeError(
                f"Expected prior to be GaussianPrior or ScaleMixturePrior, got {prior!r}."
            )
        if isinstance(prior, GaussianPrior) and prior.fan_in:
            prior = TorchFanInPrior(scale=prior.scale, fan_in=True)
        self.prior = prior
        self.init_noise(noise_scale if task == "regression" else 1.0, init_noise_scale)
        first = next(net.parameters())
        self.to(device=first.device, dtype=first.dtype)

    @property
    def net(self) -> nn.Module:
        """The wrapped network."""
        return self._net[0]

    @property
    def sites(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(name, shape)`` of every weight sample site, in ``named_parameters`` order."""
        return list(self._sites)

    def initial_weights(self) -> dict[str, Tensor]:
        """The net's own parameter values by site name (torch's initialisation of its layers,
        or pretrained weights): where the zoo's guides start their means on this model."""
        return {name: value.detach().clone() for name, value in self.net.named_parameters()}

    def init_to_net(self, site: dict) -> Tensor:
        """``init_loc_fn`` for autoguides: start every weight at the net's own value (torch's
        initialisation of its layers, or pretrained weights). The value is a copy: an
        autoguide trains its initial value in place, which must not change the net."""
        ref = site["fn"].mean
        value = self.net.get_parameter(site["name"]).detach()
        return value.to(dtype=ref.dtype, device=ref.device).expand(ref.shape).clone()

    def sample_weights(self, like: Tensor) -> dict[str, Tensor]:
        """Sample every parameter tensor from the prior (or the guide, under replay)."""
        return {name: drop_plate_dim(pyro.sample(name, self.prior.distribution(shape, like)),
                                     len(shape))
                for name, shape in self._sites}

    def network(self, x: Tensor, params: Mapping[str, Tensor]) -> Tensor:
        """The output ``f(x)`` (*S, N, K) of the net with the tensors ``params`` (*S, *shape).

        The sample shapes ``S`` of the tensors broadcast against each other; all samples
        are evaluated in one vectorised call (``vmap`` over the flattened samples of the net
        with the tensors swapped in; a tensor without sample dims is passed once, shared).
        Random layers (dropout) draw independently per sample.

        Each submodule owning sampled tensors is offered to the effectful
        :func:`~bnn_zoo.core.nn.noisy_layer`: an effect handler (local reparameterisation,
        flipout: :mod:`bnn_zoo.core.handlers`) may answer that the layer runs with other
        tensors (the guide's mean) plus a noise term, which a forward hook adds to the
        layer's output for as long as this call runs; the net's code knows nothing of it.
        """
        batch = torch.broadcast_shapes(*(params[name].shape[:params[name].dim() - len(shape)]
                                         for name, shape in self._sites))
        tensors, inputs, noisy = dict(params), {}, []
        for layer, names in self._owners:
            answer = noisy_layer(layer, {local: params[name] for local, name in names})
            if answer is not None:
                tensors.update((name, answer.mean[local]) for local, name in names)
                inputs.update((name, answer.inputs[local]) for local, name in names
                              if local in answer.inputs)
                noisy.append((layer, answer.noise, names))

        def evaluate(sample: Tensor | None, tensors: dict[str, Tensor],
                     inputs: dict[str, Tensor]) -> Tensor:
            # ``sample`` only gives vmap its size, when every tensor is shared (all layers
            # at their mean) and the samples differ only by the layers' noise.
            with _swapped(self._owners, tensors), contextlib.ExitStack() as hooks:
                for layer, noise, names in noisy:
                    hooks.callback(layer.register_forward_hook(functools.partial(
                        _add_noise, noise=noise,
                        inputs={local: inputs[name] for local, name in names if name in inputs}),
                        with_kwargs=True).remove)
                return self.net(x)

        if not batch:
            f = evaluate(None, tensors, inputs)
        else:
            (tensors, tensor_dims), (inputs, input_dims) = (self._flatten(tensors, batch),
                                                            self._flatten(inputs, batch))
            sample = torch.arange(math.prod(batch), device=x.device)
            f = vmap(evaluate, in_dims=(0, tensor_dims, input_dims),
                     randomness="different")(sample, tensors, inputs)
            f = f.reshape(*batch, *f.shape[1:])
        self._check_output(x, f.shape[len(batch):])
        return f

    def _flatten(self, tensors: Mapping[str, Tensor], batch: torch.Size
                 ) -> tuple[dict[str, Tensor], dict[str, int | None]]:
        """Each tensor (by site name) with its sample dims broadcast to ``batch`` and
        flattened into one (vmap dim 0), or as it is (vmap dim ``None``) if it has none."""
        flat, dims = {}, {}
        for name, value in tensors.items():
            shape = self._shapes[name]
            if value.dim() == len(shape):
                flat[name], dims[name] = value, None
            else:
                flat[name], dims[name] = value.expand(*batch, *shape).reshape(-1, *shape), 0
        return flat, dims

    def _check_output(self, x: Tensor, shape: torch.Size) -> None:
        """Refuse a net whose output per weight sample is not ``(N, K)`` with ``K`` fit for
        the task (1 for regression, at least 2 classes for classification)."""
        width_ok = len(shape) == 2 and (shape[1] == 1 if self.task == "regression"
                                        else shape[1] >= 2)
        if not width_ok or shape[0] != x.shape[0]:
            expected = "(N, 1)" if self.task == "regression" else "(N, K) with K >= 2 classes"
            raise ValueError(f"Expected net to map inputs {tuple(x.shape)} to outputs "
                             f"{expected} for {self.task}, but got {tuple(shape)}.")

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() < 1:
            raise ValueError(f"Expected x to be a tensor of shape (N, ...), but got {x!r}.")
        params = self.sample_weights(x)
        return observe(x, y, lambda inputs: self.network(inputs, params),
                       regression=self.task == "regression", noise_scale=self.observation_scale)


def digits_cnn(channels: int = 8, classes: int = 10) -> nn.Sequential:
    """A small CNN for scikit-learn's 8x8 digits: inputs ``(N, 64)`` as the zoo's data come
    (as scikit-learn gives them), unflattened to images ``(N, 1, 8, 8)``, then
    ``Conv2d(1, channels, 3) -> ReLU -> flatten -> Linear(channels * 6 * 6, classes)``."""
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, channels, 3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(channels * 6 * 6, classes))
