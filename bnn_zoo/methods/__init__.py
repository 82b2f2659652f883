"""Inference methods (layer 3), each a frozen dataclass behind the protocol of
:mod:`bnn_zoo.methods.base`: fit on standardised data, return a posterior that predicts.

:mod:`~bnn_zoo.methods.svi` (``SVI``), :mod:`~bnn_zoo.methods.nuts` (``NUTS``),
:mod:`~bnn_zoo.methods.sgmcmc` (``SGMCMC``, SGLD and SGHMC),
:mod:`~bnn_zoo.methods.ensemble` (``Ensemble``), :mod:`~bnn_zoo.methods.gp` (``ExactGP``),
:mod:`~bnn_zoo.methods.logitnormal` (``LogitNormalSVI``).
"""

__all__ = ["base", "ensemble", "gp", "logitnormal", "nuts", "sgmcmc", "svi"]
