"""The mixture guide with K = 1, 2, 4 components against NUTS on a small BNN.

The target: the weight posterior of a 1-5-1 tanh net (16 weights, prior N(0, 1), noise
fixed at 0.2) on 20 random training points of ``sine`` and of ``gap``, in float64
(:func:`bnn_zoo.models._targets.bnn_posterior`). The reference: Pyro's NUTS on its log
density (``--warmup`` + ``--samples`` draws, tree depth ``--depth``), started uniformly in
(-1, 1)^16. The guides: K = 1 fitted ``--steps`` steps of the enumerated mixture ELBO, then
split into K antithetic copies (offsets 0.05 sqrt(D)) and fitted ``--steps`` more, so that
every K starts where K = 1 stands.

Per (data, K): ``w2``, the mean over x in [-3.5, 3.5] (71 points, across ``gap``'s gap) of
the 2-Wasserstein distance between the Gaussian moment-matched predictives
f(x) + N(0, 0.2^2) of the guide (4000 draws) and of NUTS
(:func:`bnn_zoo._harness.summary.gaussian_w2`); ``w2_diff_se``, the Monte Carlo standard
error of ``w2 - w2(K=1)`` (a bootstrap of the NUTS draws, which the guides share, and batch
means over the guide's draws, in quadrature); the ELBO with its standard error (8 batches
of 256 particles); and the effective number of components exp(H(pi)). Writes
``mixture_nuts.md``, ``.csv``, ``.json`` under ``--out``.
``tests/guides/test_mixture.py`` asserts what the table says on the same settings (slow) and on
a short run (fast).

    python benchmarks/mixture_nuts.py --out benchmarks/results/mixture_nuts
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import pyro
import torch
from pyro.infer.autoguide.initialization import init_to_uniform, init_to_value

from bnn_zoo import data, fit
from bnn_zoo._core.elbo import MixtureELBO, elbo_estimate
from bnn_zoo._core.nn import mlp_forward
from bnn_zoo._harness import flags
from bnn_zoo._harness.summary import gaussian_w2
from bnn_zoo._harness.tables import write_tables
from bnn_zoo.guides._mixture import MixtureGuide
from bnn_zoo.models._targets import UnnormalisedModel, bnn_posterior

#: The inputs where the predictives are compared; they cover ``gap``'s gap.
GRID = torch.linspace(-3.5, 3.5, 71, dtype=torch.float64)[:, None]
NO_DATA = (torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64))
#: Particles of an ELBO estimate: 8 batches of 256.
ELBO_PARTICLES = 2048


def small_bnn(name: str, n: int = 20, hidden: int = 5, noise: float = 0.2) -> UnnormalisedModel:
    """The weight posterior of a 1-``hidden``-1 tanh net, prior N(0, 1), noise fixed at
    ``noise``, on ``n`` random training points of ``name`` (float64)."""
    d = data.load(name, 0, dtype=torch.float64)
    idx = torch.randperm(d.x_train.shape[0], generator=torch.Generator().manual_seed(0))[:n]
    return bnn_posterior(d.x_train[idx], d.y_train[idx], hidden=(hidden,), noise_scale=noise)


def nuts_draws(model: UnnormalisedModel, warmup: int, samples: int, depth: int) -> torch.Tensor:
    """(samples, D) draws of Pyro's NUTS on the model's log density, started uniformly in
    (-1, 1)^D."""
    pyro.set_rng_seed(0)
    log_density = model.log_density
    init = {"theta": 2 * torch.rand(model.dim, dtype=torch.float64) - 1}
    kernel = pyro.infer.NUTS(potential_fn=lambda p: -log_density(p["theta"]),
                             max_tree_depth=depth)
    mcmc = pyro.infer.MCMC(kernel, num_samples=samples, warmup_steps=warmup,
                           initial_params=init, disable_progbar=True)
    mcmc.run()
    return mcmc.get_samples()["theta"]


def fit_components(model: UnnormalisedModel, k: int, steps: int,
                   start: MixtureGuide | None = None) -> MixtureGuide:
    """A ``k``-component mixture fitted by ``steps`` enumerated-ELBO steps, started either
    uniformly in (-1, 1)^D or, given ``start`` (a K=1 fit), from its component split into
    ``k`` antithetic copies (offsets 0.05 sqrt(D)), so every K starts where K=1 stands."""
    pyro.set_rng_seed(0)
    init = (init_to_uniform(radius=1.0) if start is None
            else init_to_value(values={"theta": start.mixture().locs[0].detach()}))
    guide = MixtureGuide(model, k, estimator="enumerate", init_scale=0.05, init_spread=0.05,
                         init_loc_fn=init)
    if start is not None:
        w = start.mixture().w.detach()
        with pyro.get_param_store().scope():  # set up without sharing Pyro's global store
            guide(*NO_DATA)
            guide.w = w.expand(k, -1).clone()
    fit(model, guide, *NO_DATA, steps=steps, lr=0.02, num_particles=8, elbo=MixtureELBO,
        seed=0, progress=False)
    return guide


def predictive_moments(model: UnnormalisedModel, theta: torch.Tensor) -> tuple:
    """Mean and standard deviation over :data:`GRID` of the predictive ``f(x) + N(0,
    sigma^2)`` under the weight draws ``theta`` (S, D)."""
    net = model.log_density
    f = mlp_forward(GRID, net.unflatten(theta), net.act).squeeze(-1)
    return f.mean(0), (f.var(0) + net.noise_scale**2).sqrt()


def w2_to_reference(model: UnnormalisedModel, guides: dict[int, MixtureGuide],
                    reference: torch.Tensor, *, draws: int = 4000, boot: int = 200
                    ) -> tuple[dict, dict]:
    """Mean over :data:`GRID` of the W2 distance between the Gaussian moment-matched
    predictives of each guide (``draws`` samples) and of the NUTS draws ``reference``; and
    the Monte Carlo standard error of each guide's distance minus K=1's: a bootstrap of the
    reference draws (which the guides share) and, in quadrature, batch means over the
    guides' draws."""
    samples = {k: g.mixture().sample((draws,)) for k, g in guides.items()}
    moments = {k: predictive_moments(model, s) for k, s in samples.items()}

    def distances(ref_moments, guide_moments):
        return {k: gaussian_w2(*m, *ref_moments).mean().item() for k, m in guide_moments.items()}

    ref_moments = predictive_moments(model, reference)
    w2 = distances(ref_moments, moments)
    gen = torch.Generator().manual_seed(1)
    ref_diffs = []
    for _ in range(boot):
        pick = torch.randint(reference.shape[0], (reference.shape[0],), generator=gen)
        b = distances(predictive_moments(model, reference[pick]), moments)
        ref_diffs.append([b[k] - b[1] for k in samples])
    ref_var = torch.tensor(ref_diffs).var(0)
    batches = 8
    per_batch = torch.tensor([[gaussian_w2(*predictive_moments(model, part), *ref_moments)
                               .mean().item() for part in s.chunk(batches)]
                              for s in samples.values()])  # (guides, batches)
    guide_var = per_batch.var(1) / batches
    se = {k: math.sqrt(ref_var[i] + guide_var[i] + (guide_var[0] if k != 1 else 0.0))
          for i, k in enumerate(samples)}
    return w2, se


def compare_components(name: str, components: Sequence[int], *, warmup: int, samples: int,
                       depth: int, steps: int) -> list[dict]:
    """The rows of the table for the data set ``name``: one per K in ``components`` (K = 1
    first, the baseline of ``w2_diff_se``)."""
    model = small_bnn(name)
    reference = nuts_draws(model, warmup=warmup, samples=samples, depth=depth)
    base = fit_components(model, 1, steps=steps)
    guides = {k: fit_components(model, k, steps=steps, start=base)
              for k in dict.fromkeys((1, *components))}
    w2, se = w2_to_reference(model, guides, reference)
    rows = []
    for k, guide in guides.items():
        elbo, elbo_se = elbo_estimate(model, guide, *NO_DATA, particles=ELBO_PARTICLES)
        rows.append({"data": name, "K": k, "w2": w2[k], "w2_diff_se": se[k] if k != 1 else None,
                     "elbo": elbo, "elbo_se": elbo_se,
                     "effective_components": guide.effective_components()})
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_data_flag(parser, ("sine", "gap"))
    parser.add_argument("--components", nargs="+", type=flags.positive_int, default=[1, 2, 4],
                        help="mixture sizes K (K = 1 always runs: the baseline)")
    parser.add_argument("--steps", type=flags.positive_int, default=600,
                        help="steps of the K = 1 fit, and of each K after the split")
    parser.add_argument("--warmup", type=flags.positive_int, default=150)
    parser.add_argument("--samples", type=flags.positive_int, default=200)
    parser.add_argument("--depth", type=flags.positive_int, default=6,
                        help="NUTS's maximum tree depth")
    flags.add_shared_flags(parser, out="results/mixture_nuts", threads=1,
                           without=("device", "seed", "splits"))
    args = flags.parse(parser, argv)
    rows = [row for name in args.data
            for row in compare_components(name, args.components, warmup=args.warmup,
                                          samples=args.samples, depth=args.depth,
                                          steps=args.steps)]
    preamble = (f"NUTS: {args.warmup} warmup + {args.samples} draws, tree depth {args.depth}; "
                f"K = 1 fitted {args.steps} steps, then each K {args.steps} more from its "
                "split; w2_diff_se: the standard error of w2 - w2(K = 1).")
    print(write_tables(args.out, "mixture_nuts", rows, keys=("data", "K"),
                       columns=("w2", "w2_diff_se", "elbo", "effective_components"),
                       preamble=preamble))
    return rows


if __name__ == "__main__":
    main()
