"""Bundled references: HMC runs shipped with the package, so that a comparison measures
every guide's distance to a converged reference without sampling it again.

A reference is the costly part of a comparison: on the bundled ``sine`` data the ``hmc``
entry's 8 chains of 2,500 iterations take about 3.5 minutes on a CPU, while the guides
the comparison measures take seconds. As the NeurIPS 2021 competition on approximate
inference in Bayesian deep learning (Wilson, Izmailov, Hoffman, Gal et al.) shipped its
HMC samples for the entrants to compare with, the package ships the reference's run
record (`bnn_zoo._harness.runs.run_one`: its metrics, convergence diagnostics, and the
predictive's moments and quantiles at the test inputs, all that the distances read) as
``references/<entry>_<data>_split<k>_seed<s>.json``. ``python -m bnn_zoo compare`` reads
it (``--reference auto``, its default) where one matches the run it would fit: the same
entry, data values (their digest), split, seed, options, number of predictive samples,
device and dtype; ``--reference hmc`` samples the reference again.

A bundled run is of the code that sampled it: its record keeps that code version, which
the tables name and ``python -m bnn_zoo stale`` compares with today's. What makes it a
reference of today's posterior is checked separately (`check_posterior`): the file keeps
the model's log joint density ``log p(w) + sum_n log p(y_n | x_n, w, sigma)`` at three
weight vectors, on the standardised training data at the reference's noise scale
``sigma``, and today's model must give the same values; a change of the prior, the
likelihood, the network, the standardisation or the data fails it.
``benchmarks/bundle_reference.py`` samples and writes the file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pyro
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from bnn_zoo import zoo
from bnn_zoo._core import data as data_module
from bnn_zoo._core.files import read_json, write_text_atomic
from bnn_zoo._core.scaling import Standardizer
from bnn_zoo._core.tasks import task_named
from bnn_zoo._harness.runs import _base_record, _canonical

__all__ = ["BUNDLED", "NOT_BUNDLED", "bundle", "bundled_path", "bundled_runs", "check_posterior",
           "log_joint"]

#: The folder of the bundled references.
BUNDLED = Path(__file__).with_name("references")
#: The reason of a reference run that no bundled file matches (``--reference auto``).
NOT_BUNDLED = "not run: no bundled reference with these settings"
#: Significant digits of the numbers a bundled record keeps (float32 computes them).
DIGITS = 7
#: The scales of the three weight vectors at which `check_posterior` compares log joints.
CHECK_SCALES = (0.1, 0.5, 1.0)


def bundled_path(entry: str, data: str, split: int, seed: int) -> Path:
    """Where the bundled record of ``entry`` on split ``split`` of ``data`` (seed ``seed``)
    lies."""
    return BUNDLED / f"{entry}_{data.replace('/', '_')}_split{split}_seed{seed}.json"


def _matches(settings: dict, wanted: dict) -> bool:
    """Whether two runs' settings agree in everything but the code version."""
    def without_code(s: dict) -> str:
        return _canonical({k: v for k, v in s.items() if k != "code"})
    return without_code(settings) == without_code(wanted)


def bundled_runs(entry: str, datasets: Sequence[data_module.Dataset], *,
                 splits: Sequence[int], seeds: Sequence[int], overrides: dict | None,
                 num_samples: int, quantiles: bool, together: bool,
                 log: bool = True) -> list[dict]:
    """The bundled records of ``entry`` on ``datasets`` (with ``splits``, ``seeds``), in the
    arguments of `bnn_zoo._harness.runs.cached_runs`; a split whose run no bundled file
    matches (its settings but the code version) is recorded as skipped, with the reason
    `NOT_BUNDLED`. Nothing is fitted; ``log`` prints a line for each bundled run found."""
    if together:
        overrides = {**(overrides or {}), "replicas": list(splits)}
    records = []
    for dataset, split, seed in zip(datasets, splits, seeds):
        wanted = _base_record(entry, dataset, split, seed, overrides, num_samples, quantiles)
        path = bundled_path(entry, dataset.name, split, seed)
        record = read_json(path)["runs"][0] if path.is_file() else None
        if record is None or not _matches(record["settings"], wanted["settings"]):
            record = {**wanted, "status": "skipped", "reason": NOT_BUNDLED}
        elif log:
            print(f"[bundled] {entry} on {dataset.name} split {split}: sampled in "
                  f"{record['seconds']:.0f} s by code {record['settings']['code']}", flush=True)
        records.append(record)
    return records


def log_joint(entry: str, dataset: data_module.Dataset, noise_scale: float,
              weights: Sequence[dict[str, Tensor]]) -> list[float]:
    """``log p(w) + sum_n log p(y_n | x_n, w, sigma)`` of ``entry``'s model at each of
    ``weights`` (site values), on the training data of ``dataset`` standardised as a fit
    standardises it, with the noise scale fixed at ``noise_scale``: the density the
    reference's chains sample (up to its normaliser)."""
    x_scaler = Standardizer.fit(dataset.x_train)
    y_scaler = task_named(dataset.task).scaler(dataset.y_train, Standardizer.fit)
    x, y = x_scaler.transform(dataset.x_train), y_scaler.transform(dataset.y_train)
    model = zoo.get(entry).model(dataset.in_dim, 1, task=dataset.task, noise_scale=noise_scale)
    values = []
    with pyro.get_param_store().scope(), torch.no_grad():
        for w in weights:
            trace = poutine.trace(poutine.condition(model, data=w)).get_trace(x, y)
            values.append(float(trace.log_prob_sum()))
    return values


def _check_weights(entry: str, dataset: data_module.Dataset) -> list[dict[str, Tensor]]:
    """Three weight vectors of ``entry``'s model, standard normal draws times
    `CHECK_SCALES` (seeded)."""
    model = zoo.get(entry).model(dataset.in_dim, 1, task=dataset.task, noise_scale=1.0)
    with pyro.get_param_store().scope(), torch.no_grad():
        trace = poutine.trace(model).get_trace(dataset.x_train[:2], dataset.y_train[:2])
    shapes = {name: site["value"].shape for name, site in trace.nodes.items()
              if site["type"] == "sample" and not site["is_observed"]
              and not site_is_subsample(site) and not site["infer"].get("_deterministic")}
    generator = torch.Generator().manual_seed(0)
    return [{name: scale * torch.randn(shape, generator=generator)
             for name, shape in shapes.items()} for scale in CHECK_SCALES]


def _rounded(value: object) -> object:
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.{DIGITS}g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def bundle(record: dict, dataset: data_module.Dataset) -> Path:
    """Write the ``ok`` run ``record`` of a reference on ``dataset`` as its bundled file
    (`bundled_path`), numbers to `DIGITS` significant digits, with the log joints of
    `check_posterior`; return the path."""
    if record["status"] != "ok":
        raise ValueError(f"Expected a finished run to bundle, got status {record['status']!r}.")
    noise_scale = record["diagnostics"]["noise_scale"]
    weights = _check_weights(record["entry"], dataset)
    kept = {k: v for k, v in record.items() if k != "losses"}
    document = {"runs": [_rounded(kept)],
                "check": {"noise_scale": noise_scale,
                          "weights": [{k: v.tolist() for k, v in w.items()} for w in weights],
                          "log_joint": log_joint(record["entry"], dataset, noise_scale,
                                                 weights)},
                "provenance": {k: [record["provenance"][k]] for k in ("code", "commit")}}
    path = bundled_path(record["entry"], record["data"], record["split"], record["seed"])
    write_text_atomic(path, json.dumps(document, separators=(",", ":")) + "\n")
    return path


def check_posterior(path: Path) -> tuple[list[float], list[float]]:
    """The log joints a bundled file at ``path`` keeps and those today's model gives at the
    same weights, noise scale and data (`log_joint`): equal when the reference is of
    today's posterior."""
    document = read_json(path)
    record, check = document["runs"][0], document["check"]
    dataset = data_module.load(record["data"], record["split"])
    weights = [{k: torch.tensor(v) for k, v in w.items()} for w in check["weights"]]
    return check["log_joint"], log_joint(record["entry"], dataset, check["noise_scale"], weights)
