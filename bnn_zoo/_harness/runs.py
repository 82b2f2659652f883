"""Runs: one entry fitted on one split and evaluated, and the cache of finished runs.

`run_one` fits through the zoo's contract (``entry.fit``, ``Fitted.evaluate``,
``Fitted.predict``) and returns a JSON-ready record: metrics, diagnostics (with those a
posterior computes at the test inputs: NUTS's R-hat and ESS over the predictive), the thinned
loss curve, the predictive's moments at the test inputs (regression) or its averaged class
probabilities there (``class_probs``, classification), for distances to a reference
(`reference_distances`), and, for a run compared with a reference (``quantiles=True``),
the predictive's quantiles at the `W1_LEVELS` levels ``(k - 1/2) / K`` at every test input
(``quantiles``, K lists of N), from which the Wasserstein-1 distance follows
([`quantile_w1`][bnn_zoo._harness.summary.quantile_w1]), a predictive band on a grid (1-D
inputs) or, for classification, reliability bins and ``auroc_shift``: the AUROC of the
predictive entropy for telling the test points from a covariate-shifted copy of them
([`shifted_inputs`][bnn_zoo.evaluation._metrics.shifted_inputs]).
`cached_run` keeps each finished record as JSON under
``<out>/runs/<entry>/``, named by the entry, data set, split, seed and a digest of every
other setting that changes the result (the entry's options, the group of splits fitted
together as replicas, ``num_samples``, the device, the dtype, a digest of the data's values
and the version of the code: `code_version`), so a rerun
after a crash, or with more entries, fits only what is missing, and a run of other code is
never read back as this code's. Every record names where it comes from (``provenance``:
`provenance`).

Determinism: on the CPU with a fixed thread count the same call reproduces every split's
record (each fit seeds its own random streams from its seed). A split fitted among replicas
draws its minibatch order and noise jointly with the other splits of its group, so it does
not equal the same split fitted alone (it agrees with it in distribution); the group is
therefore part of the cache key (`cached_runs`).

The cache itself is not committed; the runs
that a comparison's JSON keeps (``<name>.json``, ``"runs"``) are, and `restore_cache`
writes them back as cache files, so that a fresh checkout resumes the committed results
instead of refitting them. Each file is written atomically (a run
interrupted, even by Ctrl-C, leaves no half-written file); a cache file that cannot be
read is refitted, and one that cannot be written is skipped, with a
`CacheWarning`.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyro
import torch
from torch import Tensor

from bnn_zoo import zoo
from bnn_zoo._core import data as data_module
from bnn_zoo._core.files import read_json, write_text_atomic
from bnn_zoo._core.predictive import GaussianMixturePredictive
from bnn_zoo._harness.figures import BAND_MASS
from bnn_zoo._harness.provenance import code_version, provenance, run_code
from bnn_zoo.evaluation._metrics import auroc, reliability_bins, shifted_inputs
from bnn_zoo.zoo import UnsupportedProblem

__all__ = ["CACHE", "W1_LEVELS", "CacheWarning", "cache_path", "cache_record", "cached_run",
           "cached_runs", "data_digest", "restore_cache", "results_jsons", "run_many", "run_one",
           "run_settings", "w1_levels"]

#: The number K of quantile levels a run compared with a reference keeps per test input: the
#: midpoint rule of ``W1 = int_0^1 |Q_a(u) - Q_b(u)| du`` on them falls short of the integral
#: by the outer halves of the first and last levels' tails: 0.9% for two Gaussians of scales
#: 1 and 2, 1.3% for the Gaussian mixtures of the tests.
W1_LEVELS = 32


def w1_levels() -> list[float]:
    """The quantile levels ``(k - 1/2) / K``, ``k = 1..K``, ``K`` = `W1_LEVELS`."""
    return [(k + 0.5) / W1_LEVELS for k in range(W1_LEVELS)]

#: The folder of a comparison's output that caches its runs, one record each.
CACHE = "runs"

GRID_POINTS = 200
#: How far a band figure reaches beyond the training inputs, as a fraction of their range.
EXTRAPOLATION = 0.5
CURVE_POINTS = 200
#: The fields a cached record must have to be reused, and those of a finished (``ok``) one.
RECORD_FIELDS = ("entry", "data", "task", "split", "seed", "status", "settings")
OK_FIELDS = ("metrics", "diagnostics", "losses", "seconds")
#: The reason of a run that a comparison with ``fit_missing=False`` found missing from its cache.
NOT_CACHED = "not run: no cached result (tables written from the cache only)"


class CacheWarning(RuntimeWarning):
    """A cached run could not be read and is fitted again."""


def _thin(values: Sequence[float], points: int = CURVE_POINTS) -> list[float]:
    """Chunk means of ``values``: at most ``points`` of them (a smoothed curve)."""
    if len(values) <= points:
        return [float(v) for v in values]
    chunks = torch.tensor_split(torch.tensor(values, dtype=torch.float64), points)
    return [float(c.mean()) for c in chunks]


def _grid(dataset: data_module.Dataset) -> Tensor:
    """Inputs of a band figure: the training range extended by `EXTRAPOLATION` of it
    on each side, so the figure shows how each posterior extrapolates."""
    x = dataset.x_train
    lo, hi = float(x.min()), float(x.max())
    pad = EXTRAPOLATION * (hi - lo)
    return torch.linspace(lo - pad, hi + pad, GRID_POINTS, dtype=x.dtype,
                          device=x.device).unsqueeze(-1)


def _tolist(t: Tensor) -> list:
    return t.detach().to("cpu", torch.float64).tolist()


def data_digest(dataset: data_module.Dataset) -> str:
    """A digest of the values of the split (training and test), so that another version of
    a data file under the same name is a different run."""
    digest = hashlib.sha1()
    for t in (dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test):
        digest.update(str((t.dtype, tuple(t.shape))).encode())
        digest.update(t.detach().to("cpu").contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def run_settings(dataset: data_module.Dataset, overrides: dict | None, num_samples: int, *,
                 quantiles: bool = False) -> dict:
    """Every setting besides entry, data, split and seed that changes a run's result,
    the version of the code that computes it included (``code``:
    `code_version`)."""
    return {"overrides": overrides or {}, "num_samples": num_samples,
            **({"quantiles": W1_LEVELS} if quantiles else {}),
            "device": str(dataset.x_train.device), "dtype": str(dataset.x_train.dtype),
            "data_digest": data_digest(dataset), "code": code_version()}


def _base_record(entry: str, dataset: data_module.Dataset, split: int, seed: int,
                 overrides: dict | None, num_samples: int, quantiles: bool = False) -> dict:
    return {"entry": entry, "data": dataset.name, "task": dataset.task, "split": split,
            "seed": seed, "settings": run_settings(dataset, overrides, num_samples,
                                                   quantiles=quantiles),
            "provenance": provenance(dataset.x_train.device)}


def _failed(record: dict, error: Exception) -> dict:
    if isinstance(error, UnsupportedProblem):
        return {**record, "status": "skipped", "reason": str(error)}
    return {**record, "status": "failed", "reason": f"{type(error).__name__}: {error}"}


def run_one(entry: str, dataset: data_module.Dataset, *, split: int, seed: int,
            overrides: dict | None = None, num_samples: int = 200,
            quantiles: bool = False) -> dict:
    """Fit ``entry`` on ``dataset`` and return its record (metrics and what the figures
    need). ``overrides`` is passed to ``entry.fit`` as keyword arguments (budget fields,
    ``model_options``, ``guide_options``, ``method_options``).

    An entry that raises [`UnsupportedProblem`][bnn_zoo.zoo.UnsupportedProblem] gives a record with
    ``status="skipped"`` and the reason; any other error ``status="failed"``.
    """
    record = _base_record(entry, dataset, split, seed, overrides, num_samples, quantiles)
    started = time.perf_counter()
    try:
        fitted = zoo.get(entry).fit(dataset.x_train, dataset.y_train, task=dataset.task,
                                    seed=seed, progress=False, **(overrides or {}))
    except Exception as error:  # a benchmark reports a broken entry and goes on
        return _failed(record, error)
    return _evaluated(record, fitted, dataset, num_samples, time.perf_counter() - started)


def run_many(entry: str, datasets: Sequence[data_module.Dataset], *, splits: Sequence[int],
             seeds: Sequence[int], overrides: dict | None = None,
             num_samples: int = 200, quantiles: bool = False) -> Iterator[dict]:
    """The records of ``entry`` on the splits ``datasets`` (of equal training size) with
    ``seeds``, fitted together by ``entry.fit_many`` (as replicas where the entry batches
    them) on the first ``next``, then each evaluated as it is asked for (so that a caller
    caches each finished one at once); ``status`` as in `run_one`, one failure
    failing every split."""
    records = [_base_record(entry, d, k, s, overrides, num_samples, quantiles)
               for d, k, s in zip(datasets, splits, seeds)]
    started = time.perf_counter()
    try:
        fits = zoo.get(entry).fit_many([d.x_train for d in datasets],
                                       [d.y_train for d in datasets], seeds=list(seeds),
                                       task=datasets[0].task, progress=False,
                                       **(overrides or {}))
    except Exception as error:  # a benchmark reports a broken entry and goes on
        yield from (_failed(record, error) for record in records)
        return
    share = (time.perf_counter() - started) / len(datasets)
    for record, fitted, dataset in zip(records, fits, datasets):
        yield _evaluated(record, fitted, dataset, num_samples, share)


def _evaluated(record: dict, fitted: zoo.Fitted, dataset: data_module.Dataset,
               num_samples: int, fit_seconds: float) -> dict:
    """``record`` with the test metrics and predictive summaries of ``fitted``, and as
    ``seconds`` ``fit_seconds`` plus the time they took."""
    started = time.perf_counter()
    pyro.set_rng_seed(record["seed"])
    record["metrics"] = fitted.evaluate(dataset.x_test, dataset.y_test, num_samples)
    record["diagnostics"] = fitted.diagnostics_at(dataset.x_test)
    record["losses"] = _thin(fitted.result.losses) if fitted.result is not None else []
    pred = fitted.predict(dataset.x_test, num_samples)
    if isinstance(pred, GaussianMixturePredictive):
        record["moments"] = {"mean": _tolist(pred.mean), "std": _tolist(pred.stddev)}
        if record["settings"].get("quantiles"):
            record["quantiles"] = [_tolist(pred.quantile(level)) for level in w1_levels()]
        if dataset.in_dim == 1:
            grid = _grid(dataset)
            band = fitted.predict(grid, num_samples)
            lo, hi = band.interval(BAND_MASS)
            record["band"] = {"x": _tolist(grid[:, 0]), "mean": _tolist(band.mean),
                              "lo": _tolist(lo), "hi": _tolist(hi)}
    else:
        bins = reliability_bins(pred.mean, dataset.y_test)
        record["class_probs"] = _tolist(pred.mean)
        record["reliability"] = {k: _tolist(v) for k, v in bins.items()}
        shifted = shifted_inputs(dataset.x_test, dataset.x_train.std(0), seed=record["split"])
        record["metrics"]["auroc_shift"] = auroc(
            pred.entropy, fitted.predict(shifted, num_samples).entropy)
    record["seconds"] = fit_seconds + time.perf_counter() - started
    return {**record, "status": "ok"}


def _canonical(value: object) -> str:
    """``value`` as JSON with sorted keys (a tuple and a list of the same items agree)."""
    return json.dumps(value, sort_keys=True, default=repr)


def cache_path(out: str | Path, entry: str, data: str, split: int, seed: int,
               settings: dict) -> Path:
    """Where the record of this run is cached: ``<out>/runs/<entry>/<data>_split<k>_seed<s>_
    <digest>.json``, the digest over ``settings`` (see `run_settings`)."""
    digest = hashlib.sha1(_canonical(settings).encode()).hexdigest()[:12]
    name = f"{data.replace('/', '_')}_split{split}_seed{seed}_{digest}.json"
    return Path(out) / CACHE / entry / name


def results_jsons(folder: Path) -> list[Path]:
    """The ``*.json`` files under ``folder``, sorted, searched recursively but for the run
    cache (`CACHE`), whose records the results files keep."""
    return [f for f in sorted(folder.rglob("*.json"))
            if f.is_file() and CACHE not in f.relative_to(folder).parts[:-1]]


def _read_cached(path: Path, expected: dict) -> dict | None:
    """The record at ``path``, or ``None`` (with a `CacheWarning`) when it is
    truncated, corrupt, or of another run than ``expected`` (its entry, data, split, seed
    and settings)."""
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or any(k not in record for k in RECORD_FIELDS):
            raise ValueError("fields missing")
        if record["status"] == "ok" and any(k not in record for k in OK_FIELDS):
            raise ValueError("results missing")
        if _canonical({k: record[k] for k in expected}) != _canonical(expected):
            raise ValueError("another run's record")
    except (OSError, ValueError) as error:
        warnings.warn(f"Cannot reuse the cached run {path} ({error}); fitting it again.",
                      CacheWarning, stacklevel=3)
        return None
    return record


def _write_cached(path: Path, record: dict) -> None:
    """Cache ``record`` at ``path``; a cache that cannot be written costs a refit on the
    next run, not this run's result, so it is a `CacheWarning`."""
    try:
        write_text_atomic(path, json.dumps(record, default=repr))
    except OSError as error:
        warnings.warn(f"Cannot cache the run at {path} ({error}); it will be fitted again "
                      "next time.", CacheWarning, stacklevel=3)


def cached_run(entry: str, dataset: data_module.Dataset, *, split: int, seed: int,
               overrides: dict | None, num_samples: int, out: str | Path,
               log: bool = True, quantiles: bool = False) -> dict:
    """The record of ``entry`` on ``dataset``: read from the cache under ``out`` when a
    readable one with the same settings exists, otherwise fitted (`run_one`) and,
    unless it failed, cached."""
    return cached_runs(entry, [dataset], splits=[split], seeds=[seed], overrides=overrides,
                       num_samples=num_samples, out=out, log=log, together=False,
                       quantiles=quantiles)[0]


def _fits(entry: str, datasets: Sequence[data_module.Dataset], splits: Sequence[int],
          seeds: Sequence[int], chosen: Sequence[int], overrides: dict, num_samples: int,
          mode: str, quantiles: bool) -> Iterator[dict]:
    """The records of the runs ``chosen`` (indices into ``datasets``, ``splits`` and
    ``seeds``) in order: fitted together (``mode="together"``, `run_many`), one by
    one (``"alone"``, `run_one`), or not at all (``"none"``: skipped, with the reason
    `NOT_CACHED`)."""
    if mode == "none":
        for i in chosen:
            yield {**_base_record(entry, datasets[i], splits[i], seeds[i], overrides,
                                  num_samples, quantiles),
                   "status": "skipped", "reason": NOT_CACHED}
    elif mode == "together":
        yield from run_many(entry, [datasets[i] for i in chosen],
                            splits=[splits[i] for i in chosen], seeds=[seeds[i] for i in chosen],
                            overrides=overrides, num_samples=num_samples,
                            quantiles=quantiles)
    else:
        for i in chosen:
            yield run_one(entry, datasets[i], split=splits[i], seed=seeds[i],
                          overrides=overrides, num_samples=num_samples, quantiles=quantiles)


def cached_runs(entry: str, datasets: Sequence[data_module.Dataset], *, splits: Sequence[int],
                seeds: Sequence[int], overrides: dict | None, num_samples: int,
                out: str | Path, log: bool = True, together: bool = False,
                fit_missing: bool = True, quantiles: bool = False) -> list[dict]:
    """The records of ``entry`` on the splits ``datasets`` (with ``splits``, ``seeds``):
    each read from the cache under ``out`` when a readable one with the same settings
    exists; the others fitted and, unless they failed, cached, each as soon as it is
    finished. With ``fit_missing=False`` nothing is fitted: a run missing from the cache
    is recorded as skipped, with the reason, and not cached.

    With ``together=False`` each split is fitted alone (`run_one`). With
    ``together=True`` the splits are one group of replicas fitted in one pass
    (`run_many`): a replica draws its minibatch order and its noise jointly with the
    others, so its result depends on the group. The group, the list of ``splits``, is
    therefore a setting (``overrides["replicas"]``) and part of the cache key, and a group
    with any run missing is fitted again whole: the same call reproduces every split, and
    the records returned never mix two groups."""
    if together:
        overrides = {**(overrides or {}), "replicas": list(splits)}
    records: list[dict | None] = []
    paths, settings = [], [run_settings(dataset, overrides, num_samples, quantiles=quantiles)
                           for dataset in datasets]
    for dataset, split, seed, own in zip(datasets, splits, seeds, settings):
        path = cache_path(out, entry, dataset.name, split, seed, own)
        expected = {"entry": entry, "data": dataset.name, "split": split, "seed": seed,
                    "settings": own}
        records.append(_read_cached(path, expected) if path.exists() else None)
        paths.append(path)
    missing = [i for i, record in enumerate(records) if record is None]
    if together and missing and fit_missing:
        missing, records = list(range(len(records))), [None] * len(records)
    fit_options = {k: v for k, v in (overrides or {}).items() if k != "replicas"}
    mode = "none" if not fit_missing else "together" if together else "alone"
    fitted = _fits(entry, datasets, splits, seeds, missing, fit_options, num_samples, mode,
                   quantiles)
    for i in range(len(records)):
        status = "cached"
        if records[i] is None:  # fitted in order, each cached as soon as it is finished
            record = next(fitted)
            record["settings"] = settings[i]  # with ``replicas`` where it joins the key
            records[i] = record
            status = record["status"]
            if status != "failed" and fit_missing:
                _write_cached(paths[i], record)
        if log:
            record = records[i]
            detail = (f"{record['seconds']:.1f} s" if record["status"] == "ok"
                      else record.get("reason", ""))
            print(f"[{status}] {entry} on {datasets[i].name} split {splits[i]}: {detail}",
                  flush=True)
    return records


def cache_record(out: str | Path, record: dict) -> bool:
    """Write ``record`` (of a run that finished or was skipped, with its settings) into the
    cache under ``out``, at the `cache_path` of its keys and settings, unless a file is
    there; return whether it was written."""
    path = cache_path(out, record["entry"], record["data"], record["split"], record["seed"],
                      record["settings"])
    if path.exists():
        return False
    _write_cached(path, record)
    return True


def restore_cache(out: str | Path, name: str, *, task: str) -> int:
    """Write the cache file under ``out`` of every run kept in ``<out>/<name>.json`` that
    finished or was skipped by its entry, where none exists; return how many were written
    (none without that file).

    The runs there are those a comparison keeps (`write_comparison`): keys, status, metrics,
    diagnostics, reason and the settings of the cache key, all on data of ``task``. They lack what
    only the figures and the distances to a reference read: a restored record has no loss curve
    (``losses`` empty), no predictive moments and no band, and its ``seconds`` are its
    ``fit_seconds``. Runs that failed, or that a table listed as not cached, are not restored: they
    are fitted again; nor are the runs of other code than this checkout's (`run_code`),
    whose cache key no run of this code has.
    """
    document = Path(out) / f"{name}.json"
    if not document.exists():
        return 0
    written = 0
    for run in read_json(document).get("runs", []):
        if (run["status"] == "failed" or run.get("reason") == NOT_CACHED
                or run_code(run) != code_version()):
            continue
        record = {**{k: v for k, v in run.items() if v is not None}, "task": task}
        if run["status"] == "ok":
            record.update(losses=[], seconds=run["metrics"]["fit_seconds"])
        written += cache_record(out, record)
    return written
