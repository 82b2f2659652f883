"""The README and the documentation site: their code runs, their numbers come from files.

* Every ```` ```python ```` block of ``README.md`` and ``docs/**/*.md`` runs, each in a
  fresh namespace in a temporary folder; a block preceded by a line
  ``<!-- not run by the tests: REASON -->`` is skipped (it needs a GPU, several processes,
  or a long run), and one that reads the UCI files skips unless ``BNN_ZOO_DATA`` is set.
* A block that prints a number is followed by a ```` ```text ```` block of what it prints,
  and the output must match it: the same text once numbers are blanked out, and every
  number within ``t * max(1, |expected|)``, with ``t = 0.01`` unless a line
  ``<!-- output within T -->`` between the two blocks states another tolerance (a short
  stochastic fit prints other digits on a CPU of another kind: MKL's kernels round by the
  instruction set, and the optimiser carries the difference). A block that prints a number
  with no such output block fails.
* Every generated table (``<!-- table: ... -->`` and ``<!-- entries -->``) equals what
  its results file, or the zoo's registry, gives, and the text before each table names
  its results file.
* The README has at most 300 lines, and every file it links exists.
* ``mkdocs build --strict`` builds the site (skipped where mkdocs is not installed;
  ``.ci/run`` installs the ``docs`` extra and builds it too), and its API reference reads
  for a user: at most 150 classes and functions, each under a public path, and every
  public name of every public module among them.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import pkgutil
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from bnn_zoo._harness.readme_tables import (
    BLOCK,
    ENTRIES,
    documents,
    entries_table,
    parse_spec,
    render,
)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = documents(ROOT)
SKIP = "<!-- not run by the tests:"
CODE = re.compile(r"(?P<marker><!-- not run by the tests: [^>]*-->\n)?```python\n(?P<code>.*?)```\n"
                  r"(?P<output>\n*(?:<!-- output within (?P<within>[0-9.e-]+) -->\n)?"
                  r"```text\n(?P<text>.*?)```)?", flags=re.S)
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
DEFAULT_WITHIN = 0.01


def _blocks() -> list[tuple[str, re.Match]]:
    return [(f"{path.relative_to(ROOT)}:{path.read_text()[:m.start()].count(chr(10)) + 1}", m)
            for path in DOCUMENTS for m in CODE.finditer(path.read_text())]


BLOCKS = _blocks()
RUNNABLE = [(where, m) for where, m in BLOCKS if not m["marker"]]


def _skeleton(text: str) -> str:
    return " ".join(NUMBER.sub("#", text).split())


def check_output(printed: str, expected: str, within: float) -> None:
    """``printed`` matches ``expected``: the same text with numbers blanked out, and every
    number within ``within * max(1, |expected number|)``."""
    assert _skeleton(printed) == _skeleton(expected), (
        f"printed\n{printed}\nexpected\n{expected}")
    for got, want in zip(NUMBER.findall(printed), NUMBER.findall(expected)):
        assert math.isclose(float(got), float(want), rel_tol=0, abs_tol=within * max(
            1.0, abs(float(want)))), (f"printed {got} where {want} is documented "
                                      f"(tolerance {within}):\n{printed}")


def test_the_output_check_can_fail():
    check_output("ll 0.762, rmse 0.113\n", "ll 0.765, rmse 0.113", 0.01)
    with pytest.raises(AssertionError, match="printed 0.9"):
        check_output("ll 0.9, rmse 0.113", "ll 0.765, rmse 0.113", 0.01)
    with pytest.raises(AssertionError, match="expected"):
        check_output("accuracy 0.9", "ll 0.9", 0.01)


def test_the_documents_have_runnable_examples():
    assert len(RUNNABLE) >= 20
    assert all(SKIP not in m["code"] for _, m in BLOCKS)


@pytest.mark.parametrize("where", [where for where, _ in RUNNABLE])
def test_example_runs_and_prints_what_is_documented(where, capsys, tmp_path, monkeypatch):
    match = dict(RUNNABLE)[where]
    code = match["code"]
    root = os.environ.get("BNN_ZOO_DATA")
    if "uci/" in code and not root:
        pytest.skip("BNN_ZOO_DATA is not set to the UCI data folder")
    if root:  # it may be relative to the repository, and the example runs elsewhere
        monkeypatch.setenv("BNN_ZOO_DATA", str(Path(root).resolve()))
    monkeypatch.chdir(tmp_path)  # examples that save files write here
    exec(compile(code, where, "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out
    if match["text"] is None:
        assert not NUMBER.search(printed), (
            f"{where} prints numbers but no ```text block after it says what:\n{printed}")
    else:
        check_output(printed, match["text"], float(match["within"] or DEFAULT_WITHIN))


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_tables_equal_their_sources(path):
    text = path.read_text()
    assert render(text, ROOT) == text, (
        f"a table of {path} differs from its source: run python -m bnn_zoo tables")


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_table_names_its_results_file(path):
    """The reader sees where a table comes from: the text before its marker (after the
    previous table) names the file or its folder."""
    text = path.read_text()
    start = 0
    for match in BLOCK.finditer(text):
        files, _ = parse_spec(match["spec"])
        before = re.sub(r"<!--.*?-->", "", text[start:match.start()], flags=re.S)
        for file in files.split(","):
            assert file in before or str(Path(file).parent) in before, (
                f"{path.relative_to(ROOT)}: the table of {file} does not say where it comes "
                "from")
        start = match.end()


def test_the_entries_table_is_the_registry():
    from bnn_zoo import zoo

    match = ENTRIES.search(README.read_text())
    assert match and match["body"] == entries_table()
    listed = re.findall(r"^\| `([^`]+)` \|", match["body"], flags=re.M)
    assert listed == zoo.names()


def test_readme_is_short_and_its_links_exist():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links no file"
    for link in local:
        assert (ROOT / link).exists(), f"the README links {link}, which does not exist"


def test_results_figures_the_docs_show_exist():
    for path in DOCUMENTS[1:]:
        for figure in re.findall(r"\(((?:\.\./)*(?:results/)?figures/[^)]+\.png)\)",
                                 path.read_text()):
            relative = figure.split("figures/", 1)[1]
            assert (ROOT / "benchmarks" / "results" / relative).is_file(), (
                f"{path.relative_to(ROOT)} shows {figure}, not under benchmarks/results")


def test_tables_render_filters_and_refuse_bad_markers(tmp_path):
    from bnn_zoo._harness.tables import Table, write_table_group, write_tables

    rows = [{"data": "a", "entry": "x", "runs": 2, "ll": 1.0, "ll_se": 0.5},
            {"data": "b", "entry": "x", "runs": 2, "ll": -2.0, "ll_se": 0.25}]
    write_tables(tmp_path, "t", rows, keys=("data", "entry"), columns=("ll",))
    text = ("before\n<!-- table: t.json keys=entry columns=ll where=data:b -->\nstale\n"
            "<!-- end table -->\n")
    out = render(text, tmp_path)
    assert "| x | 2 | -2.000 ± 0.250 |" in out and "1.000" not in out and "stale" not in out
    assert out.startswith("before\n") and render(out, tmp_path) == out
    both = render("<!-- table: t.json keys=data columns=ll where=data:a,b -->\n"
                  "<!-- end table -->", tmp_path)
    assert "| a | 2 | 1.000 ± 0.500 |" in both and "| b | 2 | -2.000 ± 0.250 |" in both
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


def test_a_matrix_ranks_each_data_set_and_sorts_by_mean_rank(tmp_path):
    """``across=`` turns the rows into entries by data sets: each cell the metric with its
    rank in its column (the best in bold, values shown alike sharing the better rank), the
    lines by their
    mean rank; the rows of several files (one marker, their paths joined by commas) are one
    matrix, under one line naming both files' runs."""
    from bnn_zoo._harness.tables import write_tables

    first = [{"data": "uci/a", "entry": "x", "runs": 2, "ll": -1.0},
             {"data": "uci/a", "entry": "y", "runs": 2, "ll": -2.0},
             {"data": "uci/a", "entry": "z", "runs": 2, "ll": -1.0001}]  # shown as x's
    second = [{"data": "b", "entry": "x", "runs": 2, "ll": -3.0},
              {"data": "b", "entry": "y", "runs": 2, "ll": -2.5},
              {"data": "b", "entry": "w", "runs": 2, "ll": float("nan")}]
    write_tables(tmp_path / "one", "t", first, keys=("entry",), columns=("ll",),
                 provenance={"code": ["c0de"], "commit": ["1a2b3c4"], "machine": ["M"]})
    write_tables(tmp_path / "two", "t", second, keys=("entry",), columns=("ll",),
                 provenance={"code": ["c0de"], "commit": ["5d6e7f8"], "machine": ["M"]})
    out = render("<!-- table: one/t.json,two/t.json keys=entry columns=ll across=data -->\n"
                 "<!-- end table -->", tmp_path)
    assert out.splitlines()[1:8] == [
        "| entry | mean rank | a | b |", "|---|---|---|---|",
        "| z | 1.0 | **-1.000** (1) | - |",
        "| x | 1.5 | **-1.000** (1) | -3.000 (2) |",
        "| y | 2.0 | -2.000 (3) | **-2.500** (1) |",
        "| w | - | - | - |", ""]
    assert ("Runs of code version `c0de` at commits `1a2b3c4`, `5d6e7f8`, on M."
            in out.splitlines())
    lowest = render("<!-- table: one/t.json keys=entry columns=ll across=data best=min -->\n"
                    "<!-- end table -->", tmp_path)
    assert "| y | 1.0 | **-2.000** (1) |" in lowest and "| x | 2.0 | -1.000 (2) |" in lowest
    for marker, message in [("one/t.json keys=entry columns=ll,runs across=data",
                             "one key and one column"),
                            ("one/t.json keys=entry columns=ll across=data best=top",
                             "best='top'"),
                            ("one/t.json,one/t.json keys=entry columns=ll across=data",
                             "Two rows for entry='x'")]:
        with pytest.raises(ValueError, match=message):
            render(f"<!-- table: {marker} -->\n<!-- end table -->", tmp_path)


def test_the_command_rewrites_every_document_and_checks_them(tmp_path):
    from bnn_zoo._harness.cli import main
    from bnn_zoo._harness.tables import write_tables

    write_tables(tmp_path, "t", [{"entry": "x", "runs": 1, "ll": 1.5}], keys=("entry",),
                 columns=("ll",))
    stale = "<!-- table: t.json keys=entry columns=ll -->\nold\n<!-- end table -->\n"
    (tmp_path / "README.md").write_text(stale)
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / "sub" / "page.md").write_text("# Page\n\n" + stale)
    assert main(["tables", "--root", str(tmp_path), "--check"]) == 1
    assert main(["tables", "--root", str(tmp_path)]) == 0
    assert "| x | 1 | 1.500 |" in (tmp_path / "docs" / "sub" / "page.md").read_text()
    assert main(["tables", "--root", str(tmp_path), "--check"]) == 0


@pytest.mark.skipif((importlib.util.find_spec("mkdocs") is None
                     or importlib.util.find_spec("mkdocstrings") is None)
                    and not os.environ.get("CI"),  # CI installs the docs extra: never skip
                    reason="the docs extra (mkdocs, mkdocstrings) is not installed")
def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "results" / "figures" / "uci" / "uci_ll.png").is_file()
    # Docstrings cross-reference in Markdown: a reST role would be printed as it is.
    roles = re.compile(r":(class|meth|func|mod|data|attr|exc|obj):(`|<code>)")
    raw = [str(page.relative_to(tmp_path)) for page in (tmp_path / "site").rglob("*.html")
           if roles.search(page.read_text())]
    assert not raw, f"raw reST roles in {raw}"
    check_reference(tmp_path / "site" / "objects.inv")

#: The modules a user imports; every other module is private (an underscored name).
PUBLIC_MODULES = ("bnn_zoo", "bnn_zoo.data", "bnn_zoo.distributed", "bnn_zoo.elbo",
                  "bnn_zoo.evaluation", "bnn_zoo.guides", "bnn_zoo.handlers", "bnn_zoo.methods",
                  "bnn_zoo.methods.laplace", "bnn_zoo.models", "bnn_zoo.results", "bnn_zoo.zoo")
MAX_DOCUMENTED = 150


def inventory(path: Path) -> list[tuple[str, str, str]]:
    """``(name, role, location)`` of each object in a Sphinx inventory (``objects.inv``):
    four lines of header, then zlib-compressed lines ``name role priority location ...``."""
    data = path.read_bytes()
    start = 0
    for _ in range(4):
        start = data.index(b"\n", start) + 1
    rows = [line.split(" ", 4) for line in zlib.decompress(data[start:]).decode().splitlines()]
    return [(name, role, location.replace("$", name)) for name, role, _, location, *_ in rows]


def is_private(path: str) -> bool:
    return any(part.startswith("_") for part in path.split("."))


def public_names(module_name: str) -> set[str]:
    """The classes and functions a public module offers: its ``__all__``."""
    module = importlib.import_module(module_name)
    return {f"{module_name}.{name}" for name in module.__all__
            if inspect.isclass(getattr(module, name)) or inspect.isfunction(getattr(module, name))}


def unlisted_public_modules() -> list[str]:
    """Modules of the public packages whose names are public but which are not in
    `PUBLIC_MODULES`, with the classes or functions they define."""
    found = []
    for package in PUBLIC_MODULES:
        module = importlib.import_module(package)
        for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
            name = f"{package}.{info.name}"
            if info.name.startswith("_") or name in PUBLIC_MODULES:
                continue
            sub = importlib.import_module(name)
            defined = [key for key, value in vars(sub).items() if not key.startswith("_")
                       and (inspect.isclass(value) or inspect.isfunction(value))
                       and value.__module__ == name]
            if defined:
                found.append(f"{name}: {defined}")
    return found


def check_reference(objects_inv: Path) -> None:
    entries = inventory(objects_inv)
    documented = {location for _, role, location in entries
                  if role in ("py:class", "py:function")}
    assert len(documented) <= MAX_DOCUMENTED, f"{len(documented)} classes and functions"
    private = sorted(location for location in documented if is_private(location.split("#")[1]))
    assert not private, f"documented under private paths: {private}"
    names = {name for name, _, _ in entries}
    missing = sorted(set().union(*map(public_names, PUBLIC_MODULES)) - names)
    assert not missing, f"public but not in the API reference: {missing}"


def test_every_public_module_is_listed():
    """A module of a public package that defines public classes or functions is either
    one of `PUBLIC_MODULES` (and so in the reference) or private."""
    assert not unlisted_public_modules()


@pytest.mark.parametrize("names, match", [
    ([f"bnn_zoo._core.f{i}" for i in range(3)], "private paths"),
    ([f"bnn_zoo.f{i}" for i in range(MAX_DOCUMENTED + 1)], "151 classes and functions"),
    (["bnn_zoo.fit"], "public but not in the API reference"),
])
def test_the_reference_check_can_fail(tmp_path, names, match):
    fake = tmp_path / "objects.inv"
    rows = "".join(f"{name} py:function 1 api/#$ -\n" for name in names)
    fake.write_bytes(b"# header\n# p\n# v\n# z\n" + zlib.compress(rows.encode()))
    with pytest.raises(AssertionError, match=match):
        check_reference(fake)
