"""The README's result tables, generated from the committed results.

A table in the README that quotes a benchmark is written between two markers::

    <!-- table: benchmarks/results/laplace/laplace.json keys=data,variant columns=ll,rmse -->
    | data | variant | runs | ll | rmse |
    ...
    <!-- end table -->

The opening marker names a JSON file written by :func:`~bnn_zoo.harness.tables.write_tables`
(its ``"summary"`` rows) or by :func:`~bnn_zoo.harness.tables.write_table_group` (then
``table=KEY`` picks the group's table) and how to show them: ``keys`` and ``columns`` as in
:func:`~bnn_zoo.harness.tables.markdown_table`, optionally ``section=FIELD`` and any number of
``where=FIELD:VALUE`` filters (a row is kept when its field, as text, equals the value).
:func:`render` rewrites every such block from its file; ``python -m
bnn_zoo.harness.readme_tables`` writes the README, ``--check`` exits 1 if a block differs
from its file (the test suite runs the same check), so every number the README quotes can be
traced to a committed file and re-run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from bnn_zoo.core.files import write_text_atomic
from bnn_zoo.harness.tables import markdown_table

__all__ = ["BLOCK", "render", "render_block"]

#: A generated block: its opening marker's specification, then the body up to the end marker.
BLOCK = re.compile(r"<!-- table: (?P<spec>[^>]*?) -->\n(?P<body>.*?)<!-- end table -->",
                   flags=re.S)
_OPTIONS = ("keys", "columns", "section", "table", "where")


def _parse(spec: str) -> tuple[str, dict[str, list[str]]]:
    """The file and the options of a marker ``PATH key=value ...``."""
    path, *words = spec.split()
    options: dict[str, list[str]] = {"where": []}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or name not in _OPTIONS or not value:
            raise ValueError(f"Bad option {word!r} in the README table marker {spec!r}: "
                             f"expected NAME=VALUE with NAME one of {', '.join(_OPTIONS)}.")
        if name == "where":
            options["where"].append(value)
        else:
            options[name] = value.split(",")
    for name in ("keys", "columns"):
        if name not in options:
            raise ValueError(f"The README table marker {spec!r} lacks {name}=...")
    return path, options


def _matches(row: dict, conditions: list[str]) -> bool:
    for condition in conditions:
        field, sep, value = condition.partition(":")
        if not sep:
            raise ValueError(f"Bad filter where={condition!r}: expected where=FIELD:VALUE.")
        if str(row.get(field)) != value:
            return False
    return True


def render_block(spec: str, root: Path) -> str:
    """The Markdown table that the marker ``spec`` asks for, from its file under ``root``."""
    path, options = _parse(spec)
    file = root / path
    if not file.is_file():
        raise ValueError(f"The README table {spec!r} names {path}, which does not exist.")
    tables = json.loads(file.read_text())
    table = options.get("table", ["summary"])[0]
    if table not in tables:
        raise ValueError(f"The README table {spec!r} asks for table {table!r} of {path}, "
                         f"which has {', '.join(map(repr, tables))}.")
    rows = [row for row in tables[table] if _matches(row, options["where"])]
    if not rows:
        raise ValueError(f"The README table {spec!r} selects no row of {path}.")
    section = options.get("section", [None])[0]
    return markdown_table(rows, keys=options["keys"], columns=options["columns"],
                          section=section)


def render(text: str, root: Path) -> str:
    """``text`` with every generated block rewritten from its file under ``root``."""
    return BLOCK.sub(lambda m: f"<!-- table: {m['spec']} -->\n"
                               f"{render_block(m['spec'], root)}<!-- end table -->", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a table differs from its file; write nothing")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    new = render(text, args.readme.resolve().parent)
    if args.check:
        if new != text:
            print(f"{args.readme}: a generated table differs from its file; run "
                  "python -m bnn_zoo.harness.readme_tables", file=sys.stderr)
            return 1
        return 0
    if new != text:
        write_text_atomic(args.readme, new)
    print(f"{len(BLOCK.findall(text))} tables in {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
