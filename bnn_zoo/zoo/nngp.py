"""Zoo entries ``nngp`` and ``nngp-erf``: the infinite-width limit of the BNN with ``depth``
hidden layers (one by default) and a relevance per input (automatic relevance
determination: MacKay 1994; Neal 1996) as exact GP regression (Neal 1996; Lee et al. 2018
for depth; the second half of Arbel's lecture notes "Bayesian NN under a Laplace
approximation" (2021)), hyperparameters by type-II maximum likelihood
([`ExactGP`][bnn_zoo.methods.ExactGP]); e.g. ``fit(x, y, model_options={"depth": 3})``,
``model_options={"ard": False}`` for one weight variance shared by every input."""

from __future__ import annotations

from bnn_zoo._core.checks import check_bool
from bnn_zoo.methods._base import Budget
from bnn_zoo.methods._gp import ExactGP
from bnn_zoo.methods._options import Factory
from bnn_zoo.models._nngp import NNGPRegression
from bnn_zoo.zoo import Entry, register
from bnn_zoo.zoo._defaults import ARBEL_NOTES

__all__ = ["MAX_TRAINING_POINTS"]

#: Exact GP regression costs O(N^3) per step; above this many training points the entry
#: declines (a benchmark lists it as skipped) instead of running for hours.
MAX_TRAINING_POINTS = 3000


def _nngp_model(in_dim: int, out_dim: int, *, task: str = "regression", activation: str = "relu",
         depth: int = 1, ard: bool = True, noise_scale: float | None = None,
         num_features: int | None = None, **kernel_options: float) -> NNGPRegression:
    """The NNGP regression model of a net with ``depth`` hidden layers and, with ``ard`` and
    two inputs or more, a relevance per input (one input's would only repeat the weight
    variance); ``kernel_options`` are the initial kernel variances (``weight_variance``,
    ``bias_variance``, ``output_variance``, ``output_bias_variance``)."""
    if task != "regression" or out_dim != 1:
        raise ValueError(f"Expected task 'regression' with out_dim 1, got {task!r}, {out_dim}.")
    return NNGPRegression(in_dim, activation=activation, depth=depth, noise_scale=noise_scale,
                          num_features=num_features, ard=check_bool("ard", ard) and in_dim > 1,
                          **kernel_options)


#: Each entry's activation and the papers of its infinite-width kernel.
_KERNELS = {"nngp": ("relu", 'Neal 1996, "Bayesian Learning for Neural Networks"; Cho & Saul '
                             '2009, "Kernel Methods for Deep Learning"'),
            "nngp-erf": ("erf", 'Neal 1996, "Bayesian Learning for Neural Networks"; Williams '
                                '1997, "Computing with Infinite Networks"')}

for _name, (_activation, _source) in _KERNELS.items():
    register(Entry(
        name=_name,
        description=f"infinite-width {_activation} BNN (1 hidden layer, option depth) with a "
                    "relevance per input: exact GP with the NNGP kernel, hyperparameters by "
                    "type-II maximum likelihood",
        tasks=("regression",),
        source=_source,
        notes=ARBEL_NOTES,
        # Any option: those _nngp_model does not name go on to the model and its kernel.
        model=Factory(_nngp_model, None, {"activation": _activation}),
        method=ExactGP(max_points=MAX_TRAINING_POINTS),
        budget=Budget(steps=300, lr=0.05, batch_size=None),
    ))
