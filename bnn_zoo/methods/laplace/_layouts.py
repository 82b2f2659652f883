"""A network as a function of its flat weight vector ``theta`` (the Laplace
approximation's view of a net), for the zoo's MLP and for any torch module.

A layout knows where each weight tensor sits in ``theta`` (P,), how the weights group
into layers (for a prior precision per layer, the last layer, Kronecker factors), and
evaluates the network (with its own activation) and its Jacobians at a ``theta``. Two
layouts share that interface,
so the curvatures (`bnn_zoo.methods.laplace._curvature`), the precision blocks, the posterior,
its guide and its predictive models work unchanged on both:

* [`ParameterLayout`][]: a [`BayesianMLP`][bnn_zoo.models.BayesianMLP], weights in the zoo's
  layout ``(d_in, d_out)``; Jacobians by one backward pass per output through the
  layers' pre-activations.
* [`ModuleLayout`][]: a [`BayesianModule`][bnn_zoo.models.BayesianModule] around any
  ``torch.nn.Module``, weights in torch's layout ``(d_out, d_in, *kernel)``, the network
  evaluated by ``torch.func.functional_call`` in eval mode (batch norm an affine map per
  channel with the model's running statistics; deterministic parameters at the model's
  values, outside ``theta``); Jacobians by ``torch.func`` (per-example
  ``jacrev`` under ``vmap``), Kronecker factors for ``nn.Linear``, ``nn.Conv1d`` and
  ``nn.Conv2d`` layers from their inputs (patches) and output Jacobians, captured by
  forward hooks.

Kronecker factors of a layer (K-FAC; Martens & Grosse 2015, and KFC for convolutions,
Grosse & Martens 2016). A layer maps inputs ``a_{n,l}`` (``D`` numbers, with a trailing
1 where it has a bias) at ``L`` locations ``l`` to ``z_{n,l} = W a_{n,l}``: ``L = 1``
for a dense layer on ``(N, D)`` inputs, the ``L = H' W'`` output pixels of a
convolution (its ``L'`` output positions for a ``Conv1d``), whose ``a_{n,l}`` are the
input patches (``F.unfold``) in the order of the weight's ``(C_in, *kernel)``.
`layer_factors` returns the ``a_{n,l}`` and the output Jacobians
``J_{n,k,l} = d f_{n,k} / d z_{n,l}``; the curvature module forms

.. math::

    Q = \\frac{1}{N L} \\sum_{n,l} a_{n,l} a_{n,l}^T, \\qquad
    G = \\sum_{n,l} J_{n,l}^T \\Lambda_n J_{n,l},

and approximates the layer's GGN block by ``Q ⊗ G``: the "KFAC-expand" of Eschenhagen
et al. (2023), which for a convolution is Grosse & Martens' KFC with its spatially
uncorrelated derivatives, and for ``L = 1`` the K-FAC of an MLP.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby

import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev, vmap

from bnn_zoo._core.nn import mlp_forward
from bnn_zoo.guides._flat_sites import flatten_sites, unflatten_sites
from bnn_zoo.methods.laplace._conv_patches import conv_patches
from bnn_zoo.models._module_options import net_mode

__all__ = ["KRON_LAYERS", "Layout", "ModuleLayout", "ParameterLayout", "layout_of"]

#: The layer types whose GGN block [`ModuleLayout`][] can Kronecker-factor.
KRON_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d)

_CONV = (nn.Conv1d, nn.Conv2d)

#: Per layer: its inputs ``a`` (N, L, D) (a trailing 1 for a bias) and the output's
#: Jacobian in its outputs ``J_z`` (N, K, L, d_out).
LayerFactors = list[tuple[Tensor, Tensor]]
#: Maps the outputs ``f`` (N, K) to matrices ``R_n`` (N, K', K) applied to the Jacobian.
Whitening = Callable[[Tensor], Tensor]


class _FlatWeights:
    """What both layouts compute from ``sites`` and ``layer_slices`` alone."""

    sites: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def layer_slices(self) -> list[slice]:
        raise NotImplementedError

    @property
    def num_layers(self) -> int:
        return len(self.layer_slices)

    @property
    def num_parameters(self) -> int:
        return sum(math.prod(shape) for _, shape in self.sites)

    def layer_index(self, like: Tensor) -> Tensor:
        """(P,) the layer of every entry of ``theta``, as int64 on ``like.device``."""
        sizes = [s.stop - s.start for s in self.layer_slices]
        return torch.repeat_interleave(torch.arange(len(sizes), device=like.device),
                                       torch.tensor(sizes, device=like.device))

    def flatten(self, tensors: dict[str, Tensor]) -> Tensor:
        """[`flatten_sites`][] of this layout's sites."""
        return flatten_sites(self.sites, tensors)

    def unflatten(self, theta: Tensor) -> dict[str, Tensor]:
        """[`unflatten_sites`][] of this layout's sites."""
        return unflatten_sites(self.sites, theta)

    def offsets(self) -> dict[str, int]:
        """Where each site's tensor starts in ``theta``."""
        out, start = {}, 0
        for name, shape in self.sites:
            out[name] = start
            start += math.prod(shape)
        return out


@dataclass(frozen=True)
class ParameterLayout(_FlatWeights):
    """Where each weight tensor of an MLP sits in the flat vector ``theta``.

    ``sites`` is the model's ``(name, shape)`` list in forward order, alternating
    weight ``(d_in, d_out)`` and bias ``(d_out,)`` as `BayesianMLP.sites` gives it.
    Layer ``l``'s slice of ``theta`` is the row-major flattening of ``[W_l; b_l]``
    (d_in + 1, d_out), so with ``a = [h_{l-1}, 1]`` the pre-activation is
    ``z_l = a^T [W_l; b_l]`` and the Jacobian of the output in the layer's weights is the
    outer product ``a ⊗ df/dz_l``. ``act`` is the MLP's hidden activation.
    """

    sites: tuple[tuple[str, tuple[int, ...]], ...]
    act: Callable[[Tensor], Tensor] = field(repr=False)
    #: Every layer's Jacobian is ``a ⊗ J_z`` (one location), in the order of ``theta``.
    outer_product_jacobian = True

    @classmethod
    def from_model(cls, model) -> ParameterLayout:
        sites = tuple((name, tuple(shape)) for name, shape in model.sites)
        if len(sites) % 2 or any(len(s) != 2 for _, s in sites[::2]) or any(
                len(s) != 1 for _, s in sites[1::2]):
            raise ValueError("Expected model.sites to alternate weight (d_in, d_out) and bias "
                             f"(d_out,) tensors, but got {sites}.")
        return cls(sites, model.act)

    @property
    def sizes(self) -> list[int]:
        """Layer widths ``[d_0, ..., d_L]``."""
        return [self.sites[0][1][0]] + [shape[1] for _, shape in self.sites[::2]]

    @property
    def description(self) -> str:
        return f"MLP {self.sizes}"

    @property
    def layer_slices(self) -> list[slice]:
        """Slice of ``theta`` holding layer ``l``'s ``[W_l; b_l]``, ``(d_in + 1) * d_out`` long."""
        out, start = [], 0
        for d_in, d_out in zip(self.sizes[:-1], self.sizes[1:]):
            out.append(slice(start, start + (d_in + 1) * d_out))
            start = out[-1].stop
        return out

    def kron_indices(self, like: Tensor) -> list[tuple[slice, bool]]:
        """Per layer the positions of ``[W_l; b_l]`` in row-major ``(d_in + 1, d_out)``
        order (its slice) and whether the last ``d_out`` of them are a bias (always)."""
        return [(index, True) for index in self.layer_slices]

    def network(self, theta: Tensor) -> list[tuple[Tensor, Tensor]]:
        """The ``(W, b)`` list of `bnn_zoo._core.nn.mlp_forward` for ``theta`` (*S, P)."""
        values = list(self.unflatten(theta).values())
        return list(zip(values[::2], values[1::2]))

    def check_input(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[-1] != self.sizes[0]:
            raise ValueError(f"Expected x of shape (N, {self.sizes[0]}), but got "
                             f"{tuple(x.shape)}.")
        return x

    def output(self, theta: Tensor, x: Tensor) -> Tensor:
        """``f(x, theta)`` (*S, N, K) for ``theta`` (*S, P)."""
        return mlp_forward(x, self.network(theta), self.act)

    def layer_factors(self, theta: Tensor, x: Tensor) -> tuple[Tensor, LayerFactors]:
        """Output ``f`` (N, K) and, per layer, its inputs ``a_l = [h_{l-1}, 1]``
        (N, 1, d_in + 1) and ``J_l[n, k, 0, j] = d f_nk / d z_l,nj`` (N, K, 1, d_out).

        One backward pass per output (K of them), none per data point.
        """
        h, inputs, pre = x, [], []
        net = self.network(theta.detach())
        with torch.enable_grad():
            for i, (weight, bias) in enumerate(net):
                inputs.append(torch.cat([h, h.new_ones(h.shape[0], 1)], -1))
                z = (h @ weight + bias).requires_grad_()
                pre.append(z)
                h = self.act(z) if i < len(net) - 1 else z
            f = h
            rows = [torch.autograd.grad(f[:, k].sum(), pre, retain_graph=k < f.shape[1] - 1)
                    for k in range(f.shape[1])]
        jacs = [torch.stack([row[i] for row in rows], 1) for i in range(len(pre))]
        return f.detach(), [(a.detach().unsqueeze(1), j.unsqueeze(2))
                            for a, j in zip(inputs, jacs)]

    def jacobian(self, theta: Tensor, x: Tensor, layers: list[int] | None = None,
                 whiten: Whitening | None = None) -> tuple[Tensor, Tensor]:
        """Output ``f`` (N, K) and ``df/dtheta`` (N, K, P) (only ``layers``' columns, in
        order, if given; ``R(f) df/dtheta`` with ``whiten=R``, R (N, K', K)): the outer
        products ``a_l ⊗ R J_l`` of [`layer_factors`][], whitened before the product."""
        f, parts = self.layer_factors(theta, x)
        r = None if whiten is None else whiten(f)
        keep = range(self.num_layers) if layers is None else layers
        cols = []
        for i in keep:
            a, jz = parts[i][0], parts[i][1][:, :, 0]
            jz = jz if r is None else r @ jz
            cols.append((a[:, :, :, None] * jz[:, :, None, :]).flatten(2))
        return f, torch.cat(cols, -1)


def _owner(name: str) -> str:
    """The module that holds the parameter ``name`` (``"0.weight"`` -> ``"0"``)."""
    return name.rpartition(".")[0]


@dataclass(frozen=True)
class ModuleLayout(_FlatWeights):
    """Where each parameter tensor of a torch module sits in ``theta``, and the module as a
    function of ``theta``.

    ``sites`` are the names and shapes of the random parameters among
    ``net.named_parameters()``, in that order (torch's layout ``(d_out, d_in, *kernel)``);
    a layer is the parameters one submodule holds itself (a ``Linear``'s weight and bias),
    so layers follow the order in which the submodules were registered, the forward order
    for ``nn.Sequential``, and the ``last_layer`` structure covers the last of them.

    ``fixed`` gives the net's other tensors (deterministic parameters, running
    statistics) by name, read at every evaluation (the model's current values); the net
    runs in eval mode, so each point's output depends on that point alone.
    """

    sites: tuple[tuple[str, tuple[int, ...]], ...]
    net: nn.Module = field(repr=False)
    fixed: Callable[[], dict[str, Tensor]] | None = field(default=None, repr=False)
    #: Layers of any kind, torch's weights stored ``(d_out, d_in)``: Jacobians by torch.func.
    outer_product_jacobian = False

    @classmethod
    def from_model(cls, model) -> ModuleLayout:
        """The layout of a [`BayesianModule`][bnn_zoo.models.BayesianModule] (its ``net`` and
        ``sites``)."""
        sites = tuple((name, tuple(shape)) for name, shape in model.sites)
        hidden = getattr(model, "deterministic", frozenset())
        found = tuple((name, tuple(p.shape)) for name, p in model.net.named_parameters()
                      if name not in hidden)
        if sites != found:
            raise ValueError(f"Expected model.sites to be the net's random parameters {found}, "
                             f"but got {sites}.")
        return cls(sites, model.net, getattr(model, "fixed_tensors", None))

    def call(self, tensors: dict[str, Tensor], x: Tensor) -> Tensor:
        """The net on ``x`` in eval mode with the random parameters ``tensors`` (by name)
        and the model's fixed tensors."""
        fixed = {} if self.fixed is None else self.fixed()
        with net_mode(self.net, False):
            return functional_call(self.net, {**fixed, **tensors}, (x,))

    @property
    def description(self) -> str:
        return f"{type(self.net).__name__} with parameters {[name for name, _ in self.sites]}"

    @property
    def layer_names(self) -> list[str]:
        """The submodule (its name in ``net``) of every layer."""
        return [owner for owner, _ in groupby(_owner(name) for name, _ in self.sites)]

    @property
    def layer_slices(self) -> list[slice]:
        """Slice of ``theta`` holding the parameters of each layer."""
        out, start = [], 0
        for _, group in groupby(self.sites, key=lambda site: _owner(site[0])):
            size = sum(math.prod(shape) for _, shape in group)
            out.append(slice(start, start + size))
            start += size
        return out

    def check_input(self, x: Tensor) -> Tensor:
        if x.dim() < 1:
            raise ValueError(f"Expected x of shape (N, ...), but got {tuple(x.shape)}.")
        return x

    def output(self, theta: Tensor, x: Tensor) -> Tensor:
        """``f(x, theta)`` (*S, N, K) for ``theta`` (*S, P), all samples in one vectorised
        call."""
        if theta.dim() == 1:
            return self.call(self.unflatten(theta), x)
        flat = theta.reshape(-1, theta.shape[-1])
        f = vmap(lambda t: self.call(self.unflatten(t), x), randomness="different")(flat)
        return f.reshape(*theta.shape[:-1], *f.shape[1:])

    def jacobian(self, theta: Tensor, x: Tensor, layers: list[int] | None = None,
                 whiten: Whitening | None = None) -> tuple[Tensor, Tensor]:
        """Output ``f`` (N, K) and ``df/dtheta`` (N, K, P) (only ``layers``' columns, in
        order, if given; ``R(f) df/dtheta`` with ``whiten=R``), by ``torch.func.jacrev`` of
        each point's output, ``vmap``-ed over the points: ``K`` backward passes of one
        point each, vectorised.

        Each point's output must depend on that point's input only (no batch statistics).
        """
        params = self.unflatten(theta.detach())
        slices = self.layer_slices
        keep = range(self.num_layers) if layers is None else layers
        offsets = self.offsets()
        names = [name for i in keep for name, _ in self.sites
                 if slices[i].start <= offsets[name] < slices[i].stop]
        wrt = {name: params[name] for name in names}
        rest = {name: value for name, value in params.items() if name not in wrt}

        def point(weights: dict[str, Tensor], xi: Tensor) -> tuple[Tensor, Tensor]:
            out = self.call({**rest, **weights}, xi.unsqueeze(0))[0]
            return out, out

        jac, f = vmap(jacrev(point, has_aux=True), in_dims=(None, 0))(wrt, x)
        g = torch.cat([jac[name].flatten(2) for name in names], -1)
        return f, g if whiten is None else whiten(f) @ g

    def kron_layers(self) -> list[nn.Module]:
        """The submodule of every layer, after checking that each is a `KRON_LAYERS`
        holding exactly its own weight (and bias)."""
        modules = []
        for prefix in self.layer_names:
            module = self.net.get_submodule(prefix)
            names = [name for name, _ in self.sites if _owner(name) == prefix]
            if not isinstance(module, KRON_LAYERS):
                raise ValueError(
                    f"curvature='kron' factors only {', '.join(c.__name__ for c in KRON_LAYERS)} "
                    f"layers, but the parameter {names[0]!r} belongs to a "
                    f"{type(module).__name__}; keep that layer deterministic "
                    f"(model_options={{'deterministic': [{prefix!r}]}}; batch norm is by "
                    "default), or use curvature='ggn', 'diag' or 'last_layer'.")
            if isinstance(module, _CONV) and (module.groups != 1
                                              or module.padding_mode != "zeros"):
                raise ValueError(
                    f"curvature='kron' factors convolutions with groups=1 and zero padding, "
                    f"but {prefix!r} has groups={module.groups}, "
                    f"padding_mode={module.padding_mode!r}; use curvature='ggn' or 'diag'.")
            sites = dict(self.sites)  # a deterministic bias is the net's, outside theta
            own = [name for name in (f"{prefix}.{n}" if prefix else n for n, _ in
                                     module.named_parameters(recurse=False)) if name in sites]
            if names != own or own[0].rpartition(".")[2] != "weight":
                raise ValueError(f"curvature='kron' needs layer {prefix!r} to hold its own "
                                 f"weight (and bias), but its parameters are {names} (a weight "
                                 "shared with another layer?).")
            modules.append(module)
        return modules

    def _random_bias(self, module: nn.Module, prefix: str) -> bool:
        """Whether ``module`` (named ``prefix``) has a bias among the random parameters."""
        return module.bias is not None and (f"{prefix}.bias" if prefix else "bias") in dict(
            self.sites)

    def kron_indices(self, like: Tensor) -> list[tuple[Tensor, bool]]:
        """Per layer the positions in ``theta`` of ``[W^T; b]`` in row-major
        ``(D + 1, d_out)`` order (``D`` the fan-in, ``W`` flattened to ``(d_out, D)``; no
        bias row without a bias), on ``like.device``, and whether the layer has a bias."""
        offsets, out = self.offsets(), []
        for module, prefix in zip(self.kron_layers(), self.layer_names):
            name = f"{prefix}.weight" if prefix else "weight"
            d_out = module.weight.shape[0]
            fan_in = module.weight[0].numel()
            rows = torch.arange(fan_in, device=like.device)[:, None]
            index = offsets[name] + rows + fan_in * torch.arange(d_out, device=like.device)
            bias = self._random_bias(module, prefix)
            if bias:
                start = offsets[f"{prefix}.bias" if prefix else "bias"]
                index = torch.cat([index, start + torch.arange(d_out, device=like.device)[None]])
            out.append((index.flatten(), bias))
        return out

    def layer_factors(self, theta: Tensor, x: Tensor) -> tuple[Tensor, LayerFactors]:
        """Output ``f`` (N, K) and, per layer, its inputs ``a`` (N, L, D [+ 1]) and the
        output's Jacobian ``J_z`` (N, K, L, d_out) in its outputs at the ``L`` locations
        (see the module doc), captured by forward hooks on the layers (removed after):
        one forward and ``K`` backward passes for all the points at once."""
        modules = self.kron_layers()
        seen: dict[nn.Module, list[tuple[Tensor, Tensor]]] = {m: [] for m in modules}

        def capture(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
            # The parameters are constants here: the first layer's output becomes a leaf
            # that requires grad, and the later ones depend on it (as the MLP's do).
            z = output if output.requires_grad else output.detach().requires_grad_()
            seen[module].append((args[0].detach(), z))
            return z

        handles = [module.register_forward_hook(capture) for module in modules]
        try:
            with torch.enable_grad():
                f = self.call(self.unflatten(theta.detach()), x)
        finally:
            for handle in handles:
                handle.remove()
        for prefix, module in zip(self.layer_names, modules):
            if len(seen[module]) != 1:
                raise ValueError(f"curvature='kron' needs every layer applied once per "
                                 f"forward pass, but {prefix!r} was applied "
                                 f"{len(seen[module])} times.")
        zs = [seen[m][0][1] for m in modules]
        k_out = f.shape[1]
        rows = [torch.autograd.grad(f[:, k].sum(), zs, retain_graph=k < k_out - 1,
                                    allow_unused=True, materialize_grads=True)
                for k in range(k_out)]
        out = []
        for i, (module, prefix) in enumerate(zip(modules, self.layer_names)):
            inputs = seen[module][0][0]
            jz = torch.stack([row[i] for row in rows], 1)  # (N, K, *z.shape[1:])
            n = inputs.shape[0]
            if isinstance(module, _CONV):
                a = conv_patches(module, inputs)
                jz = jz.flatten(3).transpose(2, 3)
            else:  # a Linear on (N, ..., D): every position of the middle dims a location
                a = inputs.reshape(n, -1, inputs.shape[-1])
                jz = jz.reshape(n, k_out, -1, jz.shape[-1])
            if self._random_bias(module, prefix):
                a = torch.cat([a, a.new_ones(*a.shape[:-1], 1)], -1)
            out.append((a, jz))
        return f.detach(), out


Layout = ParameterLayout | ModuleLayout


def layout_of(model) -> Layout:
    """The layout of ``model``: a [`ModuleLayout`][] for a model around a torch module
    (a ``net`` attribute, as [`BayesianModule`][bnn_zoo.models.BayesianModule] has), else the MLP's
    [`ParameterLayout`][]."""
    if isinstance(getattr(model, "net", None), nn.Module):
        return ModuleLayout.from_model(model)
    return ParameterLayout.from_model(model)
