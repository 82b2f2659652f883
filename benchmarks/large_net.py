"""The scalable entries on a ResNet-18-sized network (He et al. 2016, "Deep Residual Learning
for Image Recognition", its CIFAR form: about 11.2M weights at width 64) on 32x32x3 images:
``laplace_last_layer``, ``laplace_kron`` and ``bbb`` each fit (``--steps`` steps) and
predict, with their time, peak memory and test accuracy; ``laplace_full`` must be refused
by its memory guard before it allocates its P x P matrix (its row gives the message, and
a peak memory far below P^2 floats shows it allocated nothing of the kind).

The images are synthetic: Gaussian pixels, labelled by a fixed random linear map of their
4x4 average-pooled colours, so there is something to learn and nothing to download.
Peak memory is ``torch.cuda.max_memory_allocated`` on a GPU, and the process's resident
high-water mark on the CPU (which never falls: each row is the largest so far). Writes
``large_net.md``/``.csv``/``.json`` under ``--out``::

    python benchmarks/large_net.py --device cuda --out benchmarks/results/gpu/large_net
    python benchmarks/large_net.py --width 4 --n 128 --steps 5   # a dry run on the CPU
"""

from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Sequence

import pyro
import torch
from torch import Tensor, nn

from bnn_zoo import zoo
from bnn_zoo._harness import flags
from bnn_zoo._harness.tables import write_tables

ENTRIES = ("laplace_last_layer", "laplace_kron", "bbb", "laplace_full")
CLASSES = 10


class Block(nn.Module):
    """A basic residual block: two 3x3 convolutions with batch norm, and a 1x1 projection on
    the shortcut where the shape changes."""

    def __init__(self, d_in: int, d_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(d_in, d_out, 3, stride, 1, bias=False), nn.BatchNorm2d(d_out), nn.ReLU(),
            nn.Conv2d(d_out, d_out, 3, 1, 1, bias=False), nn.BatchNorm2d(d_out))
        self.shortcut = nn.Identity() if stride == 1 and d_in == d_out else nn.Sequential(
            nn.Conv2d(d_in, d_out, 1, stride, bias=False), nn.BatchNorm2d(d_out))

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet18(width: int = 64) -> nn.Module:
    """ResNet-18 for 32x32x3 images: a 3x3 stem, four stages of two blocks of widths
    ``width * (1, 2, 4, 8)``, global average pooling and a linear layer to the logits."""
    widths = [width * m for m in (1, 2, 4, 8)]
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                               nn.ReLU()]
    d_in = width
    for stage, d_out in enumerate(widths):
        layers += [Block(d_in, d_out, 1 if stage == 0 else 2), Block(d_out, d_out, 1)]
        d_in = d_out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(d_in, CLASSES))


def images(n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """``n`` synthetic images (n, 3, 32, 32) and their labels (module doc)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, 32, 32, generator=g)
    teacher = torch.randn(3 * 16, CLASSES, generator=g)
    pooled = nn.functional.avg_pool2d(x, 8).flatten(1)
    return x.to(device), (pooled @ teacher).argmax(-1).to(device)


def peak_mb(device: torch.device) -> float:
    """The peak memory so far, in MiB (module doc)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def run(entry: str, args: argparse.Namespace) -> dict:
    """Fit ``entry`` on the training images and predict the test ones (or record its
    refusal)."""
    x, y = images(args.n + args.n // 4, args.device)
    x_train, y_train, x_test, y_test = x[:args.n], y[:args.n], x[args.n:], y[args.n:]
    if args.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(args.device)
    pyro.set_rng_seed(0)
    started = time.perf_counter()
    record = {"entry": entry, "weights": sum(p.numel() for p in resnet18(args.width).parameters())}
    try:
        fitted = zoo.get(entry).fit(x_train, y_train, net=lambda: resnet18(args.width),
                                    task="classification", seed=0, steps=args.steps,
                                    batch_size=args.batch, progress=False)
    except ValueError as refusal:  # UnsupportedProblem, or a guard naming what it would need
        return {**record, "outcome": f"refused: {refusal}".replace("|", "/"),
                "fit_seconds": time.perf_counter() - started, "peak_mb": peak_mb(args.device)}
    fit_seconds = time.perf_counter() - started
    started = time.perf_counter()
    probs = fitted.predict(x_test, num_samples=args.samples).probs.mean(0)
    return {**record, "outcome": "fit and predicted", "fit_seconds": fit_seconds,
            "predict_seconds": time.perf_counter() - started, "peak_mb": peak_mb(args.device),
            "accuracy": float((probs.argmax(-1) == y_test).float().mean())}


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    flags.add_shared_flags(parser, out="results/large_net", threads=2, without=("splits",))
    flags.add_entries_flag(parser, ENTRIES)
    parser.add_argument("--width", type=flags.positive_int, default=64,
                        help="channels of the first stage (64: ResNet-18, 11.2M weights)")
    parser.add_argument("--n", type=flags.positive_int, default=1024, help="training images")
    parser.add_argument("--steps", type=flags.positive_int, default=200,
                        help="training steps of every fit")
    parser.add_argument("--batch", type=flags.positive_int, default=128)
    parser.add_argument("--samples", type=flags.positive_int, default=20,
                        help="posterior samples per prediction")
    args = flags.parse(parser, argv)
    rows = []
    for entry in args.entries:
        rows.append(run(entry, args))
        print(f"{entry}: {rows[-1]['outcome']}, {rows[-1]['fit_seconds']:.1f} s", flush=True)
        table = write_tables(args.out, "large_net", rows, keys=("entry",),
                             columns=("weights", "outcome", "fit_seconds", "predict_seconds",
                                      "peak_mb", "accuracy"))
    print(table)
    return rows


if __name__ == "__main__":
    main()
