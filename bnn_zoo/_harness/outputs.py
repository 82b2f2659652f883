"""Checks, before any work starts, that the results of a run can be written: a run that
fails only when it writes its tables has lost its work."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from bnn_zoo._core.files import write_target

__all__ = ["check_writable"]


def _nearest_existing(path: Path) -> Path:
    while not os.path.lexists(path):
        path = path.parent
    return path


def _check_folder(name: str, out: Path, folder: Path) -> None:
    existing = _nearest_existing(folder)
    if not existing.is_dir():
        raise ValueError(f"Cannot write results under {name} {out}: {existing} is a file, "
                         "not a folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"Cannot write results under {name} {out}: the folder {existing} "
                         "is not writable.")


def check_writable(name: str, out: str | os.PathLike, *, files: Iterable[str] = (),
                   folders: Iterable[str] = ()) -> Path:
    """Check that results can be written under the folder ``out`` (the flag or argument
    ``name`` in the messages) without creating anything: ``out`` and each of ``folders``
    (relative to ``out``) is a folder or can be created inside a folder this process may
    write, and each of ``files`` (relative to ``out``) is a regular file or a new path
    (`write_target`: not a folder, device, FIFO or socket).
    Raises a ``ValueError`` naming the flag and the path; returns ``Path(out)``."""
    out = Path(out)
    for folder in (out, *(out / f for f in folders)):
        _check_folder(name, out, folder)
    for file in files:
        path = out / file
        _check_folder(name, out, path.parent)
        try:
            write_target(path)
        except OSError as error:
            raise ValueError(f"Cannot write results under {name} {out}: {error.strerror}."
                             ) from None
    return out
