"""Bayesian MLP for regression and classification.

Prior over every weight tensor (one sample site per tensor, named
``layers.{l}.weight`` and ``layers.{l}.bias``), network output recorded as the
deterministic site ``f``, and the likelihood at site ``obs`` inside
``pyro.plate("data", N)``:

* regression: ``y_n ~ N(f(x_n), sigma^2)``, with ``sigma`` fixed or learned as
  a point estimate (type-II maximum likelihood); ``beta = sigma^-2`` is the
  noise precision of Bishop (PRML 5.7); with ``out_dim`` D > 1 the targets are (N, D)
  and ``y_nd ~ N(f_d(x_n), sigma_d^2)``, one ``sigma_d`` per output; with
  ``noise="heteroscedastic"`` the network has a second output and ``sigma(x_n) =
  softplus(s(x_n)) + 10^-3`` (Lakshminarayanan et al. 2017;
  `bnn_zoo.models._likelihood`);
* classification: ``y_n ~ Categorical(softmax(f(x_n)))``.

Minibatches come from the data plate: ``bnn_zoo.fit`` sets the plate's
subsample indices, so the likelihood is rescaled by ``N / B`` and the ELBO stays
unbiased (see [`bnn_zoo._core.handlers.subsample_data`][]).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam
from torch import Tensor

from bnn_zoo._core.checks import check_choice, check_positive, check_positive_int
from bnn_zoo._core.nn import activation as activation_fn
from bnn_zoo._core.nn import layer_names, layer_sizes, mlp_forward
from bnn_zoo._core.replicas import replica_plate
from bnn_zoo._core.tasks import task_named
from bnn_zoo.models._likelihood import observe
from bnn_zoo.models._noise import ObservationNoise
from bnn_zoo.models._priors import GaussianPrior, ScaleMixturePrior

__all__ = ["NOISE_MODELS", "BayesianMLP", "fan_in_init", "init_to_fan_in"]

NOISE_MODELS = ("homoscedastic", "heteroscedastic")


def drop_plate_dim(value: Tensor, event_dim: int) -> Tensor:
    """Remove the singleton data-plate dim from the batch shape of a global site.

    A site sampled outside ``plate("data", dim=-1)`` but inside a vectorised
    particle or predictive plate has batch shape ``(S, 1)``; the network wants
    the sample shape ``(S,)`` so its output ``(S, N, d)`` lines up with the plates.
    """
    if value.dim() > event_dim:
        return value.squeeze(-event_dim - 1)
    return value


class BayesianMLP(ObservationNoise, PyroModule):
    """Fully connected Bayesian network ``in_dim -> hidden... -> out_dim``.

    Parameters
    ----------
    in_dim, out_dim : input width and output width (regression: the number D of outputs,
        1 for targets (N,), D > 1 for targets (N, D); classification: the number of
        classes).
    hidden : widths of the hidden layers.
    activation : hidden activation (``relu`` default; ``sigmoid`` for the 1-3-1 net of
        ``benchmarks/bbb_priors.py``).
    task : ``"regression"`` or ``"classification"``.
    prior : [`GaussianPrior`][] (default ``N(0, 1)``) or [`ScaleMixturePrior`][].
    noise_scale : regression only; a float fixes ``sigma``, ``None`` learns it
        (initialised at ``init_noise_scale``); for D outputs, one ``sigma_d`` per output,
        each fixed to (or starting at) that number.
    noise : ``"homoscedastic"`` (default: one ``sigma``) or ``"heteroscedastic"``
        (regression with one output only: a second output gives each point its own
        ``sigma(x)``; then ``noise_scale`` must be ``None`` and the model has no
        [`observation_scale`][]).
    noise_prior : regression with one output and ``noise_scale=None`` only: ``sigma`` is
        a latent site ``"sigma"`` under the hyperprior ``HalfNormal(noise_prior)``, sampled
        with the weights (by a sampler: the guides of the zoo cover the weights only), in
        place of a learned point estimate; the model has no [`observation_scale`][].

    [`replicated`][] gives the same model for R independent fits in one pass
    (`bnn_zoo._core.replicas`).
    """

    def __init__(self, in_dim: int, out_dim: int = 1, hidden: Sequence[int] = (50,), *,
                 activation: str = "relu", task: str = "regression",
                 prior: GaussianPrior | ScaleMixturePrior | None = None,
                 noise_scale: float | None = None, init_noise_scale: float = 0.5,
                 noise: str = "homoscedastic", noise_prior: float | None = None) -> None:
        super().__init__()
        kind = task_named(task)
        self.task = kind.name
        #: The task as an object (what the forward pass and the output check ask of it).
        self.kind = kind
        self.heteroscedastic = check_choice("noise", noise, NOISE_MODELS) == "heteroscedastic"
        if self.heteroscedastic and (not kind.noisy or noise_scale is not None):
            raise ValueError("Expected noise='heteroscedastic' only for regression and with "
                             f"noise_scale=None, but got task={task!r}, "
                             f"noise_scale={noise_scale!r}.")
        self.sizes = layer_sizes(in_dim, tuple(hidden), out_dim + self.heteroscedastic)
        kind.check_out_dim(out_dim, self.heteroscedastic)
        self.activation_name = activation
        self.act = activation_fn(activation)
        prior = GaussianPrior() if prior is None else prior
        if not isinstance(prior, (GaussianPrior, ScaleMixturePrior)):
            raise TypeError(
                f"Expected prior to be GaussianPrior or ScaleMixturePrior, got {prior!r}."
            )
        self.prior = prior
        self.noise_prior = check_positive("noise_prior", noise_prior, allow_none=True)
        if self.noise_prior is not None and (not kind.noisy or noise_scale is not None
                                             or self.heteroscedastic or out_dim != 1):
            raise ValueError("Expected noise_prior only for regression with one output, "
                             "noise_scale=None and a homoscedastic noise, but got "
                             f"task={task!r}, out_dim={out_dim}, noise_scale={noise_scale!r}, "
                             f"noise={noise!r}.")
        if not self.heteroscedastic and self.noise_prior is None:
            self.init_noise(kind.noise_scale(noise_scale), init_noise_scale,
                            kind.noise_outputs(out_dim))
        else:
            self.learn_noise = False
        #: ``None`` for a single fit; R for a model of R replicas (see [`replicated`][]).
        self.replicas: int | None = None

    def replicated(self, replicas: int) -> BayesianMLP:
        """A copy of this model for ``replicas`` independent fits in one pass.

        The copy takes inputs ``x`` (R, N, D) and targets ``y`` (R, N) and samples every
        site inside ``pyro.plate("replicas", R, dim=-2)``
        (`replica_plate`), so the weights of replica ``r``
        have the leading index ``r`` and see only ``x[r]``, ``y[r]``; a learned noise scale
        becomes one per replica, shape (R, 1) (D outputs: (R, 1, D)), starting at this
        model's value.
        """
        check_positive_int("replicas", replicas)
        if self.replicas is not None:
            raise ValueError("Expected a single-fit model, but this one is already replicated "
                             f"({self.replicas} replicas).")
        twin = copy.deepcopy(self)
        twin.replicas = replicas
        if self.learn_noise:
            value = self.noise_scale.detach()
            start = value.expand(replicas, 1, *value.shape).clone()
            twin.noise_scale = PyroParam(start, constraint=constraints.positive)
        return twin

    def observation_scale(self) -> Tensor:
        """The noise standard deviation ``sigma``; a heteroscedastic model has none (each
        input has its own ``sigma(x)``, site ``noise_scale``): a ``ValueError``."""
        if self.heteroscedastic:
            raise ValueError("This model's noise is heteroscedastic: each point has its own "
                             "sigma(x) (site 'noise_scale'), and there is no single one.")
        if self.noise_prior is not None:
            raise ValueError("This model samples its noise scale (site 'sigma', "
                             f"HalfNormal({self.noise_prior})): there is no single one.")
        return super().observation_scale()

    @property
    def sites(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(name, shape)`` of every weight sample site, in forward order."""
        out = []
        for (w_name, b_name), d_in, d_out in zip(layer_names(len(self.sizes) - 1),
                                                 self.sizes[:-1], self.sizes[1:]):
            out += [(w_name, (d_in, d_out)), (b_name, (d_out,))]
        return out

    def sample_weights(self, like: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Sample every weight tensor from the prior (or the guide, under replay)."""
        values = [drop_plate_dim(pyro.sample(name, self.prior.distribution(shape, like)),
                                 len(shape)) for name, shape in self.sites]
        return list(zip(values[::2], values[1::2]))

    def network(self, x: Tensor, params: list[tuple[Tensor, Tensor]]) -> Tensor:
        """The network output ``f(x)`` (*S, N, out_dim) under the weight samples ``params``.

        Its layers are `bnn_zoo._core.nn.affine`, so an objective may evaluate them
        differently through an effect handler (local reparameterisation:
        [`bnn_zoo._core.handlers.local_reparameterization`][]); the model does not know.
        """
        return mlp_forward(x, params, self.act)

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        batch = () if self.replicas is None else (self.replicas,)
        if x.shape[:-2] != batch or x.dim() != len(batch) + 2 or x.shape[-1] != self.sizes[0]:
            expected = ", ".join(map(str, (*batch, "N", self.sizes[0])))
            raise ValueError(f"Expected x of shape ({expected}), but got {tuple(x.shape)}.")
        with replica_plate(self.replicas, x.device):
            params = self.sample_weights(x)
            sigma = None if self.noise_prior is None else pyro.sample("sigma", dist.HalfNormal(
                torch.tensor(self.noise_prior, dtype=x.dtype, device=x.device)))
            return observe(x, y, lambda inputs: self.network(inputs, params),
                           regression=self.kind.noisy,
                           noise_scale=self.observation_scale if sigma is None else lambda: sigma,
                           heteroscedastic=self.heteroscedastic, data_dim=len(batch))


def fan_in_init(shape: tuple[int, ...], *, dtype: torch.dtype | None = None,
                device: torch.device | None = None,
                generator: torch.Generator | None = None) -> Tensor:
    """Initial weights: matrices ``(d_in, d_out)`` drawn ``N(0, 1/d_in)``, biases ``U(-1, 1)``.

    On standardised inputs a unit's pre-activation ``w.x`` then has variance about 1,
    and random biases spread the ReLU kinks ``-b/w`` over the data; zero biases would
    put every kink at ``x = 0`` and leave a 1-D net unable to bend anywhere else.
    """
    if len(shape) == 2:
        return torch.randn(shape, dtype=dtype, device=device, generator=generator) / shape[0] ** 0.5
    return 2 * torch.rand(shape, dtype=dtype, device=device, generator=generator) - 1


def init_to_fan_in(site: dict) -> Tensor:
    """``init_loc_fn`` for autoguides: [`fan_in_init`][] for every weight site.

    Pyro's default ``init_to_feasible`` starts every weight at 0, where a ReLU
    network has no gradient to break the symmetry between units. A site with batch
    dimensions (a replica plate) gets an independent draw per batch element.
    """
    ref = site["fn"].mean
    event_shape = tuple(site["fn"].event_shape)
    draws = [fan_in_init(event_shape, dtype=ref.dtype, device=ref.device)
             for _ in range(site["fn"].batch_shape.numel())]
    return torch.stack(draws).reshape(ref.shape)
