"""Files that cannot be written: a write that fails part-way (a file-size limit stands in
for a full disk) raises the file system's ``OSError`` naming the path and its cause, keeps
the earlier file and leaves no temporary file; a folder, FIFO, socket or device at the
path is never replaced; a symbolic link is written through, as ``open`` does."""

from __future__ import annotations

import os
import resource
import socket
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure

from bnn_zoo import data, zoo
from bnn_zoo.core import files
from bnn_zoo.harness.figures import save_figure
from bnn_zoo.harness.outputs import check_writable

KEEP = b"an earlier fit\n"


@pytest.fixture(scope="module")
def fitted():
    d = data.load("sine")
    return zoo.get("map").fit(d.x_train, d.y_train, seed=0, steps=5)


@pytest.fixture
def file_size_limit():
    """Files of this process may grow to at most 4 KiB (Python ignores ``SIGXFSZ``, so a
    write past it fails with ``EFBIG``), as a full disk would stop them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    yield
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(".")]


def test_save_that_cannot_be_written_whole_names_the_path_and_cause(fitted, tmp_path,
                                                                    file_size_limit):
    path = tmp_path / "fit.pt"
    path.write_bytes(KEEP)
    with pytest.raises(OSError, match=f"Cannot write '{path}': File too large"):
        fitted.save(path)
    assert path.read_bytes() == KEEP
    assert not _leftovers(tmp_path)


@pytest.mark.parametrize("write", [
    pytest.param(lambda p: files.write_text_atomic(p, "x" * 10_000), id="text"),
    pytest.param(lambda p: files.save_atomic({"w": torch.zeros(5_000)}, p), id="torch"),
    pytest.param(lambda p: save_figure(Figure(figsize=(20, 20)), p.with_suffix(".png")),
                 id="figure"),
])
def test_every_writer_names_the_path_when_the_disk_is_full(write, tmp_path, file_size_limit):
    path = tmp_path / "result.txt"
    with pytest.raises(OSError, match="Cannot write '.*result.*': File too large"):
        write(path)
    assert not list(tmp_path.iterdir())


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    return server


@pytest.mark.parametrize("make, kind", [(_fifo, "a FIFO"), (_socket, "a socket"),
                                        (Path.mkdir, "a folder")])
def test_save_never_replaces_what_is_not_a_regular_file(fitted, tmp_path, make, kind):
    path = tmp_path / "fit.pt"
    kept = make(path)
    mode = path.lstat().st_mode
    with pytest.raises(OSError, match=f"Cannot write '{path}': it is {kind}"):
        fitted.save(path)
    assert path.lstat().st_mode == mode
    assert not _leftovers(tmp_path)
    with pytest.raises(ValueError, match=f"--out {tmp_path}: Cannot write .* it is {kind}"):
        check_writable("--out", tmp_path, files=["fit.pt"])
    if kept is not None:
        kept.close()


def test_save_never_replaces_a_device(fitted):
    with pytest.raises(OSError, match="'/dev/null': it is a character device"):
        fitted.save("/dev/null")
    assert Path("/dev/null").is_char_device()


def test_save_writes_through_a_symbolic_link(fitted, tmp_path):
    target = tmp_path / "fits" / "fit.pt"
    target.parent.mkdir()
    target.write_bytes(KEEP)
    link = tmp_path / "latest.pt"
    link.symlink_to(target)
    fitted.save(link)
    assert link.is_symlink() and link.resolve() == target
    assert target.read_bytes() != KEEP
    zoo.load(link)


@pytest.mark.parametrize("make, kind", [(_fifo, "a FIFO"), (Path.mkdir, "a folder")])
def test_reading_a_path_that_is_not_a_file_names_it_and_never_blocks(tmp_path, make, kind):
    path = tmp_path / "fit.pt"
    make(path)
    with pytest.raises(ValueError, match=f"Cannot read a saved fit '{path}': it is {kind}"):
        zoo.load(path)
    with pytest.raises(ValueError, match=f"Cannot read results file '{path}': it is {kind}"):
        files.read_json(path)


def test_save_names_a_path_of_another_type(fitted):
    with pytest.raises(TypeError, match="Expected path to be a str or os.PathLike"):
        fitted.save(3)


def test_save_below_a_file_names_it(fitted, tmp_path):
    below = tmp_path / "notes.txt"
    below.write_bytes(KEEP)
    with pytest.raises(NotADirectoryError, match=f"'{below}' is a file, not a folder"):
        fitted.save(below / "fit.pt")
    assert below.read_bytes() == KEEP
