"""Bad inputs and faults, table-driven (issue "Every bad input answered"): each case asserts
the error type, that the message names the culprit, and that no file is lost or half-written."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

import pytest

from bnn_zoo import data

SOURCE = Path(__file__).resolve().parents[2] / "shared" / "data" / "uci"


@pytest.fixture
def uci_copy(tmp_path, monkeypatch) -> Path:
    """A private copy of the yacht files under ``BNN_ZOO_DATA`` that a case may damage."""
    source = Path(__import__("os").environ.get("BNN_ZOO_DATA", SOURCE)) / "yacht"
    if not source.exists():
        pytest.skip("the UCI data are not available (set BNN_ZOO_DATA)")
    shutil.copytree(source, tmp_path / "yacht")
    monkeypatch.setenv("BNN_ZOO_DATA", str(tmp_path))
    return tmp_path / "yacht" / "data"


def _truncate(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2].rsplit(" ", 1)[0] + " 1.5e")


DATA_FILE_CASES = {
    # case: (file, damage, error type, words the message must contain)
    "garbled data": ("data.txt", lambda p: p.write_text("1 2 three\n4 5 6\n"), ValueError,
                     ["data.txt"]),
    "truncated data": ("data.txt", _truncate, ValueError, ["data.txt"]),
    "empty data": ("data.txt", lambda p: p.write_text(""), ValueError, ["data.txt"]),
    "empty split": ("index_train_0.txt", lambda p: p.write_text(""), ValueError,
                    ["index_train_0.txt"]),
    "index out of range": ("index_test_0.txt", lambda p: p.write_text("0\n1\n100000\n"),
                           ValueError, ["index_test_0.txt", "100000"]),
    "negative index": ("index_train_0.txt", lambda p: p.write_text("-1\n2\n"), ValueError,
                       ["index_train_0.txt"]),
    "fractional index": ("index_train_0.txt", lambda p: p.write_text("0.5\n2\n"), ValueError,
                         ["index_train_0.txt", "integer"]),
    "feature column out of range": ("index_features.txt", lambda p: p.write_text("0\n99\n"),
                                    ValueError, ["index_features.txt"]),
    "missing split file": ("index_test_0.txt", lambda p: p.unlink(), FileNotFoundError,
                           ["index_test_0.txt"]),
    "garbled split count": ("n_splits.txt", lambda p: p.write_text("twenty\n"), ValueError,
                            ["n_splits.txt"]),
}


@pytest.mark.parametrize("case", sorted(DATA_FILE_CASES))
def test_damaged_uci_file_is_named(uci_copy: Path, case: str):
    file, damage, error, words = DATA_FILE_CASES[case]
    damage(uci_copy / file)
    with pytest.raises(error) as info:
        data.load("uci/yacht", split=0)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("split", [20, 10**6])
def test_split_beyond_the_standard_splits(uci_copy: Path, split: int):
    with pytest.raises(ValueError, match="split"):
        data.load("uci/yacht", split=split)


def test_failed_download_leaves_no_file_and_no_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("BNN_ZOO_DATA", raising=False)
    monkeypatch.setenv("BNN_ZOO_CACHE", str(tmp_path / "cache"))

    def refuse(url, timeout=None):
        assert timeout is not None and timeout > 0  # a download never waits forever
        raise OSError("network unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    with pytest.raises(OSError, match="n_splits.txt"):
        data.load("uci/yacht")
    assert not (tmp_path / "cache" / "yacht").exists()


@pytest.mark.parametrize("name, split, error, words", [
    ("no_such_set", 0, ValueError, ["no_such_set", "sine"]),
    ("uci/no_such_set", 0, ValueError, ["no_such_set", "yacht"]),
    (3, 0, TypeError, ["name"]),
    ("sine", -1, ValueError, ["split"]),
    ("sine", 1.5, ValueError, ["split"]),
    ("sine", True, ValueError, ["split"]),
])
def test_bad_load_arguments(name, split, error, words):
    with pytest.raises(error) as info:
        data.load(name, split=split)
    for word in words:
        assert word in str(info.value)
