"""Files that cannot be written: a write that fails part-way (a file-size limit stands in
for a full disk) raises the file system's ``OSError`` naming the path and its cause, keeps
the earlier file and leaves no temporary file; a folder, FIFO, socket or device at the
path is never replaced; a symbolic link is written through, as ``open`` does."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bnn_zoo import data, zoo
from bnn_zoo._core import files
from bnn_zoo._harness.outputs import check_writable

KEEP = b"an earlier fit\n"
CHILD = Path(__file__).with_name("write_past_size_limit.py")


@pytest.fixture(scope="module")
def fitted():
    d = data.load("sine")
    return zoo.get("map").fit(d.x_train, d.y_train, seed=0, steps=5)


@pytest.fixture(scope="module")
def past_size_limit(tmp_path_factory) -> dict:
    """What each writer did in a child process whose files may grow to at most 4 KiB."""
    root = tmp_path_factory.mktemp("size_limit")
    done = subprocess.run([sys.executable, str(CHILD), str(root)], capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(done.stdout)


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("writer", ["fit", "text", "torch", "figure"])
def test_a_write_past_a_size_limit_names_the_path_and_keeps_the_old_file(writer,
                                                                          past_size_limit):
    outcome = past_size_limit[writer]
    assert re.fullmatch(f"OSError: .*Cannot write '.*/{writer}/{outcome['file']}': "
                        "File too large", outcome["error"])
    assert outcome["kept"]
    assert outcome["left"] == [outcome["file"]]


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


def test_loading_a_missing_file_names_it(tmp_path):
    path = tmp_path / "fit.pt"
    with pytest.raises(ValueError, match=f"Cannot read a saved fit '{path}': no such file"):
        zoo.load(path)
