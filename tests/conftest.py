"""Pyro's testing habits: before each test, seed, clear the param store and turn
validation on (in Pyro and in ``bnn_zoo.fit``); tests that compare with closed
forms ask for float64 themselves. One torch thread: the nets here are too small
to gain from intra-op threads, which only add overhead on a busy machine."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import pyro
import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def pyro_test_setup(monkeypatch):
    monkeypatch.setenv("BNN_ZOO_VALIDATE", "1")  # bnn_zoo.fit validates only when asked
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    pyro.enable_validation(True)
    yield
    pyro.enable_validation(False)


@pytest.fixture
def uci_data():
    """Skip cleanly unless BNN_ZOO_DATA points at the UCI folder."""
    root = os.environ.get("BNN_ZOO_DATA")
    if not root or not os.path.isdir(root):
        pytest.skip("BNN_ZOO_DATA is not set to the UCI data folder")
    return root


@pytest.fixture
def benchmark_script():
    """Load a script of ``benchmarks/`` by file name as a module, without running it:
    ``benchmark_script("uci.py")["main"]`` is its ``main``."""
    scripts = Path(__file__).resolve().parents[1] / "benchmarks"

    def load(name: str) -> dict:
        return runpy.run_path(str(scripts / name), run_name=name.removesuffix(".py"))

    return load
