"""The UCI gap splits (Foong et al. 2019): split ``d`` of ``uci_gap/<name>`` holds out the
middle third of the rows sorted by input ``d``, ties in the row order of ``data.txt``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bnn_zoo._core import data
from bnn_zoo._harness import compare


def _raw(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and target of a UCI set read straight from its files."""
    folder = data.uci_root() / name / "data"
    table = np.loadtxt(folder / "data.txt")
    features = np.loadtxt(folder / "index_features.txt", ndmin=1).astype(int)
    target = int(np.loadtxt(folder / "index_target.txt"))
    return table[:, features], table[:, target]


def test_gap_rows_holds_out_the_middle_third_and_breaks_ties_by_row():
    # Sorted: rows 5 (0), 1 (1), 2, 3, 4 (the tied 2s, in row order), 0 (3); positions 2..3
    # are the middle third, so of the tied rows 2 and 3 are held out and 4 is trained on.
    train, test = data.gap_rows(np.array([3.0, 1.0, 2.0, 2.0, 2.0, 0.0]))
    assert test.tolist() == [2, 3] and train.tolist() == [0, 1, 4, 5]
    train, test = data.gap_rows(torch.arange(10.0).flip(0))  # 7 outer rows, 3 held out
    assert test.tolist() == [4, 5, 6] and train.tolist() == [0, 1, 2, 3, 7, 8, 9]


@pytest.mark.parametrize("column", [np.zeros(2), np.zeros((4, 2))])
def test_gap_rows_refuses_what_has_no_middle_third(column):
    with pytest.raises(ValueError, match="column"):
        data.gap_rows(column)


@pytest.mark.parametrize("name", data.UCI_SETS)
def test_every_input_dimension_is_a_gap_split_of_the_middle_third(uci_data, name):
    """For every input ``d``: the test rows are those at sorted positions
    ``floor(n/3) <= i < floor(2n/3)`` of the rows ordered by ``(x_d, row)`` (a sort written
    apart from :func:`gap_rows`), the training rows are the others, each in row order."""
    x, y = _raw(name)
    n, dims = x.shape
    assert data.num_splits(f"uci_gap/{name}") == dims
    for d in range(dims):
        by_value = sorted(range(n), key=lambda i: (x[i, d], i))
        test = sorted(by_value[n // 3:2 * n // 3])
        train = sorted(set(range(n)) - set(test))
        split = data.load(f"uci_gap/{name}", split=d, dtype=torch.float64)
        assert split.name == f"uci_gap/{name}" and split.task == "regression"
        assert np.array_equal(split.x_test.numpy(), x[test])
        assert np.array_equal(split.y_test.numpy(), y[test])
        assert np.array_equal(split.x_train.numpy(), x[train])
        assert np.array_equal(split.y_train.numpy(), y[train])
        # Nothing trained on lies strictly inside the held-out range of x_d.
        low, high = split.x_test[:, d].min(), split.x_test[:, d].max()
        assert not ((split.x_train[:, d] > low) & (split.x_train[:, d] < high)).any()


@pytest.mark.parametrize("split", [6, -1, 10**6, 1.0, True, "0", None])
def test_a_split_that_is_no_input_dimension_is_refused(uci_data, split):
    with pytest.raises(ValueError, match=r"split.*0 <= split < 6"):
        data.load("uci_gap/yacht", split=split)


def test_gap_names_are_listed_and_an_unknown_set_is_refused(uci_data):
    assert {f"uci_gap/{name}" for name in data.UCI_SETS} <= set(data.names())
    assert data.uci_set("uci_gap/yacht") == data.uci_set("uci/yacht") == "yacht"
    assert data.uci_set("gap") is None
    with pytest.raises(ValueError, match="Unknown UCI data set 'uci_gap/boston'.*Did you "
                                         "mean 'uci_gap/bostonHousing'"):
        data.load("uci_gap/boston")
    with pytest.raises(ValueError, match="Unknown UCI data set"):
        data.num_splits("uci_gap/boston")


def test_gap_splits_get_the_uci_protocol(uci_data):
    """The gap splits run under the protocol of the standard ones: the noise tuned on held-out
    training data, protein's 100 hidden units, one split per input dimension."""
    assert (compare.data_overrides("uci_gap/yacht", {}, None)("map")
            == compare.data_overrides("uci/yacht", {}, None)("map"))
    on_protein = compare.data_overrides("uci_gap/protein-tertiary-structure", {}, None)
    assert on_protein("map")["model_options"] == {"hidden": (100,)}
    assert compare.split_indices("uci_gap/yacht", 20) == list(range(6))
    with pytest.raises(ValueError, match="< 6"):
        compare.split_indices("uci_gap/yacht", [6])
