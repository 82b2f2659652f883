"""Milliseconds per Bayes-by-Backprop step of the digits CNN through the zoo, against plain
PyTorch (the goal: the zoo's step at most 1.2x the hand-written one).

The network is :func:`bnn_zoo.models._module.digits_cnn` (``Conv2d(1, C, 3) -> ReLU ->
Linear(C * 36, 10)`` on scikit-learn's 8x8 digits), minibatches of ``--batch`` out of the
first ``B * floor(1797 / B)`` digits (so every minibatch is full; all steps walk them alike,
a fresh permutation every epoch), ``N(0, 1)`` prior, fused Adam (as ``SVIStep``), Pyro's
validation off (as ``bnn_zoo.fit`` trains). Timed in the same run, interleaved, medians:

* ``torch_map``: a deterministic plain-PyTorch step of the same CNN (cross-entropy scaled
  by ``N / B`` plus the Gaussian prior's ``|w|^2 / 2``);
* ``torch_<estimator>``: a hand-written BBB step (diagonal Gaussian ``mu + softplus(rho) *
  eps``, closed-form KL) of the same CNN with the same estimator as the zoo step;
* ``zoo_<estimator>``: :class:`~bnn_zoo.models.BayesianModule` with the ``bbb`` entry's
  guide (:class:`~bnn_zoo.guides.BayesByBackpropGuide`) through
  :class:`~bnn_zoo._core.step.SVIStep` (what ``bnn_zoo.fit`` runs, without validation)
  with the estimator's ELBO and the loss traced as the ``bbb`` entry trains (``jit``);
  ``zoo_<estimator>_eager``: the same untraced.

Estimators: ``sample`` (one weight sample per minibatch, :class:`MeanFieldELBO`), ``lrt``
(local reparameterisation, :class:`LocalReparameterizationELBO`, the ``bbb`` entry's ELBO)
and ``flipout`` (:class:`FlipoutELBO`). ``cnn.md``, ``.csv`` and ``.json`` under ``--out``
give each step's time, its ratio to ``torch_map``, the zoo-to-hand-written ratio and its
peak memory (``*_mib``: after the timing, ``--inner`` more calls of each step alone, the
largest peak of a call above what was in use before it, by
:func:`~bnn_zoo._harness.memory.step_peaks`: the resident set size on the CPU, the CUDA
allocator's count on a GPU)::

    python benchmarks/cnn.py --out results/cnn
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import pyro
import torch
from sklearn.datasets import load_digits
from torch import Tensor
from torch.nn import functional as F

from bnn_zoo import zoo
from bnn_zoo._core.elbo import FlipoutELBO, LocalReparameterizationELBO, MeanFieldELBO
from bnn_zoo._core.step import SVIStep
from bnn_zoo._harness import flags
from bnn_zoo._harness.memory import step_peaks
from bnn_zoo._harness.tables import write_tables
from bnn_zoo._harness.timing import epoch_batches, interleaved_medians
from bnn_zoo.guides._bbb import softplus_inverse
from bnn_zoo.models import BayesianModule, digits_cnn

ESTIMATORS = {"sample": MeanFieldELBO, "lrt": LocalReparameterizationELBO,
              "flipout": FlipoutELBO}
INIT_SCALE = 1e-2  # the bbb guide's default initial posterior scale


def digits(device: torch.device) -> tuple[Tensor, Tensor]:
    """The 1797 digits, pixels scaled to [0, 1], as (N, 64) inputs and (N,) labels."""
    data = load_digits()
    x = torch.as_tensor(data.data, dtype=torch.float32) / 16.0
    return x.to(device), torch.as_tensor(data.target).to(device)


def cnn_forward(x: Tensor, params: Sequence[Tensor]) -> Tensor:
    """The digits CNN on (B, 64) inputs with the tensors ``(conv weight, conv bias, linear
    weight, linear bias)``."""
    conv_w, conv_b, lin_w, lin_b = params
    h = F.relu(F.conv2d(x.view(-1, 1, 8, 8), conv_w, conv_b))
    return F.linear(h.flatten(1), lin_w, lin_b)


def signs(shape: Sequence[int], like: Tensor) -> Tensor:
    return torch.randint(0, 2, tuple(shape), device=like.device, dtype=like.dtype) * 2 - 1


def cnn_lrt(x: Tensor, locs: Sequence[Tensor], scales: Sequence[Tensor]) -> Tensor:
    """The CNN with both layers' pre-activations drawn from their Gaussian (mean
    ``layer(x; M)``, variance ``layer(x^2; S^2)``), fresh noise per point and unit."""
    img = x.view(-1, 1, 8, 8)
    mean = F.conv2d(img, locs[0], locs[1])
    var = F.conv2d(img**2, scales[0] ** 2, scales[1] ** 2)
    h = F.relu(mean + var.sqrt() * torch.randn_like(mean)).flatten(1)
    mean = F.linear(h, locs[2], locs[3])
    var = F.linear(h**2, scales[2] ** 2, scales[3] ** 2)
    return mean + var.sqrt() * torch.randn_like(mean)


def cnn_flipout(x: Tensor, locs: Sequence[Tensor], scales: Sequence[Tensor]) -> Tensor:
    """The CNN by flipout: ``layer(x; M) + layer(x * s_in; dW) * s_out``, signs per point
    and channel, ``dW = S * eps`` one draw per step."""
    deltas = [s * torch.randn_like(s) for s in scales]
    img = x.view(-1, 1, 8, 8)
    h = F.conv2d(img, locs[0], locs[1]) + F.conv2d(
        img * signs((img.shape[0], 1, 1, 1), img), deltas[0], deltas[1]) \
        * signs((img.shape[0], locs[0].shape[0], 1, 1), img)
    h = F.relu(h).flatten(1)
    return F.linear(h, locs[2], locs[3]) + F.linear(h * signs(h.shape, h), deltas[2], deltas[3]) \
        * signs((h.shape[0], locs[2].shape[0]), h)


def cnn_sample(x: Tensor, locs: Sequence[Tensor], scales: Sequence[Tensor]) -> Tensor:
    """The CNN with one weight sample ``M + S * eps`` for the whole minibatch."""
    return cnn_forward(x, [m + s * torch.randn_like(s) for m, s in zip(locs, scales)])


HAND_FORWARD = {"sample": cnn_sample, "lrt": cnn_lrt, "flipout": cnn_flipout}


def torch_map_step(x: Tensor, y: Tensor, batch: int, channels: int) -> Callable[[], None]:
    params = [p.detach().clone().to(x.device).requires_grad_()
              for p in digits_cnn(channels).parameters()]
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    n, next_batch = x.shape[0], epoch_batches(x.shape[0], batch, device=x.device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        idx = next_batch()
        loss = n / batch * F.cross_entropy(cnn_forward(x[idx], params), y[idx], reduction="sum")
        loss = loss + 0.5 * sum((p**2).sum() for p in params)
        loss.backward()
        opt.step()

    return step


def torch_bbb_step(x: Tensor, y: Tensor, batch: int, channels: int, estimator: str
                   ) -> Callable[[], None]:
    locs = [p.detach().clone().to(x.device).requires_grad_()
            for p in digits_cnn(channels).parameters()]
    rhos = [torch.full_like(m, softplus_inverse(INIT_SCALE)).requires_grad_() for m in locs]
    opt = torch.optim.Adam(locs + rhos, lr=1e-3, fused=True)
    forward = HAND_FORWARD[estimator]
    n, next_batch = x.shape[0], epoch_batches(x.shape[0], batch, device=x.device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        idx = next_batch()
        scales = [F.softplus(r) for r in rhos]
        f = forward(x[idx], locs, scales)
        # KL(N(m, s^2) || N(0, 1)) in closed form, as the zoo's MeanFieldELBO computes it.
        kl = sum((0.5 * (s**2 + m**2 - 1) - s.log()).sum() for m, s in zip(locs, scales))
        loss = n / batch * F.cross_entropy(f, y[idx], reduction="sum") + kl
        loss.backward()
        opt.step()

    return step


def zoo_bbb_step(x: Tensor, y: Tensor, batch: int, channels: int, estimator: str,
                 jit: bool) -> SVIStep:
    """The zoo's step: BayesianModule(digits_cnn) with the ``bbb`` entry's guide factory."""
    model = BayesianModule(digits_cnn(channels).to(x.device), task="classification")
    guide = zoo.get("bbb").guide(model, init_scale=INIT_SCALE)
    return SVIStep(model, guide, x, y, lr=1e-3, batch_size=batch, elbo=ESTIMATORS[estimator],
                   jit=jit)


def build_steps(x: Tensor, y: Tensor, batch: int, channels: int, estimators: Sequence[str],
                jit: bool) -> dict[str, Callable[[], object]]:
    """``torch_map`` and, per estimator, ``torch_<est>``, ``zoo_<est>`` (traced if ``jit``)
    and ``zoo_<est>_eager``, all walking minibatches of ``batch`` of ``x``, ``y``; build them
    with Pyro's validation off (as they are timed)."""
    steps: dict[str, Callable[[], object]] = {"torch_map": torch_map_step(x, y, batch, channels)}
    for est in estimators:
        steps[f"torch_{est}"] = torch_bbb_step(x, y, batch, channels, est)
        steps[f"zoo_{est}"] = zoo_bbb_step(x, y, batch, channels, est, jit)
        steps[f"zoo_{est}_eager"] = zoo_bbb_step(x, y, batch, channels, est, False)
    return steps


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=flags.positive_int, default=15)
    parser.add_argument("--inner", type=flags.positive_int, default=20)
    parser.add_argument("--batch", type=flags.positive_int, default=128)
    parser.add_argument("--channels", type=flags.positive_int, default=8,
                        help="convolution channels of digits_cnn (default: 8)")
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS),
                        choices=list(ESTIMATORS))
    flags.add_shared_flags(parser, out="results/cnn", threads=1, without=("splits",))
    args = flags.parse(parser, argv)
    pyro.set_rng_seed(args.seed)
    x, y = digits(args.device)
    batch = min(args.batch, x.shape[0])
    x, y = x[: batch * (x.shape[0] // batch)], y[: batch * (x.shape[0] // batch)]
    jit = zoo.get("bbb").budget.jit
    with pyro.validation_enabled(False):  # as bnn_zoo.fit trains by default
        steps = build_steps(x, y, batch, args.channels, args.estimators, jit)
        ms = interleaved_medians(steps, repeats=args.repeats, inner=args.inner,
                                 device=args.device)
        mib = step_peaks(steps, calls=args.inner, device=args.device)
    n = x.shape[0]
    rows = [{"estimator": est, "device": str(args.device), "batch": batch,
             "torch_map_ms": ms["torch_map"], "torch_bbb_ms": ms[f"torch_{est}"],
             "zoo_bbb_ms": ms[f"zoo_{est}"], "zoo_eager_ms": ms[f"zoo_{est}_eager"],
             "torch_bbb_per_map": ms[f"torch_{est}"] / ms["torch_map"],
             "zoo_bbb_per_map": ms[f"zoo_{est}"] / ms["torch_map"],
             "zoo_vs_hand": ms[f"zoo_{est}"] / ms[f"torch_{est}"],
             "zoo_eager_vs_hand": ms[f"zoo_{est}_eager"] / ms[f"torch_{est}"],
             "torch_map_mib": mib["torch_map"], "torch_bbb_mib": mib[f"torch_{est}"],
             "zoo_bbb_mib": mib[f"zoo_{est}"], "zoo_eager_mib": mib[f"zoo_{est}_eager"]}
            for est in args.estimators]
    columns = ("torch_map_ms", "torch_bbb_ms", "zoo_bbb_ms", "zoo_eager_ms", "torch_bbb_per_map",
               "zoo_bbb_per_map", "zoo_vs_hand", "zoo_eager_vs_hand", "torch_map_mib",
               "torch_bbb_mib", "zoo_bbb_mib", "zoo_eager_mib")
    preamble = (f"digits CNN ({args.channels} channels), batch {batch} of {n}, "
                f"{args.threads} thread(s), median of {args.repeats} x {args.inner} steps; zoo "
                f"steps {'traced (jit)' if jit else 'eager'} as the bbb entry trains, and eager; "
                "the goal: zoo_vs_hand <= 1.2; *_mib: peak MiB above the step's "
                f"state, largest of {args.inner} steps")
    print(write_tables(args.out, "cnn", rows, keys=("estimator", "device", "batch"),
                       columns=columns, preamble=preamble))
    return {"rows": rows}


if __name__ == "__main__":
    main()
