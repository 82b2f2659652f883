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
           "commit_column", "cpu_name", "git_state", "note", "provenance", "run_code",
           "run_columns", "versions"]

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
            "cpu": cpu_name()}


def provenance(device: str | torch.device = "cpu") -> dict:
    """Where a run's numbers come from: ``version`` (of ``bnn_zoo``), ``code``
    (`code_version`), ``commit`` and ``dirty`` (`git_state`), the ``torch``,
    ``pyro``, ``numpy`` and ``python`` versions, ``cpu`` (`cpu_name`), ``device``,
    ``threads`` (torch's intra-op thread count) and ``date`` (UTC, ISO 8601, to the
    second)."""
    return {**_fixed(), "device": str(device), "threads": torch.get_num_threads(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


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
    """A run's ``code`` (`run_code`) and ``commit`` (`commit_column`) as table
    columns."""
    return {"code": run_code(run), "commit": commit_column(run.get("provenance"))}


def versions(rows: Iterable[Mapping]) -> dict[str, list[str]]:
    """The distinct ``code`` and ``commit`` values of ``rows`` (sorted), each row holding
    one or, as a summary row does, several joined by ``"; "``; rows without them do not
    count."""
    found: dict[str, set[str]] = {"code": set(), "commit": set()}
    for row in rows:
        for key, values in found.items():
            if row.get(key):
                values.update(str(row[key]).split("; "))
    return {key: sorted(values) for key, values in found.items()}


def _listed(kind: str, values: Sequence[str]) -> str:
    return f"{kind}{'s' if len(values) > 1 else ''} " + ", ".join(f"`{v}`" for v in values)


def note(found: Mapping[str, Sequence[str]]) -> str:
    """The line under a table naming the commits and code versions of its numbers (as
    from `versions`), e.g. ``Runs of commit `1a2b3c4` (code version `0123456789ab`).``;
    ``""`` when there are none."""
    if not found.get("code"):
        return ""
    commits = found.get("commit") or [UNKNOWN]
    return f"Runs of {_listed('commit', commits)} ({_listed('code version', found['code'])})."
