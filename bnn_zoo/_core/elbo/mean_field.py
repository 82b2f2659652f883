"""A mean-field ELBO that computes only the terms it uses.

.. math::

    \\mathcal{L}(q) = \\sum_{\\text{observed}} s \\log p(y | w)
                 - \\sum_{\\text{latent}} s \\, \\mathrm{KL}(q(w) \\| p(w)),

with the KL in closed form wherever it is known: for a Gaussian guide and a Gaussian
prior (eq. 1 of the notes "ELBO diagonal Gaussian"; Blundell et al. 2015) by
[`gaussian_kl`][], for other pairs wherever ``torch.distributions.kl_divergence`` knows
them, and the single-sample estimate ``log p(w) - log q(w)`` at the guide's sample
otherwise (e.g. the scale-mixture prior), which for a point-mass guide (``Delta``: MAP) is
exact and is ``log p(w)`` (by [`gaussian_log_density`][] for a Gaussian prior) less the
``Delta``'s own ``log_density``; ``s`` is the site's scale (minibatch ``N / B`` on the
likelihood, a KL weight on the latents).

It computes the same objective as Pyro's ``TraceMeanField_ELBO``, but Pyro's
implementation first evaluates every log density of both traces (and so the
Gaussian log densities of all weights, which the closed-form KL then ignores):
on a 784-400-400-10 net those unused terms cost as much as the KL itself. This
class evaluates each term once, lazily, and with as few tensor operations as it can
(on a small net a step costs per operation, not per element: the Gaussian KL in 7
elementwise operations against torch's 10, no ``0 +`` or ``/ 1`` of the total). Like
``TraceMeanField_ELBO`` it requires a fully reparameterised guide whose latents are all
global (no local latent sites inside data plates with dependencies between them).
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.distributions.util import is_identically_zero, sum_rightmost
from pyro.infer.util import is_validation_enabled, torch_item
from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import _Subsample
from pyro.util import check_model_guide_match, warn_if_nan
from torch import Tensor
from torch.distributions import kl_divergence

from bnn_zoo._core.handlers import flipout, local_reparameterization

__all__ = ["DifferentiableLossELBO", "FlipoutELBO", "LocalReparameterizationELBO",
           "MeanFieldELBO", "gaussian_kl", "gaussian_log_density"]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
#: Guide sites of at least this many weights take the summed KL ([`_summed_gaussian_kl`][]):
#: fewer passes over the weights, more operations (a small tensor's KL costs per operation).
SUMMED_KL_ELEMENTS = 1 << 14


def _normal_moments(fn) -> tuple[Tensor, Tensor] | None:
    while isinstance(fn, dist.Independent):
        fn = fn.base_dist
    if isinstance(fn, dist.Normal):
        return fn.loc, fn.scale
    return None


def _event_dim(fn) -> int:
    """The number of dimensions that ``Independent`` wrappers of ``fn`` reinterpret."""
    dims = 0
    while isinstance(fn, dist.Independent):
        dims += fn.reinterpreted_batch_ndims
        fn = fn.base_dist
    return dims


def _unexpanded(t: Tensor) -> Tensor:
    """``t`` with each dimension along which it is expanded (stride 0) cut to size one: the
    same values under broadcasting, so that a prior's ``N(0, s).expand(shape)`` costs one
    element, not ``prod(shape)``, in [`gaussian_kl`][]."""
    if all(stride != 0 or size == 1 for stride, size in zip(t.stride(), t.shape)):
        return t
    return t[tuple(slice(0, 1) if stride == 0 else slice(None)
                   for stride, size in zip(t.stride(), t.shape))]


def gaussian_kl(q_loc: Tensor, q_scale: Tensor, p_loc: Tensor, p_scale: Tensor) -> Tensor:
    """Elementwise ``KL(N(q_loc, q_scale^2) || N(p_loc, p_scale^2))`` in closed form,

    .. math::

        \\mathrm{KL} = \\frac{\\sigma_q^2 + (\\mu_q - \\mu_p)^2}{2 \\sigma_p^2}
            - \\log \\sigma_q + \\log \\sigma_p - \\frac{1}{2}

    (eq. 1 of the notes "ELBO diagonal Gaussian"; Blundell et al. 2015), the value of
    ``torch.distributions.kl_divergence`` of the two ``Normal`` s up to rounding, in 7
    elementwise operations over the guide's shape where torch takes 10 (the prior's terms
    are computed once per element the prior does not merely repeat: an expanded scalar prior
    costs one element). The result has the broadcast shape of the four arguments.
    """
    shape = torch.broadcast_shapes(q_loc.shape, q_scale.shape, p_loc.shape, p_scale.shape)
    p_loc, p_scale = _unexpanded(p_loc), _unexpanded(p_scale)
    shift = q_loc - p_loc
    kl = (torch.addcmul(shift * shift, q_scale, q_scale) / (2 * p_scale * p_scale)
          - q_scale.log() + (p_scale.log() - 0.5))
    return kl if kl.shape == shape else kl.expand(shape)


class _SummedGaussianKL(torch.autograd.Function):
    """``gaussian_kl(q_loc, q_scale, p_loc, p_scale).sum()`` for a prior of one loc and one
    scale (0-dim tensors), with its gradient in closed form:

    .. math::

        \\sum \\mathrm{KL} = \\frac{\\sum_i \\sigma_i^2 + (\\mu_i - \\mu_p)^2}{2 \\sigma_p^2}
            - \\sum_i \\log \\sigma_i + n (\\log \\sigma_p - \\tfrac{1}{2}),
        \\quad
        \\frac{\\partial}{\\partial \\mu_i} = \\frac{\\mu_i - \\mu_p}{\\sigma_p^2},
        \\quad
        \\frac{\\partial}{\\partial \\sigma_i} = \\frac{\\sigma_i}{\\sigma_p^2}
            - \\frac{1}{\\sigma_i}.

    Three passes over the weights forward and three backward, where autograd through the
    elementwise form takes about fifteen: on a wide net the KL's passes over the weights
    cost as much as its matrix products. The value carries rounding of the order of the
    sums rather than of each (non-negative) term; the backward is itself differentiable."""

    @staticmethod
    def forward(ctx, q_loc: Tensor, q_scale: Tensor, p_loc: Tensor, p_scale: Tensor
                ) -> Tensor:
        ctx.save_for_backward(q_loc, q_scale, p_loc, p_scale)
        return (_SummedGaussianKL.squares(q_loc, q_scale, p_loc) / (2 * p_scale * p_scale)
                - q_scale.log().sum() + q_loc.numel() * (p_scale.log() - 0.5))

    @staticmethod
    def squares(q_loc: Tensor, q_scale: Tensor, p_loc: Tensor) -> Tensor:
        """``sum (q_loc - p_loc)^2 + sum q_scale^2``, as two dot products (no squares stored)."""
        shift, scale = (q_loc - p_loc).reshape(-1), q_scale.reshape(-1)
        return torch.dot(shift, shift) + torch.dot(scale, scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        q_loc, q_scale, p_loc, p_scale = ctx.saved_tensors
        rate = grad / (p_scale * p_scale)
        grads: list[Tensor | None] = [None] * 4
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[2]:
            grads[0] = torch.addcmul(-p_loc * rate, q_loc, rate)
        if ctx.needs_input_grad[1]:
            grads[1] = torch.addcdiv(q_scale * rate, grad, q_scale, value=-1)
        if ctx.needs_input_grad[2]:
            grads[2] = -grads[0].sum()
        if ctx.needs_input_grad[3]:
            squares = _SummedGaussianKL.squares(q_loc, q_scale, p_loc)  # a learnt prior scale
            grads[3] = grad * (q_loc.numel() / p_scale - squares / (p_scale * p_scale * p_scale))
        return tuple(grads)


def _summed_gaussian_kl(q_loc: Tensor, q_scale: Tensor, p_loc: Tensor, p_scale: Tensor
                        ) -> Tensor:
    """``gaussian_kl(...).sum()``: by [`_SummedGaussianKL`][] for a guide of at least
    `SUMMED_KL_ELEMENTS` weights, its loc and scale of one shape, under a prior of one loc and
    one scale; elementwise otherwise."""
    shape = torch.broadcast_shapes(q_loc.shape, q_scale.shape, p_loc.shape, p_scale.shape)
    p_loc, p_scale = _unexpanded(p_loc), _unexpanded(p_scale)
    if (q_loc.numel() >= SUMMED_KL_ELEMENTS and p_loc.numel() == 1 and p_scale.numel() == 1
            and q_loc.shape == q_scale.shape == shape):
        return _SummedGaussianKL.apply(q_loc, q_scale, p_loc.reshape(()), p_scale.reshape(()))
    return gaussian_kl(q_loc, q_scale, p_loc, p_scale).sum()


def gaussian_log_density(value: Tensor, loc: Tensor, scale: Tensor) -> Tensor:
    """Elementwise ``log N(value; loc, scale^2)``,

    .. math:: \\log p(w) = -\\frac{1}{2} \\Big(\\frac{w - \\mu}{\\sigma}\\Big)^2
              - \\log \\sigma - \\frac{1}{2} \\log 2\\pi,

    torch's ``Normal.log_prob`` up to rounding, in 4 elementwise operations over the shape of
    ``value`` where torch takes 9 (the terms of ``loc`` and ``scale`` alone are computed once
    per element they do not merely repeat: an expanded scalar prior costs one element). The
    result has the broadcast shape of the three arguments.

    Squares are products (``d * d``, not ``d.square()``), here and in [`gaussian_kl`][]:
    TorchScript's autodiff differentiates ``mul`` inside its differentiable subgraphs but
    not ``square``, which would split a traced loss into more subgraphs with the squares run
    by eager autograd between them.
    """
    shape = torch.broadcast_shapes(value.shape, loc.shape, scale.shape)
    loc, scale = _unexpanded(loc), _unexpanded(scale)
    shift = value - loc
    log_p = shift * shift * (-0.5 / (scale * scale)) - (scale.log() + _HALF_LOG_2PI)
    return log_p if log_p.shape == shape else log_p.expand(shape)


def _point_mass_log_prior(guide_fn, prior_fn, value: Tensor, scale) -> Tensor | None:
    """The site's scaled ``log p(w) - log q(w)`` when the guide is a point mass (Pyro's
    ``Delta``), whose log density at its own value is its ``log_density`` (zero unless
    given): ``log p(w)`` by [`gaussian_log_density`][] for a Gaussian prior, by the
    prior's ``log_prob`` otherwise; ``None`` for other guides."""
    if not isinstance(guide_fn, dist.Delta):
        return None
    moments = _normal_moments(prior_fn)
    log_p = (prior_fn.log_prob(value) if moments is None
             else sum_rightmost(gaussian_log_density(value, *moments), _event_dim(prior_fn)))
    return _sum_scaled(log_p - guide_fn.log_density, scale)


def _sum_scaled(value: Tensor, scale) -> Tensor:
    return (value * scale).sum() if not isinstance(scale, float) or scale != 1.0 else value.sum()


def _closed_form_kl(guide_fn, prior_fn, scale) -> Tensor | None:
    """The site's scaled ``sum KL(q || p)`` by [`gaussian_kl`][] when both are (independent)
    Gaussians with the same event dimensions, else ``None``."""
    q, p = _normal_moments(guide_fn), _normal_moments(prior_fn)
    event_dim = _event_dim(guide_fn)
    if q is None or p is None or _event_dim(prior_fn) != event_dim:
        return None
    if isinstance(scale, float):
        kl = _summed_gaussian_kl(*q, *p)
        return kl if scale == 1.0 else kl * scale
    return (sum_rightmost(gaussian_kl(*q, *p), event_dim) * scale).sum()


def _accumulate(total: Tensor | None, term: Tensor, sign: float) -> Tensor:
    if total is None:
        return term if sign > 0 else -term
    return total + term if sign > 0 else total - term


class DifferentiableLossELBO(pyro.infer.ELBO):
    """An ELBO defined by its ``differentiable_loss``; ``loss`` and ``loss_and_grads``
    follow from it."""

    def loss(self, model, guide, *args, **kwargs) -> float:
        return torch_item(self.differentiable_loss(model, guide, *args, **kwargs))

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        loss.backward()
        return torch_item(loss)


class MeanFieldELBO(DifferentiableLossELBO):
    """Trace ELBO with closed-form KL terms, evaluated lazily (see module docstring)."""

    def _get_trace(self, model, guide, args, kwargs):
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = self._model_trace(model, guide_trace, args, kwargs)
        if is_validation_enabled():
            check_model_guide_match(model_trace, guide_trace, self.max_plate_nesting)
        return model_trace, guide_trace

    @staticmethod
    def _model_trace(model, guide_trace, args, kwargs):
        return poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)

    @staticmethod
    def _loss_particle(model_trace, guide_trace) -> Tensor | None:
        """``-ELBO`` of one particle: the scaled KL terms less the scaled log-likelihoods
        (``None`` if the model has no sample sites that count)."""
        loss = None
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample" or isinstance(site["fn"], _Subsample):
                continue
            if site["infer"].get("_deterministic"):
                continue
            if site["mask"] is not None:
                raise NotImplementedError(f"MeanFieldELBO does not support masked site {name!r}.")
            if site["is_observed"]:
                log_lik = _sum_scaled(site["fn"].log_prob(site["value"]), site["scale"])
                loss = _accumulate(loss, log_lik, -1.0)
                continue
            guide_site = guide_trace.nodes[name]
            if is_validation_enabled() and not guide_site["fn"].has_rsample:
                raise ValueError(f"MeanFieldELBO needs a reparameterised guide at site {name!r}.")
            kl = _closed_form_kl(guide_site["fn"], site["fn"], site["scale"])
            if kl is not None:
                loss = _accumulate(loss, kl, 1.0)
                continue
            log_prior = _point_mass_log_prior(guide_site["fn"], site["fn"], site["value"],
                                              site["scale"])
            if log_prior is not None:
                loss = _accumulate(loss, log_prior, -1.0)
                continue
            try:
                term = -kl_divergence(guide_site["fn"], site["fn"])
            except NotImplementedError:
                value = site["value"]
                term = site["fn"].log_prob(value) - guide_site["fn"].log_prob(value)
            if not is_identically_zero(term):
                loss = _accumulate(loss, _sum_scaled(term, site["scale"]), -1.0)
        return loss

    def differentiable_loss(self, model, guide, *args, **kwargs) -> Tensor:
        loss = 0.0
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            particle = self._loss_particle(model_trace, guide_trace)
            if particle is not None:
                loss = particle if isinstance(loss, float) else loss + particle
        if self.num_particles != 1:
            loss = loss / self.num_particles
        warn_if_nan(loss, "loss")
        return loss


class _LayerEstimatorELBO(MeanFieldELBO):
    """[`MeanFieldELBO`][] whose model runs under ``handler(moments)``, ``moments`` being
    the loc and scale of every Gaussian guide site (a handler of
    [`bnn_zoo._core.handlers`][] that evaluates the layers of such weights differently)."""

    handler: type[Messenger]

    def _model_trace(self, model, guide_trace, args, kwargs):
        moments = {}
        for name, site in guide_trace.nodes.items():
            if site["type"] == "sample" and not site["is_observed"]:
                pair = _normal_moments(site["fn"])
                if pair is not None:
                    moments[name] = pair
        with self.handler(moments):
            return super()._model_trace(model, guide_trace, args, kwargs)


class _undrawn(Messenger):
    """Guide-side handler: the sample sites named in ``names`` are not sampled; each takes
    a NaN tensor of its shape as its value (one per site, kept in ``placeholders``), so that
    a draw that no term of the loss uses costs nothing, and a use of it would show as a NaN
    loss rather than pass unnoticed."""

    def __init__(self, names: frozenset[str], placeholders: dict) -> None:
        super().__init__()
        self.names = names
        self.placeholders = placeholders

    def _pyro_sample(self, msg) -> None:
        if msg["name"] not in self.names or msg["is_observed"]:
            return
        loc, _ = _normal_moments(msg["fn"])
        shape = msg["fn"].shape()
        key = (msg["name"], shape, loc.dtype, loc.device)
        if key not in self.placeholders:
            self.placeholders[key] = torch.full(shape, float("nan"), dtype=loc.dtype,
                                                device=loc.device)
        msg["value"] = self.placeholders[key]
        msg["done"] = True


class LocalReparameterizationELBO(_LayerEstimatorELBO):
    """[`MeanFieldELBO`][] with the local reparameterisation trick (Kingma et al. 2015).

    The model runs under the effect handler
    [`local_reparameterization`][bnn_zoo.handlers.local_reparameterization], given the loc and
    scale of every Gaussian guide site: each affine layer (`bnn_zoo._core.nn.affine`), and each
    ``nn.Linear`` or convolution of a [`BayesianModule`][bnn_zoo.models.BayesianModule], whose
    weight and bias come from such sites draws its pre-activations from their Gaussian given the
    layer input, rather than pushing one weight sample through the minibatch.
    The KL terms are unchanged (closed form, or Monte Carlo at the guide's weight
    sample); the expected log-likelihood is the same in expectation for fully connected
    layers, with lower-variance gradients (for convolutions, an approximation: see the
    handler). The model and the guide know nothing of it: a model without such layers gets
    the plain [`MeanFieldELBO`][].

    Weight draws that no term of the loss uses are not drawn: under the handler the layers
    take only the moments, and a closed-form KL never reads the draw, so a site whose every
    use is such costs the guide nothing but its moments. Which sites these are is found on
    the first loss of each model and guide with gradients enabled (the sites whose draw the
    loss has no gradient path to) and kept; later losses give those sites a NaN placeholder
    value instead of a draw (a later use would turn the loss NaN, never pass unnoticed).
    The objective and its gradient are unchanged; the random stream is not (the skipped
    draws no longer consume it).
    """

    handler = local_reparameterization

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: (model, guide, names of the sites whose draws the loss does not use)
        self._unused: tuple[object, object, frozenset[str]] | None = None
        self._skipped: frozenset[str] = frozenset()
        self._draws: list[tuple[str, Tensor]] | None = None
        self._placeholders: dict = {}

    def _get_trace(self, model, guide, args, kwargs):
        if self._skipped:
            guide = _undrawn(self._skipped, self._placeholders)(guide)
        model_trace, guide_trace = super()._get_trace(model, guide, args, kwargs)
        if self._draws is not None:
            self._draws += [(name, site["value"]) for name, site in guide_trace.nodes.items()
                            if site["type"] == "sample" and not site["is_observed"]
                            and isinstance(site["value"], Tensor) and site["value"].requires_grad]
        return model_trace, guide_trace

    def differentiable_loss(self, model, guide, *args, **kwargs) -> Tensor:
        known = self._unused
        if known is not None and known[0] is model and known[1] is guide:
            self._skipped = known[2]
            try:
                return super().differentiable_loss(model, guide, *args, **kwargs)
            finally:
                self._skipped = frozenset()
        self._draws = []
        try:
            loss = super().differentiable_loss(model, guide, *args, **kwargs)
            draws = self._draws
        finally:
            self._draws = None
        if (isinstance(loss, Tensor) and loss.requires_grad and torch.is_grad_enabled()
                and not torch._C._get_tracing_state()):
            grads = torch.autograd.grad(loss, [value for _, value in draws], retain_graph=True,
                                        allow_unused=True)
            used = {name for (name, _), grad in zip(draws, grads) if grad is not None}
            self._unused = (model, guide, frozenset(name for name, _ in draws) - used)
        return loss


class FlipoutELBO(_LayerEstimatorELBO):
    """[`MeanFieldELBO`][] with flipout (Wen et al. 2018) in place of weight sampling.

    As [`LocalReparameterizationELBO`][], but the model runs under
    [`flipout`][bnn_zoo.handlers.flipout]: each such layer adds the guide's weight
    perturbation ``dW = W - M`` with random signs per data point and input or output unit
    (channel), so the objective and the expected gradient are those of plain weight
    sampling ([`MeanFieldELBO`][]) for any of these layers, convolutions included, and
    the gradient variance is lower on a minibatch. A model without such layers gets the
    plain [`MeanFieldELBO`][].
    """

    handler = flipout
