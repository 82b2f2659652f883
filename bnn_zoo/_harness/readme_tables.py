"""The generated tables of the README and the documentation.

A table in ``README.md`` or ``docs/**/*.md`` that quotes a benchmark is written between
two markers::

    <!-- table: benchmarks/results/laplace/laplace.json keys=data,variant columns=ll,rmse -->
    | data | variant | runs | ll | rmse |
    ...
    <!-- end table -->

The opening marker names a JSON file written by `write_tables`
(its ``"summary"`` rows) or by `write_table_group` (then
``table=KEY`` picks the group's table), or several such files joined by commas (their rows
one after the other), and how to show them: ``keys`` and ``columns`` as in
`markdown_table`, optionally ``section=FIELD`` and any number of
``where=FIELD:VALUE`` filters (a row is kept when its field, as text, equals the value, or
one of the values of ``FIELD:A,B,...``). With ``across=FIELD`` the block is a matrix
(`markdown_matrix`): a line per value of the one key, a column per value of
``FIELD`` (a data set), each cell the one column's metric with its rank, the best
(``best=max``, the default, or ``best=min``) in bold.
Where the files record the code versions, commits and machines of their numbers
(``"provenance"``, as `write_tables` writes it), a line under the table names
them (`note`).
`render` rewrites every such block from its file; ``python -m bnn_zoo tables`` writes the
README, ``--check`` exits 1 if a block differs from its file (the test suite runs the same
check), so every number the README quotes can be traced to a committed file and re-run.

The table of the zoo's entries is written between ``<!-- entries -->`` and
``<!-- end entries -->``; `entries_table` renders it from the registry
([`bnn_zoo.zoo`][]), so it lists every registered entry and nothing else.

``python -m bnn_zoo tables`` (`rewrite`) rewrites every block of ``README.md`` and
``docs/**/*.md`` (or of the files it is given); marker paths are relative to ``--root``,
the repository (default: the working directory).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from bnn_zoo._core.files import read_json, write_text_atomic
from bnn_zoo._harness.provenance import note
from bnn_zoo._harness.tables import markdown_matrix, markdown_table

__all__ = ["BLOCK", "ENTRIES", "PROG", "documents", "entries_table", "parse_spec", "render",
           "render_block", "rewrite"]

PROG = "python -m bnn_zoo tables"

#: A generated block: its opening marker's specification, then the body up to the end marker.
BLOCK = re.compile(r"<!-- table: (?P<spec>[^>]*?) -->\n(?P<body>.*?)<!-- end table -->",
                   flags=re.S)
#: The generated table of the zoo's entries.
ENTRIES = re.compile(r"<!-- entries -->\n(?P<body>.*?)<!-- end entries -->", flags=re.S)
_OPTIONS = ("keys", "columns", "section", "table", "where", "across", "best")


def parse_spec(spec: str) -> tuple[str, dict[str, list[str]]]:
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
        if str(row.get(field)) not in value.split(","):
            return False
    return True


def _merged(found: list[dict]) -> dict[str, list[str]]:
    """The provenance of several files as one: each field's values in order, once."""
    fields = dict.fromkeys(k for f in found for k, v in f.items() if isinstance(v, list))
    return {k: list(dict.fromkeys(v for f in found for v in f.get(k, []))) for k in fields}


def _read(spec: str, paths: list[str], table: str, root: Path) -> tuple[list[dict], dict | None]:
    """The rows of table ``table`` of every file of ``paths`` under ``root``, one after the
    other, and their provenance (`_merged`; none unless every file records it, as
    `write_tables` and `write_table_group` do)."""
    rows, found = [], []
    for path in paths:
        file = root / path
        if not file.is_file():
            raise ValueError(f"The README table {spec!r} names {path}, which does not exist.")
        tables = read_json(file)
        if table not in tables:
            raise ValueError(f"The README table {spec!r} asks for table {table!r} of {path}, "
                             f"which has {', '.join(map(repr, tables))}.")
        rows += tables[table]
        found.append(tables.get("provenance"))
    return rows, _merged(found) if all(isinstance(f, dict) for f in found) else None


def render_block(spec: str, root: Path) -> str:
    """The Markdown table that the marker ``spec`` asks for, from its files under ``root``."""
    path, options = parse_spec(spec)
    table = options.get("table", ["summary"])[0]
    rows, found = _read(spec, path.split(","), table, root)
    rows = [row for row in rows if _matches(row, options["where"])]
    if not rows:
        raise ValueError(f"The README table {spec!r} selects no row of {path}.")
    if "across" in options:
        if len(options["keys"]) != 1 or len(options["columns"]) != 1:
            raise ValueError(f"The README matrix {spec!r} takes one key and one column.")
        text = markdown_matrix(rows, key=options["keys"][0], across=options["across"][0],
                               metric=options["columns"][0],
                               best=options.get("best", ["max"])[0])
    else:
        text = markdown_table(rows, keys=options["keys"], columns=options["columns"],
                              section=options.get("section", [None])[0])
    return f"{text}\n{note(found)}\n" if found and note(found) else text


def _method_name(method: object) -> str:
    """``SVI``, ``Laplace``, ...; an ensemble with its member, ``Ensemble(Laplace x 5)``."""
    from bnn_zoo.methods._ensemble import Ensemble  # imports the methods: only when asked for

    name = type(method).__name__
    if isinstance(method, Ensemble):
        return f"{name}({_method_name(method.member)} x {method.members})"
    return name


def entries_table() -> str:
    """The Markdown table of every registered entry: its name, tasks, inference method,
    whether it takes a user's network (``net=``) and batches fits as replicas, the paper it
    implements and its description."""
    from bnn_zoo import zoo  # the registry imports every entry: only when asked for

    lines = ["| entry | tasks | method | `net=` | replicas | paper | description |",
             "|---|---|---|---|---|---|---|"]
    for name in zoo.names():
        entry = zoo.get(name)
        cells = [f"`{name}`", ", ".join(entry.tasks), f"`{_method_name(entry.method)}`",
                 "yes" if entry.accepts_net else "no",
                 "yes" if zoo.batches_replicas(entry) else "no",
                 entry.source or "-", entry.description.replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render(text: str, root: Path) -> str:
    """``text`` with every generated block rewritten: each table from its file under
    ``root``, the entries' table from the registry."""
    text = BLOCK.sub(lambda m: f"<!-- table: {m['spec']} -->\n"
                               f"{render_block(m['spec'], root)}<!-- end table -->", text)
    if ENTRIES.search(text):
        table = entries_table()
        text = ENTRIES.sub(lambda m: f"<!-- entries -->\n{table}<!-- end entries -->", text)
    return text


def documents(root: Path) -> list[Path]:
    """The Markdown files whose blocks are generated: ``README.md`` and ``docs/**/*.md``
    under ``root``."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def rewrite(files: list[Path], root: Path, check: bool) -> int:
    """Rewrite the generated tables of ``files`` (default: `documents`) from their
    sources under ``root``; with ``check``, write nothing and return 1 if one differs."""
    stale = []
    for file in files or documents(root):
        text = file.read_text()
        new = render(text, root)
        if new == text:
            continue
        if check:
            stale.append(file)
        else:
            write_text_atomic(file, new)
            print(f"rewrote the generated tables of {file}")
    for file in stale:
        print(f"{file}: a generated table differs from its source; run {PROG}", file=sys.stderr)
    return 1 if stale else 0

