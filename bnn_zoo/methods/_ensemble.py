"""Deep ensembles (Lakshminarayanan et al. 2017, without adversarial training) as a method.

``members`` independent fits of ``member`` (an [`SVI`][bnn_zoo.methods.SVI] or a
[`Laplace`][bnn_zoo.methods.laplace.Laplace] method; seeds ``members * seed + m``), trained as
replicas in one vectorised pass where the member declares ``replicas=True``
([`bnn_zoo.methods._svi.SVI.fit_many`][], or the MAP phases of
[`bnn_zoo.methods.laplace.Laplace.fit_many`][]: each member starts from its own seed's
initial values, and all take the minibatch order of the first member's seed), one by one
otherwise. With Laplace members the predictive is a mixture of Laplace approximations
(Eschenhagen et al. 2021).
[`Ensemble.fit_many`][bnn_zoo.methods.Ensemble.fit_many] trains the ``R x members`` members
of R ensembles (R training sets, e.g. the splits of a UCI set) as replicas in one pass, member ``m``
of fit ``r`` from seed ``members * seeds[r] + m`` as in
[`Ensemble.fit`][bnn_zoo.methods.Ensemble.fit]. The predictive is the members' equal-weight
mixture

    p(y | x) = 1/M sum_m p_m(y | x),  e.g. 1/M sum_m N(y; f_m(x), sigma_m^2)  (regression).

As a Pyro pair, the ensemble's model and guide both sample a site ``"member"``
``m ~ Categorical(1/M, ..., 1/M)`` and run member ``m``'s model and guide, so
``pyro.infer.Predictive(model, guide=guide, num_samples=S)`` samples the mixture (one
member per sample, ``parallel=False``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from torch import Tensor, nn

from bnn_zoo._core.batches import Batches
from bnn_zoo._core.checks import check_positive_int
from bnn_zoo._core.training import FitResult
from bnn_zoo.methods._base import Budget, ModelFactory, Predictive
from bnn_zoo.methods._state import result_from_state, result_state
from bnn_zoo.methods._svi import SVI, SVIPosterior
from bnn_zoo.methods.laplace import Laplace, LaplaceFit

__all__ = ["Ensemble", "EnsemblePosterior", "MemberChoice", "mixture"]


def mixture(preds: list[Predictive]) -> Predictive:
    """Equal-weight mixture of the members' predictives (their samples stacked; each
    predictive type's own ``mixture``)."""
    return type(preds[0]).mixture(preds)


class MemberChoice(nn.Module):
    """A Pyro model or guide that samples ``m ~ Categorical(1/M, ..., 1/M)`` at the site
    ``"member"`` and runs ``members[m]``.

    Members of one class have the same Pyro parameter names, so each runs in a parameter
    store of its own: it uses its own parameters, whatever the global store holds. One
    member per call: under a vectorised sample plate it raises.
    """

    def __init__(self, members: list[Callable]) -> None:
        super().__init__()
        if not members:
            raise ValueError("Expected at least one member.")
        self.members = nn.ModuleList(members)

    def forward(self, x: Tensor, y: Tensor | None = None):
        logits = torch.zeros(len(self.members), dtype=x.dtype, device=x.device)
        m = pyro.sample("member", dist.Categorical(logits=logits))
        if m.numel() != 1:
            raise ValueError("An ensemble's model and guide run one member per call: use "
                             "pyro.infer.Predictive(..., parallel=False).")
        with pyro.get_param_store().scope():
            return self.members[int(m)](x, y)


@dataclass
class EnsemblePosterior:
    """The members' posteriors; ``model`` and ``guide`` sample their equal mixture."""

    members: list[SVIPosterior | LaplaceFit]
    result: FitResult | None
    samples_per_member: int = 1

    def __post_init__(self) -> None:
        self.model = MemberChoice([p.model for p in self.members])
        self.guide = MemberChoice([p.guide for p in self.members])
        self.diagnostics: dict[str, float] = {}

    def predict(self, x: Tensor, num_samples: int) -> Predictive:
        """``samples_per_member`` predictive samples from every member, stacked (the
        mixture's weights are equal whatever ``num_samples``)."""
        return mixture([p.predict(x, self.samples_per_member) for p in self.members])

    def state_dict(self) -> dict:
        return {"members": [p.state_dict() for p in self.members],
                "result": result_state(self.result)}


@dataclass(frozen=True)
class Ensemble:
    """``members`` fits of ``member`` from different seeds; see the module doc.

    ``samples_per_member``: predictive samples per member (1 for point-mass members).
    """

    member: SVI | Laplace
    members: int = 5
    samples_per_member: int = 1

    def __post_init__(self) -> None:
        check_positive_int("members", self.members)
        check_positive_int("samples_per_member", self.samples_per_member)

    @property
    def guide(self) -> Callable[..., Callable] | None:
        """The SVI guide factory every member trains (``None`` for Laplace members, which
        build their own guide)."""
        return self.member.guide

    def with_guide_options(self, options: Mapping[str, Any]) -> Ensemble:
        return replace(self, member=self.member.with_guide_options(options))

    @property
    def replicas(self) -> bool:
        """Whether [`fit_many`][] trains many ensembles as replicas in one pass: when the
        member does (`bnn_zoo.methods._svi.SVI.replicas`)."""
        return self.member.replicas

    @property
    def streams(self) -> bool:
        """Whether the ensemble fits from a loader's batches: when the member does; its
        members are then fitted one by one."""
        return self.member.streams

    def _member_seeds(self, seed: int) -> list[int]:
        return [self.members * seed + m for m in range(self.members)]

    def _posterior(self, fits: list[SVIPosterior | LaplaceFit]) -> EnsemblePosterior:
        """The ensemble of the member fits ``fits``: their mean loss curve, and as time and
        steps the sums over members."""
        losses = torch.tensor([f.result.losses for f in fits]).mean(0).tolist()
        result = FitResult(losses=losses, seconds=sum(f.result.seconds for f in fits),
                           steps=sum(f.result.steps for f in fits))
        return EnsemblePosterior(fits, result, self.samples_per_member)

    def fit(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str, seed: int,
            budget: Budget, progress: bool | None) -> EnsemblePosterior:
        """``members`` fits of ``member`` on ``x`` (N, D), ``y`` (N,) from the seeds
        ``members * seed + m``: as replicas in one pass where [`replicas`][] (and the
        budget is not distributed), one by one otherwise (and from a loader's
        `Batches` ``x``, ``y`` ``None``)."""
        if self.replicas and not budget.distributed and not isinstance(x, Batches):
            return self.fit_many(build_model, x[None], y[None], task=task, seeds=[seed],
                                 budget=budget, progress=progress)[0]
        fits = []
        for member_seed in self._member_seeds(seed):
            pyro.set_rng_seed(member_seed)
            fits.append(self.member.fit(build_model, x, y, task=task, seed=member_seed,
                                        budget=budget, progress=progress))
        return self._posterior(fits)

    def fit_many(self, build_model: ModelFactory, x: Tensor, y: Tensor, *, task: str,
                 seeds: Sequence[int], budget: Budget, progress: bool | None
                 ) -> list[EnsemblePosterior]:
        """R ensembles in one replica pass (needs [`replicas`][]): ensemble ``r`` fits
        ``x[r]`` (N, D), ``y[r]`` (N,) with ``members`` members from the seeds
        ``members * seeds[r] + m``, the seeds [`fit`][] with ``seeds[r]`` uses, so all
        ``R * members`` members train as replicas of one
        [`fit_many`][bnn_zoo.methods.SVI.fit_many] (member ``m`` of fit ``r`` is replica
        ``r * members + m``, on its fit's data only). Every replica takes the minibatch
        order of the first member's seed ``members * seeds[0]``, so on full batches
        (deterministic MAP members) ensemble ``r`` equals [`fit`][] with ``seeds[r]`` up
        to round-off, and otherwise in distribution. ``budget.distributed`` is not
        supported (a ``ValueError``)."""
        if not self.replicas:
            raise ValueError("This ensemble's member does not declare replicas=True; fit "
                             "one ensemble at a time.")
        member_seeds = [s for seed in seeds for s in self._member_seeds(seed)]
        # (R, N, ...) -> (R * members, N, ...): member m of fit r sees x[r], y[r] only.
        fits = self.member.fit_many(build_model, x.repeat_interleave(self.members, 0),
                                    y.repeat_interleave(self.members, 0), task=task,
                                    seeds=member_seeds, budget=budget, progress=progress)
        return [self._posterior(fits[r * self.members:(r + 1) * self.members])
                for r in range(len(seeds))]

    def restore(self, build_model: ModelFactory, state: dict, *, x: Tensor,
                y: Tensor) -> EnsemblePosterior:
        """The posterior of `EnsemblePosterior.state_dict`."""
        members = [self.member.restore(build_model, s, x=x, y=y) for s in state["members"]]
        return EnsemblePosterior(members, result_from_state(state["result"]),
                                 self.samples_per_member)
