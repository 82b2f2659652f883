"""Mean-field Gaussian variational inference with a closed-form KL (the notes "ELBO
diagonal Gaussian").

The guide is a diagonal Gaussian over every weight tensor of the model,
``q(w) = prod_i N(w_i; mu_i, sigma_i^2)``, with ``sigma = softplus(rho)``: the
same family and parameterisation as Bayes by Backprop, so
[`MeanFieldGuide`][] subclasses
[`BayesByBackpropGuide`][bnn_zoo.guides.BayesByBackpropGuide] rather than repeating it.
The notes train it on the ELBO

.. math::

    \\mathcal{L}(q) = \\mathbb{E}_{q(w)}\\Big[\\sum_{n=1}^N \\log p(y_n | f_w(x_n))\\Big]
                   - \\mathrm{KL}(q(w) \\| p(w)),

with a Gaussian prior ``p(w) = N(0, s^2 I)`` so that the KL is the closed form of
eq. (1) ([`diagonal_gaussian_kl`][]); in Pyro that is ``TraceMeanField_ELBO``,
which replaces the Monte Carlo ``log q(w) - log p(w)`` of ``Trace_ELBO`` by the
analytic KL of each site. The predictive is the notes' section 2, the Monte
Carlo average of class probabilities over ``w_s ~ q``
([`bnn_zoo.predict`][], [`CategoricalPredictive`][bnn_zoo.CategoricalPredictive]).

Where we differ from the notes' slips:

* eq. (1)-(2) put ``- n`` inside the sum over the ``n`` weights, which would
  subtract ``n^2``; it belongs outside (``- 1`` per weight), as the line above
  eq. (1) has it;
* the notes' ELBO writes ``E_q[sum_n p(y_n | f(x_n))]``; the ELBO has the
  expected *log*-likelihood;
* the notes' first line writes ``KL(q || p) = E_q[log p/q]``, the negative of the
  KL; its later lines (and ours) use ``E_q[log q/p]``;
* the notes' predictive averages over ``p(w)``; it means the posterior ``p(w | D)``,
  which ``q`` approximates.
"""

from __future__ import annotations

import pyro.distributions as dist
import torch
from torch import Tensor, nn

from bnn_zoo._core.checks import check_tensor
from bnn_zoo.guides._bbb import BayesByBackpropGuide
from bnn_zoo.models._priors import prior_of_site

__all__ = ["MeanFieldGuide", "diagonal_gaussian_kl"]


def diagonal_gaussian_kl(loc_q: Tensor, scale_q: Tensor, loc_p: Tensor | float,
                         scale_p: Tensor | float) -> Tensor:
    """Closed-form ``KL(N(loc_q, diag scale_q^2) || N(loc_p, diag scale_p^2))`` (the notes' eq. 1).

    With ``n`` the number of elements after broadcasting the four arguments
    against each other,

    .. math::

        \\mathrm{KL}(q \\| p) = \\frac12 \\Big[\\sum_{i=1}^n \\Big(
            \\log \\frac{\\sigma_{p,i}^2}{\\sigma_{q,i}^2}
            + \\frac{\\sigma_{q,i}^2}{\\sigma_{p,i}^2}
            + \\frac{(\\mu_{p,i} - \\mu_{q,i})^2}{\\sigma_{p,i}^2}\\Big) - n\\Big].

    The notes put ``- n`` inside the sum; it belongs outside, as written here. We
    compute it as ``- 1`` inside each term (the same number), which keeps each
    term ``r^2 - 1 - 2 log r >= 0`` for ``r = sigma_q / sigma_p`` instead of
    cancelling two large sums. With ``loc_p = 0`` and ``scale_p = 1`` this is
    the notes' eq. (2).

    Parameters
    ----------
    loc_q, scale_q : mean and standard deviation (not variance) of ``q``.
    loc_p, scale_p : those of ``p``; tensors or numbers, broadcast against ``q``'s.

    Returns
    -------
    A 0-dim tensor: the KL summed over every element, in nats.
    """
    loc_q = check_tensor("loc_q", loc_q, floating=True)
    scale_q = check_tensor("scale_q", scale_q, floating=True)
    loc_p = check_tensor("loc_p", torch.as_tensor(loc_p, dtype=loc_q.dtype, device=loc_q.device),
                         floating=True)
    scale_p = check_tensor("scale_p",
                           torch.as_tensor(scale_p, dtype=loc_q.dtype, device=loc_q.device),
                           floating=True)
    for name, scale in (("scale_q", scale_q), ("scale_p", scale_p)):
        if not bool((scale > 0).all()):
            raise ValueError(f"Expected {name} > 0 everywhere, but found a value <= 0.")
    try:
        loc_q, scale_q, loc_p, scale_p = torch.broadcast_tensors(loc_q, scale_q, loc_p, scale_p)
    except RuntimeError as err:
        raise ValueError(
            f"Expected loc_q, scale_q, loc_p, scale_p to broadcast, but got shapes "
            f"{tuple(loc_q.shape)}, {tuple(scale_q.shape)}, {tuple(loc_p.shape)}, "
            f"{tuple(scale_p.shape)}."
        ) from err
    log_ratio = torch.log(scale_q) - torch.log(scale_p)  # log r, r = sigma_q / sigma_p
    mahalanobis = ((loc_p - loc_q) / scale_p) ** 2
    return 0.5 * (torch.expm1(2 * log_ratio) - 2 * log_ratio + mahalanobis).sum()


class MeanFieldGuide(BayesByBackpropGuide):
    """The notes' diagonal Gaussian guide: one mean and one softplus-scale per weight.

    The parameters, their initialisation (means ``N(0, 1/d_in)``, scales
    ``init_scale``) and the sampling are those of
    [`BayesByBackpropGuide`][bnn_zoo.guides.BayesByBackpropGuide]; this class adds the
    closed-form KL to the model's Gaussian prior. Train it with
    ``pyro.infer.TraceMeanField_ELBO``.

    Parameters
    ----------
    model : a model exposing ``sites`` (``(name, shape)`` of each weight tensor)
        and ``prior`` (e.g. [`bnn_zoo.models.BayesianMLP`][]).
    init_scale : initial posterior standard deviation of every weight.
    generator : optional ``torch.Generator`` for the initial means.
    """

    def __init__(self, model: nn.Module, *, init_scale: float = 1e-2,
                 generator: torch.Generator | None = None) -> None:
        if not hasattr(model, "sites") or not hasattr(model, "prior"):
            raise TypeError(f"Expected model to expose 'sites' and 'prior' (e.g. a BayesianMLP), "
                            f"but got {type(model).__name__}.")
        super().__init__(model, init_scale=init_scale, generator=generator)
        self.prior = model.prior

    def kl_divergence(self) -> Tensor:
        """``KL(q || p)`` summed over every weight, by eq. (1) ([`diagonal_gaussian_kl`][]).

        Raises ``TypeError`` if the model's prior is not Gaussian (a scale
        mixture has no closed-form KL).
        """
        total = 0.0
        for name, q in self.distributions().items():
            prior = prior_of_site(self.prior, name).distribution(self.site_shapes[name], q.loc)
            base = prior.base_dist if isinstance(prior, dist.Independent) else prior
            if not isinstance(base, dist.Normal):
                raise TypeError(f"A closed-form KL needs a Gaussian prior, but the prior of "
                                f"{name!r} is {type(base).__name__}.")
            total = total + diagonal_gaussian_kl(q.loc, q.scale, base.loc, base.scale)
        return total
