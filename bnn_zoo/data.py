"""The data sets: the UCI regression sets with their standard splits (Hernández-Lobato and
Adams 2015, "Probabilistic Backpropagation"), the gap splits of Foong et al. 2019, the
bundled scikit-learn sets and the synthetic ones, each loaded as a
[`Dataset`][bnn_zoo.data.Dataset] in the data's original units."""

from bnn_zoo._core.data import Dataset, catalogue, holdout, load, names, num_splits

__all__ = ["Dataset", "catalogue", "holdout", "load", "names", "num_splits"]
