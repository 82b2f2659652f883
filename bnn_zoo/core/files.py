"""Files the zoo writes and reads: atomic writes (tables, figures, caches, checkpoints,
saved fits) and a safe ``torch.load``.

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

__all__ = ["NEW_FILE_MODE", "atomic_path", "load_plain", "save_atomic", "write_text_atomic"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: The permissions of a new result file: those of ``open(path, "w")`` (``mkstemp`` makes
#: its files private to their owner).
NEW_FILE_MODE = 0o666 & ~_umask()


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``path`` (same suffix, so that writers which
    infer the format from it still work); when the block ends without an error the
    temporary file replaces ``path`` (keeping the permissions of the file it replaces),
    otherwise, also on ``KeyboardInterrupt``, it is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    tmp = Path(name)
    try:
        os.close(fd)
        yield tmp
        mode = path.stat().st_mode & 0o777 if path.is_file() else NEW_FILE_MODE
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; return the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` atomically (see :func:`atomic_path`); ``path``'s folder
    must exist."""
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"Cannot write {str(path)!r}: the folder {str(path.parent)!r} "
                                "does not exist.")
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


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
