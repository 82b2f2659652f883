"""The README's Python examples run as written.

A block preceded by a line ``<!-- not run by the tests: REASON -->`` is skipped
(it needs a GPU, several processes, or a long run); every other ``python`` block
runs, and those that read the UCI files skip unless ``BNN_ZOO_DATA`` is set.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"(<!-- not run by the tests: [^>]*-->\n)?```python\n(.*?)```",
                    README.read_text(), flags=re.S)
RUNNABLE = [code for marker, code in BLOCKS if not marker]


def test_readme_has_runnable_python_examples():
    assert len(RUNNABLE) >= 2


@pytest.mark.parametrize("index", range(len(RUNNABLE)))
def test_readme_example_runs(index, capsys, tmp_path, monkeypatch):
    code = RUNNABLE[index]
    root = os.environ.get("BNN_ZOO_DATA")
    if "uci/" in code and not root:
        pytest.skip("BNN_ZOO_DATA is not set to the UCI data folder")
    if root:  # it may be relative to the repository, and the example runs elsewhere
        monkeypatch.setenv("BNN_ZOO_DATA", str(Path(root).resolve()))
    monkeypatch.chdir(tmp_path)  # examples that save figures write here
    exec(compile(code, f"README.md example {index}", "exec"), {})
    assert capsys.readouterr().out.strip()
