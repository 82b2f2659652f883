"""Files the core writes and reads: atomic ``torch.save`` and a safe ``torch.load``.

A write goes to a unique temporary file beside the destination (``tempfile.mkstemp``),
which :func:`os.replace` renames onto it, so a reader, a concurrent writer or a rerun after
a crash sees the old file or the whole new one, never a half-written one; on an error the
temporary file is removed. A read uses ``torch.load(weights_only=True)``, which refuses to
run the code a pickled object would, and turns every failure into a ``ValueError`` naming
the file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["load_plain", "save_atomic"]


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` through a unique temporary file in ``path``'s folder."""
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"Cannot write {str(path)!r}: the folder {str(path.parent)!r} "
                                "does not exist.")
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as f:
            torch.save(obj, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_plain(path: str | os.PathLike, *, what: str,
               map_location: torch.device | str | None = None) -> Any:
    """The tensors and plain data saved in ``path``, loaded with ``weights_only=True``.

    A truncated, corrupt or foreign file, or one holding pickled objects other than
    tensors and plain Python data, raises a ``ValueError`` naming the file and ``what`` it
    was expected to be.
    """
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (OSError, MemoryError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise ValueError(f"Cannot read {what} {str(path)!r}: {error}") from None
    except Exception as error:  # noqa: BLE001 - unpickling and zip errors of any type
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"Cannot read {what} {str(path)!r}: it is truncated, corrupt, or holds objects "
            f"other than tensors and plain data ({type(error).__name__}: {reason})."
        ) from None
