"""Pyro effect handlers the zoo's objectives install around a model: minibatch subsampling
of the data plate, the weighting of the KL of global sites, and the local
reparameterisation and flipout of a mean-field Gaussian's affine layers. A model's code is
the same under each of them."""

from bnn_zoo._core.handlers import (
    flipout,
    local_reparameterization,
    scale_global_sites,
    subsample_data,
    weight_points,
)

__all__ = ["flipout", "local_reparameterization", "scale_global_sites", "subsample_data",
           "weight_points"]
