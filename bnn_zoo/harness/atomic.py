"""Atomic writes of result files: a unique temporary file in the destination's folder,
renamed onto the destination with :func:`os.replace`, so that a reader (or a rerun after
a crash or Ctrl-C) sees either the old file or the whole new one, never a half-written
one, and concurrent writers of one file never share a temporary name."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "write_text_atomic"]


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
