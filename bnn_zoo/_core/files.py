"""Files the zoo writes and reads: atomic writes (tables, figures, caches, checkpoints,
saved fits) and a safe ``torch.load``.

A write goes to a unique temporary file beside the destination (``tempfile.mkstemp``),
which `os.replace` renames onto it, so a reader, a concurrent writer or a rerun after
a crash sees the old file or the whole new one, never a half-written one; on an error the
temporary file is removed, and the error (an ``OSError``) names the destination and its
cause. A results file that cannot be read or parsed is a ``ValueError`` naming it
(`read_json`). Only a regular file or a new path is written: never a folder, device, FIFO or
socket that stands at the path. A read uses ``torch.load(weights_only=True)``, which refuses to
run the code a pickled object would, and turns every failure into a ``ValueError`` naming
the file.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import torch

__all__ = ["NEW_FILE_MODE", "atomic_path", "load_plain", "parse_json", "read_json",
           "save_atomic", "write_target", "write_text_atomic"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: The permissions of a new result file: those of ``open(path, "w")`` (``mkstemp`` makes
#: its files private to their owner).
NEW_FILE_MODE = 0o666 & ~_umask()


def _kind(path: Path) -> str:
    """What the existing ``path`` is, in words: ``a folder``, ``a FIFO``, ..."""
    mode = path.stat().st_mode
    kinds = ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"),
             (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"))
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def write_target(path: str | os.PathLike) -> Path:
    """The file a write to ``path`` replaces: ``path``, or the file a symbolic link there
    points to (as ``open(path, "w")`` writes through it). Only a regular file or a new
    path may be written: an existing folder, device, FIFO or socket raises an ``OSError``
    (``IsADirectoryError`` for a folder) naming it, before anything is written."""
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        error, code = (IsADirectoryError, errno.EISDIR) if target.is_dir() \
            else (FileExistsError, errno.EEXIST)
        link = f" (through the link {str(path)!r})" if str(target) != os.path.abspath(path) \
            else ""
        raise error(code, f"Cannot write {str(target)!r}{link}: it is {_kind(target)}; only a "
                          "regular file or a new path is written")
    return target


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``path`` (same suffix, so that writers which
    infer the format from it still work); when the block ends without an error the
    temporary file replaces ``path`` (keeping the permissions of the file it replaces),
    otherwise, also on ``KeyboardInterrupt``, it is removed and ``path`` is untouched.

    ``path`` must be a regular file or a new path (see `write_target`); an
    ``OSError`` on the way (a full disk, a file-size limit, a folder that cannot be
    written) is raised again as the same type naming ``path`` and its cause."""
    path = write_target(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.",
                                    suffix=path.suffix)
        tmp = Path(name)
        os.close(fd)
        yield tmp
        mode = path.stat().st_mode & 0o777 if path.is_file() else NEW_FILE_MODE
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as error:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        cause = error.strerror or str(error)
        raise type(error)(error.errno, f"Cannot write {str(path)!r}: {cause}") from error
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; return the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


class _Writer:
    """A binary file whose `write` keeps the ``OSError`` it raises: ``torch.save``
    turns a failed write into its own ``RuntimeError`` (``unexpected pos ...``), which
    says neither the file nor the cause."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.file.flush()


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` atomically (see `atomic_path`); ``path``'s folder
    must exist. A write that fails (a full disk, a file-size limit) raises the
    ``OSError`` of the file system, naming ``path``; the file there before is kept."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"Expected path to be a str or os.PathLike, but got {path!r}.")
    path = Path(path)
    if path.parent.exists() and not path.parent.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"Cannot write {str(path)!r}: "
                                 f"{str(path.parent)!r} is {_kind(path.parent)}, not a folder")
    if not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, f"Cannot write {str(path)!r}: the folder "
                                f"{str(path.parent)!r} does not exist")
    with atomic_path(path) as tmp, open(tmp, "wb") as file:
        writer = _Writer(file)
        try:
            torch.save(obj, writer)
        except RuntimeError:
            if writer.error is None:
                raise
            raise writer.error from None


def _check_regular(path: str | os.PathLike, what: str) -> None:
    """A ``ValueError`` naming ``path`` where it exists and is no regular file."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"Cannot read {what} {str(path)!r}: it is {_kind(Path(path))}, not a "
                         "file.")


def read_json(path: str | os.PathLike, *, what: str = "results file") -> Any:
    """The JSON document in ``path``. A file that cannot be read (missing, not a regular
    file, not permitted) or parsed (truncated, corrupt, not UTF-8) raises a ``ValueError`` naming
    ``what`` it was expected to be, the file and the cause."""
    _check_regular(path, what)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        cause = getattr(error, "strerror", None) or str(error)
        raise ValueError(f"Cannot read {what} {str(path)!r}: {cause}.") from None
    return parse_json(text, what=what, source=repr(str(path)))


def parse_json(text: str, *, what: str, source: str) -> Any:
    """The JSON document ``text``; one that cannot be parsed raises a ``ValueError`` naming
    ``what`` it was expected to be, its ``source`` and where the parse stopped."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"Cannot read {what} {source}: {error.msg} at line {error.lineno}, "
                         f"column {error.colno}.") from None


def load_plain(path: str | os.PathLike, *, what: str,
               map_location: torch.device | str | None = None) -> Any:
    """The tensors and plain data saved in ``path``, loaded with ``weights_only=True``.

    A truncated, corrupt or foreign file, one holding pickled objects other than tensors
    and plain Python data, a missing file, or a path that is no regular file (a FIFO would
    block the read) raises a ``ValueError`` naming the file and ``what`` it was expected to
    be.
    """
    _check_regular(path, what)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"Cannot read {what} {str(path)!r}: no such file.") from None
    except (OSError, MemoryError) as error:
        raise ValueError(f"Cannot read {what} {str(path)!r}: {error}") from None
    except Exception as error:  # noqa: BLE001 - unpickling and zip errors of any type
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"Cannot read {what} {str(path)!r}: it is truncated, corrupt, or holds objects "
            f"other than tensors and plain data ({type(error).__name__}: {reason})."
        ) from None
