"""Bring your own network: a Pyro model from any ``torch.nn.Module``.

[`BayesianModule`][] puts a prior on every parameter tensor of ``net`` (one sample site
per tensor, named as ``net.named_parameters()`` names it, e.g. ``0.weight``) and evaluates
the network with the sampled tensors in place of its own:

.. math::

    \\theta_j \\sim p(\\theta_j) \\;\\text{for each parameter tensor}\\;j,\\qquad
    f = \\mathrm{net}(x; \\theta),\\qquad y_n \\sim p(y_n \\mid f(x_n))

with the likelihood of `bnn_zoo.models._likelihood.observe` (Gaussian for regression,
categorical for classification), as TyXe's ``PytorchBNN`` does for any module. A whole batch
of weight samples (vectorised particles, a parallel ``Predictive``) runs in one pass: the
net with the sampled tensors swapped in for its parameters (as ``torch.func.functional_call``
does), under ``torch.func.vmap`` over the sample dimension. The loss can be traced
(``bnn_zoo.fit(jit=True)``).

Local reparameterisation and flipout apply to its ``nn.Linear`` and ``nn.Conv{1,2,3}d``
layers as effect handlers ([`bnn_zoo.handlers`][], installed by
[`LocalReparameterizationELBO`][bnn_zoo.elbo.LocalReparameterizationELBO] and
[`FlipoutELBO`][bnn_zoo.elbo.FlipoutELBO]): the net's code knows nothing of them.

The net itself is held outside the module tree (in a tuple, as Pyro's autoguides hold
their model), so its parameters are not parameters of the Pyro model: they are only the
shapes, the names and, through
[`BayesianModule.init_to_net`][bnn_zoo.models.BayesianModule.init_to_net], optional initial
values for a guide.

Networks as people write them ([`bnn_zoo.models._module_options`][]): parameters picked
by name or type stay deterministic (point estimates learned with the guide; by default
those of batch-norm layers), priors may differ per parameter, and buffers (batch-norm
running statistics) are the model's state. The net runs in **train mode during a training
step** (the model in train mode, as after construction, and observing ``y``: batch
statistics, running statistics updated) and in **eval mode otherwise** (predictions, which
pass no ``y``, or after ``model.eval()``: running statistics used, never changed; dropout
off), whatever mode the user's net is in. With ``S`` weight samples evaluated at once
(vectorised particles) each sample updates its own copy of the running statistics, and the
model keeps their mean over the samples (the counter ``num_batches_tracked`` advances
once per step), which for a single sample is torch's own update.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import groupby

import pyro
import torch
from pyro.nn import PyroModule
from torch import Tensor, nn
from torch.func import vmap

from bnn_zoo._core.nn import noisy_layer
from bnn_zoo._core.tasks import task_named
from bnn_zoo.models._likelihood import observe
from bnn_zoo.models._mlp import drop_plate_dim
from bnn_zoo.models._module_options import (
    NetState,
    PriorOption,
    Selector,
    mean_buffers,
    net_mode,
    select_deterministic,
    site_priors,
)
from bnn_zoo.models._noise import ObservationNoise
from bnn_zoo.models._priors import GaussianPrior, SitePriors, TorchFanInPrior

__all__ = ["BayesianModule", "TorchFanInPrior", "digits_cnn"]

#: Site names of the model's own: a parameter of the net may not take one.
RESERVED_NAMES = ("data", "f", "obs", "noise_scale")


def _check_net(net: object, deterministic: set[str]) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every random parameter of ``net`` (all but ``deterministic``),
    after refusing what the model cannot treat as a Bayesian network."""
    if not isinstance(net, nn.Module):
        raise TypeError(f"Expected net to be a torch.nn.Module, but got {type(net).__name__}.")
    if isinstance(net, PyroModule):
        raise TypeError(f"Expected net to be a plain torch.nn.Module, but got the PyroModule "
                        f"{type(net).__name__}; BayesianModule adds the priors itself.")
    sites = []
    for name, param in net.named_parameters():
        if name in RESERVED_NAMES:
            raise ValueError(f"net's parameter {name!r} takes the name of one of the model's "
                             f"own sites {RESERVED_NAMES}; rename it.")
        if not param.is_floating_point():
            raise ValueError(f"Expected net's parameter {name!r} to be floating point, but it "
                             f"is {param.dtype}.")
        if name in deterministic:
            continue
        if not param.requires_grad:
            raise ValueError(
                f"net's parameter {name!r} does not require grad; BayesianModule puts a prior "
                "on every parameter not kept deterministic, so a frozen one would be sampled "
                f"all the same. Keep it fixed with deterministic=[{name!r}], or set "
                "requires_grad=True on it.")
        sites.append((name, tuple(param.shape)))
    if not sites:
        raise ValueError(f"net ({type(net).__name__}) has no parameters to put a prior on "
                         "(it has none, or every one is deterministic).")
    return sites


#: Per submodule of the net: the ``(slot, local name, net's name)`` of each tensor it holds
#: itself, ``slot`` ``"_parameters"`` or ``"_buffers"``.
Owners = list[tuple[nn.Module, tuple[tuple[str, str, str], ...]]]


def _owners(net: nn.Module) -> Owners:
    """Each submodule of ``net`` holding parameters or buffers, with the ``(slot, local
    name, name)`` of each (``("_parameters", "weight", "0.weight")``). A parameter shared
    by several modules (tied weights) is one name, listed under each of them."""
    owned: dict[str, list[tuple[str, str, str]]] = {}
    for slot, named in (("_parameters", net.named_parameters),
                        ("_buffers", net.named_buffers)):
        first = {id(value): name for name, value in named()}
        for name, value in named(remove_duplicate=False):
            prefix, _, local = name.rpartition(".")
            owned.setdefault(prefix, []).append((slot, local, first[id(value)]))
    return [(net.get_submodule(prefix), tuple(names)) for prefix, names in owned.items()]


@contextlib.contextmanager
def _swapped(owners: Owners, tensors: Mapping[str, Tensor]) -> Iterator[None]:
    """The net's parameters and buffers replaced by ``tensors`` (by name) while the context
    runs, restored afterwards, as ``torch.func.functional_call`` does; unlike it, this can
    be traced by ``torch.jit`` (``bnn_zoo.fit(jit=True)``) and costs nothing per call."""
    saved = []
    try:
        for module, names in owners:
            for slot, local, name in names:
                held = getattr(module, slot)
                saved.append((held, local, held[local]))
                held[local] = tensors[name]
        yield
    finally:
        for held, local, value in reversed(saved):
            held[local] = value


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
        one random parameter, every random one requiring grad. It is not copied and never
        changed; its parameter values are never used by the model (see
        [`init_to_net`][]), its buffers (running statistics) are copied into the model.
    task : ``"regression"`` or ``"classification"``.
    prior : [`GaussianPrior`][] (default ``N(0, 1)``; with ``fan_in=True`` the scale of a
        weight is divided by the square root of its fan-in in torch's layout, see
        `TorchFanInPrior`) or `ScaleMixturePrior`; or a prior per parameter:
        a mapping from parameter names, module names or module types to priors, or a
        function ``(name, tensor) -> prior``
        (`site_priors`).
    deterministic : parameter names, module names or module types whose parameters are
        point estimates (``PyroParam``s learned with the guide; fixed where the parameter
        has ``requires_grad=False``), not random. ``None`` (default): the parameters of
        batch-norm layers; ``()``: none, every parameter random.
    noise_scale : regression only; a float fixes ``sigma``, ``None`` learns it (initialised
        at ``init_noise_scale``), as in [`BayesianMLP`][bnn_zoo.models.BayesianMLP].

    The model lives on the device and in the dtype of ``net``'s parameters. It exposes
    ``sites`` and ``prior`` as [`BayesianMLP`][bnn_zoo.models.BayesianMLP] does (``prior`` is a
    `SitePriors` where the sites' priors differ), so the
    zoo's site-wise guides (Bayes by Backprop, mean field) and Pyro's autoguides apply
    unchanged.
    """

    def __init__(self, net: nn.Module, *, task: str = "regression", prior: PriorOption = None,
                 deterministic: Iterable[Selector] | None = None,
                 noise_scale: float | None = None, init_noise_scale: float = 0.5) -> None:
        super().__init__()
        kind = task_named(task)
        self.task = kind.name
        #: The task as an object (what the forward pass and the output check ask of it).
        self.kind = kind
        if not isinstance(net, nn.Module):
            raise TypeError(f"Expected net to be a torch.nn.Module, but got "
                            f"{type(net).__name__}.")
        self.deterministic = frozenset(select_deterministic(net, deterministic))
        self._sites = _check_net(net, self.deterministic)
        self._shapes = dict(self._sites)
        self._owners = _owners(net)
        self._net = (net,)  # in a tuple: its parameters are not the model's
        self._priors = site_priors(prior, net, self._shapes)
        shared = set(map(id, self._priors.values()))
        self.prior = (next(iter(self._priors.values())) if len(shared) == 1
                      else SitePriors(tuple(self._priors.items())))
        self.net_state = NetState(net, self.deterministic)
        self.init_noise(kind.noise_scale(noise_scale), init_noise_scale)
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
        """The net's own values of the random parameters by site name (torch's
        initialisation of its layers, or pretrained weights): where the zoo's guides start
        their means on this model."""
        return {name: self.net.get_parameter(name).detach().clone() for name in self._shapes}

    def init_to_net(self, site: dict) -> Tensor:
        """``init_loc_fn`` for autoguides: start every weight at the net's own value (torch's
        initialisation of its layers, or pretrained weights). The value is a copy: an
        autoguide trains its initial value in place, which must not change the net."""
        ref = site["fn"].mean
        value = self.net.get_parameter(site["name"]).detach()
        return value.to(dtype=ref.dtype, device=ref.device).expand(ref.shape).clone()

    def fixed_tensors(self) -> dict[str, Tensor]:
        """The deterministic parameters and the buffers by the net's names, detached: the
        net's tensors other than the sampled ones, as the Laplace layout evaluates it."""
        with torch.no_grad():
            return {name: value.detach() for name, value in
                    {**self.net_state.parameter_values(),
                     **self.net_state.buffers_by_name()}.items()}

    def prior_precision(self) -> float | Tensor:
        """The precision of the Gaussian priors, as the Laplace approximation takes it: one
        number where every site has the prior ``N(0, s^2)``; else one per layer (the
        parameters of one submodule, in order) where it is constant within each layer, else
        one per weight (P,). A ``ValueError`` names a site whose prior is not Gaussian."""
        parts = []
        for name, shape in self._sites:
            prior = self._priors[name]
            if not isinstance(prior, GaussianPrior):
                raise ValueError(f"The Laplace approximation needs Gaussian priors, but the "
                                 f"prior of {name!r} is {prior!r}.")
            parts.append((name, math.prod(shape), prior.scale_for(shape) ** -2))
        if isinstance(self.prior, GaussianPrior) and not self.prior.fan_in:
            return parts[0][2]
        per_layer = [[(size, alpha) for _, size, alpha in group] for _, group in
                     groupby(parts, key=lambda part: part[0].rpartition(".")[0])]
        if all(len({alpha for _, alpha in layer}) == 1 for layer in per_layer):
            return torch.tensor([layer[0][1] for layer in per_layer], dtype=torch.float64)
        return torch.cat([torch.full((size,), alpha, dtype=torch.float64)
                          for _, size, alpha in parts])

    def sample_weights(self, like: Tensor) -> dict[str, Tensor]:
        """Sample every parameter tensor from its prior (or the guide, under replay)."""
        return {name: drop_plate_dim(
            pyro.sample(name, self._priors[name].distribution(shape, like)), len(shape))
            for name, shape in self._sites}

    def _noisy_layers(self, params: Mapping[str, Tensor]):
        """The tensors each layer runs with, the handlers' inputs and the layers that add a
        noise term (see [`network`][])."""
        tensors, inputs, noisy = dict(params), {}, []
        for layer, held in self._owners:
            names = [(local, name) for slot, local, name in held
                     if slot == "_parameters" and name in self._shapes]
            if not names:
                continue
            answer = noisy_layer(layer, {local: params[name] for local, name in names})
            if answer is not None:
                tensors.update((name, answer.mean[local]) for local, name in names)
                inputs.update((name, answer.inputs[local]) for local, name in names
                              if local in answer.inputs)
                noisy.append((layer, answer.noise, names))
        return tensors, inputs, noisy

    def network(self, x: Tensor, params: Mapping[str, Tensor], *, train: bool = False
                ) -> Tensor:
        """The output ``f(x)`` (*S, N, K) of the net with the tensors ``params`` (*S, *shape),
        in train mode (``train``: batch statistics, running statistics updated) or eval mode.

        The sample shapes ``S`` of the tensors broadcast against each other; all samples
        are evaluated in one vectorised call (``vmap`` over the flattened samples of the net
        with the tensors swapped in; a tensor without sample dims is passed once, shared).
        Random layers (dropout) draw independently per sample. In train mode each sample
        updates a copy of the running statistics and the model keeps their mean.

        Each submodule owning sampled tensors is offered to the effectful
        `noisy_layer`: an effect handler (local reparameterisation,
        flipout: [`bnn_zoo.handlers`][]) may answer that the layer runs with other
        tensors (the guide's mean) plus a noise term, which a forward hook adds to the
        layer's output for as long as this call runs; the net's code knows nothing of it.
        """
        batch = torch.broadcast_shapes(*(params[name].shape[:params[name].dim() - len(shape)]
                                         for name, shape in self._sites))
        tensors, inputs, noisy = self._noisy_layers(params)
        fixed = self.net_state.parameter_values()
        buffers = self.net_state.buffers_by_name()

        def evaluate(sample: Tensor | None, tensors: dict[str, Tensor],
                     inputs: dict[str, Tensor], buffers: dict[str, Tensor]) -> Tensor:
            # ``sample`` only gives vmap its size, when every tensor is shared (all layers
            # at their mean) and the samples differ only by the layers' noise.
            with _swapped(self._owners, {**fixed, **buffers, **tensors}), \
                    contextlib.ExitStack() as hooks:
                for layer, noise, names in noisy:
                    hooks.callback(layer.register_forward_hook(functools.partial(
                        _add_noise, noise=noise,
                        inputs={local: inputs[name] for local, name in names if name in inputs}),
                        with_kwargs=True).remove)
                return self.net(x)

        with net_mode(self.net, train):
            if not batch:
                f = evaluate(None, tensors, inputs, buffers)
            else:
                size = math.prod(batch)
                (tensors, tensor_dims), (inputs, input_dims) = (self._flatten(tensors, batch),
                                                                self._flatten(inputs, batch))
                if train and buffers:  # a copy of the running statistics per sample
                    buffers = {name: b.expand(size, *b.shape).clone()
                               for name, b in buffers.items()}
                sample = torch.arange(size, device=x.device)
                f = vmap(evaluate, in_dims=(0, tensor_dims, input_dims,
                                            0 if train else None),
                         randomness="different")(sample, tensors, inputs, buffers)
                f = f.reshape(*batch, *f.shape[1:])
                if train and buffers:
                    self.net_state.set_buffers(mean_buffers(buffers))
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
        if len(shape) != 2 or not self.kind.width_ok(shape[1]) or shape[0] != x.shape[0]:
            raise ValueError(f"Expected net to map inputs {tuple(x.shape)} to outputs "
                             f"{self.kind.expected_outputs} for {self.task}, but got "
                             f"{tuple(shape)}.")

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() < 1:
            raise ValueError(f"Expected x to be a tensor of shape (N, ...), but got {x!r}.")
        params = self.sample_weights(x)
        train = self.training and y is not None  # a training step
        return observe(x, y, lambda inputs: self.network(inputs, params, train=train),
                       regression=self.kind.noisy, noise_scale=self.observation_scale)


def digits_cnn(channels: int = 8, classes: int = 10) -> nn.Sequential:
    """A small CNN for scikit-learn's 8x8 digits: inputs ``(N, 64)`` as the zoo's data come
    (as scikit-learn gives them), unflattened to images ``(N, 1, 8, 8)``, then
    ``Conv2d(1, channels, 3) -> ReLU -> flatten -> Linear(channels * 6 * 6, classes)``."""
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, channels, 3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(channels * 6 * 6, classes))
