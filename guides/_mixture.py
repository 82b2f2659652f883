r"""Mixture of diagonal Gaussians for unnormalised posteriors.

The guide is the fitting function of the notes on fitting an unnormalised posterior by a
mixture of diagonal Gaussians (the mixture notes) over the flattened, unconstrained latent
vector :math:`\theta \in \mathbb{R}^D` of any Pyro model (built on Pyro's
`AutoContinuous`):

.. math::

    q(\theta; a, w, b) = \sum_{i=1}^K \pi_i \prod_{j=1}^D N(\theta_j; w_{ij}, b_{ij}),
    \qquad \pi_i = \frac{a_i^2}{\sum_k a_k^2},

    N(x; w, b) = \sqrt{\frac{w^2}{2\pi}} \exp\!\left(-\tfrac12 (w x + b)^2\right)
               = \mathcal{N}\!\left(x; -\tfrac{b}{w}, \tfrac{1}{w^2}\right),

evaluated in log space as :math:`\log q = \operatorname{logsumexp}_i \beta_i` with
the notes' component terms

.. math::

    \beta_i = \log \pi_i + \sum_j \left\{-\tfrac12 (\theta_j w_{ij} + b_{ij})^2
              + \tfrac12 \log \frac{w_{ij}^2}{2\pi}\right\}.

Where this differs from the mixture notes, on purpose:

* the component mean is :math:`-b/w`, not the notes' :math:`b/w`;
* the weights are normalised, :math:`\pi_i = a_i^2 / \sum_k a_k^2`: with the
  notes' raw :math:`a_i^2`, ``q`` is not a density and its "KL" is not a KL;
* ``w`` is kept positive (a ``PyroParam`` with a positive constraint): the
  density depends on ``w`` only through ``|w|`` and ``w = 0`` is a singularity;
* ``log q`` is an exact ``torch.logsumexp``; the notes' truncation to the set
  :math:`M_\beta` of leading terms is an approximation that a stable
  log-sum-exp makes unnecessary;
* the notes' cost :math:`E_q[\ln p - \ln q]` is the ELBO (to be maximised), not
  the KL; for a target with normaliser :math:`Z`,
  :math:`\mathrm{KL}(q \| p/Z) = \log Z - \mathrm{ELBO}`;
* the notes' :math:`\partial\beta_i/\partial w_{jk}` has the wrong sign on
  :math:`1/w`: it is :math:`\delta_{ik}\{-(\theta_j w_{jk} + b_{jk})\theta_j + 1/w_{jk}\}`;
  and with normalised weights :math:`\partial\beta_i/\partial a_k =
  2\delta_{ik}/a_k - 2 a_k / \sum_l a_l^2`.

Gradient estimators of the ELBO (``estimator=``), all unbiased, computed by
[`MixtureELBO`][bnn_zoo.elbo.MixtureELBO]:

* ``"score"``: the notes' section 4,
  :math:`\nabla \mathrm{ELBO} \approx \frac1n\sum_s \nabla\log q(\theta^{(s)})
  \{\ln p(\theta^{(s)}) - \ln q(\theta^{(s)}) - 1 - c\}`, with ``c = 0`` as in the
  notes or, with ``baseline=True``, ``c = m - 1`` where ``m`` is a running mean of the
  ELBO from earlier steps, which centres the multiplier (a control variate, unbiased
  because it does not depend on the current draw);
* ``"pathwise"``: the component ``k ~ pi`` is drawn, then
  :math:`\theta = \mu_k + \sigma_k \epsilon` is reparameterised, which gives
  pathwise gradients for the means and scales; the weights, which do not move
  the sample, get the score of ``k`` Rao-Blackwellised over ``k | theta``,
  :math:`E[\nabla_a \log q(\theta)\,\{\ln p(\theta) - \ln q(\theta) - c\}]` with
  the means and scales held fixed in :math:`\log q` (works for any ``D >= 1``);
* ``"enumerate"``: the component summed out exactly,
  :math:`\mathrm{ELBO} = \sum_i \pi_i E_{\theta \sim N_i}[\ln p(\theta) - \ln q(\theta)]`,
  one reparameterised draw from every component per particle.

Against NUTS on a small BNN posterior (``benchmarks/mixture_nuts.py``: K = 1 fitted, then
K = 1, 2, 4 split from it and fitted further): more components raise the ELBO and keep
their weight, but they settle in the mode K = 1 found and do not bring the predictive
closer to NUTS's (the W2 distance of the moment-matched predictives). A mixture helps
where the target's modes differ in function space (the toy targets); a BNN's extra modes
are mostly weight-space symmetries with the same predictive.

Why not Pyro's `MixtureOfDiagNormals`, whose
``rsample`` has implicit pathwise gradients for all parameters (Jankowiak &
Karaletsos 2018)? Two defects in pyro 1.9 (both shown in ``tests/guides/test_mixture.py``):
(1) its backward evaluates :math:`q(\theta)` and products of
scales outside log space, which overflows in float32 once
:math:`\sum_j \log(1/\sigma_{ij})` exceeds about 88 (a 1-10-1 net's 31 weights at
:math:`\sigma = 0.01`): the gradient turns NaN and a pathwise BNN fit with
``K >= 2`` diverges; (2) its gradient for the component logits is biased except for
functions linear in :math:`\theta` (for :math:`E[\theta_1^3]`, say), so fits with
it leave the weights near their initial values.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.distributions.torch_distribution import TorchDistribution
from pyro.infer.autoguide import AutoContinuous
from pyro.infer.autoguide.initialization import init_to_median
from pyro.nn import PyroParam
from torch import Tensor

from bnn_zoo._core.checks import check_choice, check_positive, check_positive_int

__all__ = ["ESTIMATORS", "DiagonalNormalMixture", "MixtureGuide", "component_log_densities"]

ESTIMATORS = ("score", "pathwise", "enumerate")
BASELINE_DECAY = 0.9


def component_log_densities(theta: Tensor, a: Tensor, w: Tensor, b: Tensor) -> Tensor:
    r"""The notes' :math:`\beta_i` (with normalised weights) at every ``theta``.

    Parameters
    ----------
    theta : (..., D) points.
    a : (K,) weight parameters, :math:`\pi_i = a_i^2 / \sum_k a_k^2`.
    w, b : (K, D) precisions' square roots and offsets; component ``i`` is
        :math:`\mathcal{N}(-b_i / w_i, \operatorname{diag}(w_i^{-2}))`.

    Returns
    -------
    (..., K) :math:`\beta_i = \log \pi_i + \sum_j \{-\frac12 (\theta_j w_{ij} + b_{ij})^2
    + \frac12 \log(w_{ij}^2 / 2\pi)\}`.
    """
    # 2 log|a|, not log(a^2): a dying component's a^2 underflows in float32, which would
    # make log(a^2) = -inf and the gradient NaN. |a| itself can keep shrinking to 0, so it
    # is floored at the smallest normal number: below it the component's weight is 0 to
    # working precision and a is frozen.
    floor = torch.finfo(a.dtype).tiny
    log_weights = 2 * torch.log(a.abs().clamp_min(floor)) - torch.log((a**2).sum())
    z = theta.unsqueeze(-2) * w + b  # (..., K, D)
    per_coord = -0.5 * z**2 + 0.5 * torch.log(w**2 / (2 * math.pi))
    return log_weights + per_coord.sum(-1)


class DiagonalNormalMixture(TorchDistribution):
    r"""The mixture :math:`q(\theta; a, w, b)` over :math:`\mathbb{R}^D` (event shape (D,)).

    ``log_prob`` is :math:`\operatorname{logsumexp}_i \beta_i` (see
    [`component_log_densities`][]). ``reparameterized=True`` gives an ``rsample``
    that is pathwise in the means and scales given the drawn component; otherwise
    samples carry no gradient and ELBO gradients go through ``log_prob`` (the score
    function).
    """

    arg_constraints = {"a": constraints.real, "w": constraints.positive, "b": constraints.real}
    support = constraints.real_vector

    def __init__(self, a: Tensor, w: Tensor, b: Tensor, *, reparameterized: bool = False,
                 validate_args: bool | None = None) -> None:
        if a.dim() != 1 or w.dim() != 2 or w.shape != b.shape or w.shape[0] != a.shape[0]:
            raise ValueError(f"Expected a (K,), w and b (K, D), but got {tuple(a.shape)}, "
                             f"{tuple(w.shape)} and {tuple(b.shape)}.")
        self.a, self.w, self.b = a, w, b
        self.reparameterized = reparameterized
        super().__init__(torch.Size(), torch.Size(w.shape[-1:]), validate_args=validate_args)

    @property
    def has_rsample(self) -> bool:
        return self.reparameterized

    @property
    def weights(self) -> Tensor:
        """(K,) normalised weights :math:`\\pi_i`."""
        return self.a**2 / (self.a**2).sum()

    @property
    def locs(self) -> Tensor:
        """(K, D) component means :math:`-b/w`."""
        return -self.b / self.w

    @property
    def scales(self) -> Tensor:
        """(K, D) component standard deviations :math:`1/w`."""
        return 1.0 / self.w

    @property
    def mean(self) -> Tensor:
        return self.weights @ self.locs

    @property
    def variance(self) -> Tensor:
        second = self.weights @ (self.scales**2 + self.locs**2)
        return second - self.mean**2

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return torch.logsumexp(component_log_densities(value, self.a, self.w, self.b), -1)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        with torch.no_grad():
            which = dist.Categorical(self.weights).sample(sample_shape)
            noise = torch.randn(torch.Size(sample_shape) + self.event_shape,
                                dtype=self.w.dtype, device=self.w.device)
            return self.locs[which] + self.scales[which] * noise

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        """Draw ``k ~ pi`` (no gradient), then ``locs[k] + scales[k] * eps`` (reparameterised
        in the means and scales; the weights' gradient needs a score term, see the module)."""
        if not self.reparameterized:
            raise NotImplementedError("rsample needs reparameterized=True.")
        shape = torch.Size(sample_shape)
        which = dist.Categorical(self.weights.detach()).sample(shape)
        noise = torch.randn(shape + self.event_shape, dtype=self.w.dtype, device=self.w.device)
        return self.locs[which] + self.scales[which] * noise

    def with_fixed_components(self) -> DiagonalNormalMixture:
        """The same mixture with ``w`` and ``b`` detached: its ``log_prob`` has gradients
        for the weights ``a`` alone (the score term of the pathwise estimator)."""
        return DiagonalNormalMixture(self.a, self.w.detach(), self.b.detach())

    def componentwise(self, extra_dims: int) -> ComponentDraws:
        """One reparameterised draw per component: batch shape ``(K,) + (1,) * extra_dims``."""
        return ComponentDraws(self, extra_dims)


class ComponentDraws(TorchDistribution):
    r"""Draws :math:`\theta_i \sim N_i` for every component ``i`` at once, scored by the
    whole mixture: ``log_prob`` is the mixture's :math:`\log q(\theta_i)`, not
    :math:`\log N_i(\theta_i)`. Used by [`MixtureELBO`][bnn_zoo.elbo.MixtureELBO] to enumerate
    the component."""

    support = constraints.real_vector
    has_rsample = True
    arg_constraints: dict = {}

    def __init__(self, mixture: DiagonalNormalMixture, extra_dims: int) -> None:
        self.mixture = mixture
        shape = mixture.w.shape[:1] + (1,) * extra_dims
        super().__init__(torch.Size(shape), mixture.event_shape, validate_args=False)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        view = self.batch_shape + self.event_shape
        locs, scales = self.mixture.locs.reshape(view), self.mixture.scales.reshape(view)
        return locs + scales * torch.randn(shape, dtype=locs.dtype, device=locs.device)

    def log_prob(self, value: Tensor) -> Tensor:
        return self.mixture.log_prob(value)


class MixtureGuide(AutoContinuous):
    r"""Mixture of ``K`` diagonal Gaussians over the unconstrained latents of ``model``.

    Parameters
    ----------
    model : any Pyro model with continuous latent sites (e.g. a
        [`UnnormalisedModel`][bnn_zoo.models.UnnormalisedModel] or a
        [`BayesianMLP`][bnn_zoo.models.BayesianMLP]).
    num_components : ``K``.
    estimator : ``"score"``, ``"pathwise"`` or ``"enumerate"`` (see the module).
    baseline : ``score`` and ``pathwise``: subtract a running mean of earlier ELBOs in the
        score-function term.
    init_scale : initial standard deviation ``1/w`` of every component.
    init_spread : components start at ``init_loc +- init_spread * sqrt(D) * u_m`` with
        ``u_m`` uniform random unit vectors, in antithetic pairs (``K > 1``), so that they
        do not start on top of each other.
    init_loc_fn : Pyro init function for the centre (default ``init_to_median``).

    The parameters are the notes' ``a`` (K,), ``w`` (K, D) and ``b`` (K, D); note
    the (component, coordinate) layout, the transpose of the notes' :math:`w_{ji}`.
    Train with [`MixtureELBO`][bnn_zoo.elbo.MixtureELBO].
    """

    def __init__(self, model: Callable, num_components: int = 2, *,
                 estimator: str = "enumerate", baseline: bool = False, init_scale: float = 0.1,
                 init_spread: float = 1.0, init_loc_fn: Callable = init_to_median) -> None:
        self.num_components = check_positive_int("num_components", num_components)
        self.estimator = check_choice("estimator", estimator, ESTIMATORS)
        if not isinstance(baseline, bool):
            raise TypeError(f"Expected baseline to be a bool, but got {baseline!r}.")
        if baseline and estimator == "enumerate":
            raise ValueError("baseline=True needs a score-function term: estimator='score' "
                             "or 'pathwise', not 'enumerate'.")
        self.baseline = baseline
        self._init_scale = check_positive("init_scale", init_scale)
        if isinstance(init_spread, bool) or not isinstance(init_spread, (int, float)) \
                or not math.isfinite(init_spread) or init_spread < 0:
            raise ValueError(f"Expected init_spread >= 0, but got {init_spread!r}.")
        self._init_spread = float(init_spread)
        super().__init__(model, init_loc_fn=init_loc_fn)

    def _setup_prototype(self, *args, **kwargs) -> None:
        super()._setup_prototype(*args, **kwargs)
        centre = self._init_loc()
        k = self.num_components
        # Antithetic offsets (+e, -e, +e', -e', ...): pairs start on opposite sides of the
        # centre, so two components never start in the same basin by chance.
        offsets = torch.randn((k + 1) // 2, self.latent_dim, dtype=centre.dtype,
                              device=centre.device)
        # Fixed length sqrt(D), the typical norm of N(0, I), so no pair starts by chance
        # almost on top of the centre.
        offsets = offsets * (self.latent_dim**0.5 / offsets.norm(dim=-1, keepdim=True))
        offsets = torch.stack([offsets, -offsets], 1).reshape(-1, self.latent_dim)[:k]
        locs = centre + (self._init_spread * offsets if k > 1 else torch.zeros_like(offsets))
        self.a = PyroParam(torch.full_like(centre[:1], k**-0.5).expand(k).clone())
        self.w = PyroParam(torch.full_like(locs, 1.0 / self._init_scale),
                           constraint=constraints.positive)
        self.loc = PyroParam(locs)
        self.register_buffer("baseline_value", centre.new_zeros(()))
        self.register_buffer("baseline_steps", centre.new_zeros((), dtype=torch.long))

    @property
    def latent_site(self) -> str:
        """Name of the auxiliary sample site holding the flattened latent vector."""
        return f"_{self._pyro_name}_latent"

    def get_posterior(self, *args, **kwargs) -> DiagonalNormalMixture:
        w = self.w
        return DiagonalNormalMixture(self.a, w, -self.loc * w,
                                     reparameterized=self.estimator == "pathwise")

    def mixture(self) -> DiagonalNormalMixture:
        """The fitted mixture over the unconstrained latent vector (after a first call)."""
        if self.prototype_trace is None:
            raise RuntimeError("MixtureGuide not set up: call it (or fit it) once first.")
        return self.get_posterior()

    def effective_components(self) -> float:
        r"""Perplexity of the weights, :math:`\exp(-\sum_i \pi_i \log \pi_i)`, in ``[1, K]``."""
        pi = self.mixture().weights.detach()
        return float(torch.exp(-(pi * torch.log(pi.clamp_min(1e-30))).sum()))

    def _loc_scale(self, *args, **kwargs) -> tuple[Tensor, Tensor]:
        q = self.mixture()
        return q.mean, q.variance.sqrt()

    def update_baseline(self, elbo: Tensor) -> None:
        """Fold this step's mean ELBO into the running baseline (decay 0.9, bias-corrected)."""
        with torch.no_grad():
            self.baseline_steps += 1
            self.baseline_value.mul_(BASELINE_DECAY).add_((1 - BASELINE_DECAY) * elbo)

    def current_baseline(self) -> Tensor:
        """The running mean of earlier ELBOs (0 before the first step)."""
        steps = int(self.baseline_steps)
        if steps == 0:
            return self.baseline_value
        return self.baseline_value / (1 - BASELINE_DECAY**steps)
