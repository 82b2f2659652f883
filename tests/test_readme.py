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


def test_readme_tables_agree_with_the_committed_results():
    """Every generated table of the README equals what its committed results file gives."""
    from bnn_zoo.harness.readme_tables import BLOCK, render

    text = README.read_text()
    assert len(BLOCK.findall(text)) >= 2
    assert render(text, README.parent) == text, (
        "a README table differs from its results file: run python -m bnn_zoo.harness.readme_tables")


def test_readme_tables_render_filters_and_refuse_bad_markers(tmp_path):
    from bnn_zoo.harness.readme_tables import render
    from bnn_zoo.harness.tables import Table, write_table_group, write_tables

    rows = [{"data": "a", "entry": "x", "runs": 2, "ll": 1.0, "ll_se": 0.5},
            {"data": "b", "entry": "x", "runs": 2, "ll": -2.0, "ll_se": 0.25}]
    write_tables(tmp_path, "t", rows, keys=("data", "entry"), columns=("ll",))
    text = ("before\n<!-- table: t.json keys=entry columns=ll where=data:b -->\nstale\n"
            "<!-- end table -->\n")
    out = render(text, tmp_path)
    assert "| x | 2 | -2.000 ± 0.250 |" in out and "1.000" not in out and "stale" not in out
    assert out.startswith("before\n") and render(out, tmp_path) == out
    write_table_group(tmp_path, "g", [Table("sweep", "A sweep", [{"width": 4, "var": 2.5}],
                                            keys=("width",), columns=("var",))])
    grouped = render("<!-- table: g.json keys=width columns=var table=sweep -->\n"
                     "<!-- end table -->", tmp_path)
    assert "| 4 | 2.500 |" in grouped
    for marker, message in [("t.json columns=ll", "lacks keys"),
                            ("g.json keys=width columns=var", "asks for table 'summary'"),
                            ("t.json keys=entry columns=ll colour=red", "Bad option"),
                            ("t.json keys=entry columns=ll where=data:c", "selects no row"),
                            ("missing.json keys=entry columns=ll", "does not exist")]:
        with pytest.raises(ValueError, match=message):
            render(f"<!-- table: {marker} -->\n<!-- end table -->", tmp_path)
