"""The flat vector of a model's sites: a round trip, scalar sites included."""

from __future__ import annotations

import torch

from bnn_zoo.guides._flat_sites import flatten_sites, unflatten_sites


def test_round_trip_with_a_scalar_site_and_without_a_leading_dimension():
    """A scalar site (a sampled noise scale, shape ``()``) splits out of a 1-D ``theta`` as
    a 0-d tensor, and back."""
    sites = [("w", (2, 3)), ("sigma", ())]
    theta = torch.arange(7.0)
    values = unflatten_sites(sites, theta)
    assert values["w"].shape == (2, 3) and values["sigma"].shape == ()
    assert float(values["sigma"]) == 6.0
    torch.testing.assert_close(flatten_sites(sites, values), theta)
    batched = unflatten_sites(sites, torch.arange(14.0).reshape(2, 7))
    assert batched["sigma"].shape == (2,) and batched["w"].shape == (2, 2, 3)
