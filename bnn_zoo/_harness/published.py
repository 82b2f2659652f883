"""Published results on the standard UCI splits, as data.

Test RMSE and test log-likelihood per point in original units, mean and standard
error over the splits (20; protein 5), one hidden ReLU layer of 50 units (100 for
protein). Sources: Gal & Ghahramani (2016), *Dropout as a Bayesian approximation*,
Table 1 (corrected version, October 2016), which reprints the VI (Graves 2011) and
PBP (Hernandez-Lobato & Adams 2015) columns; Lakshminarayanan et al. (2017), *Simple
and scalable predictive uncertainty estimation using deep ensembles*, Table 1 (its
± look like standard deviations). Copied from ``data/uci/REFERENCE.md``.
"""

from __future__ import annotations

__all__ = ["METHODS", "PUBLISHED", "published"]

METHODS = ("VI", "PBP", "MC dropout", "deep ensembles")

# data set -> metric -> ((mean, se) per method, in METHODS order)
PUBLISHED: dict[str, dict[str, tuple[tuple[float, float], ...]]] = {
    "bostonHousing": {
        "rmse": ((4.32, 0.29), (3.01, 0.18), (2.97, 0.19), (3.28, 1.00)),
        "ll": ((-2.90, 0.07), (-2.57, 0.09), (-2.46, 0.06), (-2.41, 0.25)),
    },
    "concrete": {
        "rmse": ((7.19, 0.12), (5.67, 0.09), (5.23, 0.12), (6.03, 0.58)),
        "ll": ((-3.39, 0.02), (-3.16, 0.02), (-3.04, 0.02), (-3.06, 0.18)),
    },
    "energy": {
        "rmse": ((2.65, 0.08), (1.80, 0.05), (1.66, 0.04), (2.09, 0.29)),
        "ll": ((-2.39, 0.03), (-2.04, 0.02), (-1.99, 0.02), (-1.38, 0.22)),
    },
    "kin8nm": {
        "rmse": ((0.10, 0.00), (0.10, 0.00), (0.10, 0.00), (0.09, 0.00)),
        "ll": ((0.90, 0.01), (0.90, 0.01), (0.95, 0.01), (1.20, 0.02)),
    },
    "naval-propulsion-plant": {
        "rmse": ((0.01, 0.00), (0.01, 0.00), (0.01, 0.00), (0.00, 0.00)),
        "ll": ((3.73, 0.12), (3.73, 0.01), (3.80, 0.01), (5.63, 0.05)),
    },
    "power-plant": {
        "rmse": ((4.33, 0.04), (4.12, 0.03), (4.02, 0.04), (4.11, 0.17)),
        "ll": ((-2.89, 0.01), (-2.84, 0.01), (-2.80, 0.01), (-2.79, 0.04)),
    },
    "protein-tertiary-structure": {
        "rmse": ((4.84, 0.03), (4.73, 0.01), (4.36, 0.01), (4.71, 0.06)),
        "ll": ((-2.99, 0.01), (-2.97, 0.00), (-2.89, 0.00), (-2.83, 0.02)),
    },
    "wine-quality-red": {
        "rmse": ((0.65, 0.01), (0.64, 0.01), (0.62, 0.01), (0.64, 0.04)),
        "ll": ((-0.98, 0.01), (-0.97, 0.01), (-0.93, 0.01), (-0.94, 0.12)),
    },
    "yacht": {
        "rmse": ((6.89, 0.67), (1.02, 0.05), (1.11, 0.09), (1.58, 0.48)),
        "ll": ((-3.43, 0.16), (-1.63, 0.02), (-1.55, 0.03), (-1.18, 0.21)),
    },
}


def published(data: str, metric: str, method: str) -> tuple[float, float]:
    """``(mean, se)`` of ``metric`` (``"rmse"`` or ``"ll"``) for ``method`` on ``data``
    (``"concrete"`` or ``"uci/concrete"``)."""
    name = data.removeprefix("uci/")
    if name not in PUBLISHED:
        raise ValueError(f"Unknown UCI data set {data!r}; expected one of: "
                         f"{', '.join(PUBLISHED)}.")
    if metric not in ("rmse", "ll"):
        raise ValueError(f"Unknown metric {metric!r}; expected 'rmse' or 'll'.")
    if method not in METHODS:
        raise ValueError(f"Unknown method {method!r}; expected one of: {', '.join(METHODS)}.")
    return PUBLISHED[name][metric][METHODS.index(method)]
