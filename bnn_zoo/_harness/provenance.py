"""Provenance: which code, libraries and machine a run's numbers come from.

`code_version` is a short digest of the source that computes results: the ``.py``
files of the packages ``bnn_zoo``, ``bnn_zoo.models`` and ``bnn_zoo.guides``, sorted by
their path inside the package and hashed with their contents (SHA-256), less the modules of
`NOT_RESULTS`, which never change what a run records. It is not the git
commit: a commit that changes only the documentation or the committed results leaves it as
it is, so cached runs stay valid across such commits, and a run with uncommitted changes to
the code has a version of its own. Every run record names it (in its settings, hence in its
cache key: `bnn_zoo._harness.runs.run_settings`) together with the rest of
`provenance`: the package version, the git commit and whether the code differs from
it, the torch, Pyro, numpy and Python versions, the device, torch's thread count and the
date.

`run_columns` gives a record's ``code`` and ``commit`` as the columns of a table
(``"unknown"`` for a record written before runs named their code), `versions` the
distinct ones behind a set of rows, and `note` the line under a table that names them.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from functools import cache
from pathlib import Path

import numpy
import pyro
import torch

import bnn_zoo
import bnn_zoo.guides
import bnn_zoo.models

__all__ = ["CODE_PACKAGES", "NOT_RESULTS", "UNKNOWN", "code_digest", "code_version",
           "commit_column", "cpu_name", "git_state", "machine", "note", "provenance",
           "run_code", "run_columns", "versions"]

#: The packages whose source computes results, hashed by `code_version`.
CODE_PACKAGES = (bnn_zoo, bnn_zoo.models, bnn_zoo.guides)
#: The modules left out of `code_version`: the engine that runs the batches of a sweep
#: (whose records are tested equal to the serial run's) and the reporting that reads records
#: back into tables and lists. A change to them changes no record, so it keeps the cached
#: runs valid.
NOT_RESULTS = ("bnn_zoo/_harness/fidelity.py", "bnn_zoo/_harness/readme_tables.py",
               "bnn_zoo/_harness/stale.py", "bnn_zoo/_harness/sweep.py",
               "bnn_zoo/_harness/tables.py", "bnn_zoo/results.py")
#: What a table shows for the code or commit of a run that does not record it.
UNKNOWN = "unknown"
#: How many hexadecimal digits of the digest `code_version` keeps.
DIGITS = 12
#: What the dirty check of `git_state` looks at: the code and the benchmark scripts,
#: not the committed results or the documentation.
_CODE_PATHS = ("bnn_zoo", "models", "guides", "benchmarks", ":(exclude)benchmarks/results")


def code_digest(roots: Mapping[str, Path], exclude: Iterable[str] = ()) -> str:
    """The digest of every ``.py`` file under the folders ``roots`` (a name for each, which
    prefixes the relative paths) but those whose ``name/relative/path`` is in ``exclude``:
    SHA-256 over the sorted ``name/relative/path`` and the bytes of each file, its first
    `DIGITS` hexadecimal digits. Compiled files and anything that is not ``.py`` do
    not count."""
    excluded = set(exclude)
    files = sorted((f"{name}/{path.relative_to(root).as_posix()}", path)
                   for name, root in roots.items() for path in Path(root).rglob("*.py")
                   if "__pycache__" not in path.parts)
    files = [(relative, path) for relative, path in files if relative not in excluded]
    digest = hashlib.sha256()
    for relative, path in files:
        digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:DIGITS]


@cache
def code_version() -> str:
    """The `code_digest` of the packages of `CODE_PACKAGES` as this process
    imported them, less `NOT_RESULTS` (computed once per process)."""
    return code_digest({package.__name__: Path(package.__path__[0])
                        for package in CODE_PACKAGES}, exclude=NOT_RESULTS)


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


@cache
def git_state() -> tuple[str | None, bool | None]:
    """The short git commit of the checkout that holds ``bnn_zoo``, and whether its code
    (the packages and the benchmark scripts) differs from that commit; ``(None, None)``
    where ``bnn_zoo`` is not in a git checkout (an installed package) or git cannot be run."""
    root = Path(bnn_zoo.__path__[0]).resolve().parent
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root:
        return None, None
    commit = _git(root, "rev-parse", "--short", "HEAD")
    changes = _git(root, "status", "--porcelain", "--", *_CODE_PATHS)
    if commit is None or changes is None:
        return None, None
    return commit, bool(changes)


def cpu_name() -> str:
    """The processor's model name (from ``/proc/cpuinfo`` on Linux), else what
    ``platform`` knows of it."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@cache
def _fixed() -> dict:
    commit, dirty = git_state()
    return {"version": bnn_zoo.__version__, "code": code_version(), "commit": commit,
            "dirty": dirty, "torch": torch.__version__, "pyro": pyro.__version__,
            "numpy": numpy.__version__, "python": platform.python_version(),
            "cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def provenance(device: str | torch.device = "cpu") -> dict:
    """Where a run's numbers come from: ``version`` (of ``bnn_zoo``), ``code``
    (`code_version`), ``commit`` and ``dirty`` (`git_state`), the ``torch``,
    ``pyro``, ``numpy`` and ``python`` versions, ``cpu`` (`cpu_name`) and
    ``cpu_capability`` (the vector instructions torch's CPU kernels use, e.g. ``AVX2``),
    ``device``, ``gpu`` (the CUDA device's name; ``None`` on the CPU), ``threads``
    (torch's intra-op thread count) and ``date`` (UTC, ISO 8601, to the second)."""
    device = torch.device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {**_fixed(), "device": str(device), "gpu": gpu, "threads": torch.get_num_threads(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def machine(origin: Mapping | None) -> str:
    """The machine of a `provenance` as a table column: the GPU's name for a run on a GPU,
    else the CPU's with torch's CPU capability (``AMD EPYC (AVX512)``); `UNKNOWN`
    where it does not record them."""
    origin = origin or {}
    if origin.get("gpu"):
        return str(origin["gpu"])
    if not origin.get("cpu"):
        return UNKNOWN
    capability = origin.get("cpu_capability")
    return f"{origin['cpu']} ({capability})" if capability else str(origin["cpu"])


def run_code(run: Mapping) -> str:
    """The code version of a run record (its settings', else its provenance's), or
    `UNKNOWN`."""
    code = (run.get("settings") or {}).get("code") or (run.get("provenance") or {}).get("code")
    return code or UNKNOWN


def commit_column(origin: Mapping | None) -> str:
    """The commit of a `provenance` as a table column: the short commit, with
    ``-dirty`` where the code differed from it, ``none`` outside a git checkout,
    `UNKNOWN` where there is no provenance."""
    if not origin:
        return UNKNOWN
    if origin.get("commit") is None:
        return "none"
    return origin["commit"] + ("-dirty" if origin.get("dirty") else "")


def run_columns(run: Mapping) -> dict[str, str]:
    """A run's ``code`` (`run_code`), ``commit`` (`commit_column`) and ``machine``
    (`machine`) as table columns."""
    origin = run.get("provenance")
    return {"code": run_code(run), "commit": commit_column(origin), "machine": machine(origin)}


def _in_commit_order(commits: set[str]) -> list[str]:
    """``commits`` (short hashes, perhaps ``-dirty``) oldest first by their commit dates in
    this checkout's history; sorted as text where git does not know them all."""
    hashes = {c: c.removesuffix("-dirty") for c in commits}
    root = Path(bnn_zoo.__path__[0]).resolve().parent
    listed = _git(root, "rev-list", "--no-walk", *sorted(set(hashes.values())))
    if listed is None or len(listed.split()) != len(set(hashes.values())):
        return sorted(commits)
    age = {full: i for i, full in enumerate(reversed(listed.split()))}
    when = {c: next(i for full, i in age.items() if full.startswith(h))
            for c, h in hashes.items()}
    return sorted(commits, key=lambda c: (when[c], c))


def versions(rows: Iterable[Mapping]) -> dict[str, list[str]]:
    """The distinct ``code``, ``commit`` and ``machine`` values of ``rows``, each row
    holding one or, as a summary row does, several joined by ``"; "``; rows without them
    do not count. The commits are oldest first (`_in_commit_order`), the others sorted."""
    found: dict[str, set[str]] = {"code": set(), "commit": set(), "machine": set()}
    for row in rows:
        for key, values in found.items():
            if row.get(key):
                values.update(str(row[key]).split("; "))
    return {"code": sorted(found["code"]), "commit": _in_commit_order(found["commit"]),
            "machine": sorted(found["machine"])}


def _listed(kind: str, values: Sequence[str]) -> str:
    return f"{kind}{'s' if len(values) > 1 else ''} " + ", ".join(f"`{v}`" for v in values)


def _commits(commits: Sequence[str]) -> str:
    if len(commits) <= 2:
        return _listed("commit", commits)
    return f"{len(commits)} commits from `{commits[0]}` to `{commits[-1]}`"


def note(found: Mapping[str, Sequence[str]]) -> str:
    """The line under a table naming the code versions of its numbers, the range of their
    commits (oldest first, as from `versions`) and their machines, e.g. ``Runs of code
    version `0123456789ab` at commit `1a2b3c4`, on AMD EPYC (AVX512).``; ``""`` when
    there are none. A file written before runs named their machine says so."""
    if not found.get("code"):
        return ""
    commits = found.get("commit") or [UNKNOWN]
    machines = [m for m in found.get("machine") or [] if m != UNKNOWN]
    where = " and ".join(machines) if machines else "a machine not recorded"
    return (f"Runs of {_listed('code version', found['code'])} at {_commits(commits)}, "
            f"on {where}.")
