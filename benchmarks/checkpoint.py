"""Carry an unfinished sweep to another machine: its run cache packed into files that git
can hold, one per data set, and unpacked back into a cache on the other side.

A sweep (``uci.py``, ``classification.py``, ``compare``) caches every finished run under
``<out>/runs/`` (:mod:`bnn_zoo._harness.runs`). That folder is not committed: with the
predictive's moments at every test point, the runs of the UCI protocol weigh hundreds of
megabytes. The committed ``<name>_summary.json`` restores the runs of a *finished* sweep; a
sweep longer than one machine's lease (the whole UCI protocol is about 20 fit-hours) needs
its finished runs carried over before it ends.

``--out OUT`` writes ``OUT/checkpoint/<data set>.jsonl`` (``uci_concrete.jsonl`` for
``uci/concrete``): one line per cached run of today's code
(:func:`bnn_zoo._harness.provenance.code_version`) on that data set that finished or was
skipped, sorted by entry, split and seed, and removes the files of data sets without such a
run. A sweep runs its data sets one after the other, so the file of a finished data set is
written once and stays the same while the next ones fill; each file stays far below what a
git host accepts. A run is packed less what the tables do not read:

* the thinned loss curve (``losses``, kept empty, as a restored run has it);
* on a data set where the reference entry (``--reference``, default ``hmc``) was skipped,
  the predictive at every test point (``moments``, ``quantiles``, ``class_probs``): only the
  distances to the reference read them, and there is no reference to measure against. On the
  data sets
  where it runs, or has not yet run, they are kept, so the distances can be computed once
  the reference finishes. A sweep measured against no reference (``--reference none``, as
  ``classification.py`` runs) drops them everywhere.

``--out OUT --unpack`` writes every run of today's code in those files back into
``OUT/runs/`` where its cache file is missing (:func:`bnn_zoo._harness.runs.cache_record`); the
sweep's next command then fits only what is missing. ``reproduce.py`` unpacks a sweep folder's
checkpoint before it runs the sweep. Once the sweep has finished and its tables are written,
the checkpoint folder has served and is deleted.

    python benchmarks/checkpoint.py --out benchmarks/results/uci            # before the lease ends
    python benchmarks/checkpoint.py --out benchmarks/results/uci --unpack   # on the next machine
    python benchmarks/checkpoint.py --out benchmarks/results/classification --reference none
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from bnn_zoo._core.files import parse_json, read_json, write_text_atomic
from bnn_zoo._harness import flags
from bnn_zoo._harness.cli import run_command
from bnn_zoo._harness.provenance import code_version, run_code
from bnn_zoo._harness.runs import cache_record
from bnn_zoo._harness.summary import REFERENCE

#: The folder a sweep's cache is packed into, under its ``--out``: one file per data set.
CHECKPOINT = "checkpoint"
#: The statuses of the runs a cache keeps (a failed run is fitted again, never cached).
KEPT = ("ok", "skipped")
#: The predictive at every test point: read only by the distances to a reference.
PER_POINT = ("moments", "quantiles", "class_probs")


def _key(record: dict) -> tuple:
    return record["entry"], record["data"], record["split"], record["seed"]


def _record(path: Path, number: int, line: str) -> dict:
    """The run record on line ``number`` of the checkpoint ``path``."""
    return parse_json(line, what="checkpoint", source=f"{str(path)!r} (run record {number})")


def cached_records(out: Path) -> list[dict]:
    """Every run cached under ``out/runs`` of today's code that finished or was skipped,
    sorted by entry, data set, split and seed."""
    code = code_version()
    records = (read_json(path, what="cached run")
               for path in sorted(out.glob("runs/*/*.json")))
    return sorted((r for r in records if r["status"] in KEPT and run_code(r) == code),
                  key=_key)


def packed(records: Sequence[dict], reference: str | None) -> list[dict]:
    """``records`` less their loss curves and, on the data sets where ``reference`` was
    skipped (on every data set when ``reference`` is None), their predictive at every test
    point."""
    unmeasured = {r["data"] for r in records
                  if reference is None or (r["entry"] == reference
                                           and r["status"] == "skipped")}
    out = []
    for record in records:
        dropped = PER_POINT if record["data"] in unmeasured else ()
        slim = {k: v for k, v in record.items() if k not in dropped}
        if "losses" in slim:
            slim["losses"] = []
        out.append(slim)
    return out


def data_file(data: str) -> str:
    """The name of the checkpoint file of the data set ``data``."""
    return data.replace("/", "_") + ".jsonl"


def pack(out: Path, reference: str | None = REFERENCE) -> int:
    """Write ``out/checkpoint/<data set>.jsonl`` from the cache under ``out``, one file per
    data set, and remove the files of other data sets; return how many runs."""
    records = packed(cached_records(out), reference)
    by_file: dict[str, list[dict]] = {}
    for record in records:
        by_file.setdefault(data_file(record["data"]), []).append(record)
    folder = out / CHECKPOINT
    folder.mkdir(exist_ok=True)
    for name, group in by_file.items():
        write_text_atomic(folder / name,
                          "".join(json.dumps(r, default=repr) + "\n" for r in group))
    for path in folder.glob("*.jsonl"):
        if path.name not in by_file:
            path.unlink()
    return len(records)


def unpack(out: Path) -> int:
    """Write the cache file of every run of today's code in ``out/checkpoint/*.jsonl`` where
    none exists; return how many were written (none without such files)."""
    code = code_version()
    written = 0
    for path in sorted((out / CHECKPOINT).glob("*.jsonl")):
        records = [_record(path, number, line)
                   for number, line in enumerate(path.read_text().splitlines(), 1) if line]
        written += sum(cache_record(out, r) for r in records if run_code(r) == code)
    return written


def _reference(text: str) -> str | None:
    return None if text.lower() == "none" else flags.entry_name(text)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the sweep's output folder (required)")
    parser.add_argument("--unpack", action="store_true",
                        help="write the packed runs back into the cache (default: pack)")
    parser.add_argument("--reference", type=_reference, default=REFERENCE,
                        help="the entry the others are measured against, or none (when "
                             "packing)")
    args = parser.parse_args(argv)
    if args.out is None or not args.out.is_dir():
        parser.error(f"--out: expected a sweep's output folder, got {args.out}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Pack (or with ``--unpack``, unpack) and print how many runs; the exit code, 0."""
    args = parse_args(argv)
    if args.unpack:
        print(f"Unpacked {unpack(args.out)} runs into {args.out / 'runs'}")
    else:
        print(f"Packed {pack(args.out, args.reference)} runs into {args.out / CHECKPOINT}/")
    return 0


if __name__ == "__main__":
    sys.exit(run_command("benchmarks/checkpoint.py", main))
