"""The source's shape, kept by a test: no module over 450 lines, no function over 60
code lines (docstrings, comments and blank lines aside), and no issue number, design
file or run log named in the source, the README or the documentation: the code explains
itself, measurements live in ``benchmarks/results/`` and history in the changelog."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = sorted(p for folder in ("bnn_zoo", "models", "guides", "benchmarks")
                for p in (ROOT / folder).rglob("*.py"))
TEXT = [*SOURCE, ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
#: Words that point a reader at the project's history instead of at the code.
HISTORY = re.compile(r"\b[Ii]ssue \d+|\bDESIGN\.md\b|\b\d{3}_[0-9a-f]{16}\.txt\b")


def code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """Lines of ``node`` that hold code: its docstring, comments and blank lines aside."""
    skip: set[int] = set()
    first = node.body[0]
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        skip = set(range(first.lineno, first.end_lineno + 1))
    return sum(1 for i in range(node.lineno, node.end_lineno + 1)
               if i not in skip and lines[i - 1].strip()
               and not lines[i - 1].strip().startswith("#"))


def long_functions(source: str) -> list[tuple[str, int]]:
    lines = source.splitlines()
    return [(node.name, n) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (n := code_lines(node, lines)) > MAX_FUNCTION_LINES]


def test_code_lines_counts_code_only():
    source = 'def f():\n    """Doc\n    string."""\n    # a comment\n\n    x = 1\n    return x\n'
    assert code_lines(ast.parse(source).body[0], source.splitlines()) == 3
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def g():\n{body}") == [("g", MAX_FUNCTION_LINES + 1)]
    assert long_functions(f"def g():\n{body[body.index(chr(10)) + 1:]}") == []


@pytest.mark.parametrize("path", SOURCE, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_functions_are_short(path):
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_MODULE_LINES, f"{path} is over {MAX_MODULE_LINES} lines"
    assert long_functions(source) == [], f"functions over {MAX_FUNCTION_LINES} code lines"


def test_source_and_docs_name_no_history():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in TEXT for i, line in enumerate(p.read_text().splitlines(), 1)
             if HISTORY.search(line)]
    assert found == []
