"""Child process of ``test_files.py``: each writer of the library, run in a process whose
files may grow to at most 4 KiB, as a full disk would stop them.

The limit is set here, after the imports and a warm-up figure (matplotlib may write its
font cache), and never in the test process: pytest's own output may go to a file larger
than the limit. Python ignores ``SIGXFSZ``, so a write past the limit fails with
``EFBIG``. Prints one JSON object: for each writer, the error it raised, whether its file kept
the earlier version, and the files it left in its folder."""

from __future__ import annotations

import io
import json
import resource
import sys
from pathlib import Path

import torch
from matplotlib.figure import Figure

from bnn_zoo import data, zoo
from bnn_zoo._core import files
from bnn_zoo._harness.figures import save_figure

KEEP = b"an earlier fit\n"


def main(root: Path) -> None:
    d = data.load("sine")
    fitted = zoo.get("map").fit(d.x_train, d.y_train, seed=0, steps=5)
    Figure().savefig(io.BytesIO())
    writers = {  # each writer's file, which already holds an earlier version
        "fit": ("result.pt", lambda p: fitted.save(p)),
        "text": ("result.txt", lambda p: files.write_text_atomic(p, "x" * 10_000)),
        "torch": ("result.pt", lambda p: files.save_atomic({"w": torch.zeros(5_000)}, p)),
        "figure": ("result.png", lambda p: save_figure(Figure(figsize=(20, 20)), p)),
    }
    for name, (file, _) in writers.items():
        (root / name).mkdir()
        (root / name / file).write_bytes(KEEP)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    outcome = {}
    for name, (file, write) in writers.items():
        target = root / name / file
        try:
            write(target)
            error = None
        except Exception as e:  # noqa: BLE001 - the parent asserts on the type and message
            error = f"{type(e).__name__}: {e}"
        outcome[name] = {"error": error, "file": file, "kept": target.read_bytes() == KEEP,
                         "left": sorted(p.name for p in target.parent.iterdir())}
    print(json.dumps(outcome))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
