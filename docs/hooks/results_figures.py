"""MkDocs hooks of the documentation site.

* The committed figures of ``benchmarks/results`` are served under ``results/figures/``
  without a copy in ``docs/``: a page links ``results/figures/<path under
  benchmarks/results>``, e.g. ``![UCI](figures/uci/uci_ll.png)`` from ``docs/results/uci.md``.
* ``bnn_zoo.models`` and ``bnn_zoo.guides`` live in the top-level folders ``models/`` and
  ``guides/`` (``[tool.setuptools.package-dir]``), which griffe's static loader cannot see
  through; ``build/api_source/bnn_zoo`` is a tree of links (and copies of the package's own
  files) that puts them where it looks, made before mkdocstrings configures itself, and
  ``mkdocs.yml`` points the API reference at it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
API_SOURCE = ROOT / "build" / "api_source" / "bnn_zoo"


@event_priority(100)  # before mkdocstrings reads its paths: they must exist by then
def on_config(config):
    if API_SOURCE.exists():
        shutil.rmtree(API_SOURCE)
    API_SOURCE.mkdir(parents=True)
    for child in (ROOT / "bnn_zoo").iterdir():
        if child.is_dir() and child.name != "__pycache__":
            (API_SOURCE / child.name).symlink_to(child)
        elif child.suffix == ".py":  # a copy: griffe walks the folder of the resolved file
            shutil.copyfile(child, API_SOURCE / child.name)
    for package in ("models", "guides"):
        (API_SOURCE / package).symlink_to(ROOT / package)
    return config


def on_files(files: Files, config) -> Files:
    for path in sorted(RESULTS.rglob("*.png")):
        uri = f"results/figures/{path.relative_to(RESULTS).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
