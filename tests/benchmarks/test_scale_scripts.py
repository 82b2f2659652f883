"""The throughput benchmark and the distributed example run with tiny flags and write
their outputs; the torchrun launch of the example is a slow test."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def script(monkeypatch, folder: str, name: str):
    """Import ``folder/name.py`` as module ``name`` (importable by the processes it spawns)."""
    monkeypatch.syspath_prepend(str(ROOT / folder))
    return importlib.import_module(name)


def test_throughput_benchmark_writes_table_json_and_figure(monkeypatch, tmp_path):
    throughput = script(monkeypatch, "benchmarks", "throughput")
    rows = throughput.main(["--n", "64", "--batch", "16", "--hidden", "4", "--steps", "2",
                            "--warmup", "1", "--repeats", "1", "--processes", "2",
                            "--replicas", "3", "--out", str(tmp_path)])
    assert [r["step"] for r in rows] == ["torch", "bbb x1", "bbb x2", "bbb r3"]
    saved = json.loads((tmp_path / "throughput.json").read_text())["summary"]
    assert all(math.isfinite(r["samples_per_second"]) and r["samples_per_second"] > 0
               for r in saved)
    by_step = {r["step"]: r for r in saved}
    replica = by_step["bbb r3"]
    assert replica["samples_per_second"] == pytest.approx(3 * 16e3 / replica["ms_per_step"])
    assert replica["ratio_to_bbb"] == pytest.approx(
        replica["samples_per_second"] / by_step["bbb x1"]["samples_per_second"])
    assert by_step["torch"]["ratio_to_torch"] == by_step["bbb x1"]["ratio_to_bbb"] == 1
    table = (tmp_path / "throughput.md").read_text()
    assert "| bbb x2 | cpu | 2 | 1 | 16 |" in table
    assert "| bbb r3 | cpu | 1 | 3 | 16 |" in table
    assert (tmp_path / "throughput.csv").read_text().startswith(
        "step,device,processes,replicas,batch")
    assert (tmp_path / "throughput.png").stat().st_size > 0


def test_throughput_benchmark_rejects_bad_flags(monkeypatch, tmp_path, capsys):
    throughput = script(monkeypatch, "benchmarks", "throughput")
    for flag, value in (("--device", "gpu"), ("--processes", "0")):
        with pytest.raises(SystemExit) as stop:
            throughput.main([flag, value, "--out", str(tmp_path)])
        assert stop.value.code == 2
        assert f"argument {flag}:" in capsys.readouterr().err


def check_metrics(path: Path, processes: int) -> None:
    (metrics,) = json.loads(path.read_text())["summary"]
    assert metrics["processes"] == processes
    assert all(math.isfinite(metrics[k]) for k in ("rmse", "ll", "coverage_90"))


def test_distributed_example_runs_as_one_process(monkeypatch, tmp_path):
    example = script(monkeypatch, "benchmarks", "distributed_fit")
    example.main(["--steps", "3", "--out", str(tmp_path)])
    check_metrics(tmp_path / "metrics.json", 1)


@pytest.mark.slow
def test_distributed_example_under_torchrun(tmp_path):
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", str(ROOT / "benchmarks" / "distributed_fit.py"),
                    "--steps", "20", "--out", str(tmp_path)], check=True, cwd=tmp_path,
                   timeout=600)
    check_metrics(tmp_path / "metrics.json", 2)
